package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// logEntry is one create-only object locks/log.<seq>: a session joined,
// or a session committed a snapshot. Snapshot names the namespace as of
// this entry (a join repeats the previous entry's).
type logEntry struct {
	Seq      uint64    `json:"seq"`
	Kind     string    `json:"kind"` // "join" or "commit"
	Session  string    `json:"session"`
	Host     string    `json:"host"`
	PID      int       `json:"pid"`
	Snapshot string    `json:"snapshot,omitempty"`
	Gen      uint64    `json:"gen,omitempty"`
	Time     time.Time `json:"time"`
}

func logHandle(seq uint64) backend.Handle {
	return backend.Handle{Kind: backend.Lock, Name: fmt.Sprintf("log.%020d", seq)}
}

// readTail returns the last entry of be's log (nil when there is none): it
// reads the entry the head's hint names (the hint only ever names an entry
// that exists), and reads forward until an entry is absent. A head of the first format
// (no seq) stands for an entry 0 naming its snapshot.
func readTail(ctx context.Context, be backend.Backend) (*logEntry, error) {
	hb, err := be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: headName}, nil)
	var tail *logEntry
	switch {
	case errors.Is(err, backend.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read the head of %s: %w", be.Location(), err)
	default:
		var hd head
		if err := json.Unmarshal(hb, &hd); err != nil {
			return nil, fmt.Errorf("the head of %s is damaged: %w", be.Location(), err)
		}
		tail = &logEntry{Seq: hd.Seq, Kind: "commit", Snapshot: hd.Snapshot, Gen: hd.Gen, Time: hd.Time}
		if hd.Seq > 0 { // the entry itself is what counts, not the hint's copy
			if tail, err = readEntry(ctx, be, hd.Seq); err != nil {
				return nil, fmt.Errorf("the head of %s names log entry %d: %w", be.Location(), hd.Seq, err)
			}
		}
	}
	seq := uint64(0)
	if tail != nil {
		seq = tail.Seq
	}
	for {
		e, err := readEntry(ctx, be, seq+1)
		if errors.Is(err, backend.ErrNotExist) {
			return tail, nil
		}
		if err != nil {
			return nil, err
		}
		tail, seq = e, seq+1
	}
}

func readEntry(ctx context.Context, be backend.Backend, seq uint64) (*logEntry, error) {
	b, err := be.Get(ctx, logHandle(seq), nil)
	if err != nil {
		if errors.Is(err, backend.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("read log entry %d of %s: %w", seq, be.Location(), err)
	}
	e := &logEntry{}
	if err := json.Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("log entry %d of %s is damaged: %w", seq, be.Location(), err)
	}
	e.Seq = seq
	return e, nil
}

// appendEntry puts e as the entry after the session's last one, create-only.
// Finding it taken by another session fences this one for good: someone
// else has the log, and whatever this session would publish would hide it.
func (s *Session) appendEntry(ctx context.Context, e logEntry) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	e.Seq = s.seq + 1
	s.mu.Unlock()
	other, err := s.tryAppend(ctx, e)
	if other != nil {
		err := fmt.Errorf("%w: session %s (%s pid %d) wrote log entry %d of %s at %s; remount to rejoin as a new session",
			ErrFenced, other.Session, other.Host, other.PID, other.Seq, s.be.Location(), other.Time.Format(time.RFC3339))
		s.fence(err)
		return err
	}
	return err
}

// tryAppend puts e at e.Seq, create-only, before the session's deadline;
// it returns the entry found there when another session wrote it. An entry
// of this session's found there (an earlier try whose answer was lost)
// counts as appended if it says what e says, and is stepped over if not.
func (s *Session) tryAppend(ctx context.Context, e logEntry) (*logEntry, error) {
	e.Session, e.Host, e.PID, e.Time = s.rec.Session, s.rec.Host, s.rec.PID, time.Now().UTC()
	for {
		body, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithDeadline(ctx, s.deadline())
		err = s.be.Put(actx, logHandle(e.Seq), body, backend.PutOptions{IfAbsent: true})
		cancel()
		if errors.Is(err, backend.ErrExists) {
			other, rerr := readEntry(ctx, s.be, e.Seq)
			if rerr != nil {
				return nil, fmt.Errorf("log entry %d of %s exists: %w", e.Seq, s.be.Location(), rerr)
			}
			if other.Session != s.rec.Session {
				return other, nil
			}
			if other.Kind != e.Kind || other.Snapshot != e.Snapshot {
				e.Seq++ // an earlier round's entry, published after all
				continue
			}
			err = nil // this very entry: an answer lost on the way
		}
		if err != nil {
			return nil, fmt.Errorf("append to the log of %s: %w", s.be.Location(), err)
		}
		break
	}
	s.mu.Lock()
	s.seq = e.Seq
	s.mu.Unlock()
	// The head is a hint for readers: only ever an entry that exists.
	hb, _ := json.Marshal(head{Seq: e.Seq, Gen: e.Gen, Snapshot: e.Snapshot, Time: e.Time})
	if err := s.be.Put(ctx, backend.Handle{Kind: backend.Lock, Name: headName}, hb, backend.PutOptions{}); err != nil {
		s.opts.Logf("write the head hint of %s: %v", s.be.Location(), err)
	}
	return nil, nil
}

