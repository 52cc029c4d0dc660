package cas

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/object"
)

// reader is the store's read path: an object from the backend (a
// backend.Tier fetches it from its remote on a miss), verified and decoded,
// a delta against its base. Reached from Store as s.rd.
type reader struct {
	s *Store
	// baseBufs holds *[]byte buffers for the decoded bases of deltas being
	// read (readBase): fresh memory costs a page fault per 4 KiB.
	baseBufs sync.Pool
	objBufs  sync.Pool // *[]byte: objects being read
}

// ReadChunk returns the raw bytes of ref's chunk, from the cache or loaded and
// verified from its object. The returned slice is shared: never modify it.
func (s *Store) ReadChunk(ctx context.Context, ref ChunkRef) ([]byte, error) {
	data, err := s.cache.get(ctx, ref.ID, func(ctx context.Context, alloc func(int) []byte) ([]byte, error) {
		return s.rd.loadChunk(ctx, ref.ID, alloc)
	})
	if err != nil {
		return nil, err
	}
	if len(data) != int(ref.Len) {
		return nil, fmt.Errorf("chunk %v: %w: %d bytes, manifest says %d", ref.ID, ErrCorrupt, len(data), ref.Len)
	}
	return data, nil
}

// AcquireChunk is ReadChunk for callers that give the bytes back: the chunk's
// buffer is reused for another chunk after Release (and after the cache let it
// go). Reads through the mount use it, so streaming a large file recycles a
// few buffers instead of faulting in fresh memory for every chunk.
func (s *Store) AcquireChunk(ctx context.Context, ref ChunkRef) (*Chunk, error) {
	e, err := s.cache.acquire(ctx, ref.ID, func(ctx context.Context, alloc func(int) []byte) ([]byte, error) {
		return s.rd.loadChunk(ctx, ref.ID, alloc)
	})
	if err != nil {
		return nil, err
	}
	k := &Chunk{Data: e.data, c: s.cache, e: e}
	if len(e.data) != int(ref.Len) {
		k.Release()
		return nil, fmt.Errorf("chunk %v: %w: %d bytes, manifest says %d", ref.ID, ErrCorrupt, len(e.data), ref.Len)
	}
	return k, nil
}

// AcquireCached is AcquireChunk for a chunk in the cache only: it never
// loads nor waits (ok false: not cached, or not of ref's length). A reader
// takes its cached chunks with it and starts loads only for the others.
func (s *Store) AcquireCached(ref ChunkRef) (*Chunk, bool) {
	e, ok := s.cache.peek(ref.ID)
	if !ok {
		return nil, false
	}
	k := &Chunk{Data: e.data, c: s.cache, e: e}
	if len(e.data) != int(ref.Len) {
		k.Release()
		return nil, false // AcquireChunk reports it
	}
	return k, true
}

// Cached reports whether chunk id is in the decoded-chunk cache.
func (s *Store) Cached(id ID) bool { return s.cache.has(id) }

// CacheSize is the decoded-chunk cache's budget in bytes.
func (s *Store) CacheSize() int64 { return s.cache.budget }

// loadChunk reads, verifies and decodes chunk id from its object. The
// object is read into a recycled buffer: the decoded bytes never alias it.
func (r *reader) loadChunk(ctx context.Context, id ID, alloc func(int) []byte) ([]byte, error) {
	s := r.s
	buf, _ := r.objBufs.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	var start time.Time
	if s.obs != nil {
		start = time.Now()
	}
	raw, obj, err := r.readObject(ctx, id, *buf, alloc)
	if cap(obj) > 0 {
		*buf = obj
	}
	r.objBufs.Put(buf)
	if s.obs != nil {
		s.obs.Fetch(time.Since(start), len(raw), err)
	}
	if err != nil {
		return nil, err
	}
	s.storeReadBytes.Add(int64(len(raw)))
	return raw, nil
}

// VerifyObject reads and fully verifies chunk id's object, bypassing the cache.
func (s *Store) VerifyObject(ctx context.Context, id ID) (ChunkInfo, error) {
	info, _, err := s.rd.verifyObject(ctx, id)
	return info, err
}

// VerifyObjectBase is VerifyObject that also says whether the object is a
// delta, and against which base.
func (s *Store) VerifyObjectBase(ctx context.Context, id ID) (info ChunkInfo, base ID, delta bool, err error) {
	info, h, err := s.rd.verifyObject(ctx, id)
	return info, h.Base, h.Delta, err
}

func (r *reader) verifyObject(ctx context.Context, id ID) (ChunkInfo, object.Header, error) {
	raw, obj, err := r.readObject(ctx, id, nil, nil)
	if err != nil {
		return ChunkInfo{}, object.Header{}, err
	}
	if err := object.CheckCRC(id, obj); err != nil { // a read skips it for raw objects
		return ChunkInfo{}, object.Header{}, err
	}
	h, _ := object.ParseHeader(obj) // Decode parsed it already
	return ChunkInfo{RawLen: uint32(len(raw)), StoredLen: uint32(len(obj)), Codec: h.Codec}, h, nil
}

