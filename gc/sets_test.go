package gc

import (
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

func TestIDSet(t *testing.T) {
	id := func(i int) cas.ID { return cas.Sum([]byte{byte(i), byte(i >> 8), byte(i >> 16)}) }
	for _, tc := range []struct {
		name           string
		adds, distinct int // adds id(k % distinct) for each k < adds
	}{
		{"empty", 0, 1},
		{"one", 1, 1},
		{"repeats within a buffer", 1000, 10},
		{"several merges, all distinct", 3*minPending + 17, 3*minPending + 17},
		{"several merges, repeats across them", 5 * minPending, minPending + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s idSet
			for k := range tc.adds {
				s.add(id(k % tc.distinct))
			}
			s.seal()
			want := min(tc.adds, tc.distinct)
			if s.len() != want {
				t.Fatalf("len %d, want %d", s.len(), want)
			}
			for k := range tc.distinct + 5 {
				if got := s.has(id(k)); got != (k < want) {
					t.Fatalf("has(id(%d)) = %v", k, got)
				}
			}
		})
	}
}

func TestInoSet(t *testing.T) {
	s := inoSet{}
	in := []uint64{1, 16, 63, 64, 65535, 65536, 1 << 40, 1<<64 - 1}
	for _, ino := range in {
		s.add(ino)
	}
	for _, ino := range in {
		if !s.has(ino) {
			t.Errorf("has(%d) = false", ino)
		}
	}
	for _, ino := range []uint64{0, 2, 62, 65, 65537, 1<<40 + 1, 1<<64 - 2} {
		if s.has(ino) {
			t.Errorf("has(%d) = true", ino)
		}
	}
	if len(s) != 4 {
		t.Errorf("%d pages for inode numbers in 4 pages", len(s))
	}
}
