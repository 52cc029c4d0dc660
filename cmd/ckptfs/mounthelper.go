package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// mount(8) runs /sbin/mount.fuse.ckptfs STORE MOUNTPOINT [-sfnv] [-o OPTS]
// for `mount -t fuse.ckptfs STORE MOUNTPOINT -o OPTS` and for an fstab line
// of type fuse.ckptfs; `make install` links that name (and mount.ckptfs, for
// -t ckptfs) to the ckptfs binary, which then behaves as the helper: it
// starts `ckptfs mount` in a new session, waits until the mount is live (the
// daemon reports on a pipe named by $CKPTFS_READY_FD), and exits, so mount(8)
// returns while the daemon serves. A daemon that fails before that makes the
// helper exit 32 (mount(8)'s "mount failure") with the daemon's error.
//
// Options (-o, comma-separated): cache_size=SIZE, readahead_kb=N,
// commit=sync|async, inline_encoders=N, metrics_addr=HOST:PORT, allow_other,
// log=FILE (the daemon's log; default /var/log/ckptfs.log for root,
// ~/.cache/ckptfs/mount.log otherwise). mount(8)'s generic options (rw,
// defaults, auto, noauto, user, nofail, _netdev, x-systemd.*, nosuid, nodev,
// noatime, ...) are accepted and left to mount(8); ro is refused (a read-only
// mount is not supported).

// readyEnv names the descriptor on which a daemon started by the helper
// reports that its mount is live.
const readyEnv = "CKPTFS_READY_FD"

// isMountHelper reports whether the binary runs as mount(8)'s helper.
func isMountHelper(argv0 string) bool {
	b := filepath.Base(argv0)
	return b == "mount.fuse.ckptfs" || b == "mount.ckptfs"
}

// helperArgs turns the helper's arguments into `ckptfs mount` arguments and
// the log file.
func helperArgs(args []string) (mountArgs []string, logFile string, err error) {
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o":
			if i+1 == len(args) {
				return nil, "", errors.New("-o needs options")
			}
			opts = append(opts, strings.Split(args[i+1], ",")...)
			i++
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case a == "-t":
			i++ // the type: ours
		case a == "-s", a == "-f", a == "-n", a == "-v", a == "-N":
			// sloppy, fake, no mtab, verbose, namespace: nothing to do
		case strings.HasPrefix(a, "-"):
			return nil, "", fmt.Errorf("unknown option %q", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, "", fmt.Errorf("want STORE MOUNTPOINT, got %d argument(s)", len(pos))
	}
	var flags []string
	for _, o := range opts {
		k, v, hasV := strings.Cut(strings.TrimSpace(o), "=")
		switch k {
		case "":
		case "cache_size", "readahead_kb", "commit", "inline_encoders", "metrics_addr":
			if !hasV || v == "" {
				return nil, "", fmt.Errorf("option %s needs a value (%s=...)", k, k)
			}
			flags = append(flags, "--"+strings.ReplaceAll(k, "_", "-")+"="+v)
		case "allow_other":
			flags = append(flags, "--allow-other")
		case "log":
			logFile = v
		case "ro":
			return nil, "", errors.New("ckptfs mounts read-write only: drop the ro option")
		case "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "nofail", "_netdev",
			"nosuid", "suid", "nodev", "dev", "exec", "noexec", "atime", "noatime", "relatime", "norelatime",
			"strictatime", "lazytime", "sync", "async", "dirsync", "loop", "comment":
			// generic: mount(8)'s, or the FUSE defaults ckptfs uses anyway
		default:
			if strings.HasPrefix(k, "x-") || strings.HasPrefix(k, "comment") {
				continue
			}
			return nil, "", fmt.Errorf("unknown option %q (ckptfs knows cache_size, readahead_kb, commit, inline_encoders, metrics_addr, allow_other, log)", o)
		}
	}
	if logFile == "" {
		if logFile, err = defaultLogFile(); err != nil {
			return nil, "", fmt.Errorf("%w (give -o log=FILE)", err)
		}
	}
	return append(append([]string{"mount"}, flags...), pos...), logFile, nil
}

