package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas/remote"
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
// Options (-o, comma-separated): helperOptions, the flags of `ckptfs mount`
// with underscores (cache_size=SIZE for --cache-size, allow_other for
// --allow-other; ro for --read-only, with remote= only), and log=FILE (the
// daemon's log, in a directory that exists; default /var/log/ckptfs.log for
// root, ~/.cache/ckptfs/mount.log otherwise). mount(8)'s generic options
// (rw, defaults, auto, noauto, user, nofail, _netdev, x-systemd.*, nosuid,
// nodev, noatime, ...) are accepted and left to mount(8). A daemon that
// fails before its mount is live has its error printed by the helper, in
// the options' words (cache_size, not --cache-size).

// readyEnv names the descriptor on which a daemon started by the helper
// reports that its mount is live.
const readyEnv = "CKPTFS_READY_FD"

// isMountHelper reports whether the binary runs as mount(8)'s helper.
func isMountHelper(argv0 string) bool {
	b := filepath.Base(argv0)
	return b == "mount.fuse.ckptfs" || b == "mount.ckptfs"
}

// helperArgs turns the helper's arguments into `ckptfs mount` arguments and
// the log file ("" when no log= option names one).
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
	readOnly, remote := false, false
	for _, o := range opts {
		k, v, hasV := strings.Cut(strings.TrimSpace(o), "=")
		opt, known := helperOption(k)
		switch {
		case k == "":
		case known && opt.value:
			if !hasV || v == "" {
				return nil, "", fmt.Errorf("option %s needs a value (%s=%s)", k, k, opt.arg)
			}
			if k == "log" {
				logFile = v
				continue
			}
			remote = remote || k == "remote"
			flags = append(flags, opt.flag+"="+v)
		case known:
			if hasV {
				return nil, "", fmt.Errorf("option %s takes no value", k)
			}
			readOnly = readOnly || k == "ro"
			flags = append(flags, opt.flag)
		case genericOption(k):
			// mount(8)'s, or the FUSE defaults ckptfs uses anyway
		default:
			return nil, "", fmt.Errorf("unknown option %q (ckptfs knows %s)", o, strings.Join(helperOptionNames(), ", "))
		}
	}
	if readOnly && !remote {
		return nil, "", errors.New("ro needs remote=s3://BUCKET/PREFIX (a mount of a remote's files); a local store mounts read-write only: drop the ro option")
	}
	return append(append([]string{"mount"}, flags...), pos...), logFile, nil
}

// mountOption is one -o option of the helper: the `ckptfs mount` flag it
// becomes, and whether it takes a value (name=arg).
type mountOption struct {
	name, flag string
	value      bool
	arg        string // what the value is, for messages
}

// helperOptions are the helper's own -o options, the one list that parsing,
// the unknown-option message and the rewording of the daemon's errors use.
// Each is a flag of `ckptfs mount` (TestHelperOptionsCoverMountFlags), its
// name with underscores for dashes, but for ro (--read-only: mount(8)'s
// word) and log (the daemon's log, which the helper opens; --log's).
// --background is what the helper does anyway.
var helperOptions = []mountOption{
	{"cache_size", "--cache-size", true, "SIZE"},
	{"write_memory", "--write-memory", true, "SIZE"},
	{"readahead_kb", "--readahead-kb", true, "N"},
	{"commit", "--commit", true, "sync|async|remote"},
	{"inline_encoders", "--inline-encoders", true, "N"},
	{"node_limit", "--node-limit", true, "N"},
	{"delta_keyframe", "--delta-keyframe", true, "N"},
	{"delta_latest", "--delta-latest", true, "whole|delta"},
	{"remote", "--remote", true, "s3://BUCKET/PREFIX"},
	{"remote_timeout", "--remote-timeout", true, "DURATION"},
	{"local_cache_size", "--local-cache-size", true, "SIZE"},
	{"gc_every", "--gc-every", true, "DURATION"},
	{"metrics_addr", "--metrics-addr", true, "HOST:PORT"},
	{"allow_other", "--allow-other", false, ""},
	{"nonempty", "--nonempty", false, ""}, // fuse2's name for it
	{"ro", "--read-only", false, ""},
	{"debug", "--debug", false, ""},
	{"log", "--log", true, "FILE"},
}

