package main

import (
	"encoding/binary"
	"fmt"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/zeebo/blake3"
)

// duUsage is the space accounting of a set of files (one du PATH, or all of
// them). A chunk is freed by deleting the set when no file outside the set
// uses it: no committed manifest of another file, and no open or staged file
// of the mount (an open file keeps its chunks until it is closed, and gc keeps
// them too), and, when it is the base of delta-coded chunks (cas: deltaplan.go),
// none of those deltas is still used: a base is freed with the last of its
// deltas, which may be a file outside the set (then it is kept, and counted
// in Kept*), or a file of the set (then deleting the set frees it though the
// set's files do not name it). Freed chunks become garbage that the next
// `ckptfs gc` deletes: these are the figures it reports, as gc.Collect
// marks every chunk a file names and the base of every such delta.
type duUsage struct {
	Files            int   `json:"files"`              // files with committed content
	LogicalBytes     int64 `json:"logical_bytes"`      // sum of their sizes
	UniqueBytes      int64 `json:"unique_bytes"`       // raw bytes of their distinct chunks
	Chunks           int   `json:"chunks"`             // their distinct chunks
	FreesBytes       int64 `json:"frees_bytes"`        // raw bytes of the chunks deleting them frees
	FreesChunks      int   `json:"frees_chunks"`       // how many such chunks
	FreesStoredBytes int64 `json:"frees_stored_bytes"` // bytes of those chunks' object files (whole packs only)
	// Chunks in packs that deleting frees in the index but whose packs other
	// chunks keep: their bytes stay on disk, dead, until each pack's last
	// chunk goes (packs are not rewritten: cas's doc, Packs).
	FreesPackedDeadBytes int64 `json:"frees_packed_dead_bytes"`
	// Chunks only the set's files use but that deleting them does not free:
	// bases of delta-coded chunks that other files still use.
	KeptBytes       int64 `json:"kept_bytes"`        // their raw bytes
	KeptChunks      int   `json:"kept_chunks"`       // how many
	KeptStoredBytes int64 `json:"kept_stored_bytes"` // bytes of their object files
	KeptForDeltas   int   `json:"kept_for_deltas"`   // the deltas, still used, that keep them
	// The set's chunks stored whole until a later save of them releases
	// their delta plans (the latest save of each run, until the run's next
	// save: cas's doc.go), and the bytes of their object files now.
	WaitingChunks      int   `json:"waiting_chunks"`
	WaitingStoredBytes int64 `json:"waiting_stored_bytes"`
	// Files of the set that have names outside it (hard links): deleting
	// the set's names leaves them, and their chunks, in the store.
	OtherNames int `json:"other_names"`
}

// duResult answers the control op "du": one usage per group of inode numbers,
// and the usage of all groups together.
type duResult struct {
	Groups []duUsage `json:"groups"`
	Total  duUsage   `json:"total"`
	// DirsExpanded says that the daemon read the request's GroupDirs.
	DirsExpanded bool `json:"dirs_expanded,omitempty"`
	// ReadOnly: the mount reads a remote (--read-only), where nothing can
	// be deleted; the figures are what deleting the files frees in a
	// store that holds them as this one does.
	ReadOnly bool `json:"read_only,omitempty"`
}

