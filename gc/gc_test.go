package gc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// newStore opens a store without packs or inline chunks: the tests
// written before them are about objects of their own (pack_test.go and
// inline_test.go have those cases).
func newStore(t *testing.T) *cas.Store {
	return newStoreOpts(t, cas.Options{PackMaxChunk: -1, InlineMaxChunk: -1})
}

func newStoreOpts(t *testing.T, opts cas.Options) *cas.Store {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	opts.CacheSize, opts.Objects = 8<<20, local.New(cas.ObjectsDir(dir), local.Options{})
	s, err := cas.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func chunkData(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9E3779B97F4A7C15 + 7
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// commitFile stores chunks as the manifest of a new file ino at root/name, the
// way fusefs commits: Put every chunk, then one Commit.
func commitFile(t testing.TB, s *cas.Store, name string, chunks ...[]byte) (uint64, *cas.Manifest) {
	t.Helper()
	ino, err := s.AllocIno()
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	m := &cas.Manifest{}
	for _, c := range chunks {
		ref, err := b.Put(context.Background(), c)
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
	return ino, m
}

func removeFile(t testing.TB, s *cas.Store, name string) {
	t.Helper()
	err := s.Update(func(tx *cas.Tx) error {
		ino, ok := tx.Lookup(cas.RootIno, name)
		if !ok {
			return os.ErrNotExist
		}
		if err := tx.Unlink(cas.RootIno, name); err != nil {
			return err
		}
		return tx.DeleteNode(ino)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustFsck(t testing.TB, s *cas.Store) {
	t.Helper()
	res, err := Fsck(context.Background(), s, FsckOptions{ReadData: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Problems {
		t.Errorf("fsck: %v", p)
	}
}

func TestCollectFreesOnlyUnreferencedChunks(t *testing.T) {
	s := newStore(t)
	shared := chunkData(1, 100000)
	commitFile(t, s, "keep", shared, chunkData(2, 5000))
	commitFile(t, s, "drop", shared, chunkData(3, 70000), chunkData(4, 9000))
	removeFile(t, s, "drop")

	// A dry run reports, with the raw bytes, and deletes nothing.
	res, err := Collect(context.Background(), s, Options{Grace: DefaultGrace, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks != 2 || res.FreedBytes == 0 || res.FreedRawBytes != 79000 {
		t.Fatalf("dry run: %+v", res)
	}
	if st, _ := s.Stats(); st.Chunks != 4 {
		t.Fatalf("dry run changed the index: %d chunks", st.Chunks)
	}
	// The default grace does not keep chunks that were committed: deleting
	// files frees their chunks at the next collection.
	res, err = Collect(context.Background(), s, Options{Grace: DefaultGrace})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks != 2 || res.FreedRawBytes != 79000 || res.Marked != 2 || res.Young != 0 {
		t.Fatalf("default grace: %+v", res)
	}
	st, _ := s.Stats()
	if st.Chunks != 2 || st.UniqueBytes != 105000 {
		t.Fatalf("after gc: %+v", st)
	}
	mustFsck(t, s)
}

// TestCollectSparesLiveManifests: chunks of a file the daemon still has open,
// though the catalog no longer names it, survive.
func TestCollectSparesLiveManifests(t *testing.T) {
	s := newStore(t)
	_, m := commitFile(t, s, "open-then-unlinked", chunkData(5, 40000))
	removeFile(t, s, "open-then-unlinked")
	res, err := Collect(context.Background(), s, Options{Live: func() []*cas.Manifest { return []*cas.Manifest{m} }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks != 0 {
		t.Fatalf("freed a live file's chunk: %+v", res)
	}
	if _, err := s.ReadChunk(context.Background(), m.Chunks[0]); err != nil {
		t.Fatal(err)
	}
}

// TestCollectRacesCommits commits files that deduplicate against chunks no
// manifest names (the moment GC finds them unreferenced) while collections at
// grace 0 run back to back. Every committed file must stay readable.
func TestCollectRacesCommits(t *testing.T) {
	s := newStore(t)
	const rounds = 300
	ctx := context.Background()
	var stop atomic.Bool
	var collections atomic.Int64
	var freed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			res, err := Collect(ctx, s, Options{})
			if err != nil {
				t.Error(err)
				return
			}
			collections.Add(1)
			freed.Add(int64(res.Chunks))
		}
	}()
	type file struct {
		name string
		m    *cas.Manifest
	}
	var kept []file
	for i := 0; i < rounds && !t.Failed(); i++ {
		// A chunk that becomes garbage, then is wanted again by a new commit:
		// exactly what a collection running now may be deleting.
		bait := chunkData(uint64(1000+i%7), 20000)
		name := "f" + string(rune('a'+i%26)) + time.Now().Format("150405.000000000")
		commitFile(t, s, name+"-tmp", bait)
		removeFile(t, s, name+"-tmp")
		_, m := commitFile(t, s, name, bait, chunkData(uint64(i), 3000))
		kept = append(kept, file{name, m})
		if i%3 == 0 { // and some files go away for good
			removeFile(t, s, kept[0].name)
			kept = kept[1:]
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d collections freed %d chunks during %d commits", collections.Load(), freed.Load(), rounds)
	if collections.Load() < 10 || freed.Load() == 0 {
		t.Fatalf("the race was not exercised: %d collections freed %d chunks", collections.Load(), freed.Load())
	}
	for _, f := range kept {
		for _, c := range f.m.Chunks {
			data, err := s.ReadChunk(ctx, c)
			if err != nil {
				t.Fatalf("%s: %v", f.name, err)
			}
			if cas.Sum(data) != c.ID {
				t.Fatalf("%s: wrong bytes", f.name)
			}
		}
	}
	if _, err := Collect(ctx, s, Options{}); err != nil {
		t.Fatal(err)
	}
	mustFsck(t, s)
}

func TestFsckNamesEachFault(t *testing.T) {
	s := newStore(t)
	a := chunkData(10, 30000)
	b := chunkData(11, 30000)
	commitFile(t, s, "corrupted", a)
	commitFile(t, s, "missing", b)
	mustFsck(t, s)
	idA, idB := cas.Sum(a).String(), cas.Sum(b).String()
	objPath := func(id string) string { return filepath.Join(s.Dir(), "objects", id[:2], id[2:4], id[4:]) }
	raw, err := os.ReadFile(objPath(idA))
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-3] ^= 0xff
	os.Chmod(objPath(idA), 0o644)
	if err := os.WriteFile(objPath(idA), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(objPath(idB)); err != nil {
		t.Fatal(err)
	}
	// Without --read-data a flipped bit goes unseen, a missing object does not.
	res, err := Fsck(context.Background(), s, FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || res.Problems[0].Kind != "missing-chunk" || res.Problems[0].Path != "/missing" || res.Problems[0].Chunk != idB {
		t.Fatalf("fsck: %+v", res.Problems)
	}
	res, err = Fsck(context.Background(), s, FsckOptions{ReadData: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Problem{
		"/corrupted": {Kind: "corrupt-chunk", Path: "/corrupted", Chunk: idA},
		"/missing":   {Kind: "missing-chunk", Path: "/missing", Chunk: idB},
	}
	if len(res.Problems) != 2 {
		t.Fatalf("fsck --read-data: %+v", res.Problems)
	}
	for _, p := range res.Problems {
		w := want[p.Path]
		if p.Kind != w.Kind || p.Chunk != w.Chunk {
			t.Errorf("problem %+v, want %+v", p, w)
		}
	}
}

func TestFsckFindsCatalogFaults(t *testing.T) {
	s := newStore(t)
	ino, _ := commitFile(t, s, "f", chunkData(20, 1000))
	err := s.Update(func(tx *cas.Tx) error {
		if err := tx.Link(cas.RootIno, "dangling", 99999); err != nil {
			return err
		}
		// A node in no directory, a second entry for f, and a wrong size
		// on f.
		if err := tx.PutNode(cas.Node{Ino: 88888, Mode: 0o040755}); err != nil {
			return err
		}
		if err := tx.Link(cas.RootIno, "also-f", ino); err != nil {
			return err
		}
		return tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: 5})
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Fsck(context.Background(), s, FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, p := range res.Problems {
		kinds[p.Kind] = true
	}
	for _, k := range []string{"dangling-entry", "unreachable-node", "size-mismatch", "duplicate-entry"} {
		if !kinds[k] {
			t.Errorf("fsck missed %s: %+v", k, res.Problems)
		}
	}
	for _, p := range res.Problems {
		// Entries are walked in name order: also-f comes first.
		if p.Kind == "duplicate-entry" && (p.Path != "/f" || p.Detail != fmt.Sprintf("node %d is also reached as /also-f", ino)) {
			t.Errorf("duplicate entry: %+v", p)
		}
	}
	// The counters were kept right by PutNode, so none is reported.
	if kinds["counter"] {
		t.Errorf("counter problem reported: %+v", res.Problems)
	}
}

func TestCollectRemovesOldTempFilesAndBareIndexRows(t *testing.T) {
	s := newStore(t)
	_, m := commitFile(t, s, "f", chunkData(30, 1000))
	removeFile(t, s, "f")
	id := m.Chunks[0].ID.String()
	obj := filepath.Join(s.Dir(), "objects", id[:2], id[2:4], id[4:])
	if err := os.Remove(obj); err != nil { // an index row whose object is gone
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(obj), ".tmp-123")
	if err := os.WriteFile(tmp, []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(tmp, old, old)
	res, err := Collect(context.Background(), s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.IndexRows != 1 || res.TempFiles != 1 {
		t.Fatalf("%+v", res)
	}
	if st, _ := s.Stats(); st.Chunks != 0 || st.UniqueBytes != 0 {
		t.Fatalf("index row kept: %+v", st)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("temp file kept: %v", err)
	}
	mustFsck(t, s)
}

// TestCollectGraceKeepsNeverCommittedObjects: an object no commit named (no
// index row: a crashed writer's) is kept for the grace period, then freed.
func TestCollectGraceKeepsNeverCommittedObjects(t *testing.T) {
	s := newStore(t)
	commitFile(t, s, "keep", chunkData(1, 1000))
	h := strings.Repeat("ab", 32)
	path := filepath.Join(s.Dir(), "objects", h[0:2], h[2:4], h[4:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, chunkData(9, 500), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Collect(context.Background(), s, Options{Grace: DefaultGrace})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks != 0 || res.Young != 1 || res.Unreferenced != 1 {
		t.Fatalf("grace 24h: %+v", res)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the young object is gone: %v", err)
	}
	res, err = Collect(context.Background(), s, Options{Grace: 0})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks != 1 || res.Young != 0 {
		t.Fatalf("grace 0: %+v", res)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the object is still there: %v", err)
	}
}

// TestFsckNamesEveryFileOfADamagedChunk: a corrupt or missing chunk shared by
// several files is reported for each of them (every one of them reads EIO).
func TestFsckNamesEveryFileOfADamagedChunk(t *testing.T) {
	s := newStore(t)
	shared := chunkData(20, 30000)
	gone := chunkData(21, 20000)
	for _, name := range []string{"a", "b", "c"} {
		commitFile(t, s, name, shared, chunkData(uint64(len(name))+30, 1000), gone)
	}
	commitFile(t, s, "other", chunkData(40, 1000))
	id, idGone := cas.Sum(shared).String(), cas.Sum(gone).String()
	objPath := func(id string) string { return filepath.Join(s.Dir(), "objects", id[:2], id[2:4], id[4:]) }
	raw, err := os.ReadFile(objPath(id))
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-3] ^= 0xff
	if err := os.WriteFile(objPath(id), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(objPath(idGone)); err != nil {
		t.Fatal(err)
	}
	res, err := Fsck(context.Background(), s, FsckOptions{ReadData: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, p := range res.Problems {
		got[p.Kind+" "+p.Path+" "+p.Chunk] = true
	}
	var want []string
	for _, name := range []string{"/a", "/b", "/c"} {
		want = append(want, "corrupt-chunk "+name+" "+id, "missing-chunk "+name+" "+idGone)
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("no problem %q", w)
		}
	}
	if len(res.Problems) != len(want) {
		t.Errorf("%d problems, want %d: %+v", len(res.Problems), len(want), res.Problems)
	}
}
