package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/test/testrand"
)

// ckptfsBin is the binary under test, built once by TestMain.
var ckptfsBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ckptfs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ckptfsBin = filepath.Join(dir, "ckptfs")
	build := exec.Command("go", "build", "-o", ckptfsBin, "../cmd/ckptfs")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build ckptfs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is a `ckptfs mount` process.
type daemon struct {
	t      testing.TB
	cmd    *exec.Cmd
	store  string
	mnt    string
	stderr *syncBuffer // what the daemon wrote to stderr so far
	done   chan error
}

// syncBuffer is a bytes.Buffer that a running daemon writes to (through
// exec's copying goroutine) while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startDaemon runs `ckptfs mount store mnt` and waits until the mount serves.
func startDaemon(t testing.TB, store, mnt string, extra ...string) *daemon {
	t.Helper()
	return startDaemonUnder(t, nil, store, mnt, extra...)
}

// startDaemonUnder is startDaemon with the daemon run by a wrapper command
// (e.g. prlimit --nofile=N:N --): wrap's words, then the binary's.
func startDaemonUnder(t testing.TB, wrap []string, store, mnt string, extra ...string) *daemon {
	t.Helper()
	argv := append(append(append(append([]string{}, wrap...), ckptfsBin, "mount"), extra...), store, mnt)
	d, err := launch(t, exec.Command(argv[0], argv[1:]...), store, mnt, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// launch is how every test starts a daemon: it starts cmd, a `ckptfs
// mount … store mnt` the caller has prepared (user, environment, wrapper;
// launch takes its stdout and stderr), and waits up to wait for the line
// "serving" (polling the mountpoint is not enough: a dead mount's cached
// attributes still stat). A daemon that exits first or does not come up in
// time is killed and returned as an error, so a caller that expects a mount
// to fail (the power-loss suite) can tell; otherwise it is killed and its
// mount detached when the test ends.
func launch(t testing.TB, cmd *exec.Cmd, store, mnt string, wait time.Duration) (*daemon, error) {
	d := &daemon{t: t, cmd: cmd, store: store, mnt: mnt, stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	serving := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving") && !ok {
				ok = true
				serving <- true
			}
		}
		if !ok {
			serving <- false
		}
	}()
	go func() { d.done <- d.cmd.Wait() }()
	select {
	case ok := <-serving:
		if ok {
			t.Cleanup(d.kill)
			return d, nil
		}
		err := <-d.done
		d.done <- err
		d.kill()
		return nil, fmt.Errorf("ckptfs mount exited early: %v: %s", err, strings.TrimSpace(d.stderr.String()))
	case <-time.After(wait):
		d.kill()
		return nil, fmt.Errorf("ckptfs mount did not come up in %v: %s", wait, d.stderr)
	}
}

// stop sends sig and waits for a clean exit.
func (d *daemon) stop(sig os.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			d.t.Fatalf("ckptfs mount exited with %v\n%s", err, d.stderr)
		}
	case <-time.After(30 * time.Second):
		d.t.Fatalf("ckptfs mount did not exit after %v\n%s", sig, d.stderr)
	}
	if mounted(d.t, d.mnt) {
		d.t.Fatalf("%s still mounted after the daemon exited", d.mnt)
	}
}

func (d *daemon) kill() {
	select {
	case err := <-d.done:
		d.done <- err
	default:
		d.cmd.Process.Kill()
		err := <-d.done
		d.done <- err
	}
	if mounted(d.t, d.mnt) {
		syscall.Unmount(d.mnt, syscall.MNT_DETACH)
	}
}

func mounted(t testing.TB, mnt string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == mnt {
			return true
		}
	}
	return false
}

// ckptfs runs the CLI and returns its exit code, stdout and stderr.
func ckptfs(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(ckptfsBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

func statsJSON(t testing.TB, path string) map[string]int64 {
	t.Helper()
	code, out, errOut := ckptfs(t, "stats", "--json", path)
	if code != 0 {
		t.Fatalf("ckptfs stats %s: exit %d: %s", path, code, errOut)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, out)
	}
	m := map[string]int64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			m[k] = int64(f)
		}
	}
	return m
}

func randBytes(seed uint64, n int) []byte { return testrand.Bytes(seed, n) }

