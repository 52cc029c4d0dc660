// Command fusefloor mounts the thinnest FUSE filesystems there are, with the
// mount options ckptfs mounts with, so that make bench-scale can say what FUSE
// itself costs a small file on the machine it runs on, beside ckptfs and a
// plain directory:
//
//   - noop: files live in the daemon's memory and nothing is durable; a
//     create costs only its FUSE round trips (LOOKUP, CREATE, GETATTR of the
//     directory, WRITE, FLUSH, RELEASE) and the daemon's handling of them.
//     It is the ceiling of any FUSE filesystem's create rate here.
//   - loopback: go-fuse's loopback of a directory; an fsync in the mount is
//     an fsync of the file below. It is what the same durability costs the
//     simplest FUSE filesystem that has it. Where the kernel allows FUSE
//     passthrough (Linux 6.9 or later, root), go-fuse opens files with it,
//     so reads and writes go to the file below without the daemon: a floor
//     for creates (whose LOOKUP, CREATE, FLUSH, FSYNC and RELEASE still go
//     through the daemon), not for reads.
//   - read: one read-only file, "data", of -size random bytes held in the
//     daemon's memory and answered from it without a copy. A cold read of it
//     (page cache dropped) costs only FUSE: the READ round trips at the
//     mount's readahead and the copy into the page cache. It is the ceiling
//     of any FUSE filesystem's cold read here, with no disk and no check.
//
// Usage: fusefloor -mode noop|loopback|read [-backing DIR] [-size BYTES]
// MOUNTPOINT. It prints "serving" once the mount is live and unmounts on
// SIGTERM or SIGINT.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	mode := flag.String("mode", "noop", "noop (in memory) or loopback (of -backing)")
	backing := flag.String("backing", "", "with -mode loopback: the directory shown")
	size := flag.Int64("size", 1<<30, "with -mode read: the file's size in bytes")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: fusefloor -mode noop|loopback|read [-backing DIR] [-size BYTES] MOUNTPOINT")
		os.Exit(2)
	}
	if err := run(*mode, *backing, *size, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "fusefloor:", err)
		os.Exit(1)
	}
}

func run(mode, backing string, size int64, mnt string) error {
	var root fs.InodeEmbedder
	switch mode {
	case "noop":
		root = &memDir{}
	case "loopback":
		if backing == "" {
			return fmt.Errorf("-mode loopback needs -backing")
		}
		r, err := fs.NewLoopbackRoot(backing)
		if err != nil {
			return fmt.Errorf("loopback of %s: %w", backing, err)
		}
		root = r
	case "read":
		if size < 0 {
			return fmt.Errorf("-size %d: negative", size)
		}
		data := make([]byte, size)
		if _, err := rand.Read(data); err != nil {
			return fmt.Errorf("random bytes: %w", err)
		}
		root = &readDir{data: data}
	default:
		return fmt.Errorf("unknown -mode %q (noop, loopback or read)", mode)
	}
	// As fusefs.Mount sets them (timeouts, write size, permissions checked
	// by the kernel), so that the round trips per create are the same.
	day, neg := 24*time.Hour, time.Second
	opts := &fs.Options{
		EntryTimeout:    &day,
		AttrTimeout:     &day,
		NegativeTimeout: &neg,
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			DirectMount:   os.Geteuid() == 0,
			FsName:        "fusefloor:" + mode,
			Name:          "fusefloor",
			MaxWrite:      1 << 20,
			MaxBackground: 64,
			DisableXAttrs: true,
			DisableSplice: true,
			Options:       []string{"default_permissions"},
		},
	}
	srv, err := fs.Mount(mnt, root, opts)
	if err != nil {
		return fmt.Errorf("mount %s: %w", mnt, err)
	}
	fmt.Println("serving")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		_ = srv.Unmount() // Wait returns either way; a busy mount is the caller's to see
	}()
	srv.Wait()
	return nil
}

// memDir is a directory held in memory: creates and mkdirs only, which is
// what the benchmark does.
type memDir struct{ fs.Inode }

var (
	_ fs.NodeCreater   = (*memDir)(nil)
	_ fs.NodeMkdirer   = (*memDir)(nil)
	_ fs.NodeGetattrer = (*memDir)(nil)
)

func (d *memDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := &memFile{fs.MemRegularFile{Attr: fuse.Attr{Mode: mode}}}
	ch := d.NewInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG})
	d.AddChild(name, ch, true)
	out.Mode = mode | syscall.S_IFREG
	return ch, nil, 0, 0
}

func (d *memDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch := d.NewInode(ctx, &memDir{}, fs.StableAttr{Mode: syscall.S_IFDIR})
	d.AddChild(name, ch, true)
	out.Mode = mode | syscall.S_IFDIR
	return ch, 0
}

func (d *memDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = 0o755 | syscall.S_IFDIR
	return 0
}

// memFile answers FLUSH, RELEASE and FSYNC (a filesystem that answered
// ENOSYS would be sent no more FLUSHes, which ckptfs, committing at close,
// is sent for every file).
type memFile struct{ fs.MemRegularFile }

var (
	_ fs.NodeFlusher  = (*memFile)(nil)
	_ fs.NodeReleaser = (*memFile)(nil)
	_ fs.NodeFsyncer  = (*memFile)(nil)
)

func (f *memFile) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno   { return 0 }
func (f *memFile) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }
func (f *memFile) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

// readDir is a directory holding one file, "data", whose bytes are in memory.
type readDir struct {
	fs.Inode
	data []byte
}

var _ fs.NodeOnAdder = (*readDir)(nil)

// OnAdd adds the file as a persistent node: the kernel forgetting it (caches
// dropped before a cold read) must not drop it.
func (d *readDir) OnAdd(ctx context.Context) {
	f := &fs.MemRegularFile{Data: d.data, Attr: fuse.Attr{Mode: 0o444}}
	d.AddChild("data", d.NewPersistentInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG}), false)
}
