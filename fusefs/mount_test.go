package fusefs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/fusefs/internal/lockorder"
	"github.com/ckptfs/ckptfs/test/testrand"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestMain doubles as a client program: tests that must not mmap the mount from
// the serving process re-run the test binary with CKPTFS_TEST_CLIENT set.
func TestMain(m *testing.M) {
	if mode := os.Getenv("CKPTFS_TEST_CLIENT"); mode != "" {
		os.Exit(runClient(mode, os.Args[len(os.Args)-1]))
	}
	code := m.Run()
	if v := lockorder.Violations(); len(v) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d lock order inversions (fusefs/internal/lockorder), the first above\n", len(v))
		code = 1
	}
	os.Exit(code)
}

// runClient implements the subprocess clients:
//
//	mmap-hold: open and mmap PATH (MAP_PRIVATE), touch the first page, print
//	           "ready", wait for a line on stdin, then print the sha256 of the
//	           whole mapping and of a read(2) through the same descriptor
//	           (with CKPTFS_TEST_DROP set, after touching the first page again
//	           and dropping the inode's unmapped cached pages).
//	lock-try:  try a write lock on PATH with F_SETLK and print the result.
//	write-hold: open PATH with O_RDWR|O_TRUNC, write CKPTFS_TEST_SEED's bytes,
//	           mmap the file, close the descriptor (FLUSH), print "ready", wait
//	           for a line on stdin, exit (the mapping's RELEASE comes now).
//	write-fsuid: open PATH, then with fsuid and fsgid CKPTFS_TEST_FSUID (on its
//	           thread: a root process that does this keeps passing FUSE's
//	           allow check, and loses CAP_FSETID) write "written" at offset 0.
//	mmap-steps: write through a shared mapping (mmap_test.go, runMmapSteps).
func runClient(mode, path string) int {
	switch mode {
	case "mmap-steps":
		return runMmapSteps(path)
	case "write-fsuid":
		// setfsuid is per thread: open and write on this one.
		// (Opened first: the test's temporary directories are root's 0700.)
		runtime.LockOSThread()
		var id int
		fmt.Sscan(os.Getenv("CKPTFS_TEST_FSUID"), &id)
		fd, err := unix.Open(path, unix.O_WRONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "open:", err)
			return 1
		}
		unix.Setfsgid(id)
		unix.Setfsuid(id)
		if _, err := unix.Pwrite(fd, []byte("written"), 0); err != nil {
			fmt.Fprintln(os.Stderr, "write:", err)
			return 1
		}
		if err := unix.Close(fd); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			return 1
		}
		return 0
	case "write-hold":
		var seed uint64
		var size int
		fmt.Sscan(os.Getenv("CKPTFS_TEST_SEED"), &seed, &size)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_TRUNC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := f.Write(randBytes(seed, size)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_PRIVATE); err != nil {
			fmt.Fprintln(os.Stderr, "mmap:", err)
			return 1
		}
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			return 1
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		return 0
	case "lock-try":
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lk := syscall.Flock_t{Type: syscall.F_WRLCK}
		switch err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err {
		case nil:
			fmt.Println("locked")
		case syscall.EAGAIN, syscall.EACCES:
			fmt.Println("EAGAIN")
		default:
			fmt.Println(err)
		}
		return 0
	case "mmap-hold":
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		st, err := f.Stat()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_PRIVATE)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mmap:", err)
			return 1
		}
		_ = mem[0]
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "stdin:", err)
			return 1
		}
		if os.Getenv("CKPTFS_TEST_DROP") != "" {
			// Touch the first page again (a writer's mmap of the file
			// may have unmapped it) and drop the inode's cached pages
			// that are not mapped: the kernel reads those back.
			_ = mem[0]
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				fmt.Fprintln(os.Stderr, "fadvise:", err)
				return 1
			}
		}
		viaRead, err := io.ReadAll(io.NewSectionReader(f, 0, st.Size()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "read:", err)
			return 1
		}
		fmt.Println(sha(mem), sha(viaRead))
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown client mode", mode)
	return 2
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// testMount is a store mounted in this process.
type testMount struct {
	t     testing.TB
	opts  []Option
	cas0  cas.Options // store options; CacheSize defaults to 64 MiB
	store string
	dir   string // mountpoint
	srv   *fuse.Server
	fsys  *FS
	cas   *cas.Store
}

// mountStore mounts the store in storeDir (created if missing) on a fresh
// mountpoint and unmounts it when the test ends.
func mountStore(t testing.TB, storeDir string) *testMount {
	t.Helper()
	m := &testMount{t: t, store: storeDir, dir: t.TempDir()}
	m.mount()
	t.Cleanup(m.unmount)
	return m
}

// newMount mounts a fresh store with the file system's options opts and
// unmounts it when the test ends.
func newMount(t testing.TB, opts ...Option) *testMount {
	t.Helper()
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(), opts: opts}
	m.mount()
	t.Cleanup(m.unmount)
	return m
}