// confirm checks that nobody appended after this session's last entry.
func (s *Session) confirm(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	next := s.seq + 1
	s.mu.Unlock()
	other, err := readEntry(ctx, s.be, next)
	if errors.Is(err, backend.ErrNotExist) {
		return s.Err()
	}
	if err != nil {
		return err
	}
	err = fmt.Errorf("%w: session %s (%s pid %d) wrote log entry %d of %s; remount to rejoin as a new session",
		ErrFenced, other.Session, other.Host, other.PID, next, s.be.Location())
	s.fence(err)
	return err
}

// Join starts a writer session on r's prefix for the store whose ID is
// storeID: it takes the lease, appends a join entry after the log's tail
// (so a session before it can publish nothing more), merges the newest
// published namespace into the store's (Apply), and keeps only the
// store's records of uploaded chunks that the bucket really holds, so the
// next round re-uploads what the bucket lacks. The session is r's until
// Close.
func Join(ctx context.Context, r *Tier, storeID string, opts SessionOptions) (*Session, error) {
	if r.store.ReadOnly() {
		return nil, errors.New("store is open read-only")
	}
	s := newSession(r, storeID, opts)
	if err := s.takeLease(ctx); err != nil {
		return nil, err
	}
	s.startHeartbeat(ctx)
	if err := s.join(ctx); err != nil {
		return nil, errors.Join(err, s.Close(context.WithoutCancel(ctx)))
	}
	r.setSession(s)
	return s, nil
}

func (s *Session) join(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		tail, err := readTail(ctx, s.be)
		if err != nil {
			return err
		}
		var snap string
		var seq uint64
		if tail != nil {
			seq, snap = tail.Seq, tail.Snapshot
		}
		other, err := s.tryAppend(ctx, logEntry{Seq: seq + 1, Kind: "join", Snapshot: snap})
		if err != nil {
			return err
		}
		if other != nil {
			if attempt < 3 { // a session before ours appended meanwhile
				continue
			}
			return fmt.Errorf("%s: %w (session %s keeps appending to its log)", s.be.Location(), ErrLocked, other.Session)
		}
		if _, err := s.r.apply(ctx, snap, true, s.opts.Logf); err != nil {
			return fmt.Errorf("merge the files published in %s: %w", s.be.Location(), err)
		}
		return s.r.reverify(ctx)
	}
}

// reverify keeps the catalog's uploaded-chunk rows only for chunks the
// bucket holds, and adds rows for those it holds that the catalog's files
// name (a former reader's store, another writer's uploads).
func (r *Tier) reverify(ctx context.Context) error {
	in := map[cas.ID]struct{}{}
	err := r.be.List(ctx, backend.Chunk, func(info backend.Info) error {
		if id, err := cas.ParseID(info.Handle.Name); err == nil && info.Handle.Kind == backend.Chunk {
			in[id] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list the chunks of %s: %w", r.be.Location(), err)
	}
	return r.store.Update(func(tx *cas.Tx) error {
		var add, forget []cas.ID
		up := tx.Uploads()
		err := tx.ForEachManifest(func(_ uint64, m *cas.Manifest) error {
			for _, c := range m.Chunks {
				_, there := in[c.ID]
				switch has := up.Has(c.ID); {
				case there && !has:
					add = append(add, c.ID)
				case !there && has:
					forget = append(forget, c.ID)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := up.Forget(forget); err != nil {
			return err
		}
		return up.Add(add)
	})
}
