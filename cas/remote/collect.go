package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
)

// CollectResult is what Collect found and removed.
type CollectResult struct {
	Objects    int   `json:"remote_objects"`     // chunk objects in the remote
	Young      int   `json:"remote_young"`       // unreferenced but younger than the cutoff: kept
	Freed      int   `json:"remote_freed"`       // deleted (or, dry run, would be)
	FreedBytes int64 `json:"remote_freed_bytes"` // their bytes
}

// Collect deletes from the remote every chunk object that nothing names
// and that was last modified before before (the grace period: reading
// mounts may still be on an older state), doc.go step 6: it takes the
// collection's lock (locks/gc, create-only: a session joining meanwhile
// waits for it), fences sessions silent for a lease, and refuses (ErrBusy)
// while another writer session may still publish, since that session may
// name any chunk the bucket holds in its next entry. The mark is every
// version in the checkpoint and in every session's newest state, this
// store's catalog (files committed and not published yet) and live (files
// open or staged). A chunk's remote_chunks row is removed before its
// object, so a later round uploads it again if a commit comes to need it.
// Only a writer session may collect, and each delete carries the
// collection lock's deadline. With dryRun it deletes nothing.
func (r *Tier) Collect(ctx context.Context, before time.Time, live []*cas.Manifest, dryRun bool) (CollectResult, error) {
	var res CollectResult
	s := r.store
	if s.ReadOnly() {
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
	var others []string
	for id, si := range w.sessions {
		if id != sess.ID() && si.live() {
			others = append(others, id)
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		return res, fmt.Errorf("collect the remote %s: %w: session(s) %s may still publish; run gc when this mount is the only writer (a session silent for a whole lease is fenced, and no longer counts)",
			r.be.Location(), ErrBusy, strings.Join(others, ", "))
	}
	marked := map[cas.ID]struct{}{}
	mark := func(m *cas.Manifest) {
		if m == nil {
			return // a directory or symlink
		}
		for _, c := range m.Chunks {
			marked[c.ID] = struct{}{}
		}
	}
	for _, name := range w.snapshots {
		st, err := r.snapshotState(ctx, name)
		if err != nil {
			return res, fmt.Errorf("read the published files: %w", err)
		}
		for _, e := range st {
			mark(e.m)
		}
	}
	for _, e := range r.mine {
		mark(e.m)
	}
	if err := s.View(func(tx *cas.Tx) error {
		return tx.ForEachManifest(func(_ uint64, m *cas.Manifest) error { mark(m); return nil })
	}); err != nil {
		return res, err
	}
	for _, m := range live {
		mark(m)
	}
	return r.sweep(ctx, sess, marked, before, deadline, dryRun)
}

// lockCollection puts locks/gc, create-only; a lock left by a collector
// that died is taken over once it is older than ten leases by the
// bucket's clock. It returns the deadline of the collection's deletes.
func (r *Tier) lockCollection(ctx context.Context, sess *Session) (time.Time, func(), error) {
	h := backend.Handle{Kind: backend.Lock, Name: collectionName}
	body, _ := json.Marshal(sess.rec) // strings, ints and times: cannot fail
	for try := 0; ; try++ {
		start := time.Now()
		err := r.be.Put(ctx, h, body, backend.PutOptions{IfAbsent: true})
		if err == nil {
			release := func() {
				if err := r.be.Delete(context.WithoutCancel(ctx), h); err != nil && !errors.Is(err, backend.ErrNotExist) {
					sess.opts.Logf("release the collection lock of %s: %v", r.be.Location(), err)
				}
			}
			return start.Add(sess.opts.Lease - sess.opts.Lease/4), release, nil
		}
		if !errors.Is(err, backend.ErrExists) {
			return time.Time{}, nil, fmt.Errorf("lock the collection of %s: %w", r.be.Location(), err)
		}
		info, serr := r.be.Stat(ctx, h)
		if serr == nil && time.Since(info.ModTime) > 10*sess.opts.Lease && try == 0 {
			if err := r.be.Delete(ctx, h); err != nil && !errors.Is(err, backend.ErrNotExist) {
				return time.Time{}, nil, err
			}
			continue
		}
		return time.Time{}, nil, fmt.Errorf("collect the remote %s: %w: another collection runs (locks/gc)", r.be.Location(), ErrBusy)
	}
}

// sweep deletes the chunk objects outside marked and older than before.
func (r *Tier) sweep(ctx context.Context, sess *Session, marked map[cas.ID]struct{}, before, deadline time.Time, dryRun bool) (CollectResult, error) {
	var res CollectResult
	s := r.store
	type doomed struct {
		id   cas.ID
		size int64
	}
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
		return res, fmt.Errorf("list the remote's chunks: %w", err)
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
	var victims []doomed
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
		victims = append(victims, doomed{id, in.Size})
	}
	for _, v := range victims {
		res.Freed++
		res.FreedBytes += v.size
	}
	if dryRun || len(victims) == 0 {
		return res, nil
	}
	ids := make([]cas.ID, len(victims))
	for i, v := range victims {
		ids[i] = v.id
	}
	err = s.Update(func(tx *cas.Tx) error { return tx.Uploads().Forget(ids) })
	if err != nil {
		return CollectResult{Objects: res.Objects, Young: res.Young}, err
	}
	res.Freed, res.FreedBytes = 0, 0
	for _, v := range victims {
		if err := sess.Err(); err != nil {
			return res, fmt.Errorf("collect the remote: %w", err)
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("collect the remote %s: the collection's lease ran out after %d deletes: run gc again", r.be.Location(), res.Freed)
		}
		dctx, cancel := context.WithDeadline(ctx, deadline)
		err := r.be.Delete(dctx, chunkHandle(v.id))
		cancel()
		if err != nil {
			return res, fmt.Errorf("delete chunk %v from the remote: %w", v.id, err)
		}
		res.Freed++
		res.FreedBytes += v.size
	}
	return res, nil
}

// bucketBases returns the bases that the chunk objects ids in the bucket
// name, those that are deltas (doc.go, "Deltas in the bucket"): the header
// of each (headReader, else the whole object), Connections at a time. An object gone meanwhile names nothing; any other error fails the
// whole (the caller sweeps nothing).
func (r *Tier) bucketBases(ctx context.Context, ids []cas.ID) ([]cas.ID, error) {
	work := make(chan cas.ID)
	var mu sync.Mutex
	var bases []cas.ID
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
	head := r.headReader()
	for range min(max(1, r.be.Properties().Connections), 32) {
		g.Go(func() error {
			var buf []byte
			for id := range work {
				h := chunkHandle(id)
				var err error
				if head != nil {
					buf, err = head(gctx, h, buf)
				}
				if head == nil || (err != nil && !errors.Is(err, backend.ErrNotExist)) {
					buf, err = r.be.Get(gctx, h, buf) // shorter than a delta's header, or no ranges
				}
				if errors.Is(err, backend.ErrNotExist) {
					continue
				}
				if err != nil {
					return fmt.Errorf("chunk %v: %w", id, err)
				}
				if b, delta := cas.DeltaBase(buf); delta {
					mu.Lock()
					bases = append(bases, b)
					mu.Unlock()
				}
			}
			return nil
		})
	}
	return bases, g.Wait()
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
