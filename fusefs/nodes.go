package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

// DefaultNodeLimit is how many catalog nodes the daemon lets the kernel keep
// looked up before it asks the kernel to forget the oldest (WithNodeLimit).
// A node costs about 1 KiB of live memory (our node, its go-fuse inode, the
// tree's and the identity table's entries), and the Go heap runs at about
// twice its live memory: 8192 nodes are about 16 MiB of the daemon's RSS,
// whatever the number of files in the store. A walk over more files than
// that looks the forgotten ones up again from the catalog when it comes
// back to them (one LOOKUP each).
const DefaultNodeLimit = 1 << 13

// WithNodeLimit sets how many nodes the kernel may keep looked up before the
// daemon asks it to forget the oldest ones (DefaultNodeLimit); n <= 0 never
// asks. It needs a kernel with FUSE_NOTIFY_PRUNE (protocol 7.45, Linux
// 6.18); with an older one, nodes are freed only when the kernel forgets them
// on its own (memory pressure, a dropped dentry cache).
func WithNodeLimit(n int) Option { return func(f *FS) { f.nodes.limit = n } }

// pruneBatch is how many nodes one FUSE_NOTIFY_PRUNE names (the kernel walks
// them 512 at a time).
const pruneBatch = 512

// pruneSettle is how long the pruner waits after asking the kernel to forget
// nodes before it counts the ones that stayed (the FORGETs come
// asynchronously). Longer, and a fast walk outruns the pruner. A count taken
// before late FORGETs came sets the floor too high; the FORGETs lower it
// (remove), and the next lookups past it prune what they left.
const pruneSettle = 50 * time.Millisecond

// nodeLink is a node's place in FS.nodes, guarded by nodeList.mu.
type nodeLink struct {
	prev, next *nodeBase
	listed     bool
}

// nodeList holds the catalog nodes the kernel may have looked up, oldest
// first: every node a LOOKUP, CREATE, MKDIR or SYMLINK returned, until
// go-fuse drops it (OnForget). When it holds more than limit, the pruner asks
// the kernel to forget the oldest, moving each to the back: the kernel keeps
// a node that is in use (an open file, a directory with cached children, a
// process's working directory), and it comes round again later.
type nodeList struct {
	mu          sync.Mutex
	head, tail  *nodeBase
	n           int
	limit       int
	floor       int           // nodes left after the last prune: mostly in use
	kick        chan struct{} // wakes the pruner (capacity 1)
	unsupported atomic.Bool   // the kernel has no FUSE_NOTIFY_PRUNE
}

