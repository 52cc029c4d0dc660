package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/fusefs"
	"github.com/ckptfs/ckptfs/gc"
)

// The serving daemon listens on STORE/daemon.sock so that gc, fsck and du,
// given a mountpoint, run inside it: the store is locked by the daemon, and
// only the daemon knows the manifests of open files and coordinates with its
// commits.
// The protocol is one JSON request line, answered by JSON lines: any number of
// {"progress": …} (a gc.Progress, at most one per progressEvery besides the
// first and last of each phase) and then one {"result": …} or {"error": "…"}.
// A client ignores what it does not know of a result, so a newer daemon's
// answer decodes in an older client.
const socketName = "daemon.sock"

// progressEvery spaces the progress messages of one request: the client
// redraws at most every redrawEvery, so more would only cost the socket.
const progressEvery = 100 * time.Millisecond

type controlRequest struct {
	Op       string        `json:"op"` // "gc", "fsck", "du", "earliest", "tree" or "sync"
	Grace    time.Duration `json:"grace"`
	DryRun   bool          `json:"dry_run"`
	ReadData bool          `json:"read_data"`
	// Groups are du's sets of files, by inode number (what stat says in the
	// mount); the result is a duResult.
	Groups [][]uint64 `json:"groups,omitempty"`
	// GroupDirs, for du: where GroupDirs[i] is not 0, group i is (also)
	// every regular file below that directory, which the daemon finds in
	// the catalog; its result says so (duResult.DirsExpanded), an older
	// daemon's does not.
	GroupDirs []uint64 `json:"group_dirs,omitempty"`
	// Chunks are the chunk IDs "earliest" asks about: for each, the
	// earliest ctime (ns) of a file outside Groups[0] that uses it.
	Chunks []string `json:"chunks,omitempty"`
	// Dirs are the directories "tree" lists (inode numbers), Depth
	// levels down (0: all); with WantChunks each file's chunks and tensors,
	// and the content of the files of the first level named in Content
	// (runtree.go).
	Dirs       []uint64 `json:"dirs,omitempty"`
	Depth      int      `json:"depth,omitempty"`
	WantChunks bool     `json:"want_chunks,omitempty"`
	Content    []string `json:"content,omitempty"`
}

