package cas

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Group commit: commits that arrive while a catalog transaction is being made
// durable wait for it, then share the next one, as a database groups the
// flushes of its log. Each transaction is made durable by a flush (the
// fdatasync of its record in the catalog's log, catalog/wal.go); a commit of
// a small file costs little else, so without grouping a store commits at
// most one file per flush, whatever the number of writers. With it, the
// writers that queued during one flush commit together in the next: one
// transaction, one flush.
//
// Each commit still makes its own objects durable first (Batch.Sync, outside
// any lock, concurrently with the others: the file system groups those
// flushes itself), and returns only after the transaction that holds its
// rows has committed: durability at return is unchanged.
//
// The first commit to find no transaction in progress leads: it waits (up
// to groupWindow) for the commits that said they are coming
// (Batch.Committing) to queue, and for the writers of the last cycle to
// come back (see "Expected members" below), takes the caller's lock,
// collects every commit queued so far (its own first), runs
// their catalog changes in one transaction, applies their in-memory changes,
// releases the lock, and tells each its result. Commits queued meanwhile wait
// for the leader to end; then the oldest of them leads the next group.
//
// The caller's lock may let go during the flush: a lock that implements
// FlushUnlocker is released (UnlockForFlush) once the group's rows are
// written, and taken again (RelockAfterFlush) when the transaction has been
// made durable, before any member's Apply. The caller then decides who may
// take it meanwhile (fusefs: only what cannot see the members' in-memory
// state before their Apply, such as a create), so that a commit's fdatasyncs
// no longer stall every operation that needs the lock.
//
// Expected members. Writers that each close one small file after another
// (8 threads writing 4 KiB files) come back to the store a few hundred µs
// after their commit returns: FLUSH returns, then RELEASE, LOOKUP, CREATE,
// WRITE and the next FLUSH. Without waiting for them, the group that starts
// as one ends holds only the commits queued during it, and the writers
// settle into two halves that alternate, each committing a group of about
// half of them per transaction (8 writers: 3.75 commits per transaction on
// average, measured). So a group's end records how many commits took part
// in the last cycle (its members and those queued behind it): the next
// leader waits until as many have queued, or until the wait would exceed
// the time the last group spent in its transaction (at most groupWindow).
// The bound keeps a wait for writers that are not coming back (a writer
// that finished, a lone close after a burst) below the cost of the
// transaction it could have shared, and the expectation follows what
// actually arrives: a group formed after a wait that ran out sets the next
// expectation to its own size. A lone writer expects itself and never
// waits.
//
// A member whose changes fail (or a transaction that fails to commit) rolls
// the whole transaction back; each member is then committed alone, in order,
// still under the lock (the namespace they read is unchanged), so that one
// failure is reported to its own commit only. A member's Update must therefore
// be a function of the transaction alone: it may run twice.

// GroupItem is one commit's part of a group, which the caller's prepare
// returns holding the caller's lock.
type GroupItem struct {
	// Update writes the commit's rows (the batch's index rows are written
	// before it). nil: the commit needs no transaction (its batch is kept
	// or released as the caller arranged).
	Update func(*Tx) error
	// Apply, if not nil, runs once the transaction holding the commit's rows
	// has committed, the lock held, in the order of the group.
	Apply func()
	// Then, if not nil, runs after every member's Apply, the lock held. It
	// may wait on a condition of the lock (releasing it), which Apply must
	// not: the other members' Apply must see the namespace their Update saw.
	Then func()
}

// groupWindow bounds how long a leader waits for the commits that said
// they are coming (Batch.Committing) to join its group. Longer than the
// work a small file's commit does between Committing and CommitGroup
// (some µs, more on a loaded machine), far shorter than the pair of
// flush the group shares (~0.5 ms or more).
const groupWindow = 2 * time.Millisecond

// expectFresh is how long after a group's end the next leader still waits
// for the writers of its cycle (see "Expected members"): they come back
// within a few hundred µs when they write one small file after another.
const expectFresh = 10 * time.Millisecond

// FlushUnlocker is a lock passed to CommitGroup that may be released while
// a group's transaction is being made durable (see above).
type FlushUnlocker interface {
	sync.Locker
	// UnlockForFlush releases the lock, held, before the commit's writes
	// and fdatasyncs.
	UnlockForFlush()
	// RelockAfterFlush takes the lock again after them.
	RelockAfterFlush()
}

// grouper queues the commits of a store (Store.group).
type grouper struct {
	mu        sync.Mutex
	pending   []*groupReq
	busy      bool // a leader is running a group
	preparing int  // batches between Committing and CommitGroup
	// expect is the number of commits of the last cycle (the last group's
	// members and the commits queued when it ended); lastRun is how long
	// that group took (see "Expected members").
	expect  int
	lastRun time.Duration
	ended   time.Time     // when the last group ended
	wake    chan struct{} // a commit queued or arrived (1 buffered; made on first use)

	// window and fresh replace groupWindow and expectFresh when set (tests
	// that must not depend on the machine's speed).
	window, fresh time.Duration
}

// limits returns how long a leader may wait for commits that said they are
// coming, and how long after a group's end the next leader still waits for
// the writers of its cycle.
func (g *grouper) limits() (window, fresh time.Duration) {
	window, fresh = groupWindow, expectFresh
	if g.window > 0 {
		window = g.window
	}
	if g.fresh > 0 {
		fresh = g.fresh
	}
	return window, fresh
}

