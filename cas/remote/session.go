package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
)

// DefaultLease is how long a writer session's lease lasts without a
// heartbeat reaching the bucket (doc.go, step 1).
const DefaultLease = 2 * time.Minute

// ErrFenced means this mount's writer session can publish nothing more,
// ever: its log ends with a fence (its lease lapsed, or another session
// found it silent for a whole lease). The mount rejoins as a new session.
var ErrFenced = errors.New("this mount's writer session lost the remote")

// ErrSuperseded means a round published this session's changes, but a
// later change by another session won some of its paths (doc.go, "Which
// version wins"): the mount now shows the winners.
var ErrSuperseded = errors.New("superseded by a later change of another writer")

// ErrBusy means a collection of the bucket cannot run now: another
// collection runs.
var ErrBusy = errors.New("another collection of the remote runs")

// conditional is the compare-and-swap a bucket offers (cas/backend/s3).
type conditional interface {
	GetTag(ctx context.Context, h backend.Handle, buf []byte) ([]byte, string, error)
	PutIfMatch(ctx context.Context, h backend.Handle, obj []byte, tag string) (string, error)
	DeleteIfMatch(ctx context.Context, h backend.Handle, tag string) error
}

// SessionOptions configure Join.
type SessionOptions struct {
	Lease    time.Duration                    // 0: DefaultLease
	StoreDir string                           // for messages
	Logf     func(format string, args ...any) // fences, merges, conflicts; nil: silent
}

// lockRecord is locks/session.<id>, a session's lease.
type lockRecord struct {
	Session string        `json:"session"` // random per mount: a copied store is a new session
	Store   string        `json:"store"`   // the holder's Store.ID
	Dir     string        `json:"dir"`
	Host    string        `json:"host"`
	PID     int           `json:"pid"`
	Lease   time.Duration `json:"lease_ns"`
	Since   time.Time     `json:"since"`
	Beat    time.Time     `json:"beat"`
}

// Session is a writer's session on a prefix: its lease, its log, and
// whether it is fenced. Close ends it.
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
	validUntil time.Time // monotonic: publish only before it
	fenced     error     // non-nil for good once the session's log is fenced
	seq        uint64    // the log entry this session appended last
	acked      []string  // the trash lists its last entry acknowledged
	reported   bool      // fenced, and a round has said so once
}

func leaseHandle(session string) backend.Handle {
	return backend.Handle{Kind: backend.Lock, Name: "session." + session}
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
		Session: nonce, Store: storeID, Dir: opts.StoreDir,
		Host: host, PID: os.Getpid(), Lease: opts.Lease, Since: now, Beat: now,
	}}
	s.cond, _ = r.be.(conditional)
	return s
}

// ID is the session's nonce.
func (s *Session) ID() string { return s.rec.Session }

// takeLease puts the session's own lease (a new name: create-only).
func (s *Session) takeLease(ctx context.Context) error {
	body, err := json.Marshal(s.rec)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := s.be.Put(ctx, leaseHandle(s.rec.Session), body, backend.PutOptions{IfAbsent: true}); err != nil {
		return fmt.Errorf("put the writer lease of %s: %w", s.be.Location(), err)
	}
	tag := string(body)
	if s.cond != nil {
		if _, tag, err = s.cond.GetTag(ctx, leaseHandle(s.rec.Session), nil); err != nil {
			return fmt.Errorf("read back the writer lease of %s: %w", s.be.Location(), err)
		}
	}
	s.renewed(start, tag)
	return nil
}

// renewed records a lease write that started at start and left tag.
func (s *Session) renewed(start time.Time, tag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tag = tag
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
		return fmt.Errorf("%w: its lease lapsed: no heartbeat reached %s for %v (paused, or the bucket was unreachable); it rejoins as a new session",
			ErrFenced, s.be.Location(), s.opts.Lease-s.opts.Lease/4)
	}
	return nil
}

