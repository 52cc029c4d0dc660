package main

import (
	"encoding/binary"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/zeebo/blake3"
)

// duUsage is the space accounting of a set of files (one du PATH, or all of
// them). A chunk is freed by deleting the set when no file outside the set
// uses it: no committed manifest of another file, and no open or staged file
// of the mount (an open file keeps its chunks until it is closed, and gc keeps
// them too). Freed chunks become garbage that the next `ckptfs gc` deletes.
type duUsage struct {
	Files            int   `json:"files"`              // files with committed content
	LogicalBytes     int64 `json:"logical_bytes"`      // sum of their sizes
	UniqueBytes      int64 `json:"unique_bytes"`       // raw bytes of their distinct chunks
	Chunks           int   `json:"chunks"`             // their distinct chunks
	FreesBytes       int64 `json:"frees_bytes"`        // raw bytes of the chunks only they use
	FreesChunks      int   `json:"frees_chunks"`       // how many such chunks
	FreesStoredBytes int64 `json:"frees_stored_bytes"` // bytes of those chunks' object files
}

// duResult answers the control op "du": one usage per group of inode numbers,
// and the usage of all groups together.
type duResult struct {
	Groups []duUsage `json:"groups"`
	Total  duUsage   `json:"total"`
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

func (s *duSet) addFile(m *cas.Manifest) {
	s.usage.Files++
	s.usage.LogicalBytes += m.Size()
	for _, c := range distinctChunks(m) {
		s.chunks[c.ID] = c.Len
		s.refs[c.ID]++
	}
}

// finish totals the set: a chunk is freed by deleting the set when every
// file that uses it (users: all files of the store and the mount) is in the
// set.
func (s *duSet) finish(tx *cas.Tx, users map[cas.ID]int) (duUsage, error) {
	u := s.usage
	for id, n := range s.chunks {
		u.Chunks++
		u.UniqueBytes += int64(n)
		if users[id] > s.refs[id] {
			continue
		}
		u.FreesChunks++
		u.FreesBytes += int64(n)
		info, ok, err := tx.Chunk(id)
		if err != nil {
			return u, err
		}
		if ok {
			u.FreesStoredBytes += int64(info.StoredLen)
		}
	}
	return u, nil
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
// the groups' files, not to the store.
func diskUsage(store *cas.Store, live []*cas.Manifest, groups [][]uint64) (duResult, error) {
	sets := make([]*duSet, len(groups))
	member := map[uint64][]int{} // ino → the groups holding it
	for gi, g := range groups {
		sets[gi] = newDuSet()
		for _, ino := range g {
			if l := member[ino]; len(l) == 0 || l[len(l)-1] != gi {
				member[ino] = append(member[ino], gi)
			}
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
			for _, gi := range gs {
				sets[gi].addFile(m)
			}
			total.addFile(m)
			own[manifestKey(m)] = true
		}
		// Every file, committed or live, that uses one of those chunks.
		users := make(map[cas.ID]int, len(total.chunks))
		count := func(m *cas.Manifest) {
			for _, c := range distinctChunks(m) {
				if _, ok := total.chunks[c.ID]; ok {
					users[c.ID]++
				}
			}
		}
		err := tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			count(m)
			return nil
		})
		if err != nil {
			return err
		}
		for _, m := range live {
			if !own[manifestKey(m)] {
				count(m)
			}
		}
		res.Groups = make([]duUsage, len(sets))
		for gi, s := range sets {
			if res.Groups[gi], err = s.finish(tx, users); err != nil {
				return err
			}
		}
		res.Total, err = total.finish(tx, users)
		return err
	})
	return res, err
}

// manifestKey identifies a manifest's content (its chunk list).
func manifestKey(m *cas.Manifest) [32]byte {
	h := blake3.New()
	var b [cas.IDSize + 4]byte
	for _, c := range m.Chunks {
		copy(b[:], c.ID[:])
		binary.LittleEndian.PutUint32(b[cas.IDSize:], c.Len)
		h.Write(b[:])
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
