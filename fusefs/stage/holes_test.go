package stage

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestCutHoles: a commit keeps the MinHole-aligned blocks of never-written
// runs as holes (and the tail of one that reaches the end), and cuts
// everything else, so that a stream and a spool holding the same writes
// agree whatever the filesystem's block size.
func TestCutHoles(t *testing.T) {
	const M = MinHole
	for _, c := range []struct {
		name string
		data []region
		size int64
		want []region
	}{
		{"empty file", nil, 0, nil},
		{"all hole", nil, 1 << 40, nil},
		{"small file, no data", nil, M - 1, []region{{0, M - 1}}},
		{"all data", []region{{0, 5 * M}}, 5 * M, []region{{0, 5 * M}}},
		{"tail hole", []region{{0, M + 123}}, 9 * M, []region{{0, 2 * M}}},
		{"tail short of a block", []region{{0, 8*M + 123}}, 9*M + 123, []region{{0, 9*M + 123}}},
		{"hole in the middle", []region{{0, 4096}, {5*M + 10, 5*M + 20}}, 6 * M, []region{{0, M}, {5 * M, 6 * M}}},
		{"gap below a block", []region{{0, 4096}, {M + 4096, 2 * M}}, 2 * M, []region{{0, 2 * M}}},
		{"data far out", []region{{1 << 40, 1<<40 + 4096}}, 1<<40 + 4096, []region{{1 << 40, 1<<40 + 4096}}},
	} {
		got := cutHoles(c.data, c.size)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestDataRegions: a sparse spool's regions come from its filesystem's
// holes, without reading them.
func TestDataRegions(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const tib = 1 << 40
	if _, err := f.WriteAt([]byte("x"), tib/2); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(tib); err != nil {
		t.Fatal(err)
	}
	got, err := dataRegions(f, tib)
	if err != nil {
		t.Fatal(err)
	}
	if want := []region{{tib / 2, tib/2 + MinHole}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("regions %v, want %v", got, want)
	}
}
