package gc

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/remote"
)

// DefaultGrace is how old an unreferenced object must be before Collect
// deletes it.
const DefaultGrace = 24 * time.Hour

// tempMinAge is how old a temporary object file must be to be removed.
const tempMinAge = time.Hour

// sweepBatch is how many chunks one sweep step deletes: each step is one
// catalog transaction, during which commits that need one of its chunks wait.
const sweepBatch = 4096

// Options configure Collect.
type Options struct {
	// Grace keeps unreferenced objects younger than this that no commit ever
	// named (no index row: a crashed or abandoned writer's). Unreferenced
	// committed chunks are deleted whatever their age.
	Grace  time.Duration
	DryRun bool // report what would be freed, change nothing
	// Live returns the manifests of files the daemon has open that the catalog
	// may no longer name. Nil when the store is not mounted.
	Live func() []*cas.Manifest
	// Progress, when set, is called as phases advance.
	Progress func(Progress)
	// Remote, when set, is the store's remote tier, collected too
	// (remote.Tier.Collect) with the same grace period. Only the remote's
	// writer (lock holder) sets it.
	Remote *remote.Tier
}

// Progress reports how far a phase has come; Total is 0 when unknown. Bytes
// says Done and Total count bytes rather than items.
type Progress struct {
	Phase       string
	Done, Total int64
	Bytes       bool `json:",omitempty"`
}

// Result is what a collection found and freed.
type Result struct {
	DryRun        bool  `json:"dry_run"`
	Objects       int   `json:"objects"`         // object files seen
	Marked        int   `json:"marked"`          // distinct chunks named by manifests
	Unreferenced  int   `json:"unreferenced"`    // objects or index rows no manifest names
	Young         int   `json:"young"`           // never-committed unreferenced objects kept by the grace period
	Skipped       int   `json:"skipped"`         // kept because a concurrent commit uses them
	Chunks        int   `json:"freed_chunks"`    // objects deleted (or that would be)
	FreedBytes    int64 `json:"freed_bytes"`     // bytes of object files deleted
	FreedRawBytes int64 `json:"freed_raw_bytes"` // raw bytes of the deleted chunks
	IndexRows     int   `json:"index_rows"`      // index rows without an object removed
	TempFiles     int   `json:"temp_files"`      // leftover temporary files removed
	// Bases that no manifest names, kept (and counted in Marked) because
	// deltas that are kept are coded against them: deleting the files of
	// a base frees it only with the last of its deltas.
	BasesKept         int   `json:"bases_kept"`
	BasesKeptBytes    int64 `json:"bases_kept_bytes"`     // their object files' bytes (index rows)
	BasesKeptRawBytes int64 `json:"bases_kept_raw_bytes"` // their raw bytes
	LiveDeltas        int   `json:"live_deltas"`          // the kept deltas coded against them
	// Packs (cas: packs of small chunks). A packed chunk's index row goes
	// like any (counted in Chunks, its bytes in FreedBytes only when its
	// whole pack goes); a pack's object goes with its last chunk, and a
	// pack no commit named (a crash's) once past the grace period. Packs
	// are never rewritten, so a collection frees whole packs or none of a
	// pack's bytes. A dry run predicts all of these from the same rows.
	Packs          int   `json:"packs"`               // pack objects seen (those freed included)
	PackedChunks   int   `json:"freed_packed_chunks"` // packed chunks whose rows were deleted
	FreedPacks     int   `json:"freed_packs"`         // packs deleted (last chunk gone, or never committed)
	FreedPackBytes int64 `json:"freed_pack_bytes"`    // their bytes (also in FreedBytes)
	OrphanPacks    int   `json:"orphan_packs"`        // of FreedPacks, those no commit named (a crash's)
	YoungPacks     int   `json:"young_packs"`         // never-committed packs kept by the grace period
	// PackDeadBytes is the space that dead chunks still hold in packs with
	// live chunks after the collection: not freed until the whole pack is
	// dead (packs are not rewritten).
	PackDeadBytes int64 `json:"pack_dead_bytes"`
	// The remote's collection, when Options.Remote.
	remote.CollectResult
}

