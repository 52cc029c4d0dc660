package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// CollectResult is what Collect found, removed, and put in the trash.
type CollectResult struct {
	Objects    int   `json:"remote_objects"`     // chunk objects in the remote
	Young      int   `json:"remote_young"`       // unreferenced but younger than the cutoff: kept
	Freed      int   `json:"remote_freed"`       // deleted (or, dry run, would be)
	FreedBytes int64 `json:"remote_freed_bytes"` // their bytes
	// Beside other live writers (doc.go, step 8):
	Trashed      int    `json:"remote_trashed,omitempty"`       // unreferenced and old: put in a new trash list
	TrashedBytes int64  `json:"remote_trashed_bytes,omitempty"` // their bytes
	TrashList    string `json:"remote_trash_list,omitempty"`    // the new list's ID
	Purged       int    `json:"remote_purged_lists,omitempty"`  // trash lists purged (their candidates in Freed)
	Pending      int    `json:"remote_pending_lists,omitempty"` // trash lists younger than the grace period: left for a later gc
}

// Collect collects the remote's chunk objects that nothing names and that
// were last modified before before (the grace period: reading mounts may
// still be on an older state), doc.go step 8. It takes the collection's
// lock (locks/gc, create-only: a session joining meanwhile waits for it)
// and fences sessions silent for a lease. With no other writer session
// that may still publish, it deletes them at once (and drops every trash
// list: moot). Beside live writers it runs in two phases
// (collectBeside): it purges the trash lists older than the grace period
// that every live session acknowledged (ErrNotAcked, deleting nothing,
// when one has not), then puts what it finds now into a new trash list.
// The mark is every version in the checkpoint and in every session's
// newest state, this store's catalog (files committed and not published
// yet) and live (files open or staged). A chunk's remote_chunks row is
// removed before its object, so a later round uploads it again if a commit
// comes to need it. Only a writer session may collect, and each delete
// carries the collection lock's deadline. With dryRun it deletes and puts
// nothing.
func (r *Tier) Collect(ctx context.Context, before time.Time, live []*cas.Manifest, dryRun bool) (CollectResult, error) {
	var res CollectResult
	if r.store.ReadOnly() {
		return res, errors.New("store is open read-only")
	}
	sess, err := r.session()
	if err != nil {
		return res, err
	}
	r.upMu.Lock()
	defer r.upMu.Unlock()
	if err := sess.usable(ctx); err != nil {
		return res, fmt.Errorf("collect the remote: %w", r.fencedErr(sess, err))
	}
	deadline, release, err := r.lockCollection(ctx, sess)
	if err != nil {
		return res, err
	}
	defer release()
	w, err := r.readWorld(ctx)
	if err != nil {
		return res, fmt.Errorf("read the published files: %w", err) // never sweep on a partial mark
	}
	r.fenceSilent(ctx, w, sess)
	if !dryRun {
		// This store's own session reads the lists here as its rounds do
		// (under upMu: no round of it runs meanwhile).
		if err := r.forgetTrashed(w); err != nil {
			return res, err
		}
	}
	if others := liveOthers(w, sess); len(others) > 0 {
		return r.collectBeside(ctx, sess, w, others, live, before, deadline, dryRun)
	}
	marked, err := r.mark(ctx, w, w.snapshots, live)
	if err != nil {
		return res, err
	}
	if res, err = r.sweep(ctx, sess, marked, before, deadline, dryRun); err != nil || dryRun {
		res.Purged = len(w.trash)
		return res, err
	}
	res.Purged, err = r.deleteTrashLists(ctx, w)
	return res, err
}

// mark returns every chunk that a version of the snapshots names, or a
// version that wins in w, or mine, the store's catalog or live.
func (r *Tier) mark(ctx context.Context, w *world, snapshots []string, live []*cas.Manifest) (map[cas.ID]struct{}, error) {
	marked := map[cas.ID]struct{}{}
	mark := func(m *cas.Manifest) {
		if m == nil {
			return // a directory or symlink
		}
		for _, c := range m.Chunks {
			marked[c.ID] = struct{}{}
		}
	}
	for _, e := range w.state {
		mark(e.m)
	}
	for _, name := range snapshots {
		st, err := r.snapshotState(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("read the published files: %w", err)
		}
		for _, e := range st {
			mark(e.m)
		}
	}
	for _, e := range r.mine {
		mark(e.m)
	}
	if err := r.store.View(func(tx *cas.Tx) error {
		return tx.ForEachManifest(func(_ uint64, m *cas.Manifest) error { mark(m); return nil })
	}); err != nil {
		return nil, err
	}
	for _, m := range live {
		mark(m)
	}
	return marked, nil
}

