package fusefs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirNode is a directory. Its attr is guarded by fsys.nsMu and fsys.viewMu
// (changed holding both, read holding either).
type dirNode struct {
	nodeBase
	// subdirs counts the subdirectories, for the link count, once
	// subdirsKnown (nlink); guarded like attr.
	subdirs      int
	subdirsKnown bool
}

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeTmpfiler  = (*dirNode)(nil)
	_ fs.NodeSymlinker = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeLinker    = (*dirNode)(nil)
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
	_ fs.NodeFsyncer   = (*dirNode)(nil)
	_ fs.NodeOnAdder   = (*dirNode)(nil)
)

// OnAdd adds the virtual .ckptfs directory under the root.
func (d *dirNode) OnAdd(ctx context.Context) {
	if !d.IsRoot() {
		return
	}
	ctl := &ctlDir{fsys: d.fsys}
	ctlInode := d.NewPersistentInode(ctx, ctl, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: ctlIno})
	d.AddChild(ctlName, ctlInode, false)
	stats := d.NewPersistentInode(ctx, &statsFile{fsys: d.fsys}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: statsIno})
	ctlInode.AddChild(statsName, stats, false)
	manifests := d.NewPersistentInode(ctx, &manifestsDir{fsys: d.fsys}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: manifestsIno})
	ctlInode.AddChild(manifestsName, manifests, false)
}

// ino returns d's inode number.
func (d *dirNode) ino() uint64 {
	d.fsys.viewMu.RLock()
	defer d.fsys.viewMu.RUnlock()
	return d.attr.Ino
}

// child returns the node named name in d, or nil: the tree's node, which
// the kernel has looked up (or a new file not committed yet), else the
// catalog's. A node from the catalog is not in the tree: Lookup adds it, a
// namespace change acts on it in the catalog only.
func (d *dirNode) child(name string) (fs.InodeEmbedder, error) {
	if ch := d.GetChild(name); ch != nil {
		return ch.Operations(), nil
	}
	return d.fromCatalog(name)
}

// maxStaleReads bounds how often fromCatalog reads an entry again because a
// file was unpinned meanwhile.
const maxStaleReads = 8

// fromCatalog returns the node the catalog has at d/name, or nil: a pinned
// file's node (its state is more than its record), else a new node built
// from the record.
func (d *dirNode) fromCatalog(name string) (fs.InodeEmbedder, error) {
	dir := d.ino()
	for try := 0; ; try++ {
		epoch := d.fsys.pinEpoch()
		var rec cas.Node
		found := false
		err := d.fsys.store.View(func(tx *cas.Tx) error {
			ino, ok := tx.Lookup(dir, name)
			if !ok {
				return nil
			}
			r, ok, err := tx.Node(ino)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("directory %d entry %q names missing node %d", dir, name, ino)
			}
			rec, found = r, true
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("look up %q in directory %d: %w", name, dir, err)
		}
		if !found {
			return nil, nil
		}
		if rec.IsRegular() {
			n, stale := d.fsys.pinnedFile(rec.Ino, epoch)
			if n != nil && !n.unlinked.Load() {
				return n, nil
			}
			if stale && try < maxStaleReads {
				continue // a commit may have changed the record since it was read
			}
		}
		return d.fsys.nodeFor(rec, d, name), nil
	}
}

// nodeFor builds the node of a catalog record found at dir/name.
func (f *FS) nodeFor(rec cas.Node, dir *dirNode, name string) fs.InodeEmbedder {
	switch {
	case rec.IsDir():
		return &dirNode{nodeBase: nodeBase{fsys: f, attr: rec}}
	case rec.IsSymlink():
		n := &symlinkNode{nodeBase: nodeBase{fsys: f, attr: rec}}
		n.nlink.Store(rec.Nlink)
		return n
	case rec.IsSpecial():
		n := &specialNode{nodeBase: nodeBase{fsys: f, attr: rec}, typ: rec.Mode & syscall.S_IFMT}
		n.nlink.Store(rec.Nlink)
		return n
	default:
		n := &fileNode{nodeBase: nodeBase{fsys: f, attr: rec}, persisted: true, dir: dir, name: name, committedSize: rec.Size}
		n.nlink.Store(rec.Nlink)
		return n
	}
}

