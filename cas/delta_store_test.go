package cas

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// storeDelta replaces chunk ref's object in s by a delta against base (the
// way the writer of deltas publishes one), and drops it from the cache.
func storeDelta(t *testing.T, s *Store, data []byte, ref ChunkRef, base []byte, baseID ID) {
	t.Helper()
	obj := s.codecs.encodeDeltaObject(data, base, baseID, 2, new(deltaScratch))
	if err := os.WriteFile(s.objectPath(ref.ID), obj, 0o644); err != nil {
		t.Fatal(err)
	}
	s.cache.drop(ref.ID)
}

func TestStoreReadsDeltaChunks(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{})
	base, next := syntheticStep(5, 256<<10, 2, 0.01)
	_, third := syntheticStep(6, 256<<10, 2, 0.01)
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