// signal wakes a leader waiting in awaitComing. g.mu held.
func (g *grouper) signal() {
	if g.wake == nil {
		g.wake = make(chan struct{}, 1)
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Committing tells the store that b will be committed by CommitGroup soon
// (the caller is finishing its file), so that a group being formed waits
// for it (up to groupWindow) instead of committing without it and leaving
// it the next transaction alone. The returned function withdraws it, for a
// commit that gives up before CommitGroup; CommitGroup withdraws it too.
// Both may be called more than once.
func (b *Batch) Committing() (withdraw func()) {
	g := &b.s.group
	g.mu.Lock()
	if !b.coming {
		b.coming = true
		g.preparing++
	}
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.arrived(b)
		g.mu.Unlock()
	}
}

// arrived counts b out of the commits coming. g.mu held.
func (g *grouper) arrived(b *Batch) {
	if b.coming {
		b.coming = false
		g.preparing--
		g.signal()
	}
}

// awaitComing waits until no commit that said it is coming is still on its
// way (up to groupWindow) and until as many commits as the last cycle had
// have queued (up to the last group's run time, at most groupWindow; see
// "Expected members"). g.mu held (released while waiting).
func (g *grouper) awaitComing() {
	window, fresh := g.limits()
	start := time.Now()
	expectFor := min(g.lastRun, window)
	if start.Sub(g.ended) > fresh {
		expectFor = 0 // the last cycle's writers are not coming back soon
	}
	for {
		waited := time.Since(start)
		var left time.Duration
		if g.preparing > 0 {
			left = window - waited
		}
		if len(g.pending) < g.expect {
			left = max(left, expectFor-waited)
		}
		if left <= 0 {
			return
		}
		if g.wake == nil {
			g.wake = make(chan struct{}, 1)
		}
		wake := g.wake
		g.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C:
		}
		t.Stop()
		g.mu.Lock()
	}
}

type groupReq struct {
	b       *Batch
	prepare func() GroupItem
	item    GroupItem
	err     error
	done    chan struct{} // closed when err is set
	lead    chan struct{} // closed when this request leads the next group
}

// CommitGroup is Commit for commits that share one catalog transaction with
// the concurrent commits of the same store (see the comment above
// GroupItem): it makes b's objects durable (Sync), then waits for a group;
// prepare runs with lock held and returns the commit's part. b is released
// when CommitGroup returns, whether or not anything failed; when the Sync
// fails, prepare is not called. Every caller of a store must pass the same
// lock.
func (s *Store) CommitGroup(ctx context.Context, b *Batch, lock sync.Locker, prepare func() GroupItem) error {
	defer b.Release()
	if b.s != s {
		return errors.New("commit of another store's batch")
	}
	if err := b.Sync(ctx); err != nil {
		return err
	}
	r := &groupReq{b: b, prepare: prepare, done: make(chan struct{}), lead: make(chan struct{})}
	g := &s.group
	g.mu.Lock()
	g.arrived(b)
	g.pending = append(g.pending, r)
	g.signal()
	if g.busy {
		g.mu.Unlock()
		select {
		case <-r.done:
			return r.err
		case <-r.lead:
		}
		g.mu.Lock()
	}
	g.busy = true
	g.awaitComing()
	members := g.pending
	g.pending = nil
	g.mu.Unlock()

	began := time.Now()
	s.runGroup(lock, members)
	ran := time.Since(began)

	g.mu.Lock()
	g.expect, g.lastRun, g.ended = len(members)+len(g.pending), ran, time.Now()
	if len(g.pending) > 0 {
		close(g.pending[0].lead) // it is waiting: the next group is its
	} else {
		g.busy = false
	}
	g.mu.Unlock()
	for _, m := range members {
		if m != r {
			close(m.done)
		}
	}
	return r.err
}

// runGroup commits members in one transaction (or each alone, if that
// fails), holding lock, and sets each one's err.
func (s *Store) runGroup(lock sync.Locker, members []*groupReq) {
	lock.Lock()
	defer lock.Unlock()
	var txs []*groupReq
	for _, m := range members {
		m.item = m.prepare()
		if m.item.Update != nil {
			txs = append(txs, m)
		}
	}
	if len(txs) == 0 {
		// Nothing to write (files unlinked while open): no transaction.
	} else if err := s.updateGroup(lock, txs); err != nil {
		if len(txs) == 1 {
			txs[0].err = err
		} else {
			for _, m := range txs {
				m.err = s.updateGroup(lock, []*groupReq{m})
			}
		}
	}
	for _, m := range members {
		if m.err == nil && m.item.Apply != nil {
			m.item.Apply()
		}
	}
	for _, m := range members {
		if m.err == nil && m.item.Then != nil {
			m.item.Then()
		}
	}
}

// updateGroup commits the rows of members in one transaction, lock held;
// a FlushUnlocker lock is released while the transaction is made durable.
func (s *Store) updateGroup(lock sync.Locker, members []*groupReq) error {
	fn := func(tx *Tx) error { return groupRows(tx, members) }
	fl, ok := lock.(FlushUnlocker)
	if !ok {
		return s.Update(fn)
	}
	return s.db.UpdateAround(fn, func() func() {
		fl.UnlockForFlush()
		return fl.RelockAfterFlush
	})
}

// groupRows writes the rows of members (their batches' index rows, then
// their Update) in tx, and counts one commit for the remote tier.
func groupRows(tx *Tx, members []*groupReq) error {
	for _, m := range members {
		if err := commitBatch(tx, m.b); err != nil {
			return err
		}
		if err := m.item.Update(tx); err != nil {
			return err
		}
	}
	return tx.Uploads().CountCommit() // the remote tier uploads up to it (cas/remote)
}
