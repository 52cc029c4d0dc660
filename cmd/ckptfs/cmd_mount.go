package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/fusefs"
)

func runMount(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseMount(c, args, stderr)
	if err != nil {
		return err
	}
	if cfg.background { // the usage checked here, the rest by the daemon
		return mountInBackground(cfg.flagArgs, []string{cfg.storeDir, cfg.mnt}, cfg.logFile, stderr)
	}
	return serveMount(ctx, cfg, stdout, stderr)
}

// mountConfig is what the command line of `ckptfs mount` asks for, checked.
type mountConfig struct {
	storeDir, mnt string
	flagArgs      []string // the flags as given, for a daemon started in the background

	cacheSize  int64 // 0: the default share of the memory budget
	writeMem   int64 // 0: the default share of the memory budget
	nodeLimit  int   // 0: from the memory budget; -1: never prune
	readAhead  int
	debug      bool
	commitMode string // sync, async or remote
	remoteURL  string
	// remoteTimeout bounds one request to the bucket (0: the default).
	remoteTimeout time.Duration
	readOnly      bool
	localCache    int64
	encoders      int
	keyframe      int
	latestWhole   bool // --delta-latest whole
	allowOther    bool
	metricsAddr   string
	background    bool
	logFile       string
	nonEmpty      bool
	gcEvery       time.Duration // 0: collect only when asked (ckptfs gc)
}

