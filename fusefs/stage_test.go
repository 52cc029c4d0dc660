package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/fusefs/stage"
)

// TestWriteMemoryBudget: streams take their window from the write memory
// budget; files started while it is spent are spooled, and all commit
// byte-exact. (32 parallel writers each held a 32 MiB stream: 1.1 GB.)
func TestWriteMemoryBudget(t *testing.T) {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		opts: []Option{WithWriteMemory(1)}} // room for the first stream only
	m.mount()
	t.Cleanup(m.unmount)
	window := stage.StreamWindow(m.cas.ChunkSize())
	used := m.fsys.stage.StreamMemory
	const n, size = 4, 6 << 20
	var files []*os.File
	var want [][]byte
	for i := range n {
		f, err := os.Create(m.path(fmt.Sprintf("runs/f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		want = append(want, randBytes(uint64(100+i), size))
	}
	for off := 0; off < size; off += 1 << 20 {
		for i, f := range files {
			if _, err := f.Write(want[i][off : off+1<<20]); err != nil {
				t.Fatal(err)
			}
		}
		if u := used(); u != window {
			t.Fatalf("%d writers hold %d bytes of stream windows, want one window (%d)", n, u, window)
		}
	}
	for _, f := range files {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if u := used(); u != 0 {
		t.Fatalf("%d bytes of stream windows still reserved after the commits", u)
	}
	m.remount()
	for i := range n {
		mustEqualFile(t, m.path(fmt.Sprintf("runs/f%d", i)), want[i])
	}
}