// helperOption returns the entry of helperOptions called name.
func helperOption(name string) (mountOption, bool) {
	for _, o := range helperOptions {
		if o.name == name {
			return o, true
		}
	}
	return mountOption{}, false
}

// helperOptionNames are helperOptions' names, in order.
func helperOptionNames() []string {
	names := make([]string, len(helperOptions))
	for i, o := range helperOptions {
		names[i] = o.name
	}
	return names
}

// genericOption reports whether k is one of mount(8)'s generic options, or
// a FUSE default ckptfs uses anyway: accepted and left to mount(8).
func genericOption(k string) bool {
	switch k {
	case "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "nofail", "_netdev",
		"nosuid", "suid", "nodev", "dev", "exec", "noexec", "atime", "noatime", "relatime", "norelatime",
		"strictatime", "lazytime", "sync", "async", "dirsync", "loop", "comment":
		return true
	}
	return strings.HasPrefix(k, "x-") || strings.HasPrefix(k, "comment")
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

// mountInBackground is `ckptfs mount --background`: the same mount (the
// command line's flags but --background and --log) in a daemon of its own,
// returning once the mount is live. The daemon runs in / (so that it keeps
// no directory busy), so STORE, MOUNTPOINT and the log are made absolute
// here, against the caller's working directory.
func mountInBackground(flagArgs, pos []string, logFile string, stderr io.Writer) error {
	var rest []string
	for i := 0; i < len(flagArgs); i++ {
		a := flagArgs[i]
		switch {
		case a == "--background" || a == "-background" || strings.HasPrefix(a, "--background=") || strings.HasPrefix(a, "-background="):
		case a == "--log" || a == "-log":
			i++
		case strings.HasPrefix(a, "--log=") || strings.HasPrefix(a, "-log="):
		default:
			rest = append(rest, a)
		}
	}
	for _, p := range pos {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		rest = append(rest, abs)
	}
	var err error
	if logFile == "" {
		dir, err := os.UserCacheDir() // root's too: a command line has a HOME
		if err != nil {
			return fmt.Errorf("no place for the daemon's log (give --log FILE): %w", err)
		}
		if logFile, err = defaultLog(filepath.Join(dir, "ckptfs", "mount.log")); err != nil {
			return err
		}
	} else if logFile, err = filepath.Abs(logFile); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return startDaemon(self, append([]string{"mount"}, rest...), logFile, daemonStartTimeout(), stderr)
}

// defaultLog creates the directory of a default log file (the user's cache
// directory may not have one yet) and returns the file. A log the user
// named must be in a directory that exists (startDaemon says so).
func defaultLog(file string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return "", fmt.Errorf("the daemon's log %s: %w", file, err)
	}
	return file, nil
}

// runMountHelper is main for mount.fuse.ckptfs and mount.ckptfs. Exit
// status as mount(8)'s helpers: 0, 1 for a usage error, 32 for a failed
// mount. Its messages begin with the name it was run as.
func runMountHelper(args []string, stderr io.Writer) int {
	name := helperName(os.Args[0])
	mountArgs, logFile, err := helperArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nusage: mount -t %s STORE MOUNTPOINT [-o cache_size=SIZE,allow_other,metrics_addr=HOST:PORT,log=FILE,...]\n",
			name, err, strings.TrimPrefix(name, "mount."))
		return 1
	}
	if logFile == "" {
		logFile, err = defaultLogFile()
		if err == nil {
			logFile, err = defaultLog(logFile)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v (give -o log=FILE)\n", name, err)
			return 32
		}
	} else if logFile, err = filepath.Abs(logFile); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 32
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 32
	}
	if err := startDaemon(self, mountArgs, logFile, daemonStartTimeout(), stderr); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, helperWords(err.Error()))
		return 32
	}
	return 0
}

// helperName is the helper's name for its messages: the name it was run
// as (mount.ckptfs for mount -t ckptfs, mount.fuse.ckptfs for
// -t fuse.ckptfs).
func helperName(argv0 string) string {
	if b := filepath.Base(argv0); isMountHelper(b) {
		return b
	}
	return "mount.fuse.ckptfs"
}

