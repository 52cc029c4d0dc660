package fusefs

import (
	"context"
	"sync/atomic"
	"time"
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
	// ReencodeOne re-encodes one queued chunk; more reports whether others
	// remain (cas.Store.ReencodeOne).
	ReencodeOne(ctx context.Context) (more bool, err error)
}

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
		f.runReencoder(ctx, f.store, reencodePolicy{idle: f.reencodeIdle, backoffMin: reencodeBackoffMin, backoffMax: reencodeBackoffMax})
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
		<-f.bgDone
	})
}

// reencodePolicy is when the re-encoder runs: after idle without activity,
// and after an error not before backoffMin, doubling up to backoffMax.
type reencodePolicy struct {
	idle, backoffMin, backoffMax time.Duration
}

// runReencoder re-encodes queued chunks one at a time while the filesystem has
// been idle for p.idle, re-checking between chunks, until ctx is done. An
// empty queue is polled every idle period. Errors go to the FS logger, and the
// runner then backs off before it tries again; ReencodeOne moves on to the
// next queued chunk, so one chunk that keeps failing does not stall the queue.
func (f *FS) runReencoder(ctx context.Context, r reencoder, p reencodePolicy) {
	var backoff time.Duration
	for {
		if wait := f.act.idleWait(p.idle); wait > 0 {
			if !sleepCtx(ctx, wait) {
				return
			}
			continue
		}
		more, err := r.ReencodeOne(ctx)
		if ctx.Err() != nil {
			return
		}
		pause := time.Duration(0)
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