// parseMount parses and checks mount's flags and arguments; a bad one is a
// usage error (exit 2) before anything is started or created.
func parseMount(c command, args []string, stderr io.Writer) (*mountConfig, error) {
	fl := newFlags(c, stderr)
	var cacheSize, writeMem byteSize
	fl.Var(&cacheSize, "cache-size", "memory for decoded chunks (e.g. 256MiB, 1GiB; default: a quarter of the memory the daemon may use (cgroup limit or RAM), at most 256MiB)")
	fl.Var(&writeMem, "write-memory", "memory for files being written, which are stored while they are written; a file started, or grown past 4MiB, when it is spent is staged on disk and stored at close (e.g. 512MiB: 4MiB a small file, about 24MiB a large one; default: a quarter of the memory the daemon may use, at most 96MiB)")
	nodeLimit := fl.Int("node-limit", 0, "files and directories the kernel may keep looked up before the daemon asks it to forget the oldest (0: from the memory budget, 8192 to 16384; -1: never)")
	readAhead := fl.Int("readahead-kb", fusefs.DefaultReadAheadKB, "kernel readahead of the mount in KiB (0: kernel default)")
	debug := fl.Bool("debug", false, "log every FUSE request to stderr")
	commitMode := fl.String("commit", "sync", "sync: close returns once the file is committed; async: once its bytes are staged (fsync waits for the commit); remote: once it is also uploaded to --remote")
	remoteURL := fl.String("remote", "", "s3://BUCKET/PREFIX: upload committed files there in the background, fetch missing chunks from there (endpoint and credentials: AWS_* variables)")
	readOnly := fl.Bool("read-only", false, "with --remote: mount read-only, showing the files the remote's writer uploaded (refreshed every few seconds)")
	remoteTimeout := fl.Duration("remote-timeout", 0, "with --remote: how long one request to the bucket may take before it is retried (3 tries); a read the bucket cannot serve in time fails with EIO (default 10s, or $CKPTFS_REMOTE_TIMEOUT)")
	localCache := byteSize(tiered.DefaultCacheSize)
	fl.Var(&localCache, "local-cache-size", "with --remote: local space for chunks fetched from the remote (e.g. 10GiB)")
	encoders := inlineEncodersFlag(fl)
	keyframe := fl.Int("delta-keyframe", cas.DefaultDeltaKeyframe, "store a changed tensor as a delta against its version up to N-1 saves earlier, then start again with a whole one (1: no deltas)")
	latest := fl.String("delta-latest", "", "whole: a tensor's newest version is stored whole and becomes a delta when the next save comes, so that the latest checkpoint reads as fast as one without deltas; delta: at once (default: whole, or delta with --remote, whose bucket keeps objects as first uploaded)")
	allowOther := fl.Bool("allow-other", false, "let other users use the mount (FUSE allow_other; an ordinary user needs user_allow_other in /etc/fuse.conf); by default only you can")
	metricsAddr := fl.String("metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9477)")
	background := fl.Bool("background", false, "return once the mount is live, leaving the daemon running (its log: --log); unmount with fusermount3 -u or umount")
	logFile := fl.String("log", "", "with --background: the daemon's log, in a directory that exists (default ~/.cache/ckptfs/mount.log)")
	var gcEvery duration
	fl.Var(&gcEvery, "gc-every", "collect garbage every DURATION while mounted, as ckptfs gc does (the chunks of deleted and replaced files), e.g. 1h for runs that delete old checkpoints (save_total_limit); 0: only when ckptfs gc is run")
	nonEmpty := fl.Bool("nonempty", false, "mount over a MOUNTPOINT that has files in it (hiding them until the unmount); refused by default")
	flagArgs, pos, err := parseFlagArgs(fl, args, 2)
	if err != nil {
		return nil, err
	}
	if err := checkInlineEncoders(*encoders, c, stderr); err != nil {
		return nil, err
	}
	if *readAhead < 0 || *readAhead > maxReadAheadKB {
		return nil, usageError(c, stderr, "--readahead-kb must be 0 (the kernel's default) to %d (%s), not %d", maxReadAheadKB, formatBytes(maxReadAheadKB<<10), *readAhead)
	}
	switch *commitMode {
	case "sync", "async":
	case "remote":
		if *remoteURL == "" || *readOnly {
			fmt.Fprintf(stderr, "ckptfs mount: --commit=remote needs --remote (and a writing mount)\n")
			return nil, errUsage
		}
	default:
		fmt.Fprintf(stderr, "ckptfs mount: --commit must be sync, async or remote, not %q\n", *commitMode)
		return nil, errUsage
	}
	if *readOnly && *remoteURL == "" {
		fmt.Fprintf(stderr, "ckptfs mount: --read-only needs --remote\n")
		return nil, errUsage
	}
	if flagSet(fl, "remote-timeout") && (*remoteURL == "" || *remoteTimeout <= 0) {
		fmt.Fprintf(stderr, "ckptfs mount: --remote-timeout needs --remote and a positive duration such as 30s\n")
		return nil, errUsage
	}
	if *readOnly && !flagSet(fl, "readahead-kb") {
		// On a reading mount every chunk the kernel's readahead touches
		// beyond what a reader wants is a GET from the bucket, not a local
		// read; the daemon's own prefetch still streams sequential readers
		// (fusefs/prefetch.go). A writing mount reads its own local chunks.
		*readAhead = remoteReadAheadKB
	}
	if flagSet(fl, "cache-size") && cacheSize <= 0 {
		fmt.Fprintf(stderr, "ckptfs mount: --cache-size must be more than 0\n")
		return nil, errUsage
	}
	if flagSet(fl, "write-memory") && writeMem <= 0 {
		fmt.Fprintf(stderr, "ckptfs mount: --write-memory must be more than 0\n")
		return nil, errUsage
	}
	if *nodeLimit < -1 {
		fmt.Fprintf(stderr, "ckptfs mount: --node-limit must be -1 (never prune), 0 (from the memory budget) or a count, not %d\n", *nodeLimit)
		return nil, errUsage
	}
	if gcEvery < 0 || (gcEvery > 0 && *readOnly) {
		fmt.Fprintf(stderr, "ckptfs mount: --gc-every must be a positive duration such as 1h (0: off), on a writing mount, not %v\n", time.Duration(gcEvery))
		return nil, errUsage
	}
	if *keyframe < 1 {
		fmt.Fprintf(stderr, "ckptfs mount: --delta-keyframe must be 1 (no deltas) or more, not %d\n", *keyframe)
		return nil, errUsage
	}
	latestWhole := *remoteURL == ""
	switch *latest {
	case "":
	case "whole", "delta":
		latestWhole = *latest == "whole"
	default:
		fmt.Fprintf(stderr, "ckptfs mount: --delta-latest must be whole or delta, not %q\n", *latest)
		return nil, errUsage
	}
	return &mountConfig{
		storeDir: pos[0], mnt: pos[1], flagArgs: flagArgs,
		cacheSize: int64(cacheSize), writeMem: int64(writeMem), nodeLimit: *nodeLimit, readAhead: *readAhead, debug: *debug, commitMode: *commitMode,
		remoteURL: *remoteURL, remoteTimeout: *remoteTimeout, readOnly: *readOnly, localCache: int64(localCache), encoders: *encoders,
		keyframe: *keyframe, latestWhole: latestWhole, allowOther: *allowOther, metricsAddr: *metricsAddr, background: *background,
		logFile: *logFile, nonEmpty: *nonEmpty, gcEvery: time.Duration(gcEvery),
	}, nil
}

