package cas

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/object"
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
//     object: fsck accepts it when a queue row exists (counted as in flight),
//     and the next ReencodeOne of the chunk repairs the row from the object
//     header. An index row that says encoded always names an encoded object:
//     its transaction came after the rename was durable.
//   - The re-encoded object gets the raw object's mtime (set after the rename,
//     never on the temporary file, which a collection would then take for an
//     old crash leftover), so re-encoding does not restart the grace period.

// DefaultMaxReencodeBacklog is Options.MaxReencodeBacklog's default. The
// background re-encoder also works while the mount is busy once the backlog
// is past half of it (fusefs); a commit waits for an encoder past all of it.
// A single 1 GiB save (about half of it stored raw) stays under it and is
// not slowed; a run that saves without pause is held to it, so its stored
// size converges to the encoded one as the store grows.
const DefaultMaxReencodeBacklog = 1 << 30

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
func (r *reencoder) tryEncodeSlot(n int) (release func(), ok bool) {
	if n == 0 {
		return func() {}, true
	}
	select {
	case r.slots <- struct{}{}: // a nil channel is never ready
		return func() { <-r.slots }, true
	default:
		return nil, false
	}
}

// reencoder is the store's re-encoding state (the queue's consumer and the
// inline encoders' budget), reached from Store as s.re.
type reencoder struct {
	s *Store
	// slots bounds inline encoders (nil: none).
	slots chan struct{}
	// sem (capacity 1) serialises reencodeGroup and guards next, the queue
	// key after which the next group looks, and scratch.
	sem        chan struct{}
	next       []byte
	scratch    object.DeltaScratch
	maxBacklog int64 // Options.MaxReencodeBacklog
}

// newReencoder sets up the encode budget and ReencodeOne's lock. (The
// catalog's Open creates the queue's bucket in a store made before it
// existed.)
func newReencoder(s *Store, inlineEncoders int, maxBacklog int64) *reencoder {
	return &reencoder{s: s, slots: newEncodeSlots(inlineEncoders), sem: make(chan struct{}, 1), maxBacklog: maxBacklog}
}

// ReencodeBacklog is the raw bytes of the chunks in the re-encode queue
// (Counts.ReencodePendingBytes), 0 if the catalog cannot be read.
func (s *Store) ReencodeBacklog() int64 {
	var n int64
	_ = s.View(func(tx *Tx) error { n = tx.Counts().ReencodePendingBytes; return nil })
	return n
}

// ReencodeOne takes one chunk off the re-encode queue and stores it encoded if
// that makes it smaller: Reencode(ctx, 1).
func (s *Store) ReencodeOne(ctx context.Context) (more bool, err error) {
	return s.re.reencodeGroup(ctx, 1, nil)
}

// Reencode takes up to n chunks off the re-encode queue and stores each
// encoded (or as a delta, when it has a plan that pays) if that makes it
// smaller; it drops a row without rewriting anything when the encoding does
// not pay, when the chunk is no longer indexed, or when an interrupted
// earlier run already replaced the object (then it repairs the index row
// from the object header). The objects a group rewrites are made durable
// together (one backend Sync: grouped fdatasyncs and directory fsyncs) and
// recorded in one transaction, so a group of n costs about one chunk's
// syncs, not n. more reports whether other rows remain.
//
// Rows are taken in key order, resuming after the previous call's, so one row
// that keeps failing (an I/O error) does not stall the rest: its error is
// returned (after the group's other chunks are finished) and the row stays.
// A chunk whose object is corrupt or missing is dropped from the queue
// (re-encoding cannot help; fsck names it) and the error, wrapping ErrCorrupt
// or ErrMissing, is returned.
//
// Calls are serialised, and give up between steps when ctx is done.
func (s *Store) Reencode(ctx context.Context, n int) (more bool, err error) {
	return s.re.reencodeGroup(ctx, max(1, n), nil)
}

// ReencodeQueued re-encodes now those of chunks ids that wait on the
// re-encode queue (as Reencode does, in groups of n), carrying out their
// delta plans: the remote tier calls it before it uploads ids, since it
// uploads each object as it is, and a delta planned but not written yet
// would go up standalone (or raw) for good. Chunks not queued are left
// alone; their errors are returned joined, after the others are done.
func (s *Store) ReencodeQueued(ctx context.Context, ids []ID, n int) error {
	r := s.re
	if s.readOnly {
		return errors.New("store is open read-only")
	}
	var queued []ID
	if err := s.View(func(tx *Tx) error {
		for _, id := range ids {
			_, ok, err := tx.PendingReencode(id)
			if err != nil {
				return err
			}
			if ok {
				queued = append(queued, id)
			}
		}
		return nil
	}); err != nil || len(queued) == 0 {
		return err
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.sem }()
	var errs []error
	for len(queued) > 0 {
		k := min(max(1, n), len(queued))
		if err := r.reencode(ctx, queued[:k], nil); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		queued = queued[k:]
	}
	return errors.Join(errs...)
}

