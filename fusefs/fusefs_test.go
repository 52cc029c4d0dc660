package fusefs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/posixtest"
)

// posixSkip lists the posixtest cases that do not apply, and why.
var posixSkip = map[string]string{
	"XAttr":      "extended attributes are disabled (DisableXAttrs: a GETXATTR per write otherwise)",
	"XAttrLarge": "extended attributes are disabled",
	// It expects two descriptors of one process to conflict, which POSIX record
	// locks never do (a plain ext4 directory fails it the same way); the kernel
	// handles locks locally on this mount, and TestLocksAcrossProcesses checks them.
	"FcntlFlockLocksFile": "POSIX locks are per process, not per descriptor",
}

func TestPosix(t *testing.T) {
	for name, fn := range posixtest.All {
		t.Run(name, func(t *testing.T) {
			if _, ok := posixSkip[name]; ok {
				return
			}
			m := newMount(t)
			fn(t, m.path("runs"))
		})
	}
}

func TestLocksAcrossProcesses(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/lock")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err != nil {
		t.Fatalf("lock: %v", err)
	}
	_, _, stderr, readLine := startClient(t, "lock-try", p)
	if got := readLine(); got != "EAGAIN" {
		t.Fatalf("another process locking a locked file: %q (stderr %s), want EAGAIN", got, stderr)
	}
}

func TestRoundTripSizes(t *testing.T) {
	cs := cas.DefaultChunkSize
	sizes := []int{0, 1, cs - 1, cs, cs + 1, 3*cs + 17, 100<<20 + 12345}
	m := newMount(t)
	for i, n := range sizes {
		data := randBytes(uint64(i+1), n)
		p := m.path(filepath.Join("runs", "f"+itoa(n)))
		mustWrite(t, p, data)
		mustEqualFile(t, p, data)
		st, err := os.Stat(p)
		if err != nil || st.Size() != int64(n) {
			t.Fatalf("stat %d: %v size %d", n, err, st.Size())
		}
	}
	m.remount()
	for i, n := range sizes {
		mustEqualFile(t, m.path(filepath.Join("runs", "f"+itoa(n))), randBytes(uint64(i+1), n))
	}
	if st := m.stats(); st.Files != int64(len(sizes)) {
		t.Fatalf("stats.files = %d, want %d", st.Files, len(sizes))
	}
}

func itoa(n int) string {
	return strings.TrimSpace(strings.ReplaceAll(time.Duration(n).String(), "ns", ""))
}

// TestRandomOffsetWrites writes blocks in random order, leaving holes, from
// several goroutines, and checks the result against a model.
func TestRandomOffsetWrites(t *testing.T) {
	m := newMount(t)
	const block, blocks = 37 * 1024, 100
	want := make([]byte, block*blocks+5)
	rng := rand.New(rand.NewSource(1))
	order := rng.Perm(blocks)
	skip := map[int]bool{3: true, 50: true, 51: true} // holes
	p := m.path("runs/sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ch := make(chan int)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range ch {
				data := randBytes(uint64(b+100), block)
				if _, err := f.WriteAt(data, int64(b*block)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for _, b := range order {
		if !skip[b] {
			copy(want[b*block:], randBytes(uint64(b+100), block))
			ch <- b
		}
	}
	close(ch)
	wg.Wait()
	// The tail: a write past the end extends the file over a hole.
	if _, err := f.WriteAt([]byte{1, 2, 3, 4, 5}, block*blocks); err != nil {
		t.Fatal(err)
	}
	copy(want[block*blocks:], []byte{1, 2, 3, 4, 5})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, p, want)
	m.remount()
	mustEqualFile(t, p, want)
}

// TestPresizedWriteRenameWhileOpen follows safetensors' newest writer: create a
// temp file, set its length, write, rename it into place while still open, close.
func TestPresizedWriteRenameWhileOpen(t *testing.T) {
	m := newMount(t)
	old := randBytes(7, 3<<20)
	final := m.path("runs/model.safetensors")
	mustWrite(t, final, old)
	data := randBytes(8, 5<<20+3)
	tmp := m.path("runs/.tmpAbC")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := f.WriteAt(data[off:min(off+1<<20, len(data))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	// Until close, the catalog still holds the old version (crash safety); the
	// namespace already shows the new file.
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, final, data)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp name still exists: %v", err)
	}
	m.remount()
	mustEqualFile(t, final, data)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp name exists after remount: %v", err)
	}
	if st := m.stats(); st.Files != 1 || st.LogicalBytes != int64(len(data)) {
		t.Fatalf("stats: files %d logical %d, want 1 and %d", st.Files, st.LogicalBytes, len(data))
	}
}

