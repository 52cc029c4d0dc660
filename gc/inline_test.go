package gc

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

// TestInlineChunksCollectAndFsck: chunks stored inline in the catalog are
// verified by fsck (read from the catalog, not skipped for want of a
// file), kept while a file names them, shared ones stored once, and freed
// with their last reference, counters and all.
func TestInlineChunksCollectAndFsck(t *testing.T) {
	ctx := context.Background()
	s := newStoreOpts(t, cas.Options{InlineMaxChunk: cas.DefaultInlineMaxChunk})
	shared, own := chunkData(1, 4<<10), chunkData(2, 2<<10)
	commitFile(t, s, "a", shared, own)
	commitFile(t, s, "b", shared)
	inline := func() (int64, int64) {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.InlineChunks, st.InlineBytes
	}
	if n, _ := inline(); n != 2 {
		t.Fatalf("%d inline chunks, want 2 (the shared one once)", n)
	}
	res := fsck(t, s)
	if !res.OK() || res.ObjectsRead != 2 {
		t.Fatalf("fsck: %+v, want OK with both inline chunks read", res)
	}

	removeFile(t, s, "a")
	if res := fsck(t, s); !res.OK() || res.Unreferenced != 1 {
		t.Fatalf("fsck after deleting a: %d unreferenced, want 1 (own's inline chunk, which gc frees)", res.Unreferenced)
	}
	gres, err := Collect(ctx, s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if gres.IndexRows != 0 {
		t.Fatalf("after deleting a: %+v: an inline chunk counted as a bare index row", gres)
	}
	if n, b := inline(); gres.Chunks != 1 || n != 1 || gres.FreedBytes != int64(len(own)+24) || b != int64(len(shared)+24) {
		t.Fatalf("after deleting a: %+v, %d inline chunks of %d bytes; want own's chunk freed, shared kept", gres, n, b)
	}
	mustFsck(t, s)

	removeFile(t, s, "b")
	if gres, err = Collect(ctx, s, Options{}); err != nil {
		t.Fatal(err)
	}
	if n, b := inline(); gres.Chunks != 1 || n != 0 || b != 0 {
		t.Fatalf("after deleting b: %+v, %d inline chunks of %d bytes; want none left", gres, n, b)
	}
	mustFsck(t, s)
}

// TestFsckInlineObjectsAgainstIndex: an inline object whose index row is
// gone, or whose row says the chunk is stored elsewhere, is damage that no
// sweep frees (a sweep frees inline objects through their rows); fsck names
// it, and the inline counters that disagree with the inline bucket. Each
// case damages the catalog of a store whose files were removed (so that no
// manifest names the chunk and only the inline object is wrong).
func TestFsckInlineObjectsAgainstIndex(t *testing.T) {
	cases := []struct {
		name   string
		damage func(tx *cas.Tx, id cas.ID, info cas.ChunkInfo) error
		kind   string // the problem fsck must report
		detail string // a part of its detail
	}{
		{"row deleted, object kept", func(tx *cas.Tx, id cas.ID, info cas.ChunkInfo) error {
			info.Inline = false // Delete drops the row and leaves the inline object
			return tx.Index().Delete(id, info)
		}, "inline-orphan", "no index row"},
		{"row says stored as a file", func(tx *cas.Tx, id cas.ID, info cas.ChunkInfo) error {
			row := info
			row.Inline = false
			if err := tx.Index().Delete(id, row); err != nil {
				return err
			}
			_, err := tx.Index().Add(id, row)
			return err
		}, "inline-orphan", "stored elsewhere"},
		{"inline_bytes counter off", func(tx *cas.Tx, id cas.ID, info cas.ChunkInfo) error {
			info.StoredLen++ // the counters lose one byte more than the object holds
			return tx.Index().Delete(id, info)
		}, "counter", "inline_bytes counter is -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStoreOpts(t, cas.Options{InlineMaxChunk: cas.DefaultInlineMaxChunk})
			_, m := commitFile(t, s, "a", chunkData(3, 3<<10))
			removeFile(t, s, "a")
			if res := fsck(t, s); !res.OK() {
				t.Fatalf("fsck before the damage: %+v", res.Problems)
			}
			id := m.Chunks[0].ID
			err := s.Update(func(tx *cas.Tx) error {
				info, ok, err := tx.Chunk(id)
				if err != nil || !ok || !info.Inline {
					return fmt.Errorf("chunk %v: row %+v indexed %v (want inline): %v", id, info, ok, err)
				}
				return tc.damage(tx, id, info)
			})
			if err != nil {
				t.Fatal(err)
			}
			res := fsck(t, s)
			found := false
			for _, p := range res.Problems {
				found = found || p.Kind == tc.kind && strings.Contains(p.Detail, tc.detail)
			}
			if !found {
				t.Fatalf("fsck problems %+v, want a %q one saying %q", res.Problems, tc.kind, tc.detail)
			}
		})
	}
}