// reencodeGroup is Reencode with a hook run after the group's objects have
// been renamed into place and synced, before its transaction; an error from
// it ends the call there (SimulateReencodeCrash).
func (r *reencoder) reencodeGroup(ctx context.Context, n int, afterRename func(ID) error) (bool, error) {
	s := r.s
	if s.readOnly {
		return false, errors.New("store is open read-only")
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-r.sem }()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	ids, more, err := r.nextQueued(n)
	if err != nil || len(ids) == 0 {
		return false, err
	}
	r.next = append(r.next[:0], ids[len(ids)-1][:]...)
	start := time.Now()
	err = r.reencode(ctx, ids, afterRename)
	if s.obs != nil {
		d := time.Since(start) / time.Duration(len(ids))
		for range ids {
			s.obs.Reencode(d, err)
		}
	}
	return more, err
}

// nextQueued returns up to n queue rows after r.next, wrapping
// around once, and whether rows remain beyond them.
func (r *reencoder) nextQueued(n int) (ids []ID, more bool, err error) {
	s := r.s
	err = s.View(func(tx *Tx) error {
		ids, more, err = tx.Queue().Next(r.next, n)
		return err
	})
	return ids, more, err
}

// reencodeRows returns chunk id's index row, its re-encode queue row and its
// delta plan's candidate bases, nil while the plan waits for a later version
// of id (waits); a released plan's fallback is its last candidate.
func (r *reencoder) reencodeRows(id ID) (info ChunkInfo, indexed bool, p PendingReencode, queued bool, plan []catalog.DeltaLink, waits bool, err error) {
	s := r.s
	err = s.View(func(tx *Tx) error {
		var err error
		if info, indexed, err = tx.Chunk(id); err != nil {
			return err
		}
		if p, queued, err = tx.PendingReencode(id); err != nil {
			return err
		}
		w, hasWait, err := tx.DeltaWait(id)
		if err != nil {
			return err
		}
		if waits = hasWait && !w.Released; waits {
			return nil
		}
		if plan, _, err = tx.PlanCandidates(id); err != nil || !hasWait || w.Fallback.Dist == 0 {
			return err
		}
		if len(plan) > 0 && !slices.ContainsFunc(plan, func(l catalog.DeltaLink) bool { return l.Base == w.Fallback.Base }) {
			plan = append(plan, w.Fallback)
		}
		return nil
	})
	return info, indexed, p, queued, plan, waits, err
}

// deltaMinGain: a delta is kept only when it is smaller than the best
// standalone encoding by more than 1/deltaMinGain of it, since reading it
// costs a second object and decode.
const deltaMinGain = 32

// reencodeItem is what a group does with one chunk.
type reencodeItem struct {
	id     ID
	stored *ChunkInfo        // the new index row's stored length and codec; nil: unchanged
	delta  bool              // the object is (or will be) a delta
	link   catalog.DeltaLink // its base, when delta
	obj    []byte            // the object to write; nil: nothing to write
	alt    []byte            // the standalone encoding, should the delta's rows be refused
	altC   Codec
	mtime  time.Time
	waits  bool // its plan waits for a later version: kept for it
}