// empty reports whether d has no entries, in the tree or the catalog.
func (d *dirNode) empty() (bool, error) {
	if len(d.Children()) > 0 {
		return false, nil
	}
	empty := true
	err := d.fsys.store.View(func(tx *cas.Tx) error {
		return tx.Children(d.ino(), func(string, uint64) error {
			empty = false
			return errStopWalk{}
		})
	})
	if err != nil && !errors.Is(err, errStopWalk{}) {
		return false, err
	}
	return empty, nil
}

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if len(name) > maxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	// Not nsMu: a lookup must not wait for a namespace change's (or a
	// commit's) catalog transaction. The inode tree has its own lock.
	child := d.GetChild(name)
	if child == nil {
		n, err := d.fromCatalog(name)
		if err != nil {
			return nil, d.fsys.toErrno("lookup", err)
		}
		if n == nil {
			return nil, syscall.ENOENT
		}
		// A pinned file that go-fuse dropped keeps its inode (and node ID).
		child = d.NewInode(ctx, n, fs.StableAttr{Mode: modeOf(n), Ino: inoOf(n)})
	}
	d.fsys.listNode(child.Operations())
	if ga, ok := child.Operations().(fs.NodeGetattrer); ok {
		var a fuse.AttrOut
		if errno := ga.Getattr(ctx, nil, &a); errno != 0 {
			return nil, errno
		}
		out.Attr = a.Attr
	}
	return child, 0
}

// Readdir lists the catalog's entries, with the tree's node in place of the
// catalog's where it has one (a file that replaced a committed one and is not
// committed yet), and the tree's entries the catalog does not have yet.
func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	tree := d.Children()
	dir := d.ino()
	// "." and "..", as a local filesystem lists them (ls -a); go-fuse makes
	// no node of them, and the kernel ignores their attributes.
	up := dir
	if _, parent := d.EmbeddedInode().Parent(); parent != nil {
		up = parent.StableAttr().Ino
	}
	ents := []fuse.DirEntry{{Name: ".", Mode: syscall.S_IFDIR, Ino: dir}, {Name: "..", Mode: syscall.S_IFDIR, Ino: up}}
	err := d.fsys.store.View(func(tx *cas.Tx) error {
		return tx.Children(dir, func(name string, ino uint64) error {
			if ch, ok := tree[name]; ok {
				delete(tree, name)
				ents = append(ents, fuse.DirEntry{Name: name, Mode: ch.StableAttr().Mode, Ino: ch.StableAttr().Ino})
				return nil
			}
			rec, ok, err := tx.Node(ino)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("directory %d entry %q names missing node %d", dir, name, ino)
			}
			ents = append(ents, fuse.DirEntry{Name: name, Mode: rec.Mode & syscall.S_IFMT, Ino: ino})
			return nil
		})
	})
	if err != nil {
		return nil, d.fsys.toErrno("readdir", fmt.Errorf("read directory %d: %w", dir, err))
	}
	for name, ch := range tree {
		ents = append(ents, fuse.DirEntry{Name: name, Mode: ch.StableAttr().Mode, Ino: ch.StableAttr().Ino})
	}
	return fs.NewListDirStream(ents), 0
}

func (d *dirNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fsys.viewMu.RLock()
	nlink, known := d.cachedNlink()
	if known {
		fillAttr(&out.Attr, &d.attr, nlink)
	}
	d.fsys.viewMu.RUnlock()
	if known {
		return 0
	}
	// The first time only: the count is read from the catalog under nsMu,
	// so that no mkdir, rmdir or rename runs meanwhile.
	d.fsys.lockNS()
	defer d.fsys.nsMu.Unlock()
	nlink, err := d.nlink()
	if err != nil {
		return d.fsys.toErrno("getattr", err)
	}
	fillAttr(&out.Attr, &d.attr, nlink)
	return 0
}

