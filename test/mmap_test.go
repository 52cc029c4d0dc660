package test

// Shared writable mappings (issue #17): SQLite in WAL mode (its -shm index is
// a MAP_SHARED file), numpy's open_memmap and a plain mmap+memcpy+msync, run
// as client processes against the daemon, checked byte for byte after a
// remount; the daemon killed while a mapping holds unsynced stores; and the
// same clients run by an ordinary user on a fusermount3 mount.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mmapPy is the client program: python3 -c mmapPy MODE ARGS...
//
//	sqlite-write DB        WAL mode; 100 transactions of 100 rows, a second
//	                       connection reading after each; closes.
//	sqlite-hold DB         the same, then prints "ready" and waits, open.
//	sqlite-check DB        journal mode, integrity and every row.
//	raw-write PATH SRC     O_CREAT, ftruncate, mmap MAP_SHARED, copy SRC in,
//	                       msync (mmap.flush), munmap, close.
//	patch-hold PATH OFF SRC SYNC
//	                       open O_RDWR, map the whole file, copy SRC in at
//	                       OFF, sync_file_range (the dirty pages reach the
//	                       daemon as WRITEs, no fsync), msync if SYNC is 1;
//	                       prints "ready" and waits with the mapping.
//	numpy-write PATH SRC   numpy.lib.format.open_memmap(w+) of SRC's float32s,
//	                       filled, flush(), del.
//	numpy-check PATH SRC   numpy.load(mmap_mode="r") equals SRC bit for bit.
//
// Each prints "ok" when done.
const mmapPy = `
import ctypes, mmap, os, sqlite3, sys

def rows():
    return [(i, "row%d-%x" % (i, (i * 2654435761) % 2**32)) for i in range(1, 10001)]

def sqlite_write(db, hold):
    c = sqlite3.connect(db)
    mode = c.execute("pragma journal_mode=wal").fetchone()[0]
    assert mode == "wal", mode
    c.execute("create table t(id integer primary key, v text)")
    c.commit()
    r = sqlite3.connect(db)
    all_rows = rows()
    for b in range(100):
        with c:
            c.executemany("insert into t(id, v) values(?, ?)", all_rows[b*100:(b+1)*100])
        n = r.execute("select count(*) from t").fetchone()[0]
        assert n == (b + 1) * 100, (b, n)
    if hold:
        print("ready", flush=True)
        sys.stdin.readline()
    r.close()
    c.close()

def sqlite_check(db):
    c = sqlite3.connect(db)
    assert c.execute("pragma journal_mode").fetchone()[0] == "wal"
    ic = c.execute("pragma integrity_check").fetchone()[0]
    assert ic == "ok", ic
    got = c.execute("select id, v from t order by id").fetchall()
    assert got == rows(), "rows differ: %d rows" % len(got)
    c.close()

def raw_write(path, src):
    data = open(src, "rb").read()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, len(data))
    m = mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[:] = data
    m.flush()
    m.close()
    os.close(fd)

def patch_hold(path, off, src, sync):
    data = open(src, "rb").read()
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[off:off+len(data)] = data
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    if libc.sync_file_range(fd, 0, 0, 1 | 2 | 4) != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range")
    if sync:
        m.flush()
    print("ready", flush=True)
    sys.stdin.readline()

def numpy_write(path, src):
    import numpy as np
    data = np.fromfile(src, dtype=np.float32)
    a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=data.shape)
    a[:] = data
    a.flush()
    del a

def numpy_check(path, src):
    import numpy as np
    a = np.load(path, mmap_mode="r")
    b = np.fromfile(src, dtype=np.float32)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), "data differs"

mode, args = sys.argv[1], sys.argv[2:]
if mode == "sqlite-write": sqlite_write(args[0], False)
elif mode == "sqlite-hold": sqlite_write(args[0], True)
elif mode == "sqlite-check": sqlite_check(args[0])
elif mode == "raw-write": raw_write(args[0], args[1])
elif mode == "patch-hold": patch_hold(args[0], int(args[1]), args[2], args[3] == "1")
elif mode == "numpy-write": numpy_write(args[0], args[1])
elif mode == "numpy-check": numpy_check(args[0], args[1])
else: sys.exit("unknown mode " + mode)
print("ok")
`