// serveMount mounts cfg's store and serves it until it is unmounted (from
// outside, or by a signal: ctx). A mount that fails changes nothing: the
// mountpoint and what mounting needs are checked before the store is
// touched, and a store this call created is removed again.
//
// "unmounted" is printed once the store is closed (its catalog synced and
// its write-ahead log removed), so that what a script runs next finds the
// store free; a store that fails to close is an error.
func serveMount(ctx context.Context, cfg *mountConfig, stdout, stderr io.Writer) (retErr error) {
	var fsOpts []fusefs.Option
	if cfg.commitMode == "async" {
		fsOpts = append(fsOpts, fusefs.WithAsyncCommit())
	}
	ready := readyNotifier() // started by mount.fuse.ckptfs or mount --background
	mem := planMemory(cfg.cacheSize, cfg.writeMem, cfg.nodeLimit, cgroupFS{root: "/"}.memoryBudget(physicalMemory()))
	setMemoryLimit(mem.goLimit)
	fsOpts = append(fsOpts, fusefs.WithWriteMemory(mem.write), fusefs.WithNodeLimit(mem.nodes))
	cores := setProcs()
	stopProfiles, err := startProfiles()
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, stopProfiles()) }()

	mnt, err := checkMountpoint(cfg.mnt, cfg.nonEmpty)
	if err != nil {
		return err
	}
	if err := checkMountPrereqs(mnt, cfg.allowOther); err != nil {
		return err
	}
	var metrics *promMetrics
	var metricsLn net.Listener
	if cfg.metricsAddr != "" {
		metrics = newPromMetrics()
		fsOpts = append(fsOpts, fusefs.WithObserver(metrics))
		// Listen now, so a taken port fails the mount before it exists.
		if metricsLn, err = net.Listen("tcp", cfg.metricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		defer metricsLn.Close()
	}
	removeNew := newStoreCleanup(cfg.storeDir)
	mounted := false
	storeOpts := storeOptions(cores, cfg.encoders, cas.Options{CacheSize: mem.cache, DeltaKeyframe: cfg.keyframe,
		DeltaLatestWhole: cfg.latestWhole})
	if metrics != nil {
		storeOpts.Observer = metrics
	}
	logger := log.New(stderr, "ckptfs: ", log.LstdFlags)
	if n, err := raiseFileLimit(); err != nil {
		logger.Printf("%v", err)
	} else if n < lowFileLimit {
		logger.Printf("the file limit is %d descriptors (ulimit -n): reads and commits wait when they are all in use", n)
	}
	store, objects, err := openMountStore(ctx, cfg, storeOpts)
	if err != nil {
		return err
	}
	tier := remoteTier(store, objects)
	var unmounted string // set when the mount ended cleanly
	defer func() {
		if err := store.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("close store: %w", err)
		}
		if !mounted {
			removeNew()
		}
		if unmounted != "" && retErr == nil {
			fmt.Fprintf(stdout, "ckptfs: unmounted %s\n", unmounted)
		}
	}()
	every, err := refreshEvery()
	if err != nil {
		return err
	}
	switch {
	case tier != nil && !cfg.readOnly:
		leave, err := joinRemote(ctx, store, tier, logger)
		if err != nil {
			return err
		}
		defer leave() // before store.Close (deferred earlier)
	case tier != nil:
		if _, err = applyPublished(ctx, tier, cfg.remoteURL, logger, ready); err != nil {
			return err
		}
	}

	logger.Print(mem)
	if !cfg.readOnly {
		// Tidying, not correctness: a damaged row (fsck names it) leaves
		// the rows as they are, and the mount goes on.
		dropped, released, err := store.SettleDeltaWaits()
		if err != nil {
			logger.Printf("%v (ckptfs fsck STORE names the damage); the delta plans stay as they are", err)
		}
		if released > 0 {
			logger.Printf("released %d delta plans that waited for a later save (--delta-latest delta): the re-encoder codes them once the mount is idle", released)
		}
		if dropped > 0 {
			logger.Printf("dropped %d delta wait rows that an older ckptfs left without their chunk or plan", dropped)
		}
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	up, syncFn, afterCommit := remoteSync(cfg, tier, logger, every)
	if afterCommit != nil {
		fsOpts = append(fsOpts, fusefs.WithAfterCommit(afterCommit))
	}
	fsys, err := fusefs.New(store, logger, fsOpts...)
	if err != nil {
		return err
	}
	defer fsys.Close() // stops the background re-encoder; runs before store.Close
	if objects != nil {
		// Count the copies earlier mounts fetched against --local-cache-size,
		// in the background: a walk of the store's objects. Stopped before
		// fsys and the store close (this defer runs before theirs).
		actx, stop := context.WithCancel(ctx)
		adopted := make(chan struct{})
		go func() {
			defer close(adopted)
			n, size, err := adoptFetched(actx, store, objects, fsys.LiveManifests)
			switch {
			case err != nil && actx.Err() == nil:
				logger.Printf("%v (they stay on disk beyond --local-cache-size until evicted)", err)
			case err == nil && n > 0:
				logger.Printf("counted %d copies (%s) that earlier mounts fetched from the bucket against the local cache size", n, formatBytes(size))
			}
		}()
		defer func() { stop(); <-adopted }()
	}
	var ref *refresher
	if tier != nil {
		tier.SetApplier(fsys.ApplyRemote) // rounds apply others' changes to the served namespace
	}
	if tier != nil && cfg.readOnly {
		ref = &refresher{tier: tier, logger: logger, every: every, location: cfg.remoteURL}
	}
	srv, err := fusefs.Mount(fsys, mnt, fusefs.MountOptions{ReadAheadKB: cfg.readAhead, Debug: cfg.debug, AllowOther: cfg.allowOther, ReadOnly: cfg.readOnly})
	if err != nil {
		return err
	}
	mounted = true
	var bgWG sync.WaitGroup
	defer bgWG.Wait() // after stopBG (deferred later, so it runs first)
	defer stopBG()
	if up != nil {
		bgWG.Go(func() { up.run(bg) })
	}
	if ref != nil {
		bgWG.Go(func() { ref.run(bg) })
	}
	stopControl, err := serveControl(ctx, store, fsys, logger, remoteControl{sync: syncFn, tier: tier, writer: up != nil})
	if err != nil {
		srv.Unmount()
		return err
	}
	defer stopControl()
	if cfg.gcEvery > 0 {
		bgWG.Go(func() { collectEvery(bg, cfg.gcEvery, store, fsys, logger) })
	}
	if metrics != nil {
		stopMetrics := metrics.serve(metricsLn, fsys, logger)
		defer stopMetrics()
	}
	announce(stdout, ready, logger, store.Dir(), mnt)
	if err := waitForUnmount(ctx, srv, mnt, logger, stderr); err != nil {
		return err
	}
	if err := fsys.CommitAll(context.Background()); err != nil {
		return fmt.Errorf("commit at unmount: %w", err)
	}
	unmounted = mnt // said once the store is closed (deferred above)
	return nil
}

