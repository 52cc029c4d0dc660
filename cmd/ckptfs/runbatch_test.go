package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// asCkptfs makes the test binary run as ckptfs (TestMain): a test starts
// `ckptfs mount` as os.Args[0] with it set, so the daemon is this package's
// code, in a process of its own.
const asCkptfs = "CKPTFS_TEST_AS_CKPTFS"

func TestMain(m *testing.M) {
	if os.Getenv(asCkptfs) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// mountForTest mounts a new store at a new directory with this package's
// daemon and returns the mountpoint; the cleanup unmounts it.
func mountForTest(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "mount", store, mnt)
	cmd.Env = append(os.Environ(), asCkptfs+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	serving := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && strings.Contains(sc.Text(), "serving") {
				ok = true
				serving <- true
			}
		}
		if !ok {
			serving <- false
		}
	}()
	select {
	case ok := <-serving:
		if !ok {
			t.Fatalf("ckptfs mount exited without serving: %v", <-done)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("ckptfs mount: not serving after 30 s")
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ckptfs mount: %v", err)
			}
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			exec.Command("umount", "-l", mnt).Run()
			t.Error("ckptfs mount did not exit 60 s after SIGTERM")
		}
	})
	return mnt
}

// tinySafetensors is a safetensors file of F32 tensors, each of 16 values
// from its seed.
func tinySafetensors(seeds map[string]int) []byte {
	names := make([]string, 0, len(seeds))
	for n := range seeds {
		names = append(names, n)
	}
	slices.Sort(names)
	head := map[string]any{}
	var data []byte
	for _, n := range names {
		start := len(data)
		for i := range 16 {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(seeds[n])+float32(i)/16))
		}
		head[n] = map[string]any{"dtype": "F32", "shape": []int{16}, "data_offsets": []int{start, len(data)}}
	}
	h, _ := json.Marshal(head)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	return append(append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...), data...)
}

// stepMetricsJSON is step s's metrics.json.
func stepMetricsJSON(s int) string {
	return fmt.Sprintf(`{"loss": %g, "acc": %g}`, 1/float64(1+s%97), float64(s%13)/13)
}

