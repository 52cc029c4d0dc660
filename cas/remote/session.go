package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
)

// DefaultLease is how long a writer session's lease lasts without a
// heartbeat reaching the bucket (doc.go, "Sessions and leases").
const DefaultLease = 2 * time.Minute

// ErrLocked means another writer session holds the remote's lease.
var ErrLocked = errors.New("the remote is mounted for writing elsewhere")

// ErrFenced means this mount's writer session can publish nothing more,
// ever: another session took its lease or appended to the log.
var ErrFenced = errors.New("this mount's writer session lost the remote")

// ErrLeaseExpired means no lease write reached the bucket for too long; a
// renewal that finds the lease still ours makes the session usable again.
var ErrLeaseExpired = errors.New("this mount's writer lease expired")

// conditional is the compare-and-swap a bucket offers (cas/backend/s3):
// the lease is replaced and released only if it still has the tag read.
type conditional interface {
	GetTag(ctx context.Context, h backend.Handle, buf []byte) ([]byte, string, error)
	PutIfMatch(ctx context.Context, h backend.Handle, obj []byte, tag string) (string, error)
	DeleteIfMatch(ctx context.Context, h backend.Handle, tag string) error
}

// SessionOptions configure Join.
type SessionOptions struct {
	Lease time.Duration // 0: DefaultLease
	// StoreDir is the store's directory: a lease held for the same store ID
	// and the same directory (host, device, inode) belongs to a daemon that
	// died (the caller holds the store's lock), and is taken over at once.
	// A copy of the store has another inode: it waits like anyone else.
	StoreDir string
	Logf     func(format string, args ...any) // lease trouble and merges; nil: silent
}

// lockRecord is locks/writer, the lease.
type lockRecord struct {
	Session string        `json:"session"` // random per mount: a copied store is a new session
	Store   string        `json:"store"`   // the holder's Store.ID
	Dir     string        `json:"dir"`     // host, device and inode of its directory
	Host    string        `json:"host"`
	PID     int           `json:"pid"`
	Lease   time.Duration `json:"lease_ns"`
	Since   time.Time     `json:"since"`
	Beat    time.Time     `json:"beat"`
}

// Session is a writer's session on a prefix: its lease, its place in the
// log, and whether it is fenced. Close ends it.
type Session struct {
	r    *Tier
	be   backend.Backend
	cond conditional // nil: the bucket cannot compare-and-swap (tests' mem)
	opts SessionOptions
	rec  lockRecord

	stop    context.CancelFunc
	done    chan struct{}
	renewMu sync.Mutex // one lease write at a time

	mu         sync.Mutex
	tag        string    // the lease object's tag (or body) as we wrote it last
	validUntil time.Time // monotonic: publish and collect only before it
	fenced     error     // non-nil for good once the session lost the log
	seq        uint64    // the log entry this session appended last
	published  string    // digest of the files it published last
}

func lockHandle() backend.Handle { return backend.Handle{Kind: backend.Lock, Name: writerName} }

// dirIdentity names the store directory dir on this host.
func dirIdentity(host, dir string) string {
	var st syscall.Stat_t
	if dir == "" || syscall.Stat(dir, &st) != nil {
		return ""
	}
	return fmt.Sprintf("%s:%d:%d", host, st.Dev, st.Ino)
}

func newSession(r *Tier, storeID string, opts SessionOptions) *Session {
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	host, _ := os.Hostname()
	now := time.Now().UTC()
	nonce := cas.Sum(fmt.Appendf(nil, "%s %d %d %p", host, os.Getpid(), now.UnixNano(), r)).String()[:16]
	s := &Session{r: r, be: r.be, opts: opts, rec: lockRecord{
		Session: nonce, Store: storeID, Dir: dirIdentity(host, opts.StoreDir),
		Host: host, PID: os.Getpid(), Lease: opts.Lease, Since: now, Beat: now,
	}}
	s.cond, _ = r.be.(conditional)
	return s
}

// ID is the session's nonce.
func (s *Session) ID() string { return s.rec.Session }

