package test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/test/powerloss"
)

// The power-loss suite: the store lives on a powerloss.Disk (a FUSE
// filesystem that forgets, at a simulated power cut, every write not made
// durable), the real daemon serves it, and each cycle cuts the power at a
// random request (while files are written, renamed, unlinked, collected and
// re-encoded, or while the daemon mounts and recovers), then remounts on what
// survived and checks: every file whose close, fsync or rename returned holds
// exactly what was written (or a later version whose operation was cut
// short), nothing half-written is visible, fsck --read-data is clean.

// plVersion is one content a path may hold; the zero value means absent.
type plVersion struct {
	seed uint64
	size int  // bytes of a blob, tensors of a safetensors file
	st   bool // a safetensors file (tensor-aligned chunks, BF16 hints)
	// base, when set, is the version this one is a training step of: its
	// bytes with small changes (same layout), which the store codes as
	// deltas against base's chunks (issue #15).
	base *plVersion
}

// stepOf returns a new version of the same layout as v that differs from it
// by small changes, or a fresh version when v's chain is already deep.
func stepOf(v plVersion, seed uint64) (plVersion, bool) {
	depth := 0
	for b := v.base; b != nil; b = b.base {
		depth++
	}
	// Safetensors files only: their chunks are tensor-aligned, so a step
	// keeps their boundaries (a blob's content-defined ones move).
	if v == plAbsent || !v.st || depth >= 3 {
		return v, false
	}
	return plVersion{seed: seed, size: v.size, st: v.st, base: &v}, true
}

var plAbsent = plVersion{}

// bytes returns the version's content: compressible (half of every byte
// pair is random), so that the codecs and the re-encoder have work.
func (v plVersion) bytes() []byte {
	if v == plAbsent {
		return nil
	}
	rng := rand.New(rand.NewSource(int64(v.seed)))
	if v.base != nil {
		// The base's bytes, with the low bits of half of the data's
		// bytes changed (not the safetensors header: its offsets stay).
		b := v.base.bytes()
		start := 0
		if v.st {
			start = 8 + int(binary.LittleEndian.Uint64(b))
		}
		for i := start; i < len(b); i += 2 {
			if rng.Intn(2) == 0 {
				b[i] ^= byte(1 + rng.Intn(3))
			}
		}
		return b
	}
	fill := func(b []byte) {
		for i := range b {
			if i%2 == 0 {
				b[i] = byte(rng.Intn(256))
			} else {
				b[i] = 0x3c + byte(rng.Intn(4))
			}
		}
	}
	if !v.st {
		b := make([]byte, v.size)
		fill(b)
		return b
	}
	type entry struct {
		Dtype   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets [2]int `json:"data_offsets"`
	}
	header := map[string]entry{}
	var data []byte
	for i := 0; i < v.size; i++ {
		n := 1 + rng.Intn(24<<10) // elements
		t := make([]byte, 2*n)
		fill(t)
		header[fmt.Sprintf("layer%d.weight", i)] = entry{"BF16", []int{n}, [2]int{len(data), len(data) + len(t)}}
		data = append(data, t...)
	}
	h, _ := json.Marshal(header) // cannot fail: plain structs
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), data...)
}

func (v plVersion) String() string {
	if v == plAbsent {
		return "absent"
	}
	var s string
	if v.st {
		s = fmt.Sprintf("safetensors(seed %d, %d tensors)", v.seed, v.size)
	} else {
		s = fmt.Sprintf("blob(seed %d, %d bytes)", v.seed, v.size)
	}
	if v.base != nil {
		s += " step of " + v.base.String()
	}
	return s
}

// plModel is what each path may hold: its committed version (whose close,
// fsync or rename returned), and the versions of operations the power cut
// short, which may or may not have become durable.
type plModel struct {
	mu    sync.Mutex
	paths map[string]*plPath
}

type plPath struct {
	committed plVersion
	inflight  []plVersion
	history   []string // the last operations that returned, newest last (for messages)
	earlier   []plVersion
}

func (m *plModel) begin(p string, v plVersion) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paths[p].inflight = append(m.paths[p].inflight, v)
}