// writeHistoryRun writes a run of steps steps in run, with what log, best
// and du must tell apart: tensors that change every step and every tenth,
// metrics from metrics.json and trainer_state.json (a NaN, an unparsable
// file), nested and empty files, a symlink, a directory that is not a
// step, a file directly in the run.
func writeHistoryRun(t *testing.T, run string, steps int) {
	t.Helper()
	write := func(p string, b []byte) error {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, b, 0o644)
	}
	var g errgroup.Group
	g.SetLimit(4)
	for s := range steps {
		g.Go(func() error {
			d := filepath.Join(run, fmt.Sprintf("step-%04d", s))
			if err := write(filepath.Join(d, "model.safetensors"), tinySafetensors(map[string]int{"a": s, "b": s / 10})); err != nil {
				return err
			}
			metrics := stepMetricsJSON(s)
			switch {
			case s == 7:
				metrics = `{"loss": NaN}`
			case s == 11:
				metrics = `{"loss": 0.5,` // half written
			}
			if err := write(filepath.Join(d, metricsFile), []byte(metrics)); err != nil {
				return err
			}
			if s%100 == 0 {
				ts := fmt.Sprintf(`{"global_step": %d, "log_history": [{"step": %d, "eval_loss": %g}]}`, s, s, 2/float64(1+s))
				if err := write(filepath.Join(d, trainerStateFile), []byte(ts)); err != nil {
					return err
				}
			}
			if s%50 == 3 {
				if err := write(filepath.Join(d, "shard", "extra.bin"), []byte(strings.Repeat(fmt.Sprint(s), 100))); err != nil {
					return err
				}
				if err := write(filepath.Join(d, "empty.txt"), nil); err != nil {
					return err
				}
				if err := os.Symlink("model.safetensors", filepath.Join(d, "latest")); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := write(filepath.Join(run, "runs", "events.log"), []byte("not a step")); err != nil {
		t.Fatal(err)
	}
	if err := write(filepath.Join(run, "README"), []byte("a file of the run, in no step")); err != nil {
		t.Fatal(err)
	}
}

// TestRunHistoryThroughDaemonIsTheWalk: log, best and du of a run of 1,000
// steps in a mount give through the daemon's tree requests exactly what the
// walk through the mount gives (the path a daemon without them gets),
// including a copy of a step outside the run and a file being written.
func TestRunHistoryThroughDaemonIsTheWalk(t *testing.T) {
	mnt := mountForTest(t)
	ctx := context.Background()
	// A copy made before the run: the run's step 5 adds nothing new.
	if err := os.MkdirAll(filepath.Join(mnt, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "other", "copy.safetensors"), tinySafetensors(map[string]int{"a": 5, "b": 0}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "other", "metrics.json"), []byte(stepMetricsJSON(5)), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // ctimes: the copy's before every step's
	run := filepath.Join(mnt, "runs", "r1")
	const steps = 1000
	writeHistoryRun(t, run, steps)
	// The last step's second file is being written.
	f, err := os.Create(filepath.Join(run, fmt.Sprintf("step-%04d", steps-1), "pending.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("not committed yet")); err != nil {
		t.Fatal(err)
	}

	walked, err := loadHistoryWalk(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	rm, ok := openRunMount(ctx, run)
	if !ok {
		t.Fatalf("%s: not found to be in a mount", run)
	}
	h, rows, ok, err := rm.loadHistory(ctx)
	if err != nil || !ok {
		t.Fatalf("the tree requests: ok %v, %v", ok, err)
	}
	asked, err := finishHistory(ctx, h, rows)
	if err != nil {
		t.Fatal(err)
	}
	// What the run must show, so that equal cannot mean equally empty.
	if len(asked.Steps) != steps || !slices.Equal(asked.Skipped, []string{"runs"}) {
		t.Fatalf("through the daemon: %d steps, skipped %q", len(asked.Steps), asked.Skipped)
	}
	s5, s53, last := asked.Steps[5], asked.Steps[53], asked.Steps[steps-1]
	if s5.AddedBytes != 0 || asked.Steps[6].AddedBytes == 0 || s53.Files != 4 || last.PendingFiles != 1 || asked.Steps[10].TensorsChanged != 2 || asked.Steps[9].TensorsChanged != 1 {
		t.Fatalf("through the daemon: step 5 %+v, step 53 %+v, last %+v", s5, s53, last)
	}
	if _, ok := asked.Steps[100].Metrics["eval_loss"]; !ok || len(asked.Warnings) != 2 {
		t.Fatalf("through the daemon: step 100 metrics %v, warnings %q", asked.Steps[100].Metrics, asked.Warnings)
	}
	slices.Sort(walked.Warnings) // the walk loads a step's files in parallel
	slices.Sort(asked.Warnings)
	a, _ := json.MarshalIndent(walked, "", " ")
	b, _ := json.MarshalIndent(asked, "", " ")
	if string(a) != string(b) {
		t.Errorf("log through the daemon differs from the walk:\n%s", firstDiff(string(a), string(b)))
	}

	// best's metrics, step by step.
	var viaTree []string
	n, _, err := forEachStepMetrics(ctx, run, func(sd stepDir, m map[string]float64, warns []string) error {
		b, err := json.Marshal(metricMap(m))
		viaTree = append(viaTree, fmt.Sprintf("%s %s %q", sd.Path, b, warns))
		return err
	})
	if err != nil || n != steps {
		t.Fatalf("best's metrics: %d steps, %v", n, err)
	}
	sds, _, err := listSteps(run)
	if err != nil {
		t.Fatal(err)
	}
	for i, sd := range sds {
		m, warns, err := readStepMetrics(sd)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(metricMap(m))
		if w := fmt.Sprintf("%s %s %q", sd.Path, b, warns); w != viaTree[i] {
			t.Fatalf("best's metrics of step %d: through the daemon %s, walked %s", i, viaTree[i], w)
		}
	}

	// du of the run, and of one step and the mount, as directories the
	// daemon expands and as the walk's inode numbers.
	t.Run("du", func(t *testing.T) { checkDuExpanded(t, mnt, run, filepath.Join(run, "step-0053"), mnt) })
}

// checkDuExpanded compares du of paths, directories in mnt, through
// GroupDirs and through the walk's inode numbers.
func checkDuExpanded(t *testing.T, mnt string, paths ...string) {
	t.Helper()
	root, dev, err := mountRootFor(mnt)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := resolveTarget(root)
	if err != nil {
		t.Fatal(err)
	}
	groups := make([][]uint64, len(paths))
	dirs := make([]uint64, len(paths))
	for i, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		dirs[i] = catalogIno(p, root, st.Ino)
		if groups[i], err = inodesUnder(p, root, dev); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	expanded, err := duAsk(ctx, tg.socket, controlRequest{Op: "du", Groups: make([][]uint64, len(paths)), GroupDirs: dirs}, len(paths))
	if err != nil || !expanded.DirsExpanded {
		t.Fatalf("du with GroupDirs: expanded %v, %v", expanded.DirsExpanded, err)
	}
	walked, err := duAsk(ctx, tg.socket, controlRequest{Op: "du", Groups: groups}, len(paths))
	if err != nil {
		t.Fatal(err)
	}
	walked.DirsExpanded = true
	if expanded.Groups[0].Files < 2000 {
		t.Fatalf("du of the run: %+v", expanded.Groups[0])
	}
	a, _ := json.Marshal(walked)
	b, _ := json.Marshal(expanded)
	if string(a) != string(b) {
		t.Errorf("du through GroupDirs differs from the walk's:\nwalk %s\ndirs %s", a, b)
	}
}

// firstDiff shows where a and b part.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-300)
	return fmt.Sprintf("walk:   …%s…\ndaemon: …%s…", a[lo:min(len(a), i+300)], b[lo:min(len(b), i+300)])
}

// TestNextTreeBatch: tree requests hold about treeItems items, whatever the
// steps' size, between treeMin and treeMax steps.
func TestNextTreeBatch(t *testing.T) {
	for _, c := range []struct {
		name         string
		items, steps int
		want         int
	}{
		{"tiny steps", 6 * 16, 16, treeMax},
		{"empty answer", 0, 16, treeMax},
		{"10⁴ chunks a step", 10_001 * 16, 16, treeItems / 10_001},
		{"10⁶ chunks a step", 1_000_001, 1, treeMin},
		{"per step rounded up", 257, 2, treeItems / 129},
	} {
		if got := nextTreeBatch(c.items, c.steps); got != c.want {
			t.Errorf("%s: nextTreeBatch(%d, %d) = %d, want %d", c.name, c.items, c.steps, got, c.want)
		}
	}
}
