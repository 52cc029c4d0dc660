package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/test/s3test"
)

// The reproductions of ../shared/notes/remote-faults.md, one test each
// (issue #24). The invariant they check: a file whose ckptfs sync returned
// 0, and that no later commit changed or removed, reads back byte-exact
// from a fresh reading mount; nothing reads back wrong bytes.

// leaseEnv makes writer leases short enough for a test (cmd/ckptfs).
const leaseEnv = "CKPTFS_REMOTE_LEASE"

// faultEnv is a test's bucket prefix and a directory maker.
type faultEnv struct {
	t   *testing.T
	srv *s3test.Server
	url string
	tmp string
}

func newFaultEnv(t *testing.T, prefix string) *faultEnv {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	return &faultEnv{t: t, srv: srv, url: srv.URL(prefix), tmp: t.TempDir()}
}

func (e *faultEnv) dir(name string) string {
	p := filepath.Join(e.tmp, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// writer and reader mount store name at mount point name+"-mnt".
func (e *faultEnv) writer(name string, extra ...string) (*daemon, string) {
	mnt := e.dir(name + "-mnt")
	return startDaemon(e.t, e.dir(name), mnt, append([]string{remoteFlag, e.url}, extra...)...), mnt
}

func (e *faultEnv) reader(name string) (*daemon, string) {
	return e.writer(name, readOnlyFlag)
}

func (e *faultEnv) sync(mnt string) {
	e.t.Helper()
	if code, msg := syncMount(e.t, mnt, time.Minute); code != 0 {
		e.t.Fatalf("ckptfs sync %s: exit %d: %s", mnt, code, msg)
	}
}

func put(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// expect checks what a fresh reading mount shows: want's files byte-exact,
// gone's absent.
func (e *faultEnv) expect(name string, want map[string][]byte, gone ...string) {
	e.t.Helper()
	d, mnt := e.reader(name)
	defer d.kill()
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(mnt, p))
		if err != nil || !bytes.Equal(got, b) {
			e.t.Errorf("fresh reader %s: %s: %v (%d bytes, want %d, equal %v)", name, p, err, len(got), len(b), bytes.Equal(got, b))
		}
	}
	for _, p := range gone {
		if _, err := os.Lstat(filepath.Join(mnt, p)); !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("fresh reader %s: %s is there (%v), want it gone", name, p, err)
		}
	}
}

// gcGrace0 runs ckptfs gc --grace 0 on mnt after the server's 1 s mtimes.
func gcGrace0(t *testing.T, mnt string) (int, string) {
	time.Sleep(1100 * time.Millisecond)
	code, out, errOut := ckptfs(t, "gc", "--grace", "0", mnt)
	return code, out + errOut
}

// Reproduction 1: writer A paused (SIGSTOP) past its lease while B
// writes to the prefix; A, resumed, publishes nothing as its old session
// (B's round fenced it, or A's own lapsed lease did): its first sync fails
// naming why, it rejoins as a new session and its next sync publishes what
// it wrote, and nothing B synced is lost or hidden. gc beside the other
// live writer deletes nothing B or A synced (it trashes what no one names).
func TestRemoteFaultStaleWriterFenced(t *testing.T) {
	e := newFaultEnv(t, "p1")
	t.Setenv(leaseEnv, "2s")
	a, mA := e.writer("A")
	a1, a2, b1, b2 := randBytes(101, 3<<20), randBytes(102, 1<<20), randBytes(103, 3<<20), randBytes(104, 1<<20)
	put(t, filepath.Join(mA, "a1.st"), a1)
	e.sync(mA)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b, mB := e.writer("B")
	put(t, filepath.Join(mB, "b1.st"), b1)
	e.sync(mB)
	time.Sleep(3 * time.Second) // past A's lease: B's rounds fence A
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(mA, "a2.st"), a2)
	code, msg := syncMount(t, mA, time.Minute)
	if code == 0 || !strings.Contains(msg, "lost the remote") {
		t.Fatalf("sync of the writer paused past its lease: exit %d: %s; want a failure naming the lost session", code, msg)
	}
	t.Logf("A's sync: %s", strings.TrimSpace(msg))
	e.sync(mA) // the new session
	if code, out := gcGrace0(t, mA); code != 0 {
		t.Errorf("gc with another writer live: exit %d: %s", code, out)
	}
	put(t, filepath.Join(mB, "b2.st"), b2)
	e.sync(mB)
	e.expect("R", map[string][]byte{"a1.st": a1, "a2.st": a2, "b1.st": b1, "b2.st": b2})
	a.stop(syscall.SIGTERM)
	b.stop(syscall.SIGTERM)
	_, mA = e.writer("A")
	if code, out := gcGrace0(t, mA); code != 0 {
		t.Errorf("gc with no other writer: exit %d: %s", code, out)
	}
	e.expect("R2", map[string][]byte{"a1.st": a1, "a2.st": a2, "b1.st": b1, "b2.st": b2})
}