func (d *dirNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	d.fsys.lockNS()
	nlink, err := d.nlink()
	d.fsys.nsMu.Unlock()
	if err != nil {
		return d.fsys.toErrno("setattr", err)
	}
	return d.fsys.setattrNS(&d.attr, in, out, nlink)
}

// setattrNS applies a mode, owner or time change to a directory's or a
// symlink's attributes (guarded by nsMu) and persists them.
func (f *FS) setattrNS(attr *cas.Node, in *fuse.SetAttrIn, out *fuse.AttrOut, nlink uint32) syscall.Errno {
	f.lockNS()
	defer f.nsMu.Unlock()
	rec := *attr
	applySetattr(&rec, in, time.Now().UnixNano())
	if err := f.store.Update(func(tx *cas.Tx) error { return tx.PutNode(rec) }); err != nil {
		return f.toErrno("setattr", err)
	}
	f.setView(func() { *attr = rec })
	fillAttr(&out.Attr, attr, nlink)
	return 0
}

// Fsync of a directory: every namespace change is already durable.
func (d *dirNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.fsys.store.Dir(), &st); err != nil {
		return fs.ToErrno(err)
	}
	out.Blocks = st.Blocks
	out.Bfree = st.Bfree
	out.Bavail = st.Bavail
	out.Files = st.Files
	out.Ffree = st.Ffree
	out.Bsize = uint32(st.Bsize)
	out.Frsize = uint32(st.Frsize)
	out.NameLen = maxNameLen
	return 0
}

// touch sets d's mtime and ctime to now (nsMu held); the caller persists d.attr.
func (d *dirNode) touch(now int64) {
	d.fsys.setView(func() { d.attr.Mtime, d.attr.Ctime = now, now })
}

// addNode persists a new directory, symlink or special file record at
// d/name (or an empty regular file's, for mknod).
func (d *dirNode) addNode(ctx context.Context, name string, rec cas.Node) (*fs.Inode, syscall.Errno) {
	if len(name) > maxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	d.fsys.lockNS()
	defer d.fsys.nsMu.Unlock()
	if existing, err := d.child(name); err != nil {
		return nil, d.fsys.toErrno("create", err)
	} else if existing != nil {
		return nil, syscall.EEXIST
	}
	ino, err := d.fsys.store.AllocIno()
	if err != nil {
		return nil, d.fsys.toErrno("create", err)
	}
	rec.Ino = ino
	rec.UID, rec.GID = callerOwner(ctx)
	now := time.Now().UnixNano()
	rec.Atime, rec.Mtime, rec.Ctime = now, now, now
	parent := d.attr
	parent.Mtime, parent.Ctime = now, now
	err = d.fsys.store.Update(func(tx *cas.Tx) error {
		if err := tx.PutNode(rec); err != nil {
			return err
		}
		if rec.IsRegular() { // mknod(2) of a regular file: committed, empty
			if err := tx.PutManifest(ino, &cas.Manifest{}); err != nil {
				return err
			}
		}
		if err := tx.PutNode(parent); err != nil {
			return err
		}
		return tx.Link(d.attr.Ino, name, ino)
	})
	if err != nil {
		return nil, d.fsys.toErrno("create", err)
	}
	d.fsys.setView(func() { d.attr = parent })
	child := d.fsys.nodeFor(rec, d, name)
	if cd, ok := child.(*dirNode); ok {
		d.fsys.setView(func() { cd.subdirsKnown = true })
		d.addSubdirs(+1)
	}
	d.fsys.listNode(child)
	return d.NewInode(ctx, child, fs.StableAttr{Mode: rec.Mode & syscall.S_IFMT, Ino: ino}), 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := d.addNode(ctx, name, cas.Node{Mode: syscall.S_IFDIR | mode&0o7777})
	if errno != 0 {
		return nil, errno
	}
	d.fsys.lockNS()
	fillAttr(&out.Attr, &ch.Operations().(*dirNode).attr, 2) // no subdirectory yet
	d.fsys.nsMu.Unlock()
	return ch, 0
}

