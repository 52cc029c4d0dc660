package fusefs

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// linkState is what a test expects of one path: its content (regular
// files), its link count, and which other path has the same inode ("" none
// checked).
type linkState struct {
	data   string
	nlink  uint64
	sameAs string
}

func statOf(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

// TestHardLinks walks link, unlink and rename through a table: after each
// step every listed name shows the inode, link count and content wanted,
// across commits (a write through one name is read through the others) and
// remounts; gone names are gone.
func TestHardLinks(t *testing.T) {
	m := newMount(t)
	for _, s := range hardLinkSteps(t, m) {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		checkLinkStep(t, m, s)
	}
	if st := m.stats(); st.Files != 2 { // new, d/new2 (d/f2 is no regular file)
		t.Errorf("the catalog counts %d files, want 2", st.Files)
	}
}

// linkStep is one step of TestHardLinks: what it does, then what each
// listed path shows and which paths are gone.
type linkStep struct {
	what string
	do   func() error
	want map[string]linkState
	gone []string
}

func hardLinkSteps(t *testing.T, m *testMount) []linkStep {
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var reader *os.File // an open reader of "a" across steps
	return []linkStep{
		{"link", func() error {
			must(os.Mkdir(m.path("d"), 0o755))
			mustWrite(t, m.path("a"), []byte("one"))
			return os.Link(m.path("a"), m.path("b"))
		}, map[string]linkState{"a": {"one", 2, "b"}}, nil},
		{"overwrite through one name", func() error {
			return os.WriteFile(m.path("b"), []byte("two"), 0o644)
		}, map[string]linkState{"a": {"two", 2, "b"}}, nil},
		{"write beside a reader: in place, no fork", func() error {
			var err error
			if reader, err = os.Open(m.path("a")); err != nil {
				return err
			}
			return os.WriteFile(m.path("b"), []byte("three"), 0o644)
		}, map[string]linkState{"a": {"three", 2, "b"}}, nil},
		{"link into another directory", func() error {
			return os.Link(m.path("b"), m.path("d/c"))
		}, map[string]linkState{"a": {"three", 3, "b"}, "d/c": {"three", 3, "a"}}, nil},
		{"rename a name over another file", func() error {
			mustWrite(t, m.path("e"), []byte("other"))
			return os.Rename(m.path("d/c"), m.path("e"))
		}, map[string]linkState{"a": {"three", 3, "e"}}, []string{"d/c"}},
		{"rename onto a name of the same inode does nothing", func() error {
			return os.Rename(m.path("a"), m.path("b"))
		}, map[string]linkState{"a": {"three", 3, "b"}}, nil},
		{"unlink one name", func() error {
			return os.Remove(m.path("a"))
		}, map[string]linkState{"b": {"three", 2, "e"}}, []string{"a"}},
		{"remount", func() error {
			reader.Close()
			m.remount()
			return nil
		}, map[string]linkState{"b": {"three", 2, "e"}}, nil},
		{"write after remount", func() error {
			f, err := os.OpenFile(m.path("e"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			if _, err := f.WriteString("+four"); err != nil {
				return err
			}
			return f.Close()
		}, map[string]linkState{"b": {"three+four", 2, "e"}}, nil},
		{"link a file not committed yet", func() error {
			f, err := os.Create(m.path("new"))
			if err != nil {
				return err
			}
			if _, err := f.WriteString("x"); err != nil {
				return err
			}
			if err := os.Link(m.path("new"), m.path("d/new2")); err != nil {
				return err
			}
			if _, err := f.WriteString("y"); err != nil {
				return err
			}
			return f.Close()
		}, map[string]linkState{"new": {"xy", 2, "d/new2"}}, nil},
		{"rename a not-committed file over a linked one", func() error {
			f, err := os.Create(m.path("tmp"))
			if err != nil {
				return err
			}
			if err := os.Rename(m.path("tmp"), m.path("new")); err != nil {
				return err
			}
			if _, err := f.WriteString("z"); err != nil {
				return err
			}
			return f.Close()
		}, map[string]linkState{"new": {"z", 1, ""}, "d/new2": {"xy", 1, ""}}, []string{"tmp"}},
		{"symlinks and FIFOs", func() error {
			must(os.Symlink("b", m.path("s")))
			must(os.Link(m.path("s"), m.path("s2")))
			must(syscall.Mkfifo(m.path("f"), 0o600))
			must(os.Link(m.path("f"), m.path("d/f2")))
			return os.Remove(m.path("f"))
		}, map[string]linkState{"s": {"", 2, "s2"}, "d/f2": {"", 1, ""}}, []string{"f"}},
		{"remount again", func() error { m.remount(); return nil },
			map[string]linkState{"b": {"three+four", 2, "e"}, "s": {"", 2, "s2"}, "d/f2": {"", 1, ""}, "new": {"z", 1, ""}}, nil},
		{"unlink every name", func() error {
			must(os.Remove(m.path("b")))
			return os.Remove(m.path("e"))
		}, nil, []string{"b", "e"}},
	}
}

func checkLinkStep(t *testing.T, m *testMount, s linkStep) {
	t.Helper()
	for p, w := range s.want {
		st := statOf(t, m.path(p))
		if uint64(st.Nlink) != w.nlink {
			t.Errorf("%s: nlink of %s is %d, want %d", s.what, p, st.Nlink, w.nlink)
		}
		if w.sameAs != "" {
			if other := statOf(t, m.path(w.sameAs)); other.Ino != st.Ino || other.Nlink != st.Nlink {
				t.Errorf("%s: %s is inode %d (nlink %d), %s inode %d (nlink %d)", s.what, p, st.Ino, st.Nlink, w.sameAs, other.Ino, other.Nlink)
			}
		}
		if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			mustEqualFile(t, m.path(p), []byte(w.data))
			if w.sameAs != "" {
				mustEqualFile(t, m.path(w.sameAs), []byte(w.data))
			}
		}
	}
	for _, p := range s.gone {
		if _, err := os.Lstat(m.path(p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %s: %v, want ENOENT", s.what, p, err)
		}
	}
}

// TestLinkErrors: what link(2) refuses, as ext4 does.
func TestLinkErrors(t *testing.T) {
	m := newMount(t)
	mustWrite(t, m.path("a"), []byte("a"))
	mustWrite(t, m.path("b"), []byte("b"))
	if err := os.Mkdir(m.path("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what, from, to string
		want           error
	}{
		{"onto an existing name", "a", "b", syscall.EEXIST},
		{"a directory", "dir", "dir2", syscall.EPERM},
		{"a missing file", "nope", "c", syscall.ENOENT},
		{"into .ckptfs", "a", ".ckptfs/a", syscall.EROFS},
	} {
		err := os.Link(m.path(c.from), m.path(c.to))
		if !errors.Is(err, c.want) {
			t.Errorf("link %s: %v, want %v", c.what, err, c.want)
		}
	}
}

func ctimeOf(t *testing.T, p string) int64 {
	t.Helper()
	st := statOf(t, p)
	return st.Ctim.Nano()
}

// TestLinkCtime: a link and an unlink of a name change the inode's ctime
// (as on ext4), and a remount keeps it.
func TestLinkCtime(t *testing.T) {
	m := newMount(t)
	mustWrite(t, m.path("a"), []byte("a"))
	past := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(m.path("a"), past, past); err != nil {
		t.Fatal(err)
	}
	before := ctimeOf(t, m.path("a"))
	time.Sleep(10 * time.Millisecond)
	if err := os.Link(m.path("a"), m.path("b")); err != nil {
		t.Fatal(err)
	}
	linked := ctimeOf(t, m.path("a"))
	if linked <= before {
		t.Fatalf("ctime after link %d, before %d", linked, before)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.Remove(m.path("b")); err != nil {
		t.Fatal(err)
	}
	unlinked := ctimeOf(t, m.path("a"))
	if unlinked <= linked {
		t.Fatalf("ctime after unlink %d, after link %d", unlinked, linked)
	}
	m.remount()
	if got := ctimeOf(t, m.path("a")); got != unlinked {
		t.Fatalf("ctime after remount %d, want %d", got, unlinked)
	}
}

// TestLinkWhileForked: a link of a file whose writer has a new version
// staged beside an old reader (a fork) names the new version, as the name
// does; the writer's later bytes reach both names, and the reader keeps the
// old bytes.
func TestLinkWhileForked(t *testing.T) {
	m := newMount(t)
	mustWrite(t, m.path("f"), []byte("old"))
	r, err := os.Open(m.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(m.path("f"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(m.path("f"), m.path("g")); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, m.path("g"), []byte("new"))
	if _, err := w.WriteString("+more"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"f", "g"} {
		mustEqualFile(t, m.path(p), []byte("new+more"))
		if st := statOf(t, m.path(p)); st.Nlink != 2 || st.Ino != statOf(t, m.path("f")).Ino {
			t.Errorf("%s: inode %d nlink %d", p, st.Ino, st.Nlink)
		}
	}
	buf := make([]byte, 16)
	if n, _ := r.ReadAt(buf, 0); string(buf[:n]) != "old" {
		t.Errorf("the old reader reads %q", buf[:n])
	}
	r.Close()
	m.remount()
	mustEqualFile(t, m.path("g"), []byte("new+more"))
	if st := statOf(t, m.path("g")); st.Nlink != 2 {
		t.Errorf("after remount: nlink %d", st.Nlink)
	}
}
