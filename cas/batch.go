package cas

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/object"
)

// Batch collects the chunks of one commit. Put writes each chunk's object
// unless the store already has it; Store.Commit then makes the objects
// durable (one backend Sync for all of them, which the local directory turns
// into grouped fdatasyncs: cas/backend/local has the rules), adds their index
// rows in the commit's transaction, and releases the batch, in that order and
// in one call, so no caller can name an object before it is durable or forget
// to unpin.
//
// A batch that finds an object it did not write (in flight in another batch,
// or stored and unindexed) names it too, and Commit's Sync covers it: the
// backend syncs objects whoever wrote them. An unindexed object found stored
// is verified before it is reused (a crash may have torn it).
//
// After a crash, an unsynced object is unindexed: it is verified before it is
// reused (and rewritten if damaged), and the collector deletes it after the
// grace period if no manifest names it.
//
// Put may be called from many goroutines at once.
type Batch struct {
	s *Store

	mu       sync.Mutex
	added    map[ID]ChunkInfo // chunks to index at commit
	synced   map[ID]struct{}  // of those, the ones a Sync made durable
	wrote    map[ID]struct{}  // objects this batch wrote and has not synced
	queue    map[ID]Hint      // chunks stored raw, to re-encode later
	hints    map[ID]Hint      // what each chunk holds, as its Put said
	suggest  map[ID]ID        // chunk → a chunk it is likely close to (SuggestBase)
	inline   map[ID][]byte    // chunks stored inline: their objects (inline.go)
	inlined  int              // raw bytes of the chunks put inline (reserveInline)
	pinned   []ID             // chunks this batch keeps from the sweeper
	released bool
	coming   bool // counted in the store's commits coming (group.go; its mu)

	committed bool // a transaction that added its rows committed, or Keep
	kept      bool // Keep: its packs stay readable through the registry

	// Packs (pack.go). packMu orders appends to the current pack and its
	// writing out; it is taken before mu. inPack and packs are written
	// holding both, and read holding either.
	packMu sync.Mutex
	cur    *packWriter // the pack being filled, nil when none
	spares [][]byte    // pack buffers no one uses: the next pack's, a sort's (pack.go)

	packs       []*packWriter            // packs written out
	inPack      map[ID]packSlot          // chunk → its object in a pack of the batch
	syncedPacks map[*packWriter]struct{} // of packs, those a Sync made durable (mu)
}

// Keep tells Release that the batch's objects are in use although no catalog
// row will name them (the in-memory manifest of a file unlinked while open):
// they are kept, and the caller, which shows such manifests to the
// collector (fusefs.FS.LiveManifests), gives them back with Drop once the
// file has no reader left.
func (b *Batch) Keep() {
	b.mu.Lock()
	b.committed, b.kept = true, true
	b.mu.Unlock()
}

// Drop gives back what a kept batch (Keep) holds once the file whose
// in-memory manifest named its chunks has no reader left (a file unlinked
// while its close committed): its packs are forgotten and deleted when no
// row names them, and its other objects deleted when no row names them and
// no batch pins them, as Release does for a batch never committed. It does
// nothing for a batch not kept or not released yet.
func (b *Batch) Drop() {
	b.mu.Lock()
	if !b.kept || !b.released {
		b.mu.Unlock()
		return
	}
	b.kept = false
	unnamed, packed, packs, packIDs := b.heldLocked(true)
	b.mu.Unlock()
	b.s.packs.forget(b, packed, packs)
	if b.s.readOnly {
		return
	}
	// Failures leave the objects to the collector, as Release's do.
	_, _, _ = b.s.packs.deletePacks(context.Background(), packIDs, nil)
	if len(unnamed) > 0 {
		_, _ = b.s.gc.discardUnnamed(context.Background(), unnamed)
	}
}

// flight is an object being written by some batch; other batches putting the
// same chunk wait for it instead of writing it twice.
type flight struct {
	done    chan struct{}
	info    ChunkInfo
	pending bool // stored raw, to be queued for re-encoding with hint
	hint    Hint
	err     error
}