func TestDaemonLifecycle(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	data := randBytes(1, 5<<20+3)
	for _, p := range []string{"runs/a/1/model.bin", "runs/b/1/model.bin"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(mnt, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mnt, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	live := statsJSON(t, mnt)
	if live["files"] != 2 || live["logical_bytes"] != 2*int64(len(data)) || live["unique_bytes"] != int64(len(data)) {
		t.Fatalf("stats of the mount: %v", live)
	}
	for _, k := range []string{"files", "logical_bytes", "unique_bytes", "stored_bytes", "chunks", "store_read_bytes"} {
		if _, ok := live[k]; !ok {
			t.Errorf("stats.json lacks %q", k)
		}
	}
	// The store is locked while mounted: stats on it points at the mount.
	if code, _, errOut := ckptfs(t, "stats", store); code != 1 || !strings.Contains(errOut, "in use") {
		t.Errorf("stats on a mounted store: exit %d, %q", code, errOut)
	}
	d.stop(syscall.SIGTERM)

	offline := statsJSON(t, store)
	for _, k := range []string{"files", "logical_bytes", "unique_bytes", "stored_bytes", "chunks"} {
		if offline[k] != live[k] {
			t.Errorf("offline %s = %d, mounted said %d", k, offline[k], live[k])
		}
	}
	if code, out, _ := ckptfs(t, "stats", store); code != 0 || !strings.Contains(out, "dedup ratio") {
		t.Errorf("stats table: exit %d\n%s", code, out)
	}

	d = startDaemon(t, store, mnt)
	for _, p := range []string{"runs/a/1/model.bin", "runs/b/1/model.bin"} {
		got, err := os.ReadFile(filepath.Join(mnt, p))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s after remount: %v", p, err)
		}
	}
	if st := statsJSON(t, mnt); st["store_read_bytes"] != int64(len(data)) {
		t.Errorf("store_read_bytes %d after reading two copies of %d bytes (one from the store, one from cache)", st["store_read_bytes"], len(data))
	}
	d.stop(os.Interrupt)
}

// TestStaleMountIsCleared: after the daemon dies the mountpoint gives ENOTCONN;
// the next mount clears it.
func TestStaleMountIsCleared(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "runs", "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Kill()
	<-d.done
	d.done <- nil
	if _, err := os.Stat(filepath.Join(mnt, "runs")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("dead mount: %v, want ENOTCONN", err)
	}
	d = startDaemon(t, store, mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "runs", "f"))
	if err != nil || string(got) != "kept" {
		t.Fatalf("after remount: %q %v", got, err)
	}
	d.stop(syscall.SIGTERM)
}

func TestMountErrors(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	notStore := filepath.Join(tmp, "not-a-store")
	if err := os.MkdirAll(filepath.Join(notStore, "precious"), 0o755); err != nil {
		t.Fatal(err)
	}

	// A mounted store, for the busy and locked cases.
	busyStore, busyMnt := filepath.Join(tmp, "busy-store"), filepath.Join(tmp, "busy-mnt")
	os.Mkdir(busyMnt, 0o755)
	d := startDaemon(t, busyStore, busyMnt)
	defer d.stop(syscall.SIGTERM)

	// A store written by a newer ckptfs.
	newer := filepath.Join(tmp, "newer")
	if code, _, errOut := ckptfs(t, "stats", newer); code == 0 {
		t.Fatalf("stats of a missing store succeeded: %s", errOut)
	}
	makeNewerStore(t, newer)

	// A read-only filesystem as the store directory.
	ro := filepath.Join(tmp, "ro")
	os.Mkdir(ro, 0o755)
	if err := syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
		t.Fatalf("mount read-only tmpfs: %v", err)
	}
	defer syscall.Unmount(ro, syscall.MNT_DETACH)

	freeMnt := filepath.Join(tmp, "free-mnt")
	os.Mkdir(freeMnt, 0o755)
	cases := []struct {
		name, store, mnt, want string
		storeMustNotExist      bool
	}{
		{"missing mountpoint", filepath.Join(tmp, "s1"), filepath.Join(tmp, "nope"), "does not exist", true},
		{"mountpoint is a file", filepath.Join(tmp, "s2"), file, "not a directory", true},
		{"busy mountpoint", filepath.Join(tmp, "s3"), busyMnt, "busy", true},
		{"store already mounted", busyStore, freeMnt, "in use by another process", false},
		{"store not writable", ro, freeMnt, "not writable", false},
		{"newer format", newer, freeMnt, "newer", false},
		{"directory that is not a store", notStore, freeMnt, "not a ckptfs store", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := ckptfs(t, "mount", c.store, c.mnt)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stderr %q", code, errOut)
			}
			if lines := strings.Count(strings.TrimSpace(errOut), "\n"); lines != 0 || !strings.Contains(errOut, c.want) {
				t.Fatalf("stderr %q: want one line containing %q", errOut, c.want)
			}
			if c.storeMustNotExist {
				if _, err := os.Stat(c.store); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("failed mount created the store: %v", err)
				}
			}
			if mounted(t, freeMnt) {
				t.Fatalf("failed mount left %s mounted", freeMnt)
			}
		})
	}
	if ents, _ := os.ReadDir(notStore); len(ents) != 1 {
		t.Errorf("refused mount changed %s: %d entries", notStore, len(ents))
	}
	// The busy daemon is unharmed.
	if _, err := os.Stat(filepath.Join(busyMnt, "runs")); err != nil {
		t.Errorf("busy mount broken: %v", err)
	}
}

func TestUsage(t *testing.T) {
	for _, cmd := range []string{"mount", "stats"} {
		code, _, errOut := ckptfs(t, cmd, "--help")
		if code != 0 || !strings.Contains(errOut, "Usage: ckptfs "+cmd) {
			t.Errorf("%s --help: exit %d\n%s", cmd, code, errOut)
		}
		if code, _, _ := ckptfs(t, cmd); code != 2 {
			t.Errorf("%s without arguments: exit %d, want 2", cmd, code)
		}
	}
	if code, _, errOut := ckptfs(t, "--help"); code != 0 || !strings.Contains(errOut, "mount") {
		t.Errorf("--help: exit %d\n%s", code, errOut)
	}
	if code, _, _ := ckptfs(t, "frobnicate"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if code, _, errOut := ckptfs(t, "mount", "--cache-size", "lots", "a", "b"); code != 2 || !strings.Contains(errOut, "bad size") {
		t.Errorf("bad --cache-size: exit %d %q", code, errOut)
	}
	if code, _, errOut := ckptfs(t, "mount", "--commit", "later", "a", "b"); code != 2 || !strings.Contains(errOut, "sync, async or remote") {
		t.Errorf("bad --commit: exit %d %q", code, errOut)
	}
}
