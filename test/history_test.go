package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The run-history commands (log, best, du, import, report) on the seed's HP
// sweep: 8 runs × 10 steps sharing a frozen 8 MiB backbone, each step with its
// own 0.5 MiB head and a metrics.json whose val_loss falls, then rises.

const (
	sweepRuns      = 8
	sweepSteps     = 10
	backboneTensor = 1 << 20 // 8 of them
	headBytes      = 512 << 10
)

// sweepRun describes one generated run.
type sweepRun struct {
	dir     string
	names   []string // step directory names, in step order
	steps   []int64
	bestIdx int   // the step index with the lowest val_loss
	logical int64 // bytes of all files
	sizes   []int64
}

var sweepBackbone = func() []stTensor {
	var bb []stTensor
	for i := 0; i < 8; i++ {
		bb = append(bb, stTensor{name: fmt.Sprintf("backbone.%d.weight", i), dtype: "BF16", shape: []int64{512, 1024}, data: randBytes(uint64(500+i), backboneTensor)})
	}
	return bb
}()

func valLoss(run, i, best int) float64 {
	return 0.30 + 0.02*float64((i-best)*(i-best)) + 0.001*float64(run)
}

// writeSweepRun writes run number run under dir. Even runs name their steps
// 0, 5, 10, … (so that name order is not step order), odd runs checkpoint-0,
// checkpoint-50, …
func writeSweepRun(t testing.TB, dir string, run int) sweepRun {
	t.Helper()
	r := sweepRun{dir: dir, bestIdx: 3 + run%5}
	for i := 0; i < sweepSteps; i++ {
		step := int64(5 * i)
		name := fmt.Sprint(step)
		if run%2 == 1 {
			step = int64(50 * i)
			name = fmt.Sprintf("checkpoint-%d", step)
		}
		r.names = append(r.names, name)
		r.steps = append(r.steps, step)
		head := stTensor{name: "head.weight", dtype: "BF16", shape: []int64{256, 1024}, data: randBytes(uint64(10000+run*100+i), headBytes)}
		model := filepath.Join(dir, name, "model.safetensors")
		writeSafetensors(t, model, append(append([]stTensor{}, sweepBackbone...), head))
		metrics, _ := json.Marshal(map[string]float64{
			"val_loss":      valLoss(run, i, r.bestIdx),
			"train_loss":    1.0 - 0.05*float64(i),
			"learning_rate": 1e-4 * float64(sweepSteps-i),
		})
		if err := os.WriteFile(filepath.Join(dir, name, "metrics.json"), metrics, 0o644); err != nil {
			t.Fatal(err)
		}
		var size int64
		for _, f := range []string{model, filepath.Join(dir, name, "metrics.json")} {
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			size += st.Size()
		}
		r.sizes = append(r.sizes, size)
		r.logical += size
	}
	return r
}

// logJSON is `ckptfs log --json`.
type logJSON struct {
	RunDir       string `json:"run_dir"`
	LogicalBytes int64  `json:"logical_bytes"`
	UniqueBytes  int64  `json:"unique_bytes"`
	Skipped      []string
	Steps        []struct {
		Step           int64              `json:"step"`
		Name           string             `json:"name"`
		Path           string             `json:"path"`
		Files          int                `json:"files"`
		LogicalBytes   int64              `json:"logical_bytes"`
		AddedBytes     int64              `json:"added_bytes"`
		Tensors        int                `json:"tensors"`
		TensorsChanged int                `json:"tensors_changed"`
		Metrics        map[string]float64 `json:"metrics"`
	} `json:"steps"`
}