// NewBatch starts a batch.
func (s *Store) NewBatch() *Batch {
	return &Batch{s: s, added: map[ID]ChunkInfo{}, synced: map[ID]struct{}{}, wrote: map[ID]struct{}{},
		queue: map[ID]Hint{}, hints: map[ID]Hint{}, suggest: map[ID]ID{}, inline: map[ID][]byte{},
		inPack: map[ID]packSlot{}, syncedPacks: map[*packWriter]struct{}{}}
}

// SuggestBase tells the commit that chunk id (Put in this batch) is likely
// close to chunk prev, already committed: the same tensor range one version
// earlier. If the commit indexes id as a new chunk, it plans to store it as
// a delta against prev's chain (deltaplan.go); either way prev has a later
// version, which releases a plan of prev's that waited for one. A wrong
// suggestion costs a re-encode attempt, never bytes.
func (b *Batch) SuggestBase(id, prev ID) {
	b.mu.Lock()
	b.suggest[id] = prev
	b.mu.Unlock()
}

// DeltaCandidate reports whether chunk id, put in b, would be planned as a
// delta at commit if a base were suggested for it (SuggestBase): a chunk b
// added as an object of its own. An inline or packed chunk is never a
// delta, and a chunk the store held already is not b's to plan; a
// committer skips the search for a previous version when no chunk is one.
func (b *Batch) DeltaCandidate(id ID) bool {
	b.mu.Lock() // inPack is written holding both mu and packMu
	defer b.mu.Unlock()
	return b.candidateLocked(id)
}

// candidateLocked is DeltaCandidate with b.mu held.
func (b *Batch) candidateLocked(id ID) bool {
	info, added := b.added[id]
	_, packed := b.inPack[id]
	return added && !info.Inline && !packed
}

// HintWanted reports whether a suggested base for chunk id, put in b, of n
// bytes, does anything at commit: id is a DeltaCandidate, or the store held
// it already and it is too large to be inline or packed, so that its
// suggestion may name a version whose delta plan waits for a later one
// (deltaplan.go), which the commit releases (a save that goes back to
// content stored before).
func (b *Batch) HintWanted(id ID, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, added := b.added[id]; !added {
		return n > b.s.packMax && n > b.s.inlineMax
	}
	return b.candidateLocked(id)
}

// Put stores data as a chunk and returns its reference. When the chunk is
// already indexed nothing is written. data is not retained. It is
// PutHinted(ctx, data, Hint{}).
func (b *Batch) Put(ctx context.Context, data []byte) (ChunkRef, error) {
	return b.PutHinted(ctx, data, Hint{})
}

// PutHinted is Put with a hint of what data holds (see Hint), used to pick its
// codec when the chunk is new. The chunk ID is the hash of data whatever the
// hint, so hinted and unhinted puts of the same bytes dedupe. Its chunk
// ranks after every PutAt's in a pack, in the order put.
func (b *Batch) PutHinted(ctx context.Context, data []byte, h Hint) (ChunkRef, error) {
	return b.PutAt(ctx, data, h, Unordered)
}

// Unordered is the order of a chunk put by Put or PutHinted (PutAt).
const Unordered = math.MaxInt64

