package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// ErrNotAcked means a collection beside live writers cannot purge a trash
// list yet: a live session has not acknowledged it (doc.go, step 8). It
// deleted nothing; gc succeeds once the session's next round has
// acknowledged, or once it is fenced.
var ErrNotAcked = errors.New("trash not acknowledged yet")

// ErrTrashed means a round held some of this store's files back: they name
// chunks a collection put in the trash, so they publish only once the trash
// list is purged (the chunks are then uploaded again). Everything else the
// round had to do is done.
var ErrTrashed = errors.New("files wait for the collection's trash")

// trashPrefix names a trash list in locks/: trash.<id>.
const trashPrefix = "trash."

func trashHandle(id string) backend.Handle {
	return backend.Handle{Kind: backend.Lock, Name: trashPrefix + id}
}

// trashList is locks/trash.<id>, create-only: the chunk objects a
// collection found unnamed and older than its grace cutoff (phase 1 of doc.go
// step 8). It is deleted once purged (phase 2), never changed.
type trashList struct {
	ID      string    `json:"id"`
	Session string    `json:"session"` // the collector's
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Time    time.Time `json:"time"`
	Chunks  []string  `json:"chunks"`

	ids []cas.ID  // Chunks, parsed
	mod time.Time // when the bucket took it (its clock, as the objects' ModTimes)
}

// readTrash reads trash list id, listed at mod (cached: lists never change);
// nil and no error when it is gone (purged meanwhile).
func (r *Tier) readTrash(ctx context.Context, id string, mod time.Time) (*trashList, error) {
	r.cacheMu.Lock()
	t, ok := r.trashes[id]
	r.cacheMu.Unlock()
	if ok {
		return t, nil
	}
	b, err := r.be.Get(ctx, trashHandle(id), nil)
	if errors.Is(err, backend.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read trash list %s of %s: %w", id, r.be.Location(), err)
	}
	t = &trashList{}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("trash list %s of %s is damaged: %w", id, r.be.Location(), err)
	}
	for _, c := range t.Chunks {
		cid, err := cas.ParseID(c)
		if err != nil {
			return nil, fmt.Errorf("trash list %s of %s is damaged: %w", id, r.be.Location(), err)
		}
		t.ids = append(t.ids, cid)
	}
	t.ID, t.mod = id, mod
	r.cacheMu.Lock()
	r.trashes[id] = t
	r.cacheMu.Unlock()
	return t, nil
}

// readTrashLists reads the trash lists a listing showed (id → ModTime) into
// w, and keeps only those in the cache.
func (r *Tier) readTrashLists(ctx context.Context, w *world, listed map[string]time.Time) error {
	for id, mod := range listed {
		t, err := r.readTrash(ctx, id, mod)
		if err != nil {
			return err
		}
		if t == nil {
			continue // purged since the listing: its chunks are gone, and every live session had seen it
		}
		w.trash[id] = t
		for _, c := range t.ids {
			w.trashed[c] = id
		}
	}
	r.cacheMu.Lock()
	for id := range r.trashes {
		if _, ok := listed[id]; !ok {
			delete(r.trashes, id)
		}
	}
	r.cacheMu.Unlock()
	return nil
}