// getLock reads the lease and its tag (its body where there are no tags).
func (s *Session) getLock(ctx context.Context) ([]byte, string, error) {
	if s.cond != nil {
		return s.cond.GetTag(ctx, lockHandle(), nil)
	}
	b, err := s.be.Get(ctx, lockHandle(), nil)
	return b, string(b), err
}

// replaceLock writes body over the lease if it still has tag; the new tag.
func (s *Session) replaceLock(ctx context.Context, body []byte, tag string) (string, error) {
	if s.cond != nil {
		return s.cond.PutIfMatch(ctx, lockHandle(), body, tag)
	}
	cur, err := s.be.Get(ctx, lockHandle(), nil)
	if err != nil {
		return "", err
	}
	if string(cur) != tag {
		return "", errModified
	}
	return string(body), s.be.Put(ctx, lockHandle(), body, backend.PutOptions{})
}

var errModified = errors.New("the lease changed since it was read")

// takeLease puts the lease if absent; a held one is taken only if it is
// ours by directory, or silent for a whole lease on our own clock.
func (s *Session) takeLease(ctx context.Context) error {
	loc := s.be.Location()
	body, err := json.Marshal(s.rec)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 3; attempt++ {
		start := time.Now()
		err := s.be.Put(ctx, lockHandle(), body, backend.PutOptions{IfAbsent: true})
		if err == nil {
			_, tag, err := s.getLock(ctx)
			if err != nil {
				return fmt.Errorf("read back the writer lease of %s: %w", loc, err)
			}
			s.renewed(start, tag)
			return nil
		}
		if !errors.Is(err, backend.ErrExists) {
			return fmt.Errorf("take the writer lease of %s: %w", loc, err)
		}
		cur, tag, err := s.getLock(ctx)
		if errors.Is(err, backend.ErrNotExist) {
			continue // released meanwhile
		}
		if err != nil {
			return fmt.Errorf("read the writer lease of %s: %w", loc, err)
		}
		var other lockRecord
		_ = json.Unmarshal(cur, &other) // a damaged lease is still a lease: judged by its age
		if err := s.waitStale(ctx, other, tag); err != nil {
			return err
		}
		start = time.Now()
		newTag, err := s.replaceLock(ctx, body, tag)
		if err != nil {
			if errors.Is(err, errModified) || errors.Is(err, backend.ErrNotExist) || isModified(err) {
				return fmt.Errorf("%s: %w (another writer took the stale lease first)", loc, ErrLocked)
			}
			return fmt.Errorf("take over the writer lease of %s: %w", loc, err)
		}
		s.renewed(start, newTag)
		return nil
	}
	return fmt.Errorf("%s: %w (the lease kept changing)", loc, ErrLocked)
}

// waitStale returns nil when the lease other (with tag) may be taken over:
// it names this store directory, or it is unchanged for a whole lease as
// our monotonic clock measures (no clock of another host is trusted).
func (s *Session) waitStale(ctx context.Context, other lockRecord, tag string) error {
	loc := s.be.Location()
	if other.Dir != "" && other.Dir == s.rec.Dir && other.Store == s.rec.Store {
		s.opts.Logf("taking over the writer lease of %s from session %s of this store (pid %d: its daemon is gone)", loc, other.Session, other.PID)
		return nil
	}
	lease := other.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	info, err := s.be.Stat(ctx, lockHandle())
	if err != nil {
		return fmt.Errorf("read the writer lease of %s: %w", loc, err)
	}
	if age := time.Since(info.ModTime); age < lease {
		return fmt.Errorf("%s: %w: held by %s pid %d since %s, last heartbeat %s ago; mount it read-only (--read-only), or stop that writer",
			loc, ErrLocked, other.Host, other.PID, other.Since.Format(time.RFC3339), age.Round(time.Second))
	}
	s.opts.Logf("the writer lease of %s (%s pid %d) looks stale; waiting %v to be sure", loc, other.Host, other.PID, lease)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(lease):
	}
	_, now, err := s.getLock(ctx)
	if err != nil && !errors.Is(err, backend.ErrNotExist) {
		return fmt.Errorf("read the writer lease of %s: %w", loc, err)
	}
	if now != tag {
		return fmt.Errorf("%s: %w: %s pid %d renewed its lease", loc, ErrLocked, other.Host, other.PID)
	}
	return nil
}