// openMountStore opens (or creates) cfg's store; with --remote its objects
// are a tier with the bucket behind the store's own directory.
func openMountStore(ctx context.Context, cfg *mountConfig, opts cas.Options) (*cas.Store, *tiered.Backend, error) {
	var objects *tiered.Backend
	if cfg.remoteURL != "" {
		var err error
		ro := remoteOptions{timeout: cfg.remoteTimeout, write: !cfg.readOnly}
		if objects, err = openTiered(ctx, cfg.remoteURL, cfg.storeDir, cfg.localCache, ro); err != nil {
			return nil, nil, err
		}
		opts.Objects = objects
	}
	store, err := openStore(cfg.storeDir, opts)
	if err != nil {
		if objects != nil {
			objects.Close()
		}
		return nil, nil, err
	}
	return store, objects, nil
}

// joinRemote starts the mount's writer session on the bucket prefix
// (remote.Join: the lease, the join entry, the merge of what is published),
// and returns the function that ends it.
func joinRemote(ctx context.Context, store *cas.Store, tier *remote.Tier, logger *log.Logger) (func(), error) {
	id, err := store.ID()
	if err != nil {
		return nil, err
	}
	lease, err := envDuration(leaseEnv)
	if err != nil {
		return nil, err
	}
	sess, err := remote.Join(ctx, tier, id, remote.SessionOptions{Lease: lease, StoreDir: store.Dir(), Logf: logger.Printf})
	if err != nil {
		return nil, err
	}
	logger.Printf("writer session %s on %s", sess.ID(), tier.Location())
	return func() {
		if err := tier.Close(context.Background()); err != nil { // the session now: a rejoin replaces sess
			logger.Printf("%v", err)
		}
	}, nil
}