// usable returns nil when the session may publish now. A lapsed lease
// fences the session's own log first: whoever saw it silent may have
// fenced it or collected what it uploaded since.
func (s *Session) usable(ctx context.Context) error {
	err := s.Err()
	if err == nil {
		return nil
	}
	s.mu.Lock()
	already, seq := s.fenced != nil, s.seq
	s.mu.Unlock()
	if !already {
		if ferr := s.r.fenceSession(ctx, s.rec.Session, seq, s, "its lease lapsed"); ferr != nil {
			return errors.Join(err, ferr)
		}
		s.fence(err)
	}
	return s.Err()
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

// renew rewrites the lease if it is still ours (If-Match); finding it gone
// (another session fenced this one) fences the session.
func (s *Session) renew(ctx context.Context) error {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	s.mu.Lock()
	fenced, tag := s.fenced, s.tag
	s.mu.Unlock()
	if fenced != nil {
		return fenced
	}
	if s.Err() != nil {
		// Lapsed (a pause, a bucket out of reach): another writer may have
		// taken the session for dead, so it never renews, it ends.
		return s.usable(ctx)
	}
	rec := s.rec
	rec.Beat = time.Now().UTC()
	body, _ := json.Marshal(rec) // strings, ints and times: cannot fail
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.opts.Lease/4)
	defer cancel()
	var newTag string
	var err error
	if s.cond != nil {
		newTag, err = s.cond.PutIfMatch(rctx, leaseHandle(s.rec.Session), body, tag)
		if isModified(err) {
			// Only this session writes its lease (a fencer deletes it): a
			// changed tag is a renewal whose answer was lost. Take its tag.
			if _, cur, gerr := s.cond.GetTag(rctx, leaseHandle(s.rec.Session), nil); gerr == nil {
				newTag, err = s.cond.PutIfMatch(rctx, leaseHandle(s.rec.Session), body, cur)
			} else if errors.Is(gerr, backend.ErrNotExist) {
				err = gerr
			}
		}
	} else {
		newTag = string(body)
		var cur []byte
		if cur, err = s.be.Get(rctx, leaseHandle(s.rec.Session), nil); err == nil {
			if string(cur) != tag {
				err = s3.ErrModified
			} else {
				err = s.be.Put(rctx, leaseHandle(s.rec.Session), body, backend.PutOptions{})
			}
		}
	}
	switch {
	case err == nil:
		s.renewed(start, newTag)
		return nil
	case errors.Is(err, backend.ErrNotExist) || errors.Is(err, s3.ErrModified):
		err := fmt.Errorf("%w: another writer fenced session %s of %s (it was silent for a whole lease); it rejoins as a new session", ErrFenced, s.rec.Session, s.be.Location())
		s.fence(err)
		return err
	}
	return fmt.Errorf("renew the writer lease of %s: %w", s.be.Location(), err)
}

// appendEntry puts e after the session's last entry, create-only, before
// the session's lease runs out. A fence found there fences the session.
func (s *Session) appendEntry(ctx context.Context, e logEntry) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	e.Seq = s.seq + 1
	deadline := s.validUntil
	s.mu.Unlock()
	e.Session, e.Host, e.PID, e.Time = s.rec.Session, s.rec.Host, s.rec.PID, time.Now().UTC()
	for {
		found, err := s.r.putEntry(ctx, e, deadline)
		if err != nil {
			return err
		}
		if found == nil {
			break
		}
		if found.Kind == kindFence {
			err := fmt.Errorf("%w: session %s (%s pid %d) fenced it at log entry %d of %s (%s); it rejoins as a new session",
				ErrFenced, found.By, found.Host, found.PID, found.Seq, s.be.Location(), found.Reason)
			s.fence(err)
			return err
		}
		e.Seq++ // an earlier round's entry, published after all
	}
	s.mu.Lock()
	s.seq, s.acked = e.Seq, e.TrashSeen
	s.mu.Unlock()
	return nil
}

// needsAck reports whether the trash lists ids (a world read's) include
// one the session's last entry did not acknowledge.
func (s *Session) needsAck(ids []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if !contains(s.acked, id) {
			return true
		}
	}
	return false
}

// confirm checks that the session's log has no fence after its last entry.
func (s *Session) confirm(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	next := s.seq + 1
	s.mu.Unlock()
	found, err := s.r.readEntry(ctx, s.rec.Session, next)
	if errors.Is(err, backend.ErrNotExist) {
		return s.Err()
	}
	if err != nil {
		return err
	}
	err = fmt.Errorf("%w: session %s (%s pid %d) fenced it at log entry %d of %s (%s); it rejoins as a new session",
		ErrFenced, found.By, found.Host, found.PID, next, s.be.Location(), found.Reason)
	s.fence(err)
	return err
}

// Close stops the heartbeat, ends the session's log with a close entry
// and deletes its lease.
func (s *Session) Close(ctx context.Context) error {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	s.r.setSession(nil, s)
	s.mu.Lock()
	fenced, seq := s.fenced != nil, s.seq
	s.mu.Unlock()
	if fenced {
		return nil
	}
	e := logEntry{Kind: kindClose, Session: s.rec.Session, Seq: seq + 1, Host: s.rec.Host, PID: s.rec.PID, Time: time.Now().UTC()}
	if found, err := s.r.putEntry(ctx, e, time.Time{}); err != nil {
		return fmt.Errorf("close writer session %s on %s: %w", s.rec.Session, s.be.Location(), err)
	} else if found != nil && !found.terminal() {
		return fmt.Errorf("close writer session %s on %s: entry %d is taken", s.rec.Session, s.be.Location(), seq+1)
	}
	err := s.be.Delete(ctx, leaseHandle(s.rec.Session))
	if err != nil && !errors.Is(err, backend.ErrNotExist) {
		return fmt.Errorf("release the writer lease of %s: %w", s.be.Location(), err)
	}
	return nil
}
