package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// stepChain returns n versions of a bf16 chunk of elems elements, each an
// Adam-like step (every element moved by ~rel of the typical magnitude) from
// the one before.
func stepChain(seed uint64, elems, n int, rel float64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 11))
	w := make([]float64, elems)
	for i := range w {
		w[i] = rng.NormFloat64() * 0.02
	}
	out := make([][]byte, n)
	for v := range out {
		b := make([]byte, 2*elems)
		for i := range w {
			if v > 0 {
				w[i] += rng.NormFloat64() * 0.02 * rel
			}
			binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(float32(w[i]))>>16))
		}
		out[v] = b
	}
	return out
}

// commitVersion commits data as one chunk, suggesting prev as its base.
func commitVersion(t *testing.T, s *Store, data []byte, prev *ChunkRef) ChunkRef {
	t.Helper()
	ctx := context.Background()
	b := s.NewBatch()
	ref, err := b.PutHinted(ctx, data, Hint{ElemSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if prev != nil {
		b.SuggestBase(ref.ID, prev.ID)
	}
	if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return ref
}

// commitNext commits data as the next version of the chain refs (suggested
// against its last version, if any) and returns the chain with it.
func commitNext(t *testing.T, s *Store, refs []ChunkRef, data []byte) []ChunkRef {
	t.Helper()
	var prev *ChunkRef
	if len(refs) > 0 {
		prev = &refs[len(refs)-1]
	}
	return append(refs, commitVersion(t, s, data, prev))
}

// chainWant is what version i of a chain of deltas is: a delta against
// version base at distance dist, or not.
type chainWant struct {
	delta bool
	base  int
	dist  int
}

// keyframe3 is a chain with DeltaKeyframe 3: v0 key, v1 d1, v2 d2, v3 key,
// v4 d1, v5 d2, v6 key.
var keyframe3 = []chainWant{{false, 0, 0}, {true, 0, 1}, {true, 0, 2}, {false, 0, 0}, {true, 3, 1}, {true, 3, 2}, {false, 0, 0}}

type deltaState struct {
	base    ID
	dist    int
	isDelta bool // delta row
	object  bool // the object's header says delta
}

func deltaOf(t *testing.T, s *Store, id ID) deltaState {
	t.Helper()
	var st deltaState
	if err := s.View(func(tx *Tx) error {
		var err error
		st.base, st.dist, st.isDelta, err = tx.Delta(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, base, delta, err := s.VerifyObjectBase(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if delta && base != st.base {
		t.Fatalf("chunk %v: object's base %v, row's %v", id, base, st.base)
	}
	st.object = delta
	return st
}

// TestDeltaWriter: suggested chunks become deltas against one keyframe per
// chain, read back exact, are smaller, and the store moves to format 3.
func TestDeltaWriter(t *testing.T) {
	for _, inline := range []int{-1, 0} { // stored raw then queued; encoded inline then planned
		s := testStore(t, Options{InlineEncoders: inline, DeltaKeyframe: 3})
		vs := stepChain(1, 256<<10, 7, 0.01)
		var refs []ChunkRef
		for _, v := range vs {
			refs = commitNext(t, s, refs, v)
		}
		if f := s.Format(); f != 2 {
			t.Fatalf("format %d before any delta, want 2", f)
		}
		drain(t, s)
		checkCounters(t, s)
		want := keyframe3
		var stored, standalone int64
		for i, r := range refs {
			st := deltaOf(t, s, r.ID)
			w := want[i]
			if st.isDelta != w.delta || st.object != w.delta || (w.delta && (st.base != refs[w.base].ID || st.dist != w.dist)) {
				t.Errorf("inline %d, version %d: %+v, want delta %v against version %d at %d", inline, i, st, w.delta, w.base, w.dist)
			}
			var info ChunkInfo
			_ = s.View(func(tx *Tx) error { info, _, _ = tx.Chunk(r.ID); return nil })
			if w.delta {
				stored += int64(info.StoredLen)
			} else {
				standalone += int64(info.StoredLen)
			}
			s.cache.drop(r.ID)
			for _, b := range refs {
				s.cache.drop(b.ID)
			}
			got, err := s.ReadChunk(context.Background(), r)
			if err != nil || !bytes.Equal(got, vs[i]) {
				t.Fatalf("version %d reads back wrong: %v", i, err)
			}
		}
		t.Logf("inline %d: 4 deltas %d bytes, 3 keyframes %d bytes", inline, stored, standalone)
		if stored*3 > standalone*2*4/3 {
			t.Errorf("deltas take %d bytes (4), standalone keyframes %d (3): no gain", stored, standalone)
		}
		if f := s.Format(); f != 3 {
			t.Errorf("format %d after deltas, want 3", f)
		}
		if c := mustCounts(t, s); c.DeltaChunks != 4 || c.ReencodePending != 0 {
			t.Errorf("counts %+v, want 4 deltas and an empty queue", c)
		}

		// A base is kept while a delta row names it; deltas first, then it.
		r, err := s.Sweep(context.Background(), []ID{refs[0].ID})
		if err != nil || r.BasesKept != 1 || r.Chunks != 0 {
			t.Fatalf("sweep of a base with live deltas: %+v, %v", r, err)
		}
		r, err = s.Sweep(context.Background(), []ID{refs[0].ID, refs[1].ID, refs[2].ID})
		if err != nil || r.BasesKept != 0 || r.Chunks != 3 {
			t.Fatalf("sweep of a base with its deltas: %+v, %v", r, err)
		}
		for _, i := range []int{3, 4, 5, 6} {
			if _, err := s.ReadChunk(context.Background(), refs[i]); err != nil {
				t.Fatalf("version %d after the sweep: %v", i, err)
			}
		}
		if c := mustCounts(t, s); c.DeltaChunks != 2 {
			t.Errorf("%d delta rows after sweeping two deltas, want 2", c.DeltaChunks)
		}
		checkCounters(t, s)
	}
}

// waits reports whether chunk id has a plan that waits for a later version.
func waits(t *testing.T, s *Store, id ID) (planned, waiting bool) {
	t.Helper()
	if err := s.View(func(tx *Tx) error {
		var err error
		if _, _, planned, err = tx.DeltaPlan(id); err != nil {
			return err
		}
		waiting, err = tx.DeltaWaits(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return planned, waiting
}

// TestDeltaLatestWhole: with Options.DeltaLatestWhole the newest version of
// a chunk stays whole however long the re-encoder runs, and becomes the
// delta it would have been once the next version is committed: the same
// chains as TestDeltaWriter's, one version late.
func TestDeltaLatestWhole(t *testing.T) {
	for _, inline := range []int{-1, 0} { // stored raw then queued; encoded inline then planned
		s := testStore(t, Options{InlineEncoders: inline, DeltaKeyframe: 3, DeltaLatestWhole: true})
		vs := stepChain(1, 256<<10, 6, 0.01)
		want := keyframe3[:6] // the last version a delta, once a later one comes
		var refs []ChunkRef
		for i, v := range vs {
			refs = commitNext(t, s, refs, v)
			drain(t, s)
			if c := checkCounters(t, s); (c.DeltaWaiting == 1) != want[i].delta || c.DeltaWaiting > 1 {
				t.Errorf("inline %d, after version %d: %d waiting plans", inline, i, c.DeltaWaiting)
			}
			for j, r := range refs {
				st := deltaOf(t, s, r.ID)
				w := want[j]
				if j == i {
					w.delta = false // the newest: whole
				}
				if st.isDelta != w.delta || st.object != w.delta || (w.delta && (st.base != refs[w.base].ID || st.dist != w.dist)) {
					t.Errorf("inline %d, after version %d: version %d %+v, want delta %v against version %d at %d",
						inline, i, j, st, w.delta, w.base, w.dist)
				}
				s.cache.drop(r.ID)
				s.cache.drop(refs[w.base].ID)
				if got, err := s.ReadChunk(context.Background(), r); err != nil || !bytes.Equal(got, vs[j]) {
					t.Fatalf("inline %d, after version %d: version %d reads back wrong: %v", inline, i, j, err)
				}
			}
			// The newest's plan (none for a keyframe) waits; no older one does.
			if planned, waiting := waits(t, s, refs[i].ID); planned != want[i].delta || waiting != want[i].delta {
				t.Errorf("inline %d: version %d's plan %v, waiting %v; want both %v", inline, i, planned, waiting, want[i].delta)
			}
			if i > 0 {
				if planned, waiting := waits(t, s, refs[i-1].ID); planned || waiting {
					t.Errorf("inline %d: version %d's plan %v, waiting %v after version %d", inline, i-1, planned, waiting, i)
				}
			}
		}
		if c := mustCounts(t, s); c.DeltaChunks != 3 || c.ReencodePending != 0 {
			t.Errorf("inline %d: counts %+v, want 3 deltas (the newest whole) and an empty queue", inline, c)
		}
		if inline < 0 {
			// Stored raw, the newest was still encoded while it waited.
			var info ChunkInfo
			_ = s.View(func(tx *Tx) error { info, _, _ = tx.Chunk(refs[5].ID); return nil })
			if info.Codec == CodecRaw {
				t.Errorf("the newest version stayed raw while its plan waited: %+v", info)
			}
		}
		// A sweep of the waiting chunk takes its rows.
		if _, err := s.Sweep(context.Background(), []ID{refs[5].ID}); err != nil {
			t.Fatal(err)
		}
		if planned, waiting := waits(t, s, refs[5].ID); planned || waiting {
			t.Errorf("inline %d: swept chunk keeps plan %v, wait %v", inline, planned, waiting)
		}
		checkCounters(t, s)
	}
}

// TestDeltaLatestWholeVersionSwept: a collection that takes the version a
// waiting plan names (a rotation deleted it) leaves the plan its fallback:
// the keyframe the chain led to.
func TestDeltaLatestWholeVersionSwept(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1, DeltaLatestWhole: true})
	vs := stepChain(4, 256<<10, 4, 0.01)
	var refs []ChunkRef
	for _, v := range vs[:3] {
		refs = commitNext(t, s, refs, v)
		drain(t, s)
	}
	// v1 is a delta against v0, and v2's plan, waiting, names v1.
	if st := deltaOf(t, s, refs[1].ID); !st.isDelta || st.base != refs[0].ID {
		t.Fatalf("v1: %+v, want a delta against v0", st)
	}
	if r, err := s.Sweep(context.Background(), []ID{refs[1].ID}); err != nil || r.Chunks != 1 {
		t.Fatalf("sweep of v1: %+v, %v", r, err)
	}
	refs = append(refs, commitVersion(t, s, vs[3], &refs[2])) // releases v2
	drain(t, s)
	if st := deltaOf(t, s, refs[2].ID); !st.isDelta || !st.object || st.base != refs[0].ID || st.dist != 2 {
		t.Fatalf("v2 after v1 was swept: %+v, want a delta against v0 at 2", st)
	}
	if st := deltaOf(t, s, refs[3].ID); st.isDelta || st.object {
		t.Fatalf("v3, the latest: %+v, want whole", st)
	}
	s.cache.drop(refs[2].ID)
	s.cache.drop(refs[0].ID)
	if got, err := s.ReadChunk(context.Background(), refs[2]); err != nil || !bytes.Equal(got, vs[2]) {
		t.Fatalf("v2 reads back wrong: %v", err)
	}
	checkCounters(t, s)
}

// TestDeltaLatestWholeReleases: a waiting plan is released by any later
// version, also one whose bytes the store already holds, and also after
// the store is opened with deltas off (--delta-keyframe 1).
func TestDeltaLatestWholeReleases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reopen Options // the options the later version is committed with
		dedup  bool    // its bytes are in the store already
	}{
		{"a later version already stored", Options{InlineEncoders: -1, DeltaLatestWhole: true}, true},
		{"deltas turned off since", Options{InlineEncoders: -1, DeltaKeyframe: -1}, false},
		{"eager planning since", Options{InlineEncoders: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			s, err := openLocal(dir, Options{InlineEncoders: -1, DeltaLatestWhole: true})
			if err != nil {
				t.Fatal(err)
			}
			vs := stepChain(5, 256<<10, 3, 0.01)
			v0 := commitVersion(t, s, vs[0], nil)
			v1 := commitVersion(t, s, vs[1], &v0)
			drain(t, s)
			if planned, waiting := waits(t, s, v1.ID); !planned || !waiting {
				t.Fatalf("v1: planned %v, waiting %v", planned, waiting)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = testStoreAt(t, dir, tc.reopen)
			if tc.dedup {
				commitVersion(t, s, vs[2], nil)
			}
			commitVersion(t, s, vs[2], &v1)
			drain(t, s)
			if st := deltaOf(t, s, v1.ID); !st.isDelta || !st.object || st.base != v0.ID {
				t.Fatalf("v1 after a later version: %+v, want a delta against v0", st)
			}
			if planned, waiting := waits(t, s, v1.ID); planned || waiting {
				t.Fatalf("v1 carried out keeps plan %v, wait %v", planned, waiting)
			}
			checkCounters(t, s)
		})
	}
}

// TestDeltaReleasedDuringReencode: a waiting chunk's standalone re-encode
// that finishes after the next version released its plan leaves it queued,
// so that the plan is carried out by the next round, not lost.
func TestDeltaReleasedDuringReencode(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{InlineEncoders: -1, DeltaLatestWhole: true})
	vs := stepChain(3, 256<<10, 3, 0.01)
	v0 := commitVersion(t, s, vs[0], nil)
	drain(t, s)
	v1 := commitVersion(t, s, vs[1], &v0) // raw: queued, and its plan waits
	// Between its object's rename and its transaction, the next version
	// releases v1's plan.
	released := false
	if err := s.re.reencode(ctx, []ID{v1.ID}, func(id ID) error {
		if planned, waiting := waits(t, s, v1.ID); !planned || !waiting {
			t.Errorf("re-encoding v1: planned %v, waiting %v", planned, waiting)
		}
		commitVersion(t, s, vs[2], &v1)
		released = true
		return nil
	}); err != nil || !released {
		t.Fatalf("re-encode: %v (released %v)", err, released)
	}
	if st := deltaOf(t, s, v1.ID); st.isDelta || st.object {
		t.Fatalf("v1 became a delta while it waited: %+v", st)
	}
	var queued bool
	_ = s.View(func(tx *Tx) error { _, queued, _ = tx.PendingReencode(v1.ID); return nil })
	if planned, waiting := waits(t, s, v1.ID); !queued || !planned || waiting {
		t.Fatalf("after the release: queued %v, planned %v, waiting %v; want queued and planned", queued, planned, waiting)
	}
	drain(t, s)
	if st := deltaOf(t, s, v1.ID); !st.isDelta || !st.object || st.base != v0.ID {
		t.Fatalf("released plan not carried out: %+v", st)
	}
	checkCounters(t, s)
}

// TestDeltaAfterUnrelatedSuggestion: a new run's first save is suggested
// against the previous run's file of the same name (fusefs looks one level
// up), an unrelated chunk; the run's next saves, committed before the
// re-encoder got to any of them, still become deltas against that first
// save. Their plans named the unrelated chunk's keyframe before, and none
// of the run's chunks became a delta.
func TestDeltaAfterUnrelatedSuggestion(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1})
	other := stepChain(1, 256<<10, 1, 0.01)[0]
	k := commitVersion(t, s, other, nil)
	vs := stepChain(2, 256<<10, 3, 0.01)
	refs := []ChunkRef{commitVersion(t, s, vs[0], &k)}
	for _, v := range vs[1:] {
		refs = append(refs, commitVersion(t, s, v, &refs[len(refs)-1]))
	}
	drain(t, s)
	for i, r := range refs {
		// Version i is i versions from version 0; its distance may count the
		// unrelated chunk's step too when version 0's failed plan was
		// dropped first (PlanCandidates): a keyframe one version early.
		st := deltaOf(t, s, r.ID)
		delta := i > 0
		if st.isDelta != delta || st.object != delta || (delta && (st.base != refs[0].ID || st.dist < i || st.dist > i+1)) {
			t.Errorf("version %d: %+v, want delta %v against version 0 at %d or %d", i, st, delta, i, i+1)
		}
		s.cache.drop(r.ID)
		s.cache.drop(refs[0].ID)
		if got, err := s.ReadChunk(context.Background(), r); err != nil || !bytes.Equal(got, vs[i]) {
			t.Fatalf("version %d reads back wrong: %v", i, err)
		}
	}
	checkCounters(t, s)
}

// TestDeltaWriterRefusals: no delta against a swept base, over the length
// limit of the suggestion, or when it does not pay; an old delta object
// found on disk is not reused.
func TestDeltaWriterRefusals(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{InlineEncoders: -1})
	vs := stepChain(2, 64<<10, 2, 0.01)
	r0 := commitVersion(t, s, vs[0], nil)
	r1 := commitVersion(t, s, vs[1], &r0)
	// The base goes before the re-encoder runs: the chunk is encoded alone.
	if r, err := s.Sweep(ctx, []ID{r0.ID}); err != nil || r.Chunks != 1 {
		t.Fatalf("sweep: %+v %v", r, err)
	}
	drain(t, s)
	if st := deltaOf(t, s, r1.ID); st.isDelta || st.object {
		t.Errorf("delta against a swept base: %+v", st)
	}

	// Unrelated bytes: the delta does not pay.
	other := stepChain(3, 64<<10, 1, 0)[0]
	r2 := commitVersion(t, s, other, &r1)
	drain(t, s)
	if st := deltaOf(t, s, r2.ID); st.isDelta {
		t.Errorf("delta of unrelated bytes kept: %+v", st)
	}

	// A suggestion of another length is ignored at commit.
	short := commitVersion(t, s, vs[0][:4096], &r2)
	if err := s.View(func(tx *Tx) error {
		if _, _, ok, err := tx.DeltaPlan(short.ID); ok || err != nil {
			t.Errorf("plan for a chunk of another length than its suggestion (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A delta object left on disk without rows (its commit swept) is
	// replaced by a standalone object when the chunk is stored again.
	vs2 := stepChain(4, 64<<10, 2, 0.01)
	a := commitVersion(t, s, vs2[0], nil)
	b := commitVersion(t, s, vs2[1], &a)
	drain(t, s)
	if st := deltaOf(t, s, b.ID); !st.isDelta {
		t.Fatalf("no delta written: %+v", st)
	}
	if r, err := s.Sweep(ctx, []ID{b.ID}); err != nil || r.Chunks != 1 {
		t.Fatalf("sweep: %+v %v", r, err)
	}
	storeDelta(t, s, vs2[1], b, vs2[0], a.ID) // as a crash between the sweep's row and object deletion would leave it
	b2 := commitVersion(t, s, vs2[1], nil)
	if st := deltaOf(t, s, b2.ID); st.object || st.isDelta {
		t.Errorf("an unrecorded delta object was reused: %+v", st)
	}
	// Its base can now go: nothing names it.
	if r, err := s.Sweep(ctx, []ID{a.ID}); err != nil || r.Chunks != 1 {
		t.Fatalf("sweep of the former base: %+v %v", r, err)
	}
	if _, err := s.ReadChunk(ctx, b2); err != nil {
		t.Fatal(err)
	}
}

// TestDeltaReencodeCrashWindow: a delta re-encode stopped after its rename
// and before its last transaction leaves rows that keep the base; the next
// run finishes it.
func TestDeltaReencodeCrashWindow(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{InlineEncoders: -1})
	vs := stepChain(5, 64<<10, 2, 0.01)
	r0 := commitVersion(t, s, vs[0], nil)
	drain(t, s)
	r1 := commitVersion(t, s, vs[1], &r0)
	crash := errors.New("crash")
	if _, err := s.re.reencodeGroup(ctx, 1, func(ID) error { return crash }); !errors.Is(err, crash) {
		t.Fatalf("re-encode: %v", err)
	}
	if r, err := s.Sweep(ctx, []ID{r0.ID}); err != nil || r.BasesKept != 1 {
		t.Fatalf("base swept in the crash window: %+v %v", r, err)
	}
	drain(t, s)
	if st := deltaOf(t, s, r1.ID); !st.isDelta || !st.object {
		t.Errorf("after the next run: %+v", st)
	}
	checkCounters(t, s)
	s.cache.drop(r0.ID)
	s.cache.drop(r1.ID)
	if got, err := s.ReadChunk(ctx, r1); err != nil || !bytes.Equal(got, vs[1]) {
		t.Fatal(err)
	}
}

func mustCounts(t *testing.T, s *Store) Counts {
	t.Helper()
	var c Counts
	if err := s.View(func(tx *Tx) error { c = tx.Counts(); return nil }); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReencodeGroup: a group re-encodes raw chunks and planned deltas in one
// sync and one transaction; stopped after its renames (a crash before the
// transaction), the next group repairs every row.
func TestReencodeGroup(t *testing.T) {
	ctx := context.Background()
	for _, crash := range []bool{false, true} {
		s := testStore(t, Options{InlineEncoders: -1})
		var refs []ChunkRef
		var data [][]byte
		for c := range 3 { // three chains of three versions
			vs := stepChain(uint64(10+c), 32<<10, 3, 0.01)
			var prev *ChunkRef
			for _, v := range vs {
				r := commitVersion(t, s, v, prev)
				refs, data = append(refs, r), append(data, v)
				prev = &refs[len(refs)-1]
			}
		}
		if crash {
			stop := errors.New("crash")
			if _, err := s.re.reencodeGroup(ctx, 16, func(ID) error { return stop }); !errors.Is(err, stop) {
				t.Fatalf("group: %v", err)
			}
			if c := mustCounts(t, s); c.ReencodePending != 9 {
				t.Fatalf("after the crash: %d queued, want all 9 still queued", c.ReencodePending)
			}
		}
		more, err := s.Reencode(ctx, 16)
		if err != nil || more {
			t.Fatalf("group: more %v, %v", more, err)
		}
		c := checkCounters(t, s)
		if c.ReencodePending != 0 || mustCounts(t, s).DeltaChunks != 6 {
			t.Errorf("crash %v: counts %+v, want an empty queue and 6 deltas", crash, mustCounts(t, s))
		}
		for i, r := range refs {
			s.cache.drop(r.ID)
			st := deltaOf(t, s, r.ID)
			if want := i%3 != 0; st.isDelta != want || st.object != want {
				t.Errorf("crash %v, chunk %d: %+v, want delta %v", crash, i, st, want)
			}
			if got, err := s.ReadChunk(ctx, r); err != nil || !bytes.Equal(got, data[i]) {
				t.Fatalf("chunk %d reads back wrong: %v", i, err)
			}
		}
	}
}

// TestDeltaSweptKeyframeRestartsChain: a collection that sweeps a keyframe
// no file uses any more before the re-encoder carried out the plans against
// it (a rotation, then gc) leaves the next version whole, and the chain goes
// on from that version as from a keyframe. That costs less than keeping the
// dead keyframe for the plans would: the versions kept take fewer stored
// bytes than they would beside it (cas/deltaplan.go).
func TestDeltaSweptKeyframeRestartsChain(t *testing.T) {
	for _, latestWhole := range []bool{false, true} {
		t.Run(fmt.Sprintf("latestWhole=%v", latestWhole), func(t *testing.T) {
			ctx := context.Background()
			vs := stepChain(5, 64<<10, 4, 0.01)
			// Versions 0..2 in each store; with latestWhole a third version
			// releases the second's plan. kept: every version stays (the
			// keyframe too); swept: version 0 goes before the re-encoder.
			build := func(sweep bool) (*Store, []ChunkRef) {
				s := testStore(t, Options{InlineEncoders: -1, DeltaLatestWhole: latestWhole})
				var refs []ChunkRef
				for _, v := range vs {
					refs = commitNext(t, s, refs, v)
				}
				if sweep {
					if r, err := s.Sweep(ctx, []ID{refs[0].ID}); err != nil || r.Chunks != 1 {
						t.Fatalf("sweep: %+v %v", r, err)
					}
				}
				drain(t, s)
				return s, refs
			}
			kept, krefs := build(false)
			swept, srefs := build(true)
			if st := deltaOf(t, swept, srefs[1].ID); st.isDelta || st.object {
				t.Errorf("version 1 of the swept chain: %+v, want whole", st)
			}
			last := len(vs) - 1
			if latestWhole {
				last-- // the newest stays whole until a later version
			}
			for i := 2; i <= last; i++ {
				if st := deltaOf(t, swept, srefs[i].ID); !st.isDelta || st.base != srefs[1].ID {
					t.Errorf("version %d of the swept chain: %+v, want a delta against version 1", i, st)
				}
				if st := deltaOf(t, kept, krefs[i].ID); !st.isDelta || st.base != krefs[0].ID {
					t.Errorf("version %d of the kept chain: %+v, want a delta against version 0", i, st)
				}
			}
			stored := func(s *Store, refs []ChunkRef) (n int64) {
				if err := s.View(func(tx *Tx) error {
					for _, r := range refs {
						info, ok, err := tx.Chunk(r.ID)
						if err != nil || !ok {
							return fmt.Errorf("chunk %v: %v %v", r.ID, ok, err)
						}
						n += int64(info.StoredLen)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if k, s := stored(kept, krefs), stored(swept, srefs[1:]); s >= k {
				t.Errorf("versions 1..%d stored in %d bytes after the sweep, %d with the keyframe kept: keeping would pay", len(vs)-1, s, k)
			} else {
				t.Logf("stored: %d bytes with the dead keyframe kept, %d without", k, s)
			}
			for i, r := range srefs[1:] {
				swept.cache.drop(r.ID)
				if got, err := swept.ReadChunk(ctx, r); err != nil || !bytes.Equal(got, vs[i+1]) {
					t.Fatalf("version %d reads back wrong: %v", i+1, err)
				}
			}
			checkCounters(t, kept)
			checkCounters(t, swept)
		})
	}
}

// TestSettleDeltaWaitsReleasesForEagerMount: a store whose latest save
// waited (DeltaLatestWhole), opened again without it and settled as a
// mount does, codes that save as a delta; opened with it, the save still
// waits.
func TestSettleDeltaWaitsReleasesForEagerMount(t *testing.T) {
	for _, whole := range []bool{true, false} {
		t.Run(fmt.Sprintf("whole=%v", whole), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			s := testStore(t, Options{InlineEncoders: -1, DeltaLatestWhole: true}, dir)
			var refs []ChunkRef
			for _, v := range stepChain(7, 64<<10, 2, 0.01) {
				refs = commitNext(t, s, refs, v)
			}
			drain(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = testStore(t, Options{InlineEncoders: -1, DeltaLatestWhole: whole}, dir)
			dropped, released, err := s.SettleDeltaWaits()
			if err != nil || dropped != 0 || released != map[bool]int{true: 0, false: 1}[whole] {
				t.Fatalf("settle: dropped %d, released %d (%v)", dropped, released, err)
			}
			drain(t, s)
			if st := deltaOf(t, s, refs[1].ID); st.isDelta == whole {
				t.Errorf("the latest save after settling with whole=%v: %+v", whole, st)
			}
			checkCounters(t, s)
		})
	}
}
