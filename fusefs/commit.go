package fusefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs/stage"
)

// commit makes the staged content the committed content, if there is any.
// For a file with a fork in progress it commits the fork.
//
// Its error is the caller's answer to "is what was written committed?"
// (fsync, close): when there is nothing to commit because a failed commit
// (another request's, e.g. an earlier handle's RELEASE) dropped the staged
// content, it reports that failure (n.lost), not success.
func (n *fileNode) commit(ctx context.Context) error { return n.commitAs(ctx, nil) }

// commitAtRelease is the commit of the RELEASE of h: it commits only if no
// handle but h that may write has the file (the node the commit lands on)
// open, checked holding the file's lock, so that a writer that opened after
// the kernel's close of h never has its half-written content committed (nor
// dropped by a failure of that commit, which RELEASE can only log). It
// reports no n.lost: that failure was reported to the writers.
func (n *fileNode) commitAtRelease(ctx context.Context, h *handle) error { return n.commitAs(ctx, h) }

// commitAs is commit, or commitAtRelease when releasing is not nil.
func (n *fileNode) commitAs(ctx context.Context, releasing *handle) error {
	replaced, committed, err := n.commitQuiet(ctx, releasing)
	if err != nil {
		return err
	}
	if replaced != nil {
		// The name now belongs to n: make the kernel drop its cached entry (which
		// resolves to the origin) before close returns, so that the next open of
		// the name finds the new version. No lock of ours is held here: the kernel
		// takes the directory's lock, which a request waiting for nsMu may hold.
		replaced()
	}
	if committed && n.fsys.afterCommit != nil {
		return n.fsys.afterCommit(ctx)
	}
	return nil
}

// commitQuiet is commitAs without the kernel's entry invalidated: a fork
// that took its origin's place returns replaceOrigin's function, for a
// caller that must not wait on the kernel's directory lock (Link, which
// the kernel serves holding it) to run later.
func (n *fileNode) commitQuiet(ctx context.Context, releasing *handle) (replaced func(), committed bool, err error) {
	defer n.fsys.beginActivity()() // the re-encoder waits for commits
	if t := n.dataNode(nil); t != n {
		return t.commitQuiet(ctx, releasing)
	}
	n.commitMu.Lock()
	defer n.commitMu.Unlock()
	// A fork takes its origin's place: its name, mode and owner. Read them
	// before taking n.mu (Open holds an origin's mu while taking its fork's).
	n.fsys.nsMu.Lock()
	origin := n.origin
	n.fsys.nsMu.Unlock()
	var originAttr cas.Node
	if origin != nil {
		origin.mu.RLock()
		originAttr = origin.attr
		origin.mu.RUnlock()
	}
	return n.commitLocked(ctx, origin, originAttr, releasing)
}

// commitLocked does the commit and reports whether it wrote one; for a fork
// that took its origin's place it returns the function that invalidates the
// kernel's entry. releasing: see commitAs.
func (n *fileNode) commitLocked(ctx context.Context, origin *fileNode, originAttr cas.Node, releasing *handle) (replaced func(), committed bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if releasing != nil {
		own := 0 // the releasing handle still counts among the writers
		if releasing.write {
			own = 1
		}
		if n.writers > own {
			return nil, false, nil // another writer has it open: its close commits
		}
		if !n.dirty {
			return nil, false, nil
		}
	}
	if !n.dirty {
		return nil, false, n.lost
	}
	if n.unlinked.Load() || origin != nil && origin.unlinked.Load() {
		// No name left to commit it under (a fork takes its origin's): the
		// staged content serves the handles still open and goes with the
		// last of them (Release), as a local filesystem frees an unlinked
		// file at its last close. Storing it would leave chunks no row
		// names until a collection's grace period ends (and fsck would
		// call them a crash's). An unlink that lands after this look is
		// still handled by commitCatalog (Keep).
		n.unlinked.Store(true)
		return nil, false, nil
	}
	if obs := n.fsys.obs; obs != nil {
		start := time.Now()
		defer func() { obs.Commit(time.Since(start), n.attr.Size, err) }()
	}
	replaced, err = n.commitDirty(ctx, origin, originAttr)
	n.fsys.unpinIfSettled(n)
	return replaced, err == nil, err
}

