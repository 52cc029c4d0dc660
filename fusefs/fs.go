package fusefs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs/internal/lockorder"
	"github.com/ckptfs/ckptfs/fusefs/stage"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Inode numbers of the virtual nodes (below cas.FirstIno, never allocated).
const (
	ctlIno   uint64 = 2
	statsIno uint64 = 3
)

// Names the filesystem reserves.
const (
	ctlName       = ".ckptfs"
	statsName     = "stats.json"
	manifestsName = "manifests"
	runsName      = "runs"
)

// maxNameLen is the longest directory entry name, as on ext4.
const maxNameLen = 255

// MaxFileSize is the largest file size: ext4's with 4 KiB blocks (2^32-1
// blocks). A truncate or fallocate past it fails with EFBIG, and a write is
// cut short at it (EFBIG when it starts there), as on ext4. A hole costs
// nothing whatever its length (cas.Hole); the bound is the spool's, whose
// holes a file changed out of order lives in on the store's filesystem.
const MaxFileSize = 1<<44 - 4096

// zeroBuf is the size of FS.zeros, the buffer holes are read from.
const zeroBuf = 1 << 20

// FS is one mounted store's filesystem state.
type FS struct {
	store *cas.Store
	log   *log.Logger

	// letGo counts files with no name left whose last handle closed
	// (dropUnlinkedLocked): what they kept from a collection is garbage now,
	// though no catalog counter moved (LetGo).
	letGo atomic.Uint64

	// ctl is the owner and times of the control files (.ckptfs): the
	// daemon's user and group, and when New ran (ctlAttr).
	ctl struct {
		uid, gid uint32
		time     uint64 // seconds
	}

	// readAhead is the kernel's readahead for the mount in bytes, when
	// Mount set one (0: the kernel's default, at most DefaultReadAheadKB).
	readAhead atomic.Int64

	nsMu   lockorder.Mutex[lockorder.Namespace] // guards the namespace; see the package doc
	viewMu lockorder.RWMutex[lockorder.View]    // guards what lookups and listings read; see the package doc

	// renames counts the RENAME requests in flight, from before our Rename
	// runs to after go-fuse has moved the inode in its tree; renamed (on
	// nsMu) is broadcast when one ends. Guarded by nsMu.
	renames int
	renamed *sync.Cond

	// flushing is set (guarded by nsMu) while a group commit's transaction
	// is being made durable with nsMu released (cas.FlushUnlocker: the
	// members' rows are written, their Apply not run yet); flushed (on
	// nsMu) is broadcast when it ends. lockNS waits it out; Create does not.
	flushing bool
	flushed  *sync.Cond

	root *dirNode

	// openFiles tracks files with open handles or uncommitted content, so that
	// callers (gc) can see manifests that the catalog no longer names.
	openMu    sync.Mutex
	openFiles map[*fileNode]int

	tgids threadGroups // callers' thread groups (handle's FLUSH rule)

	// The nodes the kernel has looked up, and the pruner that keeps them
	// near a limit; the files that must outlive the kernel's interest
	// (nodes.go: the structures; prune.go, pins.go: their use).
	nodes     nodeList
	pins      pinSet
	pruneStop context.CancelFunc
	pruneDone chan struct{}

	// The staging of files being written (package stage): the write memory
	// budget (writeMemory, WithWriteMemory) and the spool files.
	stage       *stage.Pool
	writeMemory int64

	obs Observer // WithObserver, or nil

	zeros []byte // zeroBuf zero bytes, never written: the reply to reads of holes

	asyncCommit bool                            // close returns before the commit (WithAsyncCommit)
	afterCommit func(ctx context.Context) error // WithAfterCommit
	pending     sync.WaitGroup                  // background commits in flight

	// Background re-encoding (background.go).
	act          activity
	reencodeIdle time.Duration // idle time before it runs; <= 0: off
	bgStop       context.CancelFunc
	bgDone       chan struct{}
	closeOnce    sync.Once

	// setattrHook, when set (tests only), runs in Setattr after the new
	// attributes are computed and before they are written to the catalog.
	setattrHook func()
	// renameHook, when set (tests only), runs when our Rename has recorded a
	// rename and released nsMu, before go-fuse moves the inode in its tree.
	renameHook func()
	// releaseHook, when set (tests only), runs in Release once the handle
	// looked like the file's last writer, before the commit; the function it
	// returns, if not nil, runs when Release is done.
	releaseHook func(name string) func()
	// releaseLookHook, when set (tests only), runs in every Release of a
	// handle that may write, after its look at the file's writers.
	releaseLookHook func(name string, last bool)
	// commitHook, when set (tests only), runs in a commit once its chunks
	// are stored, before its catalog transaction (the file's mu held).
	commitHook func()
	// hintHook, when set (tests only), runs after a commit's search for the
	// previous version of its file (bases.go) with what it found (nil if
	// nothing) and the directory rows it read (cas.Tx.Walked).
	hintHook func(prev *cas.Manifest, walked int)
	// flushHook, when set (tests only), runs in a group commit's leader
	// once it has released nsMu for the flush (groupLock.UnlockForFlush).
	flushHook func()
}

