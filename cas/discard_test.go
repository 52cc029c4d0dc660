package cas

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"testing"
)

// TestReleaseDiscardsUnnamedObjects: a batch released without a commit (a
// failed or abandoned write) deletes the objects no row names, at once; a
// committed or kept batch, and an object another batch has pinned or a commit
// has indexed, keep theirs.
func TestReleaseDiscardsUnnamedObjects(t *testing.T) {
	ctx := context.Background()
	exists := func(s *Store, id ID) bool {
		_, err := os.Stat(s.objectPath(id))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}
	cases := []struct {
		name string
		// run puts data in a batch that is then released, with whatever
		// else the case needs, and says whether the object must remain.
		run func(t *testing.T, s *Store, data []byte) (id ID, remains bool)
	}{
		{"abandoned", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			b := s.NewBatch()
			ref, err := b.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
			return ref.ID, false
		}},
		{"synced, transaction failed", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			b := s.NewBatch()
			ref, err := b.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Commit(ctx, b, func(*Tx) error { return errors.New("the catalog is full") })
			if err == nil {
				t.Fatal("the transaction committed")
			}
			return ref.ID, false
		}},
		{"committed", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			b := s.NewBatch()
			ref, err := b.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			return ref.ID, true
		}},
		{"kept", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			b := s.NewBatch()
			ref, err := b.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			b.Keep()
			b.Release()
			return ref.ID, true
		}},
		{"deduplicated by a batch in flight", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			a, b := s.NewBatch(), s.NewBatch()
			ref, err := a.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Put(ctx, data); err != nil { // finds a's object
				t.Fatal(err)
			}
			a.Release() // a's write failed; b still names the object
			if !exists(s, ref.ID) {
				t.Fatal("a failed batch deleted an object another batch deduplicated against")
			}
			if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			got, err := s.ReadChunk(ctx, ref)
			if err != nil || string(got) != string(data) {
				t.Fatalf("read after the other batch committed: %v", err)
			}
			return ref.ID, true
		}},
		{"indexed by a commit already released", func(t *testing.T, s *Store, data []byte) (ID, bool) {
			a := s.NewBatch()
			ref, err := a.Put(ctx, data)
			if err != nil {
				t.Fatal(err)
			}
			put(t, s, data) // another batch commits the chunk and releases it
			a.Release()
			return ref.ID, true
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := testStore(t, Options{})
			id, remains := c.run(t, s, pseudoRandom(64<<10, byte(i)))
			if got := exists(s, id); got != remains {
				t.Fatalf("object exists after release: %v, want %v", got, remains)
			}
		})
	}
}
