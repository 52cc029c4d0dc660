package fusefs

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"golang.org/x/sys/unix"
)

// hangGuard runs op and fails the test if it has not returned within 30 s: a
// guard against a wedged daemon (extending used to cost 1.3 s per GiB), not
// a timing assertion.
func hangGuard(t *testing.T, what string, op func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return within 30 s", what)
		return nil
	}
}

// readAtWant reads len(want) bytes at off of path and compares.
func readAtWant(t *testing.T, path string, off int64, want []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatalf("read %d bytes at %d: %v", len(want), off, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("at %d: read %q..., want %q...", off, got[:min(16, len(got))], want[:min(16, len(want))])
	}
}

// TestHoles: extending a file makes a hole (no chunk, no space, no store
// read), whatever its length, by every way a file grows; holes survive a
// commit, a shrink and re-extension, and a remount; a size past MaxFileSize
// is EFBIG, as on ext4.
func TestHoles(t *testing.T) {
	const tib = int64(1) << 40
	zeros := make([]byte, 1<<20)
	hello := []byte("hello, hole")
	type check struct {
		off  int64
		want []byte
	}
	cases := []struct {
		name   string
		size   int64 // after make
		make   func(p string) error
		checks []check
	}{
		{"ftruncate a new file to 1 TiB", tib, func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			if err := f.Truncate(tib); err != nil {
				return err
			}
			return f.Close()
		}, []check{{0, zeros}, {1 << 30, zeros}, {tib/2 + 12345, zeros}, {tib - 1<<20, zeros}}},
		{"truncate a committed file by path, write in the hole", tib, func(p string) error {
			if err := os.WriteFile(p, hello, 0o644); err != nil {
				return err
			}
			if err := os.Truncate(p, tib); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			if _, err := f.WriteAt(hello, tib/2); err != nil {
				return err
			}
			return f.Close()
		}, []check{{0, hello}, {int64(len(hello)), zeros}, {tib/2 - 5, append(make([]byte, 5), hello...)}, {tib - 1<<20, zeros}}},
		{"write far past the end", 3*tib + int64(len(hello)), func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			if _, err := f.Write(hello); err != nil {
				return err
			}
			if _, err := f.WriteAt(hello, 3*tib); err != nil {
				return err
			}
			return f.Close()
		}, []check{{0, hello}, {tib, zeros}, {3*tib - 3, append([]byte{0, 0, 0}, hello...)}}},
		{"shrink, then extend again", 2 * tib, func(p string) error {
			data := randBytes(7, 3<<20)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return err
			}
			if err := os.Truncate(p, 1<<20+17); err != nil {
				return err
			}
			return os.Truncate(p, 2*tib)
		}, []check{{0, randBytes(7, 1<<20+17)}, {1<<20 + 17, zeros}, {2*tib - 1<<20, zeros}}},
		{"fallocate past the end", tib, func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			if err := unix.Fallocate(int(f.Fd()), 0, 0, tib); err != nil {
				return err
			}
			return f.Close()
		}, []check{{0, zeros}, {tib - 1<<20, zeros}}},
	}
	m := newMount(t)
	for _, c := range cases {
		p := m.path(c.name)
		if err := hangGuard(t, c.name, func() error { return c.make(p) }); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	verify := func(when string) {
		t.Helper()
		before, err := m.cas.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			p := m.path(c.name)
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil {
				t.Fatalf("%s %s: %v", when, c.name, err)
			}
			if st.Size != c.size || st.Blocks*512 > 16<<20 {
				t.Errorf("%s %s: size %d blocks %d, want size %d and no more than 16 MiB of blocks", when, c.name, st.Size, st.Blocks, c.size)
			}
			for _, ck := range c.checks {
				readAtWant(t, p, ck.off, ck.want)
			}
		}
		st, err := m.cas.Stats()
		if err != nil {
			t.Fatal(err)
		}
		// Holes read no object: the data chunks (a few MiB) at most.
		if read := st.StoreReadBytes - before.StoreReadBytes; read > 8<<20 {
			t.Errorf("%s: reading holes read %d bytes from the store", when, read)
		}
		if st.LogicalBytes < 7*tib || st.UniqueBytes > 16<<20 {
			t.Errorf("%s: logical %d bytes, unique %d: holes must take no space", when, st.LogicalBytes, st.UniqueBytes)
		}
		if st.FormatVersion < cas.FormatHoles { // packs of its small chunks may take it further
			t.Errorf("%s: format %d, want at least %d (holes)", when, st.FormatVersion, cas.FormatHoles)
		}
	}
	verify("committed")
	m.remount()
	verify("remounted")
}