// Option configures New.
type Option func(*FS)

// WithAsyncCommit makes close(2) return once the file's bytes are staged,
// with the commit following in the background (seeds/003's non-blocking
// checkpointing): fsync of the file waits for its commit and reports its
// error; readers see the staged bytes meanwhile; a crash before the commit
// loses that file's new version (the previous one stays). A file replaced
// while others have it open shows its new version under its name only once
// the commit lands.
func WithAsyncCommit() Option { return func(f *FS) { f.asyncCommit = true } }

// WithWriteMemory sets the memory that files being written hold in streams
// (DefaultWriteMemory): each stream reserves a window of about 24 MiB, and a
// file started while the budget is spent is staged in a spool file on disk
// instead (committed at close from there). With the chunk cache and a fixed
// cost per open writer, this bounds the daemon's memory.
func WithWriteMemory(n int64) Option { return func(f *FS) { f.writeMemory = n } }

// Observer receives the timings of commits and reads, for metrics. Its
// methods are called on the request's goroutine, possibly under the file's
// own lock, so they must be cheap and must not block (atomic counters,
// histogram observations).
type Observer interface {
	// Commit is one commit of a changed file: its committed size, the error.
	Commit(d time.Duration, size int64, err error)
	// Read is one READ of a regular file: bytes returned, error.
	Read(d time.Duration, bytes int, errno syscall.Errno)
}

// WithObserver reports commits and reads to o.
func WithObserver(o Observer) Option { return func(f *FS) { f.obs = o } }

// WithAfterCommit runs fn after every successful file commit, outside the
// filesystem's locks, in the committing request: an error from it is the
// commit's error (the file stays committed locally). The remote tier uses it
// to start an upload, or with --commit=remote to wait for one.
func WithAfterCommit(fn func(ctx context.Context) error) Option {
	return func(f *FS) { f.afterCommit = fn }
}

