package main

import (
	"context"
	"log"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
	"github.com/ckptfs/ckptfs/gc"
)

// Collections while mounted (mount --gc-every). A deleted checkpoint's
// chunks stay on disk until a collection frees them; a run that deletes its
// old checkpoints as it saves new ones (transformers' save_total_limit,
// Lightning's save_top_k) then grows the store by every save, where a plain
// directory stays the size of the checkpoints kept. The default stays "only
// when ckptfs gc is run" (users of peers' tools distrust collections they
// did not ask for: shared/notes/peers.md); --gc-every makes the daemon run
// the collection `ckptfs gc MOUNTPOINT` runs, with the same safety: the
// default grace period for objects no commit named, the open files'
// manifests marked (FS.LiveManifests), commits in flight pinned (cas). It
// collects this machine's store only: a remote writer's bucket is
// collected by an explicit `ckptfs gc`, whose trash lists involve the other
// writers. A round is skipped while the catalog's counters have not moved
// since the last one and no file deleted while open has been closed
// (fusefs.FS.LetGo), so an idle mount does not walk its store every period.

// collectEvery runs a collection every period until ctx ends, logging what
// each freed and any error (the next round tries again).
func collectEvery(ctx context.Context, every time.Duration, store *cas.Store, fsys *fusefs.FS, logger *log.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	// What the last round saw: the catalog's counters, and how many
	// unlinked files had closed (their chunks, kept while they were open,
	// are garbage once they close, and no counter moves then).
	var last cas.Counts
	var lastGone uint64
	ran := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := store.Stats()
		gone := fsys.LetGo()
		if err == nil && ran && st.Counts == last && gone == lastGone {
			continue // nothing was saved, deleted or let go since the last round
		}
		// The counters before the round: a file deleted while it runs
		// (after its marking) moves them, and the next round collects it.
		// The round's own frees move them too, which costs one more round.
		if err == nil {
			last, lastGone, ran = st.Counts, gone, true
		}
		start := time.Now()
		res, err := gc.Collect(ctx, store, gc.Options{Grace: gc.DefaultGrace, Live: fsys.LiveManifests})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.Printf("gc (every %v): %v", every, err)
			ran = false // try again next period
			continue
		case res.Chunks > 0 || res.FreedPacks > 0:
			logger.Printf("%s in %.1fs (every %v)", gcSummary(res, "freed"), time.Since(start).Seconds(), every)
		}
	}
}