// lockCollection puts locks/gc, create-only; a lock left by a collector
// that died is taken over once it is older than ten leases by the
// bucket's clock, and one that names this very session (an earlier attempt
// whose answer was lost: the put reached a stalled server and was applied
// after the attempt gave up) at once. It returns the deadline of the
// collection's deletes. A put or a release whose outcome is not known
// marks the lock unsure (r.lockUnsure, upMu held): the next round removes
// it if it names this session (releaseLostLock), so that other writers
// neither wait for it to age nor find every collection refused meanwhile.
func (r *Tier) lockCollection(ctx context.Context, sess *Session) (time.Time, func(), error) {
	h := backend.Handle{Kind: backend.Lock, Name: collectionName}
	body, _ := json.Marshal(sess.rec) // strings, ints and times: cannot fail
	release := func() {
		if err := r.be.Delete(context.WithoutCancel(ctx), h); err != nil && !errors.Is(err, backend.ErrNotExist) {
			r.lockUnsure = true
			sess.opts.Logf("release the collection lock of %s: %v (the next round tries again)", r.be.Location(), err)
		}
	}
	for try := 0; ; try++ {
		start := time.Now()
		err := r.be.Put(ctx, h, body, backend.PutOptions{IfAbsent: true})
		if err == nil {
			return start.Add(sess.opts.Lease - sess.opts.Lease/4), release, nil
		}
		if !errors.Is(err, backend.ErrExists) {
			r.lockUnsure = true
			return time.Time{}, nil, fmt.Errorf("lock the collection of %s: %w", r.be.Location(), err)
		}
		holder, herr := r.collectionHolder(ctx)
		if herr == nil && holder.Session == sess.rec.Session {
			// Ours, from an attempt that gave up: put it again (its
			// time is the bucket's now) and go on.
			if err := r.be.Put(ctx, h, body, backend.PutOptions{}); err != nil {
				r.lockUnsure = true
				return time.Time{}, nil, fmt.Errorf("lock the collection of %s: %w", r.be.Location(), err)
			}
			return start.Add(sess.opts.Lease - sess.opts.Lease/4), release, nil
		}
		info, serr := r.be.Stat(ctx, h)
		if serr == nil && time.Since(info.ModTime) > 10*sess.opts.Lease && try == 0 {
			if err := r.be.Delete(ctx, h); err != nil && !errors.Is(err, backend.ErrNotExist) {
				return time.Time{}, nil, err
			}
			continue
		}
		who := "locks/gc"
		if herr == nil && serr == nil {
			who = fmt.Sprintf("locks/gc of session %s, host %s pid %d, put %v ago; taken over once %v old",
				holder.Session, holder.Host, holder.PID, time.Since(info.ModTime).Round(time.Second), 10*sess.opts.Lease)
		}
		return time.Time{}, nil, fmt.Errorf("collect the remote %s: %w (%s)", r.be.Location(), ErrBusy, who)
	}
}

// collectionHolder reads locks/gc: the session record of its collector.
func (r *Tier) collectionHolder(ctx context.Context) (lockRecord, error) {
	var rec lockRecord
	data, err := r.be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: collectionName}, nil)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("locks/gc of %s: %w", r.be.Location(), err)
	}
	return rec, nil
}

// releaseLostLock deletes locks/gc if it names sess: left by a collection
// of this session whose lock put or release had no answer (lockUnsure; upMu
// held, so no collection of this store runs). Errors leave it unsure, for
// the next round.
func (r *Tier) releaseLostLock(ctx context.Context, sess *Session) {
	holder, err := r.collectionHolder(ctx)
	switch {
	case errors.Is(err, backend.ErrNotExist):
	case err != nil:
		return
	case holder.Session == sess.rec.Session:
		if err := r.be.Delete(ctx, backend.Handle{Kind: backend.Lock, Name: collectionName}); err != nil && !errors.Is(err, backend.ErrNotExist) {
			return
		}
		sess.opts.Logf("removed the collection lock of %s that an earlier gc of this session left", r.be.Location())
	}
	r.lockUnsure = false
}

