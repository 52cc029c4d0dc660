package fusefs

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// DefaultReencodeIdle is how long the filesystem must have seen no activity
// before the background re-encoder runs (WithReencodeIdle).
const DefaultReencodeIdle = 500 * time.Millisecond

// Back-off of the re-encoder after an error, doubling up to the maximum.
const (
	reencodeBackoffMin = time.Second
	reencodeBackoffMax = time.Minute
)

// activityGranularity: noteActivity skips the store when the last noted time
// is this recent, so concurrent readers and writers do not all write the same
// cache line on every request.
const activityGranularity = time.Millisecond

// reencoder is what the background runner needs from the store.
type reencoder interface {
	// Reencode re-encodes up to n queued chunks as one group (one sync,
	// one transaction); more reports whether others remain
	// (cas.Store.Reencode).
	Reencode(ctx context.Context, n int) (more bool, err error)
	// ReencodeBacklog is the raw bytes of the chunks queued.
	ReencodeBacklog() int64
}

// reencodeGroup is how many chunks one Reencode call takes: their syncs
// and transaction are shared, and a group of 1 MiB chunks is a few tens of
// milliseconds of encoding, so activity still stops the runner promptly.
const reencodeGroup = 8

// Keeping up. A store written without a pause (a training job saving every
// few seconds) is never idle, and its raw chunks would wait for ever: the
// store would keep ~0.85 of raw instead of ~0.66. So when the queue holds
// more than busyBacklog raw bytes, the runner also works while the
// filesystem is busy, at a duty cycle: after a group that took d, it pauses
// d·busyPause, taking at most 1/(1+busyPause) of one core from the writers.
// The backlog of a continuous writer therefore stays near busyBacklog (if
// the writer's raw chunks come slower than that share encodes them), and
// stored ÷ unique converges to the encoded ratio as the store grows; a
// single large save (below the threshold) still waits for idle time and
// runs at full speed. Past cas's bound (twice this) the commits themselves
// wait for an encoder (cas.Options.MaxReencodeBacklog).
const (
	busyBacklog = cas.DefaultMaxReencodeBacklog / 2
	busyPause   = 1
)

// WithReencodeIdle sets how long the filesystem must be idle (no FUSE read,
// write or commit) before the background re-encoder stores the chunks that
// commits wrote raw in their encoded form (default DefaultReencodeIdle). d <= 0
// turns the re-encoder off; queued chunks then stay raw (and readable) until a
// mount with it on.
func WithReencodeIdle(d time.Duration) Option { return func(f *FS) { f.reencodeIdle = d } }

// activity tracks when the filesystem was last used. Times are nanoseconds
// since epoch on the monotonic clock, so wall-clock jumps do not matter.
type activity struct {
	epoch time.Time
	last  atomic.Int64 // when activity was last noted
	busy  atomic.Int64 // operations in progress (beginActivity)
}

func (a *activity) now() int64 { return int64(time.Since(a.epoch)) }

// noteActivity records that the filesystem is in use now, postponing background
// work. It is cheap enough for every FUSE read and write: one atomic load, and
// a store at most once per millisecond.
func (f *FS) noteActivity() {
	now := f.act.now()
	if now-f.act.last.Load() >= int64(activityGranularity) {
		f.act.last.Store(now)
	}
}

// beginActivity marks the start of an operation that may run long (a commit):
// background work waits until it ends (and the idle time has passed again).
// Call the returned function when it ends.
func (f *FS) beginActivity() (end func()) {
	f.act.busy.Add(1)
	f.noteActivity()
	return func() {
		f.noteActivity()
		f.act.busy.Add(-1)
	}
}

// idleWait returns how much longer the filesystem must stay idle before it has
// been idle for d; 0 means it has been.
func (a *activity) idleWait(d time.Duration) time.Duration {
	if a.busy.Load() > 0 {
		return d
	}
	wait := d - time.Duration(a.now()-a.last.Load())
	return max(wait, 0)
}

// startBackground starts the re-encoder, unless it is turned off.
func (f *FS) startBackground() {
	f.bgDone = make(chan struct{})
	if f.reencodeIdle <= 0 {
		close(f.bgDone)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.bgStop = cancel
	go func() {
		defer close(f.bgDone)
		f.runReencoder(ctx, f.store, reencodePolicy{idle: f.reencodeIdle, backoffMin: reencodeBackoffMin, backoffMax: reencodeBackoffMax,
			busyBacklog: busyBacklog})
	}()
}

// Close stops the filesystem's background work and waits for it: at most the
// one chunk being re-encoded finishes. Call it after the last CommitAll and
// before closing the store; chunks still queued stay queued in the store for
// the next mount. Calling it again does nothing.
func (f *FS) Close() {
	f.closeOnce.Do(func() {
		if f.bgStop != nil {
			f.bgStop()
		}
		if f.pruneStop != nil {
			f.pruneStop()
		}
		<-f.bgDone
		<-f.pruneDone
	})
}

// reencodePolicy is when the re-encoder runs: after idle without activity,
// and after an error not before backoffMin, doubling up to backoffMax.
type reencodePolicy struct {
	idle, backoffMin, backoffMax time.Duration
	busyBacklog                  int64 // queued raw bytes above which it runs while busy
}

// runReencoder re-encodes queued chunks a group at a time while the filesystem
// has been idle for p.idle, re-checking between groups, and while it is busy
// when the backlog is over p.busyBacklog, at a duty cycle (above), until ctx
// is done. An
// empty queue is polled every idle period. Errors go to the FS logger, and the
// runner then backs off before it tries again; ReencodeOne moves on to the
// next queued chunk, so one chunk that keeps failing does not stall the queue.
func (f *FS) runReencoder(ctx context.Context, r reencoder, p reencodePolicy) {
	var backoff time.Duration
	for {
		busy := false
		if wait := f.act.idleWait(p.idle); wait > 0 {
			if r.ReencodeBacklog() <= p.busyBacklog {
				if !sleepCtx(ctx, min(wait, p.idle)) {
					return
				}
				continue
			}
			busy = true
		}
		start := time.Now()
		more, err := r.Reencode(ctx, reencodeGroup)
		if ctx.Err() != nil {
			return
		}
		pause := time.Duration(0)
		if busy {
			pause = time.Since(start) * busyPause
		}
		switch {
		case err != nil:
			backoff = min(max(2*backoff, p.backoffMin), p.backoffMax)
			f.log.Printf("background re-encode: %v (next try in %v)", err, backoff)
			pause = backoff
		case !more:
			backoff = 0
			pause = p.idle // nothing queued: look again later
		default:
			backoff = 0
		}
		if pause > 0 && !sleepCtx(ctx, pause) {
			return
		}
	}
}

// sleepCtx sleeps for d or until ctx is done, and reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
