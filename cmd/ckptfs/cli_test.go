package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
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
		{[]string{"report", "-o"}, "flag -o needs a value"},
		{[]string{"stats"}, "want 1 argument(s), got 0"},
		{[]string{"mount", "--commit", "later", "a", "b"}, "--commit must be sync, async or remote"},
		{[]string{"mount", "--readahead-kb", "999999999", "a", "b"}, "--readahead-kb must be 0 (the kernel's default) to 65536 (64.0 MiB), not 999999999"},
		{[]string{"mount", "--readahead-kb=-1", "a", "b"}, "--readahead-kb must be 0"},
		{[]string{"mount", "--remote-timeout", "5s", "a", "b"}, "--remote-timeout needs --remote and a positive duration"},
		{[]string{"mount", "--remote", "s3://b/p", "--remote-timeout", "0s", "a", "b"}, "--remote-timeout needs --remote and a positive duration"},
		{[]string{"mount", "--remote", "s3://b/p", "--remote-timeout", "soon", "a", "b"}, `invalid value "soon" for --remote-timeout`},
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
			[]string{"512 MiB/2.00 GiB", "256 MiB/s", "ETA 6s"}},
		{gc.Progress{Phase: "mark", Done: 25000, Total: 100000}, 5 * time.Second,
			[]string{"25.0k/100k", "5000/s", "ETA 15s"}},
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
	args, logFile, err := helperArgs([]string{"/srv/store", "/mnt/ckpt", "-o", "rw,noauto,_netdev,x-systemd.automount,cache_size=1GiB,write_memory=512MiB,allow_other,metrics_addr=127.0.0.1:9477,log=/tmp/l"})
	if err != nil {
		t.Fatal(err)
	}
	want := "mount --cache-size=1GiB --write-memory=512MiB --allow-other --metrics-addr=127.0.0.1:9477 /srv/store /mnt/ckpt"
	if strings.Join(args, " ") != want || logFile != "/tmp/l" {
		t.Errorf("got %q log %q, want %q", strings.Join(args, " "), logFile, want)
	}
	args, _, err = helperArgs([]string{"/s", "/m", "-o", "nonempty"})
	if err != nil || strings.Join(args, " ") != "mount --nonempty /s /m" {
		t.Errorf("-o nonempty: %q %v", args, err)
	}
	for _, bad := range [][]string{
		{"/s"},
		{"/s", "/m", "-o", "log="},
		{"/s", "/m", "-o", "ro"},
		{"/s", "/m", "-o", "cache_size"},
		{"/s", "/m", "-o", "write_memory"},
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

// TestUnknownCommandSuggests: a mistyped command gets one line naming the
// command it was probably meant to be and a pointer to --help, not the
// whole usage.
func TestUnknownCommandSuggests(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"stat", `unknown command "stat": did you mean stats?`},
		{"mout", `unknown command "mout": did you mean mount?`},
		{"fsk", `unknown command "fsk": did you mean fsck?`},
		{"imp", `unknown command "imp": did you mean import?`},
		{"tensor", `did you mean tensors?`},
		{"nosuch", `unknown command "nosuch"` + "\n"},
	} {
		code, out, errOut := runCLI(tc.arg, "x")
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("ckptfs %s: exit %d, stderr %q; want exit 2 and %q", tc.arg, code, errOut, tc.want)
		}
		if strings.Contains(errOut, "Usage:") || strings.Count(errOut, "\n") != 2 || !strings.Contains(errOut, "ckptfs --help") {
			t.Errorf("ckptfs %s: want one line and a pointer to --help, got %q", tc.arg, errOut)
		}
	}
	if got := suggestCommand("nosuch"); got != "" {
		t.Errorf("suggestCommand(nosuch) = %q, want none", got)
	}
}

