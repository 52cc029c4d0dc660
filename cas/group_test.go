package cas

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestCommitGroupSharesTransactions: commits that queue while one is in its
// transaction share the next one (one commit generation for all of them),
// each returns only once its rows are committed, and a member whose Update
// fails gets its own error while the others of its group commit.
func TestCommitGroupSharesTransactions(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail int // the member whose Update fails, -1: none
	}{
		{"all commit", -1},
		{"one fails", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t, Options{})
			ctx := context.Background()
			const n = 8
			var lock sync.Mutex
			gen0 := commitGen(t, s)

			// The first commit leads; its prepare holds the group open until
			// the other n-1 have queued behind it.
			queued := func() int {
				s.group.mu.Lock()
				defer s.group.mu.Unlock()
				return len(s.group.pending)
			}
			errs := make([]error, n)
			applied := make([]bool, n)
			refs := make([]ChunkRef, n)
			item := func(i int) GroupItem {
				return GroupItem{
					Update: func(tx *Tx) error {
						if i == tc.fail {
							return errors.New("injected")
						}
						return tx.PutManifest(uint64(100+i), &Manifest{Chunks: []ChunkRef{refs[i]}})
					},
					Apply: func() { applied[i] = true },
				}
			}
			commit := func(i int) error {
				b := s.NewBatch()
				var err error
				if refs[i], err = b.Put(ctx, pseudoRandom(1000, byte(i))); err != nil {
					return err
				}
				return s.CommitGroup(ctx, b, &lock, func() GroupItem {
					if i == 0 {
						deadline := time.Now().Add(10 * time.Second)
						for queued() < n-1 && time.Now().Before(deadline) {
							time.Sleep(time.Millisecond)
						}
					}
					return item(i)
				})
			}
			lead := make(chan error)
			go func() { lead <- commit(0) }()
			for queued() == 0 && !s.groupBusy() {
				time.Sleep(time.Millisecond)
			}
			var wg sync.WaitGroup
			for i := 1; i < n; i++ {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = commit(i) }()
			}
			errs[0] = <-lead
			wg.Wait()

			for i := range n {
				if want := i == tc.fail; (errs[i] != nil) != want || applied[i] == want {
					t.Errorf("commit %d: err %v, applied %v; want a failure: %v", i, errs[i], applied[i], want)
				}
				if err := s.View(func(tx *Tx) error {
					_, ok, err := tx.Manifest(uint64(100 + i))
					if err == nil && ok == (i == tc.fail) {
						err = fmt.Errorf("manifest committed: %v", ok)
					}
					return err
				}); err != nil {
					t.Errorf("commit %d: %v", i, err)
				}
			}
			// The leader's group, then one for the n-1 queued behind it; when
			// one failed, its group is retried member by member.
			want := uint64(2)
			if tc.fail >= 0 {
				want = 1 + n - 2
			}
			if got := commitGen(t, s) - gen0; got != want {
				t.Errorf("%d transactions for %d commits, want %d", got, n, want)
			}
		})
	}
}

func (s *Store) groupBusy() bool {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return s.group.busy
}

func commitGen(t *testing.T, s *Store) uint64 {
	t.Helper()
	var gen uint64
	if err := s.View(func(tx *Tx) error {
		gen, _ = tx.Uploads().Gens()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return gen
}

// TestCommitGroupWaitsForReturningWriters: writers that commit one file
// after another come back a moment after their group ends; the next leader
// waits for as many commits as the last cycle had (bounded by the last
// group's run time), so they share one transaction instead of the first one
// back committing alone. A writer left alone afterwards stops waiting once
// the expectation has followed it down.
func TestCommitGroupWaitsForReturningWriters(t *testing.T) {
	s := testStore(t, Options{})
	// Limits that do not depend on the machine's load: the leader waits for
	// the returning writers up to the last group's run (hold, below), and
	// the cycle stays fresh however slowly the goroutines are scheduled.
	s.group.window, s.group.fresh = time.Minute, time.Minute
	const hold = 500 * time.Millisecond
	ctx := context.Background()
	var lock sync.Mutex
	commit := func(i int, b *Batch, apply func()) error {
		ref, err := b.Put(ctx, pseudoRandom(1000, byte(i)))
		if err != nil {
			return err
		}
		return s.CommitGroup(ctx, b, &lock, func() GroupItem {
			return GroupItem{
				Update: func(tx *Tx) error { return tx.PutManifest(uint64(100+i), &Manifest{Chunks: []ChunkRef{ref}}) },
				Apply:  apply,
			}
		})
	}
	run := func(first int, n int, apply func()) {
		t.Helper()
		// Every writer says it is coming before the first one commits: one
		// group of n (the leader waits for the comers).
		bs := make([]*Batch, n)
		for i := range bs {
			bs[i] = s.NewBatch()
			bs[i].Committing()
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var a func()
				if i == 0 {
					a = apply
				}
				errs[i] = commit(first+i, bs[i], a)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("commit %d: %v", first+i, err)
			}
		}
	}

	// A cycle of 4 writers, one group whose run takes hold.
	gen0 := commitGen(t, s)
	run(0, 4, func() { time.Sleep(hold) })
	if got := commitGen(t, s) - gen0; got != 1 {
		t.Fatalf("%d transactions for the first 4 commits, want 1", got)
	}

	// The writers come back one by one, none having said it is coming: the
	// first leads and waits for the other three.
	gen1 := commitGen(t, s)
	lead := make(chan error, 1)
	go func() { lead <- commit(10, s.NewBatch(), nil) }()
	for !s.groupBusy() && len(lead) == 0 { // it leads, or it is done
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = commit(11+i, s.NewBatch(), nil) }()
	}
	wg.Wait()
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit %d: %v", 11+i, err)
		}
	}
	if got := commitGen(t, s) - gen1; got != 1 {
		t.Errorf("%d transactions for 4 returning writers, want 1 (they share the leader's group)", got)
	}

	// One writer left: its first commit waits for the others (at most the
	// last run), then the expectation is its own and it no longer waits.
	start := time.Now()
	if err := commit(20, s.NewBatch(), nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Minute/2 {
		t.Errorf("a lone commit after a cycle of 4 took %v: the wait is bounded by the last group's run", took)
	}
	if s.group.expect != 1 {
		t.Errorf("expecting %d commits after a lone one, want 1", s.group.expect)
	}
}
