package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// manyFilesLayout is how buildManyFiles lays out its files: runs/run-R/step-S/
// holds filesPerStep files, the shape of checkpoint directories.
const (
	filesPerStep = 100
	stepsPerRun  = 100
	layoutChunks = 256  // distinct chunks the files share
	layoutChunk  = 4096 // bytes per chunk
)

// buildManyFiles creates, through the cas API (no FUSE), a store at dir
// holding n small files, each of one or two chunks out of a pool of
// layoutChunks, spread over directories as checkpoints are.
func buildManyFiles(t testing.TB, dir string, n int) {
	t.Helper()
	ctx := context.Background()
	s, err := cas.Open(dir, cas.Options{Objects: local.New(cas.ObjectsDir(dir), local.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	defer b.Release()
	refs := make([]cas.ChunkRef, layoutChunks)
	for i := range refs {
		if refs[i], err = b.Put(ctx, randBytes(uint64(i)+1<<32, layoutChunk)); err != nil {
			t.Fatal(err)
		}
	}
	var root cas.Node
	err = s.View(func(tx *cas.Tx) error {
		var ok bool
		root, ok, err = tx.Node(cas.RootIno)
		if !ok && err == nil {
			err = fmt.Errorf("no root")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	alloc := func() uint64 {
		ino, err := s.AllocIno()
		if err != nil {
			t.Fatal(err)
		}
		return ino
	}
	dirRec := func(ino uint64) cas.Node {
		return cas.Node{Ino: ino, Mode: syscall.S_IFDIR | 0o755, UID: root.UID, GID: root.GID, Atime: now, Mtime: now, Ctime: now}
	}
	runs := alloc()
	// The first transaction carries the batch.
	first := true
	commit := func(fn func(tx *cas.Tx) error) {
		if first {
			first = false
			err = s.Commit(ctx, b, fn)
		} else {
			err = s.Update(fn)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	commit(func(tx *cas.Tx) error {
		if err := tx.PutNode(dirRec(runs)); err != nil {
			return err
		}
		return tx.Link(cas.RootIno, "runs", runs)
	})
	// One transaction per run: its directory, its steps and their files.
	perRun := filesPerStep * stepsPerRun
	for r := 0; r*perRun < n; r++ {
		files := min(perRun, n-r*perRun)
		steps := (files + filesPerStep - 1) / filesPerStep
		run := alloc()
		stepInos := make([]uint64, steps)
		for i := range stepInos {
			stepInos[i] = alloc()
		}
		inos := make([]uint64, files)
		for i := range inos {
			inos[i] = alloc()
		}
		commit(func(tx *cas.Tx) error {
			if err := tx.PutNode(dirRec(run)); err != nil {
				return err
			}
			if err := tx.Link(runs, fmt.Sprintf("run-%03d", r), run); err != nil {
				return err
			}
			for st, stepIno := range stepInos {
				if err := tx.PutNode(dirRec(stepIno)); err != nil {
					return err
				}
				if err := tx.Link(run, fmt.Sprintf("step-%04d", st), stepIno); err != nil {
					return err
				}
			}
			for i, ino := range inos {
				k := r*perRun + i
				m := &cas.Manifest{Chunks: []cas.ChunkRef{refs[k%layoutChunks]}}
				if k%2 == 1 {
					m.Chunks = append(m.Chunks, refs[(k/2)%layoutChunks])
				}
				rec := cas.Node{Ino: ino, Mode: syscall.S_IFREG | 0o644, UID: root.UID, GID: root.GID,
					Size: m.Size(), Atime: now, Mtime: now, Ctime: now}
				if err := tx.PutNode(rec); err != nil {
					return err
				}
				if err := tx.PutManifest(ino, m); err != nil {
					return err
				}
				if err := tx.Link(stepInos[i/filesPerStep], fmt.Sprintf("file-%02d.bin", i%filesPerStep), ino); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// procMem is a process's memory, from /proc/PID/status.
type procMem struct {
	rss, anon, file int64 // VmRSS, RssAnon, RssFile: bytes
}

func (m procMem) String() string {
	return fmt.Sprintf("RSS %d MiB (anon %d, file %d)", m.rss>>20, m.anon>>20, m.file>>20)
}

// readProcMem reads process pid's memory.
func readProcMem(pid int) (procMem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	defer f.Close()
	var m procMem
	fields := map[string]*int64{"VmRSS:": &m.rss, "RssAnon:": &m.anon, "RssFile:": &m.file}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for name, dst := range fields {
			v, ok := strings.CutPrefix(sc.Text(), name)
			if !ok {
				continue
			}
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return m, fmt.Errorf("%s %q: %v", name, v, err)
			}
			*dst = kb << 10
		}
	}
	if m.rss == 0 {
		return m, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, sc.Err()
}

func mustProcMem(t testing.TB, pid int) procMem {
	t.Helper()
	m, err := readProcMem(pid)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// rssSampler records the peaks of a process's memory while it runs (each
// figure's own: the peak anon need not be at the peak RSS).
type rssSampler struct {
	stop chan struct{}
	done chan procMem
	err  error
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan procMem, 1)}
	go func() {
		var peak procMem
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			m, err := readProcMem(pid)
			if err != nil && s.err == nil {
				s.err = err
			}
			peak = procMem{rss: max(peak.rss, m.rss), anon: max(peak.anon, m.anon), file: max(peak.file, m.file)}
			select {
			case <-s.stop:
				s.done <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// peak stops the sampler and returns the highest figures it saw.
func (s *rssSampler) peak(t testing.TB) procMem {
	t.Helper()
	close(s.stop)
	peak := <-s.done
	if s.err != nil {
		t.Fatalf("sample RSS: %v", s.err)
	}
	return peak
}

// statTree stats every entry under dir, the way `find DIR | xargs stat` does
// (find lists and lstats; stat stats each name again), and returns how many
// entries it saw.
func statTree(t testing.TB, dir string) int {
	t.Helper()
	find := exec.Command("find", dir, "-printf", "%p %s %m %U %T@\n")
	out, err := find.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := find.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var statErr error
	seen := 0
	names := make(chan string, 256)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range names {
				var st syscall.Stat_t
				if err := syscall.Stat(p, &st); err != nil {
					mu.Lock()
					statErr = err
					mu.Unlock()
				}
			}
		}()
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		names <- line[:strings.IndexByte(line, ' ')]
		seen++
	}
	close(names)
	wg.Wait()
	if err := find.Wait(); err != nil {
		t.Fatalf("find %s: %v", dir, err)
	}
	if statErr != nil {
		t.Fatalf("stat: %v", statErr)
	}
	return seen
}

// memFiles is how many files TestDaemonMemoryManyFiles walks:
// $CKPTFS_MEM_FILES (to measure other sizes), 100k by default.
func memFiles(t testing.TB) int {
	if s := os.Getenv("CKPTFS_MEM_FILES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("CKPTFS_MEM_FILES=%q", s)
		}
		return n
	}
	return 100_000
}

// nodeMemoryBound is what the daemon's own memory (RssAnon) may be beside
// its chunk cache after a walk over a store of any size, and while it
// checks one (issues #17, #27): the nodes the kernel keeps looked up (at
// most the node limit, 16,384 here, about 2 KiB each), fsck's sets, and the
// Go heap's slack. 45 to 57 MiB were measured at 10⁵ files.
const nodeMemoryBound = 72 << 20

// TestDaemonMemoryManyFiles: the daemon's own memory (RssAnon) after a find
// + stat over 100k files, and while it runs fsck over them, stays within
// nodeMemoryBound of its chunk cache; "cache" is what the daemon reports its
// chunk cache holds (stats.json's cache_bytes), not its budget: the walk
// reads no file, so the cache stays near empty. The pages of the catalog's
// mapping the daemon has touched (RssFile: the whole catalog, about 70 MiB
// here, since bbolt reads every page at open) grow with the catalog and are
// the page cache's to reclaim (the cgroup test puts them under pressure):
// they are checked to be no more than the catalog file. The bound was on
// VmRSS, both together, until the catalog's growth (50 MiB when it was set)
// left fsck's peak within a MiB of it on a loaded machine.
func TestDaemonMemoryManyFiles(t *testing.T) {
	n := memFiles(t)
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	start := time.Now()
	buildManyFiles(t, store, n)
	t.Logf("built a store of %d files in %v", n, time.Since(start).Round(time.Millisecond))

	d := startDaemon(t, store, mnt)
	pid := d.cmd.Process.Pid
	idle := mustProcMem(t, pid)
	start = time.Now()
	seen := statTree(t, mnt)
	walk := time.Since(start)
	// Directories: runs, one per run, one per step; the root; .ckptfs and its two.
	steps := (n + filesPerStep - 1) / filesPerStep
	if want := n + steps + (steps+stepsPerRun-1)/stepsPerRun + 1 + 1 + 3; seen != want {
		t.Fatalf("find saw %d entries, want %d", seen, want)
	}
	after := mustProcMem(t, pid)
	cache := statsJSON(t, mnt)["cache_bytes"]
	t.Logf("%d files: idle %v; after find+stat (%v) %v; cache %d MiB",
		n, idle, walk.Round(time.Millisecond), after, cache>>20)
	catalogSize := fileSize(t, filepath.Join(store, "catalog.db"))
	check := func(when string, m procMem) {
		t.Helper()
		if m.anon-cache > nodeMemoryBound {
			t.Errorf("%s over %d files the daemon's own memory is %d MiB, %d MiB above its cache (bound %d MiB)",
				when, n, m.anon>>20, (m.anon-cache)>>20, nodeMemoryBound>>20)
		}
		if m.file > catalogSize+16<<20 { // and the binary's own pages
			t.Errorf("%s over %d files the daemon maps %d MiB of files, more than its catalog (%d MiB)",
				when, n, m.file>>20, catalogSize>>20)
		}
	}
	t.Logf("catalog %d MiB", catalogSize>>20)
	check("after find+stat", after)

	sampler := sampleRSS(pid, 10*time.Millisecond)
	start = time.Now()
	code, out, errOut := ckptfs(t, "fsck", mnt)
	peak := sampler.peak(t)
	cache = statsJSON(t, mnt)["cache_bytes"]
	if code != 0 {
		t.Fatalf("fsck through the daemon: exit %d\n%s%s", code, out, errOut)
	}
	if want := fmt.Sprintf("checked %d files", n); !strings.Contains(out, want) {
		t.Fatalf("fsck output lacks %q:\n%s", want, out)
	}
	t.Logf("fsck in the daemon (%v): peak %v; cache %d MiB", time.Since(start).Round(time.Millisecond), peak, cache>>20)
	check("during fsck", peak)
	d.stop(syscall.SIGTERM)
}

// TestWriteMemoryFlag: --write-memory sets the memory of files being
// written (the daemon says so, and raises its Go limit by what it adds
// beyond the default); with room for two streams, four files written at
// once, the later ones staged on disk, all read back exact after a remount.
func TestWriteMemoryFlag(t *testing.T) {
	dir := t.TempDir()
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, store, mnt, "--write-memory", "48MiB")
	if log := d.stderr.String(); !strings.Contains(log, "write memory 48 MiB (--write-memory)") {
		t.Fatalf("the daemon does not report the flag's write memory: %s", log)
	}
	if err := os.MkdirAll(filepath.Join(mnt, "runs"), 0o755); err != nil {
		t.Fatal(err)
	}
	const files, size, piece = 4, 24 << 20, 1 << 20
	want := make([][]byte, files)
	fs := make([]*os.File, files)
	for i := range fs {
		want[i] = randBytes(uint64(100+i), size)
		f, err := os.Create(filepath.Join(mnt, "runs", fmt.Sprintf("rank%d.bin", i)))
		if err != nil {
			t.Fatal(err)
		}
		fs[i] = f
	}
	for off := 0; off < size; off += piece { // interleaved, as ranks write
		for i, f := range fs {
			if _, err := f.Write(want[i][off : off+piece]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range fs {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	d.stop(syscall.SIGTERM)
	startDaemon(t, store, mnt)
	for i := range fs {
		got, err := os.ReadFile(filepath.Join(mnt, "runs", fmt.Sprintf("rank%d.bin", i)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Errorf("rank%d.bin reads back %d bytes, not the %d written", i, len(got), len(want[i]))
		}
	}
}

// fileSize is the size of file p.
func fileSize(t testing.TB, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}
