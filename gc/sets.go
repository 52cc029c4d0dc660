package gc

import (
	"bytes"
	"slices"

	"github.com/ckptfs/ckptfs/cas"
)

// idSet is a set of chunk IDs held compactly, for the chunks a collection
// marks and those fsck finds named: 32 bytes a chunk (a map costs about
// twice that), sorted, in blocks of idBlock IDs so that it grows without
// being copied. Adds go to a buffer that is merged into the set when it
// grows to a quarter of the set: its IDs already in the set are dropped,
// the set is extended by the rest and the two are merged from the back, in
// place. So adding n IDs to a set of m costs O(n log m + 4m), and the set
// takes at most 1.25 times its size, with no garbage (at 10⁶ chunks: 40 MiB
// at most, where merging into a new slice took 80 MiB at the last merge, and
// more before the collector caught up: within a 128 MiB cgroup, the
// difference between a collection that runs and one that is OOM-killed).
// has, len and get need seal first.
type idSet struct {
	blocks  [][]cas.ID // every block but the last holds idBlock IDs
	n       int        // the IDs of the set: blocks' first n slots, sorted
	pending []cas.ID   // adds not merged yet (the buffer is reused)
}

const (
	// minPending is the buffer size below which adds are not merged yet.
	minPending   = 1 << 12
	idBlockShift = 12 // 4096 IDs, 128 KiB a block
	idBlock      = 1 << idBlockShift
)

func compareIDs(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) }

// at returns slot i of the blocks.
func (s *idSet) at(i int) *cas.ID { return &s.blocks[i>>idBlockShift][i&(idBlock-1)] }

// add puts id in the set.
func (s *idSet) add(id cas.ID) {
	s.pending = append(s.pending, id)
	if len(s.pending) >= max(minPending, s.n/4) {
		s.seal()
	}
}

// seal merges the buffered adds into the sorted set.
func (s *idSet) seal() {
	if len(s.pending) == 0 {
		return
	}
	slices.SortFunc(s.pending, compareIDs)
	add := slices.Compact(s.pending)
	k := 0
	for _, id := range add {
		if !s.has(id) {
			add[k] = id
			k++
		}
	}
	add = add[:k]
	s.grow(s.n + k)
	// From the back: slot w is never one of the set's IDs not yet moved.
	i, j := s.n-1, k-1
	for w := s.n + k - 1; j >= 0; w-- {
		if i >= 0 && compareIDs(*s.at(i), add[j]) > 0 {
			*s.at(w) = *s.at(i)
			i--
		} else {
			*s.at(w) = add[j]
			j--
		}
	}
	s.n += k
	s.pending = s.pending[:0]
}

// grow makes room for n IDs in the blocks: the last block is extended (a
// copy of at most one block), then whole blocks added.
func (s *idSet) grow(n int) {
	for {
		l := len(s.blocks)
		room := 0
		if l > 0 {
			room = (l-1)*idBlock + len(s.blocks[l-1])
		}
		switch {
		case room >= n:
			return
		case l > 0 && len(s.blocks[l-1]) < idBlock:
			last := s.blocks[l-1]
			s.blocks[l-1] = append(last, make([]cas.ID, min(idBlock, n-(l-1)*idBlock)-len(last))...)
		default:
			s.blocks = append(s.blocks, make([]cas.ID, min(idBlock, n-l*idBlock)))
		}
	}
}

// has reports whether id is in the set (sealed; IDs not merged yet are not
// seen).
func (s *idSet) has(id cas.ID) bool {
	lo, hi := 0, s.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch c := compareIDs(*s.at(m), id); {
		case c == 0:
			return true
		case c < 0:
			lo = m + 1
		default:
			hi = m
		}
	}
	return false
}

// len is the number of IDs in the set (sealed).
func (s *idSet) len() int { return s.n }

// get returns the set's i-th ID in order (sealed).
func (s *idSet) get(i int) cas.ID { return *s.at(i) }

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
