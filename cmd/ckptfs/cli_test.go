package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/gc"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestUsageErrors: every bad flag or argument exits 2 with one line in
// ckptfs's words (--name), without the flag package's phrasing.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"report", "--json", "x"}, "ckptfs report: unknown flag --json"},
		{[]string{"gc", "--grace", "2x", "x"}, `invalid value "2x" for --grace`},
		{[]string{"gc", "--grace", "-1h", "x"}, "--grace must not be negative"},
		{[]string{"gc", "--grace=-1d", "x"}, "bad duration"},
		{[]string{"log", "--json=maybe", "x"}, `invalid value "maybe" for --json: want true or false`},
		{[]string{"report", "-o"}, "flag --o needs a value"},
		{[]string{"stats"}, "want 1 argument(s), got 0"},
		{[]string{"mount", "--commit", "later", "a", "b"}, "--commit must be sync, async or remote"},
		{[]string{"best", "x"}, "--metric is required"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
	} {
		code, _, errOut := runCLI(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("ckptfs %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
		if strings.Contains(errOut, "flag provided but not defined") || strings.Contains(errOut, "for flag -") {
			t.Errorf("ckptfs %s: the flag package's wording: %q", strings.Join(tc.args, " "), errOut)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"1d", 24 * time.Hour, false},
		{"7d", 7 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"0.5d", 12 * time.Hour, false},
		{"24h", 24 * time.Hour, false},
		{"0", 0, false},
		{"90m", 90 * time.Minute, false},
		{"-1d", 0, true},
		{"d", 0, true},
		{"1x", 0, true},
		{"", 0, true},
	} {
		got, err := parseDuration(tc.in)
		if tc.bad != (err != nil) || (!tc.bad && got != tc.want) {
			t.Errorf("parseDuration(%q) = %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// TestStatsOfAFile: stats names the mistake, not a path inside it.
func TestStatsOfAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "README.md")
	os.WriteFile(f, []byte("# hi\n"), 0o600)
	code, _, errOut := runCLI("stats", f)
	if code != 1 || !strings.Contains(errOut, "is a file: give a mountpoint or a store directory") || strings.Contains(errOut, ".ckptfs/stats.json") {
		t.Errorf("stats README.md: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCLI("stats", filepath.Dir(f))
	if code != 1 || !strings.Contains(errOut, "neither a ckptfs mountpoint nor a store") || strings.Contains(errOut, "catalog.db") {
		t.Errorf("stats of a plain directory: exit %d, %q", code, errOut)
	}
}

func TestFormatProgress(t *testing.T) {
	for _, tc := range []struct {
		pr      gc.Progress
		elapsed time.Duration
		want    []string
	}{
		{gc.Progress{Phase: "import", Done: 512 << 20, Total: 2 << 30, Bytes: true}, 2 * time.Second,
			[]string{"512.0 MiB/2.0 GiB", "256.0 MiB/s", "ETA 6s"}},
		{gc.Progress{Phase: "mark", Done: 25000, Total: 100000}, 5 * time.Second,
			[]string{"25.0k/100.0k", "5000/s", "ETA 15s"}},
		{gc.Progress{Phase: "scan", Done: 4096}, time.Second, []string{"scan   4096", "4096/s"}},
		{gc.Progress{Phase: "read", Done: 1, Total: 1 << 20}, time.Second, []string{"ETA 291h16m"}},
	} {
		got := formatProgress(tc.pr, tc.elapsed)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("formatProgress(%+v, %v) = %q, want %q in it", tc.pr, tc.elapsed, got, w)
			}
		}
	}
}

// TestMetricsKeepNaN: Python's NaN and Infinity in metrics.json reach log
// as NaN/+Inf, are null in JSON, and best never picks a NaN.
func TestMetricsKeepNaN(t *testing.T) {
	run := t.TempDir()
	for step, body := range map[string]string{
		"1": `{"loss": NaN, "acc": 0.5, "note": "NaN inside a string", "big": Infinity}`,
		"2": `{"loss": 0.25, "acc": -Infinity}`,
	} {
		os.MkdirAll(filepath.Join(run, step), 0o755)
		os.WriteFile(filepath.Join(run, step, "metrics.json"), []byte(body), 0o644)
	}
	m, warns, err := readStepMetrics(stepDir{Step: 1, Name: "1", Path: filepath.Join(run, "1")})
	if err != nil || len(warns) != 0 {
		t.Fatal(err, warns)
	}
	if !math.IsNaN(m["loss"]) || m["acc"] != 0.5 || !math.IsInf(m["big"], 1) {
		t.Errorf("metrics: %v", m)
	}
	if _, ok := m["note"]; ok {
		t.Errorf("a string became a metric: %v", m)
	}
	b, err := json.Marshal(metricMap(m))
	if err != nil || !strings.Contains(string(b), `"loss":null`) || !strings.Contains(string(b), `"acc":0.5`) {
		t.Errorf("JSON: %s, %v", b, err)
	}
	code, out, errOut := runCLI("log", run)
	if code != 0 || !strings.Contains(out, "NaN") || !strings.Contains(out, "-Inf") {
		t.Errorf("log: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI("best", "--metric", "loss", run)
	if code != 0 || strings.TrimSpace(out) != filepath.Join(run, "2") {
		t.Errorf("best --metric loss: exit %d, %q", code, out)
	}
	code, out, errOut = runCLI("log", "--metrics", "loss,typo", run)
	if code != 2 || !strings.Contains(errOut, "no step has typo") || !strings.Contains(errOut, "acc, big, loss") {
		t.Errorf("log --metrics typo: exit %d, %q %q", code, out, errOut)
	}
}

func TestHelperArgs(t *testing.T) {
	args, logFile, err := helperArgs([]string{"/srv/store", "/mnt/ckpt", "-o", "rw,noauto,_netdev,x-systemd.automount,cache_size=1GiB,allow_other,metrics_addr=127.0.0.1:9477,log=/tmp/l"})
	if err != nil {
		t.Fatal(err)
	}
	want := "mount --cache-size=1GiB --allow-other --metrics-addr=127.0.0.1:9477 /srv/store /mnt/ckpt"
	if strings.Join(args, " ") != want || logFile != "/tmp/l" {
		t.Errorf("got %q log %q, want %q", strings.Join(args, " "), logFile, want)
	}
	for _, bad := range [][]string{
		{"/s"},
		{"/s", "/m", "-o", "ro"},
		{"/s", "/m", "-o", "cache_size"},
		{"/s", "/m", "-o", "frobnicate=1"},
		{"/s", "/m", "-x"},
	} {
		if _, _, err := helperArgs(bad); err == nil {
			t.Errorf("helperArgs(%q) accepted", bad)
		}
	}
}

func TestFormatVersion(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/ckptfs/ckptfs", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-11-23T00:00:00Z"}}}
	if got := formatVersion(bi); !strings.HasPrefix(got, "ckptfs v1.2.3 commit abc123-dirty (2026-11-23T00:00:00Z) go") {
		t.Errorf("formatVersion = %q", got)
	}
	code, out, _ := runCLI("--version")
	if code != 0 || !strings.HasPrefix(out, "ckptfs ") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
}

func TestFuseConfAllowsOther(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]bool{
		"#user_allow_other\n":               false,
		"mount_max = 9\nuser_allow_other\n": true,
		"  user_allow_other  \n":            true,
		"":                                  false,
	} {
		p := filepath.Join(dir, "fuse.conf")
		os.WriteFile(p, []byte(body), 0o644)
		if got, err := fuseConfAllowsOther(p); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", body, got, err, want)
		}
	}
	if got, err := fuseConfAllowsOther(filepath.Join(dir, "missing")); err != nil || got {
		t.Errorf("missing file: %v, %v", got, err)
	}
}