func (d *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := d.addNode(ctx, name, cas.Node{Mode: syscall.S_IFLNK | 0o777, Target: target, Size: int64(len(target))})
	if errno != 0 {
		return nil, errno
	}
	d.fsys.lockNS()
	fillAttr(&out.Attr, &ch.Operations().(*symlinkNode).attr, 1)
	d.fsys.nsMu.Unlock()
	return ch, 0
}

// Create makes a new, empty, uncommitted file: it enters the catalog at its
// first commit (the close of this handle at the latest).
func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if len(name) > maxNameLen {
		return nil, nil, 0, syscall.ENAMETOOLONG
	}
	d.fsys.nsMu.Lock()
	defer d.fsys.nsMu.Unlock()
	if existing, err := d.child(name); err != nil {
		return nil, nil, 0, d.fsys.toErrno("create", err)
	} else if existing != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	ino, err := d.fsys.store.AllocIno()
	if err != nil {
		return nil, nil, 0, d.fsys.toErrno("create", err)
	}
	n := d.fsys.newFile(ctx, ino, mode)
	n.dir, n.name = d, name
	n.dirty = true // an empty new file is content to commit too
	d.touch(n.attr.Ctime)
	// Persistent until its first commit (commitDirty): until then the
	// catalog does not have the name (or has the file it will replace), so
	// the tree must keep it even if the kernel forgets it.
	// n.mu is not taken (nsMu is held, and comes after it): no other
	// goroutine can reach n yet.
	fh, fuseFlags, err := n.openLocked(ctx, flags)
	if err != nil { // not for a new file: it holds its (empty) manifest
		return nil, nil, 0, d.fsys.toErrno("create", err)
	}
	inode := d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino})
	d.fsys.listNode(n)
	fh.creator = true
	fillAttr(&out.Attr, &n.attr, 1)
	return inode, fh, fuseFlags, 0
}

// newFile returns an empty regular file owned by the caller, with no name yet.
func (f *FS) newFile(ctx context.Context, ino uint64, mode uint32) *fileNode {
	now := time.Now().UnixNano()
	uid, gid := callerOwner(ctx)
	return &fileNode{
		nodeBase: nodeBase{fsys: f, attr: cas.Node{
			Ino: ino, Mode: syscall.S_IFREG | mode&0o7777, UID: uid, GID: gid,
			Atime: now, Mtime: now, Ctime: now,
		}},
		manifest: &cas.Manifest{},
	}
}

// Tmpfile makes a file in no directory (O_TMPFILE). It lives in memory and the
// spool only: it has no catalog record, so linking it is refused (ENOENT)
// and it can never get a name.
func (d *dirNode) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ino, err := d.fsys.store.AllocIno()
	if err != nil {
		return nil, nil, 0, d.fsys.toErrno("tmpfile", err)
	}
	n := d.fsys.newFile(ctx, ino, mode)
	n.unlinked.Store(true)
	fh, fuseFlags, err := n.openHandle(ctx, flags)
	if err != nil { // not for a new file: it holds its (empty) manifest
		return nil, nil, 0, d.fsys.toErrno("tmpfile", err)
	}
	inode := d.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino})
	d.fsys.listNode(n)
	fillAttr(&out.Attr, &n.attr, 0)
	return inode, fh, fuseFlags, 0
}

