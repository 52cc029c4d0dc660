package gc

// Packs (cas: packs of small chunks) seen whole: the pack objects no
// catalog row names, which a crash leaves (a batch wrote a pack and the
// daemon died before the commit that records it), for Collect's dry run
// and for Fsck. Collect's sweep deletes them through cas.Store.SweepPacks;
// the dry run and Fsck must find the same ones without deleting anything.

import (
	"context"
	"fmt"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// orphanPack is a pack object no catalog row names and no live batch holds.
type orphanPack struct {
	id      cas.ID
	size    int64
	modTime time.Time
}

// packCensus is what a listing of the pack objects found.
type packCensus struct {
	packs   int          // pack objects listed
	orphans []orphanPack // those no row names, in the listing's order
}

// bytes returns the orphans' bytes.
func (pc packCensus) bytes() int64 {
	var n int64
	for _, o := range pc.orphans {
		n += o.size
	}
	return n
}

// young returns how many orphans were last modified after cutoff, and how
// many bytes they hold (SweepPacks keeps those).
func (pc packCensus) young(cutoff time.Time) (n int, bytes int64) {
	for _, o := range pc.orphans {
		if !o.modTime.Before(cutoff) {
			n++
			bytes += o.size
		}
	}
	return n, bytes
}

// findOrphanPacks lists the pack objects and returns those SweepPacks
// would delete but for their age: no live batch holds them, and neither a
// pack row nor a chunk row names them (a chunk row naming a pack without a
// pack row is a damaged catalog, and SweepPacks keeps the pack). named
// reports whether chunk rows name a pack; nil walks the chunk index (once,
// and only when a pack has no pack row). The rows are read after the
// listing: a pack a live batch committed during it has its row by then.
func findOrphanPacks(ctx context.Context, s *cas.Store, named func(cas.ID) bool) (packCensus, error) {
	var pc packCensus
	var cand []cas.PackObjectInfo
	err := s.WalkPacks(ctx, func(p cas.PackObjectInfo) error {
		pc.packs++
		if !p.Writing {
			cand = append(cand, p)
		}
		return nil
	})
	if err != nil {
		return pc, fmt.Errorf("list packs: %w", err)
	}
	if len(cand) == 0 {
		return pc, nil
	}
	err = s.View(func(tx *cas.Tx) error {
		keep := cand[:0]
		for _, p := range cand {
			if _, ok, err := tx.Pack(p.ID); err != nil {
				return err
			} else if !ok {
				keep = append(keep, p)
			}
		}
		cand = keep
		if len(cand) == 0 || named != nil {
			return nil
		}
		rowless := make(map[cas.ID]bool, len(cand))
		for _, p := range cand {
			rowless[p.ID] = false
		}
		if err := tx.ForEachChunk(func(_ cas.ID, info cas.ChunkInfo) error {
			if _, ok := rowless[info.Pack]; ok && info.Packed() {
				rowless[info.Pack] = true
			}
			return ctx.Err()
		}); err != nil {
			return err
		}
		named = func(id cas.ID) bool { return rowless[id] }
		return nil
	})
	if err != nil {
		return pc, fmt.Errorf("read pack rows: %w", err)
	}
	for _, p := range cand {
		if !named(p.ID) {
			pc.orphans = append(pc.orphans, orphanPack{id: p.ID, size: p.Size, modTime: p.ModTime})
		}
	}
	return pc, nil
}

// packRefs counts a pack's index rows, and those a file or a delta
// references (Fsck).
type packRefs struct {
	rows, referenced int
}

// checkPacks counts the packs gc frees whole (FsckResult.UnreferencedPacks):
// the pack objects no row names, each noted, and the packs whose index
// rows checkObjects read are all unreferenced. It runs after checkObjects,
// whose packSizes names every pack a chunk row names.
func (c *fscker) checkPacks(ctx context.Context) error {
	pc, err := findOrphanPacks(ctx, c.s, func(id cas.ID) bool {
		_, ok := c.packSizes[id]
		return ok
	})
	if err != nil {
		return err
	}
	c.res.Packs = pc.packs
	for _, o := range pc.orphans {
		c.res.OrphanPacks++
		c.res.UnreferencedPacks++
		c.res.UnreferencedPackBytes += o.size
		c.res.Notes = append(c.res.Notes, Problem{Kind: "pack-orphan", Pack: o.id.String(),
			Detail: fmt.Sprintf("%d bytes that no catalog row names (a commit that a crash interrupted wrote them): gc frees the pack once older than its --grace", o.size)})
	}
	for id, r := range c.packRefs {
		// A missing pack's chunks are missing-chunk problems: no space
		// to free.
		if size := c.packSizes[id]; r.referenced == 0 && size >= 0 {
			c.res.UnreferencedPacks++
			c.res.UnreferencedPackBytes += size
		}
	}
	return nil
}
