package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// checkpointName is locks/checkpoint: the logs compacted into one state.
const checkpointName = "checkpoint"

// checkpoint is locks/checkpoint: a snapshot of the merged state of every
// session's log up to Folded[session] (replaced by If-Match only).
type checkpoint struct {
	Snapshot string            `json:"snapshot"`
	Folded   map[string]uint64 `json:"folded"`
	Time     time.Time         `json:"time"`
}

// sessionInfo is what a listing and the logs say of one session.
type sessionInfo struct {
	id       string
	seqs     []uint64  // its log entries in the bucket, ascending
	lease    bool      // locks/session.<id> is there
	leaseMod time.Time // and was last written then (the bucket's clock)
	last     *logEntry // its last entry (nil: none)
	// stateless: none of its entries is a state (it never published).
	stateless bool
}

// live reports whether the session may still publish: its log does not
// end with a fence or a close.
func (si *sessionInfo) live() bool { return si.last == nil || !si.last.terminal() }

func (si *sessionInfo) lastSeq() uint64 {
	if len(si.seqs) == 0 {
		return 0
	}
	return si.seqs[len(si.seqs)-1]
}

// world is the namespace every session published, merged.
type world struct {
	state     state
	sessions  map[string]*sessionInfo
	ckpt      *checkpoint // nil: none
	ckptTag   string
	folded    map[string]uint64     // per session, the entry whose state is in state
	snapshots []string              // the snapshots merged (gc marks them all)
	newest    map[string]string     // per session, the snapshot of its newest state entry merged
	published bool                  // anything at all was ever published
	logs      int                   // log entries listed
	trash     map[string]*trashList // the trash lists listed, by ID
	trashed   map[cas.ID]string     // every chunk of a trash list: the list's ID
}

// snapshotState reads snapshot name as a state (cached: snapshots never
// change; the cache keeps what the last world read used).
func (r *Tier) snapshotState(ctx context.Context, name string) (state, error) {
	r.cacheMu.Lock()
	st, ok := r.snaps[name]
	r.cacheMu.Unlock()
	if ok {
		return st, nil
	}
	snap, err := readSnapshotObject(ctx, r.be, name)
	if err != nil {
		return nil, err
	}
	st = stateOf(snap)
	r.cacheMu.Lock()
	r.snaps[name] = st
	r.cacheMu.Unlock()
	return st, nil
}

// readSnapshotObject reads and checks snapshot name.
func readSnapshotObject(ctx context.Context, be backend.Backend, name string) (*Snapshot, error) {
	body, err := be.Get(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, nil)
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", name, err)
	}
	if cas.Sum(body).String() != name {
		return nil, fmt.Errorf("snapshot %s in %s: %w: its hash differs from its name", name, be.Location(), cas.ErrCorrupt)
	}
	return parseSnapshot(name, body)
}

// readWorld lists the prefix's locks, reads the checkpoint and every
// session's newest state not folded into it, and merges them. Its cost is
// one listing of locks/, the checkpoint, and one snapshot per session that
// published since the checkpoint (O(files) when compacted).
func (r *Tier) readWorld(ctx context.Context) (*world, error) {
	for try := 0; ; try++ {
		w, err := r.readWorldOnce(ctx)
		if errors.Is(err, errCompacted) && try < 3 {
			continue // a checkpoint folded what was listed: read it
		}
		return w, err
	}
}

// errCompacted: an entry listed was deleted by a compaction meanwhile.
var errCompacted = errors.New("the logs were compacted while being read")

