package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// Writer lock timing: the holder rewrites the lock every HeartbeatInterval;
// a lock whose last rewrite is older than StaleLockAge (as the remote's clock
// tells: its ModTime) belongs to a writer that died, and is taken over.
const (
	HeartbeatInterval = 10 * time.Second
	StaleLockAge      = 2 * time.Minute
)

// ErrLocked means another writer holds the remote's writer lock.
var ErrLocked = errors.New("the remote is mounted for writing elsewhere")

type lockRecord struct {
	Holder string    `json:"holder"` // random, to recognise our own lock
	Store  string    `json:"store"`  // the holder's Store.ID
	Host   string    `json:"host"`
	PID    int       `json:"pid"`
	Since  time.Time `json:"since"`
	Beat   time.Time `json:"beat"`
}

// Lock is a held writer lock; Unlock releases it.
type Lock struct {
	be   backend.Backend
	rec  lockRecord
	stop context.CancelFunc
	done chan struct{}
	logf func(format string, args ...any)
}

// TakeLock takes be's writer lock (locks/writer) for the store whose ID is
// storeID, with a put-if-absent, and keeps it fresh with a heartbeat until
// Unlock. A lock held by a live writer gives an error wrapping
// ErrLocked that names its host and process; a stale one (no heartbeat
// for StaleLockAge), or one held for the same store (whose daemon died: the
// caller has the store open, so no other process has), is taken over. logf
// reports a heartbeat that failed or found the lock taken from us.
func TakeLock(ctx context.Context, be backend.Backend, storeID string, logf func(format string, args ...any)) (*Lock, error) {
	host, _ := os.Hostname()
	now := time.Now().UTC()
	l := &Lock{be: be, logf: logf, rec: lockRecord{
		Holder: cas.Sum([]byte(fmt.Sprint(host, os.Getpid(), now.UnixNano()))).String()[:16],
		Store:  storeID, Host: host, PID: os.Getpid(), Since: now, Beat: now,
	}}
	h := backend.Handle{Kind: backend.Lock, Name: writerName}
	body, err := json.Marshal(l.rec)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		err = be.Put(ctx, h, body, backend.PutOptions{IfAbsent: true})
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrExists) || attempt > 0 {
			if errors.Is(err, backend.ErrExists) {
				return nil, fmt.Errorf("%s: %w (another writer took the stale lock first)", be.Location(), ErrLocked)
			}
			return nil, fmt.Errorf("take the writer lock of %s: %w", be.Location(), err)
		}
		info, serr := be.Stat(ctx, h)
		old, gerr := be.Get(ctx, h, nil)
		if serr != nil || gerr != nil {
			if errors.Is(serr, backend.ErrNotExist) || errors.Is(gerr, backend.ErrNotExist) {
				continue // released meanwhile
			}
			return nil, fmt.Errorf("read the writer lock of %s: %w", be.Location(), errors.Join(serr, gerr))
		}
		var other lockRecord
		_ = json.Unmarshal(old, &other) // a damaged lock is still a lock: judged by its age
		age := time.Since(info.ModTime)
		same := storeID != "" && other.Store == storeID
		if age < StaleLockAge && !same {
			return nil, fmt.Errorf("%s: %w: held by %s pid %d since %s, last heartbeat %s ago; mount it read-only (--read-only), or stop that writer",
				be.Location(), ErrLocked, other.Host, other.PID, other.Since.Format(time.RFC3339), age.Round(time.Second))
		}
		if logf != nil {
			logf("taking over the writer lock of %s (held by %s pid %d for this store, silent for %s)", be.Location(), other.Host, other.PID, age.Round(time.Second))
		}
		if err := be.Delete(ctx, h); err != nil {
			return nil, fmt.Errorf("remove the stale writer lock of %s: %w", be.Location(), err)
		}
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.stop, l.done = cancel, make(chan struct{})
	go l.heartbeat(hctx)
	return l, nil
}

func (l *Lock) heartbeat(ctx context.Context) {
	defer close(l.done)
	h := backend.Handle{Kind: backend.Lock, Name: writerName}
	t := time.NewTicker(HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := l.be.Get(ctx, h, nil)
		var rec lockRecord
		if err == nil {
			err = json.Unmarshal(cur, &rec)
		}
		if err == nil && rec.Holder != l.rec.Holder {
			err = fmt.Errorf("held by %s pid %d now", rec.Host, rec.PID)
		}
		if err != nil {
			if l.logf != nil && ctx.Err() == nil {
				l.logf("writer lock of %s: %v", l.be.Location(), err)
			}
			continue
		}
		l.rec.Beat = time.Now().UTC()
		body, _ := json.Marshal(l.rec) // a struct of strings, ints and times: cannot fail
		if err := l.be.Put(ctx, h, body, backend.PutOptions{}); err != nil && l.logf != nil && ctx.Err() == nil {
			l.logf("writer lock heartbeat to %s: %v", l.be.Location(), err)
		}
	}
}

// Unlock stops the heartbeat and removes the lock if it is still ours.
func (l *Lock) Unlock(ctx context.Context) error {
	l.stop()
	<-l.done
	h := backend.Handle{Kind: backend.Lock, Name: writerName}
	cur, err := l.be.Get(ctx, h, nil)
	if errors.Is(err, backend.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release the writer lock of %s: %w", l.be.Location(), err)
	}
	var rec lockRecord
	if json.Unmarshal(cur, &rec) == nil && rec.Holder != l.rec.Holder {
		return nil // taken over: not ours to remove
	}
	return l.be.Delete(ctx, h)
}
