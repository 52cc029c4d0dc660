package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountWithNodeLimit mounts a fresh store whose daemon lets the kernel keep
// at most limit nodes.
func mountWithNodeLimit(t *testing.T, limit int, opts ...Option) *testMount {
	t.Helper()
	m := newMount(t, append([]Option{WithNodeLimit(limit)}, opts...)...)
	if ks := m.srv.KernelSettings(); ks.Major == 7 && ks.Minor < 45 {
		t.Fatalf("kernel FUSE protocol 7.%d: FUSE_NOTIFY_PRUNE (7.45, Linux 6.18) is needed to bound the daemon's nodes", ks.Minor)
	}
	return m
}

// listedNodes returns how many nodes the daemon holds for the kernel.
func (m *testMount) listedNodes() int {
	m.fsys.nodes.mu.Lock()
	defer m.fsys.nodes.mu.Unlock()
	return m.fsys.nodes.n
}

// waitNodes waits until the daemon holds at most n nodes for the kernel. The
// pruner lets the kernel keep up to a quarter of the limit more than the
// nodes it could not forget (open files and their directories), and one
// whose FORGETs come late (a loaded machine, the race detector) may stop
// short: waitNodes wakes it again, as further lookups would.
func (m *testMount) waitNodes(n int) {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 1; m.listedNodes() > n; i++ {
		if time.Now().After(deadline) {
			m.t.Fatalf("the daemon still holds %d nodes, want at most %d", m.listedNodes(), n)
		}
		time.Sleep(10 * time.Millisecond)
		if i%50 == 0 {
			select {
			case m.fsys.nodes.kick <- struct{}{}:
			default:
			}
		}
	}
}

// treeState is what a walk of a mount sees: every path's inode number,
// size and content (directories: their sorted listing).
type treeState map[string]string