// New returns the filesystem of store. It creates runs/ when the store's root is
// empty (a fresh store). logger receives errors that cannot be returned to a
// caller (a commit at RELEASE, a background re-encode); nil discards them.
// New starts the background re-encoder (WithReencodeIdle): call Close once
// the filesystem is done with, before closing the store.
func New(store *cas.Store, logger *log.Logger, opts ...Option) (*FS, error) {
	if logger == nil {
		logger = log.New(discard{}, "", 0)
	}
	f := &FS{store: store, log: logger, openFiles: map[*fileNode]int{}, zeros: make([]byte, zeroBuf),
		act: activity{epoch: time.Now()}, reencodeIdle: DefaultReencodeIdle,
		writeMemory: DefaultWriteMemory,
		nodes:       nodeList{limit: DefaultNodeLimit, kick: make(chan struct{}, 1)},
		pins:        pinSet{files: map[uint64]*fileNode{}}}
	f.ctl.uid, f.ctl.gid, f.ctl.time = uint32(os.Geteuid()), uint32(os.Getegid()), uint64(time.Now().Unix())
	f.renamed = sync.NewCond(&f.nsMu)
	f.flushed = sync.NewCond(&f.nsMu)
	for _, o := range opts {
		o(f)
	}
	f.stage = stage.NewPool(store, f.writeMemory)
	// Taken before the transaction: AllocIno may run a transaction of its own.
	runsIno, err := store.AllocIno()
	if err != nil {
		return nil, err
	}
	var rootRec cas.Node
	err = store.Update(func(tx *cas.Tx) error {
		rec, ok, err := tx.Node(cas.RootIno)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("catalog has no root directory")
		}
		rootRec = rec
		empty := true
		if err := tx.Children(cas.RootIno, func(string, uint64) error { empty = false; return nil }); err != nil {
			return err
		}
		if !empty {
			return nil
		}
		now := time.Now().UnixNano()
		// runs/ belongs to the root's owner (the store's creator).
		if err := tx.PutNode(cas.Node{Ino: runsIno, Mode: syscall.S_IFDIR | 0o755, UID: rec.UID, GID: rec.GID, Atime: now, Mtime: now, Ctime: now}); err != nil {
			return err
		}
		return tx.Link(cas.RootIno, runsName, runsIno)
	})
	if err != nil {
		return nil, fmt.Errorf("load root: %w", err)
	}
	f.root = &dirNode{nodeBase: nodeBase{fsys: f, attr: rootRec}}
	f.startBackground()
	f.startPruner()
	return f, nil
}

// LetGo returns how many files with no name left have had their last handle
// closed since the mount: a collection that found such a file open kept its
// chunks (LiveManifests), and they are garbage once this moves.
func (f *FS) LetGo() uint64 { return f.letGo.Load() }

// Root returns the root node, for fs.Mount.
func (f *FS) Root() fs.InodeEmbedder { return f.root }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// blksize is the st_blksize every node reports: the buffer size stdio and
// Python's io pick for a file (Python uses it as is; glibc only below 8 KiB).
// At 1 MiB, readers that seek and read a few bytes at many places read 1 MiB
// at each: torch.load reads each storage record's 30-byte zip header, and
// fetched the whole of a 1 GiB torch.save file to map it lazily (issue #13).
// At 4 KiB such a probe reads a page or two. It is the same for files being
// written (st_blksize must not change under an open file; go-fuse's posix
// tests check it): buffered writers then flush every 4 KiB, but the writers
// of checkpoints (torch's and safetensors' writers, numpy, pickle frames)
// write tensors in large writes that bypass the buffer.
const blksize = 4 << 10

// nodeBase is what every node of the tree has.
type nodeBase struct {
	fs.Inode
	fsys *FS
	attr cas.Node // dirs, symlinks: guarded by fsys.nsMu and viewMu; files: by file.mu and attrMu
	link nodeLink // place in fsys.nodes
	// nlink counts the names of a node that is not a directory (0 reads
	// as 1): the catalog's count, changed holding nsMu by the namespace
	// change that changes the catalog's.
	nlink atomic.Uint32
}

// links returns the number of names of a node that is not a directory.
func (b *nodeBase) links() uint32 {
	if l := b.nlink.Load(); l > 0 {
		return l
	}
	return 1
}

// setView makes a change that lookups, listings and getattr of directories
// and symlinks may see (nsMu held): under viewMu, which they take instead of
// nsMu so that they never wait for a catalog transaction.
func (f *FS) setView(change func()) {
	f.viewMu.Lock()
	change()
	f.viewMu.Unlock()
}

func fillAttr(out *fuse.Attr, n *cas.Node, nlink uint32) {
	out.Ino = n.Ino
	out.Mode = n.Mode
	out.Size = uint64(n.Size)
	out.Blocks = (uint64(n.Size) + 511) / 512
	out.Blksize = blksize
	out.Nlink = nlink
	out.Rdev = n.Rdev
	out.Owner = fuse.Owner{Uid: n.UID, Gid: n.GID}
	setTime := func(ns int64) (uint64, uint32) { return uint64(ns / 1e9), uint32(ns % 1e9) }
	out.Atime, out.Atimensec = setTime(n.Atime)
	out.Mtime, out.Mtimensec = setTime(n.Mtime)
	out.Ctime, out.Ctimensec = setTime(n.Ctime)
}