// Reproduction 2: a new store on a prefix neither hides nor collects what
// an earlier store synced there, and the earlier one, remounted, sees the
// new one's files.
func TestRemoteFaultNewStoreKeepsSyncedFiles(t *testing.T) {
	e := newFaultEnv(t, "p0")
	model, notes, x, more := randBytes(111, 4<<20), []byte("notes\n"), []byte("x\n"), []byte("more\n")
	a, mA := e.writer("A")
	if err := os.MkdirAll(filepath.Join(mA, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(mA, "run", "model.st"), model)
	put(t, filepath.Join(mA, "notes.txt"), notes)
	e.sync(mA)
	a.stop(syscall.SIGTERM)

	b, mB := e.writer("B")
	if got, err := os.ReadFile(filepath.Join(mB, "run", "model.st")); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("a new writer store does not show the synced model: %v", err)
	}
	put(t, filepath.Join(mB, "x.txt"), x)
	e.sync(mB)
	if code, out := gcGrace0(t, mB); code != 0 {
		t.Fatalf("gc: %s", out)
	}
	e.expect("R1", map[string][]byte{"run/model.st": model, "notes.txt": notes, "x.txt": x})
	b.stop(syscall.SIGTERM)

	_, mA = e.writer("A")
	put(t, filepath.Join(mA, "more.txt"), more)
	e.sync(mA)
	e.expect("R2", map[string][]byte{"run/model.st": model, "notes.txt": notes, "x.txt": x, "more.txt": more})
}

// Reproduction 3: a copy of a store is a new session: mounted beside the
// original, both write, and each one's files reach the other and readers.
func TestRemoteFaultCopiedStoreWritesToo(t *testing.T) {
	e := newFaultEnv(t, "p2")
	x, mX := e.writer("X")
	put(t, filepath.Join(mX, "f"), []byte("one\n"))
	e.sync(mX)
	x.stop(syscall.SIGTERM)
	if out, err := exec.Command("cp", "-a", filepath.Join(e.tmp, "X"), filepath.Join(e.tmp, "Y")).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	_, mX = e.writer("X")
	_, mY := e.writer("Y")
	put(t, filepath.Join(mX, "g"), []byte("two\n"))
	put(t, filepath.Join(mY, "h"), []byte("three\n"))
	e.sync(mX)
	e.sync(mY)
	waitFile(t, filepath.Join(mX, "h"))
	waitFile(t, filepath.Join(mY, "g"))
	e.expect("R", map[string][]byte{"f": []byte("one\n"), "g": []byte("two\n"), "h": []byte("three\n")})
}