func walkState(t *testing.T, root string) treeState {
	t.Helper()
	st := treeState{}
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == ".ckptfs" {
			return filepath.SkipDir
		}
		ino := info.Sys().(*syscall.Stat_t).Ino
		switch {
		case info.IsDir():
			ents, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			sort.Strings(names)
			st[rel] = fmt.Sprintf("dir %d %v", ino, names)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			st[rel] = fmt.Sprintf("file %d %d %s %o", ino, info.Size(), sha(data), info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (s treeState) diff(t *testing.T, other treeState) {
	t.Helper()
	for p, v := range s {
		if other[p] != v {
			t.Errorf("%s: %q, then %q", p, v, other[p])
		}
	}
	for p, v := range other {
		if _, ok := s[p]; !ok {
			t.Errorf("%s: new %q", p, v)
		}
	}
}

// TestNodesForgottenAndFoundAgain: with more files looked up than the limit,
// the daemon has the kernel forget the oldest, and lookups that come back to
// them find the same inode numbers, sizes, modes and bytes in the catalog.
func TestNodesForgottenAndFoundAgain(t *testing.T) {
	const limit = 64
	m := mountWithNodeLimit(t, limit)
	for d := range 6 {
		dir := m.path(fmt.Sprintf("runs/r%d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range 40 {
			p := filepath.Join(dir, fmt.Sprintf("f%02d", f))
			mustWrite(t, p, randBytes(uint64(d*100+f), 100+f*37))
			if f%3 == 0 {
				if err := os.Chmod(p, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	before := walkState(t, m.dir)
	if len(before) < 6*40 {
		t.Fatalf("walk saw %d entries", len(before))
	}
	m.waitNodes(limit)
	after := walkState(t, m.dir)
	before.diff(t, after)
	m.waitNodes(limit)
	// And across a remount, where every node comes from the catalog.
	m.remount()
	before.diff(t, walkState(t, m.dir))
}

// TestNamespaceChangesOnForgottenNodes: renames, unlinks and rmdirs of names
// whose nodes the kernel forgot act on the catalog's entries; a directory
// whose children are all forgotten is still not empty.
func TestNamespaceChangesOnForgottenNodes(t *testing.T) {
	const limit = 16
	m := mountWithNodeLimit(t, limit)
	dir := m.path("runs/a")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for f := range 50 {
		mustWrite(t, filepath.Join(dir, fmt.Sprintf("f%02d", f)), randBytes(uint64(f), 10+f))
	}
	if err := os.MkdirAll(m.path("runs/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.waitNodes(limit)
	if err := os.Remove(dir); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir of a directory of forgotten files: %v, want ENOTEMPTY", err)
	}
	if err := os.Rename(filepath.Join(dir, "f01"), m.path("runs/b/moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "f02"), filepath.Join(dir, "f03")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "f04")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.path("runs/b"), filepath.Join(dir, "f05")); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("rename of a directory over a forgotten file: %v, want ENOTDIR", err)
	}
	m.waitNodes(limit)
	want := map[string][]byte{"runs/b/moved": randBytes(1, 11), "runs/a/f03": randBytes(2, 12)}
	for p, data := range want {
		mustEqualFile(t, m.path(p), data)
	}
	for _, p := range []string{"runs/a/f01", "runs/a/f02", "runs/a/f04"} {
		if _, err := os.Lstat(m.path(p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone", p, err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 47 {
		t.Errorf("runs/a lists %d entries, want 47", len(ents))
	}
	state := walkState(t, m.dir)
	m.remount()
	state.diff(t, walkState(t, m.dir))
}

// TestOpenAndNewFilesOutliveForget: a file being written (not in the catalog
// yet, or replacing a committed one) and a file held open keep their nodes
// while the kernel forgets everything around them; the new content commits
// under its name.
func TestOpenAndNewFilesOutliveForget(t *testing.T) {
	const limit = 16
	m := mountWithNodeLimit(t, limit)
	for f := range 40 {
		mustWrite(t, m.path(fmt.Sprintf("runs/f%02d", f)), randBytes(uint64(f), 100))
	}
	old := randBytes(7, 5000)
	mustWrite(t, m.path("runs/replaced"), old)
	reader, err := os.Open(m.path("runs/replaced"))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	// A new file, and a new version of "replaced" written under a temporary
	// name and renamed over it while open: neither is in the catalog.
	fresh, err := os.Create(m.path("runs/fresh"))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	tmp, err := os.Create(m.path("runs/replaced.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	newData := randBytes(8, 7000)
	if _, err := tmp.Write(newData[:3000]); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.path("runs/replaced.tmp"), m.path("runs/replaced")); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Write([]byte("fresh")); err != nil {
		t.Fatal(err)
	}
	// Look everything up again, so that the limit is passed and the pruner
	// asks the kernel to forget the oldest nodes.
	for range 3 {
		walkState(t, m.dir)
		m.waitNodes(limit + limit/4 + 4) // open files stay
	}
	for p, size := range map[string]int64{"runs/fresh": 5, "runs/replaced": 3000} {
		if st, err := os.Stat(m.path(p)); err != nil || st.Size() != size {
			t.Fatalf("%s while being written: %v, size %v, want %d", p, err, st, size)
		}
	}
	if _, err := tmp.Write(newData[3000:]); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Close(); err != nil {
		t.Fatal(err)
	}
	walkState(t, m.dir)
	m.waitNodes(limit + limit/4 + 4) // open files stay
	mustEqualFile(t, m.path("runs/replaced"), newData)
	mustEqualFile(t, m.path("runs/fresh"), []byte("fresh"))
	got := make([]byte, len(old))
	if _, err := reader.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the reader of the replaced version: %v", err)
	}
	state := walkState(t, m.dir)
	reader.Close()
	m.remount()
	state.diff(t, walkState(t, m.dir))
}

// TestRewriteInPlaceAfterForget: a file rewritten in place (open with
// O_TRUNC) while a reader holds it gets a fork, which takes the name at
// commit; lookups after the kernel forgot the name find the fork's content,
// and the reader keeps the old bytes.
func TestRewriteInPlaceAfterForget(t *testing.T) {
	const limit = 16
	m := mountWithNodeLimit(t, limit)
	for f := range 40 {
		mustWrite(t, m.path(fmt.Sprintf("runs/f%02d", f)), randBytes(uint64(f), 100))
	}
	old, newData := randBytes(1, 9000), randBytes(2, 4000)
	p := m.path("runs/model.bin")
	mustWrite(t, p, old)
	reader, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(newData); err != nil {
		t.Fatal(err)
	}
	walkState(t, m.dir)
	m.waitNodes(limit + limit/4 + 4) // open files stay
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		walkState(t, m.dir)
		m.waitNodes(limit + limit/4 + 4) // open files stay
		mustEqualFile(t, p, newData)
	}
	got := make([]byte, len(old))
	if _, err := reader.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the reader of the old version: %v", err)
	}
}

// TestForkFoundByLookupAfterForget: a fork that has taken the name (fsync
// commits it) while its writer is still open is the node a later lookup of
// the name finds, not a second node built from the catalog, so writes by
// both the old descriptor and a new one land in the same file.
func TestForkFoundByLookupAfterForget(t *testing.T) {
	const limit = 16
	m := mountWithNodeLimit(t, limit)
	for f := range 40 {
		mustWrite(t, m.path(fmt.Sprintf("runs/f%02d", f)), randBytes(uint64(f), 100))
	}
	p := m.path("runs/model.bin")
	mustWrite(t, p, randBytes(1, 9000))
	reader, err := os.Open(p) // makes the rewrite below a fork
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	x := randBytes(2, 4000)
	if _, err := w.Write(x); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil { // the fork commits and takes the name
		t.Fatal(err)
	}
	for range 2 {
		walkState(t, m.dir)
		m.waitNodes(limit + limit/4 + 4) // open files stay
	}
	if _, err := w.Write(randBytes(3, 1000)); err != nil {
		t.Fatal(err)
	}
	w2, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.WriteAt([]byte("second writer"), 100); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := append(x, randBytes(3, 1000)...)
	copy(want[100:], "second writer")
	mustEqualFile(t, p, want)
	reader.Close()
	m.remount()
	mustEqualFile(t, p, want)
}

// TestPinnedFileStale: a catalog read is stale when the file it found was
// unpinned after the read began (its last commit may be newer than the
// record), or when too many files were unpinned to tell.
func TestPinnedFileStale(t *testing.T) {
	f := &FS{pins: pinSet{files: map[uint64]*fileNode{}}}
	file := func(ino uint64) *fileNode {
		n := &fileNode{nodeBase: nodeBase{fsys: f}}
		n.attr.Ino = ino
		return n
	}
	pinned := file(100)
	f.pin(pinned)
	for _, tc := range []struct {
		name      string
		unpin     []uint64 // files unpinned after the read began
		ino       uint64
		wantFile  bool
		wantStale bool
	}{
		{"pinned", nil, 100, true, false},
		{"pinned, others unpinned", []uint64{1, 2}, 100, true, false},
		{"never pinned, nothing unpinned", nil, 7, false, false},
		{"others unpinned", []uint64{1, 2, 3}, 7, false, false},
		{"unpinned since", []uint64{1, 7, 3}, 7, false, true},
		{"too many unpinned to tell", make([]uint64, recentUnpins), 7, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := f.pinEpoch()
			for _, ino := range tc.unpin {
				n := file(ino)
				f.pin(n)
				f.unpinIfSettled(n)
			}
			n, stale := f.pinnedFile(tc.ino, since)
			if (n != nil) != tc.wantFile || stale != tc.wantStale {
				t.Fatalf("pinnedFile(%d) = %v, stale %v; want file %v, stale %v", tc.ino, n, stale, tc.wantFile, tc.wantStale)
			}
		})
	}
}

// TestDirMtimePersists: a create changes its directory's mtime and ctime,
// and the change outlives the directory's node (a remount): the first commit
// of the file writes the directory's record with its entry.
func TestDirMtimePersists(t *testing.T) {
	m := newMount(t)
	if err := os.Mkdir(m.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(m.path("d"), old, old); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, m.path("d/f"), []byte("x"))
	before, err := os.Stat(m.path("d"))
	if err != nil {
		t.Fatal(err)
	}
	if !before.ModTime().After(old) {
		t.Fatalf("mtime %v after a create, want later than %v", before.ModTime(), old)
	}
	m.remount()
	after, err := os.Stat(m.path("d"))
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("mtime %v after a remount, want %v", after.ModTime(), before.ModTime())
	}
}

// TestListThenStatNeedsNoLookups: a lister that reads a whole directory and
// then stats its entries (ls -l, du, rsync, os.walk + stat) gets their
// attributes with the listing (READDIRPLUS on every batch, not
// READDIRPLUS_AUTO, whose later batches come without them: mount.go), so
// the stats send no LOOKUP; every entry has its type, and its attributes
// are the committed ones.
func TestListThenStatNeedsNoLookups(t *testing.T) {
	const files = 3000
	m := mountWithNodeLimit(t, 1<<20) // no pruning: the count is the lookups
	dir := m.path("many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]os.FileMode{}
	for i := range files {
		name := fmt.Sprintf("f%05d", i)
		p := filepath.Join(dir, name)
		var err error
		switch i % 100 {
		case 7:
			err, kinds[name] = os.Mkdir(p, 0o700), os.ModeDir
		case 8:
			err, kinds[name] = os.Symlink("target", p), os.ModeSymlink
		default:
			err, kinds[name] = os.WriteFile(p, []byte(name), 0o600), 0
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	m.remount()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != files {
		t.Fatalf("listed %d entries, want %d", len(entries), files)
	}
	for _, e := range entries {
		if got, want := e.Type(), kinds[e.Name()]; got != want {
			t.Errorf("%s: type %v, want %v", e.Name(), got, want)
		}
	}
	listed := m.listedNodes()
	for _, e := range entries {
		info, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Type() != kinds[e.Name()] {
			t.Errorf("lstat %s: type %v, want %v", e.Name(), info.Mode().Type(), kinds[e.Name()])
		}
		if kinds[e.Name()] == 0 && info.Size() != int64(len(e.Name())) {
			t.Errorf("lstat %s: size %d, want %d", e.Name(), info.Size(), len(e.Name()))
		}
	}
	if looked := m.listedNodes() - listed; looked > files/100 {
		t.Errorf("stat of %d listed entries looked up %d of them: the listing did not carry their attributes", files, looked)
	}
}

// TestListingHasDotEntries: a listing holds "." and "..", as a local
// filesystem's does (ls -a showed neither), naming the directory and its
// parent, with inode numbers that are not 0 (the root's was).
func TestListingHasDotEntries(t *testing.T) {
	m := newMount(t)
	if err := os.MkdirAll(m.path("a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, m.path("a/b/f"), []byte("x"))
	for _, c := range []struct{ dir, up string }{{"a/b", "a"}, {"a", "."}, {".", "."}, {".ckptfs", "."}, {".ckptfs/manifests", ".ckptfs"}} {
		out, err := exec.Command("ls", "-a1i", m.path(c.dir)).Output()
		if err != nil {
			t.Fatal(err)
		}
		inos := map[string]uint64{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var ino uint64
			var name string
			if _, err := fmt.Sscan(line, &ino, &name); err == nil {
				inos[name] = ino
			}
		}
		wantUp := statOf(t, m.path(c.up)).Ino
		if c.dir == "." {
			wantUp = inos[".."] // the mount root's parent is the mountpoint's, outside
		}
		if inos["."] != statOf(t, m.path(c.dir)).Ino || inos["."] == 0 || inos[".."] != wantUp {
			t.Errorf("ls -a of %s: . is %d, .. is %d; want %d and %d\n%s", c.dir, inos["."], inos[".."],
				statOf(t, m.path(c.dir)).Ino, statOf(t, m.path(c.up)).Ino, out)
		}
	}
	if names, err := os.ReadDir(m.path("a/b")); err != nil || len(names) != 1 || names[0].Name() != "f" {
		t.Errorf("os.ReadDir: %v %v, want just f", names, err)
	}
	if names, err := os.ReadDir(m.path(".ckptfs")); err != nil || len(names) != 2 || names[0].Name() != "manifests" || names[1].Name() != "stats.json" {
		t.Errorf("os.ReadDir of .ckptfs: %v %v, want manifests and stats.json", names, err)
	}
	if st := statOf(t, m.path(".ckptfs")); st.Nlink != 3 {
		t.Errorf(".ckptfs has %d links, want 3 (it holds manifests/)", st.Nlink)
	}
}
