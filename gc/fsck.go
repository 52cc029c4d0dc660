package gc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/remote"
)

// FsckOptions configure Fsck.
type FsckOptions struct {
	ReadData bool // decode every object and check its hash, not only its presence
	// Progress, when set, is called as ReadData's reading advances: phase
	// "read", in raw bytes of the indexed chunks.
	Progress func(Progress)
	// Remote, when set, is the store's remote tier: a chunk missing
	// locally is looked for (and, with ReadData, verified) in its bucket.
	Remote *remote.Tier
}

// Problem is one fault Fsck found. Path names the file (relative to the
// mount's root) when a file is affected; Chunk names the chunk when one is,
// Pack the pack object when one is (a note about a pack no row names).
//
// A damaged or missing chunk that is the base of deltas is one problem:
// Deltas says how many deltas are coded against it (their reads fail with
// it) and DeltaFiles names the files that use those deltas; the deltas
// themselves are not reported (their objects checked, as far as they can be
// without their base).
type Problem struct {
	Kind       string   `json:"kind"`
	Path       string   `json:"path,omitempty"`
	Chunk      string   `json:"chunk,omitempty"`
	Pack       string   `json:"pack,omitempty"`
	Detail     string   `json:"detail"`
	Deltas     int      `json:"deltas,omitempty"`
	DeltaFiles []string `json:"delta_files,omitempty"`
}

// maxNamedDeltaFiles is how many of a damaged base's delta files String names.
const maxNamedDeltaFiles = 3

func (p Problem) String() string {
	s := p.Kind
	if p.Path != "" {
		s += " " + p.Path
	}
	if p.Chunk != "" {
		s += " chunk " + p.Chunk
	}
	if p.Pack != "" {
		s += " pack " + p.Pack
	}
	s += ": " + p.Detail
	if p.Deltas > 0 {
		s += fmt.Sprintf("; it is the base of %d deltas, which cannot be read either", p.Deltas)
		if n := len(p.DeltaFiles); n > 0 {
			s += fmt.Sprintf(" (%d files: %s", n, strings.Join(p.DeltaFiles[:min(n, maxNamedDeltaFiles)], ", "))
			if n > maxNamedDeltaFiles {
				s += fmt.Sprintf(" and %d more", n-maxNamedDeltaFiles)
			}
			s += ")"
		}
	}
	return s
}

// FsckResult is what Fsck checked and found.
type FsckResult struct {
	Files       int `json:"files"`
	Dirs        int `json:"dirs"`
	Chunks      int `json:"chunks"`       // distinct chunks named by manifests
	ObjectsRead int `json:"objects_read"` // objects decoded and hashed (ReadData)
	// Bases counts the chunks no manifest names that are the bases of deltas
	// manifests name: referenced through the deltas (gc keeps them).
	Bases        int `json:"bases"`
	Unreferenced int `json:"unreferenced"` // objects neither named nor such a base (gc frees them)
	// Packs (cas: packs of small chunks) that gc frees whole: reclaimable
	// space, not faults, as unreferenced objects are. A pack no catalog
	// row names (OrphanPacks: written by a commit that a crash
	// interrupted; gc frees it once older than its --grace) is also a
	// "pack-orphan" note naming it; a committed pack none of whose chunks
	// a file (or a delta, as its base) references is counted only (gc
	// frees it at once, with its chunks). Packs a live batch is writing
	// are neither. On a mounted store, like Unreferenced, the count may
	// include packs of commits made while Fsck ran.
	Packs                 int      `json:"packs"`                   // pack objects seen
	UnreferencedPacks     int      `json:"unreferenced_packs"`      // packs gc frees whole, orphans included
	UnreferencedPackBytes int64    `json:"unreferenced_pack_bytes"` // their bytes
	OrphanPacks           int      `json:"orphan_packs"`            // of UnreferencedPacks, those no catalog row names
	SpoolLeftovers        []string `json:"spool_leftovers"`         // notes, not faults
	// ReencodePending counts chunks stored raw that wait for the daemon to
	// re-encode them (cas: deferred encoding); not a fault.
	ReencodePending int `json:"reencode_pending"`
	// ReencodeInFlight counts the queued chunks whose re-encode has begun
	// and not finished: the object is re-encoded (or its delta row
	// written) and the index row or the queue not yet updated. A mounted
	// daemon is doing it, or a crash interrupted it and the next re-encode
	// of the chunk finishes it; not a fault.
	ReencodeInFlight int `json:"reencode_in_flight"`
	// Notes are states that look odd but are not faults: a queue row whose
	// chunk an older ckptfs swept ("reencode-stale"), which the daemon's
	// next re-encode drops; a pack no catalog row names ("pack-orphan"),
	// which gc frees.
	Notes    []Problem `json:"notes"`
	Problems []Problem `json:"problems"`
}