// systemPython is python3 from PATH: sqlite3 and mmap are in its standard
// library (CI checks it is there: .ci/run).
func systemPython(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: the mmap clients are Python programs")
	}
	return p
}

// venvPython is the e2e venv's python (numpy), or "" when CKPTFS_VENV is not
// set (a local run without the venv; CI sets it).
func venvPython(t testing.TB) string {
	t.Helper()
	venv := os.Getenv("CKPTFS_VENV")
	if venv == "" {
		return ""
	}
	p := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("CKPTFS_VENV=%s: %v", venv, err)
	}
	return p
}

// runMmapPy runs a client and fails the test unless it prints "ok" within
// five minutes.
func runMmapPy(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Start()
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(5 * time.Minute):
			cmd.Process.Kill()
			<-done
			err = errors.New("still running after 5 minutes: killed")
		}
	}
	if err != nil || strings.TrimSpace(out.String()) != "ok" {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(cmd.Args[3:], " "), err, out.String(), errOut.String())
	}
}

func mmapPyCmd(py string, args ...string) *exec.Cmd {
	cmd := exec.Command(py, append([]string{"-c", mmapPy}, args...)...)
	cmd.Dir = "/"
	return cmd
}

// npyData returns the data of a .npy file (after its header).
func npyData(t testing.TB, b []byte) []byte {
	t.Helper()
	if len(b) < 12 || string(b[1:6]) != "NUMPY" {
		t.Fatalf("not a .npy file (%d bytes)", len(b))
	}
	switch b[6] {
	case 1:
		return b[10+int(binary.LittleEndian.Uint16(b[8:])):]
	case 2, 3:
		return b[12+int(binary.LittleEndian.Uint32(b[8:])):]
	}
	t.Fatalf(".npy version %d", b[6])
	return nil
}

func mustFile(t testing.TB, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes (sha %x), want %d bytes (sha %x)", path, len(got), shaOf(got), len(want), shaOf(want))
	}
}

// TestSharedMmapClients: each client writes through a shared mapping; the
// daemon is stopped (unmount) and started again, and the file is checked
// by the client's reader and byte for byte.
func TestSharedMmapClients(t *testing.T) {
	py, venv := systemPython(t), venvPython(t)
	src := filepath.Join(t.TempDir(), "src")
	data := randBytes(17, 100<<20) // 100 MiB: 25 Mi float32s
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		numpy bool     // runs with the venv's python
		write []string // the client; PATH stands for the file
		check func(t *testing.T, path string)
	}{
		{
			name:  "sqlite-wal",
			write: []string{"sqlite-write", "PATH"},
			check: func(t *testing.T, path string) { runMmapPy(t, mmapPyCmd(py, "sqlite-check", path)) },
		},
		{
			name:  "raw-mmap",
			write: []string{"raw-write", "PATH", src},
			check: func(t *testing.T, path string) { mustFile(t, path, data) },
		},
		{
			name:  "numpy-open_memmap",
			numpy: true,
			write: []string{"numpy-write", "PATH", src},
			check: func(t *testing.T, path string) {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if got := npyData(t, b); !bytes.Equal(got, data) {
					t.Fatalf("%s: data differs (sha %x, want %x)", path, shaOf(got), shaOf(data))
				}
				runMmapPy(t, mmapPyCmd(venv, "numpy-check", path, src))
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := py
			if c.numpy {
				if venv == "" {
					t.Skip("CKPTFS_VENV is not set: numpy comes from the e2e venv (CI sets it)")
				}
				p = venv
			}
			store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
			path := filepath.Join(mnt, "runs", c.name)
			d := startDaemon(t, store, mnt)
			runMmapPy(t, mmapPyCmd(p, withPath(c.write, path)...))
			d.stop(syscall.SIGTERM)
			d = startDaemon(t, store, mnt)
			c.check(t, path)
			d.stop(syscall.SIGTERM)
		})
	}
}

// withPath returns args with "PATH" replaced by path.
func withPath(args []string, path string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "PATH", path)
	}
	return out
}