// remoteSync returns a writing remote mount's uploader, what `ckptfs sync`
// runs in the daemon, and what runs after each commit (the upload itself
// with --commit=remote, else a nudge to the uploader); up and afterCommit
// are nil without a writing remote.
func remoteSync(cfg *mountConfig, tier *remote.Tier, logger *log.Logger, every time.Duration) (up *uploader, syncFn func(context.Context) error, afterCommit func(context.Context) error) {
	switch {
	case tier != nil && !cfg.readOnly:
		up = newUploader(tier, logger, every)
		if cfg.commitMode == "remote" {
			return up, up.syncReport, up.sync
		}
		return up, up.syncReport, up.poke
	case cfg.readOnly:
		return nil, func(context.Context) error { return errReadOnlyRemote }, nil
	}
	return nil, func(context.Context) error { return errors.New("this mount has no remote (--remote)") }, nil
}

// announce says the mount is live: the "serving" line (what a test or a
// service manager waits for), after making a store open to others private.
func announce(stdout io.Writer, ready *readyPipe, logger *log.Logger, storeDir, mnt string) {
	if msg, err := tightenStore(storeDir); err != nil {
		logger.Printf("%v", err)
	} else if msg != "" {
		logger.Print(msg) // the foreground's stderr, or the background daemon's log
		if ready != nil {
			ready.note(msg) // and the terminal that started it
		}
	}
	if ready != nil { // a daemon in the background: no terminal to press Ctrl-C in
		fmt.Fprintf(stdout, "ckptfs: serving %s at %s (unmount: %s)\n", storeDir, mnt, unmountCommand(mnt))
		ready.ready()
		return
	}
	fmt.Fprintf(stdout, "ckptfs: serving %s at %s (Ctrl-C to unmount)\n", storeDir, mnt)
}

// mountServer is the FUSE server of a mount (fusefs.Mount's).
type mountServer interface {
	Wait()
	Unmount() error
}

