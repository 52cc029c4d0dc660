package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Deferred encoding. Encoding a new chunk costs more CPU than hashing it (the
// byte-grouped Huffman coder runs at ~1.2–1.6 GB/s per core), so on a small
// machine a large save is bounded by the codec. The commit path therefore
// encodes inline only while an encode slot is free (Options.InlineEncoders);
// a chunk that finds none is stored raw (a normal CodecRaw object: header and
// CRC, readable at once) and its commit adds a row to the re-encode queue.
// ReencodeOne, called by the daemon while the filesystem is idle, takes rows
// off the queue and replaces each raw object by its encoded form.
//
// The queue is the catalog bucket "reencode": chunk ID → PendingReencode. It
// was added without a format bump: Open creates the bucket in older stores,
// an older ckptfs ignores it (raw objects are ordinary objects to it), and the
// only trace an older binary can leave is a queue row whose chunk it swept,
// which ReencodeOne drops and fsck reports as a note. Invariants:
//
//   - A queue row is written in the transaction that indexes its chunk
//     (Store.Commit), and only if that transaction adds the index row, so a
//     chunk is queued iff it was indexed as a raw-pending object.
//   - Sweep deletes a chunk's queue row in the transaction that deletes its
//     index row. (ReencodeOne also drops rows of chunks that are not indexed,
//     for stores an older ckptfs swept.)
//   - ReencodeOne pins the chunk (as a batch does, sweep.go) for its whole
//     run, so a concurrent collection neither deletes it underneath nor races
//     the index update; the collection spares the chunk and a later one frees
//     it if it is garbage.
//   - The encoded object is published like any object (temporary name,
//     fdatasync, rename over the raw one) and its directory fsync'd before one
//     transaction updates the index row (stored length, codec), the
//     stored-bytes counter and the queue. Readers open the object by name and
//     take codec and lengths from its header, so either version reads back the
//     same verified bytes, and the decoded-chunk cache needs no invalidation.
//   - A crash between the rename and the transaction leaves an encoded object
//     whose index row still describes the raw one, with the queue row still
//     present. That is the one state where an index row may disagree with its
//     object: fsck accepts it when a queue row exists ("re-encode pending"),
//     and the next ReencodeOne of the chunk repairs the row from the object
//     header. An index row that says encoded always names an encoded object:
//     its transaction came after the rename was durable.
//   - The re-encoded object gets the raw object's mtime (set after the rename,
//     never on the temporary file, which a collection would then take for an
//     old crash leftover), so re-encoding does not restart the grace period.

// PendingReencode is one row of the re-encode queue.
type PendingReencode struct {
	Hint   Hint   // what the chunk holds, as the Put that stored it said
	RawLen uint32 // the chunk's raw length, counted in Counts.ReencodePendingBytes
}

const pendingRecordVersion = 1

func (p PendingReencode) marshal() []byte {
	elem := p.Hint.ElemSize
	if elem < 0 || elem > 255 {
		elem = 0 // no such element width: store as "unknown", which a hint may always be
	}
	b := make([]byte, 0, 6)
	b = append(b, pendingRecordVersion, byte(elem))
	return binary.LittleEndian.AppendUint32(b, p.RawLen)
}

func unmarshalPending(b []byte) (PendingReencode, error) {
	if len(b) != 6 || b[0] != pendingRecordVersion {
		return PendingReencode{}, errors.New("bad re-encode queue record")
	}
	return PendingReencode{Hint: Hint{ElemSize: int(b[1])}, RawLen: binary.LittleEndian.Uint32(b[2:])}, nil
}

// pending decodes the sealed queue row v of key.
func (t *Tx) pending(key, v []byte) (PendingReencode, error) {
	rec, err := t.openRecord(key, v)
	if err != nil {
		return PendingReencode{}, err
	}
	p, err := unmarshalPending(rec)
	return p, errDamaged(err)
}

// newEncodeSlots returns the inline-encode semaphore for Options.InlineEncoders.
func newEncodeSlots(n int) chan struct{} {
	switch {
	case n < 0:
		return nil
	case n == 0:
		n = max(1, runtime.NumCPU()/2)
	}
	return make(chan struct{}, n)
}

// tryEncodeSlot takes an inline-encode slot without waiting. An empty chunk
// needs none (it is raw whatever the codec).
func (s *Store) tryEncodeSlot(n int) (release func(), ok bool) {
	if n == 0 {
		return func() {}, true
	}
	select {
	case s.encodeSlots <- struct{}{}: // a nil channel is never ready
		return func() { <-s.encodeSlots }, true
	default:
		return nil, false
	}
}

// initReencode sets up the encode budget and ReencodeOne's lock, and creates
// the queue bucket in a store made before it existed.
func (s *Store) initReencode(inlineEncoders int) error {
	s.encodeSlots = newEncodeSlots(inlineEncoders)
	s.reencodeSem = make(chan struct{}, 1)
	if s.readOnly {
		return nil // Tx methods treat a missing bucket as an empty queue
	}
	var ok bool
	if err := s.db.View(func(tx *bolt.Tx) error {
		ok = tx.Bucket(bucketReencode) != nil && tx.Bucket(bucketDeltaPlans) != nil
		return nil
	}); err != nil {
		return err
	}
	if ok {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketReencode); err != nil {
			return fmt.Errorf("create re-encode queue: %w", err)
		}
		return createDeltaBuckets(tx)
	})
}