func (m *testMount) mount() {
	m.t.Helper()
	opts := m.cas0
	if opts.CacheSize == 0 {
		opts.CacheSize = 64 << 20
	}
	if opts.Objects == nil {
		opts.Objects = local.New(cas.ObjectsDir(m.store), local.Options{})
	}
	s, err := cas.Open(m.store, opts)
	if err != nil {
		m.t.Fatal(err)
	}
	fsys, err := New(s, log.New(os.Stderr, "ckptfs: ", 0), m.opts...)
	if err != nil {
		s.Close()
		m.t.Fatal(err)
	}
	srv, err := Mount(fsys, m.dir, MountOptions{ReadAheadKB: DefaultReadAheadKB})
	if err != nil {
		fsys.Close()
		s.Close()
		m.t.Fatal(err)
	}
	m.srv, m.fsys, m.cas = srv, fsys, s
}

func (m *testMount) unmount() {
	if m.srv == nil {
		return
	}
	if err := m.srv.Unmount(); err != nil {
		m.t.Errorf("unmount: %v", err)
		syscall.Unmount(m.dir, syscall.MNT_DETACH)
	}
	served := make(chan struct{})
	go func() { m.srv.Wait(); close(served) }()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		// A descriptor of this process still points into the detached mount:
		// a test bug, reported rather than hanging the whole run.
		m.t.Errorf("the server did not stop within 10s of unmounting %s", m.dir)
		return
	}
	if err := m.fsys.CommitAll(context.Background()); err != nil {
		m.t.Errorf("commit at unmount: %v", err)
	}
	m.fsys.Close()
	if err := m.cas.Close(); err != nil {
		m.t.Errorf("close store: %v", err)
	}
	m.srv = nil
}

func (m *testMount) remount() {
	m.t.Helper()
	m.unmount()
	m.mount()
}

func (m *testMount) path(p string) string { return filepath.Join(m.dir, p) }

func (m *testMount) stats() cas.Stats {
	m.t.Helper()
	data, err := os.ReadFile(m.path(".ckptfs/stats.json"))
	if err != nil {
		m.t.Fatal(err)
	}
	var st cas.Stats
	if err := json.Unmarshal(data, &st); err != nil {
		m.t.Fatalf("stats.json: %v\n%s", err, data)
	}
	return st
}

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte { return testrand.Bytes(seed, n) }

func mustWrite(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustEqualFile(t testing.TB, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: content differs: got %d bytes (sha %s), want %d bytes (sha %s)", path, len(got), sha(got)[:12], len(want), sha(want)[:12])
	}
}

// startClient runs the test binary as a client process.
// env is added to the client's environment.
func startClient(t *testing.T, mode, path string, env ...string) (*exec.Cmd, io.WriteCloser, *bytes.Buffer, func() string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", path)
	cmd.Env = append(append(os.Environ(), "CKPTFS_TEST_CLIENT="+mode), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	buf := make([]byte, 4096)
	var acc []byte
	readLine := func() string {
		for !bytes.Contains(acc, []byte("\n")) {
			k, err := stdout.Read(buf)
			acc = append(acc, buf[:k]...)
			if err != nil {
				t.Fatalf("client %s: %v (stderr: %s)", mode, err, stderr.String())
			}
		}
		i := bytes.IndexByte(acc, '\n')
		line := string(acc[:i])
		acc = acc[i+1:]
		return strings.TrimSpace(line)
	}
	return cmd, stdin, &stderr, readLine
}

// TestBlksize: files report st_blksize 4 KiB, the same while open for writing
// and once committed, so a reader that probes small headers all over a file
// (torch.load's zip records) reads a page or two at each, not 1 MiB (issue
// #13).
func TestBlksize(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/a.bin")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(randBytes(1, 100<<10)); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blksize != blksize {
		t.Errorf("file open for writing: st_blksize %d, want %d", st.Blksize, blksize)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	m.remount()
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blksize != blksize {
		t.Errorf("committed file: st_blksize %d, want %d", st.Blksize, blksize)
	}
}

// TestChildHoldsNoFuseConnection: a program started while the mount is live
// does not inherit its /dev/fuse descriptor (go-fuse's direct mount, as root,
// opens it inheritable), so a daemon that dies leaves a mount that fails with
// ENOTCONN, not one that hangs its callers while that program runs.
func TestChildHoldsNoFuseConnection(t *testing.T) {
	m := newMount(t)
	if _, err := os.Stat(m.path(".")); err != nil { // the mount serves
		t.Fatal(err)
	}
	own := procFuseFDs(t, os.Getpid())
	if len(own) == 0 {
		t.Fatal("this process holds no /dev/fuse descriptor though it serves a mount")
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	if got := procFuseFDs(t, child.Process.Pid); len(got) > 0 {
		t.Errorf("a child process inherited /dev/fuse as descriptors %v (this process holds %v)", got, own)
	}
}

// waitFor polls cond every interval until it holds, and fails t with what()
// (called then, so that it says what it saw) if it does not within timeout.
func waitFor(t testing.TB, timeout, interval time.Duration, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(interval)
	}
}

// procFuseFDs lists process pid's descriptors open on /dev/fuse.
func procFuseFDs(t *testing.T, pid int) []int {
	t.Helper()
	fds, err := fuseFDs(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return fds
}