func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	d.fsys.lockNS()
	defer d.fsys.nsMu.Unlock()
	child, err := d.child(name)
	if err != nil {
		return d.fsys.toErrno("unlink", err)
	}
	if child == nil {
		return syscall.ENOENT
	}
	switch child.(type) {
	case *dirNode, *ctlDir:
		return syscall.EISDIR
	case *statsFile:
		return syscall.EROFS
	}
	now := time.Now().UnixNano()
	parent := d.attr
	parent.Mtime, parent.Ctime = now, now
	var left uint32
	err = d.fsys.store.Update(func(tx *cas.Tx) error {
		var err error
		if left, err = removeEntry(tx, d.attr.Ino, name, child, now, nil); err != nil {
			return err
		}
		return tx.PutNode(parent)
	})
	if err != nil {
		return d.fsys.toErrno("unlink", err)
	}
	d.fsys.setView(func() { d.attr = parent })
	d.dropName(name, child, left, now)
	return 0
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	d.fsys.lockNS()
	defer d.fsys.nsMu.Unlock()
	child, err := d.child(name)
	if err != nil {
		return d.fsys.toErrno("rmdir", err)
	}
	if child == nil {
		return syscall.ENOENT
	}
	cd, ok := child.(*dirNode)
	if !ok {
		if _, ctl := child.(*ctlDir); ctl {
			return syscall.EROFS
		}
		return syscall.ENOTDIR
	}
	if empty, err := cd.empty(); err != nil {
		return d.fsys.toErrno("rmdir", err)
	} else if !empty {
		return syscall.ENOTEMPTY
	}
	now := time.Now().UnixNano()
	parent := d.attr
	parent.Mtime, parent.Ctime = now, now
	err = d.fsys.store.Update(func(tx *cas.Tx) error {
		if _, err := removeEntry(tx, d.attr.Ino, name, cd, now, nil); err != nil {
			return err
		}
		return tx.PutNode(parent)
	})
	if err != nil {
		return d.fsys.toErrno("rmdir", err)
	}
	d.fsys.setView(func() { d.attr = parent })
	d.addSubdirs(-1)
	detach(cd)
	return 0
}

// removeEntry deletes from the catalog what the entry parent/name holds for
// node n: its record if it is persisted, or the committed file it shadows;
// a node with other names (hard links) loses one, and its ctime is now. A
// file's content that goes with its last name takes its waiting delta plans
// with it, but for the chunks of keep (the content renamed over it; nil:
// none): forgetWaits. It returns the names n has left. nsMu held.
func removeEntry(tx *cas.Tx, parent uint64, name string, n fs.InodeEmbedder, now int64, keep *cas.Manifest) (uint32, error) {
	var ino uint64
	switch n := n.(type) {
	case *fileNode:
		if n.persisted {
			ino = n.attr.Ino
		} else {
			ino = n.shadow
		}
	case *dirNode:
		ino = n.attr.Ino
	case *symlinkNode:
		ino = n.attr.Ino
	case *specialNode:
		ino = n.attr.Ino
	}
	if ino == 0 {
		return 0, nil
	}
	if err := tx.Unlink(parent, name); err != nil {
		return 0, err
	}
	if _, ok := n.(*fileNode); ok {
		if err := forgetWaits(tx, ino, keep); err != nil {
			return 0, err
		}
	}
	left, err := tx.DropLink(ino, now)
	if f, ok := n.(*fileNode); ok && !f.persisted {
		return 0, err // the shadow's other names are not n's
	}
	return left, err
}

// detach marks a node that no longer has a name (nsMu held), and lets go-fuse
// drop its inode once the kernel forgets it (a new file's inode is persistent
// until its first commit). A node read from the catalog and never looked up
// has no inode yet.
func detach(n fs.InodeEmbedder) {
	if f, ok := n.(*fileNode); ok {
		f.persisted = false
		f.shadow = 0
		f.unlinked.Store(true)
	}
	if inTree(n) {
		n.EmbeddedInode().ForgetPersistent()
	}
}

// inTree reports whether n's inode was made (NewInode), so that go-fuse knows
// it, or has known it.
func inTree(n fs.InodeEmbedder) bool { return n.EmbeddedInode().StableAttr().Ino != 0 }