// queueReencode adds chunk id to the re-encode queue.
func (t *Tx) queueReencode(id ID, h Hint, rawLen uint32) error {
	b := t.b(bucketReencode)
	if b == nil {
		return errors.New("catalog has no re-encode queue")
	}
	if b.Get(id[:]) == nil {
		if err := t.addCounter(keyReencodeChunks, 1); err != nil {
			return err
		}
		if err := t.addCounter(keyReencodeBytes, int64(rawLen)); err != nil {
			return err
		}
	}
	return b.Put(id[:], sealRecord(id[:], PendingReencode{Hint: h, RawLen: rawLen}.marshal()))
}

// unqueueReencode removes chunk id's queue row, if it has one.
func (t *Tx) unqueueReencode(id ID) error {
	b := t.b(bucketReencode)
	if b == nil {
		return nil
	}
	v := b.Get(id[:])
	if v == nil {
		return nil
	}
	p, err := t.pending(id[:], v)
	if err != nil {
		return fmt.Errorf("chunk %v: %w", id, err)
	}
	if err := t.addCounter(keyReencodeChunks, -1); err != nil {
		return err
	}
	if err := t.addCounter(keyReencodeBytes, -int64(p.RawLen)); err != nil {
		return err
	}
	return b.Delete(id[:])
}

// PendingReencode returns chunk id's re-encode queue row.
func (t *Tx) PendingReencode(id ID) (PendingReencode, bool, error) {
	b := t.b(bucketReencode)
	if b == nil {
		return PendingReencode{}, false, nil
	}
	v := b.Get(id[:])
	if v == nil {
		return PendingReencode{}, false, nil
	}
	p, err := t.pending(id[:], v)
	if err != nil {
		return p, false, fmt.Errorf("chunk %v: %w", id, err)
	}
	return p, true, nil
}

// ForEachPendingReencode calls fn for every row of the re-encode queue.
func (t *Tx) ForEachPendingReencode(fn func(id ID, p PendingReencode) error) error {
	b := t.b(bucketReencode)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		p, err := t.pending(k, v)
		if err != nil || len(k) != IDSize {
			return fmt.Errorf("re-encode row %x: bad record", k)
		}
		return fn(ID(k), p)
	})
}

// ReencodeOne takes one chunk off the re-encode queue and stores it encoded if
// that makes it smaller; it drops the row without rewriting anything when the
// encoding does not pay, when the chunk is no longer indexed, or when an
// interrupted earlier run already replaced the object (then it repairs the
// index row from the object header). more reports whether other rows remain.
//
// Rows are taken in key order, resuming after the previous call's, so one row
// that keeps failing (an I/O error) does not stall the rest: its error is
// returned and the row stays. A chunk whose object is corrupt or missing is
// dropped from the queue (re-encoding cannot help; fsck names it) and the
// error, wrapping ErrCorrupt or ErrMissing, is returned.
//
// Calls are serialised; each costs about one chunk's read and encode, an
// fdatasync, a directory fsync and a catalog commit, and gives up between
// steps when ctx is done.
func (s *Store) ReencodeOne(ctx context.Context) (more bool, err error) {
	return s.reencodeOne(ctx, nil)
}

