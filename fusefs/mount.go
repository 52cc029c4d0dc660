package fusefs

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// MountOptions tune the FUSE mount.
type MountOptions struct {
	// ReadAheadKB is the kernel readahead for the mount, written to its BDI after
	// mounting (the FUSE protocol can only lower it). 0 keeps the kernel default.
	ReadAheadKB int
	// Debug logs every FUSE request.
	Debug bool
	// AllowOther lets users other than the mounter use the mount (FUSE's
	// allow_other). Off, the kernel refuses every other user, root included.
	// An ordinary user needs user_allow_other in /etc/fuse.conf for it.
	AllowOther bool
	// ReadOnly mounts read-only: the kernel refuses every change with EROFS
	// (a reader of another mount's remote).
	ReadOnly bool
}

// Privileged reports whether Mount calls mount(2) itself (root) rather than
// going through the setuid fusermount3 helper (everyone else).
func Privileged() bool { return os.Geteuid() == 0 }

// DefaultReadAheadKB is the kernel's readahead window for the mount. The
// window is also what a lazy mmap reader pays for: its read-around is the
// window (twice it after torch's POSIX_FADV_SEQUENTIAL) centred on the fault,
// and its async readahead runs up to three such windows past the last byte it
// reads, all rounded out to whole chunks. At 1 MiB a reader of 8 of 256
// scattered 4 MiB tensors (safe_open or torch.load(mmap=True)) had the kernel
// read 8 MiB per tensor, 60–81 MiB fetched for 32 MiB used; at 256 KiB it
// reads 5 MiB per tensor and fetches 49 MiB (issue #13). Streaming speed comes
// from the daemon's own prefetch (prefetch.go), not the kernel's window: a
// cold 1 GiB dd measured no slower at 256 KiB than at 1 MiB (two alternating
// pairs, 4.8/6.2 s against 6.7/10.6 s on a loaded machine).
const DefaultReadAheadKB = 256

