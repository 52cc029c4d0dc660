package remote

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
)

// commitAt commits data as file name in the root, committed at ctime (ns).
func commitAt(t *testing.T, s *cas.Store, name string, data []byte, ctime int64) {
	t.Helper()
	commitNamed(t, s, name, data)
	if err := s.Update(func(tx *cas.Tx) error {
		ino, _ := tx.Lookup(cas.RootIno, name)
		n, _, err := tx.Node(ino)
		if err != nil {
			return err
		}
		n.Ctime, n.Mtime = ctime, ctime
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
}

// sizes returns the size of every regular file in s's root.
func sizes(t *testing.T, s *cas.Store) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if err := s.View(func(tx *cas.Tx) error {
		return tx.Children(cas.RootIno, func(name string, ino uint64) error {
			if m, ok, err := tx.Manifest(ino); err != nil {
				return err
			} else if ok {
				out[name] = m.Size()
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSizes(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestWritersShare: three writer sessions and a reader on one prefix see
// the union of what each published; the later commit of one path wins
// whole everywhere and the earlier one's round says it was superseded;
// renames and removals by one writer apply everywhere.
func TestWritersShare(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	var stores []*cas.Store
	var tiers []*Tier
	for range 3 {
		s, r := testStore(t, remote)
		join(t, s, r)
		stores, tiers = append(stores, s), append(tiers, r)
	}
	reader, rr := testStore(t, remote)
	roundAll := func() {
		t.Helper()
		for i, r := range tiers {
			if err := r.UploadRound(ctx, true); err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
		}
	}
	check := func(what string, want map[string]int64) {
		t.Helper()
		roundAll() // publishes
		roundAll() // and every writer applies the others' publications
		if _, _, err := rr.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		for i, s := range append(stores, reader) {
			if got := sizes(t, s); !sameSizes(got, want) {
				t.Errorf("%s: store %d has %v, want %v", what, i, got, want)
			}
		}
	}
	for i, s := range stores {
		commitNamed(t, s, []string{"a.bin", "b.bin", "c.bin"}[i], pseudoRandom(1000*(i+1), byte(60+i)))
	}
	check("disjoint files", map[string]int64{"a.bin": 1000, "b.bin": 2000, "c.bin": 3000})

	// One path, two writers: the later commit wins whole. (Commit times in
	// the future: later than every directory's ctime.)
	base := time.Now().UnixNano() + int64(time.Hour)
	commitAt(t, stores[0], "x", pseudoRandom(4000, 70), base+100e9)
	commitAt(t, stores[1], "x", pseudoRandom(5000, 71), base+200e9)
	if err := tiers[0].UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := tiers[1].UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	check("one path from two writers", map[string]int64{"a.bin": 1000, "b.bin": 2000, "c.bin": 3000, "x": 5000})

	// Concurrent: c commits y before it saw a's later y.
	commitAt(t, stores[0], "y", pseudoRandom(6000, 72), base+300e9)
	commitAt(t, stores[2], "y", pseudoRandom(7000, 73), base+250e9)
	if err := tiers[0].UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	err := tiers[2].UploadRound(ctx, true)
	if !errors.Is(err, ErrSuperseded) || !strings.Contains(err.Error(), "y (by session") {
		t.Fatalf("the earlier commit's round: %v, want ErrSuperseded naming y", err)
	}
	t.Logf("superseded: %v", err)
	check("a superseded commit", map[string]int64{"a.bin": 1000, "b.bin": 2000, "c.bin": 3000, "x": 5000, "y": 6000})

	// a renames its file and removes b's.
	if err := stores[0].Update(func(tx *cas.Tx) error {
		ino, _ := tx.Lookup(cas.RootIno, "a.bin")
		if err := tx.Unlink(cas.RootIno, "a.bin"); err != nil {
			return err
		}
		if err := tx.Link(cas.RootIno, "a2.bin", ino); err != nil {
			return err
		}
		ino, _ = tx.Lookup(cas.RootIno, "b.bin")
		if err := tx.Unlink(cas.RootIno, "b.bin"); err != nil {
			return err
		}
		return tx.DeleteNode(ino)
	}); err != nil {
		t.Fatal(err)
	}
	check("rename and unlink", map[string]int64{"a2.bin": 1000, "c.bin": 3000, "x": 5000, "y": 6000})
	if got := readPublished(t, remote); len(got) != 4 {
		t.Errorf("a fresh reader sees %d paths, want 4", len(got))
	}
}

// TestFencedSessionRejoins: a session paused past its lease is fenced by
// another writer's round; resumed, its round and its collection fail
// naming the fence, its next round rejoins as a new session and publishes
// what it committed meanwhile, and nothing the other published is lost.
// A collection while another session may publish deletes nothing (it
// trashes, doc.go step 8); with every other session closed it deletes.
func TestFencedSessionRejoins(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	a, ra := testStore(t, remote)
	b, rb := testStore(t, remote)
	lease := SessionOptions{Lease: time.Second, Logf: t.Logf}
	sa, err := joinOpts(a, ra, lease)
	if err != nil {
		t.Fatal(err)
	}
	commitNamed(t, a, "a1", pseudoRandom(50000, 21))
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	sa.stop() // paused: no heartbeat
	<-sa.done
	sb, err := joinOpts(b, rb, lease)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	commitNamed(t, b, "b1", pseudoRandom(50000, 22))
	if err := rb.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	if res, err := rb.Collect(ctx, time.Now(), nil, false); err != nil || res.Freed != 0 {
		t.Fatalf("a collection while a's session may publish: %+v, %v; want nothing deleted, no error", res, err)
	}
	time.Sleep(1200 * time.Millisecond)
	if err := rb.UploadRound(ctx, true); err != nil { // finds a silent for a lease: fences it
		t.Fatal(err)
	}
	// a resumes as if its lease were fresh: its log fences it all the same.
	sa.renewed(time.Now(), sa.tag)
	commitNamed(t, a, "a2", pseudoRandom(50000, 23))
	err = ra.UploadRound(ctx, true)
	if !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), sb.ID()) {
		t.Fatalf("a fenced session's round: %v, want ErrFenced naming %s", err, sb.ID())
	}
	t.Logf("fenced: %v", err)
	if _, err := ra.Collect(ctx, time.Now().Add(time.Hour), nil, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("a fenced session's collection: %v, want ErrFenced", err)
	}
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatalf("the round after the fence (a rejoin): %v", err)
	}
	s2, _ := ra.session()
	defer s2.Close(ctx)
	if s2 == sa {
		t.Fatal("no new session after the fence")
	}
	got := readPublished(t, remote)
	for _, p := range []string{"a1", "a2", "b1"} {
		if _, ok := got[p]; !ok {
			t.Errorf("%s is not published (have %d paths)", p, len(got))
		}
	}
	if res, err := rb.Collect(ctx, time.Now(), nil, false); err != nil || res.Freed != 0 {
		t.Fatalf("a collection while a's new session is live: %+v, %v; want nothing deleted, no error", res, err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := rb.Collect(ctx, time.Now(), nil, true); err != nil || res.Trashed != 0 {
		t.Fatalf("a collection with every other session closed: %+v, %v; want one phase (no trash)", res, err)
	}
}

// TestCheckpointCompacts: once a round reads more than compactEvery
// sessions' states, it writes a checkpoint and deletes the entries it
// folds but each session's last; a fresh reader still sees every file, and
// later publications on top of the checkpoint.
func TestCheckpointCompacts(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	var first *Tier
	var firstStore *cas.Store
	n := compactEvery + 2
	for i := range n {
		s, r := testStore(t, remote)
		join(t, s, r)
		for j := range 2 { // two entries per session
			commitNamed(t, s, string(rune('a'+i))+string(rune('0'+j)), pseudoRandom(1000+i, byte(80+i+j)))
			if err := r.UploadRound(ctx, true); err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			first, firstStore = r, s
		}
	}
	if err := first.UploadRound(ctx, true); err != nil { // reads n states: compacts
		t.Fatal(err)
	}
	if _, err := remote.Stat(ctx, backend.Handle{Kind: backend.Lock, Name: checkpointName}); err != nil {
		t.Fatalf("no checkpoint after a round that read %d states: %v", n, err)
	}
	logs := 0
	remote.List(ctx, backend.Lock, func(in backend.Info) error {
		if _, _, ok := parseLogName(in.Handle.Name); ok {
			logs++
		}
		return nil
	})
	if logs >= 2*n {
		t.Errorf("%d log entries of %d left for %d sessions after compaction", logs, 2*n, n)
	}
	commitNamed(t, firstStore, "z", pseudoRandom(500, 99))
	if err := first.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	got := readPublished(t, remote)
	if len(got) != 2*n+1 {
		t.Errorf("a fresh reader after compaction sees %d paths, want %d", len(got), 2*n+1)
	}
}

// TestRemountKeepsAppliedVersions: a store that applied another writer's
// version and changed nothing takes, after a remount, a third writer's
// later version of the path: what it applied is no change of its own,
// even with later activity in the directory.
func TestRemountKeepsAppliedVersions(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	a, ra := testStore(t, remote)
	b, rb := testStore(t, remote)
	c, rc := testStore(t, remote)
	join(t, a, ra)
	commitNamed(t, a, "x", pseudoRandom(1000, 90))
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	sb := join(t, b, rb) // applies a's x
	if got := sizes(t, b)["x"]; got != 1000 {
		t.Fatalf("b has x of %d bytes, want a's 1000", got)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	join(t, c, rc)
	commitNamed(t, c, "x", pseudoRandom(2000, 91))
	if err := rc.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	// Activity in b's root after the apply: its ctime moves on.
	if err := b.Update(func(tx *cas.Tx) error {
		n, _, err := tx.Node(cas.RootIno)
		if err != nil {
			return err
		}
		n.Ctime = time.Now().Add(time.Hour).UnixNano()
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	b2 := New(b, rb.tier)
	join(t, b, b2)
	if got := sizes(t, b)["x"]; got != 2000 {
		t.Errorf("b remounted has x of %d bytes, want c's later 2000", got)
	}
	if got := readPublished(t, remote)["x"].m.Size(); got != 2000 {
		t.Errorf("published x has %d bytes, want c's 2000", got)
	}
}

// TestSiblingDoesNotRestamp: a writer commits x, and before it publishes
// another writer commits and publishes a later x; the first then creates y
// beside x (which moves the directory's ctime past the other's x) and
// publishes. Its x is still the earlier version and loses: the round says
// so and every store keeps the other's x. Before, x's stamp was the
// directory's ctime, and the older x replaced the newer everywhere.
func TestSiblingDoesNotRestamp(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	s1, r1 := testStore(t, remote)
	s2, r2 := testStore(t, remote)
	join(t, s1, r1)
	join(t, s2, r2)
	base := time.Now().UnixNano() + int64(time.Hour)
	commitAt(t, s2, "x", pseudoRandom(1000, 80), base+100e9) // older, not published yet
	commitAt(t, s1, "x", pseudoRandom(2000, 81), base+200e9)
	if err := r1.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	commitAt(t, s2, "y", pseudoRandom(3000, 82), base+300e9)
	if err := s2.Update(func(tx *cas.Tx) error { // as a create through the mount does
		root, _, err := tx.Node(cas.RootIno)
		if err != nil {
			return err
		}
		root.Mtime, root.Ctime = base+300e9, base+300e9
		return tx.PutNode(root)
	}); err != nil {
		t.Fatal(err)
	}
	err := r2.UploadRound(ctx, true)
	if !errors.Is(err, ErrSuperseded) || !strings.Contains(err.Error(), "x (by session") {
		t.Fatalf("the older x's round: %v, want ErrSuperseded naming x", err)
	}
	for range 2 {
		for _, r := range []*Tier{r1, r2} {
			if err := r.UploadRound(ctx, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]int64{"x": 2000, "y": 3000}
	for i, s := range []*cas.Store{s1, s2} {
		if got := sizes(t, s); !sameSizes(got, want) {
			t.Errorf("store %d has %v, want %v (the later x)", i+1, got, want)
		}
	}
}

// TestRenameStamps: a path's stamp is the later of its record's ctime and
// when a rename gave it or a directory above it its name (Tx.SetLinked),
// never its directory's ctime; a linked row that names another inode (an
// entry since replaced) does not count.
func TestRenameStamps(t *testing.T) {
	s, _ := testStore(t, mem.New(backend.Properties{DurableOnPut: true}))
	const t0 = int64(1e18)
	commitAt(t, s, "f", pseudoRandom(100, 90), t0+1)
	commitAt(t, s, "g", pseudoRandom(100, 91), t0+2)
	dir, err := s.AllocIno()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *cas.Tx) error {
		if err := tx.PutNode(cas.Node{Ino: dir, Mode: syscall.S_IFDIR | 0o755, Ctime: t0 + 900}); err != nil { // entries added since
			return err
		}
		if err := tx.Link(cas.RootIno, "d", dir); err != nil {
			return err
		}
		// f moved into d at t0+50, then d renamed at t0+60; g renamed
		// at t0+70, but the row names another inode.
		f, _ := tx.Lookup(cas.RootIno, "f")
		if err := tx.Unlink(cas.RootIno, "f"); err != nil {
			return err
		}
		if err := tx.Link(dir, "f", f); err != nil {
			return err
		}
		if err := tx.SetLinked(dir, "f", f, t0+50); err != nil {
			return err
		}
		if err := tx.SetLinked(cas.RootIno, "d", dir, t0+60); err != nil {
			return err
		}
		return tx.SetLinked(cas.RootIno, "g", f, t0+70)
	}); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	if err := s.View(func(tx *cas.Tx) error {
		return walkNamespace(tx, func(p string, e nsEntry) error {
			got[p] = e.ctime
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]int64{"d": t0 + 900, "d/f": t0 + 60, "g": t0 + 2} {
		if got[p] != want {
			t.Errorf("%s stamped at t0%+d, want t0%+d", p, got[p]-t0, want-t0)
		}
	}
}

// TestLostCollectionLock: a collection's put of locks/gc reaches the
// server but its answer is lost (a stalled server applies it after the
// collection gave up). Another writer's collection is refused naming the
// holder; the session's own next collection takes the lock over, and its
// next round removes a lock it left: the other writer's collection then
// runs, without waiting ten leases for the lock to age.
func TestLostCollectionLock(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true})}
	s1, r1 := testStore(t, remote)
	s2, r2 := testStore(t, remote)
	sess1 := join(t, s1, r1)
	join(t, s2, r2)
	collect := func(r *Tier) error {
		_, err := r.Collect(ctx, time.Now(), nil, false)
		return err
	}
	remote.loseLocks.Store(1)
	if err := collect(r1); !errors.Is(err, errDown) {
		t.Fatalf("a collection whose lock answer was lost: %v", err)
	}
	err := collect(r2)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), sess1.ID()) {
		t.Fatalf("another writer's collection beside the lost lock: %v, want ErrBusy naming session %s", err, sess1.ID())
	}
	t.Logf("refused: %v", err)
	if err := collect(r1); err != nil {
		t.Fatalf("the session's own next collection: %v (the lock is its own)", err)
	}
	// Lost again; this time a round of the session removes it.
	remote.loseLocks.Store(1)
	if err := collect(r1); !errors.Is(err, errDown) {
		t.Fatalf("a collection whose lock answer was lost: %v", err)
	}
	if err := r1.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Stat(ctx, backend.Handle{Kind: backend.Lock, Name: collectionName}); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("locks/gc after the session's round: %v, want it removed", err)
	}
	if err := collect(r2); err != nil {
		t.Fatalf("the other writer's collection after the round: %v", err)
	}
}