func ckptfsJSON(t testing.TB, out any, args ...string) {
	t.Helper()
	code, stdout, stderr := ckptfs(t, args...)
	if code != 0 {
		t.Fatalf("ckptfs %s: exit %d: %s", strings.Join(args, " "), code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("ckptfs %s: %v\n%s", strings.Join(args, " "), err, stdout)
	}
}

// checkSweepLog checks log's rows for run r (in a mount or a local copy).
// newBackbone says whether the run's first step brought the frozen backbone
// to the store: true for the first run written to a store (or a local
// directory, measured on its own); a later run's first step adds only its
// head, since log counts the bytes new to the store.
func checkSweepLog(t *testing.T, lg logJSON, r sweepRun, run int, newBackbone bool) {
	t.Helper()
	if len(lg.Steps) != sweepSteps {
		t.Fatalf("log: %d rows, want %d", len(lg.Steps), sweepSteps)
	}
	var sum int64
	for i, row := range lg.Steps {
		if row.Name != r.names[i] || row.Step != r.steps[i] {
			t.Fatalf("row %d is %s (step %d), want %s (step %d)", i, row.Name, row.Step, r.names[i], r.steps[i])
		}
		if row.Files != 2 || row.LogicalBytes != r.sizes[i] || row.Tensors != 9 {
			t.Errorf("%s: files %d, logical %d, tensors %d; want 2, %d, 9", row.Name, row.Files, row.LogicalBytes, row.Tensors, r.sizes[i])
		}
		lo, hi := int64(headBytes), int64(headBytes+16<<10)
		wantChanged := 1
		if i == 0 {
			wantChanged = 9 // everything is new at the first step
			if newBackbone {
				lo, hi = 8*backboneTensor+headBytes, 8*backboneTensor+headBytes+64<<10
			} else {
				hi += 64 << 10 // the step's small files
			}
		}
		if row.AddedBytes < lo || row.AddedBytes > hi {
			t.Errorf("%s: added %d bytes, want %d..%d", row.Name, row.AddedBytes, lo, hi)
		}
		if row.TensorsChanged != wantChanged {
			t.Errorf("%s: %d tensors changed, want %d", row.Name, row.TensorsChanged, wantChanged)
		}
		if got, want := row.Metrics["val_loss"], valLoss(run, i, r.bestIdx); got != want || len(row.Metrics) != 3 {
			t.Errorf("%s: metrics %v, want val_loss %v and 3 metrics", row.Name, row.Metrics, want)
		}
		sum += row.AddedBytes
	}
	if lg.UniqueBytes != sum || lg.LogicalBytes != r.logical {
		t.Errorf("log totals: unique %d (sum of added %d), logical %d (want %d)", lg.UniqueBytes, sum, lg.LogicalBytes, r.logical)
	}
}

func TestHistorySweep(t *testing.T) {
	start := time.Now()
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	stopped := false // by the import subtest
	runs := make([]sweepRun, sweepRuns)
	for run := range runs {
		runs[run] = writeSweepRun(t, filepath.Join(mnt, "runs", fmt.Sprintf("run-%d", run)), run)
	}
	// Not steps: a directory without a number, a file.
	if err := os.MkdirAll(filepath.Join(runs[0].dir, "runs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runs[0].dir, "README"), []byte("sweep"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := statsJSON(t, mnt)
	t.Logf("sweep written in %v: logical %d, unique %d", time.Since(start).Round(time.Millisecond), st["logical_bytes"], st["unique_bytes"])

	// A local copy of a run that is not in the store yet, for log and import.
	local := writeSweepRun(t, filepath.Join(t.TempDir(), "run-8"), 8)

	t.Run("log", func(t *testing.T) {
		var lg logJSON
		ckptfsJSON(t, &lg, "log", "--json", runs[0].dir)
		checkSweepLog(t, lg, runs[0], 0, true)
		if len(lg.Skipped) != 1 || lg.Skipped[0] != "runs" {
			t.Errorf("skipped %v, want [runs]", lg.Skipped)
		}
		ckptfsJSON(t, &lg, "log", "--json", runs[1].dir)
		checkSweepLog(t, lg, runs[1], 1, false) // run-0 stored the backbone first
		// Outside a mount the files are chunked as a commit would: same numbers.
		lg = logJSON{}
		ckptfsJSON(t, &lg, "log", "--json", local.dir)
		checkSweepLog(t, lg, local, 8, true)

		code, out, errOut := ckptfs(t, "log", runs[0].dir)
		if code != 0 || !strings.Contains(out, "STEP") || !strings.Contains(out, "val_loss") || !strings.Contains(out, "10 steps") {
			t.Errorf("log table: exit %d %s\n%s", code, errOut, out)
		}
		if code, _, errOut := ckptfs(t, "log", filepath.Join(runs[0].dir, "0")); code != 1 || !strings.Contains(errOut, "no step directories") {
			t.Errorf("log of a step directory: exit %d %q", code, errOut)
		}
	})

	t.Run("best", func(t *testing.T) {
		for run := range runs {
			code, out, errOut := ckptfs(t, "best", "--metric", "val_loss", runs[run].dir)
			want := filepath.Join(runs[run].dir, runs[run].names[runs[run].bestIdx])
			if code != 0 || strings.TrimSpace(out) != want {
				t.Errorf("best of run %d: exit %d %q %s, want %s", run, code, out, errOut, want)
			}
		}
		// run 3's best is index 6: the worst is index 0.
		code, out, _ := ckptfs(t, "best", runs[3].dir, "--metric", "val_loss", "--mode", "max")
		if want := filepath.Join(runs[3].dir, runs[3].names[0]); code != 0 || strings.TrimSpace(out) != want {
			t.Errorf("best --mode max: %d %q, want %s", code, out, want)
		}
		code, out, errOut := ckptfs(t, "best", "--metric", "accuracy", runs[0].dir)
		if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, `"accuracy"`) ||
			!strings.Contains(errOut, "learning_rate, train_loss, val_loss") {
			t.Errorf("best of an unknown metric: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		if code, _, _ := ckptfs(t, "best", "--metric", "val_loss", "--mode", "median", runs[0].dir); code != 2 {
			t.Errorf("best --mode median: exit %d, want 2", code)
		}
		if code, _, _ := ckptfs(t, "best", runs[0].dir); code != 2 {
			t.Errorf("best without --metric: exit %d, want 2", code)
		}
	})

	t.Run("du", func(t *testing.T) {
		type usage struct {
			Path             string `json:"path"`
			Files            int    `json:"files"`
			LogicalBytes     int64  `json:"logical_bytes"`
			UniqueBytes      int64  `json:"unique_bytes"`
			FreesBytes       int64  `json:"frees_bytes"`
			FreesStoredBytes int64  `json:"frees_stored_bytes"`
		}
		type duJSON struct {
			Paths []usage `json:"paths"`
			Total usage   `json:"total"`
		}
		st := statsJSON(t, mnt)
		var one duJSON
		ckptfsJSON(t, &one, "du", "--json", runs[2].dir)
		u := one.Paths[0]
		heads := int64(sweepSteps * headBytes)
		if u.Files != 20 || u.LogicalBytes != runs[2].logical {
			t.Errorf("du run-2: %+v, want 20 files, %d logical", u, runs[2].logical)
		}
		if u.UniqueBytes < 8*backboneTensor+heads || u.UniqueBytes > 8*backboneTensor+heads+64<<10 {
			t.Errorf("du run-2: unique %d, want backbone + heads = %d (+ small files)", u.UniqueBytes, 8*backboneTensor+heads)
		}
		if u.FreesBytes < heads || u.FreesBytes > heads+16<<10 || u.FreesStoredBytes < u.FreesBytes {
			t.Errorf("du run-2: frees %d (%d on disk), want its heads only: %d (+ metrics.json)", u.FreesBytes, u.FreesStoredBytes, heads)
		}
		var all duJSON
		args := []string{"du", "--json"}
		for _, r := range runs {
			args = append(args, r.dir)
		}
		ckptfsJSON(t, &all, args...)
		for i, p := range all.Paths {
			if p.Path != runs[i].dir || p.FreesBytes < heads || p.FreesBytes > heads+16<<10 {
				t.Errorf("du of all runs, %s: frees %d", p.Path, p.FreesBytes)
			}
		}
		if all.Total.FreesBytes != st["unique_bytes"] || all.Total.UniqueBytes != st["unique_bytes"] || all.Total.LogicalBytes != st["logical_bytes"] {
			t.Errorf("du of all runs together: %+v; the store has unique %d, logical %d", all.Total, st["unique_bytes"], st["logical_bytes"])
		}
		var root duJSON
		ckptfsJSON(t, &root, "du", "--json", mnt)
		if root.Paths[0].FreesBytes != st["unique_bytes"] {
			t.Errorf("du of the mount root frees %d, want every chunk (%d)", root.Paths[0].FreesBytes, st["unique_bytes"])
		}
		code, out, _ := ckptfs(t, "du", runs[0].dir, runs[1].dir)
		if code != 0 || !strings.Contains(out, "DELETING FREES") || !strings.Contains(out, "total") {
			t.Errorf("du table: exit %d\n%s", code, out)
		}
		if code, _, errOut := ckptfs(t, "du", local.dir); code != 1 || !strings.Contains(errOut, "not in a ckptfs mount") {
			t.Errorf("du outside a mount: exit %d %q", code, errOut)
		}

		// A file that is open keeps its chunks after it is deleted: deleting
		// everything would not free its head while it stays open.
		victim := filepath.Join(runs[7].dir, runs[7].names[9], "model.safetensors")
		f, err := os.Open(victim)
		if err != nil {
			t.Fatal(err)
		}
		ckptfsJSON(t, &one, "du", "--json", runs[7].dir)
		if one.Paths[0].FreesBytes < heads {
			t.Errorf("an open file's own handle counted as another user: frees %d", one.Paths[0].FreesBytes)
		}
		if err := os.Remove(victim); err != nil {
			t.Fatal(err)
		}
		ckptfsJSON(t, &all, "du", "--json", mnt)
		// The victim's chunks: the backbone, its head, the header.
		vst, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := all.Paths[0].FreesBytes, statsJSON(t, mnt)["unique_bytes"]-vst.Size(); got != want {
			t.Errorf("with a deleted file still open, du of everything frees %d, want %d (all but that file's chunks)", got, want)
		}
		f.Close()
	})

	t.Run("report", func(t *testing.T) {
		html := filepath.Join(t.TempDir(), "run-0.html")
		code, out, errOut := ckptfs(t, "report", runs[0].dir, "-o", html)
		if code != 0 || !strings.Contains(out, "wrote") {
			t.Fatalf("report: exit %d %s %s", code, out, errOut)
		}
		page, err := os.ReadFile(html)
		if err != nil {
			t.Fatal(err)
		}
		// Self-contained: nothing to fetch.
		for _, re := range []string{`<link\b`, `\bsrc\s*=`, `@import`, `url\(`} {
			if m := regexp.MustCompile(re).Find(page); m != nil {
				t.Errorf("report refers to something outside itself: %q", m)
			}
		}
		for _, u := range regexp.MustCompile(`https?://[^"'\s)]*`).FindAll(page, -1) {
			if string(u) != "http://www.w3.org/2000/svg" { // the SVG namespace, not a fetch
				t.Errorf("report refers to %s", u)
			}
		}
		dom := renderInChromium(t, html)
		if !strings.Contains(dom, `data-rendered="ok"`) {
			t.Errorf("the page did not finish rendering")
		}
		if m := regexp.MustCompile(`(?s)<pre id="errors">(.*?)</pre>`).FindStringSubmatch(dom); m == nil || m[1] != "" {
			t.Errorf("page errors: %q", m)
		}
		// head.weight changed at 9 steps; 3 metric charts; 9 tensor rows.
		if n := strings.Count(dom, `<td class="c"`); n != 9 {
			t.Errorf("%d changed cells, want 9", n)
		}
		if n := strings.Count(dom, `<div class="chart">`); n != 3 {
			t.Errorf("%d metric charts, want 3", n)
		}
		for _, want := range []string{"head.weight", "backbone.7.weight", "val_loss", "lowest 0.3000 at step " + fmt.Sprint(runs[0].steps[runs[0].bestIdx])} {
			if !strings.Contains(dom, want) {
				t.Errorf("rendered page lacks %q", want)
			}
		}
	})

	t.Run("import", func(t *testing.T) {
		// Modes, times and a symlink to keep.
		old := time.Date(2024, 3, 1, 12, 0, 0, 123456789, time.UTC)
		if err := os.Chmod(filepath.Join(local.dir, local.names[2], "model.safetensors"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(local.names[9], filepath.Join(local.dir, "latest")); err != nil {
			t.Fatal(err)
		}
		err := filepath.WalkDir(local.dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type()&fs.ModeSymlink == 0 {
				err = os.Chtimes(p, old, old.Add(time.Duration(len(p))*time.Second))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(local.dir, local.names[1]), 0o750); err != nil {
			t.Fatal(err)
		}

		sum := importJSON(t, mnt, local.dir, "runs/imported")
		heads := int64(sweepSteps * headBytes)
		if sum.Files != 20 || sum.Symlinks != 1 || sum.LogicalBytes != local.logical {
			t.Errorf("import summary %+v, want 20 files, 1 symlink, %d bytes", sum, local.logical)
		}
		if sum.AddedBytes < heads || sum.AddedBytes > heads+16<<10 || sum.Ratio == nil || *sum.Ratio < 15 {
			t.Errorf("import added %d bytes (ratio %v), want its heads only (%d): the backbone is in the store", sum.AddedBytes, sum.Ratio, heads)
		}
		sameTree(t, local.dir, filepath.Join(mnt, "runs/imported"))
		code, out, errOut := ckptfs(t, "import", mnt, local.dir, "runs/imported")
		if code != 1 || !strings.Contains(errOut, "exists") {
			t.Errorf("import over an existing DEST: exit %d %s %s", code, out, errOut)
		}
		code, out, errOut = ckptfs(t, "import", mnt, local.dir, "../outside")
		if code != 1 || !strings.Contains(errOut, "below the mount root") {
			t.Errorf("import to ../outside: exit %d %s %s", code, out, errOut)
		}
		code, out, _ = ckptfs(t, "import", mnt, local.dir, "runs/imported-again")
		if code != 0 || !strings.Contains(out, "every chunk was in the store") {
			t.Errorf("second import: exit %d\n%s", code, out)
		}

		// Into the unmounted store: import mounts it itself.
		d.stop(syscall.SIGTERM)
		stopped = true
		other := writeSweepRun(t, filepath.Join(t.TempDir(), "run-9"), 9)
		sum = importJSON(t, store, other.dir, "runs/offline/run-9")
		if sum.Files != 20 || sum.LogicalBytes != other.logical || sum.AddedBytes < heads || sum.AddedBytes > heads+16<<10 {
			t.Errorf("import into the store: %+v, want 20 files, %d logical, ~%d added", sum, other.logical, heads)
		}
		if data, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(data), "ckptfs-import-") {
			t.Errorf("import left its temporary mount behind: %v", err)
		}
		d := startDaemon(t, store, mnt)
		sameTree(t, other.dir, filepath.Join(mnt, "runs/offline/run-9"))
		sameTree(t, local.dir, filepath.Join(mnt, "runs/imported"))
		var lg logJSON
		ckptfsJSON(t, &lg, "log", "--json", filepath.Join(mnt, "runs/offline/run-9"))
		checkSweepLog(t, lg, other, 9, false)
		d.stop(syscall.SIGTERM)
	})
	if !stopped {
		d.stop(syscall.SIGTERM)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

type importSummary struct {
	Files        int      `json:"files"`
	Dirs         int      `json:"dirs"`
	Symlinks     int      `json:"symlinks"`
	LogicalBytes int64    `json:"logical_bytes"`
	AddedBytes   int64    `json:"added_bytes"`
	Ratio        *float64 `json:"ratio"`

	ReencodedChunks int `json:"reencoded_chunks"`
}

func importJSON(t *testing.T, target, src, dest string, flags ...string) importSummary {
	t.Helper()
	code, out, errOut := ckptfs(t, append(append([]string{"import", "--json"}, flags...), target, src, dest)...)
	if code != 0 {
		t.Fatalf("import %s %s %s: exit %d: %s", target, src, dest, code, errOut)
	}
	if errOut != "" {
		t.Errorf("import wrote to stderr (no progress bar when it is not a terminal): %q", errOut)
	}
	var s importSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	ratio := "null"
	if s.Ratio != nil {
		ratio = fmt.Sprintf("%.2f", *s.Ratio)
	}
	t.Logf("import into %s: %d files, %d logical bytes, %d added, ratio %s", target, s.Files, s.LogicalBytes, s.AddedBytes, ratio)
	return s
}

// sameTree checks that b holds a's tree: bytes, modes, mtimes, symlinks.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		q := filepath.Join(b, rel)
		sa, err := os.Lstat(p)
		if err != nil {
			return err
		}
		sb, err := os.Lstat(q)
		if err != nil {
			return err
		}
		if sa.Mode() != sb.Mode() {
			t.Errorf("%s: mode %v, source has %v", q, sb.Mode(), sa.Mode())
		}
		if !sa.ModTime().Equal(sb.ModTime()) {
			t.Errorf("%s: mtime %v, source has %v", q, sb.ModTime(), sa.ModTime())
		}
		switch {
		case sa.Mode().IsRegular():
			x, _ := os.ReadFile(p)
			y, err := os.ReadFile(q)
			if err != nil || !bytes.Equal(x, y) {
				t.Errorf("%s differs from %s (%v)", q, p, err)
			}
			n++
		case sa.Mode()&fs.ModeSymlink != 0:
			x, _ := os.Readlink(p)
			if y, err := os.Readlink(q); err != nil || x != y {
				t.Errorf("symlink %s -> %q, source -> %q (%v)", q, y, x, err)
			}
		}
		return nil
	})
	if err != nil || n == 0 {
		t.Fatalf("compare %s with %s: %v (%d files)", a, b, err, n)
	}
}

// renderInChromium loads the page in headless Chromium and returns the DOM
// after its scripts ran. With $CKPTFS_REPORT_SCREENSHOT set it also writes a
// screenshot there.
func renderInChromium(t *testing.T, html string) string {
	t.Helper()
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("%s is missing: the report test renders the page in it (apt-get install chromium; .ci/run does)", chromium)
	}
	run := func(extra ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + t.TempDir(), "--hide-scrollbars"}, extra...)
		args = append(args, "file://"+html)
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, chromium, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v\n%s", extra, err, stderr.String())
		}
		return stdout.Bytes()
	}
	dom := run("--dump-dom")
	if shot := os.Getenv("CKPTFS_REPORT_SCREENSHOT"); shot != "" {
		abs, err := filepath.Abs(shot)
		if err != nil {
			t.Fatal(err)
		}
		run("--window-size=1280,2200", "--screenshot="+abs)
		if st, err := os.Stat(abs); err != nil || st.Size() == 0 {
			t.Errorf("screenshot %s: %v", abs, err)
		}
	}
	return string(dom)
}

