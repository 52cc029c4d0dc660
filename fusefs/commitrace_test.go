package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// committedSize returns the size of the manifest the catalog holds for the
// file at p.
func (m *testMount) committedSize(p string) int64 {
	m.t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		m.t.Fatal(err)
	}
	var size int64 = -1
	err := m.cas.View(func(tx *cas.Tx) error {
		mf, ok, err := tx.Manifest(st.Ino)
		if ok {
			size = mf.Size()
		}
		return err
	})
	if err != nil {
		m.t.Fatal(err)
	}
	return size
}

// TestReleaseDoesNotCommitALaterWriter: the kernel sends RELEASE after
// close(2) has returned, so a writer may open the file, truncate it and
// write half of its new version between the RELEASE's look at the writers
// ("am I the last one?") and its commit. That commit must not happen: it
// would make the half-written version the committed one (and when it
// failed, say at a power cut, it dropped the new writer's content, and the
// writer's fsync, finding nothing left to commit, reported success: the
// power-loss suite's lost fsync). The hook holds the RELEASE in that window.
func TestReleaseDoesNotCommitALaterWriter(t *testing.T) {
	var armed atomic.Bool
	entered, proceed, released := make(chan struct{}), make(chan struct{}), make(chan struct{})
	hook := func(f *FS) {
		f.releaseHook = func(name string) func() {
			if name != "f" || !armed.CompareAndSwap(true, false) {
				return nil
			}
			close(entered)
			<-proceed
			return func() { close(released) }
		}
	}
	m := newMount(t, hook)
	p := m.path("f")
	v1, v2 := randBytes(1, 3<<20), randBytes(2, 5<<20)

	armed.Store(true)
	mustWrite(t, p, v1) // its close commits v1; its RELEASE waits in the hook
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	wait(entered, "the RELEASE of the first writer")

	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(v2[:len(v2)/2]); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	wait(released, "the RELEASE to finish")
	if got := m.committedSize(p); got != int64(len(v1)) {
		t.Fatalf("after the first writer's RELEASE the catalog holds %d bytes, want the %d of its version: "+
			"it committed the second writer's half-written content", got, len(v1))
	}

	if _, err := w.Write(v2[len(v2)/2:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	m.remount()
	mustEqualFile(t, p, v2)
}

// syncFailer is an object backend whose Sync fails while fail is set.
type syncFailer struct {
	backend.Backend
	fail atomic.Bool
}

var errInjected = errors.New("injected sync failure")

func (s *syncFailer) Sync(ctx context.Context, hs []backend.Handle) error {
	if s.fail.Load() {
		return errInjected
	}
	return s.Backend.Sync(ctx, hs)
}

// TestCommitReportsAnotherRequestsFailure: when a commit fails after the
// staged bytes are gone (a stream's chunks: the file reverts to its
// committed version), the writers whose content it dropped must hear of it
// even when another request ran the failed commit: their fsync or close
// finds nothing left to commit, and must not report success for bytes that
// are not stored. Here a second descriptor of the writing process closes
// first (its FLUSH commits the file's staged content) while the store's
// syncs fail.
func TestCommitReportsAnotherRequestsFailure(t *testing.T) {
	cases := []struct {
		name  string
		check func(w *os.File) error // what the writer does after the failed commit
	}{
		{"fsync", func(w *os.File) error { return w.Sync() }},
		{"close", func(w *os.File) error { return w.Close() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storeDir := filepath.Join(t.TempDir(), "store")
			objects := &syncFailer{Backend: local.New(filepath.Join(storeDir, "objects"), local.Options{})}
			m := &testMount{t: t, store: storeDir, dir: t.TempDir()}
			m.cas0.Objects = objects
			m.mount()
			t.Cleanup(m.unmount)
			p := m.path("f")
			v0, v1 := randBytes(10, 1<<20), randBytes(11, 3<<20)
			mustWrite(t, p, v0)

			other, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if _, err := w.Write(v1); err != nil {
				t.Fatal(err)
			}
			objects.fail.Store(true)
			if err := other.Close(); err == nil {
				t.Fatal("the close whose commit failed reported success")
			}
			objects.fail.Store(false)
			if err := c.check(w); err == nil {
				t.Fatalf("%s of the writer reported success after its content was dropped by a failed commit", c.name)
			}
			w.Close()
			m.remount()
			mustEqualFile(t, p, v0)
		})
	}
}

// fileNodeAt returns the node of the file at name in the mount's root, which
// the kernel must hold (an open descriptor pins it).
func (m *testMount) fileNodeAt(name string) *fileNode {
	m.t.Helper()
	ch := m.fsys.root.EmbeddedInode().GetChild(name)
	if ch == nil {
		m.t.Fatalf("%s is not in the inode tree", name)
	}
	n, ok := ch.Operations().(*fileNode)
	if !ok {
		m.t.Fatalf("%s is a %T", name, ch.Operations())
	}
	return n
}

// TestLastTwoReleasesCommit: the RELEASEs of the last two writers of a file
// arrive at the same moment, after both FLUSHes, with content written since
// (a shared mapping's writeback comes after close). Each looked at the writer
// count before the other had left it and skipped the commit as not the last
// one, so the content waited for unmount. The hook holds each RELEASE after
// its look until the other has looked too (or a second has passed: the fix
// lets the second look only once the first has left).
func TestLastTwoReleasesCommit(t *testing.T) {
	var armed atomic.Bool
	var looked atomic.Int32
	both := make(chan struct{})
	hook := func(f *FS) {
		f.releaseLookHook = func(name string, last bool) {
			if name != "f" || !armed.Load() {
				return
			}
			if looked.Add(1) == 2 {
				close(both)
			}
			select {
			case <-both:
			case <-time.After(time.Second):
			}
		}
	}
	m := newMount(t, hook)
	p := m.path("f")
	v1, v2 := randBytes(21, 1<<20), randBytes(22, 2<<20)
	mustWrite(t, p, v1)
	keep, err := os.Open(p) // keeps the node in the kernel's tree
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	n := m.fileNodeAt("f")

	// Two write handles of the daemon's own making, as the kernel's would
	// be; the write comes from no process (pid 0, as writeback), so
	// neither FLUSH would have committed it.
	ctx := context.Background()
	h1, _, err := n.openHandle(ctx, uint32(os.O_WRONLY))
	if err != nil {
		t.Fatal(err)
	}
	h2, _, err := n.openHandle(ctx, uint32(os.O_WRONLY))
	if err != nil {
		t.Fatal(err)
	}
	if _, errno := h1.Write(ctx, v2, 0); errno != 0 {
		t.Fatal(errno)
	}
	armed.Store(true)
	done := make(chan struct{}, 2)
	for _, h := range []*handle{h1, h2} {
		go func() {
			h.Release(ctx)
			done <- struct{}{}
		}()
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the RELEASEs did not finish")
		}
	}
	if got := m.committedSize(p); got != int64(len(v2)) {
		t.Fatalf("after both RELEASEs the catalog holds %d bytes, want the %d written before them: neither committed", got, len(v2))
	}
	keep.Close()
	m.remount()
	mustEqualFile(t, p, v2)
}

// TestChmodDuringForkCommit: a file open for reading is rewritten (the writer
// gets a fork, which takes the file's name at its commit, with the origin's
// mode and owner). A chmod of the file that arrives while the fork commits
// must not be lost: the fork read the mode before its catalog write, and the
// chmod, finding its node replaced, wrote nothing.
func TestChmodDuringForkCommit(t *testing.T) {
	var armed atomic.Bool
	inCommit, chmodding := make(chan struct{}), make(chan struct{})
	hook := func(f *FS) {
		f.commitHook = func() {
			if !armed.CompareAndSwap(true, false) {
				return
			}
			close(inCommit)
			select {
			case <-chmodding:
				time.Sleep(50 * time.Millisecond) // let it reach the catalog write, if it does not wait
			case <-time.After(5 * time.Second):
			}
		}
		f.setattrHook = func() {
			select {
			case <-inCommit:
				select {
				case <-chmodding:
				default:
					close(chmodding)
				}
			default:
			}
		}
	}
	m := newMount(t, hook)
	p := m.path("f")
	v1, v2 := randBytes(31, 1<<20), randBytes(32, 2<<20)
	mustWrite(t, p, v1)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(p) // a reader: the rewrite gets a fork
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(v2); err != nil {
		t.Fatal(err)
	}
	n := m.fileNodeAt("f")
	n.mu.RLock()
	fork := n.fork
	n.mu.RUnlock()
	if fork == nil {
		t.Fatal("the rewrite of a file open for reading made no fork: the test tests nothing")
	}
	armed.Store(true)
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	select {
	case <-inCommit:
	case <-time.After(10 * time.Second):
		t.Fatal("the fork's commit did not start")
	}
	if err := r.Chmod(0o600); err != nil { // the old version, by its descriptor
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 || st.Size() != int64(len(v2)) {
			t.Fatalf("%s: %v, %d bytes; want -rw------- and the %d bytes of the new version", when, st.Mode(), st.Size(), len(v2))
		}
	}
	check("in the mount")
	r.Close()
	m.remount()
	check("after a remount")
	mustEqualFile(t, p, v2)
}

// TestFailedSpillOnReadKeepsCommittedVersion: reading a file that is being
// written in order turns its stream into a spool first; when that fails (here
// the spool directory is gone), the streamed bytes are gone with the stream.
// The file must not stay changed with nothing staged: its next commit would
// replace the committed version with an empty one. The writer's close reports
// the loss, and the committed version survives.
func TestFailedSpillOnReadKeepsCommittedVersion(t *testing.T) {
	m := mountStore(t, filepath.Join(t.TempDir(), "store"))
	p := m.path("f")
	v1, v2 := randBytes(41, 3<<20), randBytes(42, 2<<20)
	mustWrite(t, p, v1)
	w, err := os.OpenFile(p, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(v2); err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(m.store, "spool")
	if err := os.Rename(spool, spool+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("a read of the streamed file succeeded with no spool to move it to: the test tests nothing")
	}
	if err := os.Rename(spool+".away", spool); err != nil {
		t.Fatal(err)
	}
	// An unmount now (its final commit while the writer's RELEASE may still
	// be on its way) finds nothing to commit: not a failure of the unmount,
	// and the committed version stays.
	if err := m.fsys.CommitAll(context.Background()); err != nil {
		t.Fatalf("the final commit reported the loss the writer is told of: %v", err)
	}
	if got := m.committedSize(p); got != int64(len(v1)) {
		t.Fatalf("the catalog holds %d bytes, want the committed version's %d", got, len(v1))
	}
	n := m.fileNodeAt("f")
	if err := w.Close(); err == nil {
		t.Fatal("close reported success for bytes a failed spill dropped")
	}
	// The RELEASE that follows the close (the writer gone, the loss told)
	// comes on its own; the unmount's final commit would report the loss
	// again if it came first.
	waitFor(t, 10*time.Second, 10*time.Millisecond, func() bool {
		n.mu.RLock()
		defer n.mu.RUnlock()
		return n.writers == 0
	}, func() string { return "the writer's RELEASE did not come" })
	m.remount()
	mustEqualFile(t, p, v1)
}

// TestGroupCommitManyWriters: files closed by many writers at once (their
// commits share transactions) are all committed with their own content,
// under their own names, and survive a remount; a commit waits for its own
// transaction, so each close returns with its file in the catalog.
func TestGroupCommitManyWriters(t *testing.T) {
	m := newMount(t)
	const writers, files = 8, 40
	for w := range writers {
		if err := os.Mkdir(m.path(fmt.Sprintf("w%d", w)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	content := func(w, i int) []byte { return []byte(fmt.Sprintf("writer %d file %d\n", w, i)) }
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range files {
				p := m.path(fmt.Sprintf("w%d/f%d", w, i))
				if err := os.WriteFile(p, content(w, i), 0o644); err != nil {
					errs <- err
					return
				}
				var st syscall.Stat_t
				if err := syscall.Stat(p, &st); err != nil {
					errs <- err
					return
				}
				if err := m.cas.View(func(tx *cas.Tx) error {
					mf, ok, err := tx.Manifest(st.Ino)
					if err == nil && (!ok || mf.Size() != int64(len(content(w, i)))) {
						err = fmt.Errorf("%s: not committed when its close returned", p)
					}
					return err
				}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := m.cas.View(func(tx *cas.Tx) error {
		gen, _ := tx.Uploads().Gens()
		t.Logf("%d files committed in %d transactions (all of the mount's)", writers*files, gen)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m.remount()
	for w := range writers {
		for i := range files {
			mustEqualFile(t, m.path(fmt.Sprintf("w%d/f%d", w, i)), content(w, i))
		}
	}
}

// TestCreateDuringCommitFlush: while a group commit's transaction is made
// durable (its leader has released nsMu), a create goes on; an unlink
// issued meanwhile lands after the group; every close, create and unlink
// holds after a remount.
func TestCreateDuringCommitFlush(t *testing.T) {
	var armed atomic.Bool
	inFlush, release := make(chan struct{}), make(chan struct{})
	hook := func(f *FS) {
		f.flushHook = func() {
			if !armed.CompareAndSwap(true, false) {
				return
			}
			close(inFlush)
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
	}
	m := newMount(t, hook)
	mustWrite(t, m.path("old"), []byte("old")) // also reserves the inode numbers the create takes
	armed.Store(true)
	closed := make(chan error, 1)
	go func() { closed <- os.WriteFile(m.path("a"), []byte("a"), 0o644) }()
	select {
	case <-inFlush:
	case <-time.After(5 * time.Second):
		t.Fatal("the close of a reached no flush")
	}
	created := make(chan *os.File, 1)
	createErr := make(chan error, 1)
	go func() {
		f, err := os.Create(m.path("b"))
		if err != nil {
			createErr <- err
			return
		}
		created <- f
	}()
	var b *os.File
	select {
	case b = <-created:
	case err := <-createErr:
		close(release)
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a create waited for another file's commit to be made durable")
	}
	// An unlink meanwhile waits (lockNS, and bbolt's writer lock: the
	// group's transaction is open), and lands after the group.
	unlinked := make(chan error, 1)
	go func() { unlinked <- os.Remove(m.path("old")) }()
	close(release)
	for _, c := range []chan error{closed, unlinked} {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a close or an unlink did not end once the flush did")
		}
	}
	if _, err := b.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	m.remount()
	mustEqualFile(t, m.path("a"), []byte("a"))
	mustEqualFile(t, m.path("b"), []byte("b"))
	if _, err := os.Stat(m.path("old")); !os.IsNotExist(err) {
		t.Fatalf("unlinked file after a remount: %v", err)
	}
}
