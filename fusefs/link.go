package fusefs

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Link gives target (a file, symlink or special file; never a directory)
// one more name, d/name: a directory entry to the same catalog node, whose
// link count goes up, in one catalog transaction (see the package doc,
// Hard links).
func (d *dirNode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if len(name) > maxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	switch t := target.(type) {
	case *fileNode:
		return d.linkFile(ctx, t, name, out)
	case *symlinkNode, *specialNode:
		d.fsys.lockNS()
		defer d.fsys.nsMu.Unlock()
		return d.addLink(target, name, out)
	}
	return nil, syscall.EPERM // directories, and the nodes of .ckptfs
}

// maxLinkTries bounds how often linkFile settles a file that a writer
// keeps forking.
const maxLinkTries = 4

// linkFile links a regular file. The catalog must hold the node the new
// name names, so a file not committed yet is committed first (as fsync
// would); and a file with a new version staged in a fork has that version
// committed first, which takes the file's name: the link names the file as
// its name shows it, and a writer of it writes to both names. The file's mu
// is held across the catalog transaction, so that no fork starts meanwhile
// (a file with several names is changed in place: changeTarget).
func (d *dirNode) linkFile(ctx context.Context, t *fileNode, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	for try := 0; try < maxLinkTries; try++ {
		if f := t.dataNode(nil); f != t {
			replaced, committed, err := t.commitQuiet(ctx, nil)
			if err != nil {
				return nil, d.fsys.toErrno("link", err)
			}
			// The kernel holds the directory's lock while it waits for
			// this LINK: the entry is invalidated once it is answered.
			if replaced != nil {
				d.fsys.pending.Add(1)
				go func() {
					defer d.fsys.pending.Done()
					replaced()
				}()
			}
			if committed && d.fsys.afterCommit != nil {
				if err := d.fsys.afterCommit(ctx); err != nil {
					return nil, d.fsys.toErrno("link", err)
				}
			}
			t = f
			continue
		}
		d.fsys.lockNS()
		persisted := t.persisted
		d.fsys.nsMu.Unlock()
		if !persisted && !t.unlinked.Load() {
			if err := t.commit(ctx); err != nil {
				return nil, d.fsys.toErrno("link", err)
			}
		}
		t.mu.Lock()
		if t.fork != nil { // a writer forked it meanwhile
			t.mu.Unlock()
			continue
		}
		d.fsys.lockNS()
		var inode *fs.Inode
		errno := syscall.ENOENT // no name left (unlinked, O_TMPFILE)
		if t.persisted && !t.unlinked.Load() && t.origin == nil {
			inode, errno = d.addLink(t, name, out)
		}
		d.fsys.nsMu.Unlock()
		t.mu.Unlock()
		return inode, errno
	}
	return nil, syscall.EBUSY
}

// addLink adds the entry d/name to target's node in the catalog and counts
// it (nsMu held; for a file, its mu too).
func (d *dirNode) addLink(target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if existing, err := d.child(name); err != nil {
		return nil, d.fsys.toErrno("link", err)
	} else if existing != nil {
		return nil, syscall.EEXIST
	}
	ino := inoOf(target)
	now := time.Now().UnixNano()
	parent := d.attr
	parent.Mtime, parent.Ctime = now, now
	var count uint32
	err := d.fsys.store.Update(func(tx *cas.Tx) error {
		if _, ok, err := tx.Node(ino); err != nil {
			return err
		} else if !ok {
			return syscall.ENOENT // removed meanwhile
		}
		var err error
		if count, err = tx.AddLink(ino, now); err != nil {
			return err
		}
		if err := tx.Link(parent.Ino, name, ino); err != nil {
			return err
		}
		return tx.PutNode(parent)
	})
	if errors.Is(err, cas.ErrTooManyLinks) {
		return nil, syscall.EMLINK
	}
	if err != nil {
		return nil, d.fsys.toErrno("link", err)
	}
	d.fsys.setView(func() { d.attr = parent })
	switch t := target.(type) {
	case *fileNode:
		t.nlink.Store(count)
		t.setAttr(func(a *cas.Node) { a.Ctime = now })
		t.attrMu.Lock()
		t.fillAttr(&out.Attr)
		t.attrMu.Unlock()
	case *symlinkNode:
		d.fsys.setView(func() { t.attr.Ctime = now; t.nlink.Store(count) })
		fillAttr(&out.Attr, &t.attr, count)
	case *specialNode:
		d.fsys.setView(func() { t.attr.Ctime = now; t.nlink.Store(count) })
		fillAttr(&out.Attr, &t.attr, count)
	}
	return target.EmbeddedInode(), 0
}

// dropName notes that d/name no longer names n, which has left names
// (nsMu held): none, and n is detached; else its link count and ctime
// change, and a file that knew itself by that name forgets it (dir nil:
// it is changed in place from then on, see changeTarget).
func (d *dirNode) dropName(name string, n fs.InodeEmbedder, left uint32, now int64) {
	if left == 0 {
		detach(n)
		return
	}
	switch n := n.(type) {
	case *fileNode:
		n.nlink.Store(left)
		n.linkCtime.Store(now)
		if n.dir == d && n.name == name {
			n.dir = nil
		}
	case *symlinkNode:
		d.fsys.setView(func() { n.attr.Ctime = now; n.nlink.Store(left) })
	case *specialNode:
		d.fsys.setView(func() { n.attr.Ctime = now; n.nlink.Store(left) })
	}
}
