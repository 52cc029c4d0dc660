package fusefs

import (
	"context"
	"encoding/json"
	"strconv"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// manifestsIno is the inode number of .ckptfs/manifests (below cas.FirstIno).
const manifestsIno uint64 = 4

// ManifestJSON is what .ckptfs/manifests/<ino> holds: the committed manifest
// of the file with that inode number, for tools that inspect files without
// reading their data (ckptfs tensors, ckptfs diff).
type ManifestJSON struct {
	Ino    uint64      `json:"ino"`
	Size   int64       `json:"size"`
	Chunks []ChunkJSON `json:"chunks"`
	Holes  []HoleJSON  `json:"holes,omitempty"` // runs of zeros with no chunk (cas.Hole)
	Index  *FileIndex  `json:"index"`
}

// HoleJSON is one hole of a ManifestJSON: Len zero bytes just before chunk
// Before (after the last chunk when Before is len(Chunks)).
type HoleJSON struct {
	Before int   `json:"before"`
	Len    int64 `json:"len"`
}

// ChunkJSON is one chunk of a ManifestJSON.
type ChunkJSON struct {
	ID  string `json:"id"`
	Len uint32 `json:"len"`
}

// manifestsDir is .ckptfs/manifests: a directory that lists nothing but looks
// up any committed file's inode number.
type manifestsDir struct {
	fs.Inode
	fsys *FS
}

var (
	_ fs.NodeLookuper  = (*manifestsDir)(nil)
	_ fs.NodeGetattrer = (*manifestsDir)(nil)
	_ fs.NodeReaddirer = (*manifestsDir)(nil)
)

func (d *manifestsDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fsys.ctlAttr(&out.Attr, syscall.S_IFDIR|0o555, 2)
	out.Ino = manifestsIno
	return 0
}

func (d *manifestsDir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	return fs.NewListDirStream([]fuse.DirEntry{
		{Name: ".", Mode: syscall.S_IFDIR, Ino: manifestsIno},
		{Name: "..", Mode: syscall.S_IFDIR, Ino: ctlIno},
	}), 0
}

func (d *manifestsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	// A miss must not be cached as a negative entry (the bridge would give it
	// the mount's negative timeout): the file may commit a moment later. With a
	// non-zero entry timeout set, go-fuse returns ENOENT as an error, which the
	// kernel does not cache.
	out.SetEntryTimeout(time.Nanosecond)
	ino, err := strconv.ParseUint(name, 10, 64)
	if err != nil || ino < cas.FirstIno {
		return nil, syscall.ENOENT
	}
	data, errno := d.fsys.renderManifest(ino)
	if errno != 0 {
		return nil, errno
	}
	d.fsys.ctlAttr(&out.Attr, syscall.S_IFREG|0o444, 1)
	out.Size = uint64(len(data))
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	// Not persistent: the kernel forgets it, and so do we. The inode number
	// lives far above the catalog's so it never clashes with a real file's.
	f := &manifestFile{fsys: d.fsys, ino: ino}
	return d.NewInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino | 1<<62}), 0
}

// renderManifest returns the ManifestJSON of committed file ino.
func (f *FS) renderManifest(ino uint64) ([]byte, syscall.Errno) {
	var m *cas.Manifest
	var node cas.Node
	err := f.store.View(func(tx *cas.Tx) error {
		var ok bool
		var err error
		if node, ok, err = tx.Node(ino); err != nil || !ok || !node.IsRegular() {
			return err
		}
		m, _, err = tx.Manifest(ino)
		return err
	})
	if err != nil {
		return nil, f.toErrno("manifest", err)
	}
	if m == nil {
		return nil, syscall.ENOENT
	}
	ix, err := ParseFileIndex(m.Extra)
	if err != nil {
		return nil, f.toErrno("manifest", err)
	}
	out := ManifestJSON{Ino: ino, Size: m.Size(), Index: ix, Chunks: make([]ChunkJSON, len(m.Chunks))}
	for i, c := range m.Chunks {
		out.Chunks[i] = ChunkJSON{ID: c.ID.String(), Len: c.Len}
	}
	for _, h := range m.Holes {
		out.Holes = append(out.Holes, HoleJSON{Before: h.Before, Len: h.Len})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, f.toErrno("manifest", err)
	}
	return append(b, '\n'), 0
}

// manifestFile is one .ckptfs/manifests/<ino>, rendered at open.
type manifestFile struct {
	fs.Inode
	fsys *FS
	ino  uint64
}

var (
	_ fs.NodeOpener    = (*manifestFile)(nil)
	_ fs.NodeReader    = (*manifestFile)(nil)
	_ fs.NodeGetattrer = (*manifestFile)(nil)
)

func (f *manifestFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if isWrite(flags) {
		return nil, 0, syscall.EROFS
	}
	data, errno := f.fsys.renderManifest(f.ino)
	if errno != 0 {
		return nil, 0, errno
	}
	return &statsHandle{data: data}, fuse.FOPEN_DIRECT_IO, 0
}

func (f *manifestFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return (&statsFile{}).Read(ctx, fh, dest, off)
}

func (f *manifestFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.fsys.ctlAttr(&out.Attr, syscall.S_IFREG|0o444, 1)
	if h, ok := fh.(*statsHandle); ok {
		out.Size = uint64(len(h.data))
	} else if data, errno := f.fsys.renderManifest(f.ino); errno == 0 {
		out.Size = uint64(len(data))
	}
	out.SetTimeout(0)
	return 0
}