// trashIDs returns the IDs of w's trash lists, sorted.
func (w *world) trashIDs() []string {
	ids := make([]string, 0, len(w.trash))
	for id := range w.trash {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// acked reports whether a session's last entry acknowledges trash list id.
func (si *sessionInfo) acked(id string) bool {
	return si.last != nil && contains(si.last.TrashSeen, id)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// forgetTrashed removes the store's records of uploaded chunks for every
// chunk w's trash lists name: from the round that read them on, the store
// takes them for absent from the bucket, so a file that needs one uploads
// it again (after the purge).
func (r *Tier) forgetTrashed(w *world) error {
	if len(w.trashed) == 0 {
		return nil
	}
	var forget []cas.ID
	err := r.store.View(func(tx *cas.Tx) error {
		up := tx.Uploads()
		for id := range w.trashed {
			if up.Has(id) {
				forget = append(forget, id)
			}
		}
		return nil
	})
	if err != nil || len(forget) == 0 {
		return err
	}
	return r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().Forget(forget) })
}

// holdTrashed removes from own every file that names a chunk of w's trash
// lists and returns their paths with the lists they wait for: such a file
// is not published while the list stands (its path keeps its published
// version in the round's state), so a session that read a list never names
// one of its candidates anew (doc.go, step 8).
func holdTrashed(own state, w *world) map[string]string {
	if len(w.trashed) == 0 {
		return nil
	}
	held := map[string]string{}
	for p, e := range own {
		if e.m == nil {
			continue
		}
		for _, c := range e.m.Chunks {
			if list, ok := w.trashed[c.ID]; ok {
				held[p] = list
				delete(own, p)
				break
			}
		}
	}
	return held
}

// heldErr is the error of a round that held paths back (ErrTrashed).
func (r *Tier) heldErr(held map[string]string, w *world) error {
	var paths, lists []string
	seen := map[string]bool{}
	for p, id := range held {
		paths = append(paths, p)
		if !seen[id] {
			seen[id] = true
			t := w.trash[id]
			lists = append(lists, fmt.Sprintf("%s (by session %s, %s)", id, t.Session, t.Time.Format(time.RFC3339)))
		}
	}
	sort.Strings(paths)
	sort.Strings(lists)
	n := len(paths)
	if n > 5 {
		paths = append(paths[:5], fmt.Sprintf("and %d more", n-5))
	}
	return fmt.Errorf("%s: %w: %d path(s) (%s) name chunks of trash list %s; they publish, the chunks uploaded again, once a ckptfs gc purges it (after its grace period)",
		r.be.Location(), ErrTrashed, n, strings.Join(paths, ", "), strings.Join(lists, ", "))
}

// liveOthers returns the sessions of w other than sess that may still
// publish, sorted.
func liveOthers(w *world, sess *Session) []*sessionInfo {
	var out []*sessionInfo
	for id, si := range w.sessions {
		if id != sess.ID() && si.live() {
			out = append(out, si)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// notAcked returns an ErrNotAcked error naming, per trash list of due, the
// live sessions whose last entry does not acknowledge it; nil when every
// one does.
func (r *Tier) notAcked(due []*trashList, others []*sessionInfo) error {
	var waits []string
	for _, t := range due {
		var who []string
		for _, si := range others {
			if si.acked(t.ID) {
				continue
			}
			s := "session " + si.id
			if si.last != nil {
				s += fmt.Sprintf(" (%s pid %d, last entry %s)", si.last.Host, si.last.PID, si.last.Time.Format(time.RFC3339))
			} else {
				s += " (no entry yet)"
			}
			who = append(who, s)
		}
		if len(who) > 0 {
			waits = append(waits, fmt.Sprintf("trash list %s by %s", t.ID, strings.Join(who, ", ")))
		}
	}
	if len(waits) == 0 {
		return nil
	}
	return fmt.Errorf("collect the remote %s: %w: %s; deleted nothing (a live writer acknowledges in its next round; a session silent for a whole lease is fenced and no longer counts): run gc again",
		r.be.Location(), ErrNotAcked, strings.Join(waits, "; "))
}

// collectBeside is a collection while other sessions may publish (doc.go,
// step 8): phase 2 purges the trash lists older than the grace period once
// every live session acknowledged them, deleting their candidates that no
// version of the checkpoint or of another live session's newest state
// names, nor a winning version (a fenced or closed session's losing
// versions are never read again, and this session's are in mine, or
// lost); phase 1 puts the chunk objects
// that no winning version names and older than before into a new trash
// list. Both keep what mine, the catalog and live name.
func (r *Tier) collectBeside(ctx context.Context, sess *Session, w *world, others []*sessionInfo, live []*cas.Manifest, before, deadline time.Time, dryRun bool) (CollectResult, error) {
	var res CollectResult
	var snaps []string
	if w.ckpt != nil {
		snaps = append(snaps, w.ckpt.Snapshot)
	}
	for _, si := range others {
		if name := w.newest[si.id]; name != "" {
			snaps = append(snaps, name)
		}
	}
	marked, err := r.mark(ctx, w, snaps, live) // the purge's
	if err != nil {
		return res, err
	}
	winners, err := r.mark(ctx, w, nil, live) // the trash's
	if err != nil {
		return res, err
	}
	var due []*trashList
	for _, id := range w.trashIDs() {
		if t := w.trash[id]; t.mod.Before(before) {
			due = append(due, t)
		} else {
			res.Pending++
		}
	}
	if err := r.notAcked(due, others); err != nil {
		return res, err
	}
	objects, err := r.listChunks(ctx)
	if err != nil {
		return res, err
	}
	// What a purge deletes: the candidates of the due lists that nothing
	// names now and that were not put again since the list (never, as
	// chunks are put-if-absent, unless deleted first).
	inDue := map[cas.ID]time.Time{}
	for _, t := range due {
		for _, c := range t.ids {
			inDue[c] = t.mod
		}
	}
	doomed := map[cas.ID]int64{}
	var staying []cas.ID
	for _, in := range objects {
		id, _ := cas.ParseID(in.Handle.Name)
		_, named := marked[id]
		if mod, ok := inDue[id]; ok && !named && !in.ModTime.After(mod) {
			doomed[id] = in.Size
			continue
		}
		staying = append(staying, id)
	}
	// Every object that stays keeps its base, and a base any of them names
	// is no candidate now.
	bases, err := r.bucketBases(ctx, staying)
	if err != nil {
		return res, fmt.Errorf("read the bases of the remote's deltas: %w", err) // never sweep on a partial mark
	}
	for _, b := range bases {
		marked[b] = struct{}{}
		winners[b] = struct{}{}
		delete(doomed, b)
	}
	var fresh []string
	for _, in := range objects {
		id, _ := cas.ParseID(in.Handle.Name)
		res.Objects++
		if _, ok := doomed[id]; ok {
			res.Freed++
			res.FreedBytes += in.Size
			continue
		}
		if _, ok := winners[id]; ok {
			continue
		}
		if _, ok := w.trashed[id]; ok {
			continue // in a list not due yet, or one due whose purge keeps it
		}
		if !in.ModTime.Before(before) {
			res.Young++
			continue
		}
		fresh = append(fresh, id.String())
		res.Trashed++
		res.TrashedBytes += in.Size
	}
	res.Purged = len(due)
	if dryRun {
		return res, nil
	}
	return r.purgeAndTrash(ctx, sess, res, due, doomed, fresh, deadline)
}

// purgeAndTrash carries out collectBeside's plan (res counts it): it
// deletes the doomed chunks, then the due lists, then puts the fresh
// candidates into a new list.
func (r *Tier) purgeAndTrash(ctx context.Context, sess *Session, res CollectResult, due []*trashList, doomed map[cas.ID]int64, fresh []string, deadline time.Time) (CollectResult, error) {
	ids := make([]cas.ID, 0, len(doomed))
	for id := range doomed {
		ids = append(ids, id)
	}
	trashed, trashedBytes := res.Trashed, res.TrashedBytes
	res.Freed, res.FreedBytes, res.Purged, res.Trashed, res.TrashedBytes = 0, 0, 0, 0, 0
	if err := r.deleteChunks(ctx, sess, ids, doomed, deadline, &res); err != nil {
		return res, err
	}
	for _, t := range due {
		if err := r.be.Delete(ctx, trashHandle(t.ID)); err != nil && !errors.Is(err, backend.ErrNotExist) {
			return res, fmt.Errorf("delete purged trash list %s of %s: %w", t.ID, r.be.Location(), err)
		}
		res.Purged++
	}
	if len(fresh) == 0 {
		return res, nil
	}
	var err error
	if res.TrashList, err = r.putTrash(ctx, sess, fresh, deadline); err != nil {
		return res, err
	}
	res.Trashed, res.TrashedBytes = trashed, trashedBytes
	return res, nil
}

// putTrash puts a new trash list of chunks (create-only), before deadline.
func (r *Tier) putTrash(ctx context.Context, sess *Session, chunks []string, deadline time.Time) (string, error) {
	now := time.Now().UTC()
	sort.Strings(chunks)
	id := fmt.Sprintf("%d-%s", now.UnixNano(), cas.Sum(fmt.Appendf(nil, "%s %d %d", sess.ID(), os.Getpid(), now.UnixNano())).String()[:8])
	body, err := json.Marshal(trashList{ID: id, Session: sess.ID(), Host: sess.rec.Host, PID: sess.rec.PID, Time: now, Chunks: chunks})
	if err != nil {
		return "", err
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := r.be.Put(pctx, trashHandle(id), body, backend.PutOptions{IfAbsent: true}); err != nil {
		return "", fmt.Errorf("put trash list %s into %s: %w", id, r.be.Location(), err)
	}
	return id, nil
}

// deleteTrashLists deletes every trash list of w: a collection with no other
// live session deleted or kept their candidates itself.
func (r *Tier) deleteTrashLists(ctx context.Context, w *world) (int, error) {
	n := 0
	for _, id := range w.trashIDs() {
		if err := r.be.Delete(ctx, trashHandle(id)); err != nil && !errors.Is(err, backend.ErrNotExist) {
			return n, fmt.Errorf("delete trash list %s of %s: %w", id, r.be.Location(), err)
		}
		n++
	}
	return n, nil
}
