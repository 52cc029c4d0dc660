package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
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
// names the store) or a store directory.
func resolveTarget(p string) (target, error) {
	data, err := os.ReadFile(filepath.Join(p, ".ckptfs", "stats.json"))
	if err == nil {
		var st struct {
			Store string `json:"store"`
		}
		if err := json.Unmarshal(data, &st); err != nil || st.Store == "" {
			return target{}, fmt.Errorf("%s: stats.json does not name the store", p)
		}
		return target{storeDir: st.Store, socket: filepath.Join(st.Store, socketName)}, nil
	}
	if _, err := os.Stat(filepath.Join(p, "catalog.db")); err != nil {
		return target{}, fmt.Errorf("%s is neither a ckptfs mountpoint nor a store", p)
	}
	// A store its daemon has open: ask the daemon, which holds the store's lock.
	if sock := filepath.Join(p, socketName); isSocket(sock) {
		if abs, err := filepath.Abs(p); err == nil {
			return target{storeDir: abs, socket: filepath.Join(abs, socketName)}, nil
		}
	}
	return target{storeDir: p}, nil
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