// waitForUnmount serves until the mount goes away: unmounted from outside,
// or by us when ctx ends (a signal). A mount still in use is detached; the
// kernel lets go once its files are closed.
func waitForUnmount(ctx context.Context, srv mountServer, mnt string, logger *log.Logger, stderr io.Writer) error {
	served := make(chan struct{})
	go func() {
		srv.Wait()
		close(served)
	}()
	select {
	case <-ctx.Done():
		if err := srv.Unmount(); err != nil {
			logger.Printf("unmount: %v", err)
			if err := detach(mnt); err != nil {
				return fmt.Errorf("unmount %s: %w", mnt, err)
			}
			fmt.Fprintf(stderr, "ckptfs: %s is busy: detached it from the namespace; the daemon keeps serving the processes that still have files open in it and exits (committing their files) once they close them (fuser -vm %s lists them)\n", mnt, mnt)
		}
		<-served
	case <-served: // unmounted from outside (umount)
	}
	return nil
}

// checkMountpoint returns the absolute mountpoint after checking that it is a
// directory nobody has mounted on, that it is not a store (STORE and
// MOUNTPOINT swapped: the mount would create a new store in the mountpoint
// and hide the old one under it), and, unless nonEmpty, that it is empty
// (a mount hides what is in its mountpoint). A stale FUSE mount left by a
// dead daemon ("transport endpoint is not connected") is detached first.
// stat(2) alone cannot tell a dead mount (the kernel may answer it from its
// attribute cache); statfs(2) always asks the daemon.
func checkMountpoint(mnt string, nonEmpty bool) (string, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return "", err
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(abs, &sfs); errors.Is(err, syscall.ENOTCONN) {
		if err := detach(abs); err != nil {
			return "", fmt.Errorf("mountpoint %s: clearing the stale mount of a dead daemon: %w", abs, err)
		}
	}
	st, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("mountpoint %s does not exist", abs)
	}
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("mountpoint %s is not a directory", abs)
	}
	mounted, err := isMountpoint(abs)
	if err != nil {
		return "", err
	}
	if mounted {
		return "", fmt.Errorf("mountpoint %s is busy: something is already mounted there", abs)
	}
	if _, err := os.Stat(filepath.Join(abs, "catalog.db")); err == nil {
		return "", fmt.Errorf("mountpoint %s is a ckptfs store: did you swap STORE and MOUNTPOINT? (ckptfs mount STORE MOUNTPOINT)", abs)
	}
	if nonEmpty {
		return abs, nil
	}
	f, err := os.Open(abs)
	if errors.Is(err, os.ErrPermission) {
		return abs, nil // what cannot be listed cannot be named; fusermount3 decides
	}
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	if len(names) > 0 {
		sort.Strings(names)
		what := strings.Join(names[:min(3, len(names))], ", ")
		if len(names) > 3 {
			what += ", ..."
		}
		return "", fmt.Errorf("mountpoint %s is not empty (%s): the mount would hide what is there; give --nonempty to mount over it anyway", abs, what)
	}
	return abs, nil
}

// tightenStore takes the group's and others' permissions off the store
// directory dir (a store is its owner's alone: cas creates it 0700, but a
// user may have made it with mkdir first) and returns what it did, for the
// log and the user, or "" when nothing needed doing. Called once the mount
// is live, so that a refused mount changes nothing.
func tightenStore(dir string) (string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("store %s: %w", dir, err)
	}
	perm := st.Mode().Perm()
	if perm&0o077 == 0 {
		return "", nil
	}
	if err := os.Chmod(dir, perm&^0o077); err != nil {
		return "", fmt.Errorf("store %s is mode %04o, open to other users, and could not be made private: %w", dir, perm, err)
	}
	return fmt.Sprintf("store %s was mode %04o, open to other users: made it %04o", dir, perm, perm&^0o077), nil
}

// isMountpoint reports whether path is the mount point of a mount in this
// process's namespace (/proc/self/mountinfo, field 5, octal-escaped).
func isMountpoint(path string) (bool, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false, err
	}
	ms, err := readMountinfo()
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.point == real {
			return true, nil
		}
	}
	return false, nil
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// memoryOverhead is what the daemon needs beside its chunk cache: FUSE request
// buffers (fusefs bounds them to 64 MiB), chunks being encoded, the catalog's
// pages, the runtime.
const memoryOverhead = 96 << 20

