package cas

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/object"
)

// countingBackend counts the reads of a local directory.
type countingBackend struct {
	*local.Backend
	gets, ranges atomic.Int64
}

func (c *countingBackend) Get(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	c.gets.Add(1)
	return c.Backend.Get(ctx, h, buf)
}

func (c *countingBackend) GetRange(ctx context.Context, h backend.Handle, off, n int64, buf []byte) ([]byte, error) {
	c.ranges.Add(1)
	return c.Backend.GetRange(ctx, h, off, n, buf)
}

// packedStore opens a store in dir that packs chunks up to the default size
// (none inline), its reads counted.
func packedStore(t *testing.T, dir string, hook func(string) error) (*Store, *countingBackend) {
	t.Helper()
	be := &countingBackend{Backend: local.New(ObjectsDir(dir), local.Options{SyncHook: hook})}
	s, err := Open(dir, Options{Objects: be, PackMaxChunk: DefaultPackMaxChunk, InlineMaxChunk: -1})
	if err != nil {
		t.Fatal(err)
	}
	return s, be
}

// putChunks puts n chunks of size bytes (seeds from seed) in b.
func putChunks(t *testing.T, b *Batch, n, size int, seed byte) ([]ChunkRef, [][]byte) {
	t.Helper()
	var refs []ChunkRef
	var data [][]byte
	for i := range n {
		d := pseudoRandom(size, seed+byte(i))
		d[0], d[1] = byte(i), byte(i>>8) // distinct whatever the seed
		ref, err := b.Put(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		refs, data = append(refs, ref), append(data, d)
	}
	return refs, data
}

// commitChunks puts n chunks of size bytes (seeds from seed) in a batch of
// s and commits it.
func commitChunks(t *testing.T, s *Store, n, size int, seed byte) ([]ChunkRef, [][]byte) {
	t.Helper()
	b := s.NewBatch()
	refs, data := putChunks(t, b, n, size, seed)
	mustCommit(t, s, b)
	return refs, data
}

// chunkFiles counts the object files of chunks of their own under dir.
func chunkFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(ObjectsDir(dir), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ObjectsDir(dir), path)
		if !d.IsDir() && !strings.HasPrefix(rel, "packs") {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func packFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(ObjectsDir(dir), "packs"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestPackedChunksRoundTrip: a commit's small chunks go into packs of about
// PackTarget bytes, not object files; they read back the same after a
// reopen, one by one and as runs (one read per pack), and the store moves to
// format 6.
func TestPackedChunksRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	b := s.NewBatch()
	refs, data := putChunks(t, b, 300, 32<<10, 1) // 9.4 MiB: two packs
	big := pseudoRandom(DefaultPackMaxChunk+1, 9)
	bigRef, err := b.Put(context.Background(), big)
	if err != nil {
		t.Fatal(err)
	}
	// Small tensor data (a float element size) keeps an object of its own:
	// the re-encoder and deltas work on it.
	tensor := pseudoRandom(16<<10, 10)
	tensorRef, err := b.PutHinted(context.Background(), tensor, Hint{ElemSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Packs != 2 || st.Chunks != 302 || st.FormatVersion != 6 || st.PackBytes != st.PackedBytes {
		t.Fatalf("stats %+v: want 2 packs, 302 chunks, format 6, no dead bytes", st.Counts)
	}
	if n := chunkFiles(t, dir); n != 2 {
		t.Fatalf("%d chunk object files, want 2 (over the pack limit, tensor data)", n)
	}
	if n := len(packFiles(t, dir)); n != 2 {
		t.Fatalf("%d pack files, want 2", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, be := packedStore(t, dir, nil)
	defer s.Close()
	for i, ref := range refs[:10] {
		got, err := s.ReadChunk(context.Background(), ref)
		if err != nil || !bytes.Equal(got, data[i]) {
			t.Fatalf("chunk %d: %v, equal %v", i, err, bytes.Equal(got, data[i]))
		}
	}
	if got, err := s.ReadChunk(context.Background(), bigRef); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("chunk of its own: %v", err)
	}
	if got, err := s.ReadChunk(context.Background(), tensorRef); err != nil || !bytes.Equal(got, tensor) {
		t.Fatalf("tensor chunk: %v", err)
	}
	before := be.ranges.Load()
	ks, err := s.AcquireChunks(context.Background(), refs[10:])
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range ks {
		if !bytes.Equal(k.Data, data[10+i]) {
			t.Fatalf("run chunk %d: wrong bytes", 10+i)
		}
		k.Release()
	}
	if n := be.ranges.Load() - before; n != 2 {
		t.Fatalf("AcquireChunks of 290 chunks in 2 packs made %d reads, want 2", n)
	}
}

// TestPackSyncedBeforeCommit: the pack is fdatasync'd (with its directory)
// before the transaction that names it, and a batch's chunks read back
// before its commit, from its buffer and from its written pack.
func TestPackSyncedBeforeCommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	var mu sync.Mutex
	var synced []string
	s, _ := packedStore(t, dir, func(path string) error {
		mu.Lock()
		synced = append(synced, path)
		mu.Unlock()
		return nil
	})
	defer s.Close()
	b := s.NewBatch()
	refs, data := putChunks(t, b, 3, 40<<10, 2)
	if got, err := s.ReadChunk(context.Background(), refs[1]); err != nil || !bytes.Equal(got, data[1]) {
		t.Fatalf("read from the pack buffer: %v", err)
	}
	err := s.Commit(context.Background(), b, func(tx *Tx) error {
		mu.Lock()
		defer mu.Unlock()
		packs := 0
		for _, p := range synced {
			if strings.Contains(p, string(filepath.Separator)+"packs"+string(filepath.Separator)) {
				packs++
			}
		}
		if packs != 1 || !slices.Contains(synced, filepath.Join(ObjectsDir(dir), "packs")) {
			t.Errorf("synced before the transaction: %q, want the pack and its directory", synced)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadChunk(context.Background(), refs[2]); err != nil || !bytes.Equal(got, data[2]) {
		t.Fatalf("read after the commit: %v", err)
	}
}

// TestPackCrashBeforeCommit: a pack written and synced by a commit that
// never happened (the process died before the transaction) names no chunk
// after a reopen; SweepPacks keeps it through the grace period and deletes
// it after, never deletes the committed one, and never deletes one a live
// batch is writing, whatever its age.
func TestPackCrashBeforeCommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	committed := s.NewBatch()
	cRefs, cData := putChunks(t, committed, 4, 20<<10, 3)
	mustCommit(t, s, committed)
	crashed := s.NewBatch()
	refs, _ := putChunks(t, crashed, 4, 20<<10, 50)
	if err := crashed.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A live batch's pack: never swept, young or old.
	for _, before := range []time.Time{time.Now().Add(-time.Hour), time.Now().Add(time.Hour)} {
		res, err := s.SweepPacks(context.Background(), before)
		if err != nil || res.Deleted != 0 || res.Packs != 2 {
			t.Fatalf("sweep before %v with a batch live: %+v %v, want 2 packs, none deleted", before, res, err)
		}
	}
	// The crash: the batch is neither committed nor released.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(packFiles(t, dir)); n != 2 {
		t.Fatalf("%d packs on disk, want 2 (committed, crashed)", n)
	}

	s, _ = packedStore(t, dir, nil)
	defer s.Close()
	if _, err := s.ReadChunk(context.Background(), refs[0]); !errors.Is(err, ErrMissing) {
		t.Fatalf("chunk of the crashed commit: %v, want ErrMissing", err)
	}
	res, err := s.SweepPacks(context.Background(), time.Now().Add(-time.Hour))
	if err != nil || res.Packs != 2 || res.Deleted != 0 || res.YoungOrphans != 1 {
		t.Fatalf("sweep in the grace period: %+v %v, want 2 packs, the crashed one young, none deleted", res, err)
	}
	res, err = s.SweepPacks(context.Background(), time.Now().Add(time.Hour))
	if err != nil || res.Deleted != 1 {
		t.Fatalf("sweep after the grace period: %+v %v, want the crashed pack deleted", res, err)
	}
	if n := len(packFiles(t, dir)); n != 1 {
		t.Fatalf("%d packs on disk, want the committed one", n)
	}
	for i, ref := range cRefs {
		if got, err := s.ReadChunk(context.Background(), ref); err != nil || !bytes.Equal(got, cData[i]) {
			t.Fatalf("committed chunk %d after the sweep: %v", i, err)
		}
	}
}

// TestPackReleaseWithoutCommit: a batch given up deletes its packs at
// once, and a batch whose every chunk another commit indexed first leaves
// no pack either.
func TestPackReleaseWithoutCommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	b := s.NewBatch()
	putChunks(t, b, 4, 20<<10, 4)
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.Release()
	if n := len(packFiles(t, dir)); n != 0 {
		t.Fatalf("%d packs after a release without commit, want 0", n)
	}

	first, second := s.NewBatch(), s.NewBatch()
	putChunks(t, first, 4, 20<<10, 5)
	putChunks(t, second, 4, 20<<10, 5) // the same chunks, in flight in both
	for _, b := range []*Batch{first, second} {
		mustCommit(t, s, b)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(packFiles(t, dir)); n != 1 || st.Packs != 1 || st.Chunks != 4 {
		t.Fatalf("%d pack files, stats %+v: want the first commit's pack only", n, st.Counts)
	}
}

// TestPackedChunkDamaged: a flipped byte in a pack fails the read of that
// chunk (ErrCorrupt, never other bytes) and of no other.
func TestPackedChunkDamaged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	refs, data := commitChunks(t, s, 3, 30<<10, 6)
	var info ChunkInfo
	if err := s.View(func(tx *Tx) error { var err error; info, _, err = tx.Chunk(refs[1].ID); return err }); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ObjectsDir(dir), "packs", info.Pack.String())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := int64(info.Offset) + int64(info.StoredLen)/2
	var c [1]byte
	if _, err := f.ReadAt(c[:], at); err != nil {
		t.Fatal(err)
	}
	c[0] ^= 0x10
	if _, err := f.WriteAt(c[:], at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.ReadChunk(context.Background(), refs[1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged packed chunk: %v, want ErrCorrupt", err)
	}
	if _, err := s.AcquireChunks(context.Background(), refs); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("run over a damaged packed chunk: %v, want ErrCorrupt", err)
	}
	for _, i := range []int{0, 2} {
		if got, err := s.ReadChunk(context.Background(), refs[i]); err != nil || !bytes.Equal(got, data[i]) {
			t.Fatalf("neighbour %d of the damage: %v", i, err)
		}
	}
}

// TestPacksInAnOlderStore: a store written without packs (format 2, every
// row version 1) reads as before once packs are on; the first pack moves
// it to format 4, and both kinds of rows read after a reopen.
func TestPacksInAnOlderStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{PackMaxChunk: -1})
	if err != nil {
		t.Fatal(err)
	}
	old := pseudoRandom(20<<10, 7)
	oldRef := put(t, s, old)
	if f := s.Format(); f != 2 {
		t.Fatalf("format %d before packs, want 2", f)
	}
	s.Close()

	s, _ = packedStore(t, dir, nil)
	if got, err := s.ReadChunk(context.Background(), oldRef); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("unpacked chunk with packs on: %v", err)
	}
	if f := s.Format(); f != 2 {
		t.Fatalf("format %d after opening, want 2 until a pack is written", f)
	}
	fresh := pseudoRandom(20<<10, 8)
	freshRef := put(t, s, fresh)
	s.Close()

	s, _ = packedStore(t, dir, nil)
	defer s.Close()
	if f := s.Format(); f != 6 {
		t.Fatalf("format %d after the first pack, want 6", f)
	}
	for _, c := range []struct {
		ref  ChunkRef
		data []byte
		pack bool
	}{{oldRef, old, false}, {freshRef, fresh, true}} {
		var info ChunkInfo
		if err := s.View(func(tx *Tx) error { var err error; info, _, err = tx.Chunk(c.ref.ID); return err }); err != nil {
			t.Fatal(err)
		}
		if info.Packed() != c.pack {
			t.Fatalf("chunk %v packed %v, want %v", c.ref.ID, info.Packed(), c.pack)
		}
		if got, err := s.ReadChunk(context.Background(), c.ref); err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("chunk %v: %v", c.ref.ID, err)
		}
	}
}

