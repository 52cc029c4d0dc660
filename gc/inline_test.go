package gc

import (
	"context"
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
