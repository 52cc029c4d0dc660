package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"golang.org/x/sys/unix"
)

// unnamedObjects counts the store's objects that no catalog row names: chunk
// objects without an index row, and packs that no row names.
func (m *testMount) unnamedObjects() (chunks, packs int) {
	m.t.Helper()
	ctx := context.Background()
	var ids []cas.ID
	if err := m.cas.WalkObjects(ctx, func(o cas.ObjectInfo) error {
		ids = append(ids, o.ID)
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
	if err := m.cas.View(func(tx *cas.Tx) error {
		for _, id := range ids {
			if _, ok, err := tx.Chunk(id); err != nil {
				return err
			} else if !ok {
				chunks++
			}
		}
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
	pc, err := m.cas.OrphanPacks(ctx, nil)
	if err != nil {
		m.t.Fatal(err)
	}
	return chunks, len(pc.Orphans)
}

// TestUnlinkedWhileOpenLeavesNothing: a file that loses its last name while
// open (tempfile.TemporaryFile, O_TMPFILE, unlink then close) has no name to
// commit: its content lives in the daemon for its handles and goes with the
// last of them, as a local filesystem frees it at the last close. Its
// chunks used to be stored and kept with no row naming them, for the grace
// period (24 h), and fsck called them a crash's.
func TestUnlinkedWhileOpenLeavesNothing(t *testing.T) {
	m := newMount(t)
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"write, unlink, close", func(t *testing.T) {
			f, err := os.Create(m.path("a.tmp"))
			if err != nil {
				t.Fatal(err)
			}
			f.Write(randBytes(41, 3<<20))
			os.Remove(m.path("a.tmp"))
			f.Write(randBytes(42, 1<<20))
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"fsync after unlink", func(t *testing.T) {
			f, err := os.Create(m.path("b.tmp"))
			if err != nil {
				t.Fatal(err)
			}
			f.Write(randBytes(43, 2<<20))
			os.Remove(m.path("b.tmp"))
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			if _, err := f.ReadAt(buf, 1<<20); err != nil {
				t.Fatal(err)
			}
			if want := randBytes(43, 2<<20)[1<<20 : 1<<20+4096]; string(buf) != string(want) {
				t.Fatal("an unlinked file read back other bytes than written")
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"create, unlink, close unwritten", func(t *testing.T) {
			f, err := os.Create(m.path("c.tmp"))
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(m.path("c.tmp"))
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"a fork of a file unlinked while a reader has it", func(t *testing.T) {
			for _, flags := range []int{os.O_TRUNC, os.O_APPEND} {
				mustWrite(t, m.path("d"), []byte("old"))
				r, err := os.Open(m.path("d"))
				if err != nil {
					t.Fatal(err)
				}
				w, err := os.OpenFile(m.path("d"), os.O_WRONLY|flags, 0)
				if err != nil {
					t.Fatal(err)
				}
				w.Write(randBytes(45, 3<<20)) // a fork: the reader keeps the old bytes
				os.Remove(m.path("d"))
				if err := w.Sync(); err != nil {
					t.Fatal(err)
				}
				w.Write(randBytes(46, 1<<20))
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 8)
				if n, _ := r.ReadAt(buf, 0); string(buf[:n]) != "old" {
					t.Errorf("flags %#x: the reader of the unlinked file reads %q", flags, buf[:n])
				}
				r.Close()
			}
		}},
		{"O_TMPFILE", func(t *testing.T) {
			fd, err := unix.Open(m.dir, unix.O_TMPFILE|unix.O_RDWR, 0o600)
			if err == syscall.EOPNOTSUPP || err == syscall.EISDIR {
				t.Fatalf("O_TMPFILE: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), "tmpfile")
			f.Write(randBytes(44, 3<<20))
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t)
			// RELEASE comes after close returns: wait for the handles to go.
			open := func() int {
				m.fsys.openMu.Lock()
				defer m.fsys.openMu.Unlock()
				return len(m.fsys.openFiles)
			}
			waitFor(t, 10*time.Second, 10*time.Millisecond, func() bool { return open() == 0 }, func() string {
				return fmt.Sprintf("%d files still open in the daemon after their close", open())
			})
			// Nothing of them is held: no pinned node, no stream memory.
			m.fsys.pins.mu.Lock()
			for ino, n := range m.fsys.pins.files {
				if n.unlinked.Load() {
					t.Errorf("file %d, unlinked and closed, is still pinned", ino)
				}
			}
			m.fsys.pins.mu.Unlock()
			if mem := m.fsys.stage.StreamMemory(); mem != 0 {
				t.Errorf("%d bytes of stream memory held after every file was closed", mem)
			}
			// Counted after a remount too: while mounted, a pack some batch
			// keeps registered is no orphan.
			for _, when := range []string{"mounted", "remounted"} {
				if chunks, packs := m.unnamedObjects(); chunks != 0 || packs != 0 {
					t.Errorf("%s: %d chunk objects and %d packs that no row names are left", when, chunks, packs)
				}
				m.remount()
			}
		})
	}
}

// TestUnlinkDuringCommitLeavesNothing: an unlink that lands while the
// close's commit runs (after it looked for a name) stores the file's
// chunks for its open handles' sake, kept with no row naming them; they
// are given back with the last handle (a probe that unlinked 0-4 ms into
// close() kept 36 of 40 such files, 47.5 MiB, until an offline gc after
// the grace period).
func TestUnlinkDuringCommitLeavesNothing(t *testing.T) {
	var armed atomic.Bool
	hook := func(f *FS) {
		f.commitHook = func() {
			if armed.CompareAndSwap(true, false) {
				if errno := f.root.Unlink(context.Background(), "x"); errno != 0 {
					t.Errorf("unlink during the commit: %v", errno)
				}
			}
		}
	}
	m := newMount(t, hook)
	for _, reader := range []bool{false, true} {
		f, err := os.Create(m.path("x"))
		if err != nil {
			t.Fatal(err)
		}
		data := randBytes(47, 3<<20)
		f.Write(data)
		var r *os.File
		if reader {
			if r, err = os.Open(m.path("x")); err != nil {
				t.Fatal(err)
			}
		}
		armed.Store(true)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if r != nil {
			got := make([]byte, len(data))
			if k, err := r.ReadAt(got, 0); k != len(data) || !bytes.Equal(got, data) {
				t.Errorf("the reader of the file unlinked during its commit reads %d bytes (%v)", k, err)
			}
			r.Close()
		}
		waitFor(t, 10*time.Second, 10*time.Millisecond, func() bool {
			m.fsys.openMu.Lock()
			defer m.fsys.openMu.Unlock()
			return len(m.fsys.openFiles) == 0
		}, func() string { return "files still open in the daemon after their close" })
		m.remount()
		if chunks, packs := m.unnamedObjects(); chunks != 0 || packs != 0 {
			t.Errorf("reader %v: %d chunk objects and %d packs that no row names are left", reader, chunks, packs)
		}
	}
}

// TestUnlinkedForkKeepsItsOwnHandles: a fork that took the name and was
// opened there has handles of its own; when the name is removed and its
// origin's last writer closes, those handles keep what they wrote (the
// origin's Release dropped the fork's staged content under them).
func TestUnlinkedForkKeepsItsOwnHandles(t *testing.T) {
	_, p, _, w1 := forkingWriter(t)
	w1.WriteString("AAA")
	if err := w1.Sync(); err != nil { // the fork takes the name
		t.Fatal(err)
	}
	w2, err := os.OpenFile(p, os.O_RDWR, 0) // the fork's own handle
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if _, err := w2.WriteAt([]byte("BBBBBB"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	w1.Close()
	buf := make([]byte, 16)
	if k, err := w2.ReadAt(buf, 0); string(buf[:k]) != "BBBBBB" {
		t.Errorf("w2 reads back %q (%v) from its unlinked file, want BBBBBB", buf[:k], err)
	}
}