func (r *Tier) readWorldOnce(ctx context.Context) (*world, error) {
	w := &world{state: state{}, sessions: map[string]*sessionInfo{}, folded: map[string]uint64{},
		trash: map[string]*trashList{}, trashed: map[cas.ID]string{}, newest: map[string]string{}}
	trash := map[string]time.Time{}
	legacy, hasCkpt := false, false
	si := func(id string) *sessionInfo {
		if w.sessions[id] == nil {
			w.sessions[id] = &sessionInfo{id: id}
		}
		return w.sessions[id]
	}
	err := r.be.List(ctx, backend.Lock, func(in backend.Info) error {
		name := in.Handle.Name
		if id, seq, ok := parseLogName(name); ok {
			s := si(id)
			s.seqs = append(s.seqs, seq)
			w.logs++
			return nil
		}
		switch {
		case strings.HasPrefix(name, "session."):
			s := si(strings.TrimPrefix(name, "session."))
			s.lease, s.leaseMod = true, in.ModTime
		case name == checkpointName:
			hasCkpt = true
		case strings.HasPrefix(name, trashPrefix):
			trash[strings.TrimPrefix(name, trashPrefix)] = in.ModTime
		case name == "head" || strings.HasPrefix(name, "log."):
			legacy = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the logs of %s: %w", r.be.Location(), err)
	}
	if hasCkpt {
		if err := r.readCheckpoint(ctx, w); err != nil {
			return nil, err
		}
	} else if legacy {
		name, err := legacyTail(ctx, r.be)
		if err != nil {
			return nil, err
		}
		if err := r.mergeSnapshot(ctx, w, name); err != nil {
			return nil, err
		}
	}
	if err := r.readTrashLists(ctx, w, trash); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(w.sessions))
	for id, s := range w.sessions {
		sort.Slice(s.seqs, func(i, j int) bool { return s.seqs[i] < s.seqs[j] })
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := r.readSession(ctx, w, w.sessions[id]); err != nil {
			return nil, err
		}
	}
	r.prune(w)
	return w, nil
}

// prune keeps in the caches only the snapshots w used and the entries the
// listing showed.
func (r *Tier) prune(w *world) {
	used := map[string]bool{}
	for _, n := range w.snapshots {
		used[n] = true
	}
	r.cacheMu.Lock()
	defer r.cacheMu.Unlock()
	for n := range r.snaps {
		if !used[n] {
			delete(r.snaps, n)
		}
	}
	for n, e := range r.entries {
		si := w.sessions[e.Session]
		if si == nil || len(si.seqs) == 0 || e.Seq < si.seqs[0] {
			delete(r.entries, n)
		}
	}
}

func (r *Tier) readCheckpoint(ctx context.Context, w *world) error {
	var body []byte
	var err error
	h := backend.Handle{Kind: backend.Lock, Name: checkpointName}
	if c, ok := r.be.(conditional); ok {
		body, w.ckptTag, err = c.GetTag(ctx, h, nil)
	} else {
		body, err = r.be.Get(ctx, h, nil)
		w.ckptTag = string(body)
	}
	if errors.Is(err, backend.ErrNotExist) {
		return nil // replaced meanwhile: the logs it folded are still there
	}
	if err != nil {
		return fmt.Errorf("read the checkpoint of %s: %w", r.be.Location(), err)
	}
	ck := &checkpoint{}
	if err := json.Unmarshal(body, ck); err != nil {
		return fmt.Errorf("the checkpoint of %s is damaged: %w", r.be.Location(), err)
	}
	w.ckpt = ck
	for id, seq := range ck.Folded {
		w.folded[id] = seq
	}
	return r.mergeSnapshot(ctx, w, ck.Snapshot)
}

func (r *Tier) mergeSnapshot(ctx context.Context, w *world, name string) error {
	if name == "" {
		return nil
	}
	st, err := r.snapshotState(ctx, name)
	if err != nil {
		return err
	}
	w.state.merge(st)
	w.snapshots = append(w.snapshots, name)
	w.published = true
	return nil
}

// readSession reads a session's last entry, and merges its newest state
// unless the checkpoint has it.
func (r *Tier) readSession(ctx context.Context, w *world, s *sessionInfo) error {
	folded := w.folded[s.id]
	for i := len(s.seqs) - 1; i >= 0; i-- {
		seq := s.seqs[i]
		e, err := r.readEntry(ctx, s.id, seq)
		if errors.Is(err, backend.ErrNotExist) {
			return errCompacted
		}
		if err != nil {
			return err
		}
		if s.last == nil {
			s.last = e
		}
		if seq <= folded {
			return nil
		}
		if e.Kind == kindState {
			w.folded[s.id] = seq
			w.newest[s.id] = e.Snapshot
			return r.mergeSnapshot(ctx, w, e.Snapshot)
		}
	}
	s.stateless = true
	return nil
}

// compactEvery: a writer writes a checkpoint once a world read merged more
// session snapshots than this, or listed more log entries than compactLogs.
const (
	compactEvery = 4
	compactLogs  = 64
)

// compact writes w's state as the checkpoint (If-Match on the one read,
// create-only if none), then deletes the log entries it folded except each
// session's last (the fence of a session names the next seq). A lost race
// changes nothing: the other checkpoint folds at least as much.
func (r *Tier) compact(ctx context.Context, w *world) error {
	unfolded := len(w.snapshots)
	if w.ckpt != nil {
		unfolded--
	}
	if unfolded <= compactEvery && w.logs <= compactLogs {
		return nil
	}
	body, err := json.Marshal(w.state.snapshot("", 0))
	if err != nil {
		return err
	}
	name := cas.Sum(body).String()
	if err := r.be.Put(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, body, backend.PutOptions{IfAbsent: true}); err != nil && !errors.Is(err, backend.ErrExists) {
		return fmt.Errorf("put the checkpoint's snapshot: %w", err)
	}
	folded := map[string]uint64{}
	for id, seq := range w.folded {
		if w.sessions[id] != nil { // a session with nothing listed ended, its entries deleted
			folded[id] = seq
		}
	}
	ck, err := json.Marshal(checkpoint{Snapshot: name, Folded: folded, Time: time.Now().UTC()})
	if err != nil {
		return err
	}
	h := backend.Handle{Kind: backend.Lock, Name: checkpointName}
	c, ok := r.be.(conditional)
	switch {
	case w.ckpt == nil:
		err = r.be.Put(ctx, h, ck, backend.PutOptions{IfAbsent: true})
	case ok:
		_, err = c.PutIfMatch(ctx, h, ck, w.ckptTag)
	default:
		return nil // no compare-and-swap: no replacing
	}
	if err != nil {
		if errors.Is(err, backend.ErrExists) || isModified(err) || errors.Is(err, backend.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("put the checkpoint of %s: %w", r.be.Location(), err)
	}
	for id, si := range w.sessions {
		upto, ok := folded[id]
		if !ok && !si.stateless {
			continue
		}
		seqs := si.seqsBefore(upto)
		if si.last != nil && si.last.Kind == kindClose && !si.lease {
			// Closed by itself, its state folded: it appends nothing
			// more, so its whole log goes (a fenced session keeps its
			// fence: it may still try the seq after its last).
			seqs = si.seqs
		}
		for _, seq := range seqs {
			if err := r.be.Delete(ctx, logHandle(id, seq)); err != nil && !errors.Is(err, backend.ErrNotExist) {
				return fmt.Errorf("delete compacted log entry: %w", err)
			}
		}
	}
	return nil
}

// seqsBefore returns the session's entries before upto, but never its last.
func (si *sessionInfo) seqsBefore(upto uint64) []uint64 {
	if si == nil {
		return nil
	}
	var out []uint64
	for i, seq := range si.seqs {
		if seq < upto && i < len(si.seqs)-1 {
			out = append(out, seq)
		}
	}
	return out
}
