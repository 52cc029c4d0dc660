package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

// A Hole is a run of Len zero bytes of a file that names no chunk: the file
// has it just before its manifest's chunk Before (at the end when Before is
// len(Chunks)). A hole costs the same whatever its length, so extending a
// file (truncate, a write past its end) costs nothing in proportion to the
// new size, and a read of a hole reads no object.
//
// A manifest's holes are sorted by Before, at most one per place (two holes
// next to each other are one), each at least one byte long; the file's size
// (Size) is its chunks' lengths plus its holes' and stays at most
// math.MaxInt64. ParseManifest refuses any record that breaks these.
type Hole struct {
	Before int
	Len    int64
}

// Size is the file size the manifest describes: its chunks and its holes.
func (m *Manifest) Size() int64 {
	var s int64
	for _, c := range m.Chunks {
		s += int64(c.Len)
	}
	return s + m.HoleBytes()
}

// HoleBytes is how many of the file's bytes are holes (no chunk, no space).
func (m *Manifest) HoleBytes() int64 {
	var s int64
	for _, h := range m.Holes {
		s += h.Len
	}
	return s
}

// Offsets returns the file offset of each chunk of m, holes counted.
func (m *Manifest) Offsets() []int64 {
	offs := make([]int64, len(m.Chunks))
	var off int64
	hi := 0
	for i, c := range m.Chunks {
		for hi < len(m.Holes) && m.Holes[hi].Before == i {
			off += m.Holes[hi].Len
			hi++
		}
		offs[i] = off
		off += int64(c.Len)
	}
	return offs
}

// AddHole appends a hole of n bytes at m's end (after its last chunk),
// merged with a hole already there. n ≤ 0 adds nothing.
func (m *Manifest) AddHole(n int64) {
	if n <= 0 {
		return
	}
	if k := len(m.Holes); k > 0 && m.Holes[k-1].Before == len(m.Chunks) {
		m.Holes[k-1].Len += n
		return
	}
	m.Holes = append(m.Holes, Hole{Before: len(m.Chunks), Len: n})
}

// NextData returns the offset of the first byte at or after off that a
// chunk holds (SEEK_DATA), and false when none does: the rest is a hole.
// offsets are m.Offsets().
func (m *Manifest) NextData(offsets []int64, off int64) (int64, bool) {
	i := sort.Search(len(offsets), func(i int) bool { return offsets[i]+int64(m.Chunks[i].Len) > off })
	if i == len(offsets) {
		return 0, false
	}
	return max(off, offsets[i]), true
}

// NextHole returns the offset of the first byte at or after off that lies
// in a hole, or the file's size when none does (SEEK_HOLE: the end of a
// file counts as a hole).
func (m *Manifest) NextHole(offsets []int64, off int64) int64 {
	size := m.Size()
	for i, o := range offsets {
		end := o + int64(m.Chunks[i].Len)
		if end <= off {
			continue
		}
		if o > off {
			return off // off lies in the hole before chunk i
		}
		// Chunks end to end with no hole between them are one data run.
		if i+1 < len(offsets) && offsets[i+1] == end {
			off = end
			continue
		}
		return min(end, size)
	}
	return min(off, size)
}

func appendHoles(b []byte, holes []Hole) []byte {
	b = binary.AppendUvarint(b, uint64(len(holes)))
	for _, h := range holes {
		b = binary.AppendUvarint(b, uint64(h.Before))
		b = binary.AppendUvarint(b, uint64(h.Len))
	}
	return b
}

// readHoles reads the holes of a manifest of chunks chunks, checking them.
func readHoles(r *bytes.Reader, chunks int) ([]Hole, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n == 0 || n > uint64(r.Len())/2 {
		return nil, errors.New("manifest holes: bad count")
	}
	holes := make([]Hole, n)
	var total uint64
	for i := range holes {
		before, err1 := binary.ReadUvarint(r)
		l, err2 := binary.ReadUvarint(r)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("manifest hole %d: %w", i, err)
		}
		if before > uint64(chunks) || (i > 0 && before <= uint64(holes[i-1].Before)) {
			return nil, fmt.Errorf("manifest hole %d: at chunk %d, out of order", i, before)
		}
		total += l
		if l == 0 || l > math.MaxInt64 || total > math.MaxInt64 {
			return nil, fmt.Errorf("manifest hole %d: bad length %d", i, l)
		}
		holes[i] = Hole{Before: int(before), Len: int64(l)}
	}
	return holes, nil
}

// HoleBytes returns how many bytes of file ino's committed manifest are
// holes, from the holes bucket (PutManifest keeps it), without reading the
// manifest: a stat's st_blocks. A missing row (or bucket: a store opened
// read-only from before holes) is 0.
func (t *Tx) HoleBytes(ino uint64) (int64, error) {
	b := t.b(bucketHoles)
	if b == nil {
		return 0, nil
	}
	key := u64key(ino)
	v := b.Get(key)
	if v == nil {
		return 0, nil
	}
	rec, err := t.openRecord(key, v)
	if err != nil {
		return 0, fmt.Errorf("hole bytes of %d: %w", ino, err)
	}
	n, k := binary.Uvarint(rec)
	if k != len(rec) || n > math.MaxInt64 {
		return 0, fmt.Errorf("hole bytes of %d: %w: bad record", ino, ErrCatalogDamaged)
	}
	return int64(n), nil
}

// putHoleBytes records n hole bytes for file ino (0: no row).
func (t *Tx) putHoleBytes(ino uint64, n int64) error {
	b := t.b(bucketHoles)
	key := u64key(ino)
	if n == 0 {
		if b == nil {
			return nil
		}
		return b.Delete(key)
	}
	if b == nil {
		return fmt.Errorf("file %d has holes, and the catalog no holes bucket (opened read-only?)", ino)
	}
	return b.Put(key, sealRecord(key, binary.AppendUvarint(nil, uint64(n))))
}