// TestFileSizeLimit: past MaxFileSize a truncate and a fallocate give EFBIG
// and change nothing; a write there gives EFBIG too (pjdfstest truncate/12.t
// and ftruncate/12.t truncate to 999,999,999,999,999 bytes).
func TestFileSizeLimit(t *testing.T) {
	m := newMount(t)
	p := m.path("f")
	mustWrite(t, p, []byte("abc"))
	for _, size := range []int64{MaxFileSize + 1, 999_999_999_999_999, 1<<63 - 1} {
		if err := hangGuard(t, "truncate", func() error { return os.Truncate(p, size) }); !errors.Is(err, syscall.EFBIG) {
			t.Errorf("truncate to %d: %v, want EFBIG", size, err)
		}
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(999_999_999_999_999); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("ftruncate: %v, want EFBIG", err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, MaxFileSize, 4096); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("fallocate past the limit: %v, want EFBIG", err)
	}
	if _, err := f.WriteAt([]byte("x"), MaxFileSize); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("write at the limit: %v, want EFBIG", err)
	}
	if err := f.Truncate(MaxFileSize); err != nil {
		t.Errorf("ftruncate to the limit: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Size() != MaxFileSize {
		t.Fatalf("stat: %v %v, want size %d", st, err, MaxFileSize)
	}
	readAtWant(t, p, 0, []byte("abc\x00"))
}

// TestSeekHoles: SEEK_DATA and SEEK_HOLE of a committed file name its holes.
func TestSeekHoles(t *testing.T) {
	m := newMount(t)
	p := m.path("f")
	const gib = 1 << 30
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(randBytes(1, 1<<20), gib); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4 * gib); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkSeeks(t, f, []seekCase{
		{0, unix.SEEK_DATA, gib, nil},
		{0, unix.SEEK_HOLE, 0, nil},
		{gib + 5, unix.SEEK_DATA, gib + 5, nil},
		{gib + 5, unix.SEEK_HOLE, gib + 1<<20, nil},
		{2 * gib, unix.SEEK_DATA, 0, syscall.ENXIO},
		{2 * gib, unix.SEEK_HOLE, 2 * gib, nil},
		{4 * gib, unix.SEEK_HOLE, 4 * gib, nil},
		{4*gib + 1, unix.SEEK_HOLE, 0, syscall.ENXIO},
	})
}

// seekCase is an lseek and what it must answer: want, or the error err.
type seekCase struct {
	off    int64
	whence int
	want   int64
	err    error
}

// checkSeeks runs each lseek on f and reports the answers that differ.
func checkSeeks(t *testing.T, f *os.File, cases []seekCase) {
	t.Helper()
	for _, c := range cases {
		got, err := unix.Seek(int(f.Fd()), c.off, c.whence)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("seek(%d, %d): %d %v, want %v", c.off, c.whence, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("seek(%d, %d): %d %v, want %d", c.off, c.whence, got, err, c.want)
		}
	}
}

// TestSeekStaged: lseek's SEEK_DATA and SEEK_HOLE on a file still open for
// writing answer from what is staged, as ext4 answers on a file being
// written: a spool's data and holes (a write out of order), a stream's
// written bytes and the hole past them (in order, then ftruncate up).
func TestSeekStaged(t *testing.T) {
	const mib = 1 << 20
	m := newMount(t)
	cases := []struct {
		name  string
		write func(f *os.File) error
		seeks []seekCase
	}{
		{"spool", func(f *os.File) error {
			if _, err := f.WriteAt(randBytes(3, mib), 64*mib); err != nil {
				return err
			}
			return f.Truncate(256 * mib)
		}, []seekCase{
			{0, unix.SEEK_DATA, 64 * mib, nil},
			{0, unix.SEEK_HOLE, 0, nil},
			{64*mib + 5, unix.SEEK_HOLE, 65 * mib, nil},
			{65 * mib, unix.SEEK_DATA, 0, syscall.ENXIO},
		}},
		{"stream", func(f *os.File) error {
			if _, err := f.Write(randBytes(4, 2*mib)); err != nil {
				return err
			}
			return f.Truncate(8 * mib)
		}, []seekCase{
			{0, unix.SEEK_DATA, 0, nil},
			{0, unix.SEEK_HOLE, 2 * mib, nil},
			{3 * mib, unix.SEEK_DATA, 0, syscall.ENXIO},
			{3 * mib, unix.SEEK_HOLE, 3 * mib, nil},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Create(m.path(c.name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := c.write(f); err != nil {
				t.Fatal(err)
			}
			checkSeeks(t, f, c.seeks)
		})
	}
}

// TestMmapSparseFile: a mapping of a file with holes reads zeros in them and
// the written bytes elsewhere, in a client process.
func TestMmapSparseFile(t *testing.T) {
	m := newMount(t)
	p := m.path("sparse")
	want := make([]byte, 64<<20)
	copy(want[40<<20:], randBytes(9, 1<<20))
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(want))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want[40<<20:41<<20], 40<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	_, stdin, stderr, readLine := startClient(t, "mmap-hold", p)
	if line := readLine(); line != "ready" {
		t.Fatalf("client: %q %s", line, stderr)
	}
	stdin.Write([]byte("\n"))
	if line, w := readLine(), sha(want)+" "+sha(want); line != w {
		t.Fatalf("client hashes %q, want %q; %s", line, w, stderr)
	}
}
