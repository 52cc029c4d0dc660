package fusefs

import (
	"context"
	"encoding/json"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// renameNoReplace is RENAME_NOREPLACE from <linux/fs.h>.
const renameNoReplace = 0x1

// ctlDir is the read-only virtual directory .ckptfs. Its children are added at
// mount (OnAdd of the root); it refuses every change with EROFS.
type ctlDir struct {
	fs.Inode
	fsys *FS
}

var (
	_ fs.NodeGetattrer = (*ctlDir)(nil)
	_ fs.NodeReaddirer = (*ctlDir)(nil)
	_ fs.NodeCreater   = (*ctlDir)(nil)
	_ fs.NodeMkdirer   = (*ctlDir)(nil)
	_ fs.NodeSymlinker = (*ctlDir)(nil)
	_ fs.NodeLinker    = (*ctlDir)(nil)
	_ fs.NodeUnlinker  = (*ctlDir)(nil)
	_ fs.NodeRmdirer   = (*ctlDir)(nil)
	_ fs.NodeRenamer   = (*ctlDir)(nil)
	_ fs.NodeSetattrer = (*ctlDir)(nil)
)

// ctlAttr fills the attributes every control file shares: the daemon's
// user and group own them (a user's mount showed them as root's) and their
// times are the mount's (they showed 1970).
func (f *FS) ctlAttr(out *fuse.Attr, mode uint32, nlink uint32) {
	out.Mode, out.Nlink = mode, nlink
	out.Uid, out.Gid = f.ctl.uid, f.ctl.gid
	out.Mtime, out.Ctime, out.Atime = f.ctl.time, f.ctl.time, f.ctl.time
}

func (c *ctlDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	c.fsys.ctlAttr(&out.Attr, syscall.S_IFDIR|0o555, 3) // and manifests/
	out.Ino = ctlIno
	return 0
}

// Readdir lists the control files, with "." and ".." as every directory.
func (c *ctlDir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	return fs.NewListDirStream([]fuse.DirEntry{
		{Name: ".", Mode: syscall.S_IFDIR, Ino: ctlIno},
		{Name: "..", Mode: syscall.S_IFDIR, Ino: c.fsys.root.attr.Ino},
		{Name: statsName, Mode: syscall.S_IFREG, Ino: statsIno},
		{Name: manifestsName, Mode: syscall.S_IFDIR, Ino: manifestsIno},
	}), 0
}

func (c *ctlDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (c *ctlDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (c *ctlDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (c *ctlDir) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (c *ctlDir) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EROFS }
func (c *ctlDir) Rmdir(ctx context.Context, name string) syscall.Errno  { return syscall.EROFS }

func (c *ctlDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EROFS
}

func (c *ctlDir) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

// statsFile is .ckptfs/stats.json: the store's statistics as a JSON object,
// generated anew for every open (each handle reads its own snapshot, with
// FOPEN_DIRECT_IO so the kernel neither caches it nor clips reads at a stale size).
type statsFile struct {
	fs.Inode
	fsys *FS
}

var (
	_ fs.NodeOpener    = (*statsFile)(nil)
	_ fs.NodeReader    = (*statsFile)(nil)
	_ fs.NodeGetattrer = (*statsFile)(nil)
	_ fs.NodeSetattrer = (*statsFile)(nil)
)

// statsHandle holds one open's snapshot.
type statsHandle struct {
	data []byte
}

func (s *statsFile) render() ([]byte, error) {
	st, err := s.fsys.Stats()
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(struct {
		cas.Stats
		Store string `json:"store"` // the store directory, for tools given the mountpoint
	}{st, s.fsys.store.Dir()}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (s *statsFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if isWrite(flags) || flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EROFS
	}
	data, err := s.render()
	if err != nil {
		return nil, 0, s.fsys.toErrno("stats", err)
	}
	return &statsHandle{data: data}, fuse.FOPEN_DIRECT_IO, 0
}

func (s *statsFile) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := f.(*statsHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	if off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.data[off:min(off+int64(len(dest)), int64(len(h.data)))]), 0
}

func (s *statsFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	size := 0
	if h, ok := f.(*statsHandle); ok {
		size = len(h.data)
	} else if data, err := s.render(); err == nil {
		size = len(data)
	}
	s.fsys.ctlAttr(&out.Attr, syscall.S_IFREG|0o444, 1)
	out.Ino = statsIno
	out.Size = uint64(size)
	now := uint64(time.Now().Unix())
	out.Mtime, out.Ctime, out.Atime = now, now, now
	// The size changes with every commit: never let the kernel cache it.
	out.SetTimeout(0)
	return 0
}

func (s *statsFile) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}