func (m *plModel) done(p string, v plVersion) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.paths[p]
	st.earlier = append(st.earlier, st.committed)
	if len(st.earlier) > 8 {
		st.earlier = st.earlier[1:]
	}
	st.committed, st.inflight = v, nil
}

// note records what the last operation on p was, for messages.
func (m *plModel) note(p, op string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.paths[p]
	st.history = append(st.history, op)
	if len(st.history) > 8 {
		st.history = st.history[1:]
	}
}

// plWorkers is how many processes write at once; each owns plFiles paths.
const (
	plWorkers = 3
	plFiles   = 4
)

func plPathName(worker, file int) string { return fmt.Sprintf("runs/w%d/f%d", worker, file) }

// plOnlyEnv, when set, restricts the workload to two kinds of operations on
// a path: written under a temporary name and renamed over it, and written in
// place and fsync'd (the pair that once lost fsync'd versions: a RELEASE of
// the first's handle committed the second's content, see fusefs's
// commitAtRelease). A focused reproduction, not the suite.
const plOnlyEnv = "CKPTFS_PL_ONLY"

// run performs ops operations on worker's paths, stopping at the first that
// fails (the power was cut: the daemon gets EIO from its store, or is dead).
// An operation that fails before the power is cut is returned as an error.
func (m *plModel) run(mnt string, worker int, rng *rand.Rand, ops int, down func() bool) error {
	only := os.Getenv(plOnlyEnv) != ""
	if err := os.MkdirAll(filepath.Join(mnt, fmt.Sprintf("runs/w%d", worker)), 0o755); err != nil {
		return plFailure(down, "mkdir", err)
	}
	for i := 0; i < ops; i++ {
		p := plPathName(worker, rng.Intn(plFiles))
		full := filepath.Join(mnt, p)
		v := plVersion{seed: rng.Uint64()}
		if rng.Intn(2) == 0 {
			v.st, v.size = true, 1+rng.Intn(6)
		} else {
			v.size = 1 + rng.Intn(160<<10)
		}
		if rng.Intn(3) != 0 { // a training step of what the path holds
			m.mu.Lock()
			if w, ok := stepOf(m.paths[p].committed, v.seed); ok {
				v = w
			}
			m.mu.Unlock()
		}
		var err error
		opName := ""
		op := rng.Intn(20)
		if only {
			op = []int{0, 14}[rng.Intn(2)] // via-rename or fsync
		}
		switch {
		case op < 7: // temp file, sized, written, renamed while open, closed (safetensors)
			m.begin(p, v)
			opName = "via-rename " + v.String()
			err = writeViaRename(full, v.bytes())
		case op < 13: // in place with O_TRUNC (torch.save)
			m.begin(p, v)
			opName = "o_trunc " + v.String()
			err = os.WriteFile(full, v.bytes(), 0o644)
		case op < 16: // written, fsync'd, then closed
			m.begin(p, v)
			opName = "fsync " + v.String()
			err = writeSynced(full, v.bytes())
		case op < 18: // unlinked
			v = plAbsent
			opName = "unlink"
			m.begin(p, v)
			err = os.Remove(full)
			if errors.Is(err, os.ErrNotExist) {
				err = nil
			}
		default: // renamed over another path of the worker
			q := plPathName(worker, rng.Intn(plFiles))
			if q == p {
				continue
			}
			m.mu.Lock()
			src := m.paths[p].committed
			m.mu.Unlock()
			if src == plAbsent {
				continue
			}
			m.begin(p, plAbsent)
			m.begin(q, src)
			err = os.Rename(full, filepath.Join(mnt, q))
			if err == nil {
				m.done(q, src)
				m.note(q, "renamed from "+p)
			}
			opName = "renamed to " + q
			v = plAbsent
		}
		if err != nil {
			return plFailure(down, p, err)
		}
		m.done(p, v)
		m.note(p, opName)
	}
	return nil
}

