package fusefs

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/gc"
	"golang.org/x/sys/unix"
)

// TestSpecialFiles makes each kind of special file, then stats, chmods,
// chowns, utimens, renames, remounts (and runs fsck and gc on the store
// between) and unlinks it: each keeps its type, mode, rdev, owner and times.
func TestSpecialFiles(t *testing.T) {
	m := newMount(t)
	kinds := []struct {
		name string
		typ  uint32
		make func(p string) error
		rdev uint64
	}{
		{"fifo", syscall.S_IFIFO, func(p string) error { return syscall.Mkfifo(p, 0o640) }, 0},
		{"mknod-fifo", syscall.S_IFIFO, func(p string) error { return syscall.Mknod(p, syscall.S_IFIFO|0o640, 0) }, 0},
		{"chr", syscall.S_IFCHR, func(p string) error { return unix.Mknod(p, syscall.S_IFCHR|0o640, int(unix.Mkdev(1, 3))) }, unix.Mkdev(1, 3)},
		{"blk", syscall.S_IFBLK, func(p string) error { return unix.Mknod(p, syscall.S_IFBLK|0o640, int(unix.Mkdev(8, 17))) }, unix.Mkdev(8, 17)},
		{"sock", syscall.S_IFSOCK, func(p string) error {
			l, err := net.Listen("unix", p)
			if err != nil {
				return err
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			return l.Close()
		}, 0},
		{"mknod-reg", syscall.S_IFREG, func(p string) error { return syscall.Mknod(p, syscall.S_IFREG|0o640, 0) }, 0},
	}
	check := func(step, p string, typ uint32, perm uint32, rdev uint64, uid uint32, mtime int64) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if st.Mode&syscall.S_IFMT != typ || st.Mode&0o7777 != perm || (typ != syscall.S_IFREG && st.Rdev != rdev) || st.Uid != uid || st.Nlink != 1 || st.Size != 0 {
			t.Errorf("%s %s: mode %o rdev %x uid %d nlink %d size %d; want %o|%o rdev %x uid %d", step, p, st.Mode, st.Rdev, st.Uid, st.Nlink, st.Size, typ, perm, rdev, uid)
		}
		if mtime != 0 && st.Mtim.Nano() != mtime {
			t.Errorf("%s %s: mtime %d, want %d", step, p, st.Mtim.Nano(), mtime)
		}
	}
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, k := range kinds {
		p := m.path(k.name)
		if err := k.make(p); err != nil {
			t.Fatalf("make %s: %v", k.name, err)
		}
		perm := uint32(0o640)
		if k.typ == syscall.S_IFSOCK {
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			perm = st.Mode & 0o7777 // bind's mode is the umask's
		}
		check("create", p, k.typ, perm, k.rdev, 0, 0)
		if err := os.Chmod(p, 0o604); err != nil {
			t.Fatalf("chmod %s: %v", k.name, err)
		}
		if err := os.Lchown(p, 1234, 5678); err != nil {
			t.Fatalf("chown %s: %v", k.name, err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatalf("utimens %s: %v", k.name, err)
		}
		check("setattr", p, k.typ, 0o604, k.rdev, 1234, mtime.UnixNano())
		if err := os.Rename(p, m.path(k.name+".moved")); err != nil {
			t.Fatalf("rename %s: %v", k.name, err)
		}
	}
	m.unmount()
	s, err := cas.Open(m.store, cas.Options{Objects: local.New(cas.ObjectsDir(m.store), local.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	res, err := gc.Fsck(context.Background(), s, gc.FsckOptions{})
	if err == nil && !res.OK() {
		t.Errorf("fsck: %v", res.Problems)
	}
	if err == nil {
		_, err = gc.Collect(context.Background(), s, gc.Options{})
	}
	if cerr := s.Close(); cerr != nil {
		t.Error(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	m.mount()
	for _, k := range kinds {
		p := m.path(k.name + ".moved")
		check("remount", p, k.typ, 0o604, k.rdev, 1234, mtime.UnixNano())
		if _, err := os.Lstat(m.path(k.name)); !os.IsNotExist(err) {
			t.Errorf("%s: old name after rename: %v", k.name, err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatalf("unlink %s: %v", k.name, err)
		}
	}
	m.remount()
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != ".ckptfs" && e.Name() != "runs" {
			t.Errorf("%s left after unlink and remount", e.Name())
		}
	}
}

// TestFifoCarriesData: the kernel gives a FIFO in the mount its semantics.
func TestFifoCarriesData(t *testing.T) {
	m := newMount(t)
	p := m.path("pipe")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(p, []byte("through the pipe"), 0) }()
	got, err := os.ReadFile(p)
	if err != nil || string(got) != "through the pipe" {
		t.Fatalf("read %q %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDirLinkCount: a directory's nlink is 2 plus its subdirectories, through
// mkdir, rmdir, rename of directories (within, across and over one) and a
// remount.
func TestDirLinkCount(t *testing.T) {
	m := newMount(t)
	nlink := func(p string) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(m.path(p), &st); err != nil {
			t.Fatal(err)
		}
		return uint64(st.Nlink)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		what string
		do   func() error
		want map[string]uint64
	}{
		{"mkdir", func() error {
			for _, d := range []string{"a", "b", "a/x", "a/y", "a/z"} {
				if err := os.Mkdir(m.path(d), 0o755); err != nil {
					return err
				}
			}
			return os.WriteFile(m.path("a/file"), nil, 0o644)
		}, map[string]uint64{"a": 5, "b": 2, "a/x": 2}},
		{"rmdir", func() error { return os.Remove(m.path("a/z")) }, map[string]uint64{"a": 4}},
		{"rename within", func() error { return os.Rename(m.path("a/y"), m.path("a/w")) }, map[string]uint64{"a": 4}},
		{"rename across", func() error { return os.Rename(m.path("a/w"), m.path("b/w")) }, map[string]uint64{"a": 3, "b": 3}},
		{"rename over a dir", func() error {
			if err := os.Mkdir(m.path("b/v"), 0o755); err != nil {
				return err
			}
			return syscall.Rename(m.path("a/x"), m.path("b/v")) // os.Rename refuses a directory destination
		}, map[string]uint64{"a": 2, "b": 4, "b/v": 2}},
		{"remount", func() error { m.remount(); return nil }, map[string]uint64{"a": 2, "b": 4, "b/w": 2}},
		{"after remount", func() error { return os.Rename(m.path("b/w"), m.path("a/w")) }, map[string]uint64{"a": 3, "b": 3}},
	}
	root := func() uint64 { // the root holds .ckptfs and the mount's own runs/
		t.Helper()
		ents, err := os.ReadDir(m.dir)
		if err != nil {
			t.Fatal(err)
		}
		n := uint64(2)
		for _, e := range ents {
			if e.IsDir() {
				n++
			}
		}
		return n
	}
	for _, s := range steps {
		must(s.do())
		if got, want := nlink(""), root(); got != want {
			t.Errorf("%s: nlink of the root is %d, want %d", s.what, got, want)
		}
		for p, want := range s.want {
			if got := nlink(p); got != want {
				t.Errorf("%s: nlink of %q is %d, want %d", s.what, p, got, want)
			}
		}
	}
}

// TestCreateModeZero: a file created with mode 0000 keeps it, whichever way
// it is opened (pjdfstest open/26; FreeBSD's mv -f does this), and the
// owner, root here, still reads and writes it.
func TestCreateModeZero(t *testing.T) {
	m := newMount(t)
	for _, flags := range []int{os.O_WRONLY, os.O_RDWR, os.O_RDONLY} {
		p := m.path("zero")
		fd, err := syscall.Open(p, flags|syscall.O_CREAT|syscall.O_EXCL, 0)
		if err != nil {
			t.Fatalf("open flags %#x: %v", flags, err)
		}
		syscall.Close(fd)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode != syscall.S_IFREG {
			t.Errorf("flags %#x: mode %o, want %o", flags, st.Mode, syscall.S_IFREG)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
}