// applySetattr applies the mode, owner and time changes of in to n.
func applySetattr(n *cas.Node, in *fuse.SetAttrIn, now int64) {
	if m, ok := in.GetMode(); ok {
		n.Mode = n.Mode&syscall.S_IFMT | m&^uint32(syscall.S_IFMT)
	}
	if uid, ok := in.GetUID(); ok {
		n.UID = uid
	}
	if gid, ok := in.GetGID(); ok {
		n.GID = gid
	}
	if t, ok := in.GetATime(); ok {
		n.Atime = t.UnixNano()
	}
	if t, ok := in.GetMTime(); ok {
		n.Mtime = t.UnixNano()
	}
	n.Ctime = now
}

func callerOwner(ctx context.Context) (uint32, uint32) {
	if c, ok := ctx.(*fuse.Context); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// toErrno maps an internal error to the errno the kernel gets, logging the
// detail (the kernel keeps only the number). A wrapped errno (ENOSPC from a
// full disk, say) is kept; anything else, a corrupt chunk included, is EIO.
func (f *FS) toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR // the request was interrupted (a reader gave up on a slow load)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != 0 {
		if _, bare := err.(syscall.Errno); !bare {
			f.log.Printf("%s: %v", op, err)
		}
		return errno
	}
	f.log.Printf("%s: %v", op, err)
	return syscall.EIO
}

func (f *FS) trackOpen(n *fileNode, delta int) {
	f.openMu.Lock()
	defer f.openMu.Unlock()
	f.openFiles[n] += delta
	if f.openFiles[n] <= 0 {
		delete(f.openFiles, n)
	}
}

// LiveManifests returns the manifests of files that are open (or staged) now,
// including unlinked or replaced ones the catalog no longer names. A garbage
// collector running beside the mount must treat their chunks as reachable.
func (f *FS) LiveManifests() []*cas.Manifest {
	f.openMu.Lock()
	nodes := make([]*fileNode, 0, len(f.openFiles))
	for n := range f.openFiles {
		nodes = append(nodes, n)
	}
	f.openMu.Unlock()
	var ms []*cas.Manifest
	for _, n := range nodes {
		n.mu.RLock()
		if n.manifest != nil {
			ms = append(ms, n.manifest)
		}
		n.mu.RUnlock()
	}
	return ms
}

// Stats returns the store's statistics.
func (f *FS) Stats() (cas.Stats, error) { return f.store.Stats() }

// lockNS takes nsMu, after any group commit being made durable has ended
// (flushing): the holder may read or change what the commit's members'
// Apply changes (a file's persisted state, its place in the tree) or
// write the catalog from it. Every holder of nsMu takes it this way but
// Create and a commit's reads of its own file's place (commitQuiet,
// hintPlace), which see nothing a member's Apply changes: a new name's
// node is in the tree from Create on, whatever the catalog says. So the
// kernel's creates do not wait for the catalog's fdatasyncs (a commit of
// small files is little else), and commits keep queueing during them.
func (f *FS) lockNS() {
	f.nsMu.Lock()
	for f.flushing {
		f.flushed.Wait()
	}
}

// groupLock is the lock commits pass to cas.Store.CommitGroup: nsMu,
// released while the group's transaction is made durable (flushing).
type groupLock struct{ f *FS }

var _ cas.FlushUnlocker = groupLock{}

// Lock takes nsMu (the group's leader: no other group is being flushed).
func (l groupLock) Lock() { l.f.nsMu.Lock() }

// Unlock releases nsMu.
func (l groupLock) Unlock() { l.f.nsMu.Unlock() }

// UnlockForFlush marks the flush and releases nsMu.
func (l groupLock) UnlockForFlush() {
	l.f.flushing = true
	l.f.nsMu.Unlock()
	if hook := l.f.flushHook; hook != nil {
		hook()
	}
}

// RelockAfterFlush takes nsMu and ends the flush. The holders of nsMu
// waiting in lockNS wake, and get it once the leader has applied its
// members and released it.
func (l groupLock) RelockAfterFlush() {
	l.f.nsMu.Lock()
	l.f.flushing = false
	l.f.flushed.Broadcast()
}