// add lists b (once), and wakes the pruner when the list has outgrown its
// limit and what the last prune could not free by a quarter of the limit.
func (l *nodeList) add(b *nodeBase) {
	if l.limit <= 0 || l.unsupported.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b.link.listed {
		return
	}
	l.pushLocked(b)
	if l.n > max(l.limit, l.floor+l.limit/4) {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// remove takes b off the list (go-fuse dropped it).
func (l *nodeList) remove(b *nodeBase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unlinkLocked(b)
	l.floor = min(l.floor, l.n)
}

func (l *nodeList) unlinkLocked(b *nodeBase) {
	if !b.link.listed {
		return
	}
	if b.link.prev != nil {
		b.link.prev.link.next = b.link.next
	} else {
		l.head = b.link.next
	}
	if b.link.next != nil {
		b.link.next.link.prev = b.link.prev
	} else {
		l.tail = b.link.prev
	}
	b.link = nodeLink{}
	l.n--
}

// oldest returns the nodes to prune: enough of the oldest to bring the list
// to three quarters of its limit, each moved to the back. A node go-fuse
// never took (a lookup that lost a race to another node for the same inode)
// is dropped from the list instead.
func (l *nodeList) oldest() []*fs.Inode {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.n - l.limit*3/4
	var out []*fs.Inode
	for ; k > 0 && l.head != nil; k-- {
		b := l.head
		l.unlinkLocked(b)
		if b.Forgotten() {
			continue
		}
		l.pushLocked(b)
		out = append(out, &b.Inode)
	}
	return out
}

// startPruner starts the goroutine that keeps the kernel's looked-up nodes
// near the limit; Close stops it.
func (f *FS) startPruner() {
	f.pruneDone = make(chan struct{})
	if f.nodes.limit <= 0 {
		close(f.pruneDone)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.pruneStop = cancel
	go func() {
		defer close(f.pruneDone)
		for {
			select {
			case <-ctx.Done():
				return
			case <-f.nodes.kick:
			}
			f.prune(ctx)
		}
	}()
}

// prune asks the kernel to forget the oldest nodes, and again while that
// brings the list down and it is still over the limit (a directory is
// forgotten only after its children); then it notes how many stayed, as the
// floor the next prune waits for the list to outgrow.
func (f *FS) prune(ctx context.Context) {
	for {
		before := f.nodes.count()
		if !f.pruneOnce() {
			return
		}
		if !sleepCtx(ctx, pruneSettle) {
			return
		}
		after := f.nodes.count()
		if after <= f.nodes.limit || after >= before {
			f.nodes.mu.Lock()
			f.nodes.floor = f.nodes.n
			f.nodes.mu.Unlock()
			return
		}
	}
}

// pruneOnce asks the kernel to forget the oldest nodes, and reports whether
// it could ask.
func (f *FS) pruneOnce() bool {
	victims := f.nodes.oldest()
	for len(victims) > 0 {
		batch := victims[:min(len(victims), pruneBatch)]
		victims = victims[len(batch):]
		switch errno := f.root.NotifyPrune(batch); errno {
		case 0:
		case syscall.EBADF:
			return false // unmounted
		case syscall.ENOSYS:
			f.log.Printf("the kernel cannot be asked to forget nodes (FUSE_NOTIFY_PRUNE needs Linux 6.18): the daemon keeps every node the kernel keeps")
			f.nodes.unsupported.Store(true)
			return false
		default:
			f.log.Printf("ask the kernel to forget nodes: %v", errno)
			return false
		}
	}
	return true
}

// count returns how many nodes are listed.
func (l *nodeList) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// OnForget is called by go-fuse when it drops the node from its tree: the
// kernel forgot it and nothing keeps it (see pinSet for files).
func (b *nodeBase) OnForget() { b.fsys.nodes.remove(b) }

// listNode lists a node the kernel is about to learn of.
func (f *FS) listNode(n fs.InodeEmbedder) {
	switch n := n.(type) {
	case *fileNode:
		f.nodes.add(&n.nodeBase)
	case *dirNode:
		f.nodes.add(&n.nodeBase)
	case *symlinkNode:
		f.nodes.add(&n.nodeBase)
	}
}

// pinSet holds the files whose state is more than their catalog records: a
// file with open handles, with staged or uncommitted content, or a fork with
// writers or not committed yet. go-fuse drops a node the kernel forgets (its
// handles keep an open file known, but a file whose commit failed, or a
// fork, may not be), and a lookup of its name must then find this node, not
// build a new one from the catalog: the catalog has neither the staged
// content nor, until the commit in flight ends, the size its content will
// have.
type pinSet struct {
	mu     sync.Mutex
	files  map[uint64]*fileNode
	epoch  uint64               // bumped by every unpin: see pinnedFile
	recent [recentUnpins]uint64 // recent[e%recentUnpins]: the file unpinned at epoch e
}

// recentUnpins is how many unpins pinnedFile can tell apart.
const recentUnpins = 64

// pin keeps n findable by inode number (n.mu held).
func (f *FS) pin(n *fileNode) {
	f.pins.mu.Lock()
	f.pins.files[n.attr.Ino] = n
	f.pins.mu.Unlock()
}

// settled reports whether the catalog holds all of n's state (n.mu held).
func (n *fileNode) settled() bool {
	return n.handles == 0 && n.writers == 0 && !n.dirty && !n.staged() && n.fork == nil && n.origin == nil && !n.forked
}

// unpinIfSettled unpins n once the catalog holds all of its state (n.mu
// held), and drops its manifest, which the next open reads again.
func (f *FS) unpinIfSettled(n *fileNode) {
	if !n.settled() {
		return
	}
	f.pins.mu.Lock()
	if f.pins.files[n.attr.Ino] == n {
		delete(f.pins.files, n.attr.Ino)
		f.pins.epoch++
		f.pins.recent[f.pins.epoch%recentUnpins] = n.attr.Ino
	}
	f.pins.mu.Unlock()
	if !n.unlinked.Load() && n.manifest != nil {
		// The catalog has it: a closed file holds no chunk list.
		n.manifest, n.offsets, n.spans = nil, nil, nil
	}
}

// pinEpoch returns the current unpin epoch.
func (f *FS) pinEpoch() uint64 {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	return f.pins.epoch
}

// pinnedFile returns the pinned file with inode number ino, if any. since is
// the epoch read before the catalog read that found ino: stale reports that
// ino was unpinned since then (or that too many files were to tell), so the
// record read may predate its last commit (a commit writes the catalog
// before it unpins) and must be read again.
func (f *FS) pinnedFile(ino, since uint64) (n *fileNode, stale bool) {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	if n := f.pins.files[ino]; n != nil {
		return n, false
	}
	if f.pins.epoch-since >= recentUnpins {
		return nil, true
	}
	for e := since + 1; e <= f.pins.epoch; e++ {
		if f.pins.recent[e%recentUnpins] == ino {
			return nil, true
		}
	}
	return nil, false
}

// pinnedFiles returns every pinned file.
func (f *FS) pinnedFiles() []*fileNode {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	out := make([]*fileNode, 0, len(f.pins.files))
	for _, n := range f.pins.files {
		out = append(out, n)
	}
	return out
}

// pushLocked appends b, not listed, at the tail (l.mu held).
func (l *nodeList) pushLocked(b *nodeBase) {
	b.link = nodeLink{prev: l.tail, listed: true}
	if l.tail != nil {
		l.tail.link.next = b
	} else {
		l.head = b
	}
	l.tail = b
	l.n++
}
