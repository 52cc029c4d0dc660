package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Kinds of log entries.
const (
	kindState = "state" // the session's namespace state is Snapshot
	kindFence = "fence" // the session can publish nothing more (written by By)
	kindClose = "close" // the session ended (written by itself)
)

// logEntry is one create-only object locks/log.<session>.<seq> of a
// session's log.
type logEntry struct {
	Seq      uint64    `json:"seq"`
	Kind     string    `json:"kind"`
	Session  string    `json:"session"`      // whose log
	By       string    `json:"by,omitempty"` // a fence: the session that wrote it
	Reason   string    `json:"reason,omitempty"`
	Host     string    `json:"host"`
	PID      int       `json:"pid"`
	Snapshot string    `json:"snapshot,omitempty"`
	Gen      uint64    `json:"gen,omitempty"`
	Time     time.Time `json:"time"`
	// TrashSeen lists the trash lists (locks/trash.<id>) the round that
	// wrote a state entry had read: from it on, the session names no
	// candidate of theirs anew (doc.go, step 8).
	TrashSeen []string `json:"trash_seen,omitempty"`
}

func (e *logEntry) terminal() bool { return e.Kind == kindFence || e.Kind == kindClose }

func logName(session string, seq uint64) string {
	return fmt.Sprintf("log.%s.%020d", session, seq)
}

func logHandle(session string, seq uint64) backend.Handle {
	return backend.Handle{Kind: backend.Lock, Name: logName(session, seq)}
}

// parseLogName splits a session log entry's name; ok is false for any
// other name (the first format's log.<seq> included).
func parseLogName(name string) (session string, seq uint64, ok bool) {
	parts := strings.Split(name, ".")
	if len(parts) != 3 || parts[0] != "log" || parts[1] == "" {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(parts[2], 10, 64)
	return parts[1], seq, err == nil
}

// readEntry reads entry seq of session's log (cached: entries never change).
func (r *Tier) readEntry(ctx context.Context, session string, seq uint64) (*logEntry, error) {
	name := logName(session, seq)
	r.cacheMu.Lock()
	e, ok := r.entries[name]
	r.cacheMu.Unlock()
	if ok {
		return e, nil
	}
	b, err := r.be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: name}, nil)
	if err != nil {
		if errors.Is(err, backend.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("read log entry %s of %s: %w", name, r.be.Location(), err)
	}
	e = &logEntry{}
	if err := json.Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("log entry %s of %s is damaged: %w", name, r.be.Location(), err)
	}
	e.Seq, e.Session = seq, session
	r.cacheMu.Lock()
	r.entries[name] = e
	r.cacheMu.Unlock()
	return e, nil
}

// putEntry puts e at e.Seq of e.Session's log, create-only, before
// deadline (zero: none). It returns the entry found there when the put
// finds one that is not e (an answer lost on the way counts as e put).
func (r *Tier) putEntry(ctx context.Context, e logEntry, deadline time.Time) (*logEntry, error) {
	body, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if !deadline.IsZero() {
		pctx, cancel = context.WithDeadline(ctx, deadline)
	}
	err = r.be.Put(pctx, logHandle(e.Session, e.Seq), body, backend.PutOptions{IfAbsent: true})
	cancel()
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, backend.ErrExists) {
		return nil, fmt.Errorf("append to log %s of %s: %w", e.Session, r.be.Location(), err)
	}
	found, rerr := r.readEntry(ctx, e.Session, e.Seq)
	if rerr != nil {
		return nil, fmt.Errorf("log entry %d of session %s exists: %w", e.Seq, e.Session, rerr)
	}
	if found.Kind == e.Kind && found.By == e.By && found.Snapshot == e.Snapshot && found.Time.Equal(e.Time) {
		return nil, nil // this very entry: the answer was lost
	}
	return found, nil
}

// fenceSession makes session publish nothing more: a fence entry after its
// last entry (last), create-only; an entry appended there meanwhile moves
// the fence one further. It returns nil once the session's log ends with a
// fence or a close, and deletes the session's lease.
func (r *Tier) fenceSession(ctx context.Context, session string, last uint64, by *Session, reason string) error {
	e := logEntry{Kind: kindFence, Session: session, Reason: reason, Time: time.Now().UTC()}
	if by != nil {
		e.By, e.Host, e.PID = by.rec.Session, by.rec.Host, by.rec.PID
	}
	for seq := last + 1; seq < last+64; seq++ {
		e.Seq = seq
		found, err := r.putEntry(ctx, e, time.Time{})
		if err != nil {
			return err
		}
		if found == nil || found.terminal() {
			err := r.be.Delete(ctx, leaseHandle(session))
			if err != nil && !errors.Is(err, backend.ErrNotExist) {
				return fmt.Errorf("delete the lease of fenced session %s: %w", session, err)
			}
			return nil
		}
	}
	return fmt.Errorf("fence session %s of %s: its log keeps growing", session, r.be.Location())
}

// legacyTail returns the snapshot named by the last entry of the first
// multi-writer-less format's log (locks/head, locks/log.<seq>), "" if none.
func legacyTail(ctx context.Context, be backend.Backend) (string, error) {
	var seq uint64
	snap := ""
	hb, err := be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: "head"}, nil)
	switch {
	case errors.Is(err, backend.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("read the head of %s: %w", be.Location(), err)
	default:
		var hd struct {
			Seq      uint64 `json:"seq"`
			Snapshot string `json:"snapshot"`
		}
		if err := json.Unmarshal(hb, &hd); err != nil {
			return "", fmt.Errorf("the head of %s is damaged: %w", be.Location(), err)
		}
		seq, snap = hd.Seq, hd.Snapshot
	}
	for {
		b, err := be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: fmt.Sprintf("log.%020d", seq+1)}, nil)
		if errors.Is(err, backend.ErrNotExist) {
			return snap, nil
		}
		if err != nil {
			return "", fmt.Errorf("read log entry %d of %s: %w", seq+1, be.Location(), err)
		}
		var e logEntry
		if err := json.Unmarshal(b, &e); err != nil {
			return "", fmt.Errorf("log entry %d of %s is damaged: %w", seq+1, be.Location(), err)
		}
		seq, snap = seq+1, e.Snapshot
	}
}