// commitDirty is commitLocked's work (n.mu held, n dirty).
func (n *fileNode) commitDirty(ctx context.Context, origin *fileNode, originAttr cas.Node) (_ func(), err error) {
	m := &cas.Manifest{}
	var res stage.Result
	if st := n.staging; st == nil {
		res.Batch = n.fsys.store.NewBatch() // nothing staged: empty content
	} else {
		streamed := st.Streaming()
		if res, err = st.Finish(ctx); err != nil {
			if streamed {
				n.revert(err) // releases the stream's batch
				return nil, fmt.Errorf("staged content lost: %w", err)
			}
			return nil, err
		}
		if streamed {
			// The chunks were stored while the file was written. From
			// here the staged bytes exist only as the batch's chunks: if
			// the commit fails, the batch is released (its unnamed chunks
			// deleted) and n holds nothing staged. Left dirty, the next
			// commit (release, fsync, unmount) would commit an empty
			// manifest over the previous version; revert instead, as
			// when Finish fails.
			n.staging = nil
			defer func() {
				if err != nil {
					n.revert(err)
					err = fmt.Errorf("staged content lost: %w", err)
				}
			}()
		}
	}
	batch, ix := res.Batch, res.Index
	// A group forming now waits for this commit (cas: group commit).
	defer batch.Committing()()
	m.Chunks, m.Holes = res.Chunks, res.Holes
	if ix != nil && ix.TensorsOmitted > 0 {
		n.fsys.log.Printf("%s: %d tensors exceed the index limit of %d: the file is stored whole, without a tensor index",
			n.name, ix.TensorsOmitted, MaxIndexTensors)
	}
	if ix != nil && ix.Format != "" {
		var err error
		if m.Extra, err = json.Marshal(ix); err != nil {
			batch.Release()
			return nil, err
		}
	}
	rec := n.record()
	rec.Size = m.Size()

	n.fsys.suggestBases(batch, n.hintPlace(origin, originAttr), m, ix)

	// The batch's objects are made durable before nsMu is taken (lookups wait
	// on it), and the batch is released after the transaction has ended.
	if hook := n.fsys.commitHook; hook != nil {
		hook()
	}
	return n.commitCatalog(ctx, batch, m, rec, origin)
}

// commitCatalog makes batch durable and puts n's manifest m, its node
// record rec and (at its first commit) its directory entry in one catalog
// transaction, which concurrent commits share (cas.Store.CommitGroup: one
// transaction and one round of flushes for all the files closed meanwhile),
// holding nsMu for it; a fork takes its origin's name, mode and owner, and
// its place in the inode tree. It returns replaceOrigin's function for a fork
// that took its origin's place. n.mu held.
func (n *fileNode) commitCatalog(ctx context.Context, batch *cas.Batch, m *cas.Manifest, rec cas.Node, origin *fileNode) (func(), error) {
	var replaced func()
	kept := false
	err := n.fsys.store.CommitGroup(ctx, batch, groupLock{n.fsys}, func() cas.GroupItem {
		// nsMu held (by this commit or by the one leading its group).
		if origin != nil {
			// The fork takes the origin's mode and owner as they are now,
			// not as commitAs read them: a chmod of the origin since then
			// changed its attr first (its mu held; attrMu is a leaf we may
			// take here), and one whose change comes later finds the fork
			// in the origin's place (setattrLocked).
			origin.attrMu.Lock()
			rec.Mode, rec.UID, rec.GID = origin.attr.Mode, origin.attr.UID, origin.attr.GID
			origin.attrMu.Unlock()
			n.dir, n.name = origin.dir, origin.name
			if origin.unlinked.Load() {
				n.unlinked.Store(true)
			}
		}
		var item cas.GroupItem
		unlinked := n.unlinked.Load()
		if unlinked {
			batch.Keep() // m names its chunks while the file is open
			kept = true
		} else {
			item.Update = n.commitRows(m, rec, origin)
		}
		item.Apply = func() {
			if !unlinked {
				if !n.persisted && inTree(n) {
					// The catalog has the name now: the tree need not keep
					// the node once the kernel forgets it (Create).
					n.EmbeddedInode().ForgetPersistent()
				}
				n.persisted, n.shadow = true, 0
			}
			n.setAttr(func(a *cas.Node) { a.Mode, a.UID, a.GID = rec.Mode, rec.UID, rec.GID })
			n.setManifest(m)
			n.dirty = false
			n.dropSpoolLocked()
			if origin != nil {
				n.origin = nil
			}
		}
		if origin != nil && !unlinked {
			item.Then = func() { replaced = n.replaceOrigin(origin) }
		}
		return item
	})
	if err != nil {
		return nil, fmt.Errorf("commit %q: %w", n.nameNow(), err)
	}
	if kept {
		// Unlinked while this commit ran (commitLocked looked before):
		// given back with the last handle (dropUnlinkedLocked).
		n.kept = append(n.kept, batch)
	}
	return replaced, nil
}