func report(opts Options, phase string, done, total int64) {
	if opts.Progress != nil {
		opts.Progress(Progress{Phase: phase, Done: done, Total: total})
	}
}

// Collect runs one mark-and-sweep collection on s.
func Collect(ctx context.Context, s *cas.Store, opts Options) (Result, error) {
	res := Result{DryRun: opts.DryRun}
	end := s.BeginCollect()
	defer end()
	start := time.Now()

	// Mark. BeginCollect came first, so any manifest committed after this
	// read has its chunks pinned or watched (cas/sweep.go).
	marked, total, err := mark(ctx, s, opts)
	if err != nil {
		return res, err
	}
	isDelta, kept, err := markDeltaBases(s, marked)
	if err != nil {
		return res, err
	}
	res.BasesKept, res.BasesKeptBytes, res.BasesKeptRawBytes, res.LiveDeltas = kept.chunks, kept.stored, kept.raw, kept.deltas
	res.Marked = marked.len()
	report(opts, "mark", total, total)

	c, err := findCandidates(ctx, s, opts, marked, start.Add(-opts.Grace), &res)
	if err != nil {
		return res, err
	}
	// Deltas before other chunks: a base whose deltas are garbage too is
	// swept after them (Sweep keeps a base while a delta row names it).
	sort.SliceStable(c.ids, func(i, j int) bool {
		return isDelta.has(c.ids[i]) && !isDelta.has(c.ids[j])
	})

	if opts.DryRun {
		if err := c.dryRun(ctx, s, start.Add(-opts.Grace), &res); err != nil {
			return res, err
		}
		return collectRemote(ctx, s, opts, start, res)
	}
	if err := c.sweep(ctx, s, opts, &res); err != nil {
		return res, err
	}
	n, err := s.RemoveStale(ctx, start.Add(-tempMinAge))
	res.TempFiles = n
	if err != nil {
		return res, fmt.Errorf("remove temporary files: %w", err)
	}
	if err := sweepPacks(ctx, s, start.Add(-opts.Grace), &res); err != nil {
		return res, err
	}
	return collectRemote(ctx, s, opts, start, res)
}

// sweepPacks deletes the packs no commit named (a crash's), past the grace
// period, and reports the space dead chunks hold in the packs left, the
// packs seen (those the sweep before it freed, whose last chunks went,
// and those SweepPacks listed) and the orphans kept by the grace period.
func sweepPacks(ctx context.Context, s *cas.Store, cutoff time.Time, res *Result) error {
	ps, err := s.SweepPacks(ctx, cutoff)
	res.Packs = res.FreedPacks + ps.Packs
	res.FreedPacks += ps.Deleted
	res.OrphanPacks += ps.Deleted
	res.FreedPackBytes += ps.Bytes
	res.FreedBytes += ps.Bytes
	res.YoungPacks = ps.YoungOrphans
	if err != nil {
		return fmt.Errorf("sweep packs: %w", err)
	}
	st, err := s.Stats()
	if err != nil {
		return fmt.Errorf("sweep packs: %w", err)
	}
	res.PackDeadBytes = st.PackBytes - st.PackedBytes
	return nil
}

// candidates are what a collection deletes: unmarked objects past the grace
// period, unmarked indexed objects of any age, and unmarked index rows that
// no object backs.
type candidates struct {
	ids   []cas.ID
	bytes int64  // their objects' bytes
	seen  *idSet // every object the scan found, sealed
}

