package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/fusefs/stage"
)

// TestWriteMemoryBudget: streams take their window from the write memory
// budget (a block, then the whole window when the file outgrows it); files
// started while it is spent are spooled, and all commit byte-exact. (32
// parallel writers each held a 32 MiB stream: 1.1 GB.)
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
		// The first file's stream: one block at first, its whole window once
		// it outgrows that (the budget's first stream gets it whatever the
		// budget); the others are spooled.
		want := min(window, stage.StreamBlock)
		if off+1<<20 > int(stage.StreamBlock) {
			want = window
		}
		if u := used(); u != want {
			t.Fatalf("%d writers hold %d bytes of stream windows after %d MiB each, want one stream's (%d)", n, u, off>>20+1, want)
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

// TestStreamsGrowOnDemand: many small files written at once all stream (a
// block of the budget each, no spool file), and a file that outgrows its
// block when the budget has no room for its window spills to a spool and
// still commits byte-exact, as does the one that grows.
func TestStreamsGrowOnDemand(t *testing.T) {
	block := stage.StreamBlock
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		opts: []Option{WithWriteMemory(14 * block)}}
	m.mount()
	t.Cleanup(m.unmount)
	used := m.fsys.stage.StreamMemory
	const small = 10
	var files []*os.File
	for i := range small {
		f, err := os.Create(m.path(fmt.Sprintf("runs/small%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() }) // before the unmount, should the test fail
		if _, err := f.Write(randBytes(uint64(i), 4096)); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if u := used(); u != small*block {
		t.Fatalf("%d small files being written hold %d bytes of the budget, want a block each (%d): some were spooled", small, u, small*block)
	}
	// Two files outgrow their block: the budget (14 blocks, 12 held) has
	// room for neither window, nor, once the first spilled, for the
	// second's: both spill.
	big := [][]byte{randBytes(1000, int(3*block)), randBytes(1001, int(3*block))}
	var bigFiles []*os.File
	for i := range big {
		f, err := os.Create(m.path(fmt.Sprintf("runs/big%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		bigFiles = append(bigFiles, f)
	}
	for off := 0; off < int(3*block); off += 1 << 20 {
		for i, f := range bigFiles {
			if _, err := f.Write(big[i][off : off+1<<20]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if u := used(); u != small*block {
		t.Fatalf("after two files outgrew their blocks with no room for a window, %d bytes are held, want the small files' %d", u, small*block)
	}
	for _, f := range append(files, bigFiles...) {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if u := used(); u != 0 {
		t.Fatalf("%d bytes of the budget still held after the commits", u)
	}
	m.remount()
	for i := range small {
		mustEqualFile(t, m.path(fmt.Sprintf("runs/small%d", i)), randBytes(uint64(i), 4096))
	}
	for i := range big {
		mustEqualFile(t, m.path(fmt.Sprintf("runs/big%d", i)), big[i])
	}
}
