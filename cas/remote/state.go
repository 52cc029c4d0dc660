package remote

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/catalog"
)

// Snapshot is a published namespace state: every path a writer session
// knows of, each with the stamp and the session of its version, removed
// paths as tombstones (format 3; the first formats had neither, and read
// as stamped zero by nobody).
type Snapshot struct {
	Version int            `json:"version"`
	Gen     uint64         `json:"gen"`               // the writer's commit generation
	Time    time.Time      `json:"time"`              // when it was made
	Session string         `json:"session,omitempty"` // the session that published it ("" for a checkpoint)
	Files   []SnapshotFile `json:"files"`
}

// SnapshotFile is one path of a Snapshot.
type SnapshotFile struct {
	Path     string        `json:"path"` // slash-separated, relative to the mount's root
	Node     cas.Node      `json:"node"` // attributes (no Ino, Atime, Ctime)
	Manifest *cas.Manifest `json:"-"`
	Raw      []byte        `json:"manifest,omitempty"` // regular files: Manifest, marshalled
	Stamp    Stamp         `json:"stamp"`
	Origin   string        `json:"origin,omitempty"`  // the session that made this version
	Deleted  bool          `json:"deleted,omitempty"` // a tombstone: removed at Stamp
}

const snapshotVersion = 3

// entry is one path's version in a state: what it is and who made it when.
type entry struct {
	nsEntry
	Stamp   Stamp
	Origin  string
	Deleted bool
}

// wins reports whether version a beats version b of the same path.
func wins(a, b entry) bool {
	if a.Stamp != b.Stamp {
		return b.Stamp.Less(a.Stamp)
	}
	return a.Origin > b.Origin
}

// state maps every path to its winning version. Merging states is
// commutative, associative and idempotent (last writer wins per path).
type state map[string]entry

func (st state) merge(o state) {
	for p, e := range o {
		if cur, ok := st[p]; !ok || wins(e, cur) {
			st[p] = e
		}
	}
}

func (st state) clone() state {
	out := make(state, len(st))
	for p, e := range st {
		out[p] = e
	}
	return out
}

func depth(p string) int {
	n := 0
	for i := range len(p) {
		if p[i] == '/' {
			n++
		}
	}
	return n
}

// byDepth sorts paths parents first (then by name, for determinism).
func byDepth(ps []string) {
	sort.Slice(ps, func(i, j int) bool {
		if di, dj := depth(ps[i]), depth(ps[j]); di != dj {
			return di < dj
		}
		return ps[i] < ps[j]
	})
}

// visible is the namespace a state shows: its live paths, each below a
// directory. A live path whose directory was removed brings the directory
// back (a file committed is never hidden by a concurrent rmdir); a path
// below something that is not a directory is hidden (logged by the caller
// as a conflict it lost).
func (st state) visible() map[string]nsEntry {
	ps := make([]string, 0, len(st))
	for p, e := range st {
		if !e.Deleted {
			ps = append(ps, p)
		}
	}
	byDepth(ps)
	out := make(map[string]nsEntry, len(ps))
	hidden := map[string]bool{}
	var dirOK func(d string) bool
	dirOK = func(d string) bool {
		if d == "." || d == "" {
			return true
		}
		if e, ok := out[d]; ok {
			return e.kind() == syscall.S_IFDIR
		}
		if hidden[d] || !dirOK(path.Dir(d)) {
			return false
		}
		n := cas.Node{Mode: syscall.S_IFDIR | 0o755}
		if e, ok := st[d]; ok && e.kind() == syscall.S_IFDIR {
			n = e.Node
		}
		out[d] = nsEntry{Node: n}
		return true
	}
	for _, p := range ps {
		if !dirOK(path.Dir(p)) {
			hidden[p] = true
			continue
		}
		if _, ok := out[p]; !ok {
			e := st[p].nsEntry
			e.ctime = st[p].Stamp.Wall // applied here, the record keeps its version's time
			out[p] = e
		}
	}
	return out
}

// snapshot is st as a Snapshot, paths in order.
func (st state) snapshot(session string, gen uint64) *Snapshot {
	snap := &Snapshot{Version: snapshotVersion, Gen: gen, Time: time.Now().UTC(), Session: session}
	ps := make([]string, 0, len(st))
	for p := range st {
		ps = append(ps, p)
	}
	byDepth(ps)
	for _, p := range ps {
		e := st[p]
		f := SnapshotFile{Path: p, Stamp: e.Stamp, Origin: e.Origin, Deleted: e.Deleted}
		if !e.Deleted {
			f.Node, f.Raw = e.Node, e.Raw
		}
		snap.Files = append(snap.Files, f)
	}
	return snap
}

// stateOf reads a parsed Snapshot into a state.
func stateOf(snap *Snapshot) state {
	st := state{}
	if snap == nil {
		return st
	}
	for _, f := range snap.Files {
		e := entry{Stamp: f.Stamp, Origin: f.Origin, Deleted: f.Deleted}
		if !f.Deleted {
			e.Node = published(f.Node)
			if f.Manifest != nil {
				e.m, e.Raw = f.Manifest, f.Manifest.Marshal()
			}
		}
		st[f.Path] = e
	}
	return st
}

// parseSnapshot decodes and checks a snapshot's bytes.
func parseSnapshot(name string, body []byte) (*Snapshot, error) {
	snap := &Snapshot{}
	if err := json.Unmarshal(body, snap); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", name, err)
	}
	if snap.Version < 1 || snap.Version > snapshotVersion {
		return nil, fmt.Errorf("snapshot %s has version %d, this ckptfs reads up to %d: %w", name, snap.Version, snapshotVersion, cas.ErrNewerFormat)
	}
	var err error
	for i := range snap.Files {
		f := &snap.Files[i]
		if !f.Deleted && (f.Node.IsRegular() || snap.Version == 1) {
			if f.Manifest, err = catalog.ParseManifest(f.Raw); err != nil {
				return nil, fmt.Errorf("snapshot %s, %s: %w", name, f.Path, err)
			}
			if snap.Version == 1 {
				f.Node.Mode = syscall.S_IFREG | f.Node.Mode&0o7777
			}
		}
		f.Raw = nil
	}
	return snap, nil
}