// TestOverwriteOldReaderKeepsOldBytes replaces a file by rename while another
// process has the old version open and mmapped.
func TestOverwriteOldReaderKeepsOldBytes(t *testing.T) {
	m := newMount(t)
	v1 := randBytes(1, 6<<20+11)
	v2 := randBytes(2, 6<<20+11)
	p := m.path("runs/ckpt.bin")
	mustWrite(t, p, v1)

	// An in-process descriptor read with read(2), and a subprocess that mmaps.
	oldFd, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer oldFd.Close()
	_, stdin, stderr, readLine := startClient(t, "mmap-hold", p)
	if got := readLine(); got != "ready" {
		t.Fatalf("client: %q (stderr %s)", got, stderr)
	}

	tmp := m.path("runs/ckpt.bin.tmp")
	mustWrite(t, tmp, v2)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, p, v2)

	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	want := sha(v1) + " " + sha(v1)
	if got := readLine(); got != want {
		t.Fatalf("old mmap reader saw %q, want the old version %q (v2 is %s)", got, want, sha(v2))
	}
	got := make([]byte, len(v1))
	if _, err := oldFd.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if sha(got) != sha(v1) {
		t.Fatalf("old descriptor reads new bytes")
	}
}

// TestOverwriteInPlaceOldReaderKeepsOldBytes overwrites a file in place
// (open with O_TRUNC, torch.save's pattern) while another process has it
// mmapped: the writer's version gets a new inode, the old one stays intact.
func TestOverwriteInPlaceOldReaderKeepsOldBytes(t *testing.T) {
	m := newMount(t)
	v1 := randBytes(11, 5<<20+7)
	v2 := randBytes(12, 3<<20+1)
	p := m.path("runs/model.pt")
	mustWrite(t, p, v1)
	st1, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	oldFd, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer oldFd.Close()
	client, stdin, stderr, readLine := startClient(t, "mmap-hold", p)
	if got := readLine(); got != "ready" {
		t.Fatalf("client: %q (stderr %s)", got, stderr)
	}
	for round, v := range [][]byte{v2, v1[:1000], v2} {
		mustWrite(t, p, v) // in place: O_WRONLY|O_CREAT|O_TRUNC
		mustEqualFile(t, p, v)
		if st, err := os.Stat(p); err != nil || st.Size() != int64(len(v)) {
			t.Fatalf("round %d: stat %v %v", round, err, st.Size())
		}
	}
	st2, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Sys().(*syscall.Stat_t).Ino == st1.Sys().(*syscall.Stat_t).Ino {
		t.Fatalf("the new version kept the old inode number")
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if got, want := readLine(), sha(v1)+" "+sha(v1); got != want {
		t.Fatalf("old mmap reader saw %q, want the old version %q", got, want)
	}
	got := make([]byte, len(v1))
	if _, err := oldFd.ReadAt(got, 0); err != nil || sha(got) != sha(v1) {
		t.Fatalf("old descriptor: %v, same=%v", err, sha(got) == sha(v1))
	}
	if st := m.stats(); st.Files != 1 || st.LogicalBytes != int64(len(v2)) {
		t.Fatalf("stats: files %d logical %d", st.Files, st.LogicalBytes)
	}
	oldFd.Close()
	if err := client.Wait(); err != nil { // its mapping must be gone before unmount
		t.Fatalf("client: %v", err)
	}
	m.remount()
	mustEqualFile(t, p, v2)
}

// TestOverwriteInPlace truncates and rewrites a committed file (torch.save's
// pattern) and appends to one.
func TestOverwriteInPlace(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/opt.pt")
	mustWrite(t, p, randBytes(1, 2<<20))
	v2 := randBytes(2, 1<<20+5)
	mustWrite(t, p, v2) // O_TRUNC
	mustEqualFile(t, p, v2)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, v2...), "tail"...)
	mustEqualFile(t, p, want)
	// A write into the middle of a committed file keeps the rest.
	f, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("MID"), 1000); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(want[1000:], "MID")
	mustEqualFile(t, p, want)
	m.remount()
	mustEqualFile(t, p, want)
}

