package powerloss

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func mountDisk(t *testing.T, d *Disk, dir string) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the power-loss disk mounts with mount(2): run the tests as root")
	}
	s, err := Mount(d, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmount() })
	return s
}

// The real system calls reach the model: fsync, fdatasync and a directory's
// fsync make durable what they promise, close and rename nothing more.
func TestSyscalls(t *testing.T) {
	dir := t.TempDir()
	d := New()
	s := mountDisk(t, d, dir)
	p := func(name string) string { return filepath.Join(dir, name) }

	write := func(name string, data []byte, sync func(*os.File) error) {
		t.Helper()
		f, err := os.OpenFile(p(name), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if sync != nil {
			if err := sync(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fdatasync := func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
	syncDir := func(path string) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000)

	write("synced", big, (*os.File).Sync)
	write("datasynced", []byte("fdatasync"), fdatasync)
	write("closed", []byte("only closed"), nil)
	if err := os.Mkdir(p("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("sub/inner", []byte("in a synced dir"), (*os.File).Sync)
	syncDir(p("sub"))
	syncDir(dir)
	write("late", []byte("after the directory fsync"), (*os.File).Sync)
	write("tmp", []byte("renamed"), (*os.File).Sync)
	if err := os.Rename(p("tmp"), p("synced")); err != nil {
		t.Fatal(err)
	}
	// The control socket of a daemon: bind and connect work.
	ln, err := net.Listen("unix", p("sock"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", p("sock"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	ln.Close()
	// flock is the kernel's.
	f, err := os.Open(p("closed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	f.Close()

	d.Crash(DropAll, 1)
	if _, err := os.Stat(p("synced")); err == nil {
		t.Fatal("stat after the power cut succeeded")
	}
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
	mountDisk(t, d.After(), dir)

	for _, c := range []struct {
		name string
		want []byte // nil: absent
	}{
		{"synced", big}, // the rename was not made durable
		{"datasynced", []byte("fdatasync")},
		{"closed", []byte{}}, // its entry is durable, its data not
		{"sub/inner", []byte("in a synced dir")},
		{"late", nil},
		{"tmp", nil},
	} {
		got, err := os.ReadFile(p(c.name))
		switch {
		case c.want == nil && !errors.Is(err, os.ErrNotExist):
			t.Errorf("%s: %d bytes, %v; want absent", c.name, len(got), err)
		case c.want != nil && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != nil && !bytes.Equal(got, c.want):
			t.Errorf("%s: %d bytes %.20q, want %d bytes %.20q", c.name, len(got), got, len(c.want), c.want)
		}
	}
}
