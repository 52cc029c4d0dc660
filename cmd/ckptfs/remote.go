package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/fusefs"
)

// The remote tier in the daemon (cas/remote.go has the design): a writing
// mount holds the remote's writer lock and runs an uploader that starts an
// upload round after commits (and retries failed ones with a growing pause);
// a reading mount (--read-only) imports the remote's newest snapshot at
// start and every refreshInterval.

const (
	refreshInterval = 2 * time.Second
	// publishInterval is how often a writer publishes namespace changes
	// that are not commits (rename, unlink, chmod, …) without a sync.
	publishInterval = 5 * time.Second
	retryMin        = time.Second
	retryMax        = 30 * time.Second
)

// Hidden knobs, for tests and for users who need them: the writer lease
// (remote.DefaultLease) and the bound on one request to the bucket.
const (
	leaseEnv   = "CKPTFS_REMOTE_LEASE"
	timeoutEnv = "CKPTFS_REMOTE_TIMEOUT"
)

// envDuration reads a duration from the environment variable name (0 when
// unset).
func envDuration(name string) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 30s", name, v)
	}
	return d, nil
}

// applyPublished brings a reading mount's store to the newest published
// namespace before it is served, and warns once when nothing is published:
// in the log, and on the terminal that started a --background mount.
func applyPublished(ctx context.Context, tier *remote.Tier, url string, logger *log.Logger, ready *readyPipe) (string, error) {
	name, n, err := tier.ApplyPublished(ctx)
	if err != nil {
		return "", fmt.Errorf("read the files of %s: %w", url, err)
	}
	if name == "" {
		msg := fmt.Sprintf("warning: nothing is published in %s (a mistyped prefix?): the mount stays empty until a writer syncs there", url)
		logger.Print(msg)
		if ready != nil {
			ready.note(msg)
		}
	} else if n > 0 {
		logger.Printf("applied %d changes published in %s", n, url)
	}
	return name, nil
}

// remoteOptions say how a command talks to its bucket.
type remoteOptions struct {
	// timeout bounds one request (s3.Options.RequestTimeout); 0: $CKPTFS_REMOTE_TIMEOUT,
	// else s3.DefaultRequestTimeout.
	timeout time.Duration
	// write: the command writes to the bucket, so the server must honour
	// the conditional writes the protocol rests on (s3.CheckConditional).
	write bool
}

