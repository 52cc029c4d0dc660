package cas

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// putHinted stores data with hint h as one committed chunk.
func putHinted(t *testing.T, s *Store, data []byte, h Hint) ChunkRef {
	t.Helper()
	b := s.NewBatch()
	defer b.Release()
	ref, err := b.PutHinted(context.Background(), data, h)
	if err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	return ref
}

// rows returns chunk id's index row and queue row.
func rows(t *testing.T, s *Store, id ID) (ChunkInfo, bool, PendingReencode, bool) {
	t.Helper()
	info, indexed, p, queued, _, _, err := s.re.reencodeRows(id)
	if err != nil {
		t.Fatal(err)
	}
	return info, indexed, p, queued
}

// checkCounters compares the catalog's chunk, queue and delta-wait counters
// with its rows.
func checkCounters(t *testing.T, s *Store) Counts {
	t.Helper()
	var got, want Counts
	err := s.View(func(tx *Tx) error {
		got = tx.Counts()
		if err := tx.ForEachChunk(func(id ID, c ChunkInfo) error {
			want.Chunks++
			want.UniqueBytes += int64(c.RawLen)
			want.StoredBytes += int64(c.StoredLen)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachDeltaWait(func(id ID, w DeltaWait) error {
			if !w.Released {
				want.DeltaWaiting++
			}
			return nil
		}); err != nil {
			return err
		}
		return tx.ForEachPendingReencode(func(id ID, p PendingReencode) error {
			want.ReencodePending++
			want.ReencodePendingBytes += int64(p.RawLen)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Chunks != want.Chunks || got.UniqueBytes != want.UniqueBytes || got.StoredBytes != want.StoredBytes ||
		got.ReencodePending != want.ReencodePending || got.ReencodePendingBytes != want.ReencodePendingBytes ||
		got.DeltaWaiting != want.DeltaWaiting {
		t.Fatalf("counters %+v, rows say %+v", got, want)
	}
	return got
}

// drain runs ReencodeOne until the queue is empty.
func drain(t *testing.T, s *Store) {
	t.Helper()
	for i := 0; ; i++ {
		more, err := s.ReencodeOne(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			return
		}
		if i > 1000 {
			t.Fatal("the re-encode queue does not drain")
		}
	}
}

func TestInlineEncodeBudget(t *testing.T) {
	bf := tensortest.GaussBF16(1<<18, 0.02, 1)
	cases := []struct {
		name       string
		encoders   int  // Options.InlineEncoders
		busy       bool // every slot is taken by another encoder
		data       []byte
		hint       Hint
		wantCodec  Codec
		wantQueued bool
	}{
		{"slot free: encoded inline", 1, false, bf, Hint{ElemSize: 2}, CodecByteGroup, false},
		{"slots busy: raw and queued", 1, true, bf, Hint{ElemSize: 2}, CodecRaw, true},
		{"never inline: raw and queued", -1, false, bf, Hint{ElemSize: 2}, CodecRaw, true},
		{"never inline, unhinted", -1, false, bytes.Repeat([]byte("loss 0.1\n"), 4000), Hint{}, CodecRaw, true},
		{"empty chunk needs no slot", -1, false, nil, Hint{}, CodecRaw, false},
		{"default budget, idle", 0, false, bf, Hint{ElemSize: 2}, CodecByteGroup, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := testStore(t, Options{InlineEncoders: c.encoders})
			if c.busy {
				for range cap(s.re.slots) {
					s.re.slots <- struct{}{}
				}
			}
			ref := putHinted(t, s, c.data, c.hint)
			obj, err := s.VerifyObject(context.Background(), ref.ID)
			if err != nil {
				t.Fatal(err)
			}
			info, indexed, p, queued := rows(t, s, ref.ID)
			if !indexed || info != obj {
				t.Fatalf("index row %+v (indexed %v), object %+v", info, indexed, obj)
			}
			if obj.Codec != c.wantCodec || queued != c.wantQueued {
				t.Fatalf("codec %v queued %v, want %v %v", obj.Codec, queued, c.wantCodec, c.wantQueued)
			}
			if queued && (p.Hint != c.hint || p.RawLen != uint32(len(c.data))) {
				t.Fatalf("queue row %+v", p)
			}
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 1}[queued]; st.ReencodePending != want || st.ReencodePendingBytes != want*int64(len(c.data)) {
				t.Fatalf("stats %+v", st)
			}
			// A second commit of the same chunk dedupes: no second queue row.
			putHinted(t, s, c.data, c.hint)
			checkCounters(t, s)
		})
	}
}

// TestReencodeOne: chunks stored raw are re-encoded, read back byte-exact,
// and the stored bytes drop; a chunk that does not compress leaves the queue
// with its object untouched.
func TestReencodeOne(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{InlineEncoders: -1})
	if err != nil {
		t.Fatal(err)
	}
	chunks := []struct {
		data  []byte
		hint  Hint
		codec Codec
	}{
		{tensortest.GaussBF16(1<<19, 0.02, 1), Hint{ElemSize: 2}, CodecByteGroup},
		{tensortest.GaussF32(1<<17, 0.02, 2), Hint{ElemSize: 4}, CodecByteGroup},
		{bytes.Repeat([]byte("step 10 loss 0.123\n"), 5000), Hint{}, CodecZstd},
		{pseudoRandom(300000, 3), Hint{}, CodecRaw},
	}
	refs := make([]ChunkRef, len(chunks))
	for i, c := range chunks {
		refs[i] = putHinted(t, s, c.data, c.hint)
	}
	before := checkCounters(t, s)
	if before.ReencodePending != int64(len(chunks)) {
		t.Fatalf("pending %d, want %d", before.ReencodePending, len(chunks))
	}
	old := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	for _, r := range refs {
		if err := os.Chtimes(s.objectPath(r.ID), old, old); err != nil {
			t.Fatal(err)
		}
	}
	randomObj, err := os.ReadFile(s.objectPath(refs[3].ID))
	if err != nil {
		t.Fatal(err)
	}
	randomStat, _ := os.Stat(s.objectPath(refs[3].ID))

	drain(t, s)
	after := checkCounters(t, s)
	if after.ReencodePending != 0 || after.ReencodePendingBytes != 0 {
		t.Fatalf("queue not empty: %+v", after)
	}
	if after.StoredBytes >= before.StoredBytes || after.UniqueBytes != before.UniqueBytes {
		t.Fatalf("stored bytes %d → %d, unique %d → %d", before.StoredBytes, after.StoredBytes, before.UniqueBytes, after.UniqueBytes)
	}
	for i, c := range chunks {
		info, _, _, _ := rows(t, s, refs[i].ID)
		if info.Codec != c.codec {
			t.Errorf("chunk %d: codec %v, want %v", i, info.Codec, c.codec)
		}
		st, err := os.Stat(s.objectPath(refs[i].ID))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != int64(info.StoredLen) || !st.ModTime().Equal(old) {
			t.Errorf("chunk %d: object %d bytes, mtime %v; index says %d, want mtime %v", i, st.Size(), st.ModTime(), info.StoredLen, old)
		}
	}
	if obj, _ := os.ReadFile(s.objectPath(refs[3].ID)); !bytes.Equal(obj, randomObj) {
		t.Error("the incompressible chunk's object was rewritten")
	}
	if st, _ := os.Stat(s.objectPath(refs[3].ID)); !os.SameFile(st, randomStat) {
		t.Error("the incompressible chunk's object was replaced")
	}
	if more, err := s.ReencodeOne(context.Background()); more || err != nil {
		t.Fatalf("empty queue: more %v, err %v", more, err)
	}
	// Read back from disk, not from the cache of this process.
	s.Close()
	s = testStoreAt(t, dir, Options{})
	for i, c := range chunks {
		got, err := s.ReadChunk(context.Background(), refs[i])
		if err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("chunk %d read back: %v", i, err)
		}
	}
}

func testStoreAt(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := openLocal(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestReencodeCrashWindow: a re-encode stopped after its rename, before its
// transaction, leaves a readable object; the next ReencodeOne repairs the row.
func TestReencodeCrashWindow(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{InlineEncoders: -1})
	if err != nil {
		t.Fatal(err)
	}
	data := tensortest.GaussBF16(1<<19, 0.02, 4)
	ref := putHinted(t, s, data, Hint{ElemSize: 2})
	rawRow, _, _, _ := rows(t, s, ref.ID)
	if id := SimulateReencodeCrash(t, s); id != ref.ID {
		t.Fatalf("interrupted %v, want %v", id, ref.ID)
	}
	s.Close() // the "crash": nothing of the interrupted call survives but the disk
	s = testStoreAt(t, dir, Options{InlineEncoders: -1})

	row, _, _, queued := rows(t, s, ref.ID)
	obj, err := s.VerifyObject(context.Background(), ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row != rawRow || !queued || obj.Codec != CodecByteGroup || obj.StoredLen >= row.StoredLen {
		t.Fatalf("after the crash: row %+v queued %v, object %+v", row, queued, obj)
	}
	if got, err := s.ReadChunk(context.Background(), ref); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read in the crash window: %v", err)
	}
	more, err := s.ReencodeOne(context.Background())
	if err != nil || more {
		t.Fatalf("repair: more %v, err %v", more, err)
	}
	row, _, _, queued = rows(t, s, ref.ID)
	if row != obj || queued {
		t.Fatalf("after repair: row %+v queued %v, object %+v", row, queued, obj)
	}
	checkCounters(t, s)
}

// TestReencodeDropsRowsItCannotUse: the queue row of a chunk that is not
// indexed (an older ckptfs swept it) or whose object is corrupt is dropped.
func TestReencodeDropsRowsItCannotUse(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1})
	gone := putHinted(t, s, tensortest.GaussBF16(1<<16, 0.02, 5), Hint{ElemSize: 2})
	bad := putHinted(t, s, tensortest.GaussBF16(1<<16, 0.02, 6), Hint{ElemSize: 2})
	err := s.Update(func(tx *Tx) error {
		info, _, err := tx.Chunk(gone.ID)
		if err != nil {
			return err
		}
		return tx.Index().Delete(gone.ID, info) // what a sweep that ignores the queue does
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := flip(s.objectPath(bad.ID), -1); err != nil {
		t.Fatal(err)
	}
	var corrupt int
	for range 2 {
		if _, err := s.ReencodeOne(context.Background()); errors.Is(err, ErrCorrupt) {
			corrupt++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if corrupt != 1 {
		t.Fatalf("%d ErrCorrupt, want 1", corrupt)
	}
	if c := checkCounters(t, s); c.ReencodePending != 0 {
		t.Fatalf("rows left: %+v", c)
	}
}

// TestReencodeSkipsAFailingRow: a row whose object cannot be read (not a
// corruption: an I/O error) stays queued without stalling the others.
func TestReencodeSkipsAFailingRow(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1})
	var refs []ChunkRef
	for i := range 3 {
		refs = append(refs, putHinted(t, s, tensortest.GaussBF16(1<<16, 0.02, uint64(10+i)), Hint{ElemSize: 2}))
	}
	// The first row in key order is the one that fails: taking rows always
	// from the front would never get past it.
	sort.Slice(refs, func(i, j int) bool { return bytes.Compare(refs[i].ID[:], refs[j].ID[:]) < 0 })
	stuck := s.objectPath(refs[0].ID)
	if err := os.Remove(stuck); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(stuck, 0o755); err != nil { // reading it fails with EISDIR
		t.Fatal(err)
	}
	var failures int
	for range 6 {
		if _, err := s.ReencodeOne(context.Background()); err != nil {
			failures++
		}
	}
	if failures == 0 {
		t.Fatal("the unreadable object did not fail")
	}
	for i, r := range refs {
		_, _, _, queued := rows(t, s, r.ID)
		if queued != (i == 0) {
			t.Errorf("chunk %d queued %v", i, queued)
		}
	}
}

func TestSweepDropsQueueRow(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1})
	ref := putHinted(t, s, tensortest.GaussBF16(1<<16, 0.02, 7), Hint{ElemSize: 2})
	end := s.BeginCollect()
	res, err := s.Sweep(context.Background(), []ID{ref.ID})
	end()
	if err != nil || res.Chunks != 1 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	if c := checkCounters(t, s); c.ReencodePending != 0 || c.Chunks != 0 {
		t.Fatalf("after sweep: %+v", c)
	}
	if more, err := s.ReencodeOne(context.Background()); more || err != nil {
		t.Fatalf("empty queue: %v %v", more, err)
	}
}

// TestOpenAddsQueueToOlderStore: a store made before the queue existed gets
// its bucket at Open, and reads as an empty queue when opened read-only.
func TestOpenAddsQueueToOlderStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, pseudoRandom(1000, 1))
	if err := s.Update(func(tx *Tx) error { return catalog.DeleteBucket(tx, "reencode") }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ro := testStoreAt(t, dir, Options{ReadOnly: true})
	if st, err := ro.Stats(); err != nil || st.ReencodePending != 0 {
		t.Fatalf("read-only stats: %+v %v", st, err)
	}
	if more, err := ro.ReencodeOne(context.Background()); err == nil || more {
		t.Fatalf("read-only ReencodeOne: %v %v", more, err)
	}
	ro.Close()
	s = testStoreAt(t, dir, Options{InlineEncoders: -1})
	putHinted(t, s, tensortest.GaussBF16(1<<16, 0.02, 8), Hint{ElemSize: 2})
	if c := checkCounters(t, s); c.ReencodePending != 1 {
		t.Fatalf("queue after reopen: %+v", c)
	}
}