// OK reports whether no problem was found.
func (r *FsckResult) OK() bool { return len(r.Problems) == 0 }

// Fsck checks s. It returns an error only when it could not check (an I/O
// error reading the catalog); faults it finds are in the result.
//
// Fsck streams: it reads the catalog a record at a time and holds sets, not
// records: the inode numbers it reached (a bitmap), the chunks manifests
// name and the chunks queued for re-encoding (sorted IDs), and each object's
// ID and size. Paths are not kept: the walk makes them as it goes, and the
// problems it finds about chunks (a missing object names no file) get their
// files' paths from a second walk, made only when there are such problems.
func Fsck(ctx context.Context, s *cas.Store, opts FsckOptions) (FsckResult, error) {
	c := &fscker{s: s, opts: opts}
	if err := c.checkCatalog(ctx); err != nil {
		return c.res, fmt.Errorf("check catalog: %w", err)
	}
	if err := c.checkObjects(ctx); err != nil {
		return c.res, err
	}
	if err := c.checkPacks(ctx); err != nil {
		return c.res, fmt.Errorf("check packs: %w", err)
	}
	if err := c.checkInlineObjects(ctx); err != nil {
		return c.res, fmt.Errorf("check inline objects: %w", err)
	}
	if err := c.checkDeltas(ctx); err != nil {
		return c.res, err
	}
	// Paths for the problems found about chunks and nodes without them.
	if err := c.namePaths(ctx); err != nil {
		return c.res, err
	}

	ents, err := os.ReadDir(s.SpoolDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return c.res, fmt.Errorf("read spool: %w", err)
	}
	for _, e := range ents {
		c.res.SpoolLeftovers = append(c.res.SpoolLeftovers, e.Name())
	}
	for _, ps := range [][]Problem{c.res.Problems, c.res.Notes} {
		sort.Slice(ps, func(i, j int) bool {
			a, b := ps[i], ps[j]
			if a.Path != b.Path {
				return a.Path < b.Path
			}
			if a.Chunk != b.Chunk {
				return a.Chunk < b.Chunk
			}
			return a.Pack < b.Pack
		})
	}
	return c.res, nil
}

// fscker is one Fsck run.
type fscker struct {
	s    *cas.Store
	opts FsckOptions
	res  FsckResult

	named  idSet // chunks the reachable files' manifests name
	bases  idSet // bases of named deltas that are not named themselves
	queued idSet // chunks in the re-encode queue
	// Problems and notes about a chunk, to be given the paths of the files
	// that use it (namePaths), by index into res.Problems or res.Notes.
	chunkProblems map[cas.ID][]int
	chunkNotes    map[cas.ID][]int
	// Problems about a node reached twice, to be given the path it was first
	// reached at.
	dups map[uint64][]int
	// With ReadData: the delta objects read, in ID order, and the index rows
	// whose objects could not be read (missing or corrupt).
	deltaObjects []deltaObject
	unread       idSet
	// With ReadData: the deltas that could not be read because their base
	// could not (by base), and then the problem that names each such base
	// and the base of each such delta, for namePaths.
	baseFaults  map[cas.ID]*baseFault
	baseProblem map[cas.ID]int
	deltaBase   map[cas.ID]cas.ID
	// Queued chunks whose re-encode has begun and not finished.
	inFlight map[cas.ID]bool
	// Pack object sizes by pack, -1 for a missing one, and how many of the
	// pack's index rows a file or a delta references (checkPacked): every
	// pack a chunk row names.
	packSizes map[cas.ID]int64
	packRefs  map[cas.ID]int
}

// baseFault is a base that failed the reads of deltas: the first error, and
// the deltas.
type baseFault struct {
	err    error
	deltas []cas.ID
}

// deltaObject is a delta object's ID and the base its header names.
type deltaObject struct {
	id, base cas.ID
}

