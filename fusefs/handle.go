package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// handle is an open file description.
//
// Which closes commit: the kernel sends FLUSH for every close(2) of a
// descriptor of the description, including the copies a forked child closes at
// exec (close-on-exec) or exit. A training process whose data-loader workers
// fork while it saves a checkpoint would otherwise commit the checkpoint
// half-written. So a FLUSH commits only when the closing process is one that
// changed the file through this handle, or, when nothing was changed through
// it, the process that opened it (touch, open(O_TRUNC) then close). Processes
// are told apart by thread-group id: FUSE gives the caller's thread id, and
// /proc/<tid>/status names its thread group (threadGroups keeps the answers
// a second, for every handle of the mount).
//
// When a process cannot be named (the daemon is out of file descriptors and
// cannot open /proc/<tid>/status, or the thread is gone) the rule errs toward
// committing: a close whose caller is unknown commits, and so does every
// close after a change or an open whose caller was unknown. A needless commit
// of a half-written file costs a version that the writer's own close
// replaces; a skipped one leaves close(2) reporting success for bytes that a
// later RELEASE may fail to commit where nobody sees it.
//
// A handle is also the go-fuse file handle of its open: it answers the
// requests that name it (READ, WRITE, FLUSH, FSYNC, RELEASE, FALLOCATE,
// LSEEK) for its node, n, which holds the inode's state.
type handle struct {
	n     *fileNode
	write bool // opened for writing
	// appending: opened with O_APPEND. Its writes into a fork go where
	// the fork's content ends (Write).
	appending bool
	creator   bool // made the file (O_CREAT), even read-only
	// pageCached: what its READs return lands in the page cache (not a
	// writer's handle, FOPEN_DIRECT_IO, nor one opened with O_DIRECT).
	pageCached bool

	flushed atomic.Bool // a FLUSH has reached it (see fileNode.unflushed)

	mu       sync.Mutex
	opener   int            // thread group that opened the description, or a caller constant
	changers map[int]bool   // thread groups that changed the file through it
	unknown  bool           // a change came from a thread group that could not be named
	tgids    map[uint32]int // made on first use
	groups   *threadGroups  // the file system's answers (nil: ask /proc)
}

// Callers that are not a thread group (tgidLocked's results below 0).
const (
	unknownCaller = -1 // a process that could not be named
	kernelCaller  = -2 // the kernel itself (writeback of mmapped pages: pid 0), or no FUSE request
)

func newHandle(ctx context.Context, write bool, groups *threadGroups) *handle {
	h := &handle{write: write, groups: groups}
	h.opener = h.tgidLocked(ctx)
	return h
}

// noteChange records that the caller changed the file through h.
func (h *handle) noteChange(ctx context.Context) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch tg := h.tgidLocked(ctx); {
	case tg >= 0:
		if h.changers == nil {
			h.changers = make(map[int]bool)
		}
		h.changers[tg] = true
	case tg == unknownCaller:
		h.unknown = true
	}
}

// commitsOnClose reports whether the caller's close through h commits the
// file. A reader's close never does: it could catch a writer half-way. When
// a caller involved cannot be named, it does (see handle).
func (h *handle) commitsOnClose(ctx context.Context) bool {
	if h == nil || (!h.write && !h.creator) {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tg := h.tgidLocked(ctx)
	switch {
	case tg == unknownCaller || h.unknown:
		return true
	case tg < 0:
		return false
	case len(h.changers) == 0:
		return h.opener == unknownCaller || tg == h.opener
	default:
		return h.changers[tg]
	}
}

// mayCommit reports whether releasing h may commit (it could write).
func (h *handle) mayCommit() bool { return h != nil && (h.write || h.creator) }

// tgidLocked returns the caller's thread group, or unknownCaller or
// kernelCaller (mu held).
func (h *handle) tgidLocked(ctx context.Context) int {
	c, ok := ctx.(*fuse.Context)
	if !ok || c.Pid == 0 {
		return kernelCaller
	}
	if tg, ok := h.tgids[c.Pid]; ok {
		return tg
	}
	tg := h.groups.of(c.Pid)
	if tg >= 0 && len(h.tgids) < 64 { // an unknown one may be known next time
		if h.tgids == nil {
			h.tgids = make(map[uint32]int)
		}
		h.tgids[c.Pid] = tg
	}
	return tg
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
)

// Read reads the content h sees (a writer's: the fork's, if any), and
// reports it to the observer.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n := h.n
	obs := n.fsys.obs
	if obs == nil {
		return n.read(ctx, h, dest, off)
	}
	start := time.Now()
	res, errno := n.read(ctx, h, dest, off)
	size := 0
	if res != nil {
		size = res.Size()
	}
	obs.Read(time.Since(start), size, errno)
	return res, errno
}