func TestConcurrentWritersAndReaders(t *testing.T) {
	m := newMount(t)
	const files = 6
	var wg sync.WaitGroup
	for i := 0; i < files; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := m.path(filepath.Join("runs", "run-"+itoa(i)))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Error(err)
				return
			}
			for step := 0; step < 3; step++ {
				data := randBytes(uint64(i*10+step), 3<<20+i*1000)
				p := filepath.Join(dir, "step-"+itoa(step))
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Error(err)
					return
				}
				got, err := os.ReadFile(p)
				if err != nil || sha(got) != sha(data) {
					t.Errorf("%s: read back differs (%v)", p, err)
				}
				// Read another writer's finished file meanwhile.
				other := m.path(filepath.Join("runs", "run-"+itoa((i+1)%files), "step-0"))
				if got, err := os.ReadFile(other); err == nil {
					if sha(got) != sha(randBytes(uint64(((i+1)%files)*10), 3<<20+((i+1)%files)*1000)) {
						t.Errorf("%s: wrong bytes", other)
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	m.remount()
	for i := 0; i < files; i++ {
		for step := 0; step < 3; step++ {
			mustEqualFile(t, m.path(filepath.Join("runs", "run-"+itoa(i), "step-"+itoa(step))), randBytes(uint64(i*10+step), 3<<20+i*1000))
		}
	}
}

// TestRemountPersistence checks that the namespace and attributes survive.
func TestRemountPersistence(t *testing.T) {
	m := newMount(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(m.path("runs/r1/10/sub"), 0o750))
	mustWrite(t, m.path("runs/r1/10/config.json"), []byte(`{"a":1}`))
	mustWrite(t, m.path("runs/r1/10/sub/w.bin"), randBytes(3, 70000))
	must(os.Symlink("10", m.path("runs/r1/latest")))
	must(os.Chmod(m.path("runs/r1/10/config.json"), 0o600))
	mt := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	must(os.Chtimes(m.path("runs/r1/10/sub/w.bin"), mt, mt))
	must(os.Mkdir(m.path("other"), 0o700))
	must(os.Rename(m.path("runs/r1/10/sub"), m.path("other/moved")))
	must(os.MkdirAll(m.path("runs/gone/x"), 0o755))
	must(os.Remove(m.path("runs/gone/x")))
	must(os.Remove(m.path("runs/gone")))

	m.remount()
	mustEqualFile(t, m.path("runs/r1/10/config.json"), []byte(`{"a":1}`))
	mustEqualFile(t, m.path("other/moved/w.bin"), randBytes(3, 70000))
	mustEqualFile(t, m.path("runs/r1/latest/config.json"), []byte(`{"a":1}`))
	if target, err := os.Readlink(m.path("runs/r1/latest")); err != nil || target != "10" {
		t.Fatalf("readlink: %q %v", target, err)
	}
	st, err := os.Stat(m.path("runs/r1/10/config.json"))
	must(err)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode())
	}
	st, err = os.Stat(m.path("other/moved/w.bin"))
	must(err)
	if !st.ModTime().Equal(mt) {
		t.Fatalf("mtime %v, want %v", st.ModTime(), mt)
	}
	st, err = os.Stat(m.path("other"))
	must(err)
	if st.Mode().Perm() != 0o700 || !st.IsDir() {
		t.Fatalf("other: mode %v", st.Mode())
	}
	for _, gone := range []string{"runs/gone", "runs/r1/10/sub"} {
		if _, err := os.Stat(m.path(gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %v, want ENOENT", gone, err)
		}
	}
	ents, err := os.ReadDir(m.path("runs/r1"))
	must(err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "10,latest" {
		t.Fatalf("runs/r1 lists %v", names)
	}
}

// TestDedupIdenticalFiles is the foundation issue's acceptance check: one
// 64 MiB random file copied into two runs is stored once.
func TestDedupIdenticalFiles(t *testing.T) {
	m := newMount(t)
	data := randBytes(42, 64<<20)
	for _, run := range []string{"run-a", "run-b"} {
		if err := os.MkdirAll(m.path("runs/"+run+"/1"), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, m.path("runs/"+run+"/1/model.bin"), data)
	}
	st := m.stats()
	t.Logf("logical %d unique %d stored %d chunks %d", st.LogicalBytes, st.UniqueBytes, st.StoredBytes, st.Chunks)
	if st.LogicalBytes != 2*int64(len(data)) {
		t.Fatalf("logical_bytes %d, want %d", st.LogicalBytes, 2*len(data))
	}
	if st.UniqueBytes != int64(len(data)) {
		t.Fatalf("unique_bytes %d, want %d", st.UniqueBytes, len(data))
	}
	if float64(st.StoredBytes) > 0.55*float64(st.LogicalBytes) {
		t.Fatalf("stored_bytes %d > 0.55 × logical_bytes %d", st.StoredBytes, st.LogicalBytes)
	}
	// stored_bytes is the size of the object files, and of the objects
	// inline in the catalog (a commit's first small chunks).
	var onDisk int64
	filepath.Walk(filepath.Join(m.store, "objects"), func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			onDisk += info.Size()
		}
		return nil
	})
	if onDisk+st.InlineBytes != st.StoredBytes {
		t.Fatalf("object files hold %d bytes and the catalog %d inline, stored_bytes says %d", onDisk, st.InlineBytes, st.StoredBytes)
	}
}