func (c *fscker) problem(kind, p, chunk, format string, args ...any) int {
	c.res.Problems = append(c.res.Problems, Problem{Kind: kind, Path: p, Chunk: chunk, Detail: fmt.Sprintf(format, args...)})
	return len(c.res.Problems) - 1
}

// chunkProblem reports a problem about chunk id, to be named after the files
// that use it.
func (c *fscker) chunkProblem(kind string, id cas.ID, format string, args ...any) {
	if c.chunkProblems == nil {
		c.chunkProblems = map[cas.ID][]int{}
	}
	c.chunkProblems[id] = append(c.chunkProblems[id], c.problem(kind, "", id.String(), format, args...))
}

// chunkNote notes a state of chunk id, to be named after the first file that
// uses it.
func (c *fscker) chunkNote(kind string, id cas.ID, format string, args ...any) {
	c.res.Notes = append(c.res.Notes, Problem{Kind: kind, Chunk: id.String(), Detail: fmt.Sprintf(format, args...)})
	if c.chunkNotes == nil {
		c.chunkNotes = map[cas.ID][]int{}
	}
	c.chunkNotes[id] = append(c.chunkNotes[id], len(c.res.Notes)-1)
}

// entry is one directory entry a namespace walk reaches.
type entry struct {
	path string
	ino  uint64
	node cas.Node
	ok   bool // the node exists
	dup  bool // the node was reached before: the walk does not enter it again
}

// walkNamespace calls visit for every entry reachable from the root, depth
// first in name order, entering each directory once. It holds the path of
// the directory it is in and a bitmap of the inode numbers reached, which it
// returns.
func walkNamespace(ctx context.Context, tx *cas.Tx, visit func(e entry) error) (inoSet, error) {
	reached := inoSet{}
	reached.add(cas.RootIno)
	var walk func(dir uint64, dirPath string) error
	walk = func(dir uint64, dirPath string) error {
		return tx.Children(dir, func(name string, ino uint64) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			e := entry{path: path.Join(dirPath, name), ino: ino}
			var err error
			if e.node, e.ok, err = tx.Node(ino); err != nil {
				return err
			}
			if e.ok {
				e.dup = reached.has(ino)
				reached.add(ino)
			}
			if err := visit(e); err != nil {
				return err
			}
			if e.ok && !e.dup && e.node.IsDir() {
				return walk(ino, e.path)
			}
			return nil
		})
	}
	return reached, walk(cas.RootIno, "/")
}

// visit checks one entry of the namespace walk; names counts the entries
// reached so far of each node with several names.
func (c *fscker) visit(tx *cas.Tx, names map[uint64]uint32, e entry) error {
	if e.ok && !e.node.IsDir() && e.node.Nlink > 1 {
		names[e.ino]++
	}
	switch {
	case !e.ok:
		c.problem("dangling-entry", e.path, "", "directory entry names node %d, which does not exist", e.ino)
	case e.dup && (e.node.IsDir() || e.node.Nlink <= 1 || names[e.ino] > e.node.Nlink):
		if c.dups == nil {
			c.dups = map[uint64][]int{}
		}
		c.dups[e.ino] = append(c.dups[e.ino], c.problem("duplicate-entry", e.path, "", "node %d is also reached elsewhere", e.ino))
	case e.dup:
		// A further name of a node with several: counted once.
	case e.node.IsDir():
		c.res.Dirs++
	case e.node.IsRegular():
		c.res.Files++
		return c.checkFile(tx, e)
	}
	return nil
}

// checkLinkCounts reports the nodes with several names that fewer entries
// name than their records count: unlinking every name would leave the node
// in no directory. (More entries than counted are duplicate-entry problems.)
func (c *fscker) checkLinkCounts(tx *cas.Tx, names map[uint64]uint32) error {
	for ino, k := range names {
		n, ok, err := tx.Node(ino)
		if err != nil {
			return err
		}
		if ok && k < n.Nlink {
			c.problem("link-count", "", "", "node %d counts %d names, %d directory entries name it", ino, n.Nlink, k)
		}
	}
	return nil
}

