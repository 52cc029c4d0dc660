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

// UploadPending reports whether commits are waiting for an upload round.
func (r *Tier) UploadPending() (bool, error) {
	var pending bool
	err := r.store.View(func(tx *cas.Tx) error {
		gen, done := tx.Uploads().Gens()
		pending = gen > done
		return nil
	})
	return pending, err
}

// UploadRound is a writer's round (doc.go, step 4): it reads what every
// session published, publishes this store's changes since the last round
// (chunks first, then a snapshot, then an entry of the session's log), and
// applies the merged namespace to the store. nil means a fresh reader sees
// this store's namespace, except for paths a later change of another
// session won (ErrSuperseded, after the round did everything else), or
// for files held back because they name chunks in a collection's trash
// (ErrTrashed, likewise; doc.go step 8: they publish after its purge). A
// fenced session's round fails once with ErrFenced; the next one rejoins
// as a new session; a forced round (sync) reports a fence since the last
// forced round even when a background round rejoined meanwhile.
func (r *Tier) UploadRound(ctx context.Context, force bool) error {
	if r.store.ReadOnly() {
		return errors.New("store is open read-only")
	}
	r.upMu.Lock()
	sess, err := r.writer(ctx) // under upMu: one rejoin, not one per round waiting
	if err == nil {
		err = r.round(ctx, sess, force)
	}
	r.upMu.Unlock()
	if !force {
		return err
	}
	r.mu.Lock()
	note := r.fenceNote
	r.fenceNote = nil
	r.mu.Unlock()
	if err == nil && note != nil {
		err = fmt.Errorf("%w; rejoined as session %s, which published this mount's files", note, sess.ID())
	} else if note != nil {
		err = errors.Join(note, err)
	}
	return err
}

// writer returns the session, after rejoining as a new one if it was
// fenced and a round said so.
func (r *Tier) writer(ctx context.Context) (*Session, error) {
	sess, err := r.session()
	if err != nil {
		return nil, err
	}
	sess.mu.Lock()
	rejoin := sess.fenced != nil && sess.reported
	sess.mu.Unlock()
	if !rejoin {
		return sess, nil
	}
	r.mu.Lock()
	id, opts := r.storeID, r.opts
	r.mu.Unlock()
	ns, err := r.start(ctx, id, opts)
	if err != nil {
		return nil, fmt.Errorf("rejoin %s as a new writer session: %w", r.be.Location(), err)
	}
	r.setSession(ns, sess)
	_ = sess.Close(ctx) // fenced: stops its heartbeat only
	ns.opts.Logf("rejoined %s as writer session %s (session %s was fenced)", r.be.Location(), ns.ID(), sess.ID())
	return ns, nil
}

// Join starts a writer session on r's prefix for the store whose ID is
// storeID (doc.go, steps 1 to 3) and runs its first round, which applies
// what is published to the store before its namespace is served. The
// session is r's until Close.
func Join(ctx context.Context, r *Tier, storeID string, opts SessionOptions) (*Session, error) {
	if r.store.ReadOnly() {
		return nil, errors.New("store is open read-only")
	}
	r.mu.Lock()
	r.storeID, r.opts = storeID, opts
	r.mu.Unlock()
	s, err := r.start(ctx, storeID, opts)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.sess = s // a session left by a daemon that died is fenced once silent
	r.mu.Unlock()
	r.upMu.Lock()
	err = r.loadBase(ctx, s.opts.Logf)
	if err == nil {
		err = r.round(ctx, s, true)
	}
	r.upMu.Unlock()
	if err != nil && !errors.Is(err, ErrSuperseded) && !errors.Is(err, ErrTrashed) {
		return nil, errors.Join(fmt.Errorf("merge the files published in %s: %w", r.be.Location(), err), s.Close(context.WithoutCancel(ctx)))
	}
	return s, nil
}

// start makes a new session: its lease, its heartbeat, and the store's
// records of uploaded chunks checked against the bucket once no
// collection runs.
func (r *Tier) start(ctx context.Context, storeID string, opts SessionOptions) (*Session, error) {
	s := newSession(r, storeID, opts)
	if err := s.takeLease(ctx); err != nil {
		return nil, err
	}
	s.startHeartbeat(ctx)
	err := r.waitCollection(ctx, s.opts)
	if err == nil {
		err = r.reverify(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, s.Close(context.WithoutCancel(ctx)))
	}
	return s, nil
}

