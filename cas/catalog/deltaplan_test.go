package catalog

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

// TestPlanCandidates: a plan names the suggestion's keyframe when the
// suggestion is a delta or a keyframe, and the suggestion itself while the
// suggestion's own plan is not carried out; the re-encoder is offered the
// chain's keyframe first, then the chunks on the way, farthest first, each
// at its distance, whatever became of their plans.
func TestPlanCandidates(t *testing.T) {
	const keyframe = 5
	// Versions v0 … v4 of one chunk, each suggested against the one before;
	// "before" says what happened to earlier plans by the time of the step.
	type step struct {
		suggest int // version suggested as the base (-1: none)
		before  func(tx *Tx, v []ID) error
	}
	carryOut := func(id, base int, dist uint8) func(tx *Tx, v []ID) error {
		return func(tx *Tx, v []ID) error {
			if err := tx.Deltas().DropPlan(v[id]); err != nil {
				return err
			}
			return tx.Deltas().Put(v[id], DeltaLink{Base: v[base], Dist: dist})
		}
	}
	dropPlan := func(id int) func(tx *Tx, v []ID) error {
		return func(tx *Tx, v []ID) error { return tx.Deltas().DropPlan(v[id]) }
	}
	type link struct {
		base int
		dist uint8
	}
	cases := []struct {
		name  string
		steps []step // v1 … vn; v0 is the first version, unplanned
		row   link   // the last version's plan row
		want  []link // its candidates
	}{
		{"after a keyframe", []step{{0, nil}}, link{0, 1}, []link{{0, 1}}},
		{"after a delta", []step{{0, nil}, {1, carryOut(1, 0, 1)}}, link{0, 2}, []link{{0, 2}}},
		{"after a pending plan", []step{{0, nil}, {1, nil}}, link{1, 2}, []link{{0, 2}, {1, 1}}},
		{"after two pending plans", []step{{0, nil}, {1, nil}, {2, nil}}, link{2, 3},
			[]link{{0, 3}, {1, 2}, {2, 1}}},
		// v1's plan did not pay (v0 unrelated): v1 is a keyframe now.
		{"after a plan that did not pay", []step{{0, nil}, {1, nil}, {2, dropPlan(1)}}, link{2, 3},
			[]link{{1, 3}, {2, 1}}},
		{"after a plan carried out on the way", []step{{0, nil}, {1, nil}, {2, carryOut(1, 0, 1)}}, link{2, 3},
			[]link{{0, 3}, {2, 1}}},
		{"keyframe distance reached", []step{{0, nil}, {1, nil}, {2, nil}, {3, nil}, {4, nil}}, link{-1, 0}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, _ := testDB(t)
			v := make([]ID, len(c.steps)+1)
			for i := range v {
				v[i] = object.Sum(fmt.Appendf(nil, "%s version %d", c.name, i))
			}
			err := d.Update(func(tx *Tx) error {
				for _, id := range v {
					if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 100, StoredLen: 100}); err != nil {
						return err
					}
				}
				for i, st := range c.steps {
					if st.before != nil {
						if err := st.before(tx, v); err != nil {
							return err
						}
					}
					if err := tx.Deltas().Plan(v[i+1], v[st.suggest], Hint{ElemSize: 2}, 100, keyframe, false); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			last := v[len(v)-1]
			name := func(id ID) int { return slices.Index(v, id) }
			if err := d.View(func(tx *Tx) error {
				base, dist, ok, err := tx.DeltaPlan(last)
				if err != nil {
					return err
				}
				if got := (link{-1, 0}); ok {
					got = link{name(base), uint8(dist)}
					if got != c.row {
						t.Errorf("plan row %+v, want %+v", got, c.row)
					}
				} else if c.row.base >= 0 {
					t.Errorf("no plan row, want %+v", c.row)
				}
				cands, ok, err := tx.PlanCandidates(last)
				if err != nil {
					return err
				}
				var got []link
				for _, l := range cands {
					got = append(got, link{name(l.Base), l.Dist})
				}
				if !slices.Equal(got, c.want) || ok != (c.want != nil) {
					t.Errorf("candidates %+v (ok %v), want %+v", got, ok, c.want)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDeltaWaitRows: a waiting plan's row and the delta_waiting counter
// through Plan, Release and DropPlan, a released row's fallback, and a
// row an older ckptfs left behind (its plan carried out, the row kept).
func TestDeltaWaitRows(t *testing.T) {
	type state = waitState
	get := func(tx *Tx, id ID) state { t.Helper(); return readWaitState(t, tx, id) }
	d, _ := testDB(t)
	v := make([]ID, 4)
	for i := range v {
		v[i] = object.Sum(fmt.Appendf(nil, "wait version %d", i))
	}
	check := func(tx *Tx, what string, id ID, want state) {
		t.Helper()
		if got := get(tx, id); got != want {
			t.Errorf("%s: %+v, want %+v", what, got, want)
		}
	}
	err := d.Update(func(tx *Tx) error {
		for _, id := range v {
			if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 100, StoredLen: 100}); err != nil {
				return err
			}
		}
		if err := tx.Deltas().Plan(v[1], v[0], Hint{ElemSize: 2}, 100, 5, true); err != nil {
			return err
		}
		check(tx, "v1 planned", v[1], state{waits: true, row: true, planned: true, counter: 1})
		if err := tx.Deltas().Plan(v[2], v[1], Hint{ElemSize: 2}, 100, 5, true); err != nil {
			return err
		}
		if err := tx.Deltas().Release(v[1]); err != nil {
			return err
		}
		check(tx, "v1 released", v[1], state{row: true, released: true, planned: true, queued: true, counter: 1})
		check(tx, "v2 planned", v[2], state{waits: true, row: true, planned: true, counter: 1})
		if w, _, _ := tx.DeltaWait(v[2]); w.Fallback != (DeltaLink{Base: v[0], Dist: 2}) || w.Hint.ElemSize != 2 {
			t.Errorf("v2's wait row %+v, want the hint and v0 at 2 as its fallback", w)
		}
		if err := tx.Deltas().Release(v[1]); err != nil { // twice: nothing more
			return err
		}
		check(tx, "v1 released twice", v[1], state{row: true, released: true, planned: true, queued: true, counter: 1})
		if err := tx.Deltas().DropPlan(v[2]); err != nil {
			return err
		}
		check(tx, "v2 dropped", v[2], state{})
		// What an older ckptfs leaves: the plan carried out, its row kept.
		if err := tx.Deltas().Plan(v[3], v[0], Hint{}, 100, 5, true); err != nil {
			return err
		}
		if err := tx.b(bucketDeltaPlans).Delete(v[3][:]); err != nil {
			return err
		}
		check(tx, "v3 left by an older ckptfs", v[3], state{waits: true, row: true, counter: 1})
		if err := tx.Deltas().Plan(v[3], v[0], Hint{}, 100, 5, false); err != nil {
			return err
		}
		check(tx, "v3 planned again, not waiting", v[3], state{planned: true, queued: true, counter: 0})
		if err := tx.Deltas().Release(v[1]); err != nil {
			return err
		}
		if err := tx.Deltas().DropPlan(v[1]); err != nil {
			return err
		}
		check(tx, "v1 dropped (its queue row is the caller's)", v[1], state{queued: true, counter: 0})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeltaWaitSettle: Settle drops the wait rows whose chunk or plan is
// gone and, asked to, releases the plans that wait; it leaves released rows
// and, not asked to release, waiting ones.
func TestDeltaWaitSettle(t *testing.T) {
	d, _ := testDB(t)
	v := make([]ID, 5)
	for i := range v {
		v[i] = object.Sum(fmt.Appendf(nil, "settle version %d", i))
	}
	counts := func(tx *Tx) (waiting, pending int64) {
		c := tx.Counts()
		return c.DeltaWaiting, c.ReencodePending
	}
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			err := d.Update(func(tx *Tx) error {
				for _, id := range v[:4] { // v[4] is never indexed
					if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 100, StoredLen: 100}); err != nil {
						return err
					}
				}
				// v1 waits; v2 released (v3's commit); v3 waits, its plan
				// gone (an older re-encoder); v4's chunk is gone.
				for _, p := range [][2]int{{1, 0}, {2, 1}, {3, 2}, {4, 3}} {
					if err := tx.Deltas().Plan(v[p[0]], v[p[1]], Hint{ElemSize: 2}, 100, 5, true); err != nil {
						return err
					}
				}
				if err := tx.Deltas().Release(v[2]); err != nil {
					return err
				}
				if err := tx.b(bucketDeltaPlans).Delete(v[3][:]); err != nil {
					return err
				}
				w0, p0 := counts(tx)
				dropped, released, err := tx.Deltas().Settle(release)
				if err != nil {
					return err
				}
				w, p := counts(tx)
				wantReleased := 0
				if release {
					wantReleased = 1 // v1
				}
				if dropped != 2 || released != wantReleased || w != w0-2-int64(wantReleased) || p != p0+int64(wantReleased) {
					t.Errorf("settle: dropped %d, released %d, waiting %d→%d, queued %d→%d; want 2, %d, %d, %d",
						dropped, released, w0, w, p0, p, wantReleased, w0-2-int64(wantReleased), p0+int64(wantReleased))
				}
				for i, want := range []bool{false, !release, false, false, false} {
					if waits, err := tx.DeltaWaits(v[i]); err != nil || waits != want {
						t.Errorf("v%d waits %v (%v), want %v", i, waits, err, want)
					}
				}
				for _, i := range []int{3, 4} {
					if _, row, err := tx.DeltaWait(v[i]); err != nil || row {
						t.Errorf("v%d's stale wait row kept (%v)", i, err)
					}
				}
				if _, row, _ := tx.DeltaWait(v[2]); !row {
					t.Error("v2's released row dropped: its fallback is gone")
				}
				// Again: nothing left to do.
				if dropped, released, err := tx.Deltas().Settle(release); err != nil || dropped != 0 || released != 0 {
					t.Errorf("settle again: dropped %d, released %d (%v)", dropped, released, err)
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatal(err)
			}
		})
	}
}

// errRollback ends an Update whose changes a test throws away.
var errRollback = errors.New("roll back")

// waitState is what the delta-wait tests compare of a chunk: whether its
// plan waits, its wait row, the row's released mark, its plan, its queue
// row, and the store's delta_waiting counter.
type waitState struct {
	waits, row, released, planned, queued bool
	counter                               int64
}

// readWaitState reads id's waitState in tx.
func readWaitState(t *testing.T, tx *Tx, id ID) waitState {
	t.Helper()
	w, row, err := tx.DeltaWait(id)
	if err != nil {
		t.Fatal(err)
	}
	waits, err := tx.DeltaWaits(id)
	if err != nil {
		t.Fatal(err)
	}
	_, _, planned, err := tx.DeltaPlan(id)
	if err != nil {
		t.Fatal(err)
	}
	_, queued, err := tx.PendingReencode(id)
	if err != nil {
		t.Fatal(err)
	}
	return waitState{waits, row, w.Released, planned, queued, tx.Counts().DeltaWaiting}
}
