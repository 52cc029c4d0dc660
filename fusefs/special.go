package fusefs

import (
	"context"
	"fmt"
	"syscall"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// specialNode is a FIFO, a UNIX socket or a character or block device: a
// catalog record (type, mode, rdev, owner, times) and no content. The kernel
// gives it its semantics (a pipe, a socket, the device's driver) and never
// sends ckptfs its opens, reads or writes. Its attr is guarded like a
// dirNode's.
type specialNode struct {
	nodeBase
	typ uint32 // the file type bits of attr.Mode, immutable
}

var (
	_ fs.NodeGetattrer = (*specialNode)(nil)
	_ fs.NodeSetattrer = (*specialNode)(nil)
	_ fs.NodeMknoder   = (*dirNode)(nil)
)

func (s *specialNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	s.fsys.viewMu.RLock()
	defer s.fsys.viewMu.RUnlock()
	fillAttr(&out.Attr, &s.attr, s.links())
	return 0
}

func (s *specialNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		// truncate(2) of a FIFO or device succeeds on ext4 and changes
		// nothing; there is no content to cut here either.
		in.Valid &^= fuse.FATTR_SIZE
	}
	return s.fsys.setattrNS(&s.attr, in, out, s.links())
}

// Mknod makes a FIFO, a socket (bind(2) of a UNIX socket) or a device node.
// A regular file made by mknod(2) is an empty, committed file.
func (d *dirNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	rec := cas.Node{Mode: mode}
	switch {
	case rec.IsSpecial():
		if rec.IsDevice() {
			rec.Rdev = dev
		}
	case rec.IsRegular():
		// an empty file: no manifest, like a committed empty file
	default:
		return nil, syscall.EINVAL
	}
	rec.Mode = mode&syscall.S_IFMT | mode&0o7777
	ch, errno := d.addNode(ctx, name, rec)
	if errno != 0 {
		return nil, errno
	}
	d.fsys.lockNS()
	switch n := ch.Operations().(type) {
	case *specialNode:
		fillAttr(&out.Attr, &n.attr, 1)
	case *fileNode:
		n.attrMu.Lock()
		fillAttr(&out.Attr, &n.attr, 1)
		n.attrMu.Unlock()
	}
	d.fsys.nsMu.Unlock()
	return ch, 0
}

// nlink returns d's link count as POSIX counts it: 2 (its entry in its parent,
// and its own ".") plus one for each subdirectory's "..". The root also counts
// the virtual .ckptfs. nsMu held. The count is read from the catalog the first
// time and kept up to date by mkdir, rmdir and rename (dirNode.subdirs).
func (d *dirNode) nlink() (uint32, error) {
	if !d.subdirsKnown {
		n, err := d.countSubdirs()
		if err != nil {
			return 0, err
		}
		d.fsys.setView(func() { d.subdirs, d.subdirsKnown = n, true })
	}
	return 2 + uint32(d.subdirs), nil
}

// cachedNlink returns d's link count if it is known (viewMu or nsMu held).
func (d *dirNode) cachedNlink() (uint32, bool) {
	return 2 + uint32(d.subdirs), d.subdirsKnown
}

// addSubdirs changes d's count of subdirectories by delta, if it is known
// (nsMu held).
func (d *dirNode) addSubdirs(delta int) {
	if d.subdirsKnown {
		d.fsys.setView(func() { d.subdirs += delta })
	}
}

// countSubdirs counts d's subdirectories in the catalog, where every
// directory is from its mkdir on (nsMu held).
func (d *dirNode) countSubdirs() (int, error) {
	n := 0
	if d.IsRoot() {
		n++ // .ckptfs
	}
	err := d.fsys.store.View(func(tx *cas.Tx) error {
		return tx.Children(d.attr.Ino, func(name string, ino uint64) error {
			rec, ok, err := tx.Node(ino)
			if err != nil {
				return err
			}
			if ok && rec.IsDir() {
				n++
			}
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("count the subdirectories of directory %d: %w", d.attr.Ino, err)
	}
	return n, nil
}
