package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

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
	case *specialNode:
		f.nodes.add(&n.nodeBase)
	}
}