// TestHelpWritesDoubleDashFlags: every command's --help writes its flags
// as the README and the errors do: --allow-other, not -allow-other.
func TestHelpWritesDoubleDashFlags(t *testing.T) {
	singleDash := regexp.MustCompile(`(?m)^\s+-[a-z][a-z-]+`)
	for _, c := range commands {
		code, _, errOut := runCLI(c.name, "--help")
		if code != 0 || !strings.Contains(errOut, "Usage: ckptfs "+c.name) {
			t.Errorf("%s --help: exit %d %q", c.name, code, errOut)
		}
		if m := singleDash.FindString(errOut); m != "" {
			t.Errorf("%s --help writes a long flag with one dash: %q", c.name, m)
		}
	}
	_, _, errOut := runCLI("mount", "--help")
	for _, want := range []string{"\n  --allow-other\n", "\n  --cache-size value\n", "(default 256)", "\n  --commit string\n"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("mount --help lacks %q:\n%s", want, errOut)
		}
	}
	_, _, errOut = runCLI("report", "--help")
	if !strings.Contains(errOut, "\n  -o string\n") {
		t.Errorf("report --help: a one-letter flag keeps one dash:\n%s", errOut)
	}
}

// TestNumberFormat: one number format in every command's output:
// significant digits with their trailing zeros (1.80 beside 1.97), the
// report's 8.98 MiB where the CLI printed 9.0 MiB.
func TestNumberFormat(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{formatBytes(9416212), "8.98 MiB"},
		{formatBytes(1887437), "1.80 MiB"},
		{formatBytes(1023), "1023 B"},
		{formatBytes(1024), "1.00 KiB"},
		{formatBytes(12_900_000), "12.3 MiB"},
		{formatBytes(256 << 20), "256 MiB"},
		{formatBytes(1023*1024 + 1000), "1024 KiB"},
		{formatBytes(1_179_648), "1.13 MiB"}, // exactly 1.125: a half rounds up, as the report's toFixed
		{formatBytes(-3 << 20), "-3.00 MiB"},
		{formatSig(9.996, 3), "10.0"},
		{formatSig(1234.5, 3), "1235"},
		{formatSig(0, 3), "0.00"},
		{formatSig(0.00001234, 4), "1.234e-05"},
		{formatMetric(1.8), "1.800"},
		{formatMetric(1.97), "1.970"},
		{formatMetric(0.123456), "0.1235"},
		{formatMetric(math.NaN()), "NaN"},
		{formatMetric(math.Inf(-1)), "-Inf"},
		{ratioString(200, 100), "2.00x"},
		{ratioString(1970, 1000), "1.97x"},
		{ratioString(125, 10), "12.5x"},
		{humanCount(25000), "25.0k"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestReportFormatsNumbersAsTheCLI runs report.html's number formatting in
// headless Chromium (as test/history_test.go renders the report) and
// compares it with the CLI's on the same values.
func TestReportFormatsNumbersAsTheCLI(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("%s is missing: this test runs the report's script in it (apt-get install chromium; .ci/run does)", chromium)
	}
	start := strings.Index(reportPage, "  function fmtSig(")
	end := strings.Index(reportPage, "  // fmtTick")
	if start < 0 || end < start {
		t.Fatal("report.html: fmtSig .. fmtNum not found")
	}
	bytesIn := []int64{0, 1, 1023, 1024, 1536, 1_179_648, 1887437, 9416212, 12_900_000, 256 << 20, 1023*1024 + 1000, 5 << 40, 123456789012}
	sigIn := []float64{1.8, 1.97, 0.123456, 9.996, 1234.5, 0.00001234, 1e16, -2.5, 0.5, 123.45, 99.95, 3.14159}
	var wantB, wantS []string
	for _, n := range bytesIn {
		wantB = append(wantB, formatBytes(n))
	}
	for _, v := range sigIn {
		wantS = append(wantS, formatMetric(v), formatSig(v, 3))
	}
	bj, _ := json.Marshal(bytesIn)
	sj, _ := json.Marshal(sigIn)
	page := "<html><body><script>\n" + reportPage[start:end] +
		"var b = " + string(bj) + ".map(fmtBytes), s = [];\n" +
		sj2loop(string(sj)) +
		"document.body.textContent = JSON.stringify({b: b, s: s});\n</script></body></html>"
	dir := t.TempDir()
	html := filepath.Join(dir, "fmt.html")
	if err := os.WriteFile(html, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--dump-dom", "file://"+html)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := stdout.String()
	i, j := strings.Index(dom, "{\"b\""), strings.LastIndex(dom, "}")
	if i < 0 || j < i {
		t.Fatalf("no result in the page:\n%s", dom)
	}
	var got struct{ B, S []string }
	if err := json.Unmarshal([]byte(dom[i:j+1]), &got); err != nil {
		t.Fatalf("%v: %s", err, dom[i:j+1])
	}
	if !slices.Equal(got.B, wantB) {
		t.Errorf("bytes: report %q\n        CLI    %q", got.B, wantB)
	}
	if !slices.Equal(got.S, wantS) {
		t.Errorf("numbers: report %q\n          CLI    %q", got.S, wantS)
	}
}

// sj2loop is the script that formats each of the JSON array vals as a
// metric and to 3 significant digits, in the order the test expects.
func sj2loop(vals string) string {
	return vals + ".forEach(function (v) { s.push(fmtNum(v), fmtSig(v, 3)); });\n"
}

// TestDaemonFailed: the error a helper reports for a daemon that died before
// its mount was live is the daemon's own message, not the pointer to --help
// or the flags' help that follow a usage error.
func TestDaemonFailed(t *testing.T) {
	for _, tc := range []struct{ log, want string }{
		{"ckptfs mount: invalid value \"lots\" for --cache-size: bad size\nRun 'ckptfs mount --help' for usage.", `invalid value "lots" for --cache-size: bad size`},
		{"ckptfs mount: want 2 argument(s), got 1\n\nUsage: ckptfs mount [flags] STORE MOUNTPOINT\n\nFlags:\n  --allow-other\n    \tlet other users", "want 2 argument(s), got 1"},
		{"ckptfs: 2026/11/26 19:00:00 chunk cache 256 MiB\nckptfs mount: mountpoint /m is busy", "mountpoint /m is busy"},
		{"panic: something odd", "panic: something odd"},
		{"", "the daemon exited (exit status 2) before the mount was live"},
	} {
		if got := daemonFailed(errors.New("exit status 2"), tc.log); got.Error() != tc.want {
			t.Errorf("daemonFailed(%q) = %q, want %q", tc.log, got, tc.want)
		}
	}
}

// TestBackgroundUsageErrors: mount --background refuses bad flags itself,
// as a usage error (exit 2), before it starts a daemon.
func TestBackgroundUsageErrors(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "bg.log")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--readahead-kb", "-1"}, "--readahead-kb must be 0"},
		{[]string{"--commit", "later"}, "--commit must be sync, async or remote"},
		{[]string{"--delta-keyframe", "0"}, "--delta-keyframe must be 1"},
		{[]string{"--delta-latest", "newest"}, "--delta-latest must be whole or delta"},
		{[]string{"--inline-encoders", "-3"}, "--inline-encoders must be -1"},
		{[]string{"--cache-size", "0"}, "--cache-size must be more than 0"},
		{[]string{"--write-memory", "0"}, "--write-memory must be more than 0"},
		{[]string{"--write-memory", "lots"}, `invalid value "lots" for --write-memory: bad size`},
		{[]string{"--node-limit", "-2"}, "--node-limit must be -1"},
	} {
		args := append(append([]string{"mount", "--background", "--log", logFile}, tc.args...), filepath.Join(dir, "s"), filepath.Join(dir, "m"))
		code, _, errOut := runCLI(args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("mount --background %v: exit %d %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	if _, err := os.Stat(logFile); !os.IsNotExist(err) {
		t.Errorf("a daemon was started (its log exists): %v", err)
	}
}

// TestDeltaLatestDefault: the newest version stays whole by default, and
// is a delta at once by default with --remote (whose bucket keeps objects
// as first uploaded); either can be asked for.
func TestDeltaLatestDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--delta-latest", "delta"}, false},
		{[]string{"--remote", "s3://b/p"}, false},
		{[]string{"--remote", "s3://b/p", "--delta-latest", "whole"}, true},
	} {
		args := append(append([]string{}, tc.args...), "store", "mnt")
		cfg, err := parseMount(commands[0], args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.latestWhole != tc.want {
			t.Errorf("%v: latest whole %v, want %v", tc.args, cfg.latestWhole, tc.want)
		}
	}
}