func TestNamespaceErrors(t *testing.T) {
	m := newMount(t)
	long := strings.Repeat("x", 256)
	if err := os.WriteFile(m.path("runs/"+long), nil, 0o644); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("create long name: %v, want ENAMETOOLONG", err)
	}
	if err := os.Mkdir(m.path("runs/"+long), 0o755); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("mkdir long name: %v, want ENAMETOOLONG", err)
	}
	mustWrite(t, m.path("runs/"+long[:255]), []byte("ok")) // 255 is fine
	if err := os.MkdirAll(m.path("runs/d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m.path("runs/d")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir non-empty: %v, want ENOTEMPTY", err)
	}
	// A directory holding only an uncommitted (open) file is not empty either.
	f, err := os.Create(m.path("runs/d/e/open"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m.path("runs/d/e")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir with open file: %v, want ENOTEMPTY", err)
	}
	f.Close()
	if err := os.Rename(m.path("runs/d"), m.path("runs/d/e/inside")); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("rename into own subtree: %v, want EINVAL", err)
	}
}

func TestCtlIsReadOnly(t *testing.T) {
	m := newMount(t)
	isRO := func(err error) bool { return errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES) }
	if err := os.WriteFile(m.path(".ckptfs/new"), []byte("x"), 0o644); !isRO(err) {
		t.Errorf("create under .ckptfs: %v", err)
	}
	if err := os.WriteFile(m.path(".ckptfs/stats.json"), []byte("x"), 0o644); !isRO(err) {
		t.Errorf("write stats.json: %v", err)
	}
	if err := os.Mkdir(m.path(".ckptfs/d"), 0o755); !isRO(err) {
		t.Errorf("mkdir under .ckptfs: %v", err)
	}
	if err := os.Remove(m.path(".ckptfs/stats.json")); !isRO(err) {
		t.Errorf("unlink stats.json: %v", err)
	}
	if err := os.Rename(m.path(".ckptfs"), m.path("runs/ctl")); !isRO(err) {
		t.Errorf("rename .ckptfs: %v", err)
	}
	if err := os.Truncate(m.path(".ckptfs/stats.json"), 0); !isRO(err) {
		t.Errorf("truncate stats.json: %v", err)
	}
	if err := os.Mkdir(m.path(".ckptfs"), 0o755); !errors.Is(err, os.ErrExist) {
		t.Errorf("mkdir .ckptfs: %v, want EEXIST", err)
	}
	if m.stats().Files != 0 {
		t.Errorf("stats count files under .ckptfs")
	}
}