// isModified reports a conditional write refused: the tag changed.
func isModified(err error) bool { return errors.Is(err, s3.ErrModified) }

// renewed records a lease write that started at start and left tag.
func (s *Session) renewed(start time.Time, tag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tag = tag
	// Whoever takes the lease over waits a whole lease after reading what
	// this write left, which it read after start: stopping a quarter lease
	// earlier leaves room for clock rates and requests in flight.
	if v := start.Add(s.opts.Lease - s.opts.Lease/4); v.After(s.validUntil) {
		s.validUntil = v
	}
}

// fence makes the session unable to publish, for good.
func (s *Session) fence(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced == nil {
		s.fenced = err
		s.opts.Logf("%v", err)
	}
}

// Err returns why the session cannot publish now, or nil.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced != nil {
		return s.fenced
	}
	if time.Now().After(s.validUntil) {
		return fmt.Errorf("%w: no heartbeat reached %s for %v (paused, or the bucket is unreachable)", ErrLeaseExpired, s.be.Location(), s.opts.Lease-s.opts.Lease/4)
	}
	return nil
}

// deadline is when the session must stop publishing and collecting.
func (s *Session) deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.validUntil
}

func (s *Session) startHeartbeat(ctx context.Context) {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stop, s.done = cancel, make(chan struct{})
	go s.heartbeat(hctx)
}

func (s *Session) heartbeat(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(max(s.opts.Lease/6, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.renew(ctx)
		switch {
		case errors.Is(err, ErrFenced):
			return
		case err != nil && ctx.Err() == nil:
			s.opts.Logf("writer lease heartbeat to %s: %v", s.be.Location(), err)
		}
	}
}

// renew rewrites the lease if it is still ours (If-Match); finding it
// taken fences the session.
func (s *Session) renew(ctx context.Context) error {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	s.mu.Lock()
	fenced, tag := s.fenced, s.tag
	s.mu.Unlock()
	if fenced != nil {
		return fenced
	}
	rec := s.rec
	rec.Beat = time.Now().UTC()
	body, _ := json.Marshal(rec) // strings, ints and times: cannot fail
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.opts.Lease/4)
	newTag, err := s.replaceLock(rctx, body, tag)
	cancel()
	switch {
	case err == nil:
		s.renewed(start, newTag)
		return nil
	case errors.Is(err, errModified) || errors.Is(err, backend.ErrNotExist) || isModified(err):
		err := fmt.Errorf("%w: another writer took the lease of %s (this session %s was silent too long); remount to rejoin as a new session", ErrFenced, s.be.Location(), s.rec.Session)
		s.fence(err)
		return err
	}
	return fmt.Errorf("renew the writer lease of %s: %w", s.be.Location(), err)
}

// usable returns nil when the session may publish or collect now: its
// lease is valid, renewed on the spot if it lapsed (a pause, a bucket
// that was unreachable), unless someone else took it meanwhile.
func (s *Session) usable(ctx context.Context) error {
	err := s.Err()
	if !errors.Is(err, ErrLeaseExpired) {
		return err
	}
	if rerr := s.renew(ctx); rerr != nil {
		if errors.Is(rerr, ErrFenced) {
			return rerr
		}
		return errors.Join(err, rerr)
	}
	return s.Err()
}

// Close stops the heartbeat and releases the lease if it is still ours.
func (s *Session) Close(ctx context.Context) error {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	s.r.setSession(nil)
	s.mu.Lock()
	tag, fenced := s.tag, s.fenced != nil
	s.mu.Unlock()
	if fenced {
		return nil // not ours to remove
	}
	var err error
	if s.cond != nil {
		err = s.cond.DeleteIfMatch(ctx, lockHandle(), tag)
	} else if cur, gerr := s.be.Get(ctx, lockHandle(), nil); gerr == nil && string(cur) == tag {
		err = s.be.Delete(ctx, lockHandle())
	}
	if err != nil && !errors.Is(err, backend.ErrNotExist) && !isModified(err) {
		return fmt.Errorf("release the writer lease of %s: %w", s.be.Location(), err)
	}
	return nil
}
