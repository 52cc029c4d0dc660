package cas

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
	"github.com/ckptfs/ckptfs/cas/object"
)

// storeDelta replaces chunk ref's object in s by a delta against base (the
// way the writer of deltas publishes one), and drops it from the cache.
func storeDelta(t *testing.T, s *Store, data []byte, ref ChunkRef, base []byte, baseID ID) {
	t.Helper()
	obj := s.coder.EncodeDelta(data, base, baseID, 2, new(object.DeltaScratch))
	if err := os.WriteFile(s.objectPath(ref.ID), obj, 0o644); err != nil {
		t.Fatal(err)
	}
	s.cache.drop(ref.ID)
}

func TestStoreReadsDeltaChunks(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{})
	base, next := tensortest.SyntheticStep(5, 256<<10, 2, 0.01)
	_, third := tensortest.SyntheticStep(6, 256<<10, 2, 0.01)
	bref, nref, tref := put(t, s, base), put(t, s, next), put(t, s, third)
	storeDelta(t, s, next, nref, base, bref.ID)

	t.Run("delta reads back exact, base cached or not", func(t *testing.T) {
		for range 2 {
			got, err := s.ReadChunk(ctx, nref)
			if err != nil || !bytes.Equal(got, next) {
				t.Fatalf("read delta: %v", err)
			}
			s.cache.drop(nref.ID)
			if _, err := s.ReadChunk(ctx, bref); err != nil { // base now cached
				t.Fatal(err)
			}
		}
	})
	t.Run("damaged base is ErrCorrupt", func(t *testing.T) {
		p := s.objectPath(bref.ID)
		good, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Clone(good)
		bad[len(bad)-1] ^= 1
		if err := os.WriteFile(p, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		s.cache.drop(bref.ID)
		s.cache.drop(nref.ID)
		if _, err := s.ReadChunk(ctx, nref); !errors.Is(err, ErrCorrupt) {
			t.Errorf("read with damaged base: %v, want ErrCorrupt", err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadChunk(ctx, nref); !errors.Is(err, ErrMissing) {
			t.Errorf("read with missing base: %v, want ErrMissing", err)
		}
		if err := os.WriteFile(p, good, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a delta base is refused (depth 1), cycles end", func(t *testing.T) {
		// third as a delta against next, itself a delta: depth 2.
		storeDelta(t, s, third, tref, next, nref.ID)
		s.cache.drop(nref.ID)
		if _, err := s.ReadChunk(ctx, tref); !errors.Is(err, ErrCorrupt) {
			t.Errorf("depth-2 read: %v, want ErrCorrupt", err)
		}
		// base (bref) as a delta against next, whose base is bref: a cycle.
		storeDelta(t, s, base, bref, next, nref.ID)
		done := make(chan error, 1)
		go func() { _, err := s.ReadChunk(ctx, nref); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("read in a cycle: %v, want ErrCorrupt", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("read of a chunk in a base cycle hangs")
		}
	})
}

// BenchmarkDeltaColdRead reads $CKPTFS_DELTA_READ_MB (default 64) MiB of bf16
// chunks cold (a freshly opened store: empty cache; objects are read with
// O_DIRECT where the filesystem allows), one chunk after the other, from a
// store holding them standalone and from one holding them as deltas against
// standalone bases (the previous step), alternating, and reports the
// delta ÷ standalone time. The mount reads ahead with several chunks at
// once; this is the single-reader worst case.
func BenchmarkDeltaColdRead(b *testing.B) {
	mb := 64
	if v, err := strconv.Atoi(os.Getenv("CKPTFS_DELTA_READ_MB")); err == nil && v > 0 {
		mb = v
	}
	ctx := context.Background()
	dirs := [2]string{filepath.Join(b.TempDir(), "standalone"), filepath.Join(b.TempDir(), "delta")}
	var refs []ChunkRef
	for k, dir := range dirs {
		s, err := openLocal(dir, Options{})
		if err != nil {
			b.Fatal(err)
		}
		for i := range mb {
			base, next := tensortest.SyntheticStep(uint64(i), (1<<20)/2, 2, 0.01)
			bref := putB(b, s, base)
			nref := putB(b, s, next)
			if k == 1 {
				obj := s.coder.EncodeDelta(next, base, bref.ID, 2, new(object.DeltaScratch))
				if err := os.WriteFile(s.objectPath(nref.ID), obj, 0o644); err != nil {
					b.Fatal(err)
				}
			} else {
				refs = append(refs, nref)
			}
		}
		s.Close()
	}
	var took [2]time.Duration
	for b.Loop() {
		for k, dir := range dirs {
			s, err := openLocal(dir, Options{})
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			for _, r := range refs {
				if _, err := s.ReadChunk(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			took[k] += time.Since(t0)
			s.Close()
		}
	}
	total := float64(mb<<20) * float64(b.N)
	b.ReportMetric(total/took[0].Seconds()/1e6, "standalone-MB/s")
	b.ReportMetric(total/took[1].Seconds()/1e6, "delta-MB/s")
	b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "delta/standalone")
}

func putB(b *testing.B, s *Store, data []byte) ChunkRef {
	b.Helper()
	bt := s.NewBatch()
	ref, err := bt.Put(context.Background(), data)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Commit(context.Background(), bt, func(*Tx) error { return nil }); err != nil {
		b.Fatal(err)
	}
	return ref
}