// reencode re-encodes the chunks ids as one group: decide each (reading
// their objects, trying plans), commit the rows of the deltas, write and
// sync every object, then one transaction.
func (r *reencoder) reencode(ctx context.Context, ids []ID, afterRename func(ID) error) error {
	s := r.s
	// From here on no sweep deletes the chunks (or their rows); one that
	// was deleting them has finished.
	var pinned []ID
	defer func() { s.gc.unpin(pinned) }()
	var items []reencodeItem
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := s.gc.pin(ctx, id); err != nil {
			errs = append(errs, err)
			break
		}
		pinned = append(pinned, id)
		it, bases, err := r.decide(ctx, id)
		pinned = append(pinned, bases...)
		if err != nil {
			errs = append(errs, fmt.Errorf("re-encode chunk %v: %w", id, err))
			if it == nil {
				continue
			}
		}
		if it != nil {
			items = append(items, *it)
		}
	}
	if len(items) == 0 {
		return errors.Join(errs...)
	}
	// The deltas' rows first: from this commit on no sweep deletes their
	// bases, so an object renamed below is never left without one.
	if err := s.Update(func(tx *Tx) error {
		for i := range items {
			it := &items[i]
			if !it.delta || it.obj == nil {
				continue
			}
			if err := tx.Deltas().Put(it.id, it.link); errors.Is(err, catalog.ErrDeltaRefused) {
				// The base changed (swept, or became a delta): standalone.
				it.delta, it.obj = false, it.alt
				it.stored = nil
				if it.obj != nil {
					it.stored = &ChunkInfo{StoredLen: uint32(len(it.alt)), Codec: it.altC}
				}
			} else if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	// Replace, then make durable together before the transaction. Each
	// object keeps the raw object's age, which the collector's grace period
	// reads (the backend sets it after its rename: a temporary file that
	// looks old is one a collection removes as a crash leftover).
	var hs []backend.Handle
	for _, it := range items {
		if it.obj == nil {
			continue
		}
		h := chunkHandle(it.id)
		if err := s.objects.Put(ctx, h, it.obj, backend.PutOptions{ModTime: it.mtime}); err != nil {
			return errors.Join(append(errs, err)...)
		}
		hs = append(hs, h)
	}
	if len(hs) > 0 {
		if err := s.objects.Sync(ctx, hs); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	if afterRename != nil {
		for _, it := range items {
			if it.obj != nil {
				if err := afterRename(it.id); err != nil {
					return err
				}
			}
		}
	}
	if err := r.finishReencode(items); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// decide reads chunk id's rows and object and says what its re-encode does.
// It returns the plan's bases it pinned (the caller unpins). An item
// with an error is still to be finished (a corrupt or missing object is
// dropped from the queue); an error without an item leaves the row.
func (r *reencoder) decide(ctx context.Context, id ID) (*reencodeItem, []ID, error) {
	s := r.s
	info, indexed, p, queued, plan, waits, err := r.reencodeRows(id)
	if err != nil || !queued {
		return nil, nil, err
	}
	it := &reencodeItem{id: id}
	if !indexed {
		return it, nil, nil
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
		raw, obj, err = s.rd.readObject(ctx, id, nil, nil)
	}
	if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrMissing) {
		return it, nil, fmt.Errorf("%w (dropped from the re-encode queue)", err)
	}
	if err != nil {
		return nil, nil, err
	}
	it.mtime, it.waits = st.ModTime, waits
	hdr, _ := object.ParseHeader(obj) // Decode parsed it already
	onDisk := ChunkInfo{RawLen: info.RawLen, StoredLen: uint32(len(obj)), Codec: hdr.Codec}
	if onDisk != info || hdr.Delta {
		// An earlier run replaced the object and stopped before its
		// transaction: the object header is the truth. (A delta object's
		// rows were committed before its rename.)
		it.stored, it.delta = &onDisk, hdr.Delta
		return it, nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// Candidates: the standalone encoding of a raw object, and the planned
	// delta; the smallest wins, the object as it is if neither pays.
	best, bestCodec := obj, hdr.Codec
	if hdr.Codec == CodecRaw {
		if enc, codec := s.coder.Encode(raw, p.Hint); codec != CodecRaw && len(enc) < len(best) {
			best, bestCodec = enc, codec
			it.alt, it.altC = enc, codec
		}
	}
	// The plan's candidate bases in order (catalog.Tx.PlanCandidates): the
	// first whose delta pays is kept.
	var pinned []ID
	for _, l := range plan {
		if err := s.gc.pin(ctx, l.Base); err != nil {
			return nil, pinned, err
		}
		pinned = append(pinned, l.Base)
		if dobj := r.deltaObject(ctx, raw, l.Base, p.Hint); dobj != nil && len(dobj) < len(best)-len(best)/deltaMinGain {
			dh, _ := object.ParseHeader(dobj)
			best, bestCodec, it.delta, it.link = dobj, dh.Codec, true, l
			break
		}
	}
	if len(best) < len(obj) || it.delta {
		it.obj = best
		it.stored = &ChunkInfo{StoredLen: uint32(len(best)), Codec: bestCodec}
	}
	return it, pinned, nil
}

// deltaObject returns raw coded as a delta object against chunk base, or nil
// when base cannot serve (gone, damaged, a delta itself, another length).
// The base is verified (from the cache, or its object decoded and hashed):
// a delta against wrong bytes would fail every read.
func (r *reencoder) deltaObject(ctx context.Context, raw []byte, base ID, h Hint) []byte {
	s := r.s
	var bd []byte
	if e, ok := s.cache.peek(base); ok {
		k := &Chunk{Data: e.data, c: s.cache, e: e}
		defer k.Release()
		bd = e.data
	} else {
		obj, err := s.rd.getObject(ctx, base, nil)
		if err != nil {
			return nil
		}
		if bd, err = s.coder.Decode(base, obj); err != nil {
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
	if !object.DeltaMayPay(raw, bd, elem) {
		return nil // an unrelated base: no transform can pay
	}
	return s.coder.EncodeDelta(raw, bd, base, elem, &r.scratch)
}

// finishReencode records a group in one transaction: for each chunk, its
// queue and plan rows are dropped and, when stored is not nil, its index
// row's stored length and codec set (keeping the stored-bytes counter
// right); a chunk whose object is not a delta loses a delta row an
// interrupted run left.
func (r *reencoder) finishReencode(items []reencodeItem) error {
	s := r.s
	return s.Update(func(tx *Tx) error {
		for _, it := range items {
			id := it.id
			if it.stored != nil {
				if err := tx.Index().SetStored(id, it.stored.StoredLen, it.stored.Codec); err != nil {
					return err
				}
			}
			if !it.delta {
				if err := tx.Deltas().Drop(id); err != nil {
					return err
				}
			}
			if it.waits {
				// Its plan waited for a later version (standalone
				// encoding only): kept. Released since decide read
				// it, it is queued again by the release: left so.
				if waits, err := tx.DeltaWaits(id); err != nil {
					return err
				} else if !waits {
					continue
				}
			} else if err := tx.Deltas().DropPlan(id); err != nil {
				return err
			}
			if err := tx.Queue().Remove(id); err != nil {
				return err
			}
		}
		return nil
	})
}