// TestPackConcurrentPuts: many goroutines put into one batch (as a commit's
// ingest does) across a pack's write-out, each reading its chunks back
// before the commit, from the buffer or the written pack; everything reads
// back after a reopen.
func TestPackConcurrentPuts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	b := s.NewBatch()
	const workers, each = 8, 50 // 400 chunks of 24 KiB: a pack written out, one left in the buffer
	refs := make([][]ChunkRef, workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				d := pseudoRandom(24<<10, byte(w*each+i))
				d[0], d[1], d[2] = byte(w), byte(i), 0xee
				ref, err := b.Put(context.Background(), d)
				if err == nil {
					var got []byte
					if got, err = s.ReadChunk(context.Background(), ref); err == nil && !bytes.Equal(got, d) {
						err = errors.New("wrong bytes read back before the commit")
					}
				}
				if err != nil {
					errs <- err
					return
				}
				refs[w] = append(refs[w], ref)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	s.Close()
	s, _ = packedStore(t, dir, nil)
	defer s.Close()
	st, err := s.Stats()
	if err != nil || st.Packs != 2 || st.Chunks != workers*each {
		t.Fatalf("stats %+v %v: want 2 packs, %d chunks", st.Counts, err, workers*each)
	}
	for w := range workers {
		for i, ref := range refs[w] {
			got, err := s.ReadChunk(context.Background(), ref)
			if err != nil || got[0] != byte(w) || got[1] != byte(i) || Sum(got) != ref.ID {
				t.Fatalf("worker %d chunk %d after the reopen: %v", w, i, err)
			}
		}
	}
}