// Mount serves f at mountpoint and returns once the mount is live. The caller
// waits on the server and unmounts it.
//
// Root mounts with mount(2) directly and never falls back (DirectMountStrict):
// a failure is then a real error, not a missing helper. Anyone else mounts
// through fusermount3 (go-fuse looks for fusermount3, then fusermount, in
// $PATH and /bin), the setuid helper rclone, sshfs and s3fs use; the caller
// checks its prerequisites first (cmd/ckptfs) so that a refused mount names
// what is missing.
func Mount(f *FS, mountpoint string, opts MountOptions) (*fuse.Server, error) {
	day := 24 * time.Hour // every change goes through this mount
	neg := time.Second
	fsOpts := &fs.Options{
		EntryTimeout:    &day,
		AttrTimeout:     &day,
		NegativeTimeout: &neg,
		// A file made with mode 0000 shows 0000 (pjdfstest open/26), not
		// the 0644 go-fuse would put in its place.
		NullPermissions: true,
		// The root's inode number is the catalog's (st_ino 1), not 0: tools
		// take (st_dev, st_ino) as a file's identity, and 0 for none.
		RootStableAttr: &fs.StableAttr{Ino: f.root.attr.Ino},
		MountOptions: fuse.MountOptions{
			DirectMountStrict:       Privileged(),
			AllowOther:              opts.AllowOther,
			FsName:                  "ckptfs:" + f.store.Dir(),
			Name:                    "ckptfs",
			MaxWrite:                1 << 20,
			MaxBackground:           64,
			DisableXAttrs:           true,
			DisableSplice:           true,     // results come from memory; splice only adds a copy
			MaxInflightRequestBytes: 64 << 20, // bounds request buffers (daemon RSS)
			Options:                 []string{"default_permissions"},
			// CAP_DIRECT_IO_ALLOW_MMAP: shared mappings of write handles
			// (doc.go, Writes). Not CAP_READDIRPLUS_AUTO (libfuse's default),
			// measured against READDIRPLUS on every batch (go-fuse's):
			// with it, a walk that stats nothing (find -name) built no node
			// per entry (10⁶ files: 3.7 against 11.5 µs a file), but ls -l,
			// du, rsync and os.walk read a whole directory before they stat
			// its entries, and those then cost a LOOKUP each (10⁴ files,
			// find then stat of each: 30 against 2.4 µs a stat; find + stat
			// 3.3 against 1.0-1.4 × plain). READDIRPLUS helps them as long as
			// the nodes fit under the node limit (prune.go), which is where
			// the files of a run are.
			ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			Debug:             opts.Debug,
			PanicHandler: func(p any) fuse.Status {
				f.log.Printf("panic in FUSE handler: %v", p)
				return fuse.EIO
			},
		},
	}
	if opts.ReadOnly {
		fsOpts.MountOptions.Options = append(fsOpts.MountOptions.Options, "ro")
	}
	if opts.Debug {
		fsOpts.Logger = log.New(os.Stderr, "fuse: ", log.Lmicroseconds)
	}
	// fs.Mount, with renames tracked (renameTracker), page-cache writes
	// marked (pageWrites) and changes run to their end (uninterrupted).
	raw := uninterrupted{pageWrites{renameTracker{fs.NewNodeFS(f.Root(), fsOpts), f}}}
	srv, err := fuse.NewServer(raw, mountpoint, &fsOpts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	if err := fuseFDsCloseOnExec(); err != nil {
		f.log.Printf("mount %s: %v", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		// The kernel mounted, but its first look at the root failed (a
		// damaged catalog's root): leave no dead mount behind.
		if uerr := srv.Unmount(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount: %w", uerr))
		}
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	if opts.ReadAheadKB > 0 && Privileged() { // the BDI's sysfs file is root's
		if err := setReadAhead(mountpoint, opts.ReadAheadKB); err != nil {
			f.log.Printf("readahead: %v", err)
		} else {
			f.readAhead.Store(int64(opts.ReadAheadKB) << 10) // prefetch.go: readScale
		}
	}
	return srv, nil
}

// fuseFDsCloseOnExec marks this process's descriptors of /dev/fuse
// close-on-exec. go-fuse's direct mount (root) opens /dev/fuse with
// syscall.Open, which, unlike os.Open, leaves the descriptor inheritable:
// every program started afterwards (a test's subprocess, a hook) would hold
// the connection open, so that once the daemon died its mount would hang
// its callers instead of failing them with ENOTCONN, until those programs
// exit. A descriptor passed by fusermount3 is close-on-exec already.
func fuseFDsCloseOnExec() error {
	fds, err := fuseFDs("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("make /dev/fuse's descriptors close-on-exec: %w", err)
	}
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	return nil
}

// fuseFDs lists the descriptors open on /dev/fuse in dir, a process's
// /proc/PID/fd.
func fuseFDs(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == "/dev/fuse" {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

// renameTracker counts the renames in flight (FS.renames): go-fuse moves a
// renamed inode in its tree after our Rename has returned, and a fork's
// commit must not put the fork in its origin's place before that move is
// done (replaceOrigin).
type renameTracker struct {
	fuse.RawFileSystem
	f *FS
}

func (r renameTracker) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	r.f.lockNS()
	r.f.renames++
	r.f.nsMu.Unlock()
	defer func() {
		r.f.lockNS()
		r.f.renames--
		r.f.renamed.Broadcast()
		r.f.nsMu.Unlock()
	}()
	return r.RawFileSystem.Rename(cancel, in, oldName, newName)
}

// pageWrites gives the WRITEs that write back dirty pages of the page cache
// (FUSE_WRITE_CACHE) caller pid 0, which handle.Write reads as "from the
// page cache" (fromPageCache). Write handles are FOPEN_DIRECT_IO, so only the
// stores of a shared mapping reach the page cache. The kernel already sends
// such writes without credentials (pid 0); this makes it a rule.
type pageWrites struct{ fuse.RawFileSystem }

func (p pageWrites) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_CACHE != 0 {
		in.Caller.Pid = 0
	}
	return p.RawFileSystem.Writev(cancel, in, data)
}

func (p pageWrites) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_CACHE != 0 {
		in.Caller.Pid = 0
	}
	return p.RawFileSystem.Write(cancel, in, data)
}

// uninterrupted runs the requests that change a file's data or commit it
// (WRITE, SETATTR, FALLOCATE, COPY_FILE_RANGE, FLUSH, FSYNC) to their end
// whatever the kernel's INTERRUPT says: they get no cancel channel. The
// kernel interrupts a request for any signal its caller takes, not only a
// fatal one (a timer, SIGCHLD, the Go runtime's SIGURG), and a change given
// up half way is worse than a late one: a write that spills a stream to its
// spool must not stop in the middle (the staged content would be lost), and
// the EINTR it would return is retried by Go and Python at once, to be
// interrupted again (a writer spinning at 100% CPU, seen in CI). ext4's
// writes, truncates and fsyncs are not interrupted either. Reads keep their
// cancel channel: a reader that gives up on a slow remote fetch gets EINTR.
type uninterrupted struct{ fuse.RawFileSystem }

func (u uninterrupted) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return u.RawFileSystem.Write(nil, in, data)
}

func (u uninterrupted) Writev(_ <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	return u.RawFileSystem.Writev(nil, in, data)
}

func (u uninterrupted) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return u.RawFileSystem.SetAttr(nil, in, out)
}

func (u uninterrupted) Fallocate(_ <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return u.RawFileSystem.Fallocate(nil, in)
}

func (u uninterrupted) CopyFileRange(_ <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return u.RawFileSystem.CopyFileRange(nil, in)
}

func (u uninterrupted) Flush(_ <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return u.RawFileSystem.Flush(nil, in)
}

func (u uninterrupted) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return u.RawFileSystem.Fsync(nil, in)
}

// setReadAhead writes the mount's BDI read_ahead_kb.
func setReadAhead(mountpoint string, kb int) error {
	var st syscall.Stat_t
	if err := syscall.Stat(mountpoint, &st); err != nil {
		return err
	}
	major := (st.Dev >> 8) & 0xfff
	minor := (st.Dev & 0xff) | ((st.Dev >> 12) & 0xfff00)
	path := filepath.Join("/sys/class/bdi", fmt.Sprintf("%d:%d", major, minor), "read_ahead_kb")
	return os.WriteFile(path, []byte(strconv.Itoa(kb)), 0o644)
}
