package main

import (
	"encoding/binary"
	"slices"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/zeebo/blake3"
)

// duUsage is the space accounting of a set of files (one du PATH, or all of
// them). A chunk is freed by deleting the set when no file outside the set
// uses it: no committed manifest of another file, and no open or staged file
// of the mount (an open file keeps its chunks until it is closed, and gc keeps
// them too). Freed chunks become garbage; `ckptfs gc` deletes them once they
// are older than its grace period.
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
	usage   duUsage
	chunks  map[cas.ID]uint32 // distinct chunks → raw length
	outside map[cas.ID]bool   // chunks some file outside the set uses
}

func newDuSet() *duSet {
	return &duSet{chunks: map[cas.ID]uint32{}, outside: map[cas.ID]bool{}}
}

func (s *duSet) addFile(m *cas.Manifest) {
	s.usage.Files++
	s.usage.LogicalBytes += m.Size()
	for _, c := range m.Chunks {
		s.chunks[c.ID] = c.Len
	}
}

// markOutside notes the chunks of m, a file outside the set, that the set uses.
func (s *duSet) markOutside(m *cas.Manifest) {
	for _, c := range m.Chunks {
		if _, ok := s.chunks[c.ID]; ok {
			s.outside[c.ID] = true
		}
	}
}

func (s *duSet) finish(tx *cas.Tx) (duUsage, error) {
	u := s.usage
	for id, n := range s.chunks {
		u.Chunks++
		u.UniqueBytes += int64(n)
		if s.outside[id] {
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

// diskUsage computes du for groups of inode numbers (files of the mount; other
// inode numbers are ignored) against every manifest of the store and the
// mount's live manifests. Memory is proportional to the chunks of the groups'
// files, not to the store.
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
		// Every other file, committed or live.
		err := tx.ForEachManifest(func(ino uint64, m *cas.Manifest) error {
			gs := member[ino]
			if len(gs) == 0 {
				total.markOutside(m)
			}
			for gi, s := range sets {
				if !slices.Contains(gs, gi) {
					s.markOutside(m)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, m := range live {
			if own[manifestKey(m)] {
				continue
			}
			total.markOutside(m)
			for _, s := range sets {
				s.markOutside(m)
			}
		}
		res.Groups = make([]duUsage, len(sets))
		for gi, s := range sets {
			if res.Groups[gi], err = s.finish(tx); err != nil {
				return err
			}
		}
		res.Total, err = total.finish(tx)
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