func TestStatfs(t *testing.T) {
	m := newMount(t)
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.path("runs"), &st); err != nil {
		t.Fatal(err)
	}
	var store syscall.Statfs_t
	if err := syscall.Statfs(m.store, &store); err != nil {
		t.Fatal(err)
	}
	if st.Blocks == 0 || st.Bsize == 0 || st.Blocks != store.Blocks || st.Namelen != 255 {
		t.Fatalf("statfs: blocks %d bsize %d namelen %d; store blocks %d", st.Blocks, st.Bsize, st.Namelen, store.Blocks)
	}
}

// TestFsyncAndUnlinkedOpenFile: fsync commits; an unlinked open file stays
// readable and leaves nothing in the catalog.
func TestFsyncAndUnlinkedOpenFile(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(5, 2<<20)
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if st := m.stats(); st.Files != 1 || st.LogicalBytes != int64(len(data)) {
		t.Fatalf("after fsync: files %d logical %d", st.Files, st.LogicalBytes)
	}
	d, err := os.Open(m.path("runs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync dir: %v", err)
	}
	d.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || sha(got) != sha(data) {
		t.Fatalf("unlinked open file: %v", err)
	}
	if _, err := f.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st := m.stats(); st.Files != 0 {
		t.Fatalf("unlinked file still counted: %d", st.Files)
	}
	m.remount()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unlinked file back after remount: %v", err)
	}
}

