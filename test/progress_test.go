package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/test/s3test"
)

// Progress of the long commands (issue #26, item 10): on a terminal stderr
// gets a line redrawn with bytes, rate and ETA; elsewhere one summary line;
// --json stays as it was, with nothing on stderr.

// inTerminal runs the CLI with a pseudo-terminal for stdin, stdout and
// stderr (script(1) from util-linux) and returns everything it wrote there.
func inTerminal(t testing.TB, args ...string) string {
	t.Helper()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Fatalf("script(1) (util-linux) runs the CLI on a pseudo-terminal: %v", err)
	}
	line := ckptfsBin
	for _, a := range args {
		line += " '" + a + "'"
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(script, "-qec", line, "/dev/null")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("ckptfs %s on a terminal: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String()
}

// redraw matches one redraw of a bar: carriage return, erase the line, the
// phase.
func redraw(phase string) *regexp.Regexp {
	return regexp.MustCompile(`\r\x1b\[K` + phase + ` +\[[#.]{30}\] [0-9.]+ [KMG]?i?B/[0-9.]+ [KMG]?i?B`)
}

// TestProgressSummaries: import, gc and fsck --read-data through a mount,
// with stderr a pipe, write exactly one line there, naming the bytes copied,
// freed or read, and the time; with --json, nothing. On a terminal they draw
// their bars and clear them before the result.
func TestProgressSummaries(t *testing.T) {
	tmp := t.TempDir()
	store, mnt := filepath.Join(tmp, "store"), filepath.Join(tmp, "mnt")
	os.MkdirAll(mnt, 0o755)
	src := filepath.Join(tmp, "src")
	os.MkdirAll(src, 0o755)
	for i, name := range []string{"a.bin", "b.bin"} {
		if err := os.WriteFile(filepath.Join(src, name), randBytes(uint64(60+i), 16<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	startDaemon(t, store, mnt)

	num := `[0-9]+`
	size := `[0-9.]+ [KMG]?i?B`
	for _, tc := range []struct {
		args   []string
		stderr string // the one line, a regexp
		stdout string // in stdout
	}{
		{[]string{"import", mnt, src, "runs/one"}, `import: copied 2 files, 32.0 MiB in [0-9.]+s \(` + size + `/s\); added 32.0 MiB to the store`, "imported"},
		{[]string{"import", "--json", mnt, src, "runs/two"}, "", `"logical_bytes": 33554432`},
		{[]string{"rm", filepath.Join(mnt, "runs/one")}, "", ""},
		{[]string{"gc", "--grace", "0", mnt}, `gc: freed 0 B \(0 chunks\) of ` + num + ` (?:objects|packs|objects and ` + num + ` packs) in [0-9.]+s`, "freed 0 chunks"},
		{[]string{"rm", filepath.Join(mnt, "runs/two/a.bin")}, "", ""},
		{[]string{"gc", "--grace", "0", mnt}, `gc: freed 16.0 MiB \((` + num + `) chunks(?:, ` + num + ` whole packs)?\) of ` + num + ` (?:objects|packs|objects and ` + num + ` packs) in [0-9.]+s`, "freed "},
		{[]string{"gc", "--grace", "0", "--json", mnt}, "", `"freed_chunks": 0`},
		{[]string{"fsck", "--read-data", mnt}, `fsck: checked 1 files, (` + num + `) chunks, read and verified ` + num + ` objects, 16.0 MiB in [0-9.]+s \(` + size + `/s\); 0 problems`, "0 problems"},
		{[]string{"fsck", "--read-data", "--json", mnt}, "", `"files": 1`},
	} {
		name := strings.Join(tc.args, " ")
		if tc.args[0] == "rm" {
			if err := os.RemoveAll(tc.args[1]); err != nil {
				t.Fatal(err)
			}
			continue
		}
		code, out, errOut := ckptfs(t, tc.args...)
		if code != 0 {
			t.Fatalf("ckptfs %s: exit %d\n%s%s", name, code, out, errOut)
		}
		t.Logf("ckptfs %s: stderr %q", name, errOut)
		if tc.stderr == "" && errOut != "" {
			t.Errorf("ckptfs %s: stderr %q, want nothing", name, errOut)
		}
		if tc.stderr != "" && !regexp.MustCompile(`^`+tc.stderr+`\n$`).MatchString(errOut) {
			t.Errorf("ckptfs %s: stderr %q, want one line matching %q", name, errOut, tc.stderr)
		}
		if !strings.Contains(out, tc.stdout) {
			t.Errorf("ckptfs %s: stdout %q, want %q in it", name, out, tc.stdout)
		}
		// The chunk counts agree with the results on stdout.
		if m := regexp.MustCompile(tc.stderr).FindStringSubmatch(errOut); len(m) > 1 {
			var want string
			switch tc.args[0] {
			case "gc":
				want = "freed " + m[1] + " chunks"
			case "fsck":
				want = m[1] + " chunks"
			}
			if !strings.Contains(out, want) {
				t.Errorf("ckptfs %s: stderr says %q, stdout does not: %q", name, m[0], out)
			}
		}
	}

	// On a terminal: the bar, then its line cleared, then the result.
	for _, tc := range []struct {
		args  []string
		phase string
		last  string
	}{
		{[]string{"import", mnt, src, "runs/three"}, "import", "imported "},
		{[]string{"fsck", "--read-data", mnt}, "read", "checked "},
	} {
		out := inTerminal(t, tc.args...)
		name := strings.Join(tc.args, " ")
		if !redraw(tc.phase).MatchString(out) {
			t.Errorf("ckptfs %s on a terminal: no %s bar in %q", name, tc.phase, out)
		}
		if i, j := strings.LastIndex(out, "\r\x1b[K"), strings.Index(out, tc.last); i < 0 || j < i || strings.Contains(out[i:j], tc.phase) {
			t.Errorf("ckptfs %s on a terminal: the bar is not cleared before the result: %q", name, out)
		}
		if strings.Contains(out, tc.args[0]+": ") {
			t.Errorf("ckptfs %s on a terminal: a summary line besides the bar: %q", name, out)
		}
	}
}

// TestSyncProgress: ckptfs sync says what it uploaded, also when the round
// it waited for was the daemon's (the upload starts at the commit); with
// stderr a pipe, that line on stdout is all; on a terminal stderr shows the
// upload with its rate and ETA. Every PUT is slowed by a proxy so that the
// upload outlasts a few redraws.
func TestSyncProgress(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	tmp := t.TempDir()
	store, mnt := filepath.Join(tmp, "store"), filepath.Join(tmp, "mnt")
	os.MkdirAll(mnt, 0o755)
	startDaemon(t, store, mnt, remoteFlag, srv.URL("progress"))

	line := regexp.MustCompile(`^uploaded ([0-9]+) chunks, ([0-9.]+ MiB) in [0-9.]+s \([0-9.]+ [KM]iB/s\) to s3://` + s3test.Bucket + `/progress( at \S+)?(; [0-9.]+ MiB sent)?\n$`)
	proxy.Set(s3test.Fault{Match: s3test.IsPut, Delay: 200 * time.Millisecond})
	if err := os.WriteFile(filepath.Join(mnt, "one.bin"), randBytes(70, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ckptfs(t, "sync", mnt)
	t.Logf("sync: %q %q", out, errOut)
	if code != 0 || errOut != "" {
		t.Fatalf("sync: exit %d, stderr %q; want 0 and nothing", code, errOut)
	}
	m := line.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("sync: stdout %q, want one line matching %q", out, line)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 || m[2] == "0.0 MiB" {
		t.Errorf("sync waited for the daemon's upload of one.bin, and says %q", out)
	}
	if p := statsJSON(t, mnt)[statPending]; p != 0 {
		t.Errorf("%s = %d after sync", statPending, p)
	}
	code, out, errOut = ckptfs(t, "sync", mnt)
	if want := "nothing to upload: everything committed is in s3://" + s3test.Bucket + "/progress"; code != 0 || !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 1 || errOut != "" {
		t.Errorf("sync again: exit %d, %q %q; want one line %q…", code, out, errOut, want)
	}

	if err := os.WriteFile(filepath.Join(mnt, "two.bin"), randBytes(71, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	term := inTerminal(t, "sync", mnt)
	t.Logf("sync on a terminal: %q", term)
	withRate := regexp.MustCompile(redraw("upload").String() + `  [0-9.]+ [KM]iB/s  ETA [0-9]+s`)
	if n := len(withRate.FindAllString(term, -1)); n == 0 {
		t.Errorf("sync on a terminal: no redraw with a rate and an ETA in %q", term)
	}
	if !regexp.MustCompile(`\r\x1b\[Kuploaded [0-9]+ chunks`).MatchString(term) {
		t.Errorf("sync on a terminal: the bar is not cleared before what it uploaded: %q", term)
	}
}