// checkCatalog checks the namespace, the manifests and the counters, in one
// read transaction.
func (c *fscker) checkCatalog(ctx context.Context) error {
	var want cas.Counts
	err := c.s.View(func(tx *cas.Tx) error {
		// Names of the nodes with several (hard links), as reached.
		names := map[uint64]uint32{}
		reached, err := walkNamespace(ctx, tx, func(e entry) error { return c.visit(tx, names, e) })
		if err != nil {
			return err
		}
		if err := c.checkLinkCounts(tx, names); err != nil {
			return err
		}
		c.named.seal()
		// A delta's base is referenced through it (gc keeps it).
		err = tx.ForEachDelta(func(id, base cas.ID, _ int) error {
			if c.named.has(id) && !c.named.has(base) {
				c.bases.add(base)
			}
			return nil
		})
		if err != nil {
			return err
		}
		c.bases.seal()
		// The root directory counts in the catalog's dirs counter.
		c.res.Dirs++
		// Unreachable nodes, and the counters against what they count.
		err = tx.ForEachNode(func(n cas.Node) error {
			if !reached.has(n.Ino) {
				c.problem("unreachable-node", "", "", "node %d (mode %o) is in no directory", n.Ino, n.Mode)
			}
			switch {
			case n.IsRegular():
				want.Files++
				want.LogicalBytes += n.Size
			case n.IsDir():
				want.Dirs++
			}
			return ctx.Err()
		})
		if err != nil {
			return err
		}
		err = tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			if n, ok, err := tx.Node(ino); err != nil {
				return err
			} else if !ok || !n.IsRegular() {
				c.problem("orphan-manifest", "", "", "manifest %d belongs to no file", ino)
			}
			return ctx.Err()
		})
		if err != nil {
			return err
		}
		err = tx.ForEachChunk(func(id cas.ID, info cas.ChunkInfo) error {
			want.Chunks++
			want.UniqueBytes += int64(info.RawLen)
			want.StoredBytes += int64(info.StoredLen)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.ForEachPendingReencode(func(id cas.ID, p cas.PendingReencode) error {
			want.ReencodePending++
			want.ReencodePendingBytes += int64(p.RawLen)
			c.queued.add(id)
			if _, indexed, err := tx.Chunk(id); err != nil {
				return err
			} else if !indexed {
				// A sweep drops the queue row with the index row, but an
				// older ckptfs (same store format) sweeps without knowing
				// the queue. Harmless: the next re-encode drops the row.
				c.chunkNote("reencode-stale", id, "re-encode queue row of a chunk that is not indexed")
			}
			return nil
		})
		if err != nil {
			return err
		}
		c.queued.seal()
		got := tx.Counts()
		for _, k := range []struct {
			name      string
			got, want int64
		}{
			{"files", got.Files, want.Files},
			{"dirs", got.Dirs, want.Dirs},
			{"logical_bytes", got.LogicalBytes, want.LogicalBytes},
			{"chunks", got.Chunks, want.Chunks},
			{"unique_bytes", got.UniqueBytes, want.UniqueBytes},
			{"stored_bytes", got.StoredBytes, want.StoredBytes},
			{"reencode_pending", got.ReencodePending, want.ReencodePending},
			{"reencode_pending_bytes", got.ReencodePendingBytes, want.ReencodePendingBytes},
		} {
			if k.got != k.want {
				c.problem("counter", "", "", "%s counter is %d, the catalog holds %d", k.name, k.got, k.want)
			}
		}
		return nil
	})
	c.res.Chunks = c.named.len()
	c.res.Bases = c.bases.len()
	c.res.ReencodePending = c.queued.len()
	return err
}

// checkFile checks a reachable file's manifest against its node and the
// chunk index, and adds its chunks to the named set.
func (c *fscker) checkFile(tx *cas.Tx, e entry) error {
	m, ok, err := tx.Manifest(e.ino)
	if err != nil {
		return err
	}
	if !ok {
		c.problem("missing-manifest", e.path, "", "file has no manifest")
		return nil
	}
	if m.Size() != e.node.Size {
		c.problem("size-mismatch", e.path, "", "manifest holds %d bytes, node says %d", m.Size(), e.node.Size)
	}
	if len(m.Holes) > 0 && c.s.Format() < cas.FormatHoles {
		c.problem("format", e.path, "", "the file has holes at format %d: an older ckptfs would open the store", c.s.Format())
	}
	if n, err := tx.HoleBytes(e.ino); err != nil {
		return err
	} else if n != m.HoleBytes() {
		c.problem("hole-bytes", e.path, "", "holes row says %d bytes, the manifest's holes hold %d", n, m.HoleBytes())
	}
	for _, ref := range m.Chunks {
		c.named.add(ref.ID)
		info, ok, err := tx.Chunk(ref.ID)
		if err != nil {
			return err
		}
		if !ok && c.opts.Remote == nil {
			c.problem("unindexed-chunk", e.path, ref.ID.String(), "chunk is not in the chunk index")
		} else if ok && info.RawLen != ref.Len {
			c.problem("chunk-length", e.path, ref.ID.String(), "manifest says %d bytes, index says %d", ref.Len, info.RawLen)
		}
	}
	return nil
}

