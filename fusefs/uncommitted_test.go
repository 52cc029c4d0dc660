package fusefs

import (
	"os"
	"syscall"
	"testing"
)

// TestUncommittedFiles: the files with a name and no catalog record are
// those created and not yet committed, under their current name, and no
// others: not a committed file open for writing, not one unlinked while
// open, not one closed.
func TestUncommittedFiles(t *testing.T) {
	m := newMount(t)
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(m.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, m.path("a/committed"), []byte("old"))
	ino := func(p string) uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(m.path(p), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	open := func(p string, flags int) *os.File {
		f, err := os.OpenFile(m.path(p), flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write([]byte("new bytes")); err != nil {
			t.Fatal(err)
		}
		return f
	}
	open("a/new", os.O_CREATE|os.O_WRONLY)
	open("a/committed", os.O_WRONLY|os.O_TRUNC)
	open("a/moved", os.O_CREATE|os.O_WRONLY)
	if err := os.Rename(m.path("a/moved"), m.path("b/moved")); err != nil {
		t.Fatal(err)
	}
	open("a/gone", os.O_CREATE|os.O_WRONLY)
	if err := os.Remove(m.path("a/gone")); err != nil {
		t.Fatal(err)
	}
	closed := open("a/closed", os.O_CREATE|os.O_WRONLY)
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}

	got := map[string]UncommittedFile{}
	for _, u := range m.fsys.UncommittedFiles() {
		got[u.Name] = u
	}
	want := []struct {
		name, dir, path string
	}{
		{"new", "a", "a/new"},
		{"moved", "b", "b/moved"},
	}
	if len(got) != len(want) {
		t.Fatalf("uncommitted files %+v, want %d", got, len(want))
	}
	for _, w := range want {
		u, ok := got[w.name]
		if !ok {
			t.Fatalf("%s not listed: %+v", w.path, got)
		}
		if u.Dir != ino(w.dir) || u.Ino != ino(w.path) || u.Size != int64(len("new bytes")) || u.Ctime == 0 {
			t.Errorf("%s: %+v, want dir %d, inode %d, size %d", w.path, u, ino(w.dir), ino(w.path), len("new bytes"))
		}
	}
}