// plFailure is nil when the power was cut (the operation was meant to
// fail), else err.
func plFailure(down func() bool, what string, err error) error {
	if down() {
		return nil
	}
	return fmt.Errorf("%s failed with the power on: %w", what, err)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// verify checks every path after a remount and adopts what it found as the
// committed state. It returns what is wrong, and how many paths held their
// committed version and how many a version of an operation cut short.
func (m *plModel) verify(mnt string) (bad []string, committed, cutShort int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.paths))
	for p := range m.paths {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		st := m.paths[p]
		got, err := os.ReadFile(filepath.Join(mnt, p))
		exists := err == nil
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			bad = append(bad, fmt.Sprintf("%s: %v (committed %v, in flight %v)", p, err, st.committed, st.inflight))
			st.committed, st.inflight = plAbsent, nil
			os.Remove(filepath.Join(mnt, p)) // so that later cycles start from a known state
			continue
		}
		var match *plVersion
		for i, v := range append([]plVersion{st.committed}, st.inflight...) {
			if (v == plAbsent && !exists) || (v != plAbsent && exists && bytes.Equal(got, v.bytes())) {
				match = &v
				if i == 0 {
					committed++
				} else {
					cutShort++
				}
				break
			}
		}
		if match == nil {
			what := ""
			for k := len(st.earlier) - 1; k >= 0 && exists; k-- {
				if v := st.earlier[k]; v != plAbsent && bytes.Equal(got, v.bytes()) {
					what = fmt.Sprintf(": the version committed %d operations earlier", len(st.earlier)-k)
					break
				}
			}
			bad = append(bad, fmt.Sprintf("%s: holds %d bytes (exists %v)%s; committed %v, in flight %v; last operations %v",
				p, len(got), exists, what, st.committed, st.inflight, st.history))
			st.committed, st.inflight = plAbsent, nil
			os.Remove(filepath.Join(mnt, p))
			continue
		}
		st.committed, st.inflight = *match, nil
		st.history = append(st.history, "(power cut, remount)")
		if len(st.history) > 8 {
			st.history = st.history[1:]
		}
	}
	// Nothing else is visible: no temporary names, nothing half-made.
	for w := 0; w < plWorkers; w++ {
		ents, err := os.ReadDir(filepath.Join(mnt, fmt.Sprintf("runs/w%d", w)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			bad = append(bad, fmt.Sprintf("runs/w%d: %v", w, err))
			continue
		}
		for _, e := range ents {
			if _, ok := m.paths[fmt.Sprintf("runs/w%d/%s", w, e.Name())]; !ok {
				bad = append(bad, fmt.Sprintf("runs/w%d/%s: visible after the crash, never committed", w, e.Name()))
				os.Remove(filepath.Join(mnt, fmt.Sprintf("runs/w%d", w), e.Name()))
			}
		}
	}
	return bad, committed, cutShort
}

// plServer builds the disk's server (cmd plserve) without the race
// detector: every request of the daemon's store goes through it.
func plServer(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "plserve")
	if out, err := exec.Command("go", "build", "-o", bin, "./powerloss/plserve").CombinedOutput(); err != nil {
		t.Fatalf("build plserve: %v\n%s", err, out)
	}
	return bin
}

// plDaemon starts `bin mount store mnt`; unlike startDaemon, a mount that
// fails (the power was cut under it) is an error, not a test failure.
func plDaemon(t *testing.T, bin, store, mnt string, env []string, extra ...string) (*daemon, error) {
	cmd := exec.Command(bin, append(append([]string{"mount"}, extra...), store, mnt)...)
	cmd.Env = append(os.Environ(), env...)
	return launch(t, cmd, store, mnt, 20*time.Second)
}

// run runs bin with args, returning its exit code and output.
func plRun(bin string, env []string, args ...string) (int, string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		return -1, err.Error()
	}
	return 0, string(out)
}

// plOptions configure a power-loss run.
type plOptions struct {
	bin     string   // the ckptfs binary
	env     []string // its environment, added
	crashes int
	seed    int64
	// workerOps is how many file operations each writer does per cycle.
	workerOps int
}