// Write stages data at off in the node changeTargetOf picks, clearing
// setuid/setgid first for a write(2) by an unprivileged caller.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n := h.n
	n.fsys.noteActivity()
	h.noteChange(ctx)
	cached := fromPageCache(ctx)
	if !cached {
		// A mapping's stores keep the bits, as on ext4 (page_mkwrite does
		// not clear them).
		n.killPriv(ctx)
	}
	t := changeTargetOf(n, h, cached)
	if h.appending && !cached && t != n {
		// O_APPEND into a fork: at the fork's end, not where the kernel
		// thinks the file ends. The kernel keeps one size for the inode the
		// writer shares with its readers, and a stat of theirs sets it back
		// to the old version's: a kept descriptor's next append overwrote
		// what its last one wrote (fsync'd lines lost). The flags are the
		// open's: a descriptor whose O_APPEND fcntl cleared since still
		// appends here (FUSE's WRITE carries the current flags; go-fuse's
		// node API drops them).
		off = appendAtEnd
	}
	k, errno := t.writeStaged(ctx, data, off)
	if t != n && t.tookName() {
		// Written through the origin's inode to its fork, which has taken
		// the name: the kernel's attributes of the fork's inode (size) are
		// stale now. Attributes only: no page cache is touched. (Before
		// then the kernel knows no such inode: no request for nothing on
		// every WRITE of a rewrite beside a reader.)
		t.EmbeddedInode().NotifyContent(-1, 0)
	}
	return k, errno
}

// appendAtEnd is the offset writeStaged takes for "where the content ends".
const appendAtEnd = -1

// changeTargetOf is the node a change through h to n lands on: n's
// changeTarget, and that node's in turn for a change by path (a fork may
// itself have been forked once it took the name).
func changeTargetOf(n *fileNode, h *handle, cached bool) *fileNode {
	t := n.changeTarget(h, cached)
	for t != n {
		n, t = t, t.changeTarget(nil, cached)
	}
	return t
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	const keepSize = 0x1 // FALLOC_FL_KEEP_SIZE
	if mode&^keepSize != 0 {
		return syscall.EOPNOTSUPP
	}
	h.noteChange(ctx)
	t := changeTargetOf(h.n, h, false)
	t.mu.Lock()
	defer t.mu.Unlock()
	if off > MaxFileSize || size > MaxFileSize-off {
		return syscall.EFBIG
	}
	end := int64(off + size)
	if mode&keepSize != 0 || end <= t.attr.Size {
		return 0 // nothing to reserve: the store allocates at commit
	}
	if err := t.resize(ctx, end); err != nil {
		return t.fsys.toErrno("fallocate", err)
	}
	return 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the manifest's holes: a
// committed file's holes are holes, its chunks data. Staged content is all
// data (it reads as its bytes; SEEK_DATA may report a hole as data).
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	const seekData, seekHole = 3, 4
	n := h.n.dataNode(h)
	n.mu.RLock()
	size := uint64(n.attr.Size)
	m, offsets := n.manifest, n.offsets
	if n.staging != nil && (whence == seekData || whence == seekHole) && off < size {
		// Staged: the spool's (or the stream's) data and holes, what the
		// commit will keep.
		got, err := n.staging.SeekRegion(int64(off), whence == seekData)
		n.mu.RUnlock()
		if err != nil {
			return 0, n.fsys.toErrno("lseek", err)
		}
		return uint64(got), 0
	}
	if n.staging != nil {
		m = nil
	}
	n.mu.RUnlock()
	switch whence {
	case seekData:
		if off >= size {
			return 0, syscall.ENXIO
		}
		if m == nil {
			return off, 0
		}
		d, ok := m.NextData(offsets, int64(off))
		if !ok {
			return 0, syscall.ENXIO
		}
		return uint64(d), 0
	case seekHole:
		if off > size {
			return 0, syscall.ENXIO
		}
		if m == nil {
			return size, 0
		}
		return uint64(m.NextHole(offsets, int64(off))), 0
	}
	return 0, syscall.EINVAL
}

