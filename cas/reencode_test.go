package cas

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
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
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *Tx) error { return tx.CommitBatch(b) }); err != nil {
		t.Fatal(err)
	}
	return ref
}

// rows returns chunk id's index row and queue row.
func rows(t *testing.T, s *Store, id ID) (ChunkInfo, bool, PendingReencode, bool) {
	t.Helper()
	var info ChunkInfo
	var p PendingReencode
	var indexed, queued bool
	err := s.View(func(tx *Tx) error {
		var err error
		if info, indexed, err = tx.Chunk(id); err != nil {
			return err
		}
		p, queued, err = tx.PendingReencode(id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return info, indexed, p, queued
}

// checkCounters compares the catalog's chunk and queue counters with its rows.
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
		got.ReencodePending != want.ReencodePending || got.ReencodePendingBytes != want.ReencodePendingBytes {
		t.Fatalf("counters %+v, rows say %+v", got, want)
	}
	return got
}

func TestInlineEncodeBudget(t *testing.T) {
	bf := gaussBF16(1<<18, 0.02, 1)
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
				for range cap(s.encodeSlots) {
					s.encodeSlots <- struct{}{}
				}
			}
			ref := putHinted(t, s, c.data, c.hint)
			obj, err := s.VerifyObject(ref.ID)
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

func TestSweepDropsQueueRow(t *testing.T) {
	s := testStore(t, Options{InlineEncoders: -1})
	ref := putHinted(t, s, gaussBF16(1<<16, 0.02, 7), Hint{ElemSize: 2})
	end := s.BeginCollect()
	res, err := s.Sweep(context.Background(), []ID{ref.ID})
	end()
	if err != nil || res.Chunks != 1 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	if c := checkCounters(t, s); c.ReencodePending != 0 || c.Chunks != 0 {
		t.Fatalf("after sweep: %+v", c)
	}
}

// TestOpenAddsQueueToOlderStore: a store made before the queue existed gets
// its bucket at Open, and reads as an empty queue when opened read-only.
func TestOpenAddsQueueToOlderStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, pseudoRandom(1000, 1))
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketReencode) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ro, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := ro.Stats(); err != nil || st.ReencodePending != 0 {
		t.Fatalf("read-only stats: %+v %v", st, err)
	}
	ro.Close()
	s, err = Open(dir, Options{InlineEncoders: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putHinted(t, s, gaussBF16(1<<16, 0.02, 8), Hint{ElemSize: 2})
	if c := checkCounters(t, s); c.ReencodePending != 1 {
		t.Fatalf("queue after reopen: %+v", c)
	}
}
