package gc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/ckptfs/ckptfs/cas"
)

// FsckOptions configure Fsck.
type FsckOptions struct {
	ReadData bool // decode every object and check its hash, not only its presence
	Progress func(Progress)
}

// Problem is one fault Fsck found. Path names the file (relative to the
// mount's root) when a file is affected; Chunk names the chunk when one is.
type Problem struct {
	Kind   string `json:"kind"`
	Path   string `json:"path,omitempty"`
	Chunk  string `json:"chunk,omitempty"`
	Detail string `json:"detail"`
}

func (p Problem) String() string {
	s := p.Kind
	if p.Path != "" {
		s += " " + p.Path
	}
	if p.Chunk != "" {
		s += " chunk " + p.Chunk
	}
	return s + ": " + p.Detail
}

// FsckResult is what Fsck checked and found.
type FsckResult struct {
	Files          int      `json:"files"`
	Dirs           int      `json:"dirs"`
	Chunks         int      `json:"chunks"`          // distinct chunks named by manifests
	ObjectsRead    int      `json:"objects_read"`    // objects decoded and hashed (ReadData)
	Unreferenced   int      `json:"unreferenced"`    // objects no manifest names (gc frees them)
	SpoolLeftovers []string `json:"spool_leftovers"` // notes, not faults
	// ReencodePending counts chunks stored raw that wait for the daemon to
	// re-encode them (cas: deferred encoding); not a fault.
	ReencodePending int `json:"reencode_pending"`
	// Notes are states that look odd but are not faults: a re-encode a crash
	// interrupted after its rename ("reencode-pending"), a queue row whose
	// chunk an older ckptfs swept ("reencode-stale"). The daemon's next
	// re-encode of the chunk resolves either.
	Notes    []Problem `json:"notes"`
	Problems []Problem `json:"problems"`
}

// OK reports whether no problem was found.
func (r *FsckResult) OK() bool { return len(r.Problems) == 0 }