type controlReply struct {
	Progress *gc.Progress    `json:"progress,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
}

// serveControl accepts control connections until ctx ends.
func serveControl(ctx context.Context, store *cas.Store, fsys *fusefs.FS, logger *log.Logger, rc remoteControl) (func(), error) {
	path := filepath.Join(store.Dir(), socketName)
	os.Remove(path) // a dead daemon's socket; the store lock says we own the store
	raw, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln := newBoundedListener(raw, maxControlConns)
	// Only the store's owner may connect: the socket is 0600 (connecting
	// needs write permission on it), and every connection's peer is checked
	// (SO_PEERCRED), which also covers the moment between listen and chmod
	// and a store directory someone made wider than 0700.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if err := checkPeer(conn); err != nil {
				logger.Printf("control socket: refused: %v", err)
				json.NewEncoder(conn).Encode(controlReply{Error: err.Error()})
				conn.Close()
				continue
			}
			go handleControl(ctx, conn, store, fsys, logger, rc)
		}
	}()
	return func() { ln.Close(); os.Remove(path) }, nil
}

func handleControl(ctx context.Context, conn net.Conn, store *cas.Store, fsys *fusefs.FS, logger *log.Logger, rc remoteControl) {
	defer conn.Close()
	var req controlRequest
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&req); err != nil {
		return
	}
	enc := json.NewEncoder(conn)
	progress := throttle(func(p gc.Progress) { enc.Encode(controlReply{Progress: &p}) })
	var result any
	var err error
	switch req.Op {
	case "gc":
		if req.Grace < 0 {
			err = fmt.Errorf("grace %v is negative", req.Grace)
			break
		}
		var r gc.Result
		r, err = gc.Collect(ctx, store, gc.Options{Grace: req.Grace, DryRun: req.DryRun, Live: fsys.LiveManifests, Progress: progress, Remote: rc.collected()})
		result = r
	case "fsck":
		var r gc.FsckResult
		r, err = gc.Fsck(ctx, store, gc.FsckOptions{ReadData: req.ReadData, Progress: progress, Remote: rc.tier})
		result = r
	case "earliest":
		var r map[string]int64
		r, err = earliestUse(store, req.Groups, req.Chunks)
		result = r
	case "tree":
		var r treeResult
		r, err = answerTree(ctx, store, fsys.UncommittedFiles(), req)
		result = r
	case "sync":
		var r syncResult
		r, err = syncWatched(ctx, rc.tier, rc.sync, progress)
		result = r
	case "du":
		var r duResult
		groups := req.Groups
		if groups, err = expandGroups(store, groups, req.GroupDirs); err != nil {
			break
		}
		r, err = diskUsage(store, fsys.LiveManifests(), groups)
		r.DirsExpanded = len(req.GroupDirs) > 0
		r.ReadOnly = rc.tier != nil && !rc.writer
		result = r
	default:
		err = fmt.Errorf("unknown operation %q", req.Op)
	}
	if err != nil {
		logger.Printf("%s: %v", req.Op, err)
		enc.Encode(controlReply{Error: err.Error()})
		return
	}
	// Encoded in place, not through controlReply's RawMessage, which would
	// scan the answer (megabytes for a run's tree) once more. Encode writes
	// nothing when it fails.
	if err := enc.Encode(struct {
		Result any `json:"result"`
	}{result}); err != nil {
		enc.Encode(controlReply{Error: err.Error()})
	}
}

// throttle passes on to send the first and the last progress of each phase,
// and otherwise at most one every progressEvery. It is not safe for
// concurrent use: each request's work reports from one goroutine.
func throttle(send func(gc.Progress)) func(gc.Progress) {
	var last time.Time
	var phase string
	return func(p gc.Progress) {
		now := time.Now()
		if p.Phase == phase && now.Sub(last) < progressEvery && (p.Total == 0 || p.Done < p.Total) {
			return
		}
		phase, last = p.Phase, now
		send(p)
	}
}

// syncResult is the daemon's answer to sync: what upload rounds put into
// the bucket while it ran. Rounds are serialised, and the uploader may be
// in one when sync asks for its own, so this counts every round's work over
// the call (remote.Tier.Progress before and after), not only the
// one sync started: what the caller waited for.
type syncResult struct {
	Remote    string  `json:"remote"`     // the bucket's location
	Chunks    int64   `json:"chunks"`     // chunks put into the bucket
	RawBytes  int64   `json:"raw_bytes"`  // their raw bytes
	SentBytes int64   `json:"sent_bytes"` // their object bytes, as sent
	Present   int64   `json:"present"`    // chunks found in the bucket already
	Seconds   float64 `json:"seconds"`
}

// syncPoll is how often syncWatched reads the upload counters.
const syncPoll = 100 * time.Millisecond

// syncWatched calls run (ckptfs sync: an upload round, after any in
// progress) and, while it runs, reports the rounds' advance as the "upload"
// phase in raw bytes: Done is what has been settled since the call began,
// Total that plus what the current round has left. An upload round has no
// progress callback of its own: a round sync waits for was started by the
// uploader, so polling the store's counters is what sees both.
func syncWatched(ctx context.Context, tier *remote.Tier, run func(context.Context) error, progress func(gc.Progress)) (syncResult, error) {
	if tier == nil { // no remote: run says so
		return syncResult{}, run(ctx)
	}
	start := time.Now()
	before := tier.Progress()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(syncPoll)
		defer t.Stop()
		var sent gc.Progress
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := tier.Progress()
			p := gc.Progress{Phase: "upload", Done: now.SettledBytes - before.SettledBytes, Bytes: true}
			p.Total = p.Done + now.PendingBytes
			if p != sent && p.Total > 0 {
				progress(p)
				sent = p
			}
		}
	})
	err := run(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		return syncResult{}, err
	}
	after := tier.Progress()
	res := syncResult{
		Chunks:    after.Chunks - before.Chunks,
		RawBytes:  after.RawBytes - before.RawBytes,
		SentBytes: after.SentBytes - before.SentBytes,
		Present:   after.Present - before.Present,
		Seconds:   time.Since(start).Seconds(),
	}
	res.Remote = tier.Location()
	return res, nil
}

// checkPeer accepts a connection from the daemon's own user or root.
func checkPeer(conn net.Conn) error {
	if w, ok := conn.(interface{ NetConn() net.Conn }); ok {
		conn = w.NetConn() // a boundedConn
	}
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("peer credentials: %w", credErr)
	}
	if own := uint32(os.Geteuid()); cred.Uid != own && cred.Uid != 0 {
		return fmt.Errorf("permission denied: uid %d (pid %d) is neither the store's owner (uid %d) nor root", cred.Uid, cred.Pid, own)
	}
	return nil
}

// target is what gc and fsck act on: a mounted store (through its daemon) or
// an unmounted store directory.
type target struct {
	storeDir string
	socket   string // non-empty when mounted
}

// resolveTarget finds the store behind PATH: a mountpoint (its stats.json
// names the store) or a store directory. Its errors are probeTarget's.
func resolveTarget(p string) (target, error) {
	kind, data, err := probeTarget(p)
	if err != nil {
		return target{}, err
	}
	if kind == kindMount {
		var st struct {
			Store string `json:"store"`
		}
		if err := json.Unmarshal(data, &st); err != nil || st.Store == "" {
			return target{}, fmt.Errorf("%s: stats.json does not name the store", p)
		}
		return target{storeDir: st.Store, socket: filepath.Join(st.Store, socketName)}, nil
	}
	// A store its daemon has open: ask the daemon, which holds the store's lock.
	if sock := filepath.Join(p, socketName); isSocket(sock) {
		if abs, err := filepath.Abs(p); err == nil {
			return target{storeDir: abs, socket: filepath.Join(abs, socketName)}, nil
		}
	}
	return target{storeDir: p}, nil
}

// What probeTarget finds a path to be, besides the errors of its own kind
// (a path that does not exist, a file, another error of the file system).
// Each is an error errors.Is tells apart.
var (
	// errDaemonGone: the path is in a ckptfs mount whose daemon has died
	// (killed, crashed). The kernel keeps such a mount until it is unmounted
	// and answers everything in it with ENOTCONN ("transport endpoint is not
	// connected"), which the error wraps too.
	errDaemonGone = errors.New("the ckptfs daemon of this mount is gone")
	// errNotTarget: the path is a directory that is neither a ckptfs
	// mountpoint nor a store.
	errNotTarget = errors.New("neither a ckptfs mountpoint nor a store")
)

// targetKind is what probeTarget found.
type targetKind int

const (
	kindStore targetKind = iota + 1 // a store directory (with a catalog)
	kindMount                       // a live ckptfs mountpoint
)

// prober is what probeTarget asks of the system; tests replace it.
type prober struct {
	stat     func(name string) (fs.FileInfo, error)
	readFile func(name string) ([]byte, error)
	// statfs is statfs(2)'s error: unlike stat(2), which the kernel may
	// answer from its attribute cache, it always asks a FUSE daemon.
	statfs func(name string) error
	// mounts lists this process's mounts (/proc/self/mountinfo).
	mounts func() ([]mountEntry, error)
	euid   int
}

// osProber returns the prober of the running process.
func osProber() prober {
	return prober{
		stat:     os.Stat,
		readFile: os.ReadFile,
		statfs: func(name string) error {
			var st syscall.Statfs_t
			return syscall.Statfs(name, &st)
		},
		mounts: readMountinfo,
		euid:   os.Geteuid(),
	}
}

// probeTarget tells what p, given to gc, fsck, stats, du or import, is: a
// live ckptfs mountpoint (stats is then its .ckptfs/stats.json) or a store
// directory. What stops it is an error of its own, for errors.Is:
//   - p does not exist: fs.ErrNotExist;
//   - p is in a mount whose daemon is gone: errDaemonGone and
//     syscall.ENOTCONN, saying how to unmount and mount again;
//   - the user may not look into p: fs.ErrPermission (the syscall.EACCES or
//     EPERM met), naming the directory that refused, its owner and mode;
//   - p is a file, or a directory that is neither (errNotTarget).
//
// A permission error is not taken for "not a mountpoint": a store of another
// user (0700) would then be read as a mountpoint without stats.json, or as
// neither.
func probeTarget(p string) (targetKind, []byte, error) {
	return osProber().probe(p)
}

func (pr prober) probe(p string) (targetKind, []byte, error) {
	fi, err := pr.stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil, fmt.Errorf("%s: %w", p, syscall.ENOENT)
		}
		return 0, nil, pr.explain(p, err)
	}
	if !fi.IsDir() {
		return 0, nil, fmt.Errorf("%s is a file: give a mountpoint or a store directory", p)
	}
	data, err := pr.readFile(filepath.Join(p, ".ckptfs", "stats.json"))
	if err == nil {
		return kindMount, data, nil
	}
	if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return 0, nil, pr.explain(p, err)
	}
	_, err = pr.stat(filepath.Join(p, "catalog.db"))
	if err == nil {
		return kindStore, nil, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return 0, nil, pr.explain(p, err)
	}
	// A dead mount's directories may still stat from the kernel's cache,
	// and a name it once looked up in vain from its negative cache.
	if err := pr.statfs(p); errors.Is(err, syscall.ENOTCONN) {
		return 0, nil, pr.deadMount(p, true)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if root, ok := mountRootOf(p, st.Dev); ok {
			return 0, nil, fmt.Errorf("%s is %w: it is a directory in the ckptfs mount at %s; give that mountpoint", p, errNotTarget, root)
		}
	}
	return 0, nil, fmt.Errorf("%s is %w", p, errNotTarget)
}

// explain turns err, met looking into p, into probeTarget's error: a dead
// mount, a permission error, or err as it is, naming p.
func (pr prober) explain(p string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return pr.deadMount(p, true)
	case errors.Is(err, fs.ErrPermission):
		return pr.permission(p, err)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == p {
		return err // names p already
	}
	return fmt.Errorf("%s: %w", p, err)
}

// deadMount is the error for p, in a ckptfs mount whose daemon is gone. It
// names the mountpoint and the store (the mount's source, "ckptfs:STORE")
// when /proc/self/mountinfo has them, and says what to do: unmount and mount
// again, or, when storeWorks (not for du, which needs a daemon), that gc,
// fsck, stats and import also take the store directory, which the dead
// daemon's lock no longer holds.
func (pr prober) deadMount(p string, storeWorks bool) error {
	abs, err := filepath.Abs(p)
	if err != nil {
		abs = p
	}
	mnt, store := abs, "STORE"
	if m, ok := pr.mountOf(abs); ok {
		mnt = m.point
		if s, ok := m.store(); ok {
			store = s
		}
	}
	var where string
	if mnt != abs {
		where = fmt.Sprintf(" (the mount at %s)", mnt)
	}
	var alt string
	if storeWorks {
		alt = fmt.Sprintf("; gc, fsck, stats and import also work on the store directory, %s, itself", store)
	}
	return fmt.Errorf("%s: %w%s: the mount is still there but not connected (%w); mount again with `ckptfs mount %s %s` (which clears the stale mount) or unmount it with `%s`%s",
		p, errDaemonGone, where, syscall.ENOTCONN, store, mnt, unmountCommandFor(pr.euid, mnt), alt)
}

// unmountCommandFor is unmountCommand for the user euid.
func unmountCommandFor(euid int, mnt string) string {
	if euid == 0 {
		return "umount " + mnt
	}
	return "fusermount3 -u " + mnt
}

// permission is the error for err, a permission error met looking into p. It
// wraps err's errno (syscall.EACCES or EPERM) and says whose the directory
// that refused is: a ckptfs mount, which serves only the user who mounted
// it (unless mounted with --allow-other), or the nearest directory at or
// above p that stats (a store is 0700, its owner's alone).
func (pr prober) permission(p string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", p, err)
	}
	abs, aerr := filepath.Abs(p)
	if aerr != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if m, ok := pr.mountOf(abs); ok && m.fstype == "fuse.ckptfs" && m.uid >= 0 && m.uid != pr.euid {
		who := userName(m.uid)
		where := "it is the ckptfs mount of " + who
		if m.point != resolvePrefix(abs) {
			where = fmt.Sprintf("it is in the ckptfs mount at %s of %s", m.point, who)
		}
		return fmt.Errorf("%s: %w: %s, which serves only that user (unless mounted with --allow-other); run as %s", p, errno, where, who)
	}
	for dir := abs; ; dir = filepath.Dir(dir) {
		fi, serr := pr.stat(dir)
		st, ok := sysStat(fi)
		if serr == nil && ok {
			what, why := "the directory "+dir, ""
			if dir == abs {
				what, why = "it", "; a store is private to its owner"
			}
			if int(st.Uid) == pr.euid {
				return fmt.Errorf("%s: %w: %s is yours (mode %04o)", p, errno, what, fi.Mode().Perm())
			}
			who := userName(int(st.Uid))
			return fmt.Errorf("%s: %w: %s belongs to %s (mode %04o%s); run as %s", p, errno, what, who, fi.Mode().Perm(), why, who)
		}
		if dir == "/" || dir == "." {
			return fmt.Errorf("%s: %w", p, errno)
		}
	}
}

// sysStat is fi's stat(2) record, if it has one.
func sysStat(fi fs.FileInfo) (*syscall.Stat_t, bool) {
	if fi == nil {
		return nil, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return st, ok
}

// userName is uid's login name, or "uid N" when it has none.
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return fmt.Sprintf("uid %d", uid)
}

// mountEntry is a mount, from a line of /proc/self/mountinfo.
type mountEntry struct {
	point  string // the mountpoint
	fstype string // "fuse.ckptfs" for a ckptfs mount
	source string // "ckptfs:STORE" for a ckptfs mount
	uid    int    // a FUSE mount's user_id option (who mounted it), or -1
}

// store is the store a ckptfs mount serves.
func (m mountEntry) store() (string, bool) {
	if m.fstype != "fuse.ckptfs" {
		return "", false
	}
	s, ok := strings.CutPrefix(m.source, "ckptfs:")
	return s, ok && s != ""
}

// readMountinfo reads /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo reads mountinfo lines: "ID PARENT MAJ:MIN ROOT MOUNTPOINT
// OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS", octal-escaped.
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 5 || len(fields) < sep+3 {
			continue
		}
		m := mountEntry{point: unescapeMountinfo(fields[4]), fstype: fields[sep+1], source: unescapeMountinfo(fields[sep+2]), uid: -1}
		if len(fields) > sep+3 {
			for _, o := range strings.Split(fields[sep+3], ",") {
				if v, ok := strings.CutPrefix(o, "user_id="); ok {
					if n, err := strconv.Atoi(v); err == nil {
						m.uid = n
					}
				}
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// mountOf is the mount holding abs, an absolute path: the last mount (the
// top of a stack) whose mountpoint is abs or its nearest ancestor.
// Symbolic links in abs are resolved as far as they can be (not inside a
// dead mount, where every lookup fails).
func (pr prober) mountOf(abs string) (mountEntry, bool) {
	ms, err := pr.mounts()
	if err != nil {
		return mountEntry{}, false
	}
	real := resolvePrefix(abs)
	var best mountEntry
	found := false
	for _, m := range ms {
		if m.point != "/" && real != m.point && !strings.HasPrefix(real, m.point+"/") {
			continue
		}
		if !found || len(m.point) >= len(best.point) {
			best, found = m, true
		}
	}
	return best, found
}

// resolvePrefix resolves the symbolic links of the longest part of abs that
// filepath.EvalSymlinks resolves, keeping the rest as it is.
func resolvePrefix(abs string) string {
	rest := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest)
		}
		if dir == "/" || dir == "." {
			return abs
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// callDaemon sends req to the daemon and decodes its result into out, passing
// progress to onProgress.
func callDaemon(ctx context.Context, socket string, req controlRequest, onProgress func(gc.Progress), out any) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("reach the daemon at %s: %w", socket, err)
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	// A daemon that refuses the connection says why and closes it, maybe
	// before the request is written: read its answer even then.
	werr := json.NewEncoder(conn).Encode(req)
	dec := json.NewDecoder(conn)
	for {
		// The result is decoded into out in place (a non-nil pointer in an
		// interface), not kept as a RawMessage and decoded again: a run's
		// tree is megabytes.
		var rep struct {
			Progress *gc.Progress `json:"progress,omitempty"`
			Result   any          `json:"result,omitempty"`
			Error    string       `json:"error,omitempty"`
		}
		rep.Result = out
		if err := dec.Decode(&rep); err != nil {
			if werr != nil {
				return fmt.Errorf("send to the daemon: %w", werr)
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the daemon closed the connection without a result")
			}
			return err
		}
		switch {
		case rep.Progress != nil:
			onProgress(*rep.Progress)
		case rep.Error != "":
			return errors.New(rep.Error)
		default:
			return nil
		}
	}
}

// remoteControl is what the control socket needs of the remote tier.
type remoteControl struct {
	sync   func(context.Context) error // ckptfs sync
	tier   *remote.Tier                // the remote tier, or nil (fsck looks there for chunks missing here)
	writer bool                        // this daemon has a writer session on the remote: gc collects the remote too
}

// collected is the remote tier gc collects: the writer's only.
func (rc remoteControl) collected() *remote.Tier {
	if !rc.writer {
		return nil
	}
	return rc.tier
}

// isSocket reports whether path is a live daemon's control socket.
func isSocket(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
