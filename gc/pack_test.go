package gc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// writeOrphanPack leaves what a crash leaves: a pack object, size bytes,
// that no catalog row names (a batch wrote it and the daemon died before
// the commit that records it), last modified at mtime.
func writeOrphanPack(t *testing.T, dir string, seed uint64, size int, mtime time.Time) cas.ID {
	t.Helper()
	var id cas.ID
	copy(id[:], chunkData(seed, len(id)))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, id.String())
	if err := os.WriteFile(path, chunkData(seed, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return id
}

// onlyPack is the one pack object in dir and its size.
func onlyPack(t *testing.T, dir string) (name string, size int64) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("packs: %v %v, want one", ents, err)
	}
	fi, err := ents[0].Info()
	if err != nil {
		t.Fatal(err)
	}
	return ents[0].Name(), fi.Size()
}

// storedBytes is the stored bytes of file name's chunks, as indexed.
func storedBytes(t *testing.T, s *cas.Store, name string) int64 {
	t.Helper()
	var n int64
	err := s.View(func(tx *cas.Tx) error {
		ino, ok := tx.Lookup(cas.RootIno, name)
		if !ok {
			return os.ErrNotExist
		}
		m, _, err := tx.Manifest(ino)
		if err != nil {
			return err
		}
		for _, ref := range m.Chunks {
			info, _, err := tx.Chunk(ref.ID)
			if err != nil {
				return err
			}
			n += int64(info.StoredLen)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// packFigures keeps the figures of r that a dry run must predict.
func packFigures(r Result) Result {
	return Result{Chunks: r.Chunks, FreedBytes: r.FreedBytes, Packs: r.Packs, PackedChunks: r.PackedChunks,
		FreedPacks: r.FreedPacks, FreedPackBytes: r.FreedPackBytes, OrphanPacks: r.OrphanPacks,
		YoungPacks: r.YoungPacks, PackDeadBytes: r.PackDeadBytes}
}

// TestCollectDryRunPredictsPacks: a dry run reports what the collection
// then does about packs, figure for figure: a pack no row names (a
// crash's) past the grace period, one kept by it (and committed packs,
// however young, are not counted as kept), a pack whose last chunks go,
// and a pack left with dead chunks.
func TestCollectDryRunPredictsPacks(t *testing.T) {
	old := time.Now().Add(-48 * time.Hour)
	const orphanSize = 1 << 20
	for _, tc := range []struct {
		name  string
		grace time.Duration
		// setup makes the store's state and returns the figures wanted
		// and the pack objects left after the collection.
		setup func(t *testing.T, s *cas.Store, packs string) (want Result, left int)
	}{{
		name: "crash left a pack", grace: 0,
		setup: func(t *testing.T, s *cas.Store, packs string) (Result, int) {
			commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8)})
			writeOrphanPack(t, packs, 7, orphanSize, old)
			return Result{Packs: 2, FreedPacks: 1, OrphanPacks: 1, FreedPackBytes: orphanSize, FreedBytes: orphanSize}, 1
		},
	}, {
		name: "young crash pack kept", grace: DefaultGrace,
		setup: func(t *testing.T, s *cas.Store, packs string) (Result, int) {
			commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8)})
			writeOrphanPack(t, packs, 7, orphanSize, time.Now())
			return Result{Packs: 2, YoungPacks: 1}, 2
		},
	}, {
		name: "last chunks of a pack", grace: DefaultGrace,
		setup: func(t *testing.T, s *cas.Store, packs string) (Result, int) {
			commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8), "b": smallChunks(2, 8)})
			_, size := onlyPack(t, packs)
			removeFile(t, s, "a")
			removeFile(t, s, "b")
			return Result{Packs: 1, Chunks: 16, PackedChunks: 16, FreedPacks: 1, FreedPackBytes: size, FreedBytes: size}, 0
		},
	}, {
		name: "some chunks of a pack", grace: DefaultGrace,
		setup: func(t *testing.T, s *cas.Store, packs string) (Result, int) {
			commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8), "b": smallChunks(2, 8)})
			dead := storedBytes(t, s, "a")
			removeFile(t, s, "a")
			return Result{Packs: 1, Chunks: 8, PackedChunks: 8, PackDeadBytes: dead}, 1
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s, packs := newPackedStore(t)
			want, left := tc.setup(t, s, packs)
			for _, dry := range []bool{true, false} {
				res, err := Collect(context.Background(), s, Options{Grace: tc.grace, DryRun: dry})
				if err != nil {
					t.Fatal(err)
				}
				if got := packFigures(res); got != want {
					t.Errorf("dry run %v:\n got %+v\nwant %+v", dry, got, want)
				}
			}
			if n := countPacks(t, packs); n != left {
				t.Errorf("%d packs left, want %d", n, left)
			}
			mustFsck(t, s)
		})
	}
}