// loadBase sets mine from the snapshot the store last published (upMu
// held); a former reader's store adopts the bucket's namespace whole
// unless it has commits of its own not uploaded.
func (r *Tier) loadBase(ctx context.Context, logf func(string, ...any)) error {
	var name string
	var mirror, pending bool
	err := r.store.View(func(tx *cas.Tx) error {
		name, mirror = tx.Uploads().Base()
		gen, done := tx.Uploads().Gens()
		pending = gen > done
		return nil
	})
	if err != nil {
		return err
	}
	r.mine, r.adopt = state{}, mirror && !pending
	if name == "" || mirror {
		return nil
	}
	st, err := r.snapshotState(ctx, name)
	if err != nil {
		logf("the last snapshot this store published (%s) is unreadable, merging without it: %v", name, err)
		return nil
	}
	r.mine = st.clone()
	return nil
}

// round is UploadRound with upMu held.
func (r *Tier) round(ctx context.Context, sess *Session, force bool) error {
	if err := sess.usable(ctx); err != nil {
		return r.fencedErr(sess, err)
	}
	if r.lockUnsure {
		r.releaseLostLock(ctx, sess)
	}
	if err := r.notePending(); err != nil {
		return err
	}
	w, err := r.readWorld(ctx)
	if err != nil {
		return err
	}
	r.fenceSilent(ctx, w, sess)
	if err := r.forgetTrashed(w); err != nil {
		return err
	}
	var gen uint64
	local := map[string]nsEntry{}
	err = r.store.View(func(tx *cas.Tx) error {
		gen, _ = tx.Uploads().Gens()
		return walkNamespace(tx, func(p string, e nsEntry) error { local[p] = e; return nil })
	})
	if err != nil {
		return err
	}
	me := sess.ID()
	if err := r.foldPublished(ctx, w.state, me); err != nil {
		return err
	}
	own := r.ownChanges(local, w.state, me)
	held := holdTrashed(own, w)
	next := w.state.clone()
	next.merge(r.mine)
	next.merge(own)
	var lost []string
	for p, e := range own {
		if cur := next[p]; cur.Origin != me || cur.Stamp != e.Stamp {
			lost = append(lost, fmt.Sprintf("%s (by session %s)", p, cur.Origin))
		}
	}
	name := ""
	// A trash list not acknowledged yet is acknowledged by a state entry
	// even with no own change: it names the merged state (doc.go, step 8).
	if len(own) > 0 || sess.needsAck(w.trashIDs()) {
		if name, err = r.publishOwn(ctx, sess, own, next, gen, w); err != nil {
			return r.fencedErr(sess, err)
		}
	} else if err := sess.confirm(ctx); err != nil {
		return r.fencedErr(sess, err)
	}
	r.mine, r.adopt = next, false
	applied, err := r.applyState(ctx, local, next, held)
	if err != nil {
		return fmt.Errorf("apply the files published in %s: %w", r.be.Location(), err)
	}
	if name == "" && applied > 0 {
		// The store now agrees with next, which no entry names: keep it
		// as the base (a snapshot object, no entry), so that a remount
		// does not take what it applied for changes of its own.
		if name, err = r.putSnapshot(ctx, next, me, gen); err != nil {
			return err
		}
	}
	err = r.store.Update(func(tx *cas.Tx) error {
		if err := tx.Uploads().SetPending("", ""); err != nil { // mine holds the world now
			return err
		}
		if len(held) == 0 { // else the commits wait for a later round
			if err := tx.Uploads().SetUploaded(gen); err != nil {
				return err
			}
		}
		if name == "" {
			return nil
		}
		return tx.Uploads().SetBase(name, false)
	})
	if err != nil {
		return err
	}
	r.tier.SetPending(0) // published, or the same as what is published
	if err := r.compact(ctx, w); err != nil {
		sess.opts.Logf("compact the logs of %s: %v", r.be.Location(), err)
	}
	var errs []error
	if len(held) > 0 {
		errs = append(errs, r.heldErr(held, w))
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		if len(lost) > 5 {
			lost = append(lost[:5], fmt.Sprintf("and %d more", len(lost)-5))
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s", r.be.Location(), ErrSuperseded, strings.Join(lost, ", ")))
	}
	return errors.Join(errs...)
}

// notePending counts, as the tier's pending bytes, the chunks of the
// catalog's files not recorded as uploaded, when commits wait for upload:
// what the round has to put at most, known before the bucket answers.
func (r *Tier) notePending() error {
	return r.store.View(func(tx *cas.Tx) error {
		up := tx.Uploads()
		if gen, done := up.Gens(); gen <= done {
			return nil
		}
		seen := map[cas.ID]bool{}
		var pending int64
		err := tx.ForEachManifest(func(_ uint64, m *cas.Manifest) error {
			for _, c := range m.Chunks {
				if !seen[c.ID] && !up.Has(c.ID) {
					seen[c.ID] = true
					pending += int64(c.Len)
				}
			}
			return nil
		})
		r.tier.SetPending(pending)
		return err
	})
}

// fencedErr notes that a round reported the session fenced: the next
// round rejoins.
func (r *Tier) fencedErr(sess *Session, err error) error {
	if errors.Is(err, ErrFenced) {
		sess.mu.Lock()
		first := !sess.reported && sess.fenced != nil
		sess.reported = sess.fenced != nil
		sess.mu.Unlock()
		r.mu.Lock()
		if first && r.fenceNote == nil {
			r.fenceNote = err
		}
		r.mu.Unlock()
	}
	return err
}

// foldPublished takes into mine the versions world holds that this store
// published itself: the store had each of them, but mine lacks those of a
// round whose answer was lost (its entry was put, the round failed). Without
// them a later change to such a path would be stamped as a change of an
// older version (a rename's ctime is its file's) and lose to the store's
// own earlier one, and a removal would not be seen as a change at all: the
// next apply would bring the old version back. They are the world's
// versions of session me, and those of the store's pending snapshot (the
// last one a round put an entry for without confirming it, recorded
// before the put: catalog Uploads.Pending) that the world holds as they are
// there, whichever session published it, this one or one before it (a
// session fenced, a daemon killed, before its next round). Never every
// version of an earlier session of this store: a copy of the store shares
// that session's name but not what it published after the copy.
func (r *Tier) foldPublished(ctx context.Context, world state, me string) error {
	take := func(p string, e entry) {
		if m, ok := r.mine[p]; !ok || m.Stamp.Less(e.Stamp) {
			if r.mine == nil {
				r.mine = state{}
			}
			r.mine[p] = e
		}
	}
	for p, e := range world {
		if e.Origin == me {
			take(p, e)
		}
	}
	var name, session string
	if err := r.store.View(func(tx *cas.Tx) error {
		name, session = tx.Uploads().Pending()
		return nil
	}); err != nil || name == "" {
		return err
	}
	st, err := r.snapshotState(ctx, name)
	if errors.Is(err, backend.ErrNotExist) {
		return nil // never put: nothing of it was published
	}
	if err != nil {
		return fmt.Errorf("read the snapshot this store last published unconfirmed: %w", err)
	}
	for p, e := range st {
		if w, ok := world[p]; ok && e.Origin == session && w.Origin == session && w.Stamp == e.Stamp {
			take(p, w)
		}
	}
	return nil
}

// ownChanges returns the store's changes since mine, each stamped: a path
// whose local version differs from mine's, from the bucket's winner, and
// from what a round could not replace here. The stamp of a version is its
// commit time (the record's ctime), or now for a removal, and always later
// than the version it changed (doc.go, "Which version wins").
func (r *Tier) ownChanges(local map[string]nsEntry, world state, me string) state {
	own := state{}
	if r.adopt {
		return own
	}
	wv, mv := world.visible(), r.mine.visible()
	now := time.Now().UnixNano()
	seen := map[string]bool{}
	check := func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		l, lok := local[p]
		if m, mok := mv[p]; same(l, lok, m, mok) {
			return
		}
		if wl, wok := wv[p]; same(l, lok, wl, wok) {
			return
		}
		if st, ok := r.stale[p]; ok && same(l, lok, st.e, st.ok) {
			return
		}
		prev := r.mine[p].Stamp
		if !lok {
			own[p] = entry{Stamp: after(now, prev), Origin: me, Deleted: true}
			return
		}
		at := l.ctime
		if at <= 0 {
			at = now
		}
		l.ctime = 0
		own[p] = entry{nsEntry: l, Stamp: after(at, prev), Origin: me}
	}
	for p := range local {
		check(p)
	}
	for p := range mv {
		check(p)
	}
	return own
}

