package powerloss

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// cacheTimeout is how long the kernel may keep entries and attributes: every
// change goes through the mount, and a crash is followed by a new mount.
const cacheTimeout = 10 * time.Second

// Server is a disk mounted at a directory.
type Server struct {
	dir  string
	srv  *fuse.Server
	done chan struct{}
}

// Mount serves d at dir (root only: mount(2) directly).
func Mount(d *Disk, dir string) (*Server, error) {
	fsys := &rawFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), d: d, dirs: map[uint64][]fuse.DirEntry{}}
	srv, err := fuse.NewServer(fsys, dir, &fuse.MountOptions{
		DirectMountStrict:  true,
		FsName:             "powerloss",
		Name:               "powerloss",
		MaxWrite:           1 << 20,
		DisableXAttrs:      true,
		DisableReadDirPlus: true,
	})
	if err != nil {
		return nil, fmt.Errorf("mount powerloss disk at %s: %w", dir, err)
	}
	s := &Server{dir: dir, srv: srv, done: make(chan struct{})}
	go func() {
		srv.Serve()
		close(s.done)
	}()
	if err := srv.WaitMount(); err != nil {
		s.Unmount()
		return nil, fmt.Errorf("mount powerloss disk at %s: %w", dir, err)
	}
	return s, nil
}

// Unmount takes the disk off its directory. Users still holding files (a
// daemon being killed) get the mount detached, and the server stops when
// they let go.
func (s *Server) Unmount() error {
	if err := syscall.Unmount(s.dir, 0); err != nil {
		if err := syscall.Unmount(s.dir, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("unmount %s: %w", s.dir, err)
		}
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("unmount %s: the server did not stop", s.dir)
	}
}

// rawFS answers FUSE requests from a Disk. Node IDs are inode numbers.
type rawFS struct {
	fuse.RawFileSystem
	d *Disk

	fh   atomic.Uint64
	mu   sync.Mutex
	dirs map[uint64][]fuse.DirEntry // open directory handles: their listings
}

func status(errno syscall.Errno) fuse.Status { return fuse.Status(errno) }

func fillAttr(a Attr, out *fuse.Attr) {
	out.Ino = a.Ino
	out.Size = a.Size
	out.Blocks = (a.Size + 511) / 512
	out.Blksize = 4096
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.Uid, a.Gid
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
}

func fillEntry(a Attr, out *fuse.EntryOut) {
	out.NodeId = a.Ino
	out.SetEntryTimeout(cacheTimeout)
	out.SetAttrTimeout(cacheTimeout)
	fillAttr(a, &out.Attr)
}

func (f *rawFS) String() string { return "powerloss" }

func (f *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	a, errno := f.d.Lookup(h.NodeId, name)
	if errno != 0 {
		return status(errno)
	}
	fillEntry(a, out)
	return fuse.OK
}

func (f *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	a, errno := f.d.GetAttr(in.NodeId)
	if errno != 0 {
		return status(errno)
	}
	out.SetTimeout(cacheTimeout)
	fillAttr(a, &out.Attr)
	return fuse.OK
}

func (f *rawFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	var s SetAttrs
	if m, ok := in.GetMode(); ok {
		s.Mode = &m
	}
	if u, ok := in.GetUID(); ok {
		s.Uid = &u
	}
	if g, ok := in.GetGID(); ok {
		s.Gid = &g
	}
	if sz, ok := in.GetSize(); ok {
		s.Size = &sz
	}
	if t, ok := in.GetATime(); ok {
		s.Atime = &t
	}
	if t, ok := in.GetMTime(); ok {
		s.Mtime = &t
	}
	a, errno := f.d.SetAttr(in.NodeId, s)
	if errno != 0 {
		return status(errno)
	}
	out.SetTimeout(cacheTimeout)
	fillAttr(a, &out.Attr)
	return fuse.OK
}

func (f *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	switch in.Mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFSOCK, syscall.S_IFIFO:
	default:
		return fuse.EPERM // no devices
	}
	a, errno := f.d.Create(in.NodeId, name, in.Mode, in.Uid, in.Gid, true, false)
	if errno != 0 {
		return status(errno)
	}
	fillEntry(a, out)
	return fuse.OK
}

