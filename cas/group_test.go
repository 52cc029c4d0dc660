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
