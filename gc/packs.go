package gc

// Packs (cas: packs of small chunks) seen whole, for Fsck: the pack objects
// no catalog row names, which a crash leaves (a batch wrote a pack and the
// daemon died before the commit that records it), found by the same
// cas.Store.OrphanPacks that Collect's sweep (cas.Store.SweepPacks) and its
// dry run use, and the committed packs none of whose chunks is referenced.

import (
	"context"
	"fmt"

	"github.com/ckptfs/ckptfs/cas"
)

// checkPacks counts the packs gc frees whole (FsckResult.UnreferencedPacks):
// the pack objects no row names, each noted, and the packs whose index
// rows checkObjects read are all unreferenced. It runs after checkObjects,
// whose packSizes names every pack a chunk row names.
func (c *fscker) checkPacks(ctx context.Context) error {
	pc, err := c.s.OrphanPacks(ctx, func(id cas.ID) bool {
		_, ok := c.packSizes[id]
		return ok
	})
	if err != nil {
		return err
	}
	c.res.Packs = pc.Packs
	for _, o := range pc.Orphans {
		c.res.OrphanPacks++
		c.res.UnreferencedPacks++
		c.res.UnreferencedPackBytes += o.Size
		c.res.Notes = append(c.res.Notes, Problem{Kind: "pack-orphan", Pack: o.ID.String(),
			Detail: fmt.Sprintf("%d bytes that no catalog row names (a commit that a crash interrupted wrote them): gc frees the pack once older than its --grace", o.Size)})
	}
	for id, referenced := range c.packRefs {
		// A missing pack's chunks are missing-chunk problems: no space
		// to free.
		if size := c.packSizes[id]; referenced == 0 && size >= 0 {
			c.res.UnreferencedPacks++
			c.res.UnreferencedPackBytes += size
		}
	}
	return nil
}
