package cas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Garbage collection runs beside commits. The race it must never lose (the one
// that cost xet users data): a commit deduplicates against an existing chunk
// that the collector, which saw no manifest naming it, deletes before the
// commit's manifest lands. Three in-memory sets close it, all under collector.mu:
//
//   - pins: every chunk a live Batch has Put, deduplicated or written, from
//     before Put looks at the index until the batch is released (after its
//     transaction has ended).
//   - watch: while a collection runs (BeginCollect to its end), the chunks of
//     every batch released. A commit that landed after the collector read the
//     manifests, and released its pins before the sweep, is caught here.
//   - deleting: the chunks a sweep step (or a discard, below) has chosen, from
//     the choice until their index rows are removed and their objects are gone.
//
// The collector calls BeginCollect before it reads any manifest, so a chunk
// named by a manifest it did not see is pinned or watched when Sweep chooses.
// Sweep chooses only chunks in neither set; Put on a chunk being deleted waits
// for the step to end and then finds it absent, so it writes it anew.

// BeginCollect starts a collection: call it before reading the manifests to
// mark, and call the returned function when the collection is over. Only one
// collection runs at a time; a second waits.
func (s *Store) BeginCollect() (end func()) {
	s.gc.collectMu.Lock()
	s.gc.mu.Lock()
	s.gc.watch = map[ID]struct{}{}
	s.gc.mu.Unlock()
	return func() {
		s.gc.mu.Lock()
		s.gc.watch = nil
		s.gc.mu.Unlock()
		s.gc.collectMu.Unlock()
	}
}

func (c *collector) pin(ctx context.Context, id ID) error {
	c.mu.Lock()
	for {
		done, ok := c.deleting[id]
		if !ok {
			break
		}
		c.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
	}
	c.pins[id]++
	c.mu.Unlock()
	return nil
}

func (c *collector) unpin(ids []ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.watch != nil {
			c.watch[id] = struct{}{}
		}
		if c.pins[id]--; c.pins[id] <= 0 {
			delete(c.pins, id)
		}
	}
}

// ObjectInfo describes one chunk object found by WalkObjects.
type ObjectInfo struct {
	ID      ID
	Size    int64
	ModTime time.Time // the grace period counts from it
}

// WalkObjects calls fn for every chunk object, in no particular order.
// Debris (temporary files a crash left) is not reported: RemoveStale deletes
// it.
func (s *Store) WalkObjects(ctx context.Context, fn func(ObjectInfo) error) error {
	return s.objects.List(ctx, backend.Chunk, func(in backend.Info) error {
		id, ok := handleID(in.Handle)
		if !ok {
			return nil
		}
		return fn(ObjectInfo{ID: id, Size: in.Size, ModTime: in.ModTime})
	})
}

// OrphanPack is a pack object that no catalog row names and no live batch
// holds: a commit that a crash interrupted wrote it (OrphanPacks).
type OrphanPack struct {
	ID      ID
	Size    int64
	ModTime time.Time // the grace period counts from it
}

// PackCensus is what OrphanPacks found.
type PackCensus struct {
	Packs   int          // pack objects listed
	Orphans []OrphanPack // those no row names, in the listing's order
}

// Bytes returns the orphans' bytes.
func (pc PackCensus) Bytes() int64 {
	var n int64
	for _, o := range pc.Orphans {
		n += o.Size
	}
	return n
}

// Young returns how many orphans were last modified at or after cutoff,
// and their bytes (SweepPacks keeps those).
func (pc PackCensus) Young(cutoff time.Time) (n int, bytes int64) {
	for _, o := range pc.Orphans {
		if !o.ModTime.Before(cutoff) {
			n++
			bytes += o.Size
		}
	}
	return n, bytes
}

