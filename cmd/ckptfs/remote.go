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
)

// The remote tier in the daemon (cas/remote/doc.go has the design): a
// writing mount has a writer session (one of any number on the prefix) and
// runs an uploader that runs a round after commits and every refresh
// interval (publish this mount's changes, apply the other writers'), and
// retries failed ones with a growing pause; a reading mount (--read-only)
// applies what is published at start and every refresh interval.

const (
	// refreshInterval is how often a mount runs a round (a writer: publish
	// its changes, commits or not, and apply the others'; a reader: apply),
	// unless CKPTFS_REMOTE_REFRESH says otherwise.
	refreshInterval = 2 * time.Second
	retryMin        = time.Second
	retryMax        = 30 * time.Second
)

// Hidden knobs, for tests and for users who need them: the writer lease
// (remote.DefaultLease) and the bound on one request to the bucket.
const (
	leaseEnv   = "CKPTFS_REMOTE_LEASE"
	timeoutEnv = "CKPTFS_REMOTE_TIMEOUT"
	refreshEnv = "CKPTFS_REMOTE_REFRESH"
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
func applyPublished(ctx context.Context, tier *remote.Tier, url string, logger *log.Logger, ready *readyPipe) (bool, error) {
	published, n, err := tier.ApplyPublished(ctx)
	if err != nil {
		return false, fmt.Errorf("read the files of %s: %w", url, err)
	}
	if !published {
		msg := fmt.Sprintf("warning: nothing is published in %s (a mistyped prefix?): the mount stays empty until a writer syncs there", url)
		logger.Print(msg)
		if ready != nil {
			ready.note(msg)
		}
	} else if n > 0 {
		logger.Printf("applied %d changes published in %s", n, url)
	}
	return published, nil
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

// adoptBatch is how many objects adoptFetched looks up in one catalog read.
const adoptBatch = 4096

// adoptFetched hands the tier the copies earlier processes fetched, so that
// --local-cache-size bounds them too (tiered.Backend.Adopt): the chunk
// objects in the store that its catalog does not index (the catalog indexes
// what this store committed; a copy a tier fetched has no row). An object a
// commit in flight wrote has no row yet either; the eviction that may follow
// goes through cas's discard, which deletes only what no row names and no
// batch pins, so it is safe while the mount serves, and the mount runs this
// in the background (cmd_mount) instead of making the mount wait for it.
// Objects a crash left before their commit count as copies too, which is
// harmless: they are garbage. So may the objects of a file unlinked during
// its commit (cas.Batch.Keep), which no row names and no batch pins while
// the file's open handles read them: live (the open files' manifests,
// FS.LiveManifests, read after the walk) names them, and they are left out.
// It returns how many objects and bytes it handed over. Its cost is one
// walk of the object directories (a stat per object) and a catalog read per
// adoptBatch objects: about 1 s for 10⁵ objects in 51,000 directories, warm
// page cache, on a busy 2-core machine, nearly all of it the walk;
// BenchmarkAdoptFetched measures it. It holds the entries of the unindexed
// objects: the fetched copies (what budgets of earlier mounts allowed,
// more after a budget was lowered) and any crash's debris.
func adoptFetched(ctx context.Context, store *cas.Store, objects *tiered.Backend, live func() []*cas.Manifest) (int, int64, error) {
	var unindexed []cas.ObjectInfo
	batch := make([]cas.ObjectInfo, 0, adoptBatch)
	check := func() error {
		err := store.View(func(tx *cas.Tx) error {
			for _, o := range batch {
				if _, indexed, err := tx.Chunk(o.ID); err != nil {
					return err
				} else if !indexed {
					unindexed = append(unindexed, o)
				}
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	err := store.WalkObjects(ctx, func(o cas.ObjectInfo) error {
		if batch = append(batch, o); len(batch) == adoptBatch {
			return check()
		}
		return nil
	})
	if err == nil {
		err = check()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("count the copies earlier mounts fetched: %w", err)
	}
	named := map[cas.ID]bool{}
	if live != nil {
		for _, m := range live() {
			for _, c := range m.Chunks {
				named[c.ID] = true
			}
		}
	}
	var fetched []backend.Info
	var size int64
	for _, o := range unindexed {
		if !named[o.ID] {
			fetched = append(fetched, backend.Info{Handle: backend.Handle{Kind: backend.Chunk, Name: o.ID.String()}, Size: o.Size, ModTime: o.ModTime})
			size += o.Size
		}
	}
	objects.Adopt(ctx, fetched)
	return len(fetched), size, nil
}

// uploadRounder is what an uploader runs: remote.Tier's rounds.
type uploadRounder interface {
	UploadRound(ctx context.Context, force bool) error
	Location() string
}

// uploader runs upload rounds in the background of a writing mount.
//
// A background round that finds a path this store published superseded by
// another writer's later version only logs it; the next `ckptfs sync`
// reports it (syncReport), so that the writer who syncs learns its version
// lost, though its own round then had nothing left to upload.
type uploader struct {
	tier   uploadRounder
	logger *log.Logger
	kick   chan struct{}
	every  time.Duration

	mu         sync.Mutex
	lastErr    error // of the last round, nil once one succeeded
	superseded error // background rounds' ErrSuperseded since the last syncReport
}

func newUploader(tier uploadRounder, logger *log.Logger, every time.Duration) *uploader {
	return &uploader{tier: tier, logger: logger, kick: make(chan struct{}, 1), every: every}
}

// refreshEvery is the interval of a mount's rounds (CKPTFS_REMOTE_REFRESH).
func refreshEvery() (time.Duration, error) {
	d, err := envDuration(refreshEnv)
	if d == 0 {
		d = refreshInterval
	}
	return d, err
}

// poke asks for a round soon; it never blocks (a commit calls it).
func (u *uploader) poke(context.Context) error {
	select {
	case u.kick <- struct{}{}:
	default:
	}
	return nil
}

// run runs rounds until ctx is done: one after every poke (a commit) and
// every refresh interval (publishing namespace changes that are not
// commits, applying the other writers'), and after a failure again after a
// pause that doubles up to retryMax. A fenced session's next round rejoins
// as a new session.
func (u *uploader) run(ctx context.Context) {
	wait := time.Duration(0)
	u.poke(ctx) // a previous daemon may have left uploads pending
	tick := time.NewTicker(u.every)
	defer tick.Stop()
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
		}
		err := u.round(ctx, false)
		switch {
		case err == nil:
			wait = 0
		case ctx.Err() != nil:
			return
		case errors.Is(err, remote.ErrSuperseded):
			wait = 0
			u.logger.Printf("%v", err)
			u.mu.Lock()
			u.superseded = errors.Join(u.superseded, err)
			u.mu.Unlock()
		case errors.Is(err, remote.ErrTrashed):
			// No backoff: rounds at the usual pace acknowledge the trash
			// lists, and publish the files held back once it is purged.
			wait = 0
			u.logger.Printf("upload to %s: %v", u.tier.Location(), err)
		case errors.Is(err, remote.ErrFenced):
			wait = retryMin
			u.logger.Printf("upload to %s: %v", u.tier.Location(), err)
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
// is in the bucket (--commit=remote: after each commit).
func (u *uploader) sync(ctx context.Context) error {
	if err := u.round(ctx, true); err != nil {
		return fmt.Errorf("upload to %s: %w", u.tier.Location(), err)
	}
	return nil
}

// syncReport is sync for `ckptfs sync`: it also reports, once, the paths
// that background rounds since the last syncReport found superseded.
func (u *uploader) syncReport(ctx context.Context) error {
	u.mu.Lock()
	earlier := u.superseded
	u.superseded = nil
	u.mu.Unlock()
	err := u.sync(ctx)
	if earlier != nil {
		err = errors.Join(err, fmt.Errorf("upload to %s (a background round since the last sync): %w", u.tier.Location(), earlier))
	}
	return err
}

// refresher applies what the remote's writers publish to a reading mount
// (new, overwritten, removed and renamed paths) every refresh interval.
type refresher struct {
	tier     *remote.Tier
	logger   *log.Logger
	every    time.Duration
	location string
}

func (r *refresher) run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, n, err := r.tier.Refresh(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.logger.Printf("refresh from %s: %v", r.location, err)
		case n > 0:
			r.logger.Printf("applied %d changes published in %s", n, r.location)
		}
	}
}

// errReadOnlyRemote answers ckptfs sync on a reading mount.
var errReadOnlyRemote = errors.New("this mount reads its remote (--read-only): it has nothing to upload")
