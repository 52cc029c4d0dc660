package catalog

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

// TestDeltaWaitForget: Forget drops the waiting plans of a manifest's chunks
// but those keep names, and leaves released plans to the re-encoder;
// ReleaseIn releases the waiting ones; both keep delta_waiting right and
// read nothing more once no plan waits.
func TestDeltaWaitForget(t *testing.T) {
	d, _ := testDB(t)
	v := make([]ID, 5)
	for i := range v {
		v[i] = object.Sum(fmt.Appendf(nil, "forget version %d", i))
	}
	type state struct{ waits, row, planned, queued bool }
	get := func(tx *Tx, id ID) state {
		t.Helper()
		w := readWaitState(t, tx, id)
		return state{w.waits, w.row, w.planned, w.queued}
	}
	manifest := func(ids ...ID) *Manifest {
		m := &Manifest{}
		for _, id := range ids {
			m.Chunks = append(m.Chunks, ChunkRef{ID: id, Len: 100})
		}
		return m
	}
	err := d.Update(func(tx *Tx) error {
		for _, id := range v {
			if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 100, StoredLen: 100}); err != nil {
				return err
			}
		}
		// v1, v2, v3 wait; v2 is released (a later version came).
		for _, i := range []int{1, 2, 3} {
			if err := tx.Deltas().Plan(v[i], v[0], Hint{ElemSize: 2}, 100, 5, true); err != nil {
				return err
			}
		}
		if err := tx.Deltas().Release(v[2]); err != nil {
			return err
		}
		if n := tx.Counts().DeltaWaiting; n != 2 || !tx.Deltas().Waiting() {
			t.Fatalf("%d plans wait, want 2", n)
		}
		// A file of v0 (no plan), v1, v2, v3 and v1 again goes; the content
		// taking its place names v3.
		if err := tx.Deltas().Forget(manifest(v[0], v[1], v[2], v[3], v[1]), manifest(v[3], v[4])); err != nil {
			return err
		}
		for i, want := range []state{{}, {}, {row: true, planned: true, queued: true}, {waits: true, row: true, planned: true}} {
			if got := get(tx, v[i]); got != want {
				t.Errorf("after Forget: v%d %+v, want %+v", i, got, want)
			}
		}
		if n := tx.Counts().DeltaWaiting; n != 1 {
			t.Errorf("after Forget: %d plans wait, want 1 (v3)", n)
		}
		// The file holding v3 leaves its run.
		if err := tx.Deltas().ReleaseIn(manifest(v[3], v[0])); err != nil {
			return err
		}
		if got, want := get(tx, v[3]), (state{row: true, planned: true, queued: true}); got != want {
			t.Errorf("after ReleaseIn: v3 %+v, want %+v", got, want)
		}
		if n := tx.Counts().DeltaWaiting; n != 0 || tx.Deltas().Waiting() {
			t.Errorf("after ReleaseIn: %d plans wait, want none", n)
		}
		// Nothing waits: nothing is read, nothing changes.
		if err := tx.Deltas().Forget(manifest(v[2], v[3]), nil); err != nil {
			return err
		}
		if got := get(tx, v[2]); !got.planned || !got.queued {
			t.Errorf("a Forget with nothing waiting dropped v2's released plan: %+v", got)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
}