func (f *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	a, errno := f.d.Mkdir(in.NodeId, name, in.Mode, in.Uid, in.Gid)
	if errno != 0 {
		return status(errno)
	}
	fillEntry(a, out)
	return fuse.OK
}

func (f *rawFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return status(f.d.Unlink(h.NodeId, name))
}

func (f *rawFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return status(f.d.Rmdir(h.NodeId, name))
}

func (f *rawFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return status(f.d.Rename(in.NodeId, oldName, in.Newdir, newName, in.Flags))
}

func (f *rawFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EPERM
}

func (f *rawFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	a, errno := f.d.Symlink(h.NodeId, name, target, h.Uid, h.Gid)
	if errno != 0 {
		return status(errno)
	}
	fillEntry(a, out)
	return fuse.OK
}

func (f *rawFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	b, errno := f.d.Readlink(h.NodeId)
	return b, status(errno)
}

func (f *rawFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	return status(f.d.Check(in.NodeId))
}

func (f *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	a, errno := f.d.Create(in.NodeId, name, syscall.S_IFREG|in.Mode&0o7777, in.Uid, in.Gid,
		in.Flags&syscall.O_EXCL != 0, in.Flags&syscall.O_TRUNC != 0)
	if errno != 0 {
		return status(errno)
	}
	fillEntry(a, &out.EntryOut)
	out.Fh = f.fh.Add(1)
	return fuse.OK
}

func (f *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.Flags&syscall.O_TRUNC != 0 {
		zero := uint64(0)
		if _, errno := f.d.SetAttr(in.NodeId, SetAttrs{Size: &zero}); errno != 0 {
			return status(errno)
		}
	} else if errno := f.d.Check(in.NodeId); errno != 0 {
		return status(errno)
	}
	out.Fh = f.fh.Add(1)
	return fuse.OK
}

func (f *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	b, errno := f.d.Read(in.NodeId, int64(in.Offset), int(in.Size))
	if errno != 0 {
		return nil, status(errno)
	}
	return fuse.ReadResultData(b), fuse.OK
}

func (f *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if errno := f.d.Write(in.NodeId, int64(in.Offset), data); errno != 0 {
		return 0, status(errno)
	}
	return uint32(len(data)), fuse.OK
}

func (f *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return status(f.d.Check(in.NodeId))
}

func (f *rawFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {}

func (f *rawFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return status(f.d.Sync(in.NodeId))
}

func (f *rawFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return status(f.d.Sync(in.NodeId))
}

func (f *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	ents, errno := f.d.ReadDir(in.NodeId)
	if errno != 0 {
		return status(errno)
	}
	list := make([]fuse.DirEntry, 0, len(ents)+2)
	list = append(list, fuse.DirEntry{Name: ".", Ino: in.NodeId, Mode: syscall.S_IFDIR},
		fuse.DirEntry{Name: "..", Ino: RootIno, Mode: syscall.S_IFDIR})
	for _, e := range ents {
		list = append(list, fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode})
	}
	for i := range list {
		list[i].Off = uint64(i + 1)
	}
	out.Fh = f.fh.Add(1)
	f.mu.Lock()
	f.dirs[out.Fh] = list
	f.mu.Unlock()
	return fuse.OK
}

func (f *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if errno := f.d.Check(in.NodeId); errno != 0 {
		return status(errno)
	}
	f.mu.Lock()
	list := f.dirs[in.Fh]
	f.mu.Unlock()
	for i := int(in.Offset); i < len(list); i++ {
		if !out.AddDirEntry(list[i]) {
			break
		}
	}
	return fuse.OK
}

func (f *rawFS) ReleaseDir(in *fuse.ReleaseIn) {
	f.mu.Lock()
	delete(f.dirs, in.Fh)
	f.mu.Unlock()
}

func (f *rawFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	if errno := f.d.Check(RootIno); errno != 0 {
		return status(errno)
	}
	*out = fuse.StatfsOut{Blocks: 1 << 24, Bfree: 1 << 23, Bavail: 1 << 23, Files: 1 << 20, Ffree: 1 << 19,
		Bsize: 4096, Frsize: 4096, NameLen: 255}
	return fuse.OK
}