// openRemote connects to s3://BUCKET/PREFIX with the AWS_* configuration,
// and for a writer checks once, on a scratch object, that the server
// supports conditional writes: one that ignores them would let two writers
// take the prefix at once, so the mount is refused with one line instead.
func openRemote(ctx context.Context, url string, ro remoteOptions) (backend.Backend, error) {
	timeout := ro.timeout
	if timeout == 0 {
		var err error
		if timeout, err = envDuration(timeoutEnv); err != nil {
			return nil, err
		}
	}
	be, err := s3.Open(ctx, url, s3.Options{RequestTimeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("remote: %w", err) // the error names the bucket and prefix
	}
	if ro.write {
		if err := be.CheckConditional(ctx); err != nil {
			be.Close()
			if errors.Is(err, s3.ErrUnsupported) {
				return nil, fmt.Errorf("remote: %w; a writing mount needs If-None-Match: * and If-Match (AWS S3, versitygw and moto have them; see cas/backend/s3)", err)
			}
			return nil, fmt.Errorf("remote: %w", err)
		}
	}
	return be, nil
}

// openTiered opens the bucket at url behind the local objects of the store
// in storeDir, keeping up to cacheSize bytes of fetched objects.
func openTiered(ctx context.Context, url, storeDir string, cacheSize int64, ro remoteOptions) (*tiered.Backend, error) {
	be, err := openRemote(ctx, url, ro)
	if err != nil {
		return nil, err
	}
	return tiered.New(local.New(cas.ObjectsDir(storeDir), local.Options{}), be, tiered.Options{CacheSize: cacheSize}), nil
}

// remoteTier is the remote tier's write side of store, whose objects are
// objects; nil without a remote (objects nil).
func remoteTier(store *cas.Store, objects *tiered.Backend) *remote.Tier {
	if objects == nil {
		return nil
	}
	return remote.New(store, objects)
}

// uploader runs upload rounds in the background of a writing mount.
type uploader struct {
	tier   *remote.Tier
	logger *log.Logger
	kick   chan struct{}

	mu      sync.Mutex
	lastErr error // of the last round, nil once one succeeded
}

func newUploader(tier *remote.Tier, logger *log.Logger) *uploader {
	return &uploader{tier: tier, logger: logger, kick: make(chan struct{}, 1)}
}

// poke asks for a round soon; it never blocks (a commit calls it).
func (u *uploader) poke(context.Context) error {
	select {
	case u.kick <- struct{}{}:
	default:
	}
	return nil
}

// run uploads until ctx is done: a round after every poke, a forced one
// (namespace changes that are not commits) every publishInterval, and after
// a failure again after a pause that doubles up to retryMax; a fenced
// session stops it.
func (u *uploader) run(ctx context.Context) {
	wait := time.Duration(0)
	u.poke(ctx) // a previous daemon may have left uploads pending
	tick := time.NewTicker(publishInterval)
	defer tick.Stop()
	force := true // the session's first round publishes the merged namespace
	for {
		var retry <-chan time.Time
		if wait > 0 {
			retry = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-u.kick:
		case <-retry:
		case <-tick.C:
			force = true
		}
		err := u.round(ctx, force)
		force = false
		switch {
		case err == nil:
			wait = 0
		case ctx.Err() != nil:
			return
		case errors.Is(err, remote.ErrFenced):
			// Only a remount rejoins; ckptfs sync keeps saying why.
			u.logger.Printf("upload to %s: %v; this mount uploads nothing more", u.tier.Location(), err)
			return
		default:
			wait = min(max(2*wait, retryMin), retryMax)
			u.logger.Printf("upload to %s: %v (retrying in %v)", u.tier.Location(), err, wait)
		}
	}
}

func (u *uploader) round(ctx context.Context, force bool) error {
	err := u.tier.UploadRound(ctx, force)
	u.mu.Lock()
	u.lastErr = err
	u.mu.Unlock()
	return err
}

// sync runs a round now and reports whether everything committed before it
// is in the bucket (ckptfs sync, --commit=remote).
func (u *uploader) sync(ctx context.Context) error {
	if err := u.round(ctx, true); err != nil {
		return fmt.Errorf("upload to %s: %w", u.tier.Location(), err)
	}
	return nil
}

// refresher imports the remote's new snapshots into a reading mount.
type refresher struct {
	tier   *remote.Tier
	fsys   *fusefs.FS
	logger *log.Logger
	known  string
}

// refresh imports the newest snapshot if it is new.
func (r *refresher) refresh(ctx context.Context) error {
	snap, name, err := r.tier.Snapshot(ctx, r.known)
	if err != nil || snap == nil {
		return err
	}
	files := make([]fusefs.ImportFile, 0, len(snap.Files))
	for _, f := range snap.Files {
		if f.Manifest != nil { // directories and symlinks wait for a remount
			files = append(files, fusefs.ImportFile{Path: f.Path, Node: f.Node, Manifest: f.Manifest})
		}
	}
	if _, err := r.fsys.ImportFiles(ctx, files); err != nil {
		return err
	}
	r.known = name
	return nil
}

func (r *refresher) run(ctx context.Context) {
	t := time.NewTicker(refreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.refresh(ctx); err != nil && ctx.Err() == nil {
			r.logger.Printf("refresh from %s: %v", r.tier.Location(), err)
		}
	}
}

// errReadOnlyRemote answers ckptfs sync on a reading mount.
var errReadOnlyRemote = errors.New("this mount reads its remote (--read-only): it has nothing to upload")