// OrphanPacks lists the pack objects and returns, whatever their age, those
// no live batch holds and neither a pack row nor a chunk row names (a chunk
// row naming a pack without a pack row is a damaged catalog: the pack is
// kept, and its chunks' reads and fsck say so). SweepPacks deletes the old
// ones; gc's dry run and fsck count them. named reports whether chunk rows
// name a pack (fsck knows already); nil walks the chunk index, once and
// only when a pack has no pack row. The rows are read after the listing:
// a pack a live batch committed during it has its row by then.
func (s *Store) OrphanPacks(ctx context.Context, named func(ID) bool) (PackCensus, error) {
	var pc PackCensus
	var cand []OrphanPack
	err := s.objects.List(ctx, backend.Pack, func(in backend.Info) error {
		pc.Packs++
		id, err := ParseID(in.Handle.Name)
		if err != nil {
			return nil
		}
		s.packs.mu.Lock()
		writing := s.packs.live[id] > 0
		s.packs.mu.Unlock()
		if !writing {
			cand = append(cand, OrphanPack{ID: id, Size: in.Size, ModTime: in.ModTime})
		}
		return nil
	})
	if err != nil {
		return pc, fmt.Errorf("list packs: %w", err)
	}
	if len(cand) == 0 {
		return pc, nil
	}
	err = s.View(func(tx *Tx) error {
		rowless := cand[:0]
		for _, p := range cand {
			if _, ok, err := tx.Pack(p.ID); err != nil {
				return err
			} else if !ok {
				rowless = append(rowless, p)
			}
		}
		cand = rowless
		if len(cand) == 0 || named != nil {
			return nil
		}
		byChunks := make(map[ID]bool, len(cand))
		for _, p := range cand {
			byChunks[p.ID] = false
		}
		if err := tx.ForEachChunk(func(_ ID, info ChunkInfo) error {
			if _, ok := byChunks[info.Pack]; ok && info.Packed() {
				byChunks[info.Pack] = true
			}
			return ctx.Err()
		}); err != nil {
			return err
		}
		named = func(id ID) bool { return byChunks[id] }
		return nil
	})
	if err != nil {
		return pc, fmt.Errorf("read pack rows: %w", err)
	}
	for _, p := range cand {
		if !named(p.ID) {
			pc.Orphans = append(pc.Orphans, p)
		}
	}
	return pc, nil
}

// StatObject describes chunk id's object; ok is false when there is none.
func (s *Store) StatObject(ctx context.Context, id ID) (info ObjectInfo, ok bool, err error) {
	in, err := s.objects.Stat(ctx, chunkHandle(id))
	if errors.Is(err, backend.ErrNotExist) {
		return ObjectInfo{}, false, nil
	}
	if err != nil {
		return ObjectInfo{}, false, fmt.Errorf("stat object %v: %w", id, err)
	}
	return ObjectInfo{ID: id, Size: in.Size, ModTime: in.ModTime}, true, nil
}

// RemoveStale deletes debris of interrupted object writes (temporary files)
// last modified before before, when the backend can leave any, and returns
// how many it removed.
func (s *Store) RemoveStale(ctx context.Context, before time.Time) (int, error) {
	if s.readOnly {
		return 0, errors.New("store is open read-only")
	}
	j, ok := s.objects.(backend.Janitor)
	if !ok {
		return 0, nil
	}
	return j.RemoveStale(ctx, before)
}

// SweepResult is what one Sweep call removed.
type SweepResult struct {
	Chunks      int   // objects deleted
	StoredBytes int64 // bytes of object files deleted
	RawBytes    int64 // raw bytes of the deleted chunks that were indexed
	Skipped     int   // candidates kept: pinned by a commit in progress, or named again
	BasesKept   int   // candidates kept because a delta still stored needs them as its base
	Packed      int   // of the chunks whose index rows went, those in packs
	Packs       int   // packs deleted: their last chunk went
	PackBytes   int64 // their bytes
}

