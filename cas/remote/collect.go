package remote

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// Collect deletes from the remote every chunk object that no file
// names, neither in the newest published snapshot nor in this store's
// catalog (files committed and not uploaded yet) nor in live (files open or
// staged), and that was last modified before before (the grace period:
// reading mounts may still be on an older snapshot). It holds the upload
// lock throughout, so no upload round runs meanwhile; a chunk's
// remote_chunks row is removed before its object, so a later round uploads
// it again if a commit comes to need it. Only a writer session may collect,
// and only while its lease is valid: it checks before each delete, and each
// delete's request carries the lease's deadline (doc.go says why that is
// safe with one writer at a time). With dryRun it deletes nothing.
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
	if err := sess.confirm(ctx); err != nil {
		return res, fmt.Errorf("collect the remote: %w", err)
	}
	r.upMu.Lock()
	defer r.upMu.Unlock()

	marked := map[cas.ID]struct{}{}
	mark := func(m *cas.Manifest) {
		if m == nil {
			return // a directory or symlink
		}
		for _, c := range m.Chunks {
			marked[c.ID] = struct{}{}
		}
	}
	snap, _, err := r.Snapshot(ctx, "")
	if err == nil {
		err = sess.confirm(ctx) // the snapshot read is the newest: nobody appended since
	}
	if err != nil {
		return res, fmt.Errorf("read the published files: %w", err) // never sweep on a partial mark
	}
	if snap != nil {
		for _, f := range snap.Files {
			mark(f.Manifest)
		}
	}
	if err := s.View(func(tx *cas.Tx) error {
		return tx.ForEachManifest(func(_ uint64, m *cas.Manifest) error { mark(m); return nil })
	}); err != nil {
		return res, err
	}
	for _, m := range live {
		mark(m)
	}
	type doomed struct {
		id   cas.ID
		size int64
	}
	var victims []doomed
	err = r.be.List(ctx, backend.Chunk, func(in backend.Info) error {
		if in.Handle.Kind != backend.Chunk {
			return nil
		}
		id, err := cas.ParseID(in.Handle.Name)
		if err != nil {
			return nil // not a chunk's name: not ours to collect
		}
		res.Objects++
		if _, ok := marked[id]; ok {
			return nil
		}
		if !in.ModTime.Before(before) {
			res.Young++
			return nil
		}
		victims = append(victims, doomed{id, in.Size})
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("list the remote's chunks: %w", err)
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
		dctx, cancel := context.WithDeadline(ctx, sess.deadline())
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