// findCandidates scans the objects and the index for candidates, counting
// Objects, Unreferenced, Young and IndexRows in res.
func findCandidates(ctx context.Context, s *cas.Store, opts Options, marked *idSet, cutoff time.Time, res *Result) (*candidates, error) {
	c := &candidates{seen: &idSet{}}
	var young []cas.ObjectInfo
	err := s.WalkObjects(ctx, func(o cas.ObjectInfo) error {
		res.Objects++
		c.seen.add(o.ID)
		if res.Objects%4096 == 0 {
			report(opts, "scan", int64(res.Objects), 0)
		}
		if marked.has(o.ID) {
			return nil
		}
		res.Unreferenced++
		if o.ModTime.After(cutoff) {
			young = append(young, o)
			return nil
		}
		c.ids = append(c.ids, o.ID)
		c.bytes += o.Size
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan objects: %w", err)
	}
	c.seen.seal()
	// The grace period is for objects no commit ever named (no index row):
	// what a crashed or abandoned writer left. An indexed object was
	// committed, and is unreferenced because its files were deleted or
	// replaced: it goes at once, so deleting checkpoints frees space without
	// a flag. A concurrent commit that deduplicates against one is protected
	// by BeginCollect's pins, not by its age.
	err = s.View(func(tx *cas.Tx) error {
		for _, o := range young {
			_, indexed, err := tx.Chunk(o.ID)
			if err != nil {
				return err
			}
			if !indexed {
				res.Young++
				continue
			}
			c.ids = append(c.ids, o.ID)
			c.bytes += o.Size
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan index: %w", err)
	}
	err = s.View(func(tx *cas.Tx) error {
		return tx.ForEachChunk(func(id cas.ID, info cas.ChunkInfo) error {
			if (info.Packed() || info.Inline) && !marked.has(id) {
				// In a pack or the catalog, not an object file: a chunk
				// like any other.
				res.Unreferenced++
				c.ids = append(c.ids, id)
				c.bytes += int64(info.StoredLen)
				return nil
			}
			if !marked.has(id) && !c.seen.has(id) {
				res.Unreferenced++
				res.IndexRows++
				c.ids = append(c.ids, id)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("scan index: %w", err)
	}
	return c, nil
}

// dryRun counts what sweep and sweepPacks would free into res, deleting
// nothing. The figures are the ones a collection then reports, if nothing
// changes meanwhile: a packed chunk's bytes are freed only with its whole
// pack (when the candidates are all its live chunks: a pack's row counts
// them), and a pack no row names goes once older than cutoff.
func (c *candidates) dryRun(ctx context.Context, s *cas.Store, cutoff time.Time, res *Result) error {
	res.Chunks = len(c.ids) - res.IndexRows
	res.FreedBytes = c.bytes
	// The candidates of each pack: how many, and their bytes.
	type packed struct {
		n     int
		bytes int64
	}
	inPack := map[cas.ID]*packed{}
	counted := map[cas.ID]bool{} // packed candidates, counted once
	// The raw bytes are the index rows' (an object no commit named has
	// none: its raw size is not known without reading it).
	err := s.View(func(tx *cas.Tx) error {
		for _, id := range c.ids {
			info, ok, err := tx.Chunk(id)
			if err != nil {
				return err
			}
			if ok && (c.seen.has(id) || info.Packed() || info.Inline) {
				res.FreedRawBytes += int64(info.RawLen)
			}
			if !ok || !info.Packed() || counted[id] {
				continue
			}
			counted[id] = true
			res.PackedChunks++
			res.FreedBytes -= int64(info.StoredLen) // freed only with the pack
			p := inPack[info.Pack]
			if p == nil {
				p = &packed{}
				inPack[info.Pack] = p
			}
			p.n++
			p.bytes += int64(info.StoredLen)
		}
		counts := tx.Counts()
		res.PackDeadBytes = counts.PackBytes - counts.PackedBytes
		for id, cand := range inPack {
			p, ok, err := tx.Pack(id)
			if err != nil {
				return err
			}
			switch {
			case !ok: // a damaged catalog: Sweep fails on it
			case cand.n >= p.Live:
				// The pack's last chunks: it goes, and the dead space
				// it held with it.
				res.FreedPacks++
				res.FreedPackBytes += p.Size
				res.FreedBytes += p.Size
				res.PackDeadBytes -= p.Size - p.LiveBytes
			default:
				res.PackDeadBytes += cand.bytes
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	pc, err := s.OrphanPacks(ctx, nil)
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	res.Packs = pc.Packs
	young, youngBytes := pc.Young(cutoff)
	res.YoungPacks = young
	res.OrphanPacks = len(pc.Orphans) - young
	res.FreedPacks += res.OrphanPacks
	res.FreedPackBytes += pc.Bytes() - youngBytes
	res.FreedBytes += pc.Bytes() - youngBytes
	return nil
}

// sweep deletes the candidates, sweepBatch at a time, counting into res.
func (c *candidates) sweep(ctx context.Context, s *cas.Store, opts Options, res *Result) error {
	if len(c.ids) > 0 { // a batch may take seconds: say the phase began
		report(opts, "sweep", 0, int64(len(c.ids)))
	}
	for i := 0; i < len(c.ids); i += sweepBatch {
		step := c.ids[i:min(i+sweepBatch, len(c.ids))]
		r, err := s.Sweep(ctx, step)
		res.Chunks += r.Chunks + r.Packed
		res.PackedChunks += r.Packed
		res.FreedPacks += r.Packs
		res.FreedPackBytes += r.PackBytes
		res.FreedBytes += r.StoredBytes + r.PackBytes
		res.FreedRawBytes += r.RawBytes
		res.Skipped += r.Skipped + r.BasesKept
		if err != nil {
			return err
		}
		report(opts, "sweep", int64(i+len(step)), int64(len(c.ids)))
	}
	return nil
}

// mark returns the chunks a collection keeps, sealed: every chunk a
// committed manifest names (read in one transaction, a manifest at a time),
// and every chunk of the live manifests the daemon hands in; and the number
// of files, for progress.
func mark(ctx context.Context, s *cas.Store, opts Options) (marked *idSet, total int64, err error) {
	marked = &idSet{}
	err = s.View(func(tx *cas.Tx) error {
		total = tx.Counts().Files
		var done int64
		return tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			for _, c := range m.Chunks {
				marked.add(c.ID)
			}
			done++
			if done%256 == 0 {
				report(opts, "mark", done, total)
				return ctx.Err()
			}
			return nil
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("mark: %w", err)
	}
	if opts.Live != nil {
		for _, m := range opts.Live() {
			for _, c := range m.Chunks {
				marked.add(c.ID)
			}
		}
	}
	marked.seal()
	return marked, total, nil
}

// keptBases is what markDeltaBases kept that no manifest names.
type keptBases struct {
	chunks, deltas int
	stored, raw    int64
}

// markDeltaBases marks the base of every marked delta, and returns the set
// of deltas, sealed, and the bases it marked that no manifest names (kept
// only for the deltas). The base of a live delta is live (cas.Store.Sweep
// keeps any base a delta row names whatever is marked; marking it keeps the
// counts and the dry run honest). Depth 1: a base is never a delta itself,
// so the bases added need not be looked up in this pass.
func markDeltaBases(s *cas.Store, marked *idSet) (*idSet, keptBases, error) {
	isDelta := &idSet{}
	var bases idSet // the bases of marked deltas
	var kept keptBases
	err := s.View(func(tx *cas.Tx) error {
		if err := tx.ForEachDelta(func(id, base cas.ID, _ int) error {
			isDelta.add(id)
			if marked.has(id) && !marked.has(base) {
				bases.add(base)
			}
			return nil
		}); err != nil {
			return err
		}
		bases.seal()
		for i := range bases.len() {
			info, ok, err := tx.Chunk(bases.get(i))
			if err != nil {
				return err
			}
			kept.chunks++
			if ok {
				kept.stored += int64(info.StoredLen)
				kept.raw += int64(info.RawLen)
			}
		}
		// The deltas that keep them: a second pass over the delta rows
		// (marked is not changed until it is done).
		return tx.ForEachDelta(func(id, base cas.ID, _ int) error {
			if marked.has(id) && bases.has(base) {
				kept.deltas++
			}
			return nil
		})
	})
	if err != nil {
		return nil, kept, fmt.Errorf("mark delta bases: %w", err)
	}
	for i := range bases.len() {
		marked.add(bases.get(i))
	}
	marked.seal()
	isDelta.seal()
	return isDelta, kept, nil
}

// collectRemote runs the remote's collection when asked to.
func collectRemote(ctx context.Context, s *cas.Store, opts Options, start time.Time, res Result) (Result, error) {
	if opts.Remote == nil {
		return res, nil
	}
	var live []*cas.Manifest
	if opts.Live != nil {
		live = opts.Live()
	}
	r, err := opts.Remote.Collect(ctx, start.Add(-opts.Grace), live, opts.DryRun)
	res.CollectResult = r
	if err != nil {
		return res, fmt.Errorf("collect the remote: %w", err)
	}
	return res, nil
}
