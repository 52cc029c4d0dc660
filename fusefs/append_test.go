package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs/stage"
)

// TestAppendKeepsCommittedChunks: opening a committed log for append and
// adding a line (TensorBoard's event files, metrics CSVs: each flush reopens
// the file) streams from the file's last chunk instead of copying the whole
// file into a spool and cutting it again: the commit keeps every chunk but
// the last, and the chunks are those a commit of the whole content cuts. A
// write into the old bytes still goes through a spool.
func TestAppendKeepsCommittedChunks(t *testing.T) {
	m := newMount(t)
	const name = "metrics.csv"
	want := append([]byte("step,loss\n"), randBytes(31, 6<<20)...)
	if err := os.WriteFile(m.path(name), want, 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := func() *cas.Manifest {
		var st syscall.Stat_t
		if err := syscall.Stat(m.path(name), &st); err != nil {
			t.Fatal(err)
		}
		var mf *cas.Manifest
		if err := m.cas.View(func(tx *cas.Tx) error {
			var err error
			mf, _, err = tx.Manifest(st.Ino)
			return err
		}); err != nil || mf == nil {
			t.Fatalf("manifest of %s: %v", name, err)
		}
		return mf
	}
	before := manifest()
	for i := range 5 {
		f, err := os.OpenFile(m.path(name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Appendf(nil, "%d,%d\n", i, 1000-i)
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
		want = append(want, line...)
		n := m.fileNodeAt(name)
		n.mu.RLock()
		streaming := n.staging != nil && n.staging.Streaming()
		n.mu.RUnlock()
		if !streaming {
			t.Errorf("append %d: staged in a spool, want a stream from the last chunk", i)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		after := manifest()
		if k := len(before.Chunks) - 1; !reflect.DeepEqual(after.Chunks[:k], before.Chunks[:k]) {
			t.Fatalf("append %d changed the chunks before the last", i)
		}
		before = after
	}
	whole, _, err := stage.IndexFile(context.Background(), bytes.NewReader(want), int64(len(want)), m.cas.ChunkSize())
	if err != nil {
		t.Fatal(err)
	}
	if got := manifest(); !reflect.DeepEqual(got.Chunks, whole) {
		t.Errorf("committed %d chunks, a commit of the whole content cuts %d (or others)", len(got.Chunks), len(whole))
	}

	// A write into the old bytes: a spool, as before.
	f, err := os.OpenFile(m.path(name), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("STEP"), 0); err != nil {
		t.Fatal(err)
	}
	copy(want, "STEP")
	n := m.fileNodeAt(name)
	n.mu.RLock()
	streaming := n.staging != nil && n.staging.Streaming()
	n.mu.RUnlock()
	if streaming {
		t.Error("a write into the committed bytes is streaming")
	}
	f.Close()
	for _, when := range []string{"mounted", "remounted"} {
		if got, err := os.ReadFile(m.path(name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: read back %d bytes (%v), want the %d written", when, len(got), err, len(want))
		}
		m.remount()
	}
}