// reencodeOne is ReencodeOne with a hook run after the encoded object has been
// renamed into place, before the catalog transaction; an error from it ends
// the call there (SimulateReencodeCrash).
func (s *Store) reencodeOne(ctx context.Context, afterRename func(ID) error) (bool, error) {
	if s.readOnly {
		return false, errors.New("store is open read-only")
	}
	select {
	case s.reencodeSem <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-s.reencodeSem }()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var id ID
	var found, more bool
	err := s.View(func(tx *Tx) error {
		b := tx.b(bucketReencode)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		k, _ := c.Seek(s.reencodeNext)
		if k != nil && s.reencodeNext != nil && bytes.Equal(k, s.reencodeNext) {
			k, _ = c.Next()
		}
		if k == nil {
			k, _ = c.First()
		}
		if k == nil {
			return nil
		}
		if len(k) != IDSize {
			return fmt.Errorf("re-encode row %x: bad key", k)
		}
		id, found = ID(k), true
		if next, _ := c.Next(); next != nil {
			more = true
		} else if first, _ := c.First(); !bytes.Equal(first, id[:]) {
			more = true
		}
		return nil
	})
	if err != nil || !found {
		return false, err
	}
	s.reencodeNext = append(s.reencodeNext[:0], id[:]...)
	start := time.Now()
	err = s.reencode(ctx, id, afterRename)
	if s.obs != nil {
		s.obs.Reencode(time.Since(start), err)
	}
	if err != nil {
		return more, fmt.Errorf("re-encode chunk %v: %w", id, err)
	}
	return more, nil
}

// reencodeRows returns chunk id's index row, its re-encode queue row and its
// delta plan.
func (s *Store) reencodeRows(id ID) (info ChunkInfo, indexed bool, p PendingReencode, queued bool, plan deltaLink, planned bool, err error) {
	err = s.View(func(tx *Tx) error {
		var err error
		if info, indexed, err = tx.Chunk(id); err != nil {
			return err
		}
		if p, queued, err = tx.PendingReencode(id); err != nil {
			return err
		}
		plan, planned, err = tx.link(bucketDeltaPlans, id)
		return err
	})
	return info, indexed, p, queued, plan, planned, err
}

// deltaMinGain: a delta is kept only when it is smaller than the best
// standalone encoding by more than 1/deltaMinGain of it, since reading it
// costs a second object and decode.
const deltaMinGain = 32

func (s *Store) reencode(ctx context.Context, id ID, afterRename func(ID) error) error {
	// From here on no sweep deletes the chunk (or its rows); one that was
	// deleting it has finished.
	if err := s.pin(ctx, id); err != nil {
		return err
	}
	defer s.unpin([]ID{id})

	info, indexed, p, queued, plan, planned, err := s.reencodeRows(id)
	if err != nil || !queued {
		return err
	}
	if !indexed {
		return s.finishReencode(id, nil, false)
	}
	// Read the object itself, not through the read path: the bytes must come
	// from the object this call will replace.
	h := chunkHandle(id)
	var raw, obj []byte
	st, err := s.objects.Stat(ctx, h)
	if errors.Is(err, backend.ErrNotExist) {
		err = fmt.Errorf("chunk %v: %w", id, ErrMissing)
	}
	if err == nil {
		raw, obj, err = s.readObject(ctx, id, nil, nil)
	}
	if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrMissing) {
		if derr := s.finishReencode(id, nil, false); derr != nil {
			return errors.Join(err, derr)
		}
		return fmt.Errorf("%w (dropped from the re-encode queue)", err)
	}
	if err != nil {
		return err
	}
	hdr, _ := parseObjectHeader(obj) // decodeObject parsed it already
	onDisk := ChunkInfo{RawLen: info.RawLen, StoredLen: uint32(len(obj)), Codec: hdr.codec}
	if onDisk != info || hdr.delta {
		// An earlier run replaced the object and stopped before its
		// transaction: the object header is the truth. (A delta object's
		// rows were committed before its rename.)
		return s.finishReencode(id, &onDisk, hdr.delta)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Candidates: the standalone encoding of a raw object, and the planned
	// delta; the smallest wins, the object as it is if neither pays.
	best, bestCodec, delta := obj, hdr.codec, false
	if hdr.codec == CodecRaw {
		if enc, codec := s.codecs.encodeObject(raw, p.Hint); codec != CodecRaw && len(enc) < len(best) {
			best, bestCodec = enc, codec
		}
	}
	standalone, standaloneCodec := best, bestCodec
	if planned {
		release, err := s.pinBase(ctx, plan.Base)
		if err != nil {
			return err
		}
		defer release()
		if dobj := s.deltaObject(ctx, raw, plan.Base, p.Hint); dobj != nil && len(dobj) < len(best)-len(best)/deltaMinGain {
			dh, _ := parseObjectHeader(dobj)
			best, bestCodec, delta = dobj, dh.codec, true
		}
	}
	if len(best) == len(obj) && !delta {
		return s.finishReencode(id, nil, false) // does not compress: stays as it is
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if delta {
		// The delta's rows first: from this commit on no sweep deletes its
		// base, so the object renamed below is never left without one.
		if err := s.Update(func(tx *Tx) error { return tx.putDelta(id, plan) }); err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrCatalogDamaged) {
				return err
			}
			// The base changed (swept, or became a delta): standalone.
			best, bestCodec, delta = standalone, standaloneCodec, false
			if len(best) == len(obj) {
				return s.finishReencode(id, nil, false)
			}
		}
	}
	// Replace and make durable before the transaction. The object keeps the
	// raw object's age, which the collector's grace period reads (the backend
	// sets it after its rename: a temporary file that looks old is one a
	// collection removes as a crash leftover).
	if err := s.objects.Put(ctx, h, best, backend.PutOptions{ModTime: st.ModTime}); err != nil {
		return err
	}
	if err := s.objects.Sync(ctx, []backend.Handle{h}); err != nil {
		return err
	}
	if afterRename != nil {
		if err := afterRename(id); err != nil {
			return err
		}
	}
	return s.finishReencode(id, &ChunkInfo{RawLen: info.RawLen, StoredLen: uint32(len(best)), Codec: bestCodec}, delta)
}

