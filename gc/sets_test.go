package gc

import (
	"runtime"
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
		{"many merges over several blocks", 24 * minPending, 7*idBlock + 5},
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
			for i := 1; i < s.len(); i++ {
				if compareIDs(s.get(i-1), s.get(i)) >= 0 {
					t.Fatalf("get(%d) = %v, not after get(%d) = %v", i, s.get(i), i-1, s.get(i-1))
				}
			}
		})
	}
}

// TestIDSetMemory: a set of n IDs grows without being copied, so all it
// allocates while n distinct IDs are added (the blocks once, and a buffer
// that doubles up to a quarter of the set) is within 2.5 times its 32 bytes
// an ID (2.05 measured); merging into new slices allocated 6.3 times, most
// of it garbage alive until the collector ran (the heap in use peaked at 98
// MiB for 10⁶ IDs, against 43 MiB now), and in a 128 MiB cgroup that is
// the difference.
func TestIDSetMemory(t *testing.T) {
	const n = 1 << 17
	ids := make([]cas.ID, n)
	for k := range ids {
		ids[k] = cas.Sum([]byte{byte(k), byte(k >> 8), byte(k >> 16)})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var s idSet
	for _, id := range ids {
		s.add(id)
	}
	s.seal()
	runtime.ReadMemStats(&after)
	if s.len() != n {
		t.Fatalf("len %d, want %d", s.len(), n)
	}
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(n*32*5/2); got > limit {
		t.Errorf("adding %d IDs allocated %d bytes, want at most %d", n, got, limit)
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