// PutAt is PutHinted for the chunk at offset order of its file. A new small
// chunk goes into a pack of the batch (doc.go, Packs), where objects lie
// sorted by order: a committer that puts a file's chunks from several
// goroutines at once, so that they finish in no fixed order, still gets
// them packed in file order, and a reader of the file reads each pack
// front to back. Order only places bytes; the chunk is the same.
func (b *Batch) PutAt(ctx context.Context, data []byte, h Hint, order int64) (ChunkRef, error) {
	if b.s.readOnly {
		return ChunkRef{}, errors.New("store is open read-only")
	}
	if len(data) > maxChunkSize {
		return ChunkRef{}, fmt.Errorf("chunk of %d bytes is over the %d limit", len(data), maxChunkSize)
	}
	id, err := b.s.sum(ctx, data)
	if err != nil {
		return ChunkRef{}, err
	}
	ref := ChunkRef{ID: id, Len: uint32(len(data))}
	// Pin before looking at the index: from here until Release, a sweep will
	// not delete this chunk, and a sweep already deleting it finishes first.
	if err := b.s.gc.pin(ctx, id); err != nil {
		return ref, err
	}
	b.mu.Lock()
	b.pinned = append(b.pinned, id)
	b.mu.Unlock()

	var indexed bool
	if err := b.s.View(func(tx *Tx) error {
		_, ok, err := tx.Chunk(id)
		indexed = ok
		return err
	}); err != nil {
		return ref, err
	}
	if indexed {
		return ref, nil
	}
	// Inline, as packed, only chunks of no known element type: a tensor's
	// chunk is a delta base and a delta (the re-encoder rewrites objects),
	// and a file of tensors writes objects anyway.
	if h == (Hint{}) && b.s.inlines(len(data)) && b.reserveInline(len(data)) {
		b.putInline(id, data, h)
		return ref, nil
	}
	if h == (Hint{}) && b.s.packs.packs(len(data)) {
		// Small and of no known element type: content-defined chunks of a
		// format without a tensor layout (doc.go, Packs).
		return ref, b.putPacked(ctx, id, data, h, order)
	}

	s := b.s
	s.flightMu.Lock()
	if f, ok := s.flights[id]; ok {
		s.flightMu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return ref, ctx.Err()
		}
		if f.err != nil {
			return ref, f.err
		}
		b.note(id, f.info, f.pending, f.hint)
		return ref, nil
	}
	f := &flight{done: make(chan struct{}), hint: h}
	s.flights[id] = f
	s.flightMu.Unlock()

	f.info, f.pending, f.err = s.writeObject(ctx, id, data, h)

	s.flightMu.Lock()
	delete(s.flights, id)
	s.flightMu.Unlock()
	close(f.done)

	if f.err != nil {
		return ref, f.err
	}
	b.mu.Lock()
	b.wrote[id] = struct{}{}
	b.mu.Unlock()
	b.note(id, f.info, f.pending, h)
	return ref, nil
}

// Reuse pins chunks the store has indexed, which the batch's commit will
// name without putting them again (a file that grows by appends keeps its
// committed chunks but the last: fusefs/stage). From here until Release a
// sweep does not delete them, as for a chunk Put found stored. It fails if
// one of them is not indexed any more (a collection deleted it before the
// pin): the caller then puts the bytes instead.
func (b *Batch) Reuse(ctx context.Context, refs []ChunkRef) error {
	pinned := make([]ID, 0, len(refs))
	defer func() { // those pinned, whatever stopped the loop: Release unpins them
		b.mu.Lock()
		b.pinned = append(b.pinned, pinned...)
		b.mu.Unlock()
	}()
	for _, r := range refs {
		if err := b.s.gc.pin(ctx, r.ID); err != nil {
			return err
		}
		pinned = append(pinned, r.ID)
	}
	return b.s.View(func(tx *Tx) error {
		for _, r := range refs {
			if _, ok, err := tx.Chunk(r.ID); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("reuse chunk %v: %w", r.ID, ErrMissing)
			}
		}
		return nil
	})
}

// sum hashes data in one of the store's hash slots.
func (s *Store) sum(ctx context.Context, data []byte) (ID, error) {
	select {
	case s.hashSlots <- struct{}{}:
	case <-ctx.Done():
		return ID{}, ctx.Err()
	}
	defer func() { <-s.hashSlots }()
	return Sum(data), nil
}

// note records chunk id's object for the commit: its index row, and its
// queue row if it was stored raw.
func (b *Batch) note(id ID, info ChunkInfo, pending bool, h Hint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.added[id] = info
	b.hints[id] = h
	if pending {
		b.queue[id] = h
	}
}