// plReport is what a run saw.
type plReport struct {
	crashes       int
	byMode        [2]int
	mountCrashes  int // cut while the daemon mounted (recovering)
	idleCrashes   int // cut in idle time after the writers (re-encodes, gc)
	checks        int // path checks after remounts
	committedSeen int // of those, a version whose operation returned
	inflightSeen  int // of those, a version whose operation was cut short
	badCycles     int // cycles after which something was lost, changed or visible
	badFiles      int
	fsckBad       int // cycles after which fsck failed
	firstBad      []string
	stopped       string // why the run ended early: the store failed with the power on
	disk          powerloss.Stats
	gcRuns        int
	deltaChecks   int // checks that found delta chunks in the store
	deltaMax      int // the most delta chunks a check found
	packChecks    int // checks that found packs of small chunks in the store
	packMax       int // the most packs a check found
}

func (r *plReport) String() string {
	return fmt.Sprintf("%d power cuts (%d drop-all, %d partial; %d while mounting, %d in idle time after the writers); "+
		"%d path checks (%d committed versions, %d cut-short versions found); %d gc runs; "+
		"%d checks with delta chunks in the store (at most %d), %d with packs (at most %d); disk: %d requests, %d file syncs, %d dir syncs, %d renames over a name; "+
		"lost at the cuts: %d unsynced pages and %d namespace changes (kept %d and %d); "+
		"%d cycles lost or changed %d committed files, fsck failed after %d%s",
		r.crashes, r.byMode[0], r.byMode[1], r.mountCrashes, r.idleCrashes,
		r.checks, r.committedSeen, r.inflightSeen, r.gcRuns, r.deltaChecks, r.deltaMax, r.packChecks, r.packMax, r.disk.Ops, r.disk.FileSyncs, r.disk.DirSyncs, r.disk.RenamesOver,
		r.disk.LostPages, r.disk.LostNsOps, r.disk.KeptPages, r.disk.KeptNsOps,
		r.badCycles, r.badFiles, r.fsckBad, map[bool]string{true: "; stopped: " + r.stopped}[r.stopped != ""])
}