func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if len(newName) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	if flags&^uint32(renameNoReplace) != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported
	}
	np, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EROFS // into .ckptfs
	}
	if h := d.fsys.renameHook; h != nil {
		defer h() // after nsMu is released, before go-fuse moves the inode
	}
	d.fsys.lockNS()
	defer d.fsys.nsMu.Unlock()
	src, err := d.child(name)
	if err != nil {
		return d.fsys.toErrno("rename", err)
	}
	if src == nil {
		return syscall.ENOENT
	}
	switch src.(type) {
	case *ctlDir, *statsFile:
		return syscall.EROFS
	}
	_, srcIsDir := src.(*dirNode)
	dst, err := np.child(newName)
	if err != nil {
		return d.fsys.toErrno("rename", err)
	}
	if dst != nil {
		if dst == src || inoOf(dst) == inoOf(src) {
			return 0
		}
		if errno := d.mayReplace(dst, srcIsDir, flags); errno != 0 {
			return errno
		}
	}

	now := time.Now().UnixNano()
	oldParent, newParentRec := d.attr, np.attr
	oldParent.Mtime, oldParent.Ctime = now, now
	newParentRec.Mtime, newParentRec.Ctime = now, now

	srcFile, _ := src.(*fileNode)
	var newShadow uint64
	var dstLeft uint32 // the names dst has left
	err = d.fsys.store.Update(func(tx *cas.Tx) error {
		moved, err := d.movedFiles(tx, src, name, dst)
		if err != nil {
			return err
		}
		if newShadow, dstLeft, err = d.renameEntries(tx, name, src, np, newName, dst, now); err != nil {
			return err
		}
		if err := tx.PutNode(oldParent); err != nil {
			return err
		}
		if np != d {
			if err := tx.PutNode(newParentRec); err != nil {
				return err
			}
		}
		return d.releaseMoved(tx, moved, src, name, np, newName)
	})
	if err != nil {
		return d.fsys.toErrno("rename", err)
	}
	d.fsys.setView(func() {
		d.attr = oldParent
		if np != d {
			np.attr = newParentRec
		}
	})
	if srcIsDir {
		d.addSubdirs(-1)
		np.addSubdirs(+1)
		if _, dstIsDir := dst.(*dirNode); dstIsDir {
			np.addSubdirs(-1)
		}
	}
	if dst != nil {
		np.dropName(newName, dst, dstLeft, now)
	}
	if srcFile != nil {
		srcFile.dir, srcFile.name = np, newName
		if !srcFile.persisted {
			srcFile.shadow = newShadow
		}
	}
	return 0
}