// helperWords rewrites the daemon's flag names in msg as the -o options
// the user wrote: --cache-size as cache_size, --nonempty as -o nonempty,
// --read-only as -o ro. Longer flags go first, so that --remote-timeout is
// not read as --remote.
func helperWords(msg string) string {
	opts := slices.Clone(helperOptions)
	slices.SortStableFunc(opts, func(a, b mountOption) int { return len(b.flag) - len(a.flag) })
	for _, o := range opts {
		words := o.name
		if !o.value {
			words = "-o " + o.name
		}
		msg = strings.ReplaceAll(msg, o.flag, words)
	}
	return msg
}

// startDaemon runs `self mountArgs...` detached (new session, no terminal,
// output appended to logFile) and returns once it reports its mount live, or
// with its error if it exits first.
func startDaemon(self string, mountArgs []string, logFile string, timeout time.Duration, stderr io.Writer) error {
	logf, err := openDaemonLog(logFile)
	if err != nil {
		return err
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
	// The daemon writes "note MSG" lines, for the user at the terminal, then
	// "ok" once the mount is live (readyPipe).
	got := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if msg, ok := strings.CutPrefix(line, "note "); ok {
				fmt.Fprintf(stderr, "ckptfs: %s\n", msg)
				continue
			}
			got <- line == "ok"
			return
		}
		got <- false
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
		select { // its last notes, before the caller prints the error
		case <-got:
		case <-time.After(time.Second):
		}
		return daemonFailed(err, tail())
	case <-time.After(timeout):
		cmd.Process.Signal(syscall.SIGTERM)
		return fmt.Errorf("the mount was not live after %v; see %s", timeout, logFile)
	}
}

// daemonStartTimeout is how long a daemon started in the background may
// take to make its mount live: a writer of a remote waits up to a lease for
// a collection of the bucket to end before it joins (remote: waitCollection),
// so a lease (CKPTFS_REMOTE_LEASE, else remote.DefaultLease) and a minute.
// It had been two minutes, a default lease exactly: such a mount failed
// with "context canceled" when the wait ran its course.
func daemonStartTimeout() time.Duration {
	lease, err := envDuration(leaseEnv)
	if err != nil || lease <= 0 {
		lease = remote.DefaultLease
	}
	return max(2*time.Minute, lease+time.Minute)
}

// openDaemonLog opens the daemon's log for appending, creating the file
// (0600) but not its directory: a log named in a directory that does not
// exist is an error, not a mount without a log.
func openDaemonLog(logFile string) (*os.File, error) {
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err == nil {
		return f, nil
	}
	dir := filepath.Dir(logFile)
	if st, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
		return nil, fmt.Errorf("the daemon's log %s: directory %s does not exist", logFile, dir)
	} else if serr == nil && !st.IsDir() {
		return nil, fmt.Errorf("the daemon's log %s: %s is not a directory", logFile, dir)
	}
	return nil, fmt.Errorf("the daemon's log: %w", err)
}

// daemonFailed is the error of a daemon that exited before its mount was
// live: its own message, else its exit status. The message is the last line
// that `ckptfs mount` wrote as its error ("ckptfs mount: ..."), not simply
// the log's last line: a usage error ends with a pointer to --help, or with
// the flags' help.
func daemonFailed(exit error, log string) error {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if msg, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "ckptfs mount: "); ok && msg != "" {
			return errors.New(msg)
		}
	}
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return errors.New(last)
	}
	return fmt.Errorf("the daemon exited (%v) before the mount was live", exit)
}

// readyPipe is how a daemon started in the background (by the mount(8)
// helper or `mount --background`) talks to the process that started it,
// which waits at the terminal: notes to show the user, then "ok" once the
// mount is live.
type readyPipe struct{ f *os.File }

// note passes msg (one line) to the user's terminal.
func (r *readyPipe) note(msg string) {
	fmt.Fprintf(r.f, "note %s\n", strings.ReplaceAll(msg, "\n", " "))
}

// ready reports the mount live and closes the pipe.
func (r *readyPipe) ready() {
	r.f.Write([]byte("ok\n"))
	r.f.Close()
}

// readyNotifier returns the pipe to the process that started the daemon in
// the background ($CKPTFS_READY_FD), else nil.
func readyNotifier() *readyPipe {
	v := os.Getenv(readyEnv)
	if v == "" {
		return nil
	}
	os.Unsetenv(readyEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	syscall.CloseOnExec(fd)
	return &readyPipe{f: os.NewFile(uintptr(fd), "ready")}
}