// powerLossRun runs opts.crashes cycles. Failures of the harness itself end
// the test; what the store loses is counted in the report.
func powerLossRun(t *testing.T, opts plOptions) *plReport {
	if os.Geteuid() != 0 {
		t.Fatal("the power-loss suite mounts FUSE filesystems with mount(2): run it as root")
	}
	rng := rand.New(rand.NewSource(opts.seed))
	diskDir, mnt := t.TempDir(), t.TempDir()
	store := filepath.Join(diskDir, "store")
	disk, err := powerloss.StartChild(plServer(t), diskDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disk.Close() })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// down asks whether the power is cut (the notice, Crashed, may come
	// after a failure it caused).
	down := func() bool {
		st, err := disk.Stats()
		return err != nil || st.Down
	}
	ops := func() int64 {
		t.Helper()
		st, err := disk.Stats()
		must(err)
		return st.Ops
	}
	model := &plModel{paths: map[string]*plPath{}}
	for w := 0; w < plWorkers; w++ {
		for f := 0; f < plFiles; f++ {
			model.paths[plPathName(w, f)] = &plPath{}
		}
	}
	rep := &plReport{}
	// Requests a mount, the writers and the idle time after them take
	// (estimates from the cycles that were not cut short there).
	var mountOps, writeOps, idleOps int64

	check := func(cycle int) {
		bad, committed, cutShort := model.verify(mnt)
		rep.checks += plWorkers * plFiles
		rep.committedSeen += committed
		rep.inflightSeen += cutShort
		if b, err := os.ReadFile(filepath.Join(mnt, ".ckptfs", "stats.json")); err == nil {
			var st struct {
				Deltas int `json:"delta_chunks"`
				Packs  int `json:"packs"`
			}
			if json.Unmarshal(b, &st) == nil {
				rep.deltaChecks += min(st.Deltas, 1)
				rep.deltaMax = max(rep.deltaMax, st.Deltas)
				rep.packChecks += min(st.Packs, 1)
				rep.packMax = max(rep.packMax, st.Packs)
			}
		}
		code, out := plRun(opts.bin, opts.env, "fsck", "--read-data", mnt)
		if code != 0 { // fsck exits non-zero when it finds a problem
			rep.fsckBad++
			bad = append(bad, "fsck: "+strings.TrimSpace(out))
			// Drop the index rows of lost objects, so later cycles count anew.
			plRun(opts.bin, opts.env, "gc", "--grace", "0", mnt)
		}
		if len(bad) > 0 {
			rep.badCycles++
			for _, b := range bad {
				if !strings.HasPrefix(b, "fsck") {
					rep.badFiles++
				}
			}
			if rep.firstBad == nil {
				rep.firstBad = append([]string{fmt.Sprintf("after power cut %d:", cycle)}, bad...)
			}
		}
	}

	for cycle := 0; cycle < opts.crashes; cycle++ {
		must(disk.Mount())
		mode := powerloss.Mode(cycle % 2)
		seed := rng.Int63()
		var args []string
		if rng.Intn(2) == 0 {
			args = append(args, "--inline-encoders=-1") // every new chunk raw, re-encoded when idle
		}
		cutMount := cycle > 0 && mountOps > 0 && rng.Intn(8) == 0
		if cutMount {
			must(disk.CrashAfter(1+rng.Int63n(mountOps), mode, seed))
		}
		before := ops()
		d, err := plDaemon(t, opts.bin, store, mnt, opts.env, args...)
		if err != nil {
			// Asked, not awaited: the notice of the cut may come after
			// the daemon's failure.
			if !down() {
				rep.stopped = fmt.Sprintf("after power cut %d, the mount failed: %s", cycle, firstLine(err.Error()))
				return rep
			}
		}
		if !cutMount {
			mountOps = ops() - before
			check(cycle)
			// The workload: writers and a collection or two, then, in one
			// cycle of four, idle time for the re-encoder. The power is cut
			// at a random request of the phase the cycle aims at (in the
			// first cycle, which measures, and when the writers finish
			// before the target, at their end).
			idleCycle := writeOps > 0 && idleOps > 0 && rng.Intn(4) == 0
			if writeOps > 0 && !idleCycle {
				must(disk.CrashAfter(1+rng.Int63n(writeOps), mode, seed))
			}
			start := ops()
			var wg sync.WaitGroup
			errs := make(chan error, plWorkers)
			for w := 0; w < plWorkers; w++ {
				wg.Add(1)
				wrng := rand.New(rand.NewSource(rng.Int63()))
				go func() {
					defer wg.Done()
					if err := model.run(mnt, w, wrng, opts.workerOps, down); err != nil {
						errs <- err
					}
				}()
			}
			gcs := rng.Intn(3)
			rep.gcRuns += gcs
			wg.Add(1)
			gcDelay := time.Duration(rng.Intn(300)) * time.Millisecond
			go func() {
				defer wg.Done()
				for i := 0; i < gcs; i++ {
					time.Sleep(gcDelay)
					plRun(opts.bin, opts.env, "gc", "--grace", "0", mnt)
				}
			}()
			wg.Wait()
			close(errs)
			for err := range errs {
				d.kill()
				rep.stopped = fmt.Sprintf("before power cut %d: %v\n%s", cycle, err, d.stderr)
				return rep
			}
			written := ops()
			if !down() {
				if n := written - start; writeOps == 0 {
					writeOps = max(1, n)
				} else {
					writeOps = max(1, (writeOps+n+1)/2)
				}
				switch {
				case idleCycle:
					rep.idleCrashes++
					must(disk.CrashAfter(1+rng.Int63n(idleOps), mode, seed))
				case idleOps > 0:
					must(disk.Crash(mode, seed))
				}
				select {
				case <-disk.Crashed():
				case <-time.After(1200 * time.Millisecond): // the re-encoder starts after 500 ms
					idleOps = max(1, (idleOps+ops()-written+1)/2)
					must(disk.Crash(mode, seed))
				}
			}
		} else {
			rep.mountCrashes++
			if d != nil {
				// The mount survived the cut (it came after the mount's last
				// request): the cut happens now.
				must(disk.Crash(mode, seed))
			}
		}
		<-disk.Crashed()
		rep.crashes++
		rep.byMode[mode]++
		if d != nil {
			d.kill()
		}
		must(disk.Unmount())
		st, err := disk.Stats()
		must(err)
		rep.disk.Ops += st.Ops
		rep.disk.FileSyncs += st.FileSyncs
		rep.disk.DirSyncs += st.DirSyncs
		rep.disk.RenamesOver += st.RenamesOver
		rep.disk.LostPages += st.LostPages
		rep.disk.KeptPages += st.KeptPages
		rep.disk.LostNsOps += st.LostNsOps
		rep.disk.KeptNsOps += st.KeptNsOps
		must(disk.Reboot())
	}
	// The last remount: everything checked once more.
	must(disk.Mount())
	d, err := plDaemon(t, opts.bin, store, mnt, opts.env)
	if err != nil {
		rep.stopped = fmt.Sprintf("after the last power cut, the mount failed: %s", firstLine(err.Error()))
		return rep
	}
	check(opts.crashes)
	d.stop(syscall.SIGTERM)
	return rep
}

