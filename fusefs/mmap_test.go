package fusefs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/cas"
)

// runMmapSteps is the "mmap-steps" client: it runs the steps in
// CKPTFS_TEST_STEPS on path, in order, each one system call:
//
//	create        open O_RDWR|O_CREAT|O_TRUNC
//	open          open O_RDWR
//	trunc:N       ftruncate to N bytes
//	map:N         mmap N bytes, PROT_READ|PROT_WRITE, MAP_SHARED
//	fill:O:L:S    copy randBytes(S, L) into the mapping at offset O
//	msync         msync(MS_SYNC) of the whole mapping
//	writeback     sync_file_range(WAIT_BEFORE|WRITE|WAIT_AFTER): the dirty
//	              pages reach the daemon as WRITEs, without an fsync
//	fsync         fsync
//	unmap         munmap
//	close         close
//	pause         print "ready" and wait for a line on stdin
//
// A step that fails ends the client with its error on stderr, unless its name
// ends in "?": then it prints "step=ok" or "step=ERRNO" and goes on.
func runMmapSteps(path string) int {
	fd := -1
	var mem []byte
	in := bufio.NewReader(os.Stdin)
	for _, step := range strings.Fields(os.Getenv("CKPTFS_TEST_STEPS")) {
		name, report := strings.CutSuffix(step, "?")
		args := strings.Split(name, ":")
		num := func(i int) int {
			v, err := strconv.Atoi(args[i])
			if err != nil {
				panic(fmt.Sprintf("step %q: %v", step, err))
			}
			return v
		}
		var err error
		switch args[0] {
		case "create":
			fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
		case "open":
			fd, err = unix.Open(path, unix.O_RDWR, 0)
		case "trunc":
			err = unix.Ftruncate(fd, int64(num(1)))
		case "map":
			mem, err = unix.Mmap(fd, 0, num(1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		case "fill":
			copy(mem[num(1):], randBytes(uint64(num(3)), num(2)))
		case "msync":
			err = unix.Msync(mem, unix.MS_SYNC)
		case "writeback":
			err = unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		case "fsync":
			err = unix.Fsync(fd)
		case "unmap":
			err = unix.Munmap(mem)
		case "close":
			err = unix.Close(fd)
		case "pause":
			fmt.Println("ready")
			if _, err := in.ReadString('\n'); err != nil {
				fmt.Fprintln(os.Stderr, "stdin:", err)
				return 1
			}
		default:
			fmt.Fprintf(os.Stderr, "unknown step %q\n", step)
			return 2
		}
		switch {
		case report && err == nil:
			fmt.Printf("%s=ok\n", name)
		case report:
			fmt.Printf("%s=%s\n", name, unix.ErrnoName(err.(unix.Errno)))
		case err != nil:
			fmt.Fprintf(os.Stderr, "%s: %v\n", step, err)
			return 1
		}
	}
	fmt.Println("done")
	return 0
}

// mmapClient runs the mmap-steps client on path.
type mmapClient struct {
	t        *testing.T
	cmd      *exec.Cmd
	stdin    interface{ Write([]byte) (int, error) }
	stderr   *bytes.Buffer
	readLine func() string
}

func startMmapClient(t *testing.T, path string, steps ...string) *mmapClient {
	t.Helper()
	cmd, stdin, stderr, readLine := startClient(t, "mmap-steps", path, "CKPTFS_TEST_STEPS="+strings.Join(steps, " "))
	return &mmapClient{t: t, cmd: cmd, stdin: stdin, stderr: stderr, readLine: readLine}
}

// next returns the client's next line of output.
func (c *mmapClient) next() string { return c.readLine() }

// resume lets a paused client go on.
func (c *mmapClient) resume() {
	c.t.Helper()
	if _, err := c.stdin.Write([]byte("\n")); err != nil {
		c.t.Fatal(err)
	}
}

// wait waits for the client to end and fails the test unless it succeeded.
func (c *mmapClient) wait() {
	c.t.Helper()
	if line := c.next(); line != "done" {
		c.t.Fatalf("client printed %q, want done (stderr: %s)", line, c.stderr)
	}
	if err := c.cmd.Wait(); err != nil {
		c.t.Fatalf("client: %v (stderr: %s)", err, c.stderr)
	}
}

// committedContent returns the content the catalog holds for rel (relative to
// the mountpoint), read from the catalog and the chunks, not through the
// mount: what a crash would leave. ok is false if the catalog has no such file.
func committedContent(t *testing.T, m *testMount, rel string) (data []byte, ok bool) {
	t.Helper()
	var man *cas.Manifest
	err := m.cas.View(func(tx *cas.Tx) error {
		ino := cas.RootIno
		for _, name := range strings.Split(filepath.ToSlash(rel), "/") {
			var found bool
			if ino, found = tx.Lookup(ino, name); !found {
				return nil
			}
		}
		var err error
		man, ok, err = tx.Manifest(ino)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil, false
	}
	for _, ref := range man.Chunks {
		c, err := m.cas.AcquireChunk(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, c.Data...)
		c.Release()
	}
	return data, true
}

func mustCommitted(t *testing.T, m *testMount, rel, when string, want []byte) {
	t.Helper()
	got, ok := committedContent(t, m, rel)
	if !ok && want != nil {
		t.Fatalf("%s: %s: the catalog has no file, want %d bytes", rel, when, len(want))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %s: the catalog holds %d bytes (sha %s), want %d bytes (sha %s)",
			rel, when, len(got), sha(got)[:12], len(want), sha(want)[:12])
	}
}

// patched returns a copy of base with randBytes(seed, n) at off.
func patched(base []byte, off, n int, seed uint64) []byte {
	out := bytes.Clone(base)
	copy(out[off:], randBytes(seed, n))
	return out
}

// TestSharedMmapWrite: a process that writes a file through a shared
// writable mapping (MAP_SHARED, what SQLite's WAL index and numpy's
// open_memmap do) gets its stores committed by msync(MS_SYNC) (which sends
// FSYNC), or by the close that follows munmap (munmap writes the dirty pages
// back), or, when the mapping outlives the descriptor, by the release at
// munmap. Dirty pages that reach the daemon without an fsync or a close
// (kernel writeback) are staged, not committed. The catalog is checked while
// the client is paused at each point, and the files byte for byte through the
// mount and again after a remount.
func TestSharedMmapWrite(t *testing.T) {
	const size = 3<<20 + 123 // not a whole number of pages
	v1 := randBytes(100, size)
	full := func(seed uint64) []byte { return randBytes(seed, size) }
	type check struct {
		at   int    // the pause (0: the first)
		want []byte // the catalog's content then; nil: no file
	}
	cases := []struct {
		name   string
		before []byte // committed content before the client starts; nil: absent
		steps  []string
		checks []check
		want   []byte // at the end
	}{
		{
			name:   "msync-commits",
			steps:  []string{"create", "trunc:" + strconv.Itoa(size), "map:" + strconv.Itoa(size), "fill:0:" + strconv.Itoa(size) + ":1", "msync", "pause", "unmap", "close"},
			checks: []check{{0, full(1)}},
			want:   full(1),
		},
		{
			name:   "munmap-then-close-commits-at-close",
			before: v1,
			steps:  []string{"open", "map:" + strconv.Itoa(size), "fill:4096:65536:2", "unmap", "pause", "close", "pause"},
			checks: []check{{0, v1}, {1, patched(v1, 4096, 65536, 2)}},
			want:   patched(v1, 4096, 65536, 2),
		},
		{
			name:   "writeback-stages-without-commit",
			before: v1,
			steps:  []string{"open", "map:" + strconv.Itoa(size), "fill:1000000:2000000:3", "writeback", "pause", "fsync", "pause", "unmap", "close"},
			checks: []check{{0, v1}, {1, patched(v1, 1000000, 2000000, 3)}},
			want:   patched(v1, 1000000, 2000000, 3),
		},
		{
			name:   "last-page-partial",
			before: v1,
			steps:  []string{"open", "map:" + strconv.Itoa(size), "fill:" + strconv.Itoa(size-200) + ":200:4", "msync", "fsync", "pause", "unmap", "close"},
			checks: []check{{0, patched(v1, size-200, 200, 4)}},
			want:   patched(v1, size-200, 200, 4),
		},
		{
			// numpy.memmap: the file object is closed right after mmap; the
			// mapping keeps the description open and its release commits.
			name:   "close-before-munmap-commits-at-release",
			before: v1,
			steps:  []string{"open", "map:" + strconv.Itoa(size), "close", "fill:0:8192:5", "pause", "unmap"},
			checks: []check{{0, v1}},
			want:   patched(v1, 0, 8192, 5),
		},
		{
			// O_TRUNC then sized and written only through the mapping.
			name:   "truncate-and-map",
			before: v1,
			steps:  []string{"create", "trunc:1048576", "map:1048576", "fill:0:1048576:6", "unmap", "close", "pause"},
			checks: []check{{0, randBytes(6, 1<<20)}},
			want:   randBytes(6, 1<<20),
		},
	}
	m := newMount(t)
	if err := os.MkdirAll(m.path("runs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rel := "runs/" + c.name
			if c.before != nil {
				mustWrite(t, m.path(rel), c.before)
			}
			cl := startMmapClient(t, m.path(rel), c.steps...)
			pause := 0
			for {
				line := cl.next()
				if line == "done" {
					break
				}
				if line != "ready" {
					t.Fatalf("client printed %q (stderr: %s)", line, cl.stderr)
				}
				for _, ch := range c.checks {
					if ch.at == pause {
						mustCommitted(t, m, rel, fmt.Sprintf("at pause %d", pause), ch.want)
					}
				}
				pause++
				cl.resume()
			}
			if err := cl.cmd.Wait(); err != nil {
				t.Fatalf("client: %v (stderr: %s)", err, cl.stderr)
			}
			mustEqualFile(t, m.path(rel), c.want)
		})
	}
	// The release that commits a mapping that outlived its descriptor is
	// asynchronous: wait for it before looking at the catalog.
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range cases {
		rel := "runs/" + c.name
		for {
			got, _ := committedContent(t, m, rel)
			if bytes.Equal(got, c.want) {
				break
			}
			if time.Now().After(deadline) {
				mustCommitted(t, m, rel, "after the client exited", c.want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	m.remount()
	for _, c := range cases {
		mustEqualFile(t, m.path("runs/"+c.name), c.want)
	}
}

// TestSharedMmapCommitErrors: a commit that fails is reported by the msync
// and the close of a process that wrote through a shared mapping, as by a
// write(2) writer's fsync and close.
func TestSharedMmapCommitErrors(t *testing.T) {
	errInjected := errors.New("injected commit failure")
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		opts: []Option{WithAfterCommit(func(context.Context) error { return errInjected })}}
	m.mount()
	t.Cleanup(m.unmount)
	p := m.path("runs/f")
	cl := startMmapClient(t, p, "create", "trunc:65536", "map:65536", "fill:0:65536:1", "msync?", "fill:0:4096:2", "unmap", "close?")
	for _, want := range []string{"msync=EIO", "close=EIO"} {
		if got := cl.next(); got != want {
			t.Fatalf("client printed %q, want %q (stderr: %s)", got, want, cl.stderr)
		}
	}
	cl.wait()
}

// TestSharedMmapWriteWithReader: a process writes a file through a shared
// mapping while another has it open and mapped (MAP_PRIVATE). The kernel
// shows the stores to the reader as they are made (the inode's pages are
// shared), so the reader must go on seeing the new version, in the pages it
// maps and in those the kernel drops and reads back through its handle.
// Staged in a fork (a new inode for the new version, what a write(2) writer
// gets), the reader would see the stores while their pages stay cached and
// the old version wherever the kernel reads pages back (here: all of it, as
// the kernel drops the pages once the daemon's mtime moved).
func TestSharedMmapWriteWithReader(t *testing.T) {
	m := newMount(t)
	const size = 4 << 20
	v1 := randBytes(1, size)
	v2 := randBytes(2, size)
	p := m.path("runs/shared")
	mustWrite(t, p, v1)
	reader, rin, rerr, readerLine := startClient(t, "mmap-hold", p, "CKPTFS_TEST_DROP=1")
	if got := readerLine(); got != "ready" {
		t.Fatalf("reader: %q (stderr %s)", got, rerr)
	}
	w := startMmapClient(t, p, "open", "map:"+strconv.Itoa(size), "fill:0:"+strconv.Itoa(size)+":2", "msync", "unmap", "close")
	w.wait()
	// The reader drops the pages it does not map before its read(2).
	if _, err := rin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if got, want := readerLine(), sha(v2)+" "+sha(v2); got != want {
		t.Fatalf("reader saw %q (mapping, read), want the new version %q everywhere (old is %s)", got, want, sha(v1))
	}
	if err := reader.Wait(); err != nil {
		t.Fatalf("reader: %v (stderr %s)", err, rerr)
	}
	mustCommitted(t, m, "runs/shared", "after the writer's close", v2)
	m.remount()
	mustEqualFile(t, p, v2)
}