// TestNewStoreCleanup: what a refused mount created is removed, and nothing
// that was there before.
func TestNewStoreCleanup(t *testing.T) {
	base := t.TempDir()
	// A missing store with missing parents: all of it goes.
	missing := filepath.Join(base, "a", "b", "store")
	undo := newStoreCleanup(missing)
	os.MkdirAll(filepath.Join(missing, "objects"), 0o700)
	os.WriteFile(filepath.Join(missing, "catalog.db"), nil, 0o600)
	undo()
	if _, err := os.Stat(filepath.Join(base, "a")); !os.IsNotExist(err) {
		t.Errorf("created parents left behind: %v", err)
	}
	// An empty directory stays, emptied.
	empty := filepath.Join(base, "empty")
	os.Mkdir(empty, 0o755)
	undo = newStoreCleanup(empty)
	os.WriteFile(filepath.Join(empty, "catalog.db"), nil, 0o600)
	undo()
	if ents, err := os.ReadDir(empty); err != nil || len(ents) != 0 {
		t.Errorf("empty store dir: %v %v", ents, err)
	}
	// An existing store is never touched.
	existing := filepath.Join(base, "existing")
	os.Mkdir(existing, 0o755)
	os.WriteFile(filepath.Join(existing, "catalog.db"), []byte("x"), 0o600)
	newStoreCleanup(existing)()
	if _, err := os.Stat(filepath.Join(existing, "catalog.db")); err != nil {
		t.Errorf("existing store touched: %v", err)
	}
}