// TestSharedMmapDaemonKilled: the daemon is killed (SIGKILL) while a client
// holds a shared mapping whose stores reached it as WRITEs. Stores that no
// msync, fsync or close committed must not show in the file after a restart:
// the previous committed version is intact. Committed ones (msync, SQLite's
// fsync of its WAL at each transaction) must all be there.
func TestSharedMmapDaemonKilled(t *testing.T) {
	py := systemPython(t)
	dir := t.TempDir()
	v1 := randBytes(21, 6<<20+5)
	patch := randBytes(22, 3<<20)
	src := filepath.Join(dir, "patch")
	if err := os.WriteFile(src, patch, 0o644); err != nil {
		t.Fatal(err)
	}
	const off = 1<<20 + 100
	patched := bytes.Clone(v1)
	copy(patched[off:], patch)
	cases := []struct {
		name  string
		hold  []string // the client, with PATH for the file
		check func(t *testing.T, path string)
	}{
		{
			name:  "unsynced-stores",
			hold:  []string{"patch-hold", "PATH", strconv.Itoa(off), src, "0"},
			check: func(t *testing.T, path string) { mustFile(t, path, v1) },
		},
		{
			name:  "msynced-stores",
			hold:  []string{"patch-hold", "PATH", strconv.Itoa(off), src, "1"},
			check: func(t *testing.T, path string) { mustFile(t, path, patched) },
		},
		{
			name:  "sqlite-wal-open",
			hold:  []string{"sqlite-hold", "PATH"},
			check: func(t *testing.T, path string) { runMmapPy(t, mmapPyCmd(py, "sqlite-check", path)) },
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
			d := startDaemon(t, store, mnt)
			path := filepath.Join(mnt, "runs", c.name)
			if c.hold[0] == "patch-hold" {
				if err := os.WriteFile(path, v1, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cl := mmapPyCmd(py, withPath(c.hold, path)...)
			stdin, err := cl.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			stdout, err := cl.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			cl.Stderr = &errOut
			if err := cl.Start(); err != nil {
				t.Fatal(err)
			}
			if line, _ := bufio.NewReader(stdout).ReadString('\n'); strings.TrimSpace(line) != "ready" {
				cl.Process.Kill()
				cl.Wait()
				t.Fatalf("client: %q, %s", line, errOut.String())
			}
			d.cmd.Process.Kill() // the crash, with the client's mapping alive
			err = <-d.done
			d.done <- err
			cl.Process.Kill()
			cl.Wait()
			d = startDaemon(t, store, mnt)
			c.check(t, path)
			d.stop(syscall.SIGTERM)
		})
	}
}

// TestSharedMmapOrdinaryUser: the SQLite and plain mmap clients, run by an
// ordinary user on the mount it made through fusermount3, checked after the
// user's daemon is stopped and started again.
func TestSharedMmapOrdinaryUser(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 is not installed (Debian: apt install fuse3; .ci/run installs it)")
	}
	u := newTestUser(t, "mm")
	// python3 as the user finds it (testUser.command's PATH): root's may
	// sit in a directory the user cannot enter.
	py := ""
	for _, dir := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(dir, "python3")); err == nil {
			py = filepath.Join(dir, "python3")
			break
		}
	}
	if py == "" {
		t.Fatal("no python3 in /usr/local/bin, /usr/bin or /bin for the test user")
	}
	home, bin := sharedDir(t, u)
	store, mnt, src := filepath.Join(home, "store"), filepath.Join(home, "mnt"), filepath.Join(home, "src")
	data := randBytes(31, 8<<20+7)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mnt, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	asUser := func(args ...string) *exec.Cmd { return u.command(py, append([]string{"-c", mmapPy}, args...)...) }
	db, raw := filepath.Join(mnt, "runs", "db.sqlite"), filepath.Join(mnt, "runs", "raw.bin")
	d := startUserDaemon(t, u, bin, store, mnt)
	runMmapPy(t, asUser("sqlite-write", db))
	runMmapPy(t, asUser("raw-write", raw, src))
	d.stop(syscall.SIGTERM)
	d = startUserDaemon(t, u, bin, store, mnt)
	runMmapPy(t, asUser("sqlite-check", db))
	// Root cannot enter another user's mount (no allow_other): compare as
	// the user.
	check := u.command("cmp", src, raw)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("cmp %s %s as %s: %v %s", src, raw, u.name, err, out)
	}
	d.stop(syscall.SIGTERM)
}