// Sweep deletes the objects and index rows of candidates, which the caller
// found unreachable in manifests read after BeginCollect. Chunks pinned by a
// commit in progress, or released by one since BeginCollect, are kept. Index
// rows are removed before the objects, so a crash in between leaves unindexed
// objects (harmless: the next collection removes them), never index rows
// without objects.
func (s *Store) Sweep(ctx context.Context, candidates []ID) (SweepResult, error) {
	var res SweepResult
	if s.readOnly {
		return res, errors.New("store is open read-only")
	}
	s.gc.mu.Lock()
	chosen := make([]ID, 0, len(candidates))
	done := make(chan struct{})
	for _, id := range candidates {
		_, watched := s.gc.watch[id]
		if s.gc.pins[id] > 0 || watched {
			res.Skipped++
			continue
		}
		if _, ok := s.gc.deleting[id]; ok {
			continue
		}
		s.gc.deleting[id] = done
		chosen = append(chosen, id)
	}
	s.gc.mu.Unlock()
	defer s.gc.endDeleting(chosen, done)

	var doomed []ID
	var inline []ID // inline chunks: their objects went with their rows
	var inlineBytes int64
	var packs []ID // packs that lost chunks
	var packSizes []int64
	err := s.Update(func(tx *Tx) error {
		doomed, packs, packSizes = doomed[:0], packs[:0], packSizes[:0]
		inline, inlineBytes = inline[:0], 0
		res.RawBytes, res.BasesKept, res.Packed = 0, 0, 0
		// Deltas first, so that a base whose deltas all go in this step
		// goes too, and their objects are deleted before its object.
		var deltas, others []ID
		for _, id := range chosen {
			if _, _, ok, err := tx.Delta(id); err != nil {
				return err
			} else if ok {
				deltas = append(deltas, id)
			} else {
				others = append(others, id)
			}
		}
		for _, id := range append(deltas, others...) {
			if tx.IsBase(id) {
				// A delta that is not garbage (or not yet known to be)
				// needs it: kept whatever the caller marked.
				res.BasesKept++
				continue
			}
			info, indexed, err := tx.Chunk(id)
			if err != nil {
				return err
			}
			if indexed && info.Packed() {
				p, _, err := tx.Pack(info.Pack)
				if err != nil {
					return err
				}
				packs, packSizes = append(packs, info.Pack), append(packSizes, p.Size)
				res.Packed++
			}
			if indexed {
				if err := tx.Index().Delete(id, info); err != nil {
					return err
				}
				res.RawBytes += int64(info.RawLen)
			}
			if indexed && info.Inline {
				// Its object was in the catalog, and went with the row:
				// no file to delete, nor queue or delta rows to drop.
				inline, inlineBytes = append(inline, id), inlineBytes+int64(info.StoredLen)
				continue
			}
			// A queued chunk leaves the queue with its index row
			// (reencode.go), a delta with its delta rows (deltaplan.go).
			if err := tx.Queue().Remove(id); err != nil {
				return err
			}
			if err := tx.Deltas().DropPlan(id); err != nil {
				return err
			}
			if err := tx.Deltas().Drop(id); err != nil {
				return err
			}
			doomed = append(doomed, id)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	for _, id := range inline {
		s.cache.drop(id)
	}
	res.Chunks, res.StoredBytes = len(inline), inlineBytes
	for _, id := range doomed {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		h := chunkHandle(id)
		st, err := s.objects.Stat(ctx, h)
		gone := errors.Is(err, backend.ErrNotExist) // or unusable: delete it all the same
		if err != nil && !gone {
			return res, fmt.Errorf("sweep %v: %w", id, err)
		}
		if err := s.objects.Delete(ctx, h); err != nil {
			return res, fmt.Errorf("sweep %v: %w", id, err)
		}
		s.cache.drop(id)
		if !gone {
			res.Chunks++
			res.StoredBytes += st.Size
		}
	}
	// Packs whose last chunk went have no row now: their objects go (a
	// crash before leaves them to SweepPacks).
	seen := map[ID]bool{}
	var ids []ID
	var sizes []int64
	for i, p := range packs {
		if !seen[p] {
			seen[p] = true
			ids, sizes = append(ids, p), append(sizes, packSizes[i])
		}
	}
	n, freed, err := s.packs.deletePacks(ctx, ids, sizes)
	res.Packs, res.PackBytes = n, freed
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	return res, nil
}

// endDeleting ends a deletion step: pins waiting for its chunks go on.
func (c *collector) endDeleting(chosen []ID, done chan struct{}) {
	c.mu.Lock()
	for _, id := range chosen {
		delete(c.deleting, id)
	}
	close(done)
	c.mu.Unlock()
}

// discardUnnamed deletes the objects of ids that no index row names and no
// batch pins: the chunks of a batch released without a commit (a write that
// failed, on a full disk say, or was abandoned). No commit ever named them,
// so they need not wait for a collection's grace period, which would keep a
// full disk full. It is a sweep step restricted to unindexed chunks, under the
// same rules: a chunk another batch pins (it found the object, in flight or
// on disk, and may commit it) is kept, a chunk indexed meanwhile is kept, and
// a Put of a chosen chunk waits until the object is gone and writes it anew.
// Errors are returned for logging only: what is left is the collector's.
func (c *collector) discardUnnamed(ctx context.Context, ids []ID) (int, error) {
	s := c.s
	c.mu.Lock()
	chosen := make([]ID, 0, len(ids))
	done := make(chan struct{})
	for _, id := range ids {
		if _, ok := c.deleting[id]; ok || c.pins[id] > 0 {
			continue
		}
		c.deleting[id] = done
		chosen = append(chosen, id)
	}
	c.mu.Unlock()
	defer c.endDeleting(chosen, done)
	if len(chosen) == 0 {
		return 0, nil
	}
	unnamed := make([]ID, 0, len(chosen))
	if err := s.View(func(tx *Tx) error {
		for _, id := range chosen {
			_, indexed, err := tx.Chunk(id)
			if err != nil {
				return err
			}
			if !indexed {
				unnamed = append(unnamed, id)
			}
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("discard unnamed chunks: %w", err)
	}
	n := 0
	for _, id := range unnamed {
		if err := s.objects.Delete(ctx, chunkHandle(id)); err != nil {
			return n, fmt.Errorf("discard unnamed chunk %v: %w", id, err)
		}
		s.cache.drop(id)
		n++
	}
	return n, nil
}