// Sync makes durable every object the batch names (its own and those it found
// written by others but not indexed), in one backend Sync. Objects an earlier
// Sync of this batch made durable are skipped. Commit calls it; a caller may
// call it earlier (a streaming writer, say) to overlap the disk's work with
// its own, outside any lock it must hold for the commit.
func (b *Batch) Sync(ctx context.Context) error {
	if err := b.s.checkInPlace(); err != nil {
		return err
	}
	b.packMu.Lock()
	b.mu.Lock()
	if b.released {
		b.mu.Unlock()
		b.packMu.Unlock()
		return errors.New("sync of a released batch")
	}
	b.mu.Unlock()
	if err := b.flushPackLocked(ctx); err != nil {
		b.packMu.Unlock()
		return err
	}
	b.mu.Lock()
	ids := make([]ID, 0, len(b.added))
	hs := make([]backend.Handle, 0, len(b.added))
	for id := range b.added {
		if _, ok := b.synced[id]; ok {
			continue
		}
		ids = append(ids, id)
		if _, packed := b.inPack[id]; !packed { // packed: in a pack written above or before
			hs = append(hs, chunkHandle(id))
		}
	}
	var ws []*packWriter
	for _, w := range b.packs {
		if _, ok := b.syncedPacks[w]; !ok {
			ws = append(ws, w)
			hs = append(hs, packHandle(w.id))
		}
	}
	b.mu.Unlock()
	b.packMu.Unlock()
	if len(hs) > 0 {
		if err := b.s.objects.Sync(ctx, hs); err != nil {
			return err
		}
	}
	b.mu.Lock()
	for _, id := range ids {
		b.synced[id] = struct{}{}
		delete(b.wrote, id)
	}
	for _, w := range ws {
		b.syncedPacks[w] = struct{}{}
	}
	b.mu.Unlock()
	return nil
}

// Release unpins the batch's chunks and gives back what the backend holds for
// objects it wrote but never synced. Commit releases its batch; call Release
// only for a batch you will not commit. It may be called more than once; the
// batch must not be used after.
//
// A batch that was never committed (its write failed or was abandoned) nor
// kept (Keep) also deletes the objects it names that no index row names and
// no other batch pins (collector.discardUnnamed): they would otherwise fill the
// disk until a collection's grace period is over.
func (b *Batch) Release() {
	b.packMu.Lock()
	b.spares = nil // a kept batch stays reachable from the registry of packs
	b.packMu.Unlock()
	b.mu.Lock()
	if b.released {
		b.mu.Unlock()
		return
	}
	b.released = true
	pinned := b.pinned
	b.pinned = nil
	var abandoned []backend.Handle
	for id := range b.wrote {
		abandoned = append(abandoned, chunkHandle(id))
	}
	b.wrote = nil
	unnamed, packed, packs, packIDs := b.heldLocked(!b.committed)
	for _, w := range packs {
		if _, ok := b.syncedPacks[w]; !ok {
			abandoned = append(abandoned, packHandle(w.id))
		}
	}
	kept := b.kept
	b.mu.Unlock()
	if f, ok := b.s.objects.(forgetter); ok && len(abandoned) > 0 {
		f.Forget(abandoned)
	}
	if !kept {
		// A kept batch's packs stay registered (readable, never swept) for
		// the life of the store: an unlinked file's in-memory manifest
		// names their chunks, which no index row locates.
		b.s.packs.forget(b, packed, packs)
		// Packs no row names (an uncommitted batch's, or a commit's whose
		// chunks were all indexed by others first) go now.
		_, _, _ = b.s.packs.deletePacks(context.Background(), packIDs, nil)
	}
	b.s.gc.unpin(pinned)
	if len(unnamed) > 0 && !b.s.readOnly {
		// A failure leaves the objects to the collector, as before this
		// existed; the write that failed has reported its own error.
		_, _ = b.s.gc.discardUnnamed(context.Background(), unnamed)
	}
}