// setMemoryLimit keeps the daemon's heap near limit (planMemory: the cache +
// overhead, within the memory budget). The cache is bounded, but by default
// Go lets the heap grow to twice the live data before collecting, so a full
// cache showed as ~2.2x its size in RSS. GOMEMLIMIT, if set, wins.
func setMemoryLimit(limit int64) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(limit)
}

// setProcs gives the daemon more Ps than cores and returns the cores it may
// use (GOMAXPROCS as the runtime set it: the CPUs, or the cgroup's limit).
//
// The daemon's goroutines spend much of their time in blocking system calls:
// read and writev on /dev/fuse, O_DIRECT object reads, fdatasync. A P whose
// thread blocks in one is handed to another thread only when sysmon notices
// (20 µs to 10 ms later), so with GOMAXPROCS = cores a core often sat idle
// while chunks waited to be decoded: on the 2-core machines a cold 1 GiB read
// took 1.65 s at 2 Ps, 1.42 s at 4 and 1.34 s at 8 (medians of 4,
// alternating), and fresh writes were no slower.
//
// Two extra Ps, not more: the garbage collector sizes its mark workers (a
// quarter of the Ps) and its CPU limiter under the memory limit (half of the
// Ps) from GOMAXPROCS, so every extra P lets a collection take more of the
// real cores. CPU-heavy work on the write path stays bounded by slots sized
// from the cores, not the Ps (storeOptions). GOMAXPROCS, if set, wins.
func setProcs() (cores int) {
	cores = runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") != "" {
		return cores
	}
	runtime.GOMAXPROCS(cores + 2)
	return cores
}

// inlineEncodersFlag defines --inline-encoders, shared by mount and import.
func inlineEncodersFlag(fl *flag.FlagSet) *int {
	return fl.Int("inline-encoders", 0, "new chunks encoded at once while files are written; a chunk finding none free is stored raw and encoded when the store is idle (0: half the cores; -1: none)")
}

// checkInlineEncoders refuses an --inline-encoders value below -1.
func checkInlineEncoders(n int, c command, stderr io.Writer) error {
	if n < -1 {
		fmt.Fprintf(stderr, "ckptfs %s: --inline-encoders must be -1 (none), 0 (half the cores) or a count, not %d\n", c.name, n)
		return errUsage
	}
	return nil
}

// storeOptions sizes opts' CPU slots from cores (not runtime.NumCPU, which
// ignores a cgroup's limit, nor GOMAXPROCS, which setProcs raised): hashing on
// one fewer than the cores, inline encoding on half of them unless encoders
// says otherwise.
func storeOptions(cores, encoders int, opts cas.Options) cas.Options {
	opts.HashWorkers = max(1, cores-1)
	opts.InlineEncoders = encoders
	if encoders == 0 {
		opts.InlineEncoders = max(1, cores/2)
	}
	return opts
}

// maxReadAheadKB bounds --readahead-kb: 64 chunks. The kernel takes any
// number (a window of gigabytes), and every lazy reader would pay for it.
const maxReadAheadKB = 64 << 10

// remoteReadAheadKB is the kernel readahead of a reading mount. At the
// local default (1 MiB), a safe_open of one 4 MiB tensor on a fresh reading
// mount fetched 11 MiB from the bucket: the header read's readahead pulled in
// the first tensor's first chunk, the fault's read-around two chunks before
// the tensor, the readahead after it three chunks of the next tensor (1 MiB
// windows that a 4904-byte header misaligns with 1 MiB chunks touch one chunk
// more on each side). At 256 KiB each window touches at most one extra chunk.
const remoteReadAheadKB = 256

// flagSet reports whether the command line set flag name.
func flagSet(fl *flag.FlagSet, name string) bool {
	set := false
	fl.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