// listChunks lists the remote's chunk objects.
func (r *Tier) listChunks(ctx context.Context) ([]backend.Info, error) {
	var objects []backend.Info
	err := r.be.List(ctx, backend.Chunk, func(in backend.Info) error {
		if in.Handle.Kind != backend.Chunk {
			return nil
		}
		if _, err := cas.ParseID(in.Handle.Name); err != nil {
			return nil // not a chunk's name: not ours to collect
		}
		objects = append(objects, in)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the remote's chunks: %w", err)
	}
	return objects, nil
}

// sweep deletes the chunk objects outside marked and older than before.
func (r *Tier) sweep(ctx context.Context, sess *Session, marked map[cas.ID]struct{}, before, deadline time.Time, dryRun bool) (CollectResult, error) {
	var res CollectResult
	objects, err := r.listChunks(ctx)
	if err != nil {
		return res, err
	}
	// What stays (marked, or young: a reader on an older state may read
	// it) keeps the base it names.
	var kept []cas.ID
	for _, in := range objects {
		id, _ := cas.ParseID(in.Handle.Name)
		if _, ok := marked[id]; ok || !in.ModTime.Before(before) {
			kept = append(kept, id)
		}
	}
	bases, err := r.bucketBases(ctx, kept)
	if err != nil {
		return res, fmt.Errorf("read the bases of the remote's deltas: %w", err) // never sweep on a partial mark
	}
	for _, b := range bases {
		marked[b] = struct{}{}
	}
	victims := map[cas.ID]int64{}
	var ids []cas.ID
	for _, in := range objects {
		id, _ := cas.ParseID(in.Handle.Name)
		res.Objects++
		if _, ok := marked[id]; ok {
			continue
		}
		if !in.ModTime.Before(before) {
			res.Young++
			continue
		}
		victims[id] = in.Size
		ids = append(ids, id)
		res.Freed++
		res.FreedBytes += in.Size
	}
	if dryRun || len(victims) == 0 {
		return res, nil
	}
	res.Freed, res.FreedBytes = 0, 0
	return res, r.deleteChunks(ctx, sess, ids, victims, deadline, &res)
}

// deleteChunks forgets the store's upload records of ids, then deletes
// their objects (sizes: their bytes), Connections at a time (at most 32),
// each before deadline, counting them in res. The first failure stops the
// rest (a chunk left is only space: a later gc deletes it).
func (r *Tier) deleteChunks(ctx context.Context, sess *Session, ids []cas.ID, sizes map[cas.ID]int64, deadline time.Time, res *CollectResult) error {
	if len(ids) == 0 {
		return nil
	}
	if err := r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().Forget(ids) }); err != nil {
		return err
	}
	var mu sync.Mutex // guards res
	return r.inParallel(ctx, ids, func(ctx context.Context) func(cas.ID) error {
		return func(id cas.ID) error {
			if err := sess.Err(); err != nil {
				return fmt.Errorf("collect the remote: %w", err)
			}
			if time.Now().After(deadline) {
				span := sess.opts.Lease - sess.opts.Lease/4
				mu.Lock()
				n := res.Freed
				mu.Unlock()
				return fmt.Errorf("collect the remote %s: the collection's lease ran out after %d deletes (%v after it took locks/gc; it may delete for %v): run gc again",
					r.be.Location(), n, time.Since(deadline.Add(-span)).Round(time.Millisecond), span)
			}
			dctx, cancel := context.WithDeadline(ctx, deadline)
			err := r.be.Delete(dctx, chunkHandle(id))
			cancel()
			if err != nil && !errors.Is(err, backend.ErrNotExist) {
				return fmt.Errorf("delete chunk %v from the remote: %w", id, err)
			}
			mu.Lock()
			res.Freed++
			res.FreedBytes += sizes[id]
			mu.Unlock()
			return nil
		}
	})
}

// inParallel hands ids one at a time to Connections workers (at most 32),
// each doing what newWorker makes for it (with buffers of its own). The
// first error stops the rest and is returned; so is the context's, when it
// ends before every id was handed out (a caller never takes a partial run
// for a whole one).
func (r *Tier) inParallel(ctx context.Context, ids []cas.ID, newWorker func(ctx context.Context) func(cas.ID) error) error {
	work := make(chan cas.ID)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(work)
		for _, id := range ids {
			select {
			case work <- id:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range min(max(1, r.be.Properties().Connections), 32) {
		do := newWorker(gctx)
		g.Go(func() error {
			for id := range work {
				if err := do(id); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// bucketBases returns the bases that the chunk objects ids in the bucket
// name, those that are deltas (doc.go, "Deltas in the bucket"): the header
// of each (headReader, else the whole object), Connections at a time. An object gone meanwhile names nothing; any other error fails the
// whole (the caller sweeps nothing).
func (r *Tier) bucketBases(ctx context.Context, ids []cas.ID) ([]cas.ID, error) {
	var mu sync.Mutex // guards bases
	var bases []cas.ID
	head := r.headReader()
	err := r.inParallel(ctx, ids, func(ctx context.Context) func(cas.ID) error {
		var buf []byte
		return func(id cas.ID) error {
			h := chunkHandle(id)
			var err error
			if head != nil {
				buf, err = head(ctx, h, buf)
			}
			if head == nil || (err != nil && !errors.Is(err, backend.ErrNotExist)) {
				buf, err = r.be.Get(ctx, h, buf) // shorter than a delta's header, or no ranges
			}
			if errors.Is(err, backend.ErrNotExist) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("chunk %v: %w", id, err)
			}
			if b, delta := cas.DeltaBase(buf); delta {
				mu.Lock()
				bases = append(bases, b)
				mu.Unlock()
			}
			return nil
		}
	})
	return bases, err
}

// headGetter is a remote that reads the first bytes of an object (the S3
// backend's GetHead).
type headGetter interface {
	GetHead(ctx context.Context, h backend.Handle, n int64, buf []byte) ([]byte, error)
}

// headReader returns how to read the first cas.DeltaHeaderLen bytes of an
// object of the remote (fewer, or an error, for a shorter one), or nil when
// the remote reads whole objects only.
func (r *Tier) headReader() func(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	switch be := r.be.(type) {
	case headGetter:
		return func(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
			return be.GetHead(ctx, h, cas.DeltaHeaderLen, buf)
		}
	case backend.RangeGetter:
		return func(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
			return be.GetRange(ctx, h, 0, cas.DeltaHeaderLen, buf)
		}
	}
	return nil
}