// heldLocked lists what b holds for Release and Drop: with objects, the
// chunks it put as object files of their own (unnamed if no commit names
// them); the chunks it registered with the packs (packed, and inline ones,
// registered alike: inline.go); and its packs, with their IDs. b.mu held.
func (b *Batch) heldLocked(objects bool) (unnamed, packed []ID, packs []*packWriter, packIDs []ID) {
	if objects {
		unnamed = make([]ID, 0, len(b.added))
		for id, info := range b.added {
			if _, inPack := b.inPack[id]; !inPack && !info.Inline {
				unnamed = append(unnamed, id)
			}
		}
	}
	packed = make([]ID, 0, len(b.inPack)+len(b.inline))
	for id := range b.inPack {
		packed = append(packed, id)
	}
	for id := range b.inline {
		packed = append(packed, id)
	}
	packIDs = make([]ID, 0, len(b.packs))
	for _, w := range b.packs {
		packIDs = append(packIDs, w.id)
	}
	return unnamed, packed, b.packs, packIDs
}

// forgetter is a backend that holds resources from Put until Sync (the local
// directory's descriptors), which a batch given up on hands back.
type forgetter interface {
	Forget(hs []backend.Handle)
}

// Commit is the one way to commit a batch: it makes b's objects durable
// (Sync), then runs fn in one catalog transaction that first adds the index
// rows of b's chunks, then releases b, whether or not anything failed. fn
// names the chunks (manifests); the transaction commits only if fn returns
// nil. ctx bounds the Sync.
func (s *Store) Commit(ctx context.Context, b *Batch, fn func(*Tx) error) error {
	return s.CommitWith(ctx, b, func(update func(func(*Tx) error) error) error {
		return update(fn)
	})
}

// CommitWith is Commit for callers that must take their own locks between
// the Sync and the transaction (the filesystem's namespace lock): after the
// Sync it calls body, which calls update at most once to run the
// transaction (update adds b's index rows, then runs its fn), and may do
// more work under its locks after. b is released when body returns. When the
// Sync fails, body is not called.
func (s *Store) CommitWith(ctx context.Context, b *Batch, body func(update func(func(*Tx) error) error) error) error {
	defer b.Release()
	if b.s != s {
		return errors.New("commit of another store's batch")
	}
	if err := b.Sync(ctx); err != nil {
		return err
	}
	used := false
	return body(func(fn func(*Tx) error) error {
		if used {
			return errors.New("a batch commits in one transaction")
		}
		used = true
		return s.Update(func(tx *Tx) error {
			if err := commitBatch(tx, b); err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				return err
			}
			return tx.Uploads().CountCommit() // the remote tier uploads up to it (cas/remote)
		})
	})
}

// commitBatch adds the index rows of b's chunks, and the re-encode queue rows
// of those stored raw because no inline encoder was free. A chunk that is
// already indexed (another commit got there first) keeps its row and gets no
// queue row, so a chunk is queued only if the row that indexes it was written
// for a raw-pending object. Commit calls it after b.Sync, inside the
// transaction that commits the manifests naming the chunks; it checks again
// that every object is durable.
func commitBatch(t *Tx, b *Batch) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released {
		return errors.New("commit of a released batch")
	}
	for id := range b.added {
		if _, ok := b.synced[id]; !ok {
			return fmt.Errorf("commit of a batch that Sync has not made durable: chunk %v", id)
		}
	}
	t.OnCommit(func() {
		b.mu.Lock()
		b.committed = true
		b.mu.Unlock()
	})
	if err := commitPacks(t, b); err != nil {
		return err
	}
	// Each suggestion names the version before one of this commit's
	// chunks: a plan of its that waited for a later version is released
	// (deltaplan.go), whether or not the new chunk is new or planned.
	for id, prev := range b.suggest {
		if id != prev {
			if err := t.Deltas().Release(prev); err != nil {
				return fmt.Errorf("release the delta plan of chunk %v: %w", prev, err)
			}
		}
	}
	for id, info := range b.added {
		if info.Inline {
			if _, err := t.Index().AddInline(id, info, b.inline[id]); err != nil {
				return fmt.Errorf("index inline chunk %v: %w", id, err)
			}
			continue // never queued nor planned as a delta: it stays in the catalog
		}
		if sl, packed := b.inPack[id]; packed {
			// The pack's own record of the object: written out (Sync),
			// so sorted and named.
			pack, e := sl.loc()
			info.Pack, info.Offset, info.StoredLen, info.Codec = pack, uint32(e.off), uint32(e.n), e.codec
		}
		added, err := t.Index().Add(id, info)
		if err != nil {
			return fmt.Errorf("index chunk %v: %w", id, err)
		}
		// A packed chunk is never re-encoded (it would move out of its
		// pack): queued only by a put of the same bytes with a hint, which
		// wrote an object of its own that the row does not name.
		if h, pending := b.queue[id]; pending && added && !info.Packed() {
			if err := t.Queue().Add(id, h, info.RawLen); err != nil {
				return fmt.Errorf("queue chunk %v for re-encoding: %w", id, err)
			}
		}
		if prev, ok := b.suggest[id]; ok && added && !info.Packed() {
			if err := t.Deltas().Plan(id, prev, b.hints[id], info.RawLen, b.s.deltaKeyframe, b.s.deltaWait); err != nil {
				return fmt.Errorf("plan a delta for chunk %v: %w", id, err)
			}
		}
	}
	return dropDeadPacks(t, b)
}