// TestPowerLoss cuts the power 200 times under the daemon, half dropping
// every unsynced write and half keeping a random part of them, and requires
// that nothing committed is ever lost or changed and that fsck stays clean.
// The blobs' content-defined chunks live in packs (cas: Packs), so the cuts
// meet packs being written, synced, committed and collected.
func TestPowerLoss(t *testing.T) {
	crashes := 200
	if testing.Short() {
		crashes = 40
	}
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("CKPTFS_POWERLOSS_SEED"), 10, 64); err == nil {
		seed = v // to replay a failing run
	}
	rep := powerLossRun(t, plOptions{bin: ckptfsBin, crashes: crashes, seed: seed, workerOps: 4})
	t.Logf("seed %d: %v", seed, rep)
	if rep.badCycles > 0 || rep.stopped != "" {
		t.Fatalf("%v\nfirst:\n%s", rep, strings.Join(rep.firstBad, "\n"))
	}
	if rep.deltaChecks == 0 {
		t.Fatalf("no check found a delta chunk in the store: the cuts never met delta coding")
	}
	if rep.packChecks == 0 {
		t.Fatalf("no check found a pack in the store: the cuts never met packs of small chunks")
	}
}

// TestPowerLossCatchesSkippedSync runs the suite against a daemon built to
// leave one sync out (cas/internal/faults) and requires that the suite notices:
// a committed file lost or changed, fsck failing, or the store failing to
// mount. Each of the syncs that make a commit durable is tried.
func TestPowerLossCatchesSkippedSync(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ckptfs-faults")
	build := exec.Command("go", "build", "-tags", "ckptfs_faults", "-o", bin, "../cmd/ckptfs")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build with the ckptfs_faults tag: %v\n%s", err, out)
	}
	for _, skip := range []string{
		"object",   // Batch.Sync's fdatasync of the objects
		"objdir",   // Batch.Sync's fsync of objects/ab/cd, objects/ab, objects
		"catalog",  // the fdatasync of the commit's record in the catalog's log
		"storedir", // the store directory's fsync once catalog.db and objects/ are made
	} {
		t.Run(skip, func(t *testing.T) {
			seed := time.Now().UnixNano()
			rep := powerLossRun(t, plOptions{bin: bin, env: []string{"CKPTFS_SKIP_SYNC=" + skip},
				crashes: 12, seed: seed, workerOps: 4})
			t.Logf("without the %s sync (seed %d): %v", skip, seed, rep)
			if rep.badCycles == 0 && rep.stopped == "" {
				t.Fatalf("the suite found nothing wrong with the %s sync left out", skip)
			}
			if len(rep.firstBad) > 0 {
				t.Logf("first found: %s", strings.Join(rep.firstBad[:min(len(rep.firstBad), 4)], "\n"))
			}
		})
	}
}

// firstLine keeps a message's first line (a panic's, without its stack).
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " […]"
	}
	return s
}