// readObject returns chunk id's decoded, verified bytes and its object, read
// into buf when it is large enough. A damaged copy fetched from a remote
// tier is fetched again (refetchable).
func (r *reader) readObject(ctx context.Context, id ID, buf []byte, alloc func(int) []byte) (raw, obj []byte, err error) {
	h := chunkHandle(id)
	obj, err = r.getObject(ctx, id, buf)
	if err != nil {
		return nil, nil, err
	}
	var baseErr error
	if raw, baseErr, err = r.decodeChunk(ctx, id, obj, alloc); baseErr != nil {
		return nil, obj, baseErr
	}
	if t, ok := r.refetchable(id, err); ok {
		if obj, err = t.Refetch(ctx, h, obj); err != nil {
			return nil, nil, r.getErr(id, err)
		}
		if raw, baseErr, err = r.decodeChunk(ctx, id, obj, alloc); baseErr != nil {
			return nil, obj, baseErr // the object fetched may be sound
		}
		if err != nil {
			_ = t.Drop(ctx, h) // keep no copy known to be damaged
			return nil, obj, fmt.Errorf("in %s: %w", t.Remote().Location(), err)
		}
	}
	if err != nil {
		return nil, obj, err
	}
	return raw, obj, nil
}

// getObject reads chunk id's object wherever it lives: in a pack (as its
// index row says, or in a pack of a batch not committed yet), else in an
// object of its own (which a backend.Tier fetches from its remote when it
// is missing here). A packed chunk whose pack is missing is looked for as
// an object of its own too, which the remote tier may have.
func (r *reader) getObject(ctx context.Context, id ID, buf []byte) ([]byte, error) {
	s := r.s
	var info ChunkInfo
	var indexed bool
	if err := s.View(func(tx *Tx) error {
		var err error
		info, indexed, err = tx.Chunk(id)
		return err
	}); err != nil {
		return nil, fmt.Errorf("read chunk %v: %w", id, err)
	}
	if indexed && info.Inline {
		return s.inlineObject(id, buf) // in the catalog (inline.go)
	}
	if indexed && info.Packed() {
		obj, err := s.packs.getRange(ctx, packLoc{info.Pack, int64(info.Offset), int64(info.StoredLen)}, buf)
		if err == nil {
			return obj, nil
		}
		if _, tier := s.objects.(backend.Tier); !tier || !errors.Is(err, ErrMissing) {
			return nil, fmt.Errorf("chunk %v: %w", id, err)
		}
	} else if !indexed {
		if obj, ok, err := s.packs.read(ctx, id, buf); ok {
			if err != nil {
				return nil, fmt.Errorf("chunk %v: %w", id, err)
			}
			return obj, nil
		}
	}
	obj, err := s.objects.Get(ctx, chunkHandle(id), buf)
	if err != nil {
		return nil, r.getErr(id, err)
	}
	return obj, nil
}

// PackedObject returns chunk id's object when the chunk lives in a pack or
// inline in the catalog (packed is false when it has an object file of its
// own): the remote tier uploads it as an object of its own (cas/remote).
// The object is not verified.
func (s *Store) PackedObject(ctx context.Context, id ID, buf []byte) (obj []byte, packed bool, err error) {
	var info ChunkInfo
	var indexed bool
	if err := s.View(func(tx *Tx) error {
		var err error
		info, indexed, err = tx.Chunk(id)
		return err
	}); err != nil {
		return nil, false, err
	}
	if indexed && info.Inline {
		obj, err = s.inlineObject(id, buf)
		return obj, true, err
	}
	if !indexed || !info.Packed() {
		return nil, false, nil
	}
	obj, err = s.packs.getRange(ctx, packLoc{info.Pack, int64(info.Offset), int64(info.StoredLen)}, buf)
	if err != nil {
		return nil, true, fmt.Errorf("chunk %v: %w", id, err)
	}
	return obj, true, nil
}

// getErr is the error of reading chunk id's object.
func (r *reader) getErr(id ID, err error) error {
	s := r.s
	if errors.Is(err, backend.ErrNotExist) {
		if t, ok := s.objects.(backend.Tier); ok {
			return fmt.Errorf("chunk %v: %w (neither here nor in %s)", id, ErrMissing, t.Remote().Location())
		}
		return fmt.Errorf("chunk %v: %w", id, ErrMissing)
	}
	return fmt.Errorf("read chunk %v: %w", id, err)
}

// refetchable reports whether chunk id's object, which decoding found
// damaged (err), is a copy a tier fetched (not indexed here: the local
// catalog indexes only what this store committed) and may fetch again.
func (r *reader) refetchable(id ID, err error) (backend.Tier, bool) {
	s := r.s
	t, ok := s.objects.(backend.Tier)
	if !ok || !errors.Is(err, ErrCorrupt) {
		return nil, false
	}
	var indexed bool
	if err := s.View(func(tx *Tx) error { _, indexed, _ = tx.Chunk(id); return nil }); err != nil {
		return nil, false
	}
	return t, !indexed
}