// encodeIfFree encodes data (an object's bytes) when one of the inline
// encoders is free (Options.InlineEncoders), and reports whether it did.
func (s *Store) encodeIfFree(data []byte, h Hint) (obj []byte, codec Codec, ok bool) {
	release, ok := s.re.tryEncodeSlot(len(data))
	if !ok {
		return nil, CodecRaw, false
	}
	defer release()
	obj, codec = s.coder.Encode(data, h)
	return obj, codec, true
}

// writeObject stores data as chunk id's object, unless a verified object is
// already there. Making it durable is Batch.Sync's job.
//
// The payload is encoded inline when an encode slot is free (see
// Options.InlineEncoders); otherwise it is stored raw and pending reports that
// the chunk should be queued for a background re-encode. An object that already
// exists is kept if it verifies (pending if it is raw: it may be an earlier
// raw-pending write whose commit never happened), and replaced otherwise (the
// backend replaces atomically, and durably before the rename in the local
// directory, since another batch may have found the old object).
func (s *Store) writeObject(ctx context.Context, id ID, data []byte, h Hint) (info ChunkInfo, pending bool, err error) {
	if _, err := s.objects.Stat(ctx, chunkHandle(id)); err == nil {
		// A delta object is not reused: no row records its base (it was
		// swept, or its commit never happened), so nothing would keep the
		// base from being swept. It is replaced by a standalone one.
		if info, h, err := s.rd.verifyObject(ctx, id); err == nil && !h.Delta {
			return info, info.Codec == CodecRaw && info.RawLen > 0, nil
		} else if ctx.Err() != nil {
			return ChunkInfo{}, false, ctx.Err()
		}
	}
	obj, codec, ok := s.encodeIfFree(data, h)
	if !ok && s.re.slots != nil && s.ReencodeBacklog() >= s.re.maxBacklog {
		// The queue is full: this commit waits for an encoder rather than
		// add to it, so a store written without pause keeps at most
		// maxBacklog raw (reencode.go).
		select {
		case s.re.slots <- struct{}{}:
			obj, codec = s.coder.Encode(data, h)
			<-s.re.slots
			ok = true
		case <-ctx.Done():
			return ChunkInfo{}, false, ctx.Err()
		}
	}
	if !ok {
		obj, codec, pending = object.EncodeRaw(data), CodecRaw, true
	}
	if err := s.objects.Put(ctx, chunkHandle(id), obj, backend.PutOptions{}); err != nil {
		return ChunkInfo{}, false, fmt.Errorf("write chunk %v: %w", id, err)
	}
	return ChunkInfo{RawLen: uint32(len(data)), StoredLen: uint32(len(obj)), Codec: codec}, pending, nil
}