// pinBase keeps chunk base from being swept until release is called.
func (s *Store) pinBase(ctx context.Context, base ID) (release func(), err error) {
	if err := s.pin(ctx, base); err != nil {
		return nil, err
	}
	return func() { s.unpin([]ID{base}) }, nil
}

// deltaObject returns raw coded as a delta object against chunk base, or nil
// when base cannot serve (gone, damaged, a delta itself, another length).
// The base is verified (from the cache, or its object decoded and hashed):
// a delta against wrong bytes would fail every read.
func (s *Store) deltaObject(ctx context.Context, raw []byte, base ID, h Hint) []byte {
	var bd []byte
	if e, ok := s.cache.peek(base); ok {
		k := &Chunk{Data: e.data, c: s.cache, e: e}
		defer k.Release()
		bd = e.data
	} else {
		obj, err := s.objects.Get(ctx, chunkHandle(base), nil)
		if err != nil {
			return nil
		}
		if bd, err = s.codecs.decodeObject(base, obj); err != nil {
			return nil // a delta, or damaged: fsck names it
		}
	}
	if len(bd) != len(raw) {
		return nil
	}
	elem := h.ElemSize
	if elem < 0 || elem > 255 {
		elem = 0
	}
	return s.codecs.encodeDeltaObject(raw, bd, base, elem, &s.deltaScratch)
}

// finishReencode drops chunk id's queue and plan rows and, when stored is
// not nil, sets its index row's stored length and codec (keeping the
// stored-bytes counter right), in one transaction. delta says whether the
// object is now a delta; when it is not, a delta row left by an interrupted
// run is dropped.
func (s *Store) finishReencode(id ID, stored *ChunkInfo, delta bool) error {
	return s.Update(func(tx *Tx) error {
		if stored != nil {
			cur, ok, err := tx.Chunk(id)
			if err != nil {
				return err
			}
			if ok {
				next := ChunkInfo{RawLen: cur.RawLen, StoredLen: stored.StoredLen, Codec: stored.Codec}
				if err := tx.b(bucketChunks).Put(id[:], sealRecord(id[:], next.marshal())); err != nil {
					return err
				}
				if err := tx.addCounter(keyStored, int64(next.StoredLen)-int64(cur.StoredLen)); err != nil {
					return err
				}
			}
		}
		if !delta {
			if err := tx.dropDelta(id); err != nil {
				return err
			}
		}
		if err := tx.dropPlan(id); err != nil {
			return err
		}
		return tx.unqueueReencode(id)
	})
}