// commitRows returns the catalog changes of n's commit (commitCatalog):
// a function of the transaction alone, which may run twice (CommitGroup).
// nsMu held when it is made and when it runs.
func (n *fileNode) commitRows(m *cas.Manifest, rec cas.Node, origin *fileNode) func(*cas.Tx) error {
	return func(tx *cas.Tx) error {
		if !n.persisted {
			replaced := n.shadow
			if origin != nil && origin.persisted {
				replaced = origin.attr.Ino
			}
			if replaced != 0 {
				// A shadow with other names keeps them (an origin has
				// one: it has no fork otherwise). Else its content's
				// waiting delta plans go with it, but m's (dir.go).
				if err := forgetWaits(tx, replaced, m); err != nil {
					return err
				}
				if _, err := tx.DropLink(replaced, time.Now().UnixNano()); err != nil {
					return err
				}
			}
			if err := tx.Link(n.dir.attr.Ino, n.name, rec.Ino); err != nil {
				return err
			}
			// The directory's mtime and ctime as Create set them (in
			// memory: the name was not in the catalog yet), with the entry
			// that changed them, so that they outlive its node.
			if err := tx.PutNode(n.dir.attr); err != nil {
				return err
			}
		} else if err := forgetContent(tx, rec.Ino, m); err != nil {
			return err // the content m replaces in place, for all of its names
		}
		if err := tx.PutManifest(rec.Ino, m); err != nil {
			return err
		}
		return tx.PutNode(rec)
	}
}

// hintPlace says where n's new content will live and which committed
// content it replaces, for delta hints (bases.go). n.mu held.
func (n *fileNode) hintPlace(origin *fileNode, originAttr cas.Node) hintPlace {
	n.fsys.nsMu.Lock()
	defer n.fsys.nsMu.Unlock()
	p := hintPlace{dir: n.dir, name: n.name}
	if n.persisted {
		p.prior = append(p.prior, n.attr.Ino)
	}
	if n.shadow != 0 {
		p.prior = append(p.prior, n.shadow)
	}
	if origin != nil {
		p.dir, p.name = origin.dir, origin.name
		if originAttr.Ino != 0 {
			p.prior = append(p.prior, originAttr.Ino)
		}
	}
	return p
}

// replaceOrigin puts fork n in origin's place in the inode tree and returns a
// function that makes the kernel drop its cached entry for the name (so the
// next lookup finds n). nsMu held.
func (n *fileNode) replaceOrigin(origin *fileNode) func() {
	parent := n.dir.EmbeddedInode()
	// A rename of the origin updates origin.dir/name under nsMu, but go-fuse
	// moves its inode only after our Rename returns. Wait for the tree to
	// agree, or that move would put the origin back over n: while the tree
	// disagrees, a rename is in flight (renameTracker), and its end is
	// broadcast. The wait releases nsMu (Rename takes it; n.mu and commitMu
	// it never takes). n.dir/name stay what the catalog got in this commit.
	for parent.GetChild(n.name) != origin.EmbeddedInode() && n.fsys.renames > 0 {
		n.fsys.renamed.Wait()
	}
	detach(origin)
	// The next lookup of the name reads the catalog, which names n, and
	// finds n pinned (or, once n is settled, builds its node from the
	// catalog): the tree holds only nodes the kernel has looked up.
	if parent.GetChild(n.name) == origin.EmbeddedInode() {
		parent.RmChild(n.name)
	}
	dir, name := n.dir, n.name
	return func() {
		// A rename of the name in the kernel's dentry cache (which still
		// resolves to the origin) may be in flight: the kernel looked the
		// name up before n took it, our Rename moves n, and the kernel then
		// moves the origin's dentry to the new name. NotifyEntry waits for
		// the kernel's rename (it takes the directory's lock), so invalidate
		// again wherever n now lives, until no rename moved it meanwhile.
		for {
			if errno := dir.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
				n.fsys.log.Printf("invalidate entry %q: %v", name, errno)
			}
			n.fsys.lockNS()
			moved := !n.unlinked.Load() && n.dir != nil && (n.dir != dir || n.name != name)
			dir, name = n.dir, n.name
			n.fsys.nsMu.Unlock()
			if !moved {
				return
			}
		}
	}
}

// CommitAll commits every file with uncommitted content (used at unmount, after
// the kernel has let go of the mount). A file whose staged content an
// earlier failure dropped has nothing to commit: its committed version
// stands, and the loss was its writers' to hear (at their next write, fsync
// or close, or at the RELEASE that may still be on its way when the mount
// goes). It is logged, not reported as a failure of the unmount.
func (f *FS) CommitAll(ctx context.Context) error {
	f.pending.Wait()
	var first error
	for _, n := range f.pinnedFiles() { // open files, and closed ones a commit failed for
		err := n.commit(ctx)
		switch {
		case errors.Is(err, errStagedLost):
			f.log.Printf("%s: %v (its committed version stays)", n.nameNow(), err)
		case err != nil && first == nil:
			first = err
		}
	}
	return first
}
