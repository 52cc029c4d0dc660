package fusefs

import (
	"sync"
	"sync/atomic"

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

// count returns how many nodes are listed.
func (l *nodeList) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
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
