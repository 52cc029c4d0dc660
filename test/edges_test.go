package test

// The edges a user meets first (issue #26): mount --background from a
// working directory, swapped arguments, a mountpoint with files in it,
// mount(8)'s helper passing on the daemon's error, a store directory made
// with mkdir, and make install with a PREFIX.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitUnmounted waits until the daemon logging to logFile has finished.
func waitUnmounted(t *testing.T, logFile string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		log, _ := os.ReadFile(logFile)
		if strings.Contains(string(log), "unmounted") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not finish after the unmount:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unmountNow unmounts mnt (if mounted) and waits for its daemon.
func unmountNow(t *testing.T, mnt, logFile string) {
	t.Helper()
	if !mounted(t, mnt) {
		return
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Errorf("umount %s: %v %s", mnt, err, out)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		return
	}
	waitUnmounted(t, logFile)
}

// runBounded runs cmd and returns its exit code, stdout and stderr; a
// command still running after 30 s (a mount that should have been refused
// and now serves in the foreground) is killed and fails the test.
func runBounded(t *testing.T, cmd *exec.Cmd) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v still running after 30 s: %q %q", cmd.Args, out.String(), errOut.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// ckptfsIn runs the CLI in dir, bounded in time.
func ckptfsIn(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(ckptfsBin, args...)
	cmd.Dir = dir
	return runBounded(t, cmd)
}

// TestMountBackgroundRelativePaths: `mount --background` resolves STORE,
// MOUNTPOINT and --log against the working directory (the daemon runs in /),
// with flags before, between and after them; the daemon's log tells how to
// unmount it, not to press Ctrl-C.
func TestMountBackgroundRelativePaths(t *testing.T) {
	dir := t.TempDir()
	tag := filepath.Base(dir) // names that exist nowhere else, / included
	store, mnt, logFile := "store-"+tag, "mnt-"+tag, "bg-"+tag+".log"
	if err := os.Mkdir(filepath.Join(dir, mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ckptfsIn(t, dir, "mount", "--background", store, "--cache-size", "64MiB", mnt, "--log", logFile)
	absMnt, absLog := filepath.Join(dir, mnt), filepath.Join(dir, logFile)
	defer unmountNow(t, absMnt, absLog)
	if code != 0 {
		log, _ := os.ReadFile(absLog)
		t.Fatalf("mount --background with relative paths: exit %d %q %q\n%s", code, out, errOut, log)
	}
	if !mounted(t, absMnt) {
		t.Fatalf("%s is not mounted", absMnt)
	}
	if _, err := os.Stat(filepath.Join(dir, store, "catalog.db")); err != nil {
		t.Errorf("the store is not in the working directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/", store)); !os.IsNotExist(err) {
		t.Errorf("a store was made at /%s: %v", store, err)
	}
	if err := os.WriteFile(filepath.Join(absMnt, "runs", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(absLog)
	if err != nil {
		t.Fatalf("the log is not where --log said, relative to the working directory: %v", err)
	}
	if s := string(log); !strings.Contains(s, "serving") || strings.Contains(s, "Ctrl-C") || !strings.Contains(s, "unmount: umount "+absMnt) {
		t.Errorf("the background daemon's log should say how to unmount it, and not Ctrl-C:\n%s", s)
	}
	unmountNow(t, absMnt, absLog)
}

// TestMountRefusesSwappedArgsAndNonEmptyMountpoint: a store given as the
// mountpoint is refused as a likely swap, and a mountpoint with files in it
// is refused (naming them) unless --nonempty (mount(8): -o nonempty); a
// refusal creates nothing and mounts nothing, in the foreground and in the
// background.
func TestMountRefusesSwappedArgsAndNonEmptyMountpoint(t *testing.T) {
	tmp := t.TempDir()
	store, mnt := filepath.Join(tmp, "store"), filepath.Join(tmp, "mnt")
	os.Mkdir(mnt, 0o755)
	d := startDaemon(t, store, mnt) // a real store with a file in it
	os.WriteFile(filepath.Join(mnt, "runs", "kept"), []byte("kept"), 0o644)
	d.stop(syscall.SIGTERM)

	full := filepath.Join(tmp, "full")
	os.MkdirAll(filepath.Join(full, "b-dir"), 0o755)
	os.WriteFile(filepath.Join(full, "a.txt"), []byte("mine"), 0o644)
	logFile := filepath.Join(tmp, "bg.log")
	for _, tc := range []struct {
		name      string
		args      []string
		want      []string
		untouched string // a directory the refusal must leave as it was
	}{
		{"swapped", []string{"mount", mnt, store}, []string{"mountpoint " + store + " is a ckptfs store", "did you swap STORE and MOUNTPOINT?"}, mnt},
		{"swapped in the background", []string{"mount", "--background", "--log", logFile, mnt, store}, []string{"did you swap STORE and MOUNTPOINT?"}, mnt},
		{"non-empty mountpoint", []string{"mount", filepath.Join(tmp, "new-store"), full}, []string{"mountpoint " + full + " is not empty (a.txt, b-dir)", "--nonempty"}, full},
		{"non-empty in the background", []string{"mount", "--background", "--log", logFile, filepath.Join(tmp, "new-store"), full}, []string{"is not empty (a.txt, b-dir)"}, full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadDir(tc.untouched)
			defer func() {
				for _, m := range []string{store, full} {
					if mounted(t, m) {
						syscall.Unmount(m, syscall.MNT_DETACH)
					}
				}
			}()
			code, _, errOut := ckptfsIn(t, "/", tc.args...)
			if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Fatalf("exit %d, stderr %q: want exit 1 and one line", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
			if after, _ := os.ReadDir(tc.untouched); len(after) != len(before) {
				t.Errorf("%s: %d entries before the refused mount, %d after", tc.untouched, len(before), len(after))
			}
			if _, err := os.Stat(filepath.Join(tmp, "new-store")); !os.IsNotExist(err) {
				t.Errorf("a refused mount created a store: %v", err)
			}
			if mounted(t, store) || mounted(t, full) {
				t.Fatal("a refused mount mounted")
			}
		})
	}
	if got, err := os.ReadFile(filepath.Join(store, "catalog.db")); err != nil || len(got) == 0 {
		t.Fatalf("the store was harmed: %v", err)
	}

	// --nonempty mounts over the files; they are there again after.
	d = startDaemon(t, filepath.Join(tmp, "new-store"), full, "--nonempty")
	if _, err := os.Stat(filepath.Join(full, "a.txt")); !os.IsNotExist(err) {
		t.Errorf("a.txt shows through the mount: %v", err)
	}
	d.stop(syscall.SIGTERM)
	if got, err := os.ReadFile(filepath.Join(full, "a.txt")); err != nil || string(got) != "mine" {
		t.Fatalf("after the --nonempty mount: %q %v", got, err)
	}
	// mount(8)'s helper: refused in its words, then -o nonempty.
	helper := helperLink(t)
	code, _, errOut := runBounded(t, exec.Command(helper, filepath.Join(tmp, "new-store"), full, "-o", "log="+logFile))
	if code != 32 || !strings.Contains(errOut, "is not empty (a.txt, b-dir)") || !strings.Contains(errOut, "give -o nonempty") {
		t.Errorf("mount.fuse.ckptfs over a non-empty directory: exit %d %q", code, errOut)
	}
	out, err := exec.Command(helper, filepath.Join(tmp, "new-store"), full, "-o", "nonempty,log="+logFile).CombinedOutput()
	defer unmountNow(t, full, logFile)
	if err != nil || !mounted(t, full) {
		t.Fatalf("mount.fuse.ckptfs -o nonempty: %v %s", err, out)
	}
	unmountNow(t, full, logFile)
}

// helperLink returns a mount.fuse.ckptfs link to the binary under test: the
// name mount(8) runs (what `make install` links in SBINDIR).
func helperLink(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mount.fuse.ckptfs")
	if err := os.Symlink(ckptfsBin, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMountHelperReportsDaemonErrors: a mount that mount(8)'s helper starts
// and that fails says why on the helper's stderr, in one line and in the
// options' words, with mount(8)'s status (32); a readahead out of range and
// a log in a directory that does not exist fail so too; nothing is created
// or mounted.
func TestMountHelperReportsDaemonErrors(t *testing.T) {
	helper := helperLink(t)
	tmp := t.TempDir()
	store, mnt := filepath.Join(tmp, "store"), filepath.Join(tmp, "mnt")
	os.Mkdir(mnt, 0o755)
	logFile := filepath.Join(tmp, "d.log")
	for _, tc := range []struct {
		opts string
		code int
		want string
	}{
		{"cache_size=lots,log=" + logFile, 32, `invalid value "lots" for cache_size: bad size "lots"`},
		{"readahead_kb=999999999,log=" + logFile, 32, "readahead_kb must be 0 (the kernel's default) to 65536 (64.0 MiB), not 999999999"},
		{"readahead_kb=-1,log=" + logFile, 32, "readahead_kb must be 0 (the kernel's default) to 65536"},
		{"inline_encoders=-5,log=" + logFile, 32, "inline_encoders must be -1"},
		{"log=" + filepath.Join(tmp, "no-such-dir", "d.log"), 32, "directory " + filepath.Join(tmp, "no-such-dir") + " does not exist"},
		{"log=", 1, "option log needs a value"},
	} {
		t.Run(tc.opts, func(t *testing.T) {
			code, _, msg := runBounded(t, exec.Command(helper, store, mnt, "-o", tc.opts))
			if code != tc.code || !strings.Contains(msg, tc.want) {
				t.Errorf("-o %s: exit %d, stderr %q; want %d and %q", tc.opts, code, msg, tc.code, tc.want)
			}
			if strings.Contains(msg, "Run 'ckptfs") || strings.Contains(msg, "--") {
				t.Errorf("-o %s: the daemon's words, not the helper's: %q", tc.opts, msg)
			}
			if tc.code == 32 && strings.Count(strings.TrimSpace(msg), "\n") != 0 {
				t.Errorf("-o %s: want one line, got %q", tc.opts, msg)
			}
			if mounted(t, mnt) {
				syscall.Unmount(mnt, syscall.MNT_DETACH)
				t.Fatalf("-o %s: mounted", tc.opts)
			}
			if _, err := os.Stat(store); !os.IsNotExist(err) {
				t.Errorf("-o %s: a failed mount left the store: %v", tc.opts, err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(tmp, "no-such-dir")); !os.IsNotExist(err) {
		t.Errorf("the log's missing directory was created: %v", err)
	}
	// ckptfs mount --background, the same.
	code, _, errOut := ckptfsIn(t, "/", "mount", "--background", "--log", filepath.Join(tmp, "no-such-dir", "d.log"), store, mnt)
	if code != 1 || !strings.Contains(errOut, "does not exist") {
		t.Errorf("mount --background --log in a missing directory: exit %d %q", code, errOut)
	}
}

// TestStoreMadeWithMkdirIsMadePrivate: a store directory the user made with
// mkdir (0755) is made 0700 at mount, and the mount says so: on stderr in
// the foreground, and on the terminal of `mount --background` (the
// daemon's log has it too).
func TestStoreMadeWithMkdirIsMadePrivate(t *testing.T) {
	tmp := t.TempDir()
	for _, bg := range []bool{false, true} {
		store, mnt := filepath.Join(tmp, fmt.Sprintf("store-%v", bg)), filepath.Join(tmp, fmt.Sprintf("mnt-%v", bg))
		os.Mkdir(mnt, 0o755)
		if err := os.Mkdir(store, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(store, 0o755) // whatever the umask
		want := "store " + store + " was mode 0755, open to other users: made it 0700"
		if bg {
			logFile := filepath.Join(tmp, "bg.log")
			code, _, errOut := ckptfsIn(t, "/", "mount", "--background", "--log", logFile, store, mnt)
			if code != 0 {
				t.Fatalf("mount --background: exit %d %q", code, errOut)
			}
			if !strings.Contains(errOut, want) {
				t.Errorf("mount --background does not say it made the store private: %q", errOut)
			}
			log, _ := os.ReadFile(logFile)
			if !strings.Contains(string(log), want) {
				t.Errorf("the daemon's log does not say it made the store private:\n%s", log)
			}
			if m := mode(t, store).Perm(); m != 0o700 {
				t.Errorf("store mode %04o, want 0700", m)
			}
			unmountNow(t, mnt, logFile)
			continue
		}
		d := startDaemon(t, store, mnt)
		if m := mode(t, store).Perm(); m != 0o700 {
			t.Errorf("store mode %04o, want 0700", m)
		}
		d.stop(syscall.SIGTERM)
		if !strings.Contains(d.stderr.String(), want) {
			t.Errorf("mount does not say it made the store private:\n%s", d.stderr)
		}
	}
}

// TestMakeInstallStaysInPrefix: make install writes mount(8)'s helpers in
// /sbin for the system prefixes, and under PREFIX for any other one unless
// SBINDIR says otherwise (make -n: what it would run).
func TestMakeInstallStaysInPrefix(t *testing.T) {
	for _, tc := range []struct {
		vars   []string
		sbin   string
		prefix string
	}{
		{nil, "/sbin", "/usr/local"},
		{[]string{"PREFIX=/usr"}, "/sbin", "/usr"},
		{[]string{"PREFIX=/x"}, "/x/sbin", "/x"},
		{[]string{"PREFIX=/x", "SBINDIR=/sbin"}, "/sbin", "/x"},
		{[]string{"PREFIX=/x", "DESTDIR=/stage"}, "/stage/x/sbin", "/x"},
	} {
		out, err := exec.Command("make", append([]string{"-n", "-C", "..", "install"}, tc.vars...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n install %v: %v\n%s", tc.vars, err, out)
		}
		want := []string{"/bin/ckptfs " + tc.sbin + "/mount.fuse.ckptfs", "/bin/ckptfs " + tc.sbin + "/mount.ckptfs", tc.prefix + "/bin/ckptfs"}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("make -n install %v lacks %q:\n%s", tc.vars, w, out)
			}
		}
		for _, l := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(l, "install ") && !strings.HasPrefix(l, "ln ") {
				continue
			}
			for _, f := range strings.Fields(l)[1:] {
				if strings.HasPrefix(f, "/") && !strings.HasPrefix(f, "/stage/") && !strings.HasPrefix(f, tc.prefix+"/") && !strings.HasPrefix(f, tc.sbin+"/") && f != tc.sbin {
					t.Errorf("make install %v writes %s, outside PREFIX and SBINDIR: %q", tc.vars, f, l)
				}
			}
		}
	}
}

// TestOrdinaryUserQuickStart: the README's quick start as an ordinary
// user, from her home directory with relative paths: a store she made with
// mkdir is made private and she is told so; the mount is hers, through
// fusermount3; the daemon's log tells her how to unmount it.
func TestOrdinaryUserQuickStart(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 is not installed (Debian: apt install fuse3; .ci/run installs it)")
	}
	carol := newTestUser(t, "q")
	home, bin := sharedDir(t, carol)
	for _, dir := range []string{"store", "mnt"} {
		if code, _, errOut := carol.run(t, "mkdir", "-m", "0755", filepath.Join(home, dir)); code != 0 {
			t.Fatal(errOut)
		}
	}
	cmd := carol.command(bin, "mount", "--background", "--log", "mount.log", "store", "mnt")
	cmd.Dir = home
	code, _, errOut := runBounded(t, cmd)
	mnt, logFile := filepath.Join(home, "mnt"), filepath.Join(home, "mount.log")
	defer func() {
		if mounted(t, mnt) {
			exec.Command("fusermount3", "-u", "-z", mnt).Run()
		}
	}()
	if code != 0 {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("carol's mount --background: exit %d %q\n%s", code, errOut, log)
	}
	if want := "store " + filepath.Join(home, "store") + " was mode 0755, open to other users: made it 0700"; !strings.Contains(errOut, want) {
		t.Errorf("carol is not told her store was made private: %q", errOut)
	}
	if m := mode(t, filepath.Join(home, "store")).Perm(); m != 0o700 {
		t.Errorf("carol's store: mode %04o, want 0700", m)
	}
	info, _ := os.ReadFile("/proc/self/mountinfo")
	if !strings.Contains(string(info), mnt+" ") || !strings.Contains(string(info), fmt.Sprintf("user_id=%d", carol.uid)) {
		t.Fatalf("no FUSE mount of carol's at %s", mnt)
	}
	log, _ := os.ReadFile(logFile)
	if !strings.Contains(string(log), "unmount: fusermount3 -u "+mnt) || strings.Contains(string(log), "Ctrl-C") {
		t.Errorf("the daemon's log should tell carol to run fusermount3 -u:\n%s", log)
	}
	if code, _, errOut := carol.run(t, "fusermount3", "-u", mnt); code != 0 {
		t.Fatalf("fusermount3 -u: %s", errOut)
	}
	waitUnmounted(t, logFile)
}
