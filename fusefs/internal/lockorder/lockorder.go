// Package lockorder gives fusefs's locks a rank, and checks, in builds
// with the ckptfs_lockorder tag (make test-go runs fusefs's tests so), that
// every goroutine takes them in rank order. Elsewhere its mutexes are sync's
// with nothing added.
//
// The check takes one process-wide lock at every Lock and Unlock, which
// orders the goroutines that take any checked lock: the race detector
// would see no race between them. So the tag is for a run of its own, not
// for the race run.
//
// The order, lowest rank first (a goroutine holding a lock may take only
// locks of a higher rank):
//
//	file.releaseMu → file.commitMu → file.mu → FS.nsMu → FS.viewMu → file.attrMu
//
// Two locks of one rank nest only as a class's sub-ranks allow: a fork's
// file.mu is taken after its origin's with LockNested, never the other way. A lock of a rank already held by the goroutine, taken
// without that, is an inversion too (it could deadlock against a goroutine
// that takes the two the other way).
//
// With the tag, an inversion is recorded when the lock is asked for (so it
// is caught even where it would deadlock), with the stack that asked;
// Violations returns them, and fusefs's TestMain fails the test binary if
// any was recorded. Without the tag, Lock and Unlock cost what sync's do.
package lockorder

import "sync"

// Class names a kind of lock and its rank. Its methods are unexported: the
// classes are the ones below.
type Class interface {
	rank() int
	name() string
}

// The classes of fusefs's ranked locks, in rank order.
type (
	FileRelease struct{} // fileNode.releaseMu
	FileCommit  struct{} // fileNode.commitMu
	FileContent struct{} // fileNode.mu; a fork's after its origin's (LockNested)
	Namespace   struct{} // FS.nsMu
	View        struct{} // FS.viewMu
	FileAttr    struct{} // fileNode.attrMu
)

func (FileRelease) rank() int    { return 1 }
func (FileRelease) name() string { return "file.releaseMu" }
func (FileCommit) rank() int     { return 2 }
func (FileCommit) name() string  { return "file.commitMu" }
func (FileContent) rank() int    { return 3 }
func (FileContent) name() string { return "file.mu" }
func (Namespace) rank() int      { return 4 }
func (Namespace) name() string   { return "FS.nsMu" }
func (View) rank() int           { return 5 }
func (View) name() string        { return "FS.viewMu" }
func (FileAttr) rank() int       { return 6 }
func (FileAttr) name() string    { return "file.attrMu" }

// Mutex is a sync.Mutex of class C. The zero value is unlocked.
type Mutex[C Class] struct{ mu sync.Mutex }

func (m *Mutex[C]) Lock() {
	var c C
	acquire(m, c.rank(), 0, c.name())
	m.mu.Lock()
}

func (m *Mutex[C]) Unlock() {
	release(m)
	m.mu.Unlock()
}

// RWMutex is a sync.RWMutex of class C. The zero value is unlocked.
type RWMutex[C Class] struct{ mu sync.RWMutex }

func (m *RWMutex[C]) Lock() { m.lock(0) }

// LockNested takes m after a lock of its class that the goroutine holds:
// a fork's file.mu after its origin's.
func (m *RWMutex[C]) LockNested() { m.lock(1) }

func (m *RWMutex[C]) lock(sub int) {
	var c C
	acquire(m, c.rank(), sub, c.name())
	m.mu.Lock()
}

func (m *RWMutex[C]) Unlock() {
	release(m)
	m.mu.Unlock()
}

func (m *RWMutex[C]) RLock() {
	var c C
	acquire(m, c.rank(), 0, c.name())
	m.mu.RLock()
}

func (m *RWMutex[C]) RUnlock() {
	release(m)
	m.mu.RUnlock()
}
