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

// TestKeptAppendBesideReader: a writer keeps an O_APPEND descriptor while a
// reader has the file open, fsyncing between lines. The writer changes a
// version of its own (a fork), which the name shows; each line lands after
// the last. The kernel keeps one size for the inode the descriptor and the
// reader share, the old version's once the reader stats it: the next
// append, sent at that offset, overwrote the line fsync had committed.
func TestKeptAppendBesideReader(t *testing.T) {
	m := newMount(t)
	p := m.path("app.log")
	mustWrite(t, p, []byte("base\n"))
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // before the unmount, should a check fail
	want := "base\n"
	for _, line := range []string{"one\n", "two\n", "three\n"} {
		if _, err := w.WriteString(line); err != nil {
			t.Fatal(err)
		}
		want += line
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		// The reader's stat (GETATTR of the inode it shares with the
		// writer's descriptor) and read see the version it opened.
		if st, err := r.Stat(); err != nil || st.Size() != 5 {
			t.Fatalf("after %q: the reader's stat says %v (%v), want the 5 bytes it opened", line, st.Size(), err)
		}
		buf := make([]byte, 64)
		if k, _ := r.ReadAt(buf, 0); string(buf[:k]) != "base\n" {
			t.Fatalf("after %q: the reader reads %q, want the version it opened", line, buf[:k])
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Fatalf("after %q: the file reads %q (%v), want %q", line, got, err, want)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	m.remount()
	if got, err := os.ReadFile(p); err != nil || string(got) != want {
		t.Fatalf("after a remount: %q (%v), want %q", got, err, want)
	}
}

// TestAppendIntoAFork: an O_APPEND writer beside a writer that truncated the
// file while a reader holds it (which gave the writers a version of their
// own) appends at the end of that version, whatever size the kernel keeps
// for the inode the reader shares (the old version's, 10 bytes, would put
// "+x" inside "new" and leave a hole).
func TestAppendIntoAFork(t *testing.T) {
	m, p, r, w1 := forkingWriter(t)
	if _, err := w1.WriteString("new"); err != nil {
		t.Fatal(err)
	}
	w2, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if _, err := r.Stat(); err != nil { // GETATTR of the shared inode: the old version's size
		t.Fatal(err)
	}
	if _, err := w2.WriteString("+x"); err != nil {
		t.Fatal(err)
	}
	w2.Close()
	w1.Close()
	buf := make([]byte, 16)
	if k, _ := r.ReadAt(buf, 0); string(buf[:k]) != "0123456789" {
		t.Errorf("the reader reads %q, want the old version", buf[:k])
	}
	r.Close()
	m.remount()
	if got, err := os.ReadFile(p); err != nil || string(got) != "new+x" {
		t.Errorf("after a remount: %q (%v), want \"new+x\"", got, err)
	}
}

// TestForkSizeSeenAtItsName: a writer that truncated a file a reader holds
// writes to a version of its own, which takes the name at its first commit
// (fsync). Its later writes still come through the old inode; a stat of the
// name must see them (the new inode's attributes, cached for a day, kept the
// size of that commit).
func TestForkSizeSeenAtItsName(t *testing.T) {
	_, p, _, w := forkingWriter(t)
	var want int64
	for i, chunk := range []string{"aaa", "bbbb", "cc"} {
		if _, err := w.WriteString(chunk); err != nil {
			t.Fatal(err)
		}
		want += int64(len(chunk))
		if i == 0 {
			if err := w.Sync(); err != nil { // the fork takes the name
				t.Fatal(err)
			}
		}
		if st, err := os.Stat(p); err != nil || st.Size() != want {
			t.Fatalf("after %q: stat of the name says %d bytes (%v), want %d", chunk, st.Size(), err, want)
		}
	}
}

// forkingWriter mounts a store holding f ("0123456789"), opens it for
// reading, and opens it with O_TRUNC for writing: the writer's first write
// forks the file (a version of its own, which the reader does not see).
// Both descriptors are closed before the unmount.
func forkingWriter(t *testing.T) (m *testMount, p string, r, w *os.File) {
	t.Helper()
	m = newMount(t)
	p = m.path("f")
	mustWrite(t, p, []byte("0123456789"))
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if w, err = os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return m, p, r, w
}