// renameEntries moves the catalog's entries for Rename (nsMu held): it
// returns what the catalog will hold at the destination once a source not
// in the catalog yet commits (newShadow), and the names dst has left.
func (d *dirNode) renameEntries(tx *cas.Tx, name string, src fs.InodeEmbedder, np *dirNode, newName string, dst fs.InodeEmbedder, now int64) (newShadow uint64, dstLeft uint32, err error) {
	srcFile, _ := src.(*fileNode)
	dstFile, _ := dst.(*fileNode)
	if srcFile == nil || srcFile.persisted {
		if dst != nil {
			var keep *cas.Manifest // the content that takes dst's place
			if _, isFile := dst.(*fileNode); isFile && srcFile != nil && tx.Deltas().Waiting() {
				if keep, _, err = tx.Manifest(inoOf(src)); err != nil {
					return 0, 0, err
				}
			}
			if dstLeft, err = removeEntry(tx, np.attr.Ino, newName, dst, now, keep); err != nil {
				return 0, 0, err
			}
		}
		if err := tx.Unlink(d.attr.Ino, name); err != nil {
			return 0, 0, err
		}
		if err := tx.Link(np.attr.Ino, newName, inoOf(src)); err != nil {
			return 0, 0, err
		}
		// When the path got its name, which neither node's record says
		// (the remote tier's stamp of the moved path: catalog/linked.go).
		return 0, dstLeft, tx.SetLinked(np.attr.Ino, newName, inoOf(src), now)
	}
	// Not in the catalog yet: the old name loses what it shadowed, and the
	// destination's committed content stays until the source commits,
	// unless it has other names (which keep it anyway).
	if srcFile.shadow != 0 {
		if err := tx.Unlink(d.attr.Ino, name); err != nil {
			return 0, 0, err
		}
		if err := forgetWaits(tx, srcFile.shadow, nil); err != nil {
			return 0, 0, err
		}
		if _, err := tx.DropLink(srcFile.shadow, now); err != nil {
			return 0, 0, err
		}
	}
	switch {
	case dstFile != nil && !dstFile.persisted:
		return dstFile.shadow, 0, nil
	case dst != nil && linksOf(dst) > 1:
		dstLeft, err = removeEntry(tx, np.attr.Ino, newName, dst, now, nil) // its other names keep its content
		return 0, dstLeft, err
	case dst != nil:
		return inoOf(dst), 0, nil
	}
	return 0, 0, nil
}

// mayReplace reports why a rename of a directory (srcIsDir) or another node
// may not replace dst, an existing other node, or 0 if it may (nsMu held).
func (d *dirNode) mayReplace(dst fs.InodeEmbedder, srcIsDir bool, flags uint32) syscall.Errno {
	if flags&renameNoReplace != 0 {
		return syscall.EEXIST
	}
	switch dst := dst.(type) {
	case *ctlDir, *statsFile:
		return syscall.EROFS
	case *dirNode:
		if !srcIsDir {
			return syscall.EISDIR
		}
		if empty, err := dst.empty(); err != nil {
			return d.fsys.toErrno("rename", err)
		} else if !empty {
			return syscall.ENOTEMPTY
		}
	default:
		if srcIsDir {
			return syscall.ENOTDIR
		}
	}
	return 0
}

// modeOf returns the file type bits of a node.
func modeOf(n fs.InodeEmbedder) uint32 {
	switch n := n.(type) {
	case *dirNode:
		return syscall.S_IFDIR
	case *symlinkNode:
		return syscall.S_IFLNK
	case *specialNode:
		return n.typ
	}
	return syscall.S_IFREG
}

// linksOf returns the names of a node that is not a directory (nsMu held).
func linksOf(n fs.InodeEmbedder) uint32 {
	switch n := n.(type) {
	case *fileNode:
		return n.links()
	case *symlinkNode:
		return n.links()
	case *specialNode:
		return n.links()
	}
	return 1
}

func inoOf(n fs.InodeEmbedder) uint64 {
	switch n := n.(type) {
	case *fileNode:
		return n.attr.Ino // immutable after creation
	case *dirNode:
		return n.attr.Ino
	case *symlinkNode:
		return n.attr.Ino
	case *specialNode:
		return n.attr.Ino
	}
	return 0
}

// symlinkNode is a symbolic link; its attr is guarded like a dirNode's.
type symlinkNode struct {
	nodeBase
}

var (
	_ fs.NodeReadlinker = (*symlinkNode)(nil)
	_ fs.NodeGetattrer  = (*symlinkNode)(nil)
	_ fs.NodeSetattrer  = (*symlinkNode)(nil)
)

func (s *symlinkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	s.fsys.viewMu.RLock()
	defer s.fsys.viewMu.RUnlock()
	return []byte(s.attr.Target), 0
}

func (s *symlinkNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	s.fsys.viewMu.RLock()
	defer s.fsys.viewMu.RUnlock()
	fillAttr(&out.Attr, &s.attr, s.links())
	return 0
}

func (s *symlinkNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return syscall.EINVAL
	}
	return s.fsys.setattrNS(&s.attr, in, out, s.links())
}