// Reproduction 4: rename, unlink, rmdir, chmod, symlink and truncate reach
// the bucket, and sync returns 0 only once a fresh reader sees them.
func TestRemoteFaultNamespaceChangesReachBucket(t *testing.T) {
	e := newFaultEnv(t, "p4")
	_, mW := e.writer("W")
	in := func(p string) string { return filepath.Join(mW, p) }
	put(t, in("a"), []byte("v1\n"))
	put(t, in("g"), []byte("gone\n"))
	put(t, in("t"), []byte("truncate me\n"))
	if err := os.MkdirAll(in("d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.sync(mW)
	put(t, in("a.tmp"), []byte("v2\n"))
	e.sync(mW) // what follows is no commit: only the namespace changes
	for _, err := range []error{
		os.Rename(in("a.tmp"), in("a")),
		os.Remove(in("g")),
		os.Remove(in("d/e")),
		os.Chmod(in("t"), 0o600),
		os.Truncate(in("t"), 8),
		os.Symlink("a", in("l")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.sync(mW)
	e.expect("R", map[string][]byte{"a": []byte("v2\n"), "t": []byte("truncate")}, "a.tmp", "g", "d/e")
	d, mR := e.reader("R2")
	defer d.kill()
	if target, err := os.Readlink(filepath.Join(mR, "l")); err != nil || target != "a" {
		t.Errorf("symlink l on a fresh reader: %q %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(mR, "t")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("chmod of t on a fresh reader: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(mR, "d")); err != nil || !fi.IsDir() {
		t.Errorf("directory d on a fresh reader: %v", err)
	}
}

// Reproduction 5: a reading mount on a reused store applies overwrites,
// deletions and renames when it is mounted again.
func TestRemoteFaultReaderRemountApplies(t *testing.T) {
	e := newFaultEnv(t, "p5")
	_, mW := e.writer("W")
	in := func(p string) string { return filepath.Join(mW, p) }
	put(t, in("f.txt"), []byte("v1\n"))
	put(t, in("g.txt"), []byte("g\n"))
	put(t, in("h.txt"), []byte("h\n"))
	e.sync(mW)
	r, mR := e.reader("R")
	if got, err := os.ReadFile(filepath.Join(mR, "f.txt")); err != nil || string(got) != "v1\n" {
		t.Fatalf("reader: f.txt %q %v", got, err)
	}
	r.stop(syscall.SIGTERM)
	put(t, in("f.txt"), []byte("v2, longer\n"))
	if err := os.Remove(in("g.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(in("h.txt"), in("h2.txt")); err != nil {
		t.Fatal(err)
	}
	e.sync(mW)
	e.expect("R", map[string][]byte{"f.txt": []byte("v2, longer\n"), "h2.txt": []byte("h\n")}, "g.txt", "h.txt")
}

// Reproduction 6: a store that was a reader can become the writer: it
// uploads what the bucket lacks, and takes the bucket's namespace as it is
// (a file it imported while mounted and the writer removed stays removed).
func TestRemoteFaultReaderStoreBecomesWriter(t *testing.T) {
	e := newFaultEnv(t, "p6")
	w, mW := e.writer("W")
	f := randBytes(121, 2<<20)
	put(t, filepath.Join(mW, "f.bin"), f)
	e.sync(mW)
	// k.txt reaches the reader by a live refresh, then goes away: the
	// reader's store must not bring it back when it becomes the writer.
	r, mR := e.reader("R")
	put(t, filepath.Join(mW, "k.txt"), []byte("k\n"))
	e.sync(mW)
	waitFile(t, filepath.Join(mR, "k.txt"))
	if err := os.Remove(filepath.Join(mW, "k.txt")); err != nil {
		t.Fatal(err)
	}
	e.sync(mW)
	w.stop(syscall.SIGTERM)
	r.stop(syscall.SIGTERM)
	_, mR = e.writer("R")
	put(t, filepath.Join(mR, "new.txt"), []byte("new\n"))
	e.sync(mR)
	e.expect("R2", map[string][]byte{"f.bin": f, "new.txt": []byte("new\n")}, "k.txt")
}

// Reproduction 7: faults of the server. A killed or stalled server gives
// EIO within a bounded, configurable time; bad credentials give one line;
// a reading mount of a prefix with nothing published warns.
func TestRemoteFaultServer(t *testing.T) {
	e := newFaultEnv(t, "p7")
	_, mW := e.writer("W")
	f := randBytes(131, 2<<20)
	put(t, filepath.Join(mW, "f.bin"), f)
	put(t, filepath.Join(mW, "g.bin"), f[:1<<20])
	e.sync(mW)

	t.Setenv("CKPTFS_REMOTE_TIMEOUT", "1s")
	proxy := s3test.NewProxy(t, e.srv.Endpoint)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	_, mR := e.reader("R")
	proxy.Set(s3test.Fault{Match: s3test.IsGet, Delay: time.Hour})
	start := time.Now()
	if _, err := os.ReadFile(filepath.Join(mR, "g.bin")); !errors.Is(err, syscall.EIO) {
		t.Errorf("read through a stalled server: %v, want EIO", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("read through a stalled server took %v with CKPTFS_REMOTE_TIMEOUT=1s", d)
	}
	proxy.Clear()
	e.srv.Stop()
	if _, err := os.ReadFile(filepath.Join(mR, "f.bin")); !errors.Is(err, syscall.EIO) {
		t.Errorf("read with the server killed: %v, want EIO", err)
	}
	e.srv.Restart()
	t.Setenv("AWS_ENDPOINT_URL", e.srv.Endpoint)

	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	code, _, errOut := ckptfs(t, "mount", remoteFlag, e.url, e.dir("S"), e.dir("S-mnt"))
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code == 0 || len(lines) != 1 || !strings.Contains(errOut, "credentials") {
		t.Errorf("mount with bad credentials: exit %d, %d lines:\n%s", code, len(lines), errOut)
	}
	t.Logf("bad credentials: %s", strings.TrimSpace(errOut))
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3test.SecretKey)

	t.Setenv("CKPTFS_REMOTE_TIMEOUT", "")
	empty := e.srv.URL("nothing-here")
	mE := e.dir("E-mnt")
	d := startDaemon(t, e.dir("E"), mE, remoteFlag, empty, readOnlyFlag)
	time.Sleep(3 * time.Second) // a refresh or so: still one warning
	d.stop(syscall.SIGTERM)
	if n := strings.Count(d.stderr.String(), "nothing is published"); n != 1 {
		t.Errorf("a reading mount of an empty prefix warned %d times:\n%s", n, d.stderr)
	}
}