// defaultLogFile is where a daemon in the background logs: /var/log for
// root, the user's cache directory otherwise.
func defaultLogFile() (string, error) {
	if os.Geteuid() == 0 {
		return "/var/log/ckptfs.log", nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no place for the daemon's log: %w", err)
	}
	return filepath.Join(dir, "ckptfs", "mount.log"), nil
}

// mountInBackground is `ckptfs mount --background ARGS`: the same mount in a
// daemon of its own, returning once the mount is live.
func mountInBackground(args []string, logFile string) error {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--background" || a == "-background" || strings.HasPrefix(a, "--background=") || strings.HasPrefix(a, "-background="):
		case a == "--log" || a == "-log":
			i++
		case strings.HasPrefix(a, "--log=") || strings.HasPrefix(a, "-log="):
		default:
			rest = append(rest, a)
		}
	}
	if logFile == "" {
		dir, err := os.UserCacheDir() // root's too: a command line has a HOME
		if err != nil {
			return fmt.Errorf("no place for the daemon's log (give --log FILE): %w", err)
		}
		logFile = filepath.Join(dir, "ckptfs", "mount.log")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return startDaemon(self, append([]string{"mount"}, rest...), logFile, 2*time.Minute)
}

// runMountHelper is main for mount.fuse.ckptfs. Exit status as mount(8)'s
// helpers: 0, 1 for a usage error, 32 for a failed mount.
func runMountHelper(args []string, stderr io.Writer) int {
	mountArgs, logFile, err := helperArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "mount.fuse.ckptfs: %v\nusage: mount -t fuse.ckptfs STORE MOUNTPOINT [-o cache_size=SIZE,allow_other,metrics_addr=HOST:PORT,log=FILE,...]\n", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "mount.fuse.ckptfs: %v\n", err)
		return 32
	}
	if err := startDaemon(self, mountArgs, logFile, 2*time.Minute); err != nil {
		fmt.Fprintf(stderr, "mount.fuse.ckptfs: %v\n", err)
		return 32
	}
	return 0
}

// startDaemon runs `self mountArgs...` detached (new session, no terminal,
// output appended to logFile) and returns once it reports its mount live, or
// with its error if it exits first.
func startDaemon(self string, mountArgs []string, logFile string, timeout time.Duration) error {
	if err := os.MkdirAll(filepath.Dir(logFile), 0o700); err != nil {
		return fmt.Errorf("daemon log: %w", err)
	}
	logf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("daemon log: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	cmd := exec.Command(self, mountArgs...)
	cmd.Stdin = nil // /dev/null
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw} // fd 3
	cmd.Env = append(os.Environ(), readyEnv+"=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		pw.Close()
		return err
	}
	pw.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	got := make(chan bool, 1)
	go func() {
		b := make([]byte, 3)
		n, _ := io.ReadFull(pr, b)
		got <- n == 3 && string(b) == "ok\n"
	}()
	tail := func() string {
		data, _ := os.ReadFile(logFile)
		if int64(len(data)) >= start {
			data = data[start:]
		}
		return strings.TrimSpace(string(bytes.TrimPrefix(data, []byte("\n"))))
	}
	select {
	case ok := <-got:
		if ok {
			return nil
		}
		err := <-exited
		return daemonFailed(err, tail())
	case err := <-exited:
		return daemonFailed(err, tail())
	case <-time.After(timeout):
		cmd.Process.Signal(syscall.SIGTERM)
		return fmt.Errorf("the mount was not live after %v; see %s", timeout, logFile)
	}
}

// daemonFailed is the error of a daemon that exited before its mount was
// live: its own message (the last line it logged), else its exit status.
func daemonFailed(exit error, log string) error {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return errors.New(strings.TrimPrefix(last, "ckptfs mount: "))
	}
	return fmt.Errorf("the daemon exited (%v) before the mount was live", exit)
}

// readyNotifier returns the function the daemon calls once its mount is
// live, when a helper started it ($CKPTFS_READY_FD), else nil.
func readyNotifier() func() {
	v := os.Getenv(readyEnv)
	if v == "" {
		return nil
	}
	os.Unsetenv(readyEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	f := os.NewFile(uintptr(fd), "ready")
	syscall.CloseOnExec(fd)
	return func() {
		f.Write([]byte("ok\n"))
		f.Close()
	}
}