// TestCorruptChunkGivesEIO: a damaged object fails reads of its range with EIO,
// never wrong bytes, while the rest of the file and other files read fine.
// The victim is a content-defined chunk, so it lives in a pack beside the
// chunks around it, which must still read.
func TestCorruptChunkGivesEIO(t *testing.T) {
	m := newMount(t)
	cs := cas.DefaultChunkSize
	data := randBytes(9, 3*cs)
	mustWrite(t, m.path("runs/victim"), data)
	mustWrite(t, m.path("runs/other"), randBytes(10, cs))
	// The chunks the commit cut (content-defined for bytes of no known format).
	refs, _, err := IndexFile(context.Background(), bytes.NewReader(data), int64(len(data)), cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) < 3 {
		t.Fatalf("%d chunks", len(refs))
	}
	var start int64
	for _, r := range refs[:len(refs)/2] {
		start += int64(r.Len)
	}
	victim := refs[len(refs)/2]
	end := start + int64(victim.Len)
	m.unmount()
	if !flipChunkByte(t, m.store, victim.ID) {
		t.Fatal("the content-defined victim chunk is not in a pack")
	}
	m.mount()
	f, err := os.Open(m.path("runs/victim"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf[:1], start+1); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of the damaged chunk: %v, want EIO", err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil || !bytesEqual(buf, data[:4096]) {
		t.Fatalf("read before the damaged chunk: %v", err)
	}
	if end+4096 <= int64(len(data)) {
		// Page-aligned, past the damaged chunk's pages (readahead may still
		// touch it: a read failing there is not wrong bytes, but a success must
		// return the right ones).
		at := (end + 8191) &^ 4095
		if _, err := f.ReadAt(buf, at); err == nil && !bytesEqual(buf, data[at:at+4096]) {
			t.Fatalf("read after the damaged chunk returned wrong bytes")
		}
	}
	if _, err := os.ReadFile(m.path("runs/victim")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("whole-file read: %v, want EIO", err)
	}
	mustEqualFile(t, m.path("runs/other"), randBytes(10, cs))
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// TestReaderCloseDoesNotCommitAWriterHalfWay: until the writer closes, the
// catalog keeps the previous version, whatever other descriptors do.
func TestReaderCloseDoesNotCommitAWriterHalfWay(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/f")
	v1 := randBytes(1, 3<<20)
	mustWrite(t, p, v1)
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // on failure too: an open descriptor would hold the mount
	if _, err := w.Write(randBytes(2, 1<<20)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		r.Read(make([]byte, 100))
		r.Close()
	}
	if st := m.stats(); st.LogicalBytes != int64(len(v1)) {
		t.Fatalf("a reader's close committed the writer's half: logical_bytes %d, want %d", st.LogicalBytes, len(v1))
	}
	v2 := randBytes(3, 2<<20)
	if _, err := w.WriteAt(v2, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if st := m.stats(); st.LogicalBytes != int64(len(v2)) {
		t.Fatalf("after the writer's close: logical_bytes %d, want %d", st.LogicalBytes, len(v2))
	}
	mustEqualFile(t, p, v2)
}

// TestLateReleaseDoesNotCommitANewWriter: a writer's RELEASE can come long
// after its close (here a mapping keeps the description alive); by then a new
// writer may be half-way through the file, and that release must not commit
// the half. With a reader open, the first writer's version is a fork that has
// taken the file's name, and the new writer writes to it directly.
func TestLateReleaseDoesNotCommitANewWriter(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/f")
	mustWrite(t, p, randBytes(1, 1<<20))
	reader, err := os.Open(p) // makes the next write a fork
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	v2 := 2 << 20
	t.Setenv("CKPTFS_TEST_SEED", fmt.Sprint(2, v2)) // inherited by the client
	cmd, stdin, stderr, readLine := startClient(t, "write-hold", p)
	if got := readLine(); got != "ready" {
		t.Fatalf("client: %q (stderr %s)", got, stderr)
	}
	if st := m.stats(); st.LogicalBytes != int64(v2) {
		t.Fatalf("after the first writer's close: logical %d, want %d", st.LogicalBytes, v2)
	}
	w2, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if _, err := w2.Write(randBytes(3, 100000)); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("go\n"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client: %v %s", err, stderr)
	}
	// RELEASE is asynchronous: give it time to arrive and (wrongly) commit.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if st := m.stats(); st.LogicalBytes != int64(v2) {
			t.Fatalf("a late release committed the new writer's half: logical %d, want %d", st.LogicalBytes, v2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	v3 := randBytes(4, 3<<20)
	if _, err := w2.WriteAt(v3, 0); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, p, v3)
}

// TestForkedChildCloseDoesNotCommit: a child forked while a file is being
// written closes its copy of the descriptor at exec; that FLUSH must not
// commit the half-written file (data-loader workers fork during saves).
func TestForkedChildCloseDoesNotCommit(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/ckpt")
	v1 := randBytes(1, 1<<20)
	mustWrite(t, p, v1)
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A new file being created and pre-sized, too.
	w2, err := os.OpenFile(m.path("runs/new.tmp"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if err := w2.Truncate(3 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(randBytes(2, 300000)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := exec.Command("true").Run(); err != nil { // fork, exec: closes inherited copies
			t.Fatal(err)
		}
	}
	if st := m.stats(); st.Files != 1 || st.LogicalBytes != int64(len(v1)) {
		t.Fatalf("a child's close committed: files %d logical %d, want 1 and %d", st.Files, st.LogicalBytes, len(v1))
	}
	v2 := randBytes(3, 2<<20)
	if _, err := w.WriteAt(v2, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	if st := m.stats(); st.Files != 2 || st.LogicalBytes != int64(len(v2))+3<<20 {
		t.Fatalf("after the writers' closes: files %d logical %d", st.Files, st.LogicalBytes)
	}
	mustEqualFile(t, p, v2)
}

// TestStreamingIngestEdges: the ingest that follows writes must give the same
// bytes as ingesting at close whatever the write pattern: rewrites and
// truncation below what it consumed (it is discarded), gaps filled out of
// order, a pre-sized file.
func TestStreamingIngestEdges(t *testing.T) {
	const mb = 1 << 20
	cases := []struct {
		name string
		do   func(t *testing.T, f *os.File, want []byte) []byte
	}{
		{"sequential", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Write(want)
			return want
		}},
		{"rewrite below the cursor", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Write(want)
			time.Sleep(50 * time.Millisecond) // let the stream consume
			patch := randBytes(77, 3000)
			f.WriteAt(patch, 10)
			copy(want[10:], patch)
			return want
		}},
		{"truncate below the cursor, then grow", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Write(want)
			time.Sleep(50 * time.Millisecond)
			f.Truncate(int64(len(want) / 3))
			f.Seek(0, 2)
			tail := randBytes(78, 2*mb)
			f.Write(tail)
			return append(want[:len(want)/3:len(want)/3], tail...)
		}},
		{"gaps filled out of order", func(t *testing.T, f *os.File, want []byte) []byte {
			for _, i := range []int{3, 1, 0, 5, 2, 4} {
				f.WriteAt(want[i*len(want)/6:(i+1)*len(want)/6], int64(i*len(want)/6))
			}
			return want
		}},
		{"pre-sized, written in order", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Truncate(int64(len(want)))
			for off := 0; off < len(want); off += mb {
				f.WriteAt(want[off:min(off+mb, len(want))], int64(off))
			}
			return want
		}},
		{"read back while writing", func(t *testing.T, f *os.File, want []byte) []byte {
			half := len(want) / 2
			f.Write(want[:half])
			time.Sleep(50 * time.Millisecond) // let the stream store some chunks
			got := make([]byte, half)
			if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want[:half]) {
				t.Errorf("reading the staged half back: %v, equal %v", err, bytes.Equal(got, want[:half]))
			}
			f.Write(want[half:])
			return want
		}},
		{"truncated to zero and rewritten", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Write(randBytes(79, 5*mb))
			f.Truncate(0)
			f.WriteAt(want, 0)
			return want
		}},
		{"pre-sized, last block never written", func(t *testing.T, f *os.File, want []byte) []byte {
			f.Truncate(int64(len(want)))
			f.WriteAt(want[:len(want)-mb], 0)
			clear(want[len(want)-mb:])
			return want
		}},
	}
	m := newMount(t)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := m.path(fmt.Sprintf("runs/s%d", i))
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			want := c.do(t, f, randBytes(uint64(100+i), 9*mb+123))
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			mustEqualFile(t, p, want)
			// The committed chunks are exactly those of the final bytes.
			refs, _, err := IndexFile(context.Background(), bytes.NewReader(want), int64(len(want)), cas.DefaultChunkSize)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(m.dir, ".ckptfs", "manifests", fmt.Sprint(inoOfPath(t, p))))
			if err != nil {
				t.Fatal(err)
			}
			var mj ManifestJSON
			if err := json.Unmarshal(data, &mj); err != nil {
				t.Fatal(err)
			}
			if len(mj.Chunks) != len(refs) {
				t.Fatalf("manifest has %d chunks, ingesting the final bytes gives %d", len(mj.Chunks), len(refs))
			}
			for j := range refs {
				if mj.Chunks[j].ID != refs[j].ID.String() {
					t.Fatalf("chunk %d differs from ingesting the final bytes", j)
				}
			}
		})
	}
	m.remount()
	for i := range cases {
		got, err := os.ReadFile(m.path(fmt.Sprintf("runs/s%d", i)))
		if err != nil || len(got) == 0 {
			t.Fatalf("after remount: %v", err)
		}
	}
}

func inoOfPath(t *testing.T, p string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestAsyncCommit: with WithAsyncCommit, close returns before the commit;
// readers see the staged bytes, fsync waits for the commit, and unmount
// commits what is pending.
func TestAsyncCommit(t *testing.T) {
	m := newMount(t, WithAsyncCommit())
	for i := 0; i < 5; i++ {
		data := randBytes(uint64(i), 3<<20+i)
		p := m.path(fmt.Sprintf("runs/a%d", i))
		mustWrite(t, p, data)
		mustEqualFile(t, p, data) // staged or committed: the same bytes
	}
	f, err := os.OpenFile(m.path("runs/a4"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	f.Close()
	// fsync of a4 waited for its commit; the others were queued before it.
	waitFor(t, 10*time.Second, 20*time.Millisecond, func() bool { return m.stats().Files == 5 },
		func() string { return fmt.Sprintf("background commits did not land: %+v", m.stats()) })
	last := randBytes(99, 5<<20)
	mustWrite(t, m.path("runs/last"), last)
	m.remount() // commits what is pending before the store closes
	mustEqualFile(t, m.path("runs/last"), last)
	if st := m.stats(); st.Files != 6 {
		t.Fatalf("after remount: %d files", st.Files)
	}
}
