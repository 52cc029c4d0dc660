package remote

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// trashFixture is a prefix with live writer sessions on it: writer 0 wrote
// and removed file "f" (its chunks now unnamed), every other writer wrote
// one file of its own.
type trashFixture struct {
	remote  backend.Backend
	stores  []*cas.Store
	tiers   []*Tier
	sess    []*Session
	f       []byte   // the removed file's bytes
	fChunks []cas.ID // its chunks
	kept    [][]byte // per writer > 0, its file "w<i>"
	slowMod bool     // the bucket keeps ModTimes in seconds
	opts    SessionOptions
}

func newTrashFixture(t *testing.T, remote backend.Backend, writers int, opts SessionOptions, slowMod bool) *trashFixture {
	t.Helper()
	ctx := context.Background()
	fx := &trashFixture{remote: remote, f: pseudoRandom(200000, 31), slowMod: slowMod, opts: opts}
	for i := range writers {
		s, r := testStore(t, remote)
		sess, err := joinOpts(s, r, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.Close(context.WithoutCancel(ctx)) })
		fx.stores, fx.tiers, fx.sess = append(fx.stores, s), append(fx.tiers, r), append(fx.sess, sess)
		fx.kept = append(fx.kept, nil)
		if i > 0 {
			fx.kept[i] = pseudoRandom(70000+i, byte(40+i))
			commitNamed(t, s, "w"+string(rune('0'+i)), fx.kept[i])
		}
	}
	commitNamed(t, fx.stores[0], "f", fx.f)
	fx.roundAll(t)
	for _, c := range readPublished(t, remote)["f"].m.Chunks {
		fx.fChunks = append(fx.fChunks, c.ID)
	}
	unlinkNamed(t, fx.stores[0], "f")
	fx.roundAll(t)
	fx.age()
	return fx
}

// age lets the bucket's clock pass the chunks' ModTimes.
func (fx *trashFixture) age() {
	if fx.slowMod {
		time.Sleep(1100 * time.Millisecond)
	} else {
		time.Sleep(5 * time.Millisecond)
	}
}