// publishOwn uploads the chunks of own's files that the bucket may lack,
// then next as a snapshot, then the session's log entry naming it.
func (r *Tier) publishOwn(ctx context.Context, sess *Session, own, next state, gen uint64, w *world) (string, error) {
	need := map[cas.ID]uint32{}
	err := r.store.View(func(tx *cas.Tx) error {
		up := tx.Uploads()
		for _, e := range own {
			if e.m == nil {
				continue
			}
			for _, c := range e.m.Chunks {
				if !up.Has(c.ID) {
					need[c.ID] = c.Len
				}
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	var pending int64
	for _, n := range need {
		pending += int64(n)
	}
	r.tier.SetPending(pending)
	if len(need) > 0 {
		if err := r.uploadChunks(ctx, need, w.trashed); err != nil {
			return "", err
		}
	}
	name, err := r.putSnapshot(ctx, next, sess.ID(), gen)
	if err != nil {
		return "", err
	}
	// Recorded before the entry is put: if its answer is lost, the next
	// round (of this session or, after a fence or a crash, of the next)
	// knows what the store may have published (foldPublished).
	if err := r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().SetPending(name, sess.ID()) }); err != nil {
		return "", err
	}
	if err := sess.appendEntry(ctx, logEntry{Kind: kindState, Snapshot: name, Gen: gen, TrashSeen: w.trashIDs()}); err != nil {
		return "", fmt.Errorf("publish snapshot: %w", err)
	}
	return name, nil
}

// putSnapshot puts st as a snapshot object; its name.
func (r *Tier) putSnapshot(ctx context.Context, st state, session string, gen uint64) (string, error) {
	body, err := json.Marshal(st.snapshot(session, gen))
	if err != nil {
		return "", err
	}
	name := cas.Sum(body).String()
	err = r.be.Put(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, body, backend.PutOptions{IfAbsent: true})
	if err != nil && !errors.Is(err, backend.ErrExists) {
		return "", fmt.Errorf("upload snapshot: %w", err)
	}
	return name, nil
}

// applyState makes the local namespace (local, as walked) st's visible
// one through the applier, but for the paths held (their local version is
// a change of this store's own, not published yet), and notes the paths it
// could not change. It returns how many paths changed.
func (r *Tier) applyState(ctx context.Context, local map[string]nsEntry, st state, held map[string]string) (int, error) {
	vis := st.visible()
	var changes []change
	var paths []string
	add := func(p string) {
		if _, ok := held[p]; ok {
			return
		}
		l, lok := local[p]
		v, vok := vis[p]
		if same(l, lok, v, vok) {
			delete(r.stale, p)
			return
		}
		c := change{Path: p}
		if lok {
			c.Have = &l
		}
		if vok {
			c.Want = &v
		}
		changes = append(changes, c)
		paths = append(paths, p)
	}
	for p := range local {
		add(p)
	}
	for p := range vis {
		if _, ok := local[p]; !ok {
			add(p)
		}
	}
	if len(changes) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	apply := r.applier
	r.mu.Unlock()
	var changed []string
	err := apply(ctx, paths, func(busy func(string) bool) ([]string, error) {
		var err error
		changed, err = r.reconcile(changes, busy)
		return changed, err
	})
	if err != nil {
		return 0, err
	}
	done := map[string]bool{}
	for _, p := range changed {
		done[p] = true
	}
	for _, c := range changes {
		if done[c.Path] {
			delete(r.stale, c.Path)
		} else if c.Have != nil {
			r.stale[c.Path] = localVersion{e: *c.Have, ok: true}
		} else {
			r.stale[c.Path] = localVersion{}
		}
	}
	return len(changed), nil
}

// fenceSilent fences every other live session whose lease this writer saw
// unchanged for a whole lease by its own clock (doc.go, step 5).
func (r *Tier) fenceSilent(ctx context.Context, w *world, sess *Session) {
	now := time.Now()
	for id := range r.silent {
		if w.sessions[id] == nil {
			delete(r.silent, id)
		}
	}
	for id, si := range w.sessions {
		if id == sess.ID() || !si.live() {
			delete(r.silent, id)
			continue
		}
		prev, ok := r.silent[id]
		if !ok || !prev.mod.Equal(si.leaseMod) {
			r.silent[id] = silence{mod: si.leaseMod, since: now}
			continue
		}
		lease := r.leaseOf(ctx, id, sess.opts.Lease)
		if now.Sub(prev.since) < lease {
			continue
		}
		reason := fmt.Sprintf("its lease was not renewed for %v", now.Sub(prev.since).Round(time.Millisecond))
		if err := r.fenceSession(ctx, id, si.lastSeq(), sess, reason); err != nil {
			sess.opts.Logf("fence silent session %s of %s: %v", id, r.be.Location(), err)
			continue
		}
		sess.opts.Logf("fenced writer session %s of %s: %s", id, r.be.Location(), reason)
		si.last = &logEntry{Kind: kindFence, Session: id, By: sess.ID()}
		delete(r.silent, id)
	}
}

// leaseOf returns session id's lease length (read from its lease once),
// def when it cannot be read.
func (r *Tier) leaseOf(ctx context.Context, id string, def time.Duration) time.Duration {
	if d, ok := r.leases[id]; ok {
		return d
	}
	b, err := r.be.Get(ctx, leaseHandle(id), nil)
	var rec lockRecord
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.Lease <= 0 {
		return def
	}
	r.leases[id] = rec.Lease
	return rec.Lease
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

// ApplyPublished makes a reading mount's store namespace the published
// one (new files, overwrites, removals, renames), before the namespace is
// served; it refuses a store whose own commits are not uploaded. It
// reports whether anything was ever published, and how many paths changed.
func (r *Tier) ApplyPublished(ctx context.Context) (bool, int, error) {
	if pending, err := r.UploadPending(); err != nil || pending {
		if err == nil {
			err = errors.New("this store has commits not uploaded yet: mount it as a writer (without --read-only) and sync first")
		}
		return false, 0, err
	}
	return r.Refresh(ctx)
}

// Refresh is a reading mount's round: it applies what every session
// published, through the applier (SetApplier) once the namespace is
// served. It reports whether anything was ever published, and how many
// paths changed.
func (r *Tier) Refresh(ctx context.Context) (bool, int, error) {
	r.upMu.Lock()
	defer r.upMu.Unlock()
	w, err := r.readWorld(ctx)
	if err != nil {
		return false, 0, err
	}
	local := map[string]nsEntry{}
	err = r.store.View(func(tx *cas.Tx) error {
		return walkNamespace(tx, func(p string, e nsEntry) error { local[p] = e; return nil })
	})
	if err != nil {
		return false, 0, err
	}
	n, err := r.applyState(ctx, local, w.state, nil)
	if err != nil {
		return w.published, n, err
	}
	return w.published, n, r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().SetBase("", true) })
}

// collectionName is locks/gc: a collection of the bucket is running.
const collectionName = "gc"

// waitCollection returns once no collection of the bucket runs: its lock
// is gone, or unchanged for a whole lease by this host's clock (a
// collector bounds its deletes by its lease).
func (r *Tier) waitCollection(ctx context.Context, opts SessionOptions) error {
	h := backend.Handle{Kind: backend.Lock, Name: collectionName}
	var first, mod time.Time
	for {
		info, err := r.be.Stat(ctx, h)
		if errors.Is(err, backend.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look for a collection of %s: %w", r.be.Location(), err)
		}
		switch {
		case first.IsZero():
			opts.Logf("waiting for the collection of %s to end", r.be.Location())
			first, mod = time.Now(), info.ModTime
		case !info.ModTime.Equal(mod):
			first, mod = time.Now(), info.ModTime
		case time.Since(first) > opts.Lease:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Close ends the tier's writer session, whichever it is now (a rejoin
// replaces the one Join returned). Call it once no round runs.
func (r *Tier) Close(ctx context.Context) error {
	r.mu.Lock()
	sess := r.sess
	r.mu.Unlock()
	if sess == nil {
		return nil
	}
	return sess.Close(ctx)
}