// Fsck checks s. It returns an error only when it could not check (an I/O
// error reading the catalog); faults it finds are in the result.
func Fsck(ctx context.Context, s *cas.Store, opts FsckOptions) (FsckResult, error) {
	var res FsckResult
	problem := func(kind, p, chunk, format string, args ...any) {
		res.Problems = append(res.Problems, Problem{Kind: kind, Path: p, Chunk: chunk, Detail: fmt.Sprintf(format, args...)})
	}
	note := func(kind, p, chunk, format string, args ...any) {
		res.Notes = append(res.Notes, Problem{Kind: kind, Path: p, Chunk: chunk, Detail: fmt.Sprintf(format, args...)})
	}
	// The re-encode queue: chunks whose index row may lag their object.
	queued := map[cas.ID]cas.PendingReencode{}
	// chunk → the first file that names it, for messages.
	users := map[cas.ID]string{}
	var inoPath map[uint64]string // every reachable node's path
	var want cas.Counts
	err := s.View(func(tx *cas.Tx) error {
		nodes := map[uint64]cas.Node{}
		if err := tx.ForEachNode(func(n cas.Node) error { nodes[n.Ino] = n; return nil }); err != nil {
			return err
		}
		manifests := map[uint64]*cas.Manifest{}
		if err := tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error { manifests[ino] = m; return nil }); err != nil {
			return err
		}
		reached := map[uint64]string{cas.RootIno: "/"}
		inoPath = reached
		// Walk the namespace from the root.
		queue := []uint64{cas.RootIno}
		for len(queue) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			dir := queue[0]
			queue = queue[1:]
			err := tx.Children(dir, func(name string, ino uint64) error {
				p := path.Join(reached[dir], name)
				n, ok := nodes[ino]
				if !ok {
					problem("dangling-entry", p, "", "directory entry names node %d, which does not exist", ino)
					return nil
				}
				if prev, dup := reached[ino]; dup {
					problem("duplicate-entry", p, "", "node %d is also reached as %s", ino, prev)
					return nil
				}
				reached[ino] = p
				switch {
				case n.IsDir():
					res.Dirs++
					queue = append(queue, ino)
				case n.IsRegular():
					res.Files++
					m, ok := manifests[ino]
					if !ok {
						problem("missing-manifest", p, "", "file has no manifest")
						return nil
					}
					if m.Size() != n.Size {
						problem("size-mismatch", p, "", "manifest holds %d bytes, node says %d", m.Size(), n.Size)
					}
					for _, c := range m.Chunks {
						if _, ok := users[c.ID]; !ok {
							users[c.ID] = p
						}
						info, ok, err := tx.Chunk(c.ID)
						if err != nil {
							return err
						}
						if !ok && !s.HasRemote() {
							problem("unindexed-chunk", p, c.ID.String(), "chunk is not in the chunk index")
						} else if ok && info.RawLen != c.Len {
							problem("chunk-length", p, c.ID.String(), "manifest says %d bytes, index says %d", c.Len, info.RawLen)
						}
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		// The root directory counts in the catalog's dirs counter.
		res.Dirs++
		for ino, n := range nodes {
			if _, ok := reached[ino]; !ok {
				problem("unreachable-node", "", "", "node %d (mode %o) is in no directory", ino, n.Mode)
			}
		}
		for ino := range manifests {
			if n, ok := nodes[ino]; !ok || !n.IsRegular() {
				problem("orphan-manifest", "", "", "manifest %d belongs to no file", ino)
			}
		}
		// Counters against what they count.
		for _, n := range nodes {
			switch {
			case n.IsRegular():
				want.Files++
				want.LogicalBytes += n.Size
			case n.IsDir():
				want.Dirs++
			}
		}
		err := tx.ForEachChunk(func(id cas.ID, c cas.ChunkInfo) error {
			want.Chunks++
			want.UniqueBytes += int64(c.RawLen)
			want.StoredBytes += int64(c.StoredLen)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.ForEachPendingReencode(func(id cas.ID, p cas.PendingReencode) error {
			want.ReencodePending++
			want.ReencodePendingBytes += int64(p.RawLen)
			queued[id] = p
			if _, indexed, err := tx.Chunk(id); err != nil {
				return err
			} else if !indexed {
				// A sweep drops the queue row with the index row, but an
				// older ckptfs (same store format) sweeps without knowing
				// the queue. Harmless: the next re-encode drops the row.
				note("reencode-stale", users[id], id.String(), "re-encode queue row of a chunk that is not indexed")
			}
			return nil
		})
		if err != nil {
			return err
		}
		got := tx.Counts()
		for _, c := range []struct {
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
			if c.got != c.want {
				problem("counter", "", "", "%s counter is %d, the catalog holds %d", c.name, c.got, c.want)
			}
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("check catalog: %w", err)
	}
	res.Chunks = len(users)
	res.ReencodePending = len(queued)

	// Objects: presence and size against the index; with ReadData, content.
	index := map[cas.ID]cas.ChunkInfo{}
	if err := s.View(func(tx *cas.Tx) error {
		return tx.ForEachChunk(func(id cas.ID, c cas.ChunkInfo) error { index[id] = c; return nil })
	}); err != nil {
		return res, fmt.Errorf("read index: %w", err)
	}
	objects := map[cas.ID]int64{}
	if err := s.WalkObjects(ctx, func(o cas.ObjectInfo) error {
		objects[o.ID] = o.Size
		if _, used := users[o.ID]; !used {
			res.Unreferenced++
		}
		return nil
	}); err != nil {
		return res, fmt.Errorf("scan objects: %w", err)
	}
	objectBases := map[cas.ID]objectBase{} // what the objects read say (ReadData)
	ids := make([]cas.ID, 0, len(index))
	for id := range index {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return string(ids[i][:]) < string(ids[j][:]) })
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		info := index[id]
		user := users[id]
		_, pending := queued[id]
		size, ok := objects[id]
		// An index row may disagree with its object only while the chunk is
		// queued: a re-encode renamed the encoded object into place and a
		// crash came before its transaction (cas: deferred encoding).
		lagging := false
		switch {
		case !ok:
			problem("missing-chunk", user, id.String(), "the index names it but there is no object file")
			continue
		case size != int64(info.StoredLen) && pending:
			lagging = true
			note("reencode-pending", user, id.String(), "object file is %d bytes, index row still says %d: a re-encode was interrupted after its rename; the next one updates the row", size, info.StoredLen)
		case size != int64(info.StoredLen):
			problem("object-size", user, id.String(), "object file is %d bytes, index says %d", size, info.StoredLen)
		}
		if opts.ReadData {
			res.ObjectsRead++
			got, base, isDelta, err := s.VerifyObjectBase(ctx, id)
			if err == nil {
				objectBases[id] = objectBase{base, isDelta}
			}
			switch {
			case err != nil:
				problem("corrupt-chunk", user, id.String(), "%v", unwrapCorrupt(err))
			case got.Codec != info.Codec && pending:
				if !lagging {
					note("reencode-pending", user, id.String(), "object is %v, index row still says %v: a re-encode was interrupted after its rename; the next one updates the row", got.Codec, info.Codec)
				}
			case got.Codec != info.Codec:
				problem("object-codec", user, id.String(), "object is %v, index says %v", got.Codec, info.Codec)
			}
			if opts.Progress != nil && i%256 == 0 {
				opts.Progress(Progress{Phase: "read", Done: int64(i), Total: int64(len(ids))})
			}
		}
	}
	// Chunks named by manifests but absent from the index were reported above;
	// check they at least have objects, so the message says whether data is gone.
	// A store with a remote indexes only what it committed itself: the rest
	// (files another mount published) is fetched on read, so it is checked
	// in the remote, read and verified (a fetched copy here only with ReadData).
	for id, user := range users {
		if _, indexed := index[id]; indexed {
			continue
		}
		_, local := objects[id]
		switch {
		case local && s.HasRemote() && opts.ReadData:
			res.ObjectsRead++
			if _, err := s.VerifyObject(ctx, id); err != nil {
				problem("corrupt-chunk", user, id.String(), "%v", unwrapCorrupt(err))
			}
		case local:
		case s.HasRemote():
			res.ObjectsRead++
			if err := s.VerifyRemoteObject(ctx, id); errors.Is(err, cas.ErrMissing) {
				problem("missing-chunk", user, id.String(), "named by a manifest, in neither the local store nor the remote")
			} else if err != nil {
				problem("corrupt-chunk", user, id.String(), "in the remote: %v", unwrapCorrupt(err))
			}
		default:
			problem("missing-chunk", user, id.String(), "named by a manifest, with no object file")
		}
	}

	if err := checkDeltas(s, queued, users, objectBases, problem, note); err != nil {
		return res, err
	}

	// A lost or damaged chunk fails every file that uses it: name them all,
	// not only the first (a chunk of a shared backbone may be in thousands).
	if err := nameEveryUser(s, &res, inoPath); err != nil {
		return res, err
	}

	ents, err := os.ReadDir(s.SpoolDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("read spool: %w", err)
	}
	for _, e := range ents {
		res.SpoolLeftovers = append(res.SpoolLeftovers, e.Name())
	}
	for _, ps := range [][]Problem{res.Problems, res.Notes} {
		sort.Slice(ps, func(i, j int) bool {
			a, b := ps[i], ps[j]
			if a.Path != b.Path {
				return a.Path < b.Path
			}
			return a.Chunk < b.Chunk
		})
	}
	return res, nil
}

// unwrapCorrupt keeps the part of a verification error after the chunk name,
// which the problem already carries.
func unwrapCorrupt(err error) string {
	msg := err.Error()
	for _, sentinel := range []error{cas.ErrCorrupt, cas.ErrMissing} {
		if errors.Is(err, sentinel) {
			if i := strings.Index(msg, sentinel.Error()); i >= 0 {
				return msg[i:]
			}
		}
	}
	return msg
}

// dataLoss are the kinds of problem that make reads of a chunk fail.
var dataLoss = map[string]bool{"missing-chunk": true, "corrupt-chunk": true, "object-size": true}

// nameEveryUser repeats each data-loss problem, reported for the first file
// that uses its chunk, for every other file that uses it.
func nameEveryUser(s *cas.Store, res *FsckResult, inoPath map[uint64]string) error {
	bad := map[cas.ID][]Problem{}
	for _, p := range res.Problems {
		if !dataLoss[p.Kind] || p.Chunk == "" {
			continue
		}
		id, err := cas.ParseID(p.Chunk)
		if err != nil {
			continue
		}
		bad[id] = append(bad[id], p)
	}
	if len(bad) == 0 {
		return nil
	}
	err := s.View(func(tx *cas.Tx) error {
		return tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			p, ok := inoPath[ino]
			if !ok {
				return nil // unreachable: reported as such
			}
			done := map[cas.ID]bool{}
			for _, c := range m.Chunks {
				probs, isBad := bad[c.ID]
				if !isBad || done[c.ID] {
					continue
				}
				done[c.ID] = true
				for _, pr := range probs {
					if pr.Path == p {
						continue
					}
					pr.Path = p
					res.Problems = append(res.Problems, pr)
				}
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("name the files of damaged chunks: %w", err)
	}
	return nil
}

// objectBase is what a delta object's header says: its base, if a delta.
type objectBase struct {
	base  cas.ID
	delta bool
}

// checkDeltas checks the delta rows (cas: deltaplan.go): every delta's base
// is indexed and standalone, the reverse index matches, the counter and the
// format are right, plans are for queued chunks; with the objects' headers
// read (objects, from ReadData), that every delta object has its row and
// every row its object.
func checkDeltas(s *cas.Store, queued map[cas.ID]cas.PendingReencode, users map[cas.ID]string,
	objects map[cas.ID]objectBase, problem, note func(kind, p, chunk, format string, args ...any)) error {
	return s.View(func(tx *cas.Tx) error {
		rows := 0
		err := tx.ForEachDelta(func(id, base cas.ID, dist int) error {
			rows++
			user := users[id]
			if _, ok, err := tx.Chunk(id); err != nil {
				return err
			} else if !ok {
				problem("delta-stale", user, id.String(), "delta row of a chunk that is not indexed")
			}
			if _, ok, err := tx.Chunk(base); err != nil {
				return err
			} else if !ok {
				problem("delta-base-missing", user, id.String(), "its base %v is not indexed: a collection may have deleted it", base)
			}
			if _, _, ok, err := tx.Delta(base); err != nil {
				return err
			} else if ok {
				problem("delta-depth", user, id.String(), "its base %v is a delta itself (deltas have depth 1)", base)
			}
			if !tx.HasBaseRow(base, id) {
				problem("delta-reverse", user, id.String(), "no reverse row for its base %v: a collection would not keep the base", base)
			}
			if o, ok := objects[id]; ok {
				_, pending := queued[id]
				switch {
				case o.delta && o.base != base:
					problem("delta-base", user, id.String(), "object is a delta against %v, its row says %v", o.base, base)
				case !o.delta && pending:
					note("delta-pending", user, id.String(), "delta row over a standalone object: a re-encode was interrupted; the next one settles it")
				case !o.delta:
					problem("delta-standalone", user, id.String(), "delta row over a standalone object")
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if c := tx.Counts().DeltaChunks; c != int64(rows) {
			problem("counter", "", "", "delta_chunks counter is %d, the catalog holds %d", c, rows)
		}
		if rows > 0 && s.Format() < cas.FormatVersion {
			problem("format", "", "", "the store holds deltas at format %d: an older ckptfs would open it", s.Format())
		}
		if err := tx.ForEachBaseRow(func(base, id cas.ID) error {
			if b, _, ok, err := tx.Delta(id); err != nil {
				return err
			} else if !ok || b != base {
				problem("delta-reverse", users[base], base.String(), "reverse row names delta %v, which is not a delta against it", id)
			}
			return nil
		}); err != nil {
			return err
		}
		for id, o := range objects {
			if !o.delta {
				continue
			}
			if _, _, ok, err := tx.Delta(id); err != nil {
				return err
			} else if !ok {
				problem("delta-unrecorded", users[id], id.String(), "object is a delta against %v but has no delta row: a collection would not keep its base", o.base)
			}
		}
		return tx.ForEachDeltaPlan(func(id, base cas.ID, _ int) error {
			if _, ok := queued[id]; !ok {
				note("delta-plan-stale", users[id], id.String(), "delta plan of a chunk that is not queued for re-encoding")
			}
			return nil
		})
	})
}