// TestBacklogBound: past MaxReencodeBacklog raw bytes queued, a new chunk
// waits for an inline encoder instead of joining the queue.
func TestBacklogBound(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{InlineEncoders: 1, MaxReencodeBacklog: 64 << 10})
	s.re.slots <- struct{}{}                              // every inline encoder busy
	a := bytes.Repeat([]byte("0123456789abcdef"), 4096+1) // 64 KiB + 16
	b := bytes.Repeat([]byte("fedcba9876543210"), 4096+1)
	putCommit := func(data []byte) ChunkRef {
		bt := s.NewBatch()
		ref, err := bt.Put(ctx, data)
		if err != nil {
			t.Error(err)
		}
		if err := s.Commit(ctx, bt, func(*Tx) error { return nil }); err != nil {
			t.Error(err)
		}
		return ref
	}
	putCommit(a) // under the bound: stored raw, queued
	if c := mustCounts(t, s); c.ReencodePendingBytes < 64<<10 {
		t.Fatalf("first chunk not queued: %+v", c)
	}
	done := make(chan ChunkRef)
	go func() { done <- putCommit(b) }()
	select {
	case <-done:
		t.Fatal("a chunk joined a full queue without waiting for an encoder")
	case <-time.After(200 * time.Millisecond):
	}
	<-s.re.slots // an encoder frees up
	ref := <-done
	info, _, _, queued := rows(t, s, ref.ID)
	if queued || info.Codec == CodecRaw {
		t.Errorf("the chunk that waited was stored raw (%+v) or queued (%v) instead of encoded", info, queued)
	}
}
