package gc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

func newPackedStore(t *testing.T) (*cas.Store, string) {
	t.Helper()
	s := newStoreOpts(t, cas.Options{PackMaxChunk: cas.DefaultPackMaxChunk, InlineMaxChunk: -1})
	return s, filepath.Join(s.ObjectsLocation(), "packs")
}

// commitFiles commits files (name → chunks) in one batch, so that their
// small chunks share a pack.
func commitFiles(t *testing.T, s *cas.Store, files map[string][][]byte) {
	t.Helper()
	b := s.NewBatch()
	ms := map[string]*cas.Manifest{}
	inos := map[string]uint64{}
	for name, chunks := range files {
		m := &cas.Manifest{}
		for _, c := range chunks {
			ref, err := b.Put(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			m.Chunks = append(m.Chunks, ref)
		}
		ms[name] = m
		ino, err := s.AllocIno()
		if err != nil {
			t.Fatal(err)
		}
		inos[name] = ino
	}
	err := s.Commit(context.Background(), b, func(tx *cas.Tx) error {
		for name, m := range ms {
			ino := inos[name]
			if err := tx.PutManifest(ino, m); err != nil {
				return err
			}
			if err := tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: m.Size()}); err != nil {
				return err
			}
			if err := tx.Link(cas.RootIno, name, ino); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func countPacks(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

func smallChunks(seed uint64, n int) [][]byte {
	var cs [][]byte
	for i := range n {
		cs = append(cs, chunkData(seed*1000+uint64(i), 24<<10))
	}
	return cs
}

// TestCollectFreesAPackWithItsLastChunk: deleting one of two files that
// share a pack frees nothing of it (its dead bytes are reported); deleting
// the other frees the pack.
func TestCollectFreesAPackWithItsLastChunk(t *testing.T) {
	s, packs := newPackedStore(t)
	commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8), "b": smallChunks(2, 8)})
	if n := countPacks(t, packs); n != 1 {
		t.Fatalf("%d packs, want 1", n)
	}
	mustFsck(t, s)

	removeFile(t, s, "a")
	res, err := Collect(context.Background(), s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.PackedChunks != 8 || res.FreedPacks != 0 || res.PackDeadBytes < 8*(24<<10) {
		t.Fatalf("after deleting a: %+v, want 8 packed chunks freed, no pack, their bytes dead", res)
	}
	if n := countPacks(t, packs); n != 1 {
		t.Fatalf("%d packs after deleting a, want 1", n)
	}
	mustFsck(t, s)

	removeFile(t, s, "b")
	res, err = Collect(context.Background(), s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.PackedChunks != 8 || res.FreedPacks != 1 || res.FreedPackBytes <= 16*(24<<10) || res.PackDeadBytes != 0 {
		t.Fatalf("after deleting b: %+v, want the pack freed", res)
	}
	if n := countPacks(t, packs); n != 0 {
		t.Fatalf("%d packs after deleting both, want 0", n)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Chunks != 0 || st.Packs != 0 || st.PackBytes != 0 || st.StoredBytes != 0 {
		t.Fatalf("stats %+v, want an empty store", st.Counts)
	}
}

// TestFsckFindsADamagedPackedChunk: a flipped byte inside a pack is a
// corrupt-chunk problem naming the chunk, and the chunk's read fails; a
// missing pack makes its chunks missing.
func TestFsckFindsADamagedPackedChunk(t *testing.T) {
	s, packs := newPackedStore(t)
	_, m := commitFile(t, s, "f", smallChunks(3, 4)...)
	mustFsck(t, s)
	ents, err := os.ReadDir(packs)
	if err != nil || len(ents) != 1 {
		t.Fatalf("packs: %v %v", ents, err)
	}
	path := filepath.Join(packs, ents[0].Name())
	pack, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pack[len(pack)*5/8] ^= 1 // inside the third chunk's object
	if err := os.WriteFile(path, pack, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Fsck(context.Background(), s, FsckOptions{ReadData: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || res.Problems[0].Kind != "corrupt-chunk" || res.Problems[0].Chunk != m.Chunks[2].ID.String() {
		t.Fatalf("fsck: %+v, want one corrupt-chunk naming chunk 2", res.Problems)
	}
	if _, err := s.ReadChunk(context.Background(), m.Chunks[2]); err == nil {
		t.Fatal("read of the damaged chunk succeeded")
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	res, err = Fsck(context.Background(), s, FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 4 || res.Problems[0].Kind != "missing-chunk" {
		t.Fatalf("fsck without the pack: %+v, want 4 missing chunks", res.Problems)
	}
}