// decodeChunk decodes and verifies object obj of chunk id, a delta against
// its base from loadBase. An error loading the base is returned as baseErr
// (obj itself may be sound). A delta that does not decode, or whose result
// does not hash to id, is decoded again against its base read and verified
// in full (loadBase does not hash a base it reads): a base that fails the
// verification (a damaged fetched copy is fetched again first) is to
// blame, and its error is baseErr too. Otherwise err is the object's.
func (r *reader) decodeChunk(ctx context.Context, id ID, obj []byte, alloc func(int) []byte) (raw []byte, baseErr, err error) {
	s := r.s
	baseFailed := false
	raw, err = s.coder.DecodeInto(id, obj, alloc, func(b ID) ([]byte, func(), error) {
		data, release, err := r.loadBase(ctx, b)
		baseFailed = err != nil
		return data, release, err
	})
	if baseFailed {
		return nil, err, nil
	}
	if base, ok := object.FailedDelta(err); ok {
		return r.retryDelta(ctx, id, obj, alloc, base)
	}
	return raw, nil, err
}

// retryDelta is decodeChunk's second try.
func (r *reader) retryDelta(ctx context.Context, id ID, obj []byte, alloc func(int) []byte, base ID) (raw []byte, baseErr, err error) {
	s := r.s
	bd, release, err := r.readBase(ctx, base, true)
	if err != nil {
		return nil, &BaseError{Chunk: id, Base: base, Err: err}, nil
	}
	defer release()
	raw, err = s.coder.DecodeInto(id, obj, alloc, func(b ID) ([]byte, func(), error) {
		if b != base {
			return nil, nil, fmt.Errorf("chunk %v: %w: its base changed", id, ErrCorrupt)
		}
		return bd, func() {}, nil
	})
	return raw, nil, err
}

// bases is the base loader that decoding a delta object uses under ctx.
func (r *reader) bases(ctx context.Context) object.BaseFunc {
	return func(b ID) ([]byte, func(), error) { return r.loadBase(ctx, b) }
}

// loadBase returns the bytes of base chunk id of a delta object, and the
// function to call when done with them: from the cache when it is there,
// else read from its object (which a backend.Tier fetches from its remote
// when it is missing locally), which must be standalone (a read touches at most two
// objects). It never waits for a load in flight: with a damaged store naming
// bases in a cycle, waiting could deadlock two loads on each other.
//
// A base read from its object is not hashed (object.Coder.DecodeBase): the delta's
// result is, so a damaged base can only fail the read, and decodeChunk then
// verifies the base to tell which of the two is damaged. Such bytes are
// therefore never put in the cache; they live in a pooled buffer until the
// delta is decoded.
func (r *reader) loadBase(ctx context.Context, id ID) ([]byte, func(), error) {
	s := r.s
	if e, ok := s.cache.peek(id); ok {
		k := &Chunk{Data: e.data, c: s.cache, e: e}
		return e.data, k.Release, nil
	}
	return r.readBase(ctx, id, false)
}

// readBase reads standalone chunk id's object into a pooled buffer and
// decodes it into another, hashing the result when verify is set. A damaged
// copy fetched from a remote tier is fetched again, and verified in full.
func (r *reader) readBase(ctx context.Context, id ID, verify bool) (raw []byte, release func(), err error) {
	s := r.s
	buf, _ := r.objBufs.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer r.objBufs.Put(buf)
	rb, _ := r.baseBufs.Get().(*[]byte)
	if rb == nil {
		rb = new([]byte)
	}
	alloc := func(n int) []byte {
		*rb = growBuf(*rb, n)
		return *rb
	}
	defer func() {
		if err != nil {
			r.baseBufs.Put(rb)
		}
	}()
	keep := func(obj []byte) {
		if cap(obj) > 0 {
			*buf = obj
		}
	}
	h := chunkHandle(id)
	obj, err := r.getObject(ctx, id, *buf)
	if err != nil {
		return nil, nil, err
	}
	keep(obj)
	if verify {
		raw, err = s.coder.DecodeInto(id, obj, alloc, nil)
	} else {
		raw, err = s.coder.DecodeBase(id, obj, alloc)
	}
	if t, ok := r.refetchable(id, err); ok {
		if obj, err = t.Refetch(ctx, h, obj); err != nil {
			return nil, nil, r.getErr(id, err)
		}
		keep(obj)
		if raw, err = s.coder.DecodeInto(id, obj, alloc, nil); err != nil {
			_ = t.Drop(ctx, h) // keep no copy known to be damaged
			err = fmt.Errorf("in %s: %w", t.Remote().Location(), err)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	s.storeReadBytes.Add(int64(len(raw)))
	return raw, func() { r.baseBufs.Put(rb) }, nil
}

// growBuf returns b resized to n bytes, reallocated if its capacity is short.
func growBuf(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// DecodeObject decodes and verifies obj, an object of chunk id read from
// elsewhere than the store's objects (a remote's, for fsck): a delta's base
// is read as any chunk is.
func (s *Store) DecodeObject(ctx context.Context, id ID, obj []byte) ([]byte, error) {
	return s.coder.DecodeInto(id, obj, nil, s.rd.bases(ctx))
}