// expandGroups adds to each group i with dirs[i] not 0 the regular files
// below directory dirs[i] in the catalog, at any depth: what du's walk of
// that directory through the mount finds, less the files not committed yet,
// which have no manifest to count. One catalog read.
func expandGroups(store *cas.Store, groups [][]uint64, dirs []uint64) ([][]uint64, error) {
	if len(dirs) == 0 {
		return groups, nil
	}
	out := make([][]uint64, max(len(groups), len(dirs)))
	copy(out, groups)
	var below func(tx *cas.Tx, dir uint64, inos []uint64) ([]uint64, error)
	below = func(tx *cas.Tx, dir uint64, inos []uint64) ([]uint64, error) {
		err := tx.Children(dir, func(name string, ino uint64) error {
			n, ok, err := tx.Node(ino)
			switch {
			case err != nil:
				return err
			case !ok:
				return fmt.Errorf("directory %d entry %q names missing node %d", dir, name, ino)
			case n.IsDir():
				inos, err = below(tx, ino, inos)
				return err
			case n.IsRegular():
				inos = append(inos, ino)
			}
			return nil
		})
		return inos, err
	}
	err := store.View(func(tx *cas.Tx) error {
		for i, dir := range dirs {
			if dir == 0 {
				continue
			}
			if n, ok, err := tx.Node(dir); err != nil {
				return err
			} else if !ok || !n.IsDir() {
				return fmt.Errorf("inode %d is not a directory (removed since du looked?)", dir)
			}
			var err error
			if out[i], err = below(tx, dir, out[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// duSet accumulates one set of files.
type duSet struct {
	usage  duUsage
	chunks map[cas.ID]uint32 // distinct chunks → raw length
	refs   map[cas.ID]int    // distinct chunks → how many of the set's files use them
}

func newDuSet() *duSet {
	return &duSet{chunks: map[cas.ID]uint32{}, refs: map[cas.ID]int{}}
}

// addFile adds a file of the set; all says whether the set holds all of its
// names (else deleting the set leaves it: its chunks are not freed).
func (s *duSet) addFile(m *cas.Manifest, all bool) {
	s.usage.Files++
	s.usage.LogicalBytes += m.Size()
	if !all {
		s.usage.OtherNames++
	}
	for _, c := range distinctChunks(m) {
		s.chunks[c.ID] = c.Len
		if all {
			s.refs[c.ID]++
		}
	}
}

// duGraph is what du needs of the store beyond the sets' own chunks: every
// file that uses each chunk of interest (the sets' chunks, the bases of
// those that are deltas, and every delta of those bases), and the delta
// rows between them. Deltas have depth 1 (a base is never a delta), so that
// closure is one step.
type duGraph struct {
	users    map[cas.ID]int      // chunk of interest → files using it (committed or open)
	deltasOf map[cas.ID][]cas.ID // base → its deltas
	baseOf   map[cas.ID]cas.ID   // delta of interest → its base
	info     map[cas.ID]cas.ChunkInfo
	packs    map[cas.ID]cas.PackInfo // packs of the chunks of interest
	waiting  map[cas.ID]bool         // chunks whose delta plans wait for a later save
}

// newDuGraph reads the delta rows around chunks and the index rows of the
// chunks it adds.
func newDuGraph(tx *cas.Tx, chunks map[cas.ID]uint32) (*duGraph, error) {
	g := &duGraph{users: make(map[cas.ID]int, len(chunks)), deltasOf: map[cas.ID][]cas.ID{}, baseOf: map[cas.ID]cas.ID{}, info: map[cas.ID]cas.ChunkInfo{},
		packs: map[cas.ID]cas.PackInfo{}, waiting: map[cas.ID]bool{}}
	for id := range chunks {
		g.users[id] = 0
	}
	for id := range chunks {
		if w, err := tx.DeltaWaits(id); err != nil {
			return nil, err
		} else if w {
			g.waiting[id] = true
		}
		if base, _, ok, err := tx.Delta(id); err != nil {
			return nil, err
		} else if ok {
			g.deltasOf[base] = nil
			g.baseOf[id] = base
		}
		if tx.IsBase(id) {
			g.deltasOf[id] = nil
		}
	}
	for base := range g.deltasOf {
		var ds []cas.ID
		if err := tx.ForEachDeltaOf(base, func(d cas.ID) error {
			ds = append(ds, d)
			return nil
		}); err != nil {
			return nil, err
		}
		g.deltasOf[base] = ds
		for _, id := range append(ds, base) {
			if _, ok := g.users[id]; !ok {
				g.users[id] = 0
			}
		}
	}
	for id := range g.users {
		info, ok, err := tx.Chunk(id)
		if err != nil {
			return nil, err
		}
		if ok {
			g.info[id] = info
		}
		if _, seen := g.packs[info.Pack]; ok && info.Packed() && !seen {
			p, _, err := tx.Pack(info.Pack)
			if err != nil {
				return nil, err
			}
			g.packs[info.Pack] = p
		}
	}
	return g, nil
}

// count adds m's uses of the chunks of interest.
func (g *duGraph) count(m *cas.Manifest) {
	for _, c := range distinctChunks(m) {
		if _, ok := g.users[c.ID]; ok {
			g.users[c.ID]++
		}
	}
}

// finish totals the set: a chunk is freed by deleting the set when every
// file that uses it is in the set and, for a base, every delta of it is
// freed too (or was garbage already).
func (s *duSet) finish(g *duGraph) duUsage {
	u := s.usage
	gone := func(id cas.ID) bool { return g.users[id] <= s.refs[id] }
	// liveDeltas counts the deltas of base that stay in use.
	liveDeltas := func(base cas.ID) int {
		n := 0
		for _, d := range g.deltasOf[base] {
			if !gone(d) {
				n++
			}
		}
		return n
	}
	freedInPack := map[cas.ID]int{} // pack → its chunks freed
	frees := func(id cas.ID, raw int64) {
		u.FreesChunks++
		u.FreesBytes += raw
		if info := g.info[id]; info.Packed() {
			freedInPack[info.Pack]++
			u.FreesPackedDeadBytes += int64(info.StoredLen)
			return
		}
		u.FreesStoredBytes += int64(g.info[id].StoredLen)
	}
	packsFreed := func() {
		// A pack is freed (its whole size) when all its live chunks are.
		for p, n := range freedInPack {
			if pi := g.packs[p]; n >= pi.Live {
				u.FreesStoredBytes += pi.Size
				u.FreesPackedDeadBytes -= pi.LiveBytes
			}
		}
	}
	for id, n := range s.chunks {
		u.Chunks++
		u.UniqueBytes += int64(n)
		if g.waiting[id] {
			u.WaitingChunks++
			u.WaitingStoredBytes += int64(g.info[id].StoredLen)
		}
		if !gone(id) {
			continue
		}
		if live := liveDeltas(id); live > 0 {
			u.KeptChunks++
			u.KeptBytes += int64(n)
			u.KeptStoredBytes += int64(g.info[id].StoredLen)
			u.KeptForDeltas += live
			continue
		}
		frees(id, int64(n))
	}
	// Bases no file names, kept now by deltas that the set's files are the
	// last users of.
	var done map[cas.ID]bool
	for id := range s.chunks {
		base, ok := g.baseOf[id]
		if !ok || done[base] {
			continue
		}
		if done == nil {
			done = map[cas.ID]bool{}
		}
		done[base] = true
		if _, own := s.chunks[base]; own || g.users[base] > 0 {
			continue
		}
		used := false
		for _, d := range g.deltasOf[base] {
			used = used || g.users[d] > 0
		}
		if used && liveDeltas(base) == 0 {
			frees(base, int64(g.info[base].RawLen))
		}
	}
	packsFreed()
	return u
}

// distinctChunks returns m's chunks without repeats.
func distinctChunks(m *cas.Manifest) []cas.ChunkRef {
	seen := make(map[cas.ID]struct{}, len(m.Chunks))
	out := make([]cas.ChunkRef, 0, len(m.Chunks))
	for _, c := range m.Chunks {
		if _, dup := seen[c.ID]; !dup {
			seen[c.ID] = struct{}{}
			out = append(out, c)
		}
	}
	return out
}

// diskUsage computes du for groups of inode numbers (files of the mount; other
// inode numbers are ignored) against every manifest of the store and the
// mount's live manifests. Each chunk of the groups' files counts the files
// that use it, in the groups and in all: the work is linear in the chunk
// references of the store plus those of the groups, whatever the number of
// groups (du with one path per step). Memory is proportional to the chunks of
// the groups' files and their delta relatives (bases, and the bases' other
// deltas: a keyframe's few), not to the store.
//
// A group lists an inode number once for each of its names in the group
// (hard links): a file with a name outside a group survives its deletion.
// All groups together hold the sum of their names of it, which counts a
// name twice when two groups overlap (du DIR DIR/FILE): the total then takes
// such a file for deleted with its names inside the groups.
func diskUsage(store *cas.Store, live []*cas.Manifest, groups [][]uint64) (duResult, error) {
	sets := make([]*duSet, len(groups))
	member := map[uint64]map[int]int{} // ino → the groups holding it → its names there
	for gi, g := range groups {
		sets[gi] = newDuSet()
		for _, ino := range g {
			if member[ino] == nil {
				member[ino] = map[int]int{}
			}
			member[ino][gi]++
		}
	}
	total := newDuSet()
	var res duResult
	err := store.View(func(tx *cas.Tx) error {
		// The groups' own files. Remember their manifests' keys: a live
		// manifest equal to one of them is that file's open handle, not
		// another file.
		own := map[[32]byte]bool{}
		for ino, gs := range member {
			m, ok, err := tx.Manifest(ino)
			if err != nil {
				return err
			}
			if !ok {
				continue // a directory, or a file with nothing committed yet
			}
			links := 1
			if n, ok, err := tx.Node(ino); err != nil {
				return err
			} else if ok && n.Nlink > 1 {
				links = int(n.Nlink)
			}
			names := 0
			for gi, k := range gs {
				sets[gi].addFile(m, k >= links)
				names += k
			}
			total.addFile(m, names >= links)
			own[manifestKey(m)] = true
		}
		// Every file, committed or live, that uses one of those chunks or
		// of their delta relatives.
		g, err := newDuGraph(tx, total.chunks)
		if err != nil {
			return err
		}
		err = tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			g.count(m)
			return nil
		})
		if err != nil {
			return err
		}
		for _, m := range live {
			if !own[manifestKey(m)] {
				g.count(m)
			}
		}
		res.Groups = make([]duUsage, len(sets))
		for gi, s := range sets {
			res.Groups[gi] = s.finish(g)
		}
		res.Total = total.finish(g)
		return nil
	})
	return res, err
}

// manifestKey identifies a manifest's content (its chunk list and holes).
func manifestKey(m *cas.Manifest) [32]byte {
	h := blake3.New()
	var b [cas.IDSize + 4]byte
	for _, c := range m.Chunks {
		copy(b[:], c.ID[:])
		binary.LittleEndian.PutUint32(b[cas.IDSize:], c.Len)
		h.Write(b[:])
	}
	for _, hole := range m.Holes {
		var hb [16]byte
		binary.LittleEndian.PutUint64(hb[:], uint64(hole.Before))
		binary.LittleEndian.PutUint64(hb[8:], uint64(hole.Len))
		h.Write(hb[:])
	}
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// earliestUse answers the control op "earliest": for each of chunks (hex
// IDs), the earliest change time (the last commit, in ns) of a committed file
// that uses it, leaving out the files of exclude[0]. Chunks no such file uses
// are absent. One pass over the manifests.
func earliestUse(store *cas.Store, exclude [][]uint64, chunks []string) (map[string]int64, error) {
	skip := map[uint64]bool{}
	if len(exclude) > 0 {
		for _, ino := range exclude[0] {
			skip[ino] = true
		}
	}
	want := make(map[cas.ID]bool, len(chunks))
	for _, c := range chunks {
		id, err := cas.ParseID(c)
		if err != nil {
			return nil, err
		}
		want[id] = true
	}
	out := map[string]int64{}
	err := store.View(func(tx *cas.Tx) error {
		return tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			if skip[ino] {
				return nil
			}
			var ctime int64
			known := false
			for _, c := range m.Chunks {
				if !want[c.ID] {
					continue
				}
				if !known {
					n, ok, err := tx.Node(ino)
					if err != nil {
						return err
					}
					if !ok {
						return nil // a manifest without a node: fsck's business
					}
					ctime, known = n.Ctime, true
				}
				k := c.ID.String()
				if t, ok := out[k]; !ok || ctime < t {
					out[k] = ctime
				}
			}
			return nil
		})
	})
	return out, err
}
