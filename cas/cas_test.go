package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
	"github.com/ckptfs/ckptfs/cas/object"
)

// testStoreHook opens a store whose local backend calls hook instead of each
// fdatasync and directory fsync.
func testStoreHook(t *testing.T, hook func(path string) error) *Store {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	return testStore(t, Options{Objects: local.New(filepath.Join(dir, objectsName), local.Options{SyncHook: hook})}, dir)
}

// openLocal is Open with the objects in the store directory (local.New) unless
// opts says where they live.
//
// The tests written before packs and inline chunks (most of them, about
// objects of their own) run without either: opts.PackMaxChunk and
// opts.InlineMaxChunk 0 mean none here; the pack tests (pack_test.go) and
// the inline tests (inline_test.go) set them.
func openLocal(dir string, opts Options) (*Store, error) {
	if opts.PackMaxChunk == 0 {
		opts.PackMaxChunk = -1
	}
	if opts.InlineMaxChunk == 0 {
		opts.InlineMaxChunk = -1
	}
	if opts.Objects == nil {
		opts.Objects = local.New(ObjectsDir(dir), local.Options{})
	}
	return Open(dir, opts)
}

func testStore(t *testing.T, opts Options, dir ...string) *Store {
	t.Helper()
	if len(dir) == 0 {
		dir = append(dir, filepath.Join(t.TempDir(), "store"))
	}
	s, err := openLocal(dir[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func pseudoRandom(n int, seed byte) []byte { return tensortest.PseudoRandom(n, seed) }

// put stores data as one committed chunk.
func put(t *testing.T, s *Store, data []byte) ChunkRef {
	t.Helper()
	b := s.NewBatch()
	ref, err := b.Put(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	return ref
}

func TestObjectRoundTripAndCodecChoice(t *testing.T) {
	s := testStore(t, Options{})
	cases := []struct {
		name  string
		data  []byte
		codec Codec
	}{
		{"empty", nil, CodecRaw},
		{"random stays raw", pseudoRandom(1<<20, 1), CodecRaw},
		{"text compresses", bytes.Repeat([]byte("step 10 loss 0.123\n"), 5000), CodecZstd},
		{"zeros compress", make([]byte, 1<<20), CodecZstd},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := put(t, s, c.data)
			if ref.ID != Sum(c.data) || int(ref.Len) != len(c.data) {
				t.Fatalf("ref %v/%d", ref.ID, ref.Len)
			}
			info, err := s.VerifyObject(context.Background(), ref.ID)
			if err != nil {
				t.Fatal(err)
			}
			if info.Codec != c.codec {
				t.Errorf("codec %v, want %v", info.Codec, c.codec)
			}
			got, err := s.ReadChunk(context.Background(), ref)
			if err != nil || !bytes.Equal(got, c.data) {
				t.Fatalf("read back: %v", err)
			}
		})
	}
}

// TestCorruptObjects: every kind of damage is ErrCorrupt or ErrMissing, never
// wrong bytes.
func TestCorruptObjects(t *testing.T) {
	damage := []struct {
		name string
		do   func(path string) error
		want error
	}{
		{"flipped payload bit", func(p string) error { return flip(p, -1) }, ErrCorrupt},
		{"flipped header bit", func(p string) error { return flip(p, 9) }, ErrCorrupt},
		{"truncated", func(p string) error { return os.Truncate(p, object.HeaderSize+10) }, ErrCorrupt},
		{"shorter than header", func(p string) error { return os.Truncate(p, 5) }, ErrCorrupt},
		{"empty", func(p string) error { return os.Truncate(p, 0) }, ErrCorrupt},
		{"removed", os.Remove, ErrMissing},
		{"another chunk's object", nil, ErrCorrupt},
	}
	for i, d := range damage {
		for _, data := range [][]byte{pseudoRandom(300000, byte(i)), bytes.Repeat([]byte{byte(i), 1, 2}, 100000)} {
			t.Run(d.name, func(t *testing.T) {
				s := testStore(t, Options{})
				ref := put(t, s, data)
				path := s.objectPath(ref.ID)
				if d.do == nil {
					other := put(t, s, pseudoRandom(1000, 99))
					obj, err := os.ReadFile(s.objectPath(other.ID))
					if err != nil {
						t.Fatal(err)
					}
					os.Chmod(path, 0o644)
					if err := os.WriteFile(path, obj, 0o644); err != nil {
						t.Fatal(err)
					}
				} else if err := d.do(path); err != nil {
					t.Fatal(err)
				}
				got, err := s.ReadChunk(context.Background(), ref)
				if !errors.Is(err, d.want) {
					t.Fatalf("read: %v (%d bytes), want %v", err, len(got), d.want)
				}
				if _, err := s.VerifyObject(context.Background(), ref.ID); !errors.Is(err, d.want) {
					t.Fatalf("verify: %v, want %v", err, d.want)
				}
			})
		}
	}
}

// flip inverts one bit at off, or in the middle of the payload when off < 0.
func flip(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if off < 0 {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		off = object.HeaderSize + (st.Size()-object.HeaderSize)/2
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 0x10
	_, err = f.WriteAt(b, off)
	return err
}

// TestUnindexedDamagedObjectIsRewritten: a leftover object that is not in the
// index (a crash before commit) is verified before a new commit relies on it.
func TestUnindexedDamagedObjectIsRewritten(t *testing.T) {
	s := testStore(t, Options{})
	data := pseudoRandom(50000, 7)
	b := s.NewBatch()
	ref, err := b.Put(context.Background(), data) // written, never committed
	if err != nil {
		t.Fatal(err)
	}
	if err := flip(s.objectPath(ref.ID), object.HeaderSize+5); err != nil {
		t.Fatal(err)
	}
	put(t, s, data)
	if got, err := s.ReadChunk(context.Background(), ref); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after re-put: %v", err)
	}
}

func TestConcurrentPutsOfOneChunkCountOnce(t *testing.T) {
	s := testStore(t, Options{})
	data := pseudoRandom(1<<20, 3)
	var wg sync.WaitGroup
	batches := make([]*Batch, 8)
	for i := range batches {
		batches[i] = s.NewBatch()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := batches[i].Put(context.Background(), data); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, b := range batches {
		mustCommit(t, s, b)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Chunks != 1 || st.UniqueBytes != 1<<20 {
		t.Fatalf("chunks %d unique %d, want 1 and %d", st.Chunks, st.UniqueBytes, 1<<20)
	}
	if st.StoredBytes != (1<<20)+object.HeaderSize {
		t.Fatalf("stored %d, want %d", st.StoredBytes, (1<<20)+object.HeaderSize)
	}
}

func TestCacheStaysWithinBudget(t *testing.T) {
	s := testStore(t, Options{CacheSize: 3 << 20})
	var refs []ChunkRef
	for i := 0; i < 10; i++ {
		refs = append(refs, put(t, s, pseudoRandom(1<<20, byte(i))))
	}
	for _, r := range refs {
		if _, err := s.ReadChunk(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if c := s.cache.bytes(); c > 3<<20 {
			t.Fatalf("cache holds %d bytes, budget %d", c, 3<<20)
		}
	}
	before := s.storeReadBytes.Load()
	if _, err := s.ReadChunk(context.Background(), refs[9]); err != nil {
		t.Fatal(err)
	}
	if s.storeReadBytes.Load() != before {
		t.Fatalf("a cache hit counted as a store read")
	}
	if _, err := s.ReadChunk(context.Background(), refs[0]); err != nil {
		t.Fatal(err)
	}
	if s.storeReadBytes.Load() != before+1<<20 {
		t.Fatalf("an evicted chunk was not read from the store")
	}
}

func TestOpenErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openLocal(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Errorf("second open: %v, want ErrLocked", err)
	}
	if _, err := openLocal(dir, Options{ReadOnly: true}); !errors.Is(err, ErrLocked) {
		t.Errorf("read-only open of a locked store: %v, want ErrLocked", err)
	}
	s.Close()
	catalog.SetFormat(t, filepath.Join(dir, catalogName), FormatVersion+1)
	if _, err := openLocal(dir, Options{}); !errors.Is(err, ErrNewerFormat) {
		t.Errorf("newer format: %v, want ErrNewerFormat", err)
	}
	if _, err := openLocal(dir, Options{ReadOnly: true}); !errors.Is(err, ErrNewerFormat) {
		t.Errorf("newer format read-only: %v, want ErrNewerFormat", err)
	}
	notStore := t.TempDir()
	os.WriteFile(filepath.Join(notStore, "x"), nil, 0o644)
	if _, err := openLocal(notStore, Options{}); !errors.Is(err, ErrNotStore) {
		t.Errorf("non-empty directory: %v, want ErrNotStore", err)
	}
	if _, err := openLocal(filepath.Join(t.TempDir(), "missing"), Options{ReadOnly: true}); !errors.Is(err, ErrNotStore) {
		t.Errorf("read-only open of nothing: %v, want ErrNotStore", err)
	}
}

func TestAllocInoSurvivesReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i := 0; i < 3; i++ {
		ino, err := s.AllocIno()
		if err != nil {
			t.Fatal(err)
		}
		seen[ino] = true
	}
	s.Close()
	s, err = openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 2*inoBlock; i++ {
		ino, err := s.AllocIno()
		if err != nil {
			t.Fatal(err)
		}
		if seen[ino] || ino < FirstIno {
			t.Fatalf("inode %d handed out twice (or reserved)", ino)
		}
		seen[ino] = true
	}
}

// TestBatchSyncsWhatItNames: Put does not fdatasync (durability is batched in
// Sync), so a batch must sync every object it names before its commit, also
// one that another batch wrote and has not synced yet, and the directories
// holding it, whoever created them.
func TestBatchSyncsWhatItNames(t *testing.T) {
	var mu sync.Mutex
	synced := map[string]int{}
	s := testStoreHook(t, func(p string) error {
		mu.Lock()
		defer mu.Unlock()
		synced[p]++
		return nil
	})
	ctx := context.Background()
	data := pseudoRandom(1<<20, 7)
	a, b := s.NewBatch(), s.NewBatch()
	defer a.Release()
	defer b.Release()
	ref, err := a.Put(ctx, data) // writes the object, not synced
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, data); err != nil { // finds it on disk, unindexed
		t.Fatal(err)
	}
	if len(synced) != 0 {
		t.Fatalf("Put synced %v: durability belongs to Sync", synced)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	obj := s.objectPath(ref.ID)
	leaf := filepath.Dir(obj)
	for _, p := range []string{obj, leaf, filepath.Dir(leaf), filepath.Dir(filepath.Dir(leaf))} {
		if synced[p] != 1 {
			t.Errorf("the batch that found the object synced %s %d times, want 1", p, synced[p])
		}
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if synced[obj] != 1 {
		t.Errorf("a second Sync synced the object again (%d times)", synced[obj])
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if synced[obj] != 2 {
		t.Errorf("the writing batch's Sync did not sync its own object (%d syncs in all)", synced[obj])
	}
}

// TestBatchSyncFailureIsShared: the kernel reports a failed writeback to one
// fdatasync only. When one batch's sync of an object fails, another batch
// naming the same object must fail too, and the next Put writes the object
// anew instead of reusing it.
func TestBatchSyncFailureIsShared(t *testing.T) {
	var hook func(string) error
	s := testStoreHook(t, func(p string) error {
		if hook != nil {
			return hook(p)
		}
		return nil
	})
	ctx := context.Background()
	data := pseudoRandom(1<<20, 9)
	a, b := s.NewBatch(), s.NewBatch()
	defer a.Release()
	defer b.Release()
	ref, err := a.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, data); err != nil {
		t.Fatal(err)
	}
	obj := s.objectPath(ref.ID)
	failOnce := errors.New("simulated writeback error")
	var mu sync.Mutex
	failed := false
	hook = func(p string) error {
		mu.Lock()
		defer mu.Unlock()
		if p == obj && !failed {
			failed = true
			return failOnce
		}
		return nil
	}
	if err := a.Sync(ctx); !errors.Is(err, failOnce) {
		t.Fatalf("first sync: %v, want the writeback error", err)
	}
	if err := b.Sync(ctx); !errors.Is(err, failOnce) {
		t.Fatalf("second batch's sync of the same object: %v, want the writeback error", err)
	}
	st, err := os.Stat(obj)
	if err != nil {
		t.Fatal(err)
	}
	c := s.NewBatch()
	defer c.Release()
	if _, err := c.Put(ctx, data); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(obj); err != nil || os.SameFile(st, st2) {
		t.Fatalf("the object whose sync failed was reused, not written anew (%v)", err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("sync of the rewritten object: %v", err)
	}
}

// TestCommitBatchRefusesUnsyncedBatch: objects are made durable in Sync, so a
// commit that skipped it would name objects that may not be on disk. Commit
// cannot skip it; the transaction's own check stays as a second line.
func TestCommitBatchRefusesUnsyncedBatch(t *testing.T) {
	s := testStore(t, Options{})
	ctx := context.Background()
	b := s.NewBatch()
	defer b.Release()
	ref, err := b.Put(context.Background(), pseudoRandom(1<<16, 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *Tx) error { return commitBatch(tx, b) }); err == nil {
		t.Fatal("CommitBatch accepted a batch Sync had not made durable")
	}
	if err := s.View(func(tx *Tx) error {
		if _, ok, err := tx.Chunk(ref.ID); ok || err != nil {
			t.Errorf("chunk indexed by the refused commit (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *Tx) error { return commitBatch(tx, b) }); err != nil {
		t.Fatalf("commit after Sync: %v", err)
	}
}

// TestBatchHoldsObjectFilesUntilSync: a batch keeps each object it wrote open
// until Sync fdatasyncs it through that descriptor, then closes it; Release
// closes those of a batch that never synced. One descriptor leaked per chunk
// would exhaust the daemon's within hours.
func TestBatchHoldsObjectFilesUntilSync(t *testing.T) {
	s := testStore(t, Options{})
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	ctx := context.Background()
	for round, sync := range []bool{true, false} {
		before := fds()
		b := s.NewBatch()
		for i := range 10 {
			if _, err := b.Put(ctx, pseudoRandom(1<<16, byte(40+i+10*round))); err != nil {
				t.Fatal(err)
			}
		}
		if held := fds() - before; held < 10 {
			t.Errorf("after 10 puts %d more descriptors are open, want 10 held for Sync", held)
		}
		if sync {
			if err := b.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if n := fds(); n != before {
				t.Errorf("after Sync %d descriptors are open, want %d", n, before)
			}
		}
		b.Release()
		if n := fds(); n != before {
			t.Errorf("after Release (synced %v) %d descriptors are open, want %d", sync, n, before)
		}
	}
}

// TestPutHinted: hinted puts store byte-grouped objects that read back
// identical, dedupe with unhinted puts of the same bytes, and work from many
// goroutines at once.
func TestPutHinted(t *testing.T) {
	s := testStore(t, Options{})
	ctx := context.Background()
	bf := tensortest.GaussBF16(1<<19, 0.02, 1)
	f32 := tensortest.GaussF32(1<<18, 0.02, 2)
	b := s.NewBatch()
	refBF, err := b.PutHinted(ctx, bf, Hint{ElemSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	refF32, err := b.PutHinted(ctx, f32, Hint{ElemSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Same bytes unhinted: the same chunk, not rewritten.
	if ref, err := b.Put(ctx, bf); err != nil || ref != refBF {
		t.Fatalf("unhinted put: %v %v", ref, err)
	}
	mustCommit(t, s, b)
	b.Release()
	for _, c := range []struct {
		ref  ChunkRef
		data []byte
	}{{refBF, bf}, {refF32, f32}} {
		if c.ref.ID != Sum(c.data) {
			t.Fatal("chunk ID is not the hash of the raw bytes")
		}
		info, err := s.VerifyObject(context.Background(), c.ref.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Codec != CodecByteGroup {
			t.Errorf("codec %v, want bytegroup", info.Codec)
		}
		var indexed ChunkInfo
		s.View(func(tx *Tx) error { indexed, _, err = tx.Chunk(c.ref.ID); return err })
		if indexed.Codec != CodecByteGroup || indexed.StoredLen != info.StoredLen {
			t.Errorf("index row %+v, object %+v", indexed, info)
		}
		got, err := s.ReadChunk(ctx, c.ref)
		if err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("read back: %v", err)
		}
	}

	// Concurrent hinted puts of distinct and shared chunks.
	b = s.NewBatch()
	defer b.Release()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 8 {
		wg.Go(func() {
			for i := range 4 {
				data := tensortest.GaussBF16(1<<16, 0.02, uint64(100+g*4+i))
				if i == 3 {
					data = tensortest.GaussBF16(1<<16, 0.02, 1) // shared by all
				}
				ref, err := b.PutHinted(ctx, data, Hint{ElemSize: 2})
				if err != nil {
					errs <- err
					return
				}
				got, err := s.ReadChunk(ctx, ref)
				if err != nil || !bytes.Equal(got, data) {
					errs <- fmt.Errorf("read back %v: %v", ref.ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// mustCommit commits batch b to s with nothing else in its transaction.
func mustCommit(t testing.TB, s *Store, b *Batch) {
	t.Helper()
	if err := s.Commit(context.Background(), b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