// TestHistoryTrainerState: metrics from Hugging Face trainer_state.json.
func TestHistoryTrainerState(t *testing.T) {
	out := filepath.Join(t.TempDir(), "output")
	// The log a Trainer keeps; each checkpoint's trainer_state.json holds it
	// up to that checkpoint. Python's json writes NaN bare.
	history := []string{
		`{"epoch": 0.5, "grad_norm": NaN, "learning_rate": 5e-05, "loss": 2.0, "step": 5}`,
		`{"epoch": 1.0, "grad_norm": 1.5, "learning_rate": 4e-05, "loss": 1.5, "step": 10}`,
		`{"epoch": 1.0, "eval_loss": 1.4, "eval_runtime": 1.25, "step": 10}`,
		`{"epoch": 2.0, "learning_rate": 3e-05, "loss": 1.0, "step": 20}`,
		`{"epoch": 2.0, "eval_loss": 1.1, "eval_runtime": 1.5, "step": 20}`,
		`{"epoch": 3.0, "learning_rate": 2e-05, "loss": 0.8, "step": 30}`,
		`{"epoch": 3.0, "eval_loss": 1.2, "eval_runtime": 1.0, "step": 30}`,
	}
	upTo := map[int]int{10: 3, 15: 3, 20: 5, 30: 7}
	for i, step := range []int{10, 15, 20, 30} {
		dir := filepath.Join(out, fmt.Sprintf("checkpoint-%d", step))
		writeSafetensors(t, filepath.Join(dir, "model.safetensors"), []stTensor{
			{name: "w", dtype: "F32", shape: []int64{16}, data: randBytes(uint64(i), 64)},
			{name: "b", dtype: "F32", shape: []int64{4}, data: randBytes(99, 16)},
		})
		state := fmt.Sprintf(`{"best_metric": null, "global_step": %d, "log_history": [%s], "total_flos": 1e12}`, step, strings.Join(history[:upTo[step]], ", "))
		if err := os.WriteFile(filepath.Join(dir, "trainer_state.json"), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// metrics.json wins over trainer_state.json.
	if err := os.WriteFile(filepath.Join(out, "checkpoint-20", "metrics.json"), []byte(`{"eval_loss": 1.05, "custom": 3, "note": "x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(out, "runs", "Mar01"), 0o755); err != nil { // TensorBoard logs
		t.Fatal(err)
	}
	var lg logJSON
	ckptfsJSON(t, &lg, "log", "--json", out)
	want := []map[string]float64{
		{"epoch": 1, "grad_norm": 1.5, "learning_rate": 4e-05, "loss": 1.5, "eval_loss": 1.4, "eval_runtime": 1.25},
		{"epoch": 1, "eval_loss": 1.4, "eval_runtime": 1.25}, // no entry at 15: the last one before it
		{"epoch": 2, "learning_rate": 3e-05, "loss": 1.0, "eval_loss": 1.05, "eval_runtime": 1.5, "custom": 3},
		{"epoch": 3, "learning_rate": 2e-05, "loss": 0.8, "eval_loss": 1.2, "eval_runtime": 1.0},
	}
	if len(lg.Steps) != 4 {
		t.Fatalf("log: %d steps, want 4", len(lg.Steps))
	}
	for i, row := range lg.Steps {
		a, _ := json.Marshal(row.Metrics)
		b, _ := json.Marshal(want[i])
		if string(a) != string(b) {
			t.Errorf("%s: metrics %s, want %s", row.Name, a, b)
		}
		if wantChanged := map[int]int{0: 2, 1: 1, 2: 1, 3: 1}[i]; row.TensorsChanged != wantChanged || row.Tensors != 2 {
			t.Errorf("%s: %d of %d tensors changed, want %d of 2", row.Name, row.TensorsChanged, row.Tensors, wantChanged)
		}
	}
	for _, c := range []struct{ metric, mode, want string }{
		{"eval_loss", "min", "checkpoint-20"},
		{"loss", "min", "checkpoint-30"},
		{"epoch", "max", "checkpoint-30"},
	} {
		code, stdout, stderr := ckptfs(t, "best", "--metric", c.metric, "--mode", c.mode, out)
		if code != 0 || strings.TrimSpace(stdout) != filepath.Join(out, c.want) {
			t.Errorf("best %s %s: exit %d %q %s, want %s", c.metric, c.mode, code, stdout, stderr, c.want)
		}
	}
	code, _, stderr := ckptfs(t, "best", "--metric", "eval_accuracy", out)
	if code != 1 || !strings.Contains(stderr, "eval_loss") || !strings.Contains(stderr, "grad_norm") {
		t.Errorf("best of an unknown metric: exit %d %q", code, stderr)
	}
}

// TestHistoryLiveRun: log of a run whose newest checkpoint is still being
// written counts that file without its chunks and says so.
func TestHistoryLiveRun(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	run := filepath.Join(mnt, "runs", "live")
	writeSafetensors(t, filepath.Join(run, "0", "model.safetensors"), []stTensor{f32Tensor("w", 1, 1<<20)})
	if err := os.MkdirAll(filepath.Join(run, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(run, "1", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(randBytes(2, 100<<10)); err != nil {
		t.Fatal(err)
	}
	var lg struct {
		Steps []struct {
			Files        int `json:"files"`
			PendingFiles int `json:"pending_files"`
		} `json:"steps"`
	}
	code, out, errOut := ckptfs(t, "log", "--json", run)
	if code != 0 || !strings.Contains(errOut, "no committed content yet") {
		t.Fatalf("log of a run being written: exit %d %q", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &lg); err != nil || len(lg.Steps) != 2 || lg.Steps[1].Files != 1 || lg.Steps[1].PendingFiles != 1 {
		t.Fatalf("log of a run being written: %v\n%s", err, out)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// The kernel caches the failed look-up of .ckptfs/manifests/<ino> for
	// the mount's negative timeout (1 s): retry past it.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, out, errOut = ckptfs(t, "log", "--json", run)
		lg.Steps = nil // pending_files is omitted when 0
		err := json.Unmarshal([]byte(out), &lg)
		if err == nil && code == 0 && errOut == "" && lg.Steps[1].PendingFiles == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log after the commit: exit %d %q %v\n%s", code, errOut, err, out)
		}
	}
	d.stop(syscall.SIGTERM)
}