// object is an object file's ID and size.
type object struct {
	id   cas.ID
	size int64
}

var dataLoss = map[string]bool{"missing-chunk": true, "corrupt-chunk": true, "object-size": true}

// namePaths walks the namespace again, when problems need paths: a problem
// about a chunk is given the path of the first file that uses it, and a
// data-loss problem is repeated for every other file that uses it (a chunk
// of a shared backbone may be in thousands: each of them reads EIO); a note
// about a chunk is given its first file's path; a node reached twice is
// named at the path it was first reached.
func (c *fscker) namePaths(ctx context.Context) error {
	if len(c.chunkProblems) == 0 && len(c.chunkNotes) == 0 && len(c.dups) == 0 {
		return nil
	}
	var wanted idSet
	for id := range c.chunkProblems {
		wanted.add(id)
	}
	for id := range c.deltaBase {
		wanted.add(id)
	}
	for id := range c.chunkNotes {
		wanted.add(id)
	}
	wanted.seal()
	users := map[cas.ID][]string{}
	deltaFiles := map[cas.ID][]string{} // damaged base → the files of its deltas
	first := map[uint64]string{}
	err := c.s.View(func(tx *cas.Tx) error {
		_, err := walkNamespace(ctx, tx, func(e entry) error {
			if !e.ok || e.dup {
				return nil
			}
			if _, ok := c.dups[e.ino]; ok {
				first[e.ino] = e.path
			}
			if !e.node.IsRegular() || wanted.len() == 0 {
				return nil
			}
			m, ok, err := tx.Manifest(e.ino)
			if err != nil || !ok {
				return err
			}
			var named map[cas.ID]bool   // a chunk the file names twice is one use
			var viaBase map[cas.ID]bool // bases whose deltas the file uses
			for _, ref := range m.Chunks {
				if !wanted.has(ref.ID) || named[ref.ID] {
					continue
				}
				if named == nil {
					named = map[cas.ID]bool{}
				}
				named[ref.ID] = true
				users[ref.ID] = append(users[ref.ID], e.path)
				if b, ok := c.deltaBase[ref.ID]; ok && !viaBase[b] {
					if viaBase == nil {
						viaBase = map[cas.ID]bool{}
					}
					viaBase[b] = true
					deltaFiles[b] = append(deltaFiles[b], e.path)
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("name the files of damaged chunks: %w", err)
	}
	for ino, idx := range c.dups {
		for _, i := range idx {
			c.res.Problems[i].Detail = fmt.Sprintf("node %d is also reached as %s", ino, first[ino])
		}
	}
	for id, idx := range c.chunkNotes {
		if u := users[id]; len(u) > 0 {
			for _, i := range idx {
				c.res.Notes[i].Path = u[0]
			}
		}
	}
	for b, i := range c.baseProblem {
		c.res.Problems[i].DeltaFiles = deltaFiles[b]
	}
	for id, idx := range c.chunkProblems {
		u := users[id]
		if len(u) == 0 {
			continue
		}
		for _, i := range idx {
			c.res.Problems[i].Path = u[0]
			if !dataLoss[c.res.Problems[i].Kind] {
				continue
			}
			for _, p := range u[1:] {
				pr := c.res.Problems[i]
				pr.Path, pr.Deltas, pr.DeltaFiles = p, 0, nil // the base's deltas go with its first line
				c.res.Problems = append(c.res.Problems, pr)
			}
		}
	}
	return nil
}

// checkDeltas checks the delta rows (cas: deltaplan.go): every delta's base
// is indexed and standalone, the reverse index matches, the counter and the
// format are right, plans are for queued chunks; with the objects' headers
// read (ReadData), that every delta object has its row and every row its
// object.
func (c *fscker) checkDeltas(ctx context.Context) error {
	c.unread.seal()
	// The header of id's object, if ReadData read it: whether it is a delta,
	// and against what.
	object := func(id cas.ID) (base cas.ID, delta bool) {
		i, ok := slices.BinarySearchFunc(c.deltaObjects, id, func(o deltaObject, id cas.ID) int { return compareIDs(o.id, id) })
		if !ok {
			return cas.ID{}, false
		}
		return c.deltaObjects[i].base, true
	}
	var standalone []deltaObject // delta rows over standalone objects
	err := c.s.View(func(tx *cas.Tx) error {
		rows := 0
		err := tx.ForEachDelta(func(id, base cas.ID, dist int) error {
			rows++
			_, indexed, err := tx.Chunk(id)
			if err != nil {
				return err
			} else if !indexed {
				c.chunkProblem("delta-stale", id, "delta row of a chunk that is not indexed")
			}
			if _, ok, err := tx.Chunk(base); err != nil {
				return err
			} else if !ok {
				c.chunkProblem("delta-base-missing", id, "its base %v is not indexed: a collection may have deleted it", base)
			}
			if _, _, ok, err := tx.Delta(base); err != nil {
				return err
			} else if ok {
				c.chunkProblem("delta-depth", id, "its base %v is a delta itself (deltas have depth 1)", base)
			}
			if !tx.HasBaseRow(base, id) {
				c.chunkProblem("delta-reverse", id, "no reverse row for its base %v: a collection would not keep the base", base)
			}
			if c.opts.ReadData && indexed && !c.unread.has(id) {
				objBase, delta := object(id)
				pending := c.queued.has(id)
				switch {
				case delta && objBase != base:
					c.chunkProblem("delta-base", id, "object is a delta against %v, its row says %v", objBase, base)
				case !delta && pending:
					c.reencodeInFlight(id)
				case !delta:
					// The object may have been read before a re-encode
					// renamed the delta into place: read again below.
					standalone = append(standalone, deltaObject{id, base})
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n := tx.Counts().DeltaChunks; n != int64(rows) {
			c.problem("counter", "", "", "delta_chunks counter is %d, the catalog holds %d", n, rows)
		}
		if rows > 0 && c.s.Format() < cas.FormatDeltas {
			c.problem("format", "", "", "the store holds deltas at format %d: an older ckptfs would open it", c.s.Format())
		}
		if err := tx.ForEachBaseRow(func(base, id cas.ID) error {
			if b, _, ok, err := tx.Delta(id); err != nil {
				return err
			} else if !ok || b != base {
				c.chunkProblem("delta-reverse", base, "reverse row names delta %v, which is not a delta against it", id)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, o := range c.deltaObjects {
			if _, _, ok, err := tx.Delta(o.id); err != nil {
				return err
			} else if !ok {
				c.chunkProblem("delta-unrecorded", o.id, "object is a delta against %v but has no delta row: a collection would not keep its base", o.base)
			}
		}
		waiting := 0
		if err := tx.ForEachDeltaWait(func(id cas.ID, w cas.DeltaWait) error {
			if !w.Released {
				waiting++
			}
			// Dropped with its plan (DropPlan); an older ckptfs drops
			// plans without it.
			if _, _, planned, err := tx.DeltaPlan(id); err != nil {
				return err
			} else if !planned {
				c.chunkNote("delta-wait-stale", id, "delta wait row of a chunk with no delta plan")
			}
			return nil
		}); err != nil {
			return err
		}
		if n := tx.Counts().DeltaWaiting; n != int64(waiting) {
			c.problem("counter", "", "", "delta_waiting counter is %d, the catalog holds %d waiting plans", n, waiting)
		}
		return tx.ForEachDeltaPlan(func(id, base cas.ID, _ int) error {
			// The queue row as of this transaction: a plan and its queue
			// row are written and dropped together, unless the plan waits
			// for a later version of its chunk (the newest stays whole).
			if waits, err := tx.DeltaWaits(id); err != nil || waits {
				return err
			}
			if _, queued, err := tx.PendingReencode(id); err != nil {
				return err
			} else if !queued {
				c.chunkNote("delta-plan-stale", id, "delta plan of a chunk that is not queued for re-encoding")
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, o := range standalone {
		_, b, delta, err := c.s.VerifyObjectBase(ctx, o.id)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err == nil && delta && b == o.base:
		case err == nil && delta:
			c.chunkProblem("delta-base", o.id, "object is a delta against %v, its row says %v", b, o.base)
		default:
			c.chunkProblem("delta-standalone", o.id, "delta row over a standalone object")
		}
	}
	return nil
}