func (fx *trashFixture) roundAll(t *testing.T, skip ...int) {
	t.Helper()
	for i, r := range fx.tiers {
		if !containsInt(skip, i) {
			if err := r.UploadRound(context.Background(), true); err != nil {
				t.Fatalf("writer %d's round: %v", i, err)
			}
		}
	}
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// inBucket counts the chunks of ids the bucket holds.
func inBucket(t *testing.T, be backend.Backend, ids []cas.ID) int {
	t.Helper()
	n := 0
	for _, id := range ids {
		_, err := be.Stat(context.Background(), chunkHandle(id))
		switch {
		case err == nil:
			n++
		case !errors.Is(err, backend.ErrNotExist):
			t.Fatal(err)
		}
	}
	return n
}

// trashLists returns the IDs of the trash lists in the bucket.
func trashLists(t *testing.T, be backend.Backend) []string {
	t.Helper()
	var out []string
	if err := be.List(context.Background(), backend.Lock, func(in backend.Info) error {
		if strings.HasPrefix(in.Handle.Name, trashPrefix) {
			out = append(out, strings.TrimPrefix(in.Handle.Name, trashPrefix))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// readFresh reads published file name from a fresh store on be.
func readFresh(t *testing.T, be backend.Backend, name string) []byte {
	t.Helper()
	e, ok := readPublished(t, be)[name]
	if !ok || e.m == nil {
		t.Fatalf("%s is not published", name)
	}
	s := mustFresh(t, be)
	var got []byte
	for _, ref := range e.m.Chunks {
		data, err := s.ReadChunk(context.Background(), ref)
		if err != nil {
			t.Fatalf("%s from a fresh store: %v", name, err)
		}
		got = append(got, data...)
	}
	return got
}

// lastEntry returns session id's last log entry in the bucket.
func lastEntry(t *testing.T, r *Tier, id string) *logEntry {
	t.Helper()
	w, err := r.readWorld(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	si := w.sessions[id]
	if si == nil || si.last == nil {
		t.Fatalf("session %s has no log entry", id)
	}
	return si.last
}

// TestCollectBesideLiveWriters: gc beside two live writers puts an
// unreferenced chunk into a trash list and deletes nothing; its purge waits
// until both have acknowledged the list (ErrNotAcked naming them, nothing
// deleted); a session joining meanwhile acknowledges it in its first round
// and does not hold the purge up; once acknowledged, the next gc deletes
// the chunks and the list, and a fresh reader reads every file. On a
// memory bucket and on versitygw.
func TestCollectBesideLiveWriters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		remote  func(t *testing.T) backend.Backend
		slowMod bool
	}{
		{"mem", func(*testing.T) backend.Backend {
			return mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
		}, false},
		{"s3", func(t *testing.T) backend.Backend {
			return s3test.Open(t, s3test.Start(t).Endpoint, "trash", s3.Options{})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			fx := newTrashFixture(t, tc.remote(t), 3, SessionOptions{Logf: t.Logf}, tc.slowMod)
			gc := fx.tiers[2] // the collector; writers 0 and 1 are live beside it
			res, err := gc.Collect(ctx, time.Now(), nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Trashed != len(fx.fChunks) || res.Freed != 0 || res.TrashList == "" {
				t.Fatalf("gc beside live writers: %+v, want %d chunks trashed, none freed", res, len(fx.fChunks))
			}
			if n := inBucket(t, fx.remote, fx.fChunks); n != len(fx.fChunks) {
				t.Fatalf("%d of f's %d chunks left after the trash phase, want all", n, len(fx.fChunks))
			}
			fx.age()
			_, err = gc.Collect(ctx, time.Now(), nil, false)
			if !errors.Is(err, ErrNotAcked) || !strings.Contains(err.Error(), fx.sess[0].ID()) || !strings.Contains(err.Error(), fx.sess[1].ID()) {
				t.Fatalf("a purge before the writers acknowledged: %v, want ErrNotAcked naming sessions %s and %s", err, fx.sess[0].ID(), fx.sess[1].ID())
			}
			t.Logf("not acknowledged: %v", err)
			if n := inBucket(t, fx.remote, fx.fChunks); n != len(fx.fChunks) {
				t.Fatalf("a refused purge deleted %d of f's chunks", len(fx.fChunks)-n)
			}

			// A session joining now acknowledges in its first round.
			d, rd := testStore(t, fx.remote)
			sd := join(t, d, rd)
			if e := lastEntry(t, gc, sd.ID()); !contains(e.TrashSeen, res.TrashList) {
				t.Fatalf("the joining session's entry %d (%s) acknowledges %v, want %s", e.Seq, e.Kind, e.TrashSeen, res.TrashList)
			}

			fx.roundAll(t, 2) // the writers acknowledge
			for i := range 2 {
				if e := lastEntry(t, gc, fx.sess[i].ID()); !contains(e.TrashSeen, res.TrashList) {
					t.Fatalf("writer %d's last entry (%s) acknowledges %v, want %s", i, e.Kind, e.TrashSeen, res.TrashList)
				}
			}
			res2, err := gc.Collect(ctx, time.Now(), nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if res2.Purged != 1 || res2.Freed != len(fx.fChunks) || res2.Trashed != 0 {
				t.Fatalf("the purge: %+v, want 1 list purged, %d chunks freed", res2, len(fx.fChunks))
			}
			if n := inBucket(t, fx.remote, fx.fChunks); n != 0 {
				t.Fatalf("%d of f's chunks left after the purge", n)
			}
			if l := trashLists(t, fx.remote); len(l) != 0 {
				t.Fatalf("trash lists %v left after the purge", l)
			}
			fx.roundAll(t)
			for i := 1; i < 3; i++ {
				name := "w" + string(rune('0'+i))
				if got := readFresh(t, fx.remote, name); !bytes.Equal(got, fx.kept[i]) {
					t.Fatalf("%s reads back wrong from a fresh store", name)
				}
			}
			if _, ok := readPublished(t, fx.remote)["f"]; ok {
				t.Fatal("f, removed, is published")
			}
		})
	}
}

// listHook runs onList, once, when the chunks are listed next (a
// collection's purge lists them after its read of the logs).
type listHook struct {
	*mem.Backend
	onList func()
}

func (h *listHook) List(ctx context.Context, k backend.Kind, fn func(backend.Info) error) error {
	if f := h.onList; f != nil && k == backend.Chunk {
		h.onList = nil
		f()
	}
	return h.Backend.List(ctx, k, fn)
}

// TestResaveTrashedChunk: a writer that saves, between the trash and the
// purge, a file whose chunks are in the trash holds it back (its round
// fails with ErrTrashed, and the file is not published), and publishes it
// after the purge: the chunks survive when the collector's own store names
// them, or are uploaded again when another store collected. With another
// collector the writer's round runs inside the purge (after its read of the
// logs, before its deletes): published then, the file would lose its
// chunks. Either way a fresh reader reads the file byte-exact.
func TestResaveTrashedChunk(t *testing.T) {
	for _, tc := range []struct {
		name      string
		collector int // 0: the writer that saves again; 1: another
		freed     bool
	}{
		{"collected by another writer, saved during the purge", 1, true},
		{"collected by the saving writer", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			remote := &listHook{Backend: mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})}
			fx := newTrashFixture(t, remote, 2, SessionOptions{Logf: t.Logf}, false)
			gc := fx.tiers[tc.collector]
			res, err := gc.Collect(ctx, time.Now(), nil, false)
			if err != nil || res.Trashed != len(fx.fChunks) {
				t.Fatalf("trash: %+v, %v; want %d chunks trashed", res, err, len(fx.fChunks))
			}
			fx.roundAll(t)                          // both acknowledge
			commitNamed(t, fx.stores[0], "g", fx.f) // the same bytes again
			var held error
			round := func() {
				held = fx.tiers[0].UploadRound(ctx, true)
				if _, ok := readPublished(t, fx.remote)["g"]; ok {
					t.Error("g, whose chunks are in the trash, is published before the purge")
				}
			}
			if tc.collector == 0 {
				round()
			} else {
				remote.onList = round
			}
			fx.age()
			res, err = gc.Collect(ctx, time.Now(), nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(held, ErrTrashed) || !strings.Contains(held.Error(), "g") {
				t.Fatalf("a round saving trashed chunks: %v, want ErrTrashed naming g", held)
			}
			t.Logf("held: %v", held)
			want := 0
			if tc.freed {
				want = len(fx.fChunks)
			}
			if res.Purged != 1 || res.Freed != want {
				t.Fatalf("the purge: %+v, want 1 list purged and %d chunks freed", res, want)
			}
			if pending, _ := fx.tiers[0].UploadPending(); !pending {
				t.Fatal("a held file left no commit pending")
			}
			if err := fx.tiers[0].UploadRound(ctx, true); err != nil {
				t.Fatalf("the round after the purge: %v", err)
			}
			if n := inBucket(t, fx.remote, fx.fChunks); n != len(fx.fChunks) {
				t.Fatalf("%d of g's %d chunks in the bucket after its round", n, len(fx.fChunks))
			}
			if got := readFresh(t, fx.remote, "g"); !bytes.Equal(got, fx.f) {
				t.Fatal("g reads back wrong from a fresh store")
			}
		})
	}
}

// TestPausedSessionBlocksPurge: a session paused (not fenced yet) holds the
// purge up, which fails naming it and deletes nothing; once it has been
// silent for a whole lease, the collector fences it and purges.
func TestPausedSessionBlocksPurge(t *testing.T) {
	ctx := context.Background()
	const lease = time.Second
	fx := newTrashFixture(t, mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true}), 3, SessionOptions{Lease: lease, Logf: t.Logf}, false)
	gc, paused := fx.tiers[2], fx.sess[1]
	res, err := gc.Collect(ctx, time.Now(), nil, false)
	if err != nil || res.Trashed != len(fx.fChunks) {
		t.Fatalf("trash: %+v, %v", res, err)
	}
	paused.stop() // no heartbeat, no round
	<-paused.done
	fx.roundAll(t, 1, 2)
	_, err = gc.Collect(ctx, time.Now(), nil, false)
	if !errors.Is(err, ErrNotAcked) || !strings.Contains(err.Error(), paused.ID()) || strings.Contains(err.Error(), fx.sess[0].ID()) {
		t.Fatalf("a purge beside a paused session: %v, want ErrNotAcked naming only %s", err, paused.ID())
	}
	t.Logf("blocked: %v", err)
	if n := inBucket(t, fx.remote, fx.fChunks); n != len(fx.fChunks) {
		t.Fatalf("a blocked purge deleted %d chunks", len(fx.fChunks)-n)
	}
	time.Sleep(lease + lease/3)
	fx.roundAll(t, 1, 2) // writer 0 keeps acknowledging (its lease is renewed)
	res, err = gc.Collect(ctx, time.Now(), nil, false)
	if err != nil {
		t.Fatalf("the purge once the paused session was silent for a lease: %v", err)
	}
	if res.Purged != 1 || res.Freed != len(fx.fChunks) {
		t.Fatalf("the purge: %+v, want 1 list and %d chunks", res, len(fx.fChunks))
	}
	if e := lastEntry(t, gc, paused.ID()); e.Kind != kindFence {
		t.Fatalf("the paused session's log ends with %q, want a fence", e.Kind)
	}
}

// TestTrashedBaseNotUsed: a round that read a trash list puts a delta whose
// base is in the list standalone (a purge may delete the base), so a fresh
// store reads it from the bucket alone even with the base gone.
func TestTrashedBaseNotUsed(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
	a, ra := testStore(t, remote)
	join(t, a, ra)
	const chunk = 512 << 10
	steps := bf16Steps(3, 1, 2, chunk/2, 2, 0.01)
	ms, _ := saveSteps(t, a, steps, chunk)
	trashed := map[cas.ID]string{}
	for _, c := range ms["step0.f0"].Chunks {
		trashed[c.ID] = "x"
	}
	need := map[cas.ID]uint32{}
	deltas := 0
	for _, c := range ms["step1.f0"].Chunks {
		need[c.ID] = c.Len
		obj, err := (&uploader{r: ra}).localObject(ctx, c.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, ok := cas.DeltaBase(obj); ok && trashed[b] != "" {
			deltas++
		}
	}
	if deltas == 0 {
		t.Fatal("no chunk of step 1 is a delta of step 0 here: the test proves nothing")
	}
	if err := ra.uploadChunks(ctx, need, trashed); err != nil {
		t.Fatal(err)
	}
	if _, bases := bucketChunks(t, remote); len(bases) != 0 {
		t.Fatalf("%d deltas in the bucket on trashed bases, want none (standalone)", len(bases))
	}
	var base []cas.ID
	for id := range trashed {
		base = append(base, id)
	}
	if n := inBucket(t, remote, base); n != 0 {
		t.Fatalf("%d trashed bases put into the bucket", n)
	}
	readAll(t, mustFresh(t, remote), map[string]*cas.Manifest{"step1.f0": ms["step1.f0"]}, map[string][]byte{"step1.f0": steps[1][0]})
}
