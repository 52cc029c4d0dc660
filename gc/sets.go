package gc

import (
	"bytes"
	"slices"

	"github.com/ckptfs/ckptfs/cas"
)

// idSet is a set of chunk IDs held compactly: a sorted slice, 32 bytes a
// chunk (a map costs about twice that), for the chunks a collection marks
// and those fsck finds named. Adds go to a buffer that is sorted into the
// set when it grows to a quarter of the set (so adding n IDs to a set of m
// costs O(n log n + 4n), and the set takes at most 2.5 times its size while
// it merges); has and len need seal first.
type idSet struct {
	sorted  []cas.ID
	pending []cas.ID
}

// minPending is the buffer size below which adds are not merged yet.
const minPending = 1 << 12

func compareIDs(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) }

// add puts id in the set.
func (s *idSet) add(id cas.ID) {
	s.pending = append(s.pending, id)
	if len(s.pending) >= max(minPending, len(s.sorted)/4) {
		s.seal()
	}
}

// seal merges the buffered adds into the sorted set.
func (s *idSet) seal() {
	if len(s.pending) == 0 {
		return
	}
	slices.SortFunc(s.pending, compareIDs)
	s.pending = slices.Compact(s.pending)
	merged := make([]cas.ID, 0, len(s.sorted)+len(s.pending))
	i, j := 0, 0
	for i < len(s.sorted) && j < len(s.pending) {
		switch c := compareIDs(s.sorted[i], s.pending[j]); {
		case c < 0:
			merged = append(merged, s.sorted[i])
			i++
		case c > 0:
			merged = append(merged, s.pending[j])
			j++
		default:
			merged = append(merged, s.sorted[i])
			i, j = i+1, j+1
		}
	}
	merged = append(merged, s.sorted[i:]...)
	merged = append(merged, s.pending[j:]...)
	s.sorted = slices.Clip(merged)
	s.pending = s.pending[:0]
}

// has reports whether id is in the set (sealed).
func (s *idSet) has(id cas.ID) bool {
	_, ok := slices.BinarySearchFunc(s.sorted, id, compareIDs)
	return ok
}

// len is the number of IDs in the set (sealed).
func (s *idSet) len() int { return len(s.sorted) }

// inoSet is a set of inode numbers: a bitmap in pages of 64Ki numbers,
// allocated as numbers fall in them (inode numbers are handed out in
// sequence, so a store's nodes fill few pages: 8 KiB per 65536 numbers).
type inoSet map[uint64]*[inoPageWords]uint64

const (
	inoPageBits  = 16
	inoPageWords = 1 << inoPageBits / 64
)

func (s inoSet) add(ino uint64) {
	p := s[ino>>inoPageBits]
	if p == nil {
		p = new([inoPageWords]uint64)
		s[ino>>inoPageBits] = p
	}
	bit := ino & (1<<inoPageBits - 1)
	p[bit/64] |= 1 << (bit % 64)
}

func (s inoSet) has(ino uint64) bool {
	p := s[ino>>inoPageBits]
	if p == nil {
		return false
	}
	bit := ino & (1<<inoPageBits - 1)
	return p[bit/64]&(1<<(bit%64)) != 0
}
