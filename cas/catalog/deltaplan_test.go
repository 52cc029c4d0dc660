package catalog

import (
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
