package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// openTiered opens the store in dir with its objects in front of remote
// (cacheSize 0: the default budget of fetched copies), and its remote tier.
func openTiered(dir string, remote backend.Backend, cacheSize int64) (*cas.Store, *Tier, error) {
	t := tiered.New(local.New(cas.ObjectsDir(dir), local.Options{}), remote, tiered.Options{CacheSize: cacheSize})
	s, err := cas.Open(dir, cas.Options{Objects: t})
	if err != nil {
		t.Close()
		return nil, nil, err
	}
	return s, New(s, t), nil
}

// testStore is openTiered in a temporary directory, closed when t ends.
func testStore(t testing.TB, remote backend.Backend) (*cas.Store, *Tier) {
	t.Helper()
	s, r, err := openTiered(filepath.Join(t.TempDir(), "store"), remote, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, r
}

func pseudoRandom(n int, seed byte) []byte { return tensortest.PseudoRandom(n, seed) }

// flakyRemote fails every Put while down is set: a server that went away.
type flakyRemote struct {
	*mem.Backend
	down      atomic.Bool
	loseLogs  atomic.Int32 // this many log entries are put, and their answers lost
	loseLocks atomic.Int32 // this many puts of locks/gc are applied, and their answers lost
}

var errDown = errors.New("connection refused")

func (f *flakyRemote) Put(ctx context.Context, h backend.Handle, obj []byte, opts backend.PutOptions) error {
	if f.down.Load() {
		return errDown
	}
	err := f.Backend.Put(ctx, h, obj, opts)
	if err == nil && h.Kind == backend.Lock && strings.HasPrefix(h.Name, "log.") && f.loseLogs.Add(-1) >= 0 {
		return errDown
	}
	if err == nil && h.Kind == backend.Lock && h.Name == collectionName && f.loseLocks.Add(-1) >= 0 {
		return errDown
	}
	return err
}

// commitNamed commits data as file name in the root directory.
func commitNamed(t *testing.T, s *cas.Store, name string, data []byte) {
	t.Helper()
	ino, err := s.AllocIno()
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	m := &cas.Manifest{}
	for off := 0; off < len(data); off += 1 << 16 {
		ref, err := b.Put(context.Background(), data[off:min(off+1<<16, len(data))])
		if err != nil {
			t.Fatal(err)
		}
		m.Chunks = append(m.Chunks, ref)
	}
	err = s.Commit(context.Background(), b, func(tx *cas.Tx) error {
		if err := tx.PutManifest(ino, m); err != nil {
			return err
		}
		if err := tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: m.Size()}); err != nil {
			return err
		}
		return tx.Link(cas.RootIno, name, ino)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRemoteRoundTrip: a store uploads its committed files; a fresh store on
// the same remote sees them and reads them byte-exact by fetching chunks;
// uploads that failed resume, also after the writer reopens its store.
func TestRemoteRoundTrip(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})}
	dirA := filepath.Join(t.TempDir(), "a")
	a, ra, err := openTiered(dirA, remote, 0)
	if err != nil {
		t.Fatal(err)
	}
	join(t, a, ra)
	one := pseudoRandom(300000, 1)
	commitNamed(t, a, "one.bin", one)
	if pending, _ := ra.UploadPending(); !pending {
		t.Fatal("a commit left nothing pending for upload")
	}
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	if pending, _ := ra.UploadPending(); pending {
		t.Fatal("pending after a successful round")
	}
	if st, _ := a.Stats(); st.RemoteStats.UploadedBytes == 0 || st.RemoteStats.PendingBytes != 0 {
		t.Fatalf("after upload: %+v", st.RemoteStats)
	}
	// one.bin's 64 KiB chunks live in a pack here, and went to the bucket as
	// chunk objects of their own: the fresh store below reads them there.
	if st, _ := a.Stats(); st.Packs == 0 {
		t.Fatalf("one.bin's small chunks are in no pack: %+v", st.Counts)
	}
	n := 0
	if err := remote.List(ctx, backend.Chunk, func(backend.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n < len(one)>>16 {
		t.Fatalf("%d chunk objects in the bucket, want one per chunk of one.bin (%d)", n, len(one)>>16)
	}

	// The server goes away: the commit still works, the round fails and
	// leaves it pending, across a reopen (a crash of the daemon).
	remote.down.Store(true)
	two := append(bytes.Repeat([]byte("shared prefix "), 5000), pseudoRandom(200000, 2)...)
	commitNamed(t, a, "two.bin", two)
	if err := ra.UploadRound(ctx, false); !errors.Is(err, errDown) {
		t.Fatalf("upload round with the server down: %v", err)
	}
	if st, _ := a.Stats(); st.RemoteStats.PendingBytes < int64(len(two))/2 {
		t.Fatalf("pending bytes %d with %d bytes not uploaded", st.RemoteStats.PendingBytes, len(two))
	}
	a.Close()
	remote.down.Store(false)
	a, ra, err = openTiered(dirA, remote, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if pending, _ := ra.UploadPending(); !pending {
		t.Fatal("a reopened store forgot its pending upload")
	}
	join(t, a, ra) // a new session, whose first round uploads what the dead one left
	if pending, _ := ra.UploadPending(); pending {
		t.Fatal("the join's first round left the pending upload")
	}
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}

	// A fresh store on the same remote.
	b, _, err := openTiered(filepath.Join(t.TempDir(), "b"), remote, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	files := readPublished(t, remote)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	fdsBefore := fds()
	want := map[string][]byte{"one.bin": one, "two.bin": two}
	if len(files) != len(want) {
		t.Fatalf("published %d files, want %d", len(files), len(want))
	}
	for p, f := range files {
		var got []byte
		for _, ref := range f.m.Chunks {
			data, err := b.ReadChunk(ctx, ref)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			got = append(got, data...)
		}
		if !bytes.Equal(got, want[p]) || f.Node.Size != int64(len(got)) {
			t.Fatalf("%s read back wrong from the remote", p)
		}
	}
	if n := fds(); n > fdsBefore+2 {
		t.Fatalf("reading fetched chunks left %d more descriptors open", n-fdsBefore)
	}
	st, _ := b.Stats()
	if st.RemoteStats.ReadBytes == 0 {
		t.Fatal("no remote_read_bytes counted")
	}
	// The local copies stay within LocalCacheSize (1 MiB, plus the newest).
	var kept int64
	if err := b.WalkObjects(ctx, func(o cas.ObjectInfo) error { kept += o.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	if kept > 1<<20+1<<16+1024 {
		t.Fatalf("fetched copies take %d bytes, over the 1 MiB local cache", kept)
	}
}

// TestRemoteDamagedObject: a damaged object in the bucket reads as
// ErrCorrupt, never wrong bytes, and VerifyRemoteObject names it.
func TestRemoteDamagedObject(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	a, ra := testStore(t, remote)
	join(t, a, ra)
	data := pseudoRandom(100000, 3)
	commitNamed(t, a, "f", data)
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	id := cas.Sum(data[:1<<16])
	h := chunkHandle(id)
	obj, err := remote.Get(ctx, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	obj[len(obj)/2] ^= 1
	if err := remote.Put(ctx, h, obj, backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	b, rb := testStore(t, remote)
	if _, err := b.ReadChunk(ctx, cas.ChunkRef{ID: id, Len: 1 << 16}); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("read of a damaged remote object: %v, want ErrCorrupt", err)
	}
	if err := rb.VerifyObject(ctx, id); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("VerifyObject: %v", err)
	}
}

// join starts a writer session of store s (its directory tells a restart
// from a copy), closed when the test ends.
func join(t *testing.T, s *cas.Store, r *Tier) *Session {
	t.Helper()
	sess, err := joinOpts(s, r, SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(context.Background()) })
	return sess
}

// readPublished is what a fresh reader of be sees: every path published.
func readPublished(t *testing.T, be backend.Backend) map[string]nsEntry {
	t.Helper()
	_, r := testStore(t, be)
	w, err := r.readWorld(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return w.state.visible()
}

func joinOpts(s *cas.Store, r *Tier, opts SessionOptions) (*Session, error) {
	id, err := s.ID()
	if err != nil {
		return nil, err
	}
	opts.StoreDir = s.Dir()
	return Join(context.Background(), r, id, opts)
}

// TestCollectRemote: the remote's garbage collection deletes the chunks no
// published or local file names once they are older than the cutoff, keeps
// the rest, and a later commit needing a deleted chunk uploads it again.
func TestCollectRemote(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	s, rs := testStore(t, remote)
	join(t, s, rs)
	keep, drop := pseudoRandom(100000, 11), pseudoRandom(100000, 12)
	commitNamed(t, s, "keep", keep)
	commitNamed(t, s, "drop", drop)
	if err := rs.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	unlinkNamed(t, s, "drop")
	if err := rs.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		n := 0
		remote.List(ctx, backend.Chunk, func(backend.Info) error { n++; return nil })
		return n
	}
	all := count()
	res, err := rs.Collect(ctx, time.Now().Add(-time.Hour), nil, false)
	if err != nil || res.Freed != 0 || res.Young != 2 {
		t.Fatalf("within the grace period: %+v %v; want 2 young, none freed", res, err)
	}
	res, err = rs.Collect(ctx, time.Now().Add(time.Second), nil, false)
	if err != nil || res.Freed != 2 || count() != all-2 {
		t.Fatalf("past the grace period: %+v %v (%d of %d objects left); want the 2 chunks of drop freed", res, err, count(), all)
	}
	// keep still reads from the remote alone.
	fresh, _ := testStore(t, remote)
	for off := 0; off < len(keep); off += 1 << 16 {
		part := keep[off:min(off+1<<16, len(keep))]
		if got, err := fresh.ReadChunk(ctx, cas.ChunkRef{ID: cas.Sum(part), Len: uint32(len(part))}); err != nil || !bytes.Equal(got, part) {
			t.Fatalf("a kept file after the remote's gc: %v", err)
		}
	}
	// drop's bytes committed again are uploaded again.
	commitNamed(t, s, "again", drop)
	if err := rs.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	if count() != all {
		t.Fatalf("re-committed chunks not uploaded again: %d objects, want %d", count(), all)
	}
}

// TestUploadProgress: the upload counters say what each round put into the
// bucket, raw and sent; a second store joining knows what the bucket holds
// already and puts nothing of the same file; nothing stays pending.
func TestUploadProgress(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
	data := pseudoRandom(300000, 3)
	var chunks int64 // distinct chunks of data, from the first store's index
	for i, dir := range []string{"a", "b"} {
		s, rs, err := openTiered(filepath.Join(t.TempDir(), dir), remote, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sess, err := joinOpts(s, rs, SessionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := rs.Progress(); got != (UploadProgress{}) {
			t.Fatalf("store %s before any round: %+v", dir, got)
		}
		commitNamed(t, s, "one.bin", data)
		if err := rs.UploadRound(ctx, false); err != nil {
			t.Fatal(err)
		}
		got := rs.Progress()
		var counts cas.Counts
		if err := s.View(func(tx *cas.Tx) error { counts = tx.Counts(); return nil }); err != nil {
			t.Fatal(err)
		}
		if got.PendingBytes != 0 || (i == 0 && got.SettledBytes != counts.UniqueBytes) {
			t.Errorf("store %s: %+v; want nothing pending and %d bytes settled", dir, got, counts.UniqueBytes)
		}
		if i == 0 {
			chunks = counts.Chunks
			if got.Chunks != chunks || got.RawBytes != counts.UniqueBytes || got.SentBytes <= 0 || got.Present != 0 {
				t.Errorf("first upload: %+v; want %d chunks, %d raw bytes, none present", got, chunks, counts.UniqueBytes)
			}
		} else if got.Chunks != 0 || got.RawBytes != 0 || got.SentBytes != 0 {
			t.Errorf("second store, same file: %+v; want none of the %d chunks put", got, chunks)
		}
		if err := sess.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestJoinMergesThreeWays: a session joining merges the published
// namespace into its store against the snapshot the store last agreed
// with: the bucket's overwrite and removal arrive, the store's own unsynced
// change stays, and nothing either side synced is lost.
func TestJoinMergesThreeWays(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	a, ra := testStore(t, remote)
	b, rb := testStore(t, remote)
	size := func(s *cas.Store, name string) int64 {
		var n int64 = -1
		s.View(func(tx *cas.Tx) error {
			if ino, ok := tx.Lookup(cas.RootIno, name); ok {
				if m, ok, _ := tx.Manifest(ino); ok {
					n = m.Size()
				}
			}
			return nil
		})
		return n
	}
	sa := join(t, a, ra)
	for i, name := range []string{"f", "g", "h"} {
		commitNamed(t, a, name, pseudoRandom(1000, byte(30+i)))
	}
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	sa.Close(ctx)

	sb := join(t, b, rb)
	if size(b, "f") != 1000 || size(b, "g") != 1000 {
		t.Fatalf("a new store's join did not bring the published files: f %d, g %d", size(b, "f"), size(b, "g"))
	}
	commitNamed(t, b, "f", pseudoRandom(2000, 40))
	unlinkNamed(t, b, "g")
	if err := rb.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	sb.Close(ctx)

	commitNamed(t, a, "h", pseudoRandom(3000, 41)) // a's own change, not synced
	join(t, a, ra)
	if f, g, h := size(a, "f"), size(a, "g"), size(a, "h"); f != 2000 || g != -1 || h != 3000 {
		t.Fatalf("after a's join: f %d (want b's 2000), g %d (want removed), h %d (want a's own 3000)", f, g, h)
	}
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for p, f := range readPublished(t, remote) {
		got[p] = f.m.Size()
	}
	if len(got) != 2 || got["f"] != 2000 || got["h"] != 3000 {
		t.Fatalf("published after the merge: %v", got)
	}
}

// roundLosingAnswer runs a round of r whose log entry is put but whose
// answer is lost, and checks that it fails so.
func roundLosingAnswer(t *testing.T, remote *flakyRemote, r *Tier) {
	t.Helper()
	remote.loseLogs.Store(1)
	if err := r.UploadRound(context.Background(), false); !errors.Is(err, errDown) {
		t.Fatalf("a round whose log answer was lost: %v", err)
	}
}

// TestLostLogAnswer: a log entry put whose answer was lost counts as ours;
// the next round, with more files, publishes after it, not as it.
func TestLostLogAnswer(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true})}
	s, r := testStore(t, remote)
	join(t, s, r)
	commitNamed(t, s, "one", pseudoRandom(1000, 50))
	roundLosingAnswer(t, remote, r)
	commitNamed(t, s, "two", pseudoRandom(1000, 51))
	if err := r.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n := len(readPublished(t, remote)); n != 2 {
		t.Fatalf("published %d files after a lost answer, want both", n)
	}
}

// TestRenameAfterLostAnswer: a round publishes dst (stamped by its commit
// time) but its answer is lost, so the store's agreed state (mine) never
// takes it; then an older file is renamed over dst. The rename is a change
// of the version the store had, so it must win over the store's own lost
// publication whatever the renamed file's ctime: before the fix its stamp
// was the source's older ctime, the store's own earlier dst beat it, the
// round reported it superseded and put the old bytes back under dst.
func TestRenameAfterLostAnswer(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true})}
	s, r := testStore(t, remote)
	join(t, s, r)
	commitNamed(t, s, "src", pseudoRandom(1000, 60))
	commitNamed(t, s, "dst", pseudoRandom(2000, 61))
	now := time.Now().UnixNano()
	setCtime := func(name string, ctime int64) {
		t.Helper()
		if err := s.Update(func(tx *cas.Tx) error {
			ino, _ := tx.Lookup(cas.RootIno, name)
			n, _, err := tx.Node(ino)
			if err != nil {
				return err
			}
			n.Ctime = ctime
			return tx.PutNode(n)
		}); err != nil {
			t.Fatal(err)
		}
	}
	setCtime("src", now-int64(time.Hour)) // an old file
	setCtime("dst", now)
	roundLosingAnswer(t, remote, r)
	if err := s.Update(func(tx *cas.Tx) error { // rename src dst
		dst, _ := tx.Lookup(cas.RootIno, "dst")
		src, _ := tx.Lookup(cas.RootIno, "src")
		if err := tx.Unlink(cas.RootIno, "dst"); err != nil {
			return err
		}
		if err := tx.DeleteNode(dst); err != nil {
			return err
		}
		if err := tx.Unlink(cas.RootIno, "src"); err != nil {
			return err
		}
		if err := tx.Link(cas.RootIno, "dst", src); err != nil {
			return err
		}
		return tx.Uploads().CountCommit()
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.UploadRound(ctx, true); err != nil {
		t.Fatalf("the round after the rename: %v (the rename must win over the store's own earlier dst)", err)
	}
	pub := readPublished(t, remote)
	if e, ok := pub["dst"]; !ok || e.m == nil || e.m.Size() != 1000 {
		t.Fatalf("published dst: %+v, want the renamed 1000-byte file", e)
	}
	if _, ok := pub["src"]; ok {
		t.Fatalf("src is still published after the rename")
	}
	if err := s.View(func(tx *cas.Tx) error {
		ino, ok := tx.Lookup(cas.RootIno, "dst")
		n, _, err := tx.Node(ino)
		if err == nil && (!ok || n.Size != 1000) {
			err = fmt.Errorf("the store's dst is %d bytes after the round, want the renamed 1000", n.Size)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRemovalAfterLostAnswerAndRejoin: a round publishes f but its answer
// is lost; f is removed here; the session ends (fenced, or the daemon
// killed) before a round succeeds, and a new session of the same store
// joins. Its base (the last snapshot a round confirmed) lacks f, the
// bucket has f from the old session: the removal is a change of a version
// the store had, so the new session publishes it, and f must not come
// back (before, the join saw no change of its own and applied f again).
func TestRemovalAfterLostAnswerAndRejoin(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true})}
	s, r := testStore(t, remote)
	sa := join(t, s, r)
	commitNamed(t, s, "keep", pseudoRandom(1000, 70))
	if err := r.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	commitNamed(t, s, "f", pseudoRandom(1000, 71))
	roundLosingAnswer(t, remote, r)
	if _, ok := readPublished(t, remote)["f"]; !ok {
		t.Fatal("the lost answer's entry did not publish f")
	}
	unlinkNamed(t, s, "f")
	sa.Close(ctx)
	join(t, s, r) // a new session, its first round
	if _, ok := readPublished(t, remote)["f"]; ok {
		t.Error("f is published again after its removal")
	}
	if err := s.View(func(tx *cas.Tx) error {
		if _, ok := tx.Lookup(cas.RootIno, "f"); ok {
			return errors.New("f is back in the store after the join")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestRemoteSnapshotKeepsHoles: a sparse file's holes reach a fresh store
// through the bucket's snapshot: same size, same holes, and only its data
// chunks uploaded.
func TestRemoteSnapshotKeepsHoles(t *testing.T) {
	ctx := context.Background()
	remote := &flakyRemote{Backend: mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})}
	a, ra, err := openTiered(filepath.Join(t.TempDir(), "a"), remote, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	join(t, a, ra)
	data := pseudoRandom(70000, 3)
	ino, err := a.AllocIno()
	if err != nil {
		t.Fatal(err)
	}
	b := a.NewBatch()
	ref, err := b.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	m := &cas.Manifest{Chunks: []cas.ChunkRef{ref}, Holes: []cas.Hole{{Before: 0, Len: 1 << 40}, {Before: 1, Len: 5 << 40}}}
	err = a.Commit(ctx, b, func(tx *cas.Tx) error {
		if err := tx.PutManifest(ino, m); err != nil {
			return err
		}
		if err := tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: m.Size()}); err != nil {
			return err
		}
		return tx.Link(cas.RootIno, "sparse", ino)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.Stats(); st.RemoteStats.UploadedBytes > 1<<20 {
		t.Fatalf("uploaded %d bytes for 70 kB of data", st.RemoteStats.UploadedBytes)
	}
	fresh, _, err := openTiered(filepath.Join(t.TempDir(), "b"), remote, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	pub := readPublished(t, remote)
	e, ok := pub["sparse"]
	if !ok || e.m == nil {
		t.Fatalf("published: %v, want the file sparse with its manifest", pub)
	}
	if e.Node.Size != 6<<40+70000 || e.m.Size() != e.Node.Size || fmt.Sprint(e.m.Holes) != fmt.Sprint(m.Holes) {
		t.Fatalf("published file: size %d, holes %v; want %v", e.Node.Size, e.m.Holes, m.Holes)
	}
	got, err := fresh.ReadChunk(ctx, e.m.Chunks[0])
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("data chunk from the remote: %v", err)
	}
}