// TestFsckCountsPacksGCFrees: a pack no row names is a "pack-orphan" note
// and counted, as is a pack none of whose chunks a file references; a pack
// with a live chunk is not; none is a problem, and after a collection none
// is left.
func TestFsckCountsPacksGCFrees(t *testing.T) {
	const orphanSize = 1 << 20
	for _, tc := range []struct {
		name   string
		remove []string
		orphan bool
		// What fsck counts: packs gc frees whole, of them the orphans.
		unreferenced, orphans int
	}{
		{name: "clean"},
		{name: "crash left a pack", orphan: true, unreferenced: 1, orphans: 1},
		{name: "every file of a pack deleted", remove: []string{"a", "b"}, unreferenced: 1},
		{name: "a file of a pack deleted", remove: []string{"a"}},
		{name: "both", remove: []string{"a", "b"}, orphan: true, unreferenced: 2, orphans: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, packs := newPackedStore(t)
			commitFiles(t, s, map[string][][]byte{"a": smallChunks(1, 8), "b": smallChunks(2, 8)})
			_, packSize := onlyPack(t, packs)
			var wantBytes int64
			if len(tc.remove) == 2 {
				wantBytes += packSize
			}
			for _, name := range tc.remove {
				removeFile(t, s, name)
			}
			var orphan cas.ID
			if tc.orphan {
				orphan = writeOrphanPack(t, packs, 7, orphanSize, time.Now().Add(-time.Hour))
				wantBytes += orphanSize
			}
			res, err := Fsck(context.Background(), s, FsckOptions{ReadData: true})
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK() {
				t.Errorf("problems: %v", res.Problems)
			}
			wantPacks := 1
			if tc.orphan {
				wantPacks++
			}
			if res.Packs != wantPacks || res.UnreferencedPacks != tc.unreferenced || res.OrphanPacks != tc.orphans || res.UnreferencedPackBytes != wantBytes {
				t.Errorf("packs %d, unreferenced %d (%d bytes), orphans %d; want %d, %d (%d bytes), %d",
					res.Packs, res.UnreferencedPacks, res.UnreferencedPackBytes, res.OrphanPacks, wantPacks, tc.unreferenced, wantBytes, tc.orphans)
			}
			var notes []Problem
			for _, n := range res.Notes {
				if n.Kind == "pack-orphan" {
					notes = append(notes, n)
				}
			}
			if tc.orphan != (len(notes) == 1) || len(notes) > 1 || tc.orphan && notes[0].Pack != orphan.String() {
				t.Errorf("pack-orphan notes %v, want one naming %v: %v", notes, tc.orphan, orphan)
			}

			if _, err := Collect(context.Background(), s, Options{Grace: DefaultGrace}); err != nil {
				t.Fatal(err)
			}
			res, err = Fsck(context.Background(), s, FsckOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The orphan is an hour old: the default grace keeps it.
			if res.UnreferencedPacks != tc.orphans || res.OrphanPacks != tc.orphans {
				t.Errorf("after gc: %d unreferenced packs, %d orphans; want %d", res.UnreferencedPacks, res.OrphanPacks, tc.orphans)
			}
		})
	}
}