// TestPackHoldsChunksInOrder: chunks put with PutAt lie in their packs
// sorted by order, whatever order the puts came in (a commit's workers
// finish a file's chunks in no fixed order), and Put's chunks after them
// in the order put. Each chunk reads back right from the pack buffer before
// it is sorted, from the written pack before the commit, and after it.
func TestPackHoldsChunksInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	ctx := context.Background()
	b := s.NewBatch()
	// 300 chunks of 32 KiB (two packs), put by 8 goroutines from a
	// shuffled order: each pack's chunks arrive out of order.
	const n, size = 300, 32 << 10
	data := make([][]byte, n)
	for i := range data {
		data[i] = pseudoRandom(size, byte(i))
		data[i][0], data[i][1], data[i][2] = byte(i), byte(i>>8), 0xcc
	}
	perm := make([]int, n)
	for i := range perm {
		perm[i] = (i*7919 + 13) % n // a fixed shuffle (7919 is prime to 300)
	}
	refs := make([]ChunkRef, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < n; k += 8 {
				i := perm[k]
				ref, err := b.PutAt(ctx, data[i], Hint{}, int64(i)*size)
				if err == nil {
					var got []byte
					if got, err = s.ReadChunk(ctx, ref); err == nil && !bytes.Equal(got, data[i]) {
						err = fmt.Errorf("chunk %d: wrong bytes read back before the commit", i)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				refs[i] = ref
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tail := make([][]byte, 3)
	tailRefs := make([]ChunkRef, 3)
	for i := range tail {
		tail[i] = pseudoRandom(size, byte(200+i))
		tail[i][0], tail[i][1], tail[i][2] = byte(i), 0, 0xdd
		ref, err := b.Put(ctx, tail[i])
		if err != nil {
			t.Fatal(err)
		}
		tailRefs[i] = ref
	}
	if err := b.Sync(ctx); err != nil { // writes the last pack out, sorted
		t.Fatal(err)
	}
	readBack(t, s, refs, data, "from its written pack, before the commit")
	mustCommit(t, s, b)

	type placed struct {
		pack  ID
		off   uint32
		order int // chunk index; the tail's after every other
	}
	var ps []placed
	err := s.View(func(tx *Tx) error {
		for i, ref := range append(slices.Clone(refs), tailRefs...) {
			info, ok, err := tx.Chunk(ref.ID)
			if err != nil || !ok || !info.Packed() {
				return fmt.Errorf("chunk %d: %+v %v %v", i, info, ok, err)
			}
			ps = append(ps, placed{info.Pack, info.Offset, i})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	byPack := map[ID][]placed{}
	for _, p := range ps {
		byPack[p.pack] = append(byPack[p.pack], p)
	}
	if len(byPack) != 2 {
		t.Fatalf("%d packs, want 2", len(byPack))
	}
	for pack, in := range byPack {
		slices.SortFunc(in, func(a, b placed) int { return cmp.Compare(a.off, b.off) })
		for k := 1; k < len(in); k++ {
			if in[k].order < in[k-1].order {
				t.Fatalf("pack %v: chunk %d at %d lies after chunk %d at %d", pack, in[k-1].order, in[k-1].off, in[k].order, in[k].off)
			}
		}
	}
	readBack(t, s, refs, data, "after the commit")
	readBack(t, s, tailRefs, tail, "(one Put put) after the commit")
}

// readBack reads each of refs from s and checks it against data.
func readBack(t *testing.T, s *Store, refs []ChunkRef, data [][]byte, when string) {
	t.Helper()
	for i, ref := range refs {
		if got, err := s.ReadChunk(context.Background(), ref); err != nil || !bytes.Equal(got, data[i]) {
			t.Fatalf("chunk %d %s: %v (equal %v)", i, when, err, bytes.Equal(got, data[i]))
		}
	}
}

// TestPackBufferGrowsToAPack: a pack's buffer grows to a pack's size and
// one object, not past it as append grows a slice (by a quarter at this
// size), and the batch's next pack gets the buffer of the pack it wrote.
func TestPackBufferGrowsToAPack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	b := s.NewBatch()
	defer b.Release()
	// 40 KiB: doubling from the first buffer (two objects) passes a pack's
	// size well before it ends, at 10 MiB.
	const size = 40 << 10
	// A pack written out (in order: not sorted), and one chunk in the next.
	putChunks(t, b, PackTarget/(size+object.HeaderSize)+2, size, 3)
	b.packMu.Lock()
	next, written := cap(b.cur.buf), len(b.packs)
	b.packMu.Unlock()
	most := PackTarget + size + object.HeaderSize // a pack and one object
	if written != 1 || next < PackTarget || next > most {
		t.Fatalf("%d packs written, the next pack's buffer %d bytes: want 1, and the first's buffer, %d to %d bytes", written, next, PackTarget, most)
	}
}

// packPutRecorder records the first byte's address of each pack Put.
type packPutRecorder struct {
	*local.Backend
	mu    sync.Mutex
	packs []*byte
}

func (r *packPutRecorder) Put(ctx context.Context, h backend.Handle, obj []byte, opts backend.PutOptions) error {
	if h.Kind == backend.Pack && len(obj) > 0 {
		r.mu.Lock()
		r.packs = append(r.packs, &obj[0])
		r.mu.Unlock()
	}
	return r.Backend.Put(ctx, h, obj, opts)
}

// TestPackSortReusesBuffers: a batch writing pack after pack out of order
// fills and sorts each in the two buffers it keeps (the packs written come
// from them), allocating no more; and letting the batch go (Release, which
// a kept batch's commit does too) lets them go, since the registry of packs
// holds a kept batch for good.
func TestPackSortReusesBuffers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	be := &packPutRecorder{Backend: local.New(ObjectsDir(dir), local.Options{})}
	s, err := Open(dir, Options{Objects: be, PackMaxChunk: DefaultPackMaxChunk, InlineMaxChunk: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	const size = 32 << 10
	perPack := PackTarget/(size+object.HeaderSize) + 1
	kept := map[*byte]bool{} // the batch's two buffers after its first pack
	for p := range 3 {
		// Each pack's chunks put last first: every pack is sorted.
		for k := perPack - 1; k >= 0; k-- {
			i := p*perPack + k
			d := pseudoRandom(size, byte(i))
			d[0], d[1], d[2] = byte(i), byte(i>>8), 0xab
			if _, err := b.PutAt(context.Background(), d, Hint{}, int64(i)*size); err != nil {
				t.Fatal(err)
			}
		}
		be.mu.Lock()
		written := slices.Clone(be.packs)
		be.mu.Unlock()
		if len(written) != p+1 {
			t.Fatalf("%d packs written, want %d", len(written), p+1)
		}
		if p == 0 {
			b.packMu.Lock()
			for _, buf := range b.spares {
				kept[&buf[:1][0]] = true
			}
			b.packMu.Unlock()
			if len(kept) != 2 || !kept[written[0]] {
				t.Fatalf("after the first pack the batch keeps %d buffers (want 2, the written one among them)", len(kept))
			}
			continue
		}
		if !kept[written[p]] {
			t.Fatalf("pack %d was sorted into a buffer allocated after the first pack", p+1)
		}
	}
	b.Keep()
	mustCommit(t, s, b)
	b.packMu.Lock()
	left := len(b.spares)
	b.packMu.Unlock()
	if left != 0 {
		t.Fatalf("a kept batch, committed, still holds %d pack buffers", left)
	}
}

// TestPackedThenHintedSameBytes: the same bytes put twice in one batch,
// first packed (no hint) and then with a float hint (an object of its own:
// all-zero tensors of one byte size, one of them int64 and one bf16), are
// indexed where the pack holds them and read back. The commit took the
// packed row's offset and size from the last put's record, the object's:
// offset 0, and a read failed ("payload is 27 bytes, header says 20480").
func TestPackedThenHintedSameBytes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	ctx := context.Background()
	b := s.NewBatch()
	filler := pseudoRandom(24<<10, 7) // the pack's first object, so the chunk's offset is not 0
	if _, err := b.PutAt(ctx, filler, Hint{}, 0); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 20<<10)
	ref, err := b.PutAt(ctx, zeros, Hint{}, 24<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutHinted(ctx, zeros, Hint{ElemSize: 2}); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ = packedStore(t, dir, nil)
	defer s.Close()
	if got, err := s.ReadChunk(ctx, ref); err != nil || !bytes.Equal(got, zeros) {
		t.Fatalf("read: %v (equal %v)", err, bytes.Equal(got, zeros))
	}
	st, err := s.Stats()
	if err != nil || st.ReencodePending != 0 {
		t.Fatalf("stats %+v %v: a packed chunk queued for re-encoding", st.Counts, err)
	}
}