// Flush commits when the caller's close commits (commitsOnClose).
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	h.noteFlush()
	if !h.commitsOnClose(ctx) {
		return 0
	}
	n := h.n
	if n.fsys.asyncCommit {
		// Report a background commit's failure at the next close or fsync.
		err := n.takeAsyncErr()
		n.fsys.pending.Add(1)
		go func() {
			defer n.fsys.pending.Done()
			if err := n.commit(context.Background()); err != nil {
				n.fsys.log.Printf("background commit of %q: %v", n.name, err)
				n.mu.Lock()
				n.asyncErr = err
				n.mu.Unlock()
			}
		}()
		return n.fsys.toErrno("commit", err)
	}
	return n.fsys.toErrno("commit", n.commit(context.WithoutCancel(ctx)))
}

// noteFlush records the first FLUSH (or the RELEASE) of a handle that may
// write: the open(2) that made it has returned, so it is not an
// open(O_TRUNC) whose truncation is still to come (see fileNode.Setattr).
func (h *handle) noteFlush() {
	if h.write && h.flushed.CompareAndSwap(false, true) {
		h.n.unflushed.Add(-1)
	}
}

// Fsync commits (waiting for a background commit in flight: commits of one
// file are serialized) and reports a background commit's failure.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	n := h.n
	if err := n.commit(context.WithoutCancel(ctx)); err != nil {
		return n.fsys.toErrno("commit", err)
	}
	return n.fsys.toErrno("commit", n.takeAsyncErr())
}

// Release ends the open: the node counts one handle (and writer) less, and
// the release of the last writer commits what was written since its FLUSH.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	n := h.n
	if h.mayCommit() {
		n.releaseMu.Lock()
		defer n.releaseMu.Unlock()
	}
	// RELEASE arrives asynchronously, possibly after another writer has opened
	// and truncated the file: only the last writer's release may commit (what
	// it wrote after its last FLUSH, e.g. through a shared mmap). The kernel
	// ignores RELEASE's result, so an error can only be logged.
	// The writers that count are those of the node the commit lands on: a
	// fork that took this file's name may have writers of its own by now.
	// This look is a shortcut: a writer may open between it and the commit,
	// so commitAtRelease asks again holding the file's lock.
	t := n.dataNode(h)
	t.mu.RLock()
	last := h.mayCommit() && t.writers <= 1
	t.mu.RUnlock()
	if hook := n.fsys.releaseLookHook; hook != nil && h.mayCommit() {
		hook(n.nameNow(), last)
	}
	if last {
		if hook := n.fsys.releaseHook; hook != nil {
			if done := hook(n.nameNow()); done != nil {
				defer done()
			}
		}
		if err := n.commitAtRelease(context.WithoutCancel(ctx), h); err != nil {
			n.fsys.log.Printf("commit at release of %q: %v", n.name, err)
		}
	}
	n.mu.Lock()
	n.handles--
	fork := n.fork
	if h.write {
		n.writers--
		h.noteFlush()
		if fork != nil {
			fork.releaseWriter()
		}
		if n.writers == 0 {
			n.lost = nil // the writers that lost content are gone
		}
	}
	n.dropSpoolLocked()
	if n.handles == 0 && n.unlinked.Load() {
		n.dropUnlinkedLocked()
	}
	if fork != nil && n.writers == 0 {
		n.fork = nil // its writers are gone; it lives on at the file's name
		// Unpin it once settled (origin → fork, as in openHandle).
		fork.mu.LockNested()
		if fork.unlinked.Load() && fork.handles == 0 {
			// Its origin has no name to give it, and its writers were all
			// it had: it is gone. (One that took the name before losing it
			// may have handles of its own: their last Release drops it.)
			fork.dropUnlinkedLocked()
			n.fsys.nsMu.Lock() // after file.mu (lockorder)
			fork.origin = nil
			n.fsys.nsMu.Unlock()
		}
		fork.forked = false
		n.fsys.unpinIfSettled(fork)
		fork.mu.Unlock()
	}
	n.fsys.unpinIfSettled(n)
	n.mu.Unlock()
	n.fsys.trackOpen(n, -1)
	return 0
}
