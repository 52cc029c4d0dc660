package cas

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestAcquireChunksOutOfOrder: a file's chunks lie in a pack in the order
// the writers put them, not in file order, so AcquireChunks reads the
// chunks near each other in a pack with one read whatever their order in
// refs, gaps of other objects included up to maxRunGap, and returns them in
// the order of refs.
func TestAcquireChunksOutOfOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, be := packedStore(t, dir, nil)
	defer s.Close()
	b := s.NewBatch()
	refs, data := putChunks(t, b, 64, 16<<10, 3) // 1 MiB: one pack
	if err := s.Commit(context.Background(), b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// Pairs swapped: the order a reader of the file would ask for if the
	// writers had put each pair the other way round.
	swapped := func(idx []int) []int {
		out := append([]int(nil), idx...)
		for i := 0; i+1 < len(out); i += 2 {
			out[i], out[i+1] = out[i+1], out[i]
		}
		return out
	}
	all := make([]int, 64)
	for i := range all {
		all[i] = i
	}
	var everyOther, farApart []int
	for i := 0; i < 64; i += 2 {
		everyOther = append(everyOther, i)
	}
	// 16 KiB chunks 20 apart: gaps of 304 KiB, more than maxRunGap.
	farApart = []int{0, 20, 40, 60}
	tests := []struct {
		name  string
		idx   []int
		reads int64
	}{
		{"all, pairs swapped", swapped(all), 1},
		{"every other, pairs swapped", swapped(everyOther), 1},
		{"all, reversed", reversed(all), 1},
		{"gaps over maxRunGap", farApart, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.cache = newCache(s.cache.budget, s.cache.bufSize) // cold
			want := make([]ChunkRef, len(tt.idx))
			for i, x := range tt.idx {
				want[i] = refs[x]
			}
			before := be.ranges.Load()
			ks, err := s.AcquireChunks(context.Background(), want)
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range ks {
				if !bytes.Equal(k.Data, data[tt.idx[i]]) {
					t.Errorf("chunk %d (of %d in the pack): wrong bytes", i, tt.idx[i])
				}
				k.Release()
			}
			if n := be.ranges.Load() - before; n != tt.reads {
				t.Errorf("%d range reads, want %d", n, tt.reads)
			}
		})
	}
}

func reversed(idx []int) []int {
	out := make([]int, len(idx))
	for i, x := range idx {
		out[len(idx)-1-i] = x
	}
	return out
}

// TestAcquireChunksReadersMeanwhile: readers asking for the chunks of a run
// while AcquireChunks loads it (each chunk's load claimed before the read)
// get the right bytes, and a damaged chunk of the run gives ErrCorrupt to
// every reader of it and to AcquireChunks, never a hang or another chunk's
// bytes; its neighbours read back whole.
func TestAcquireChunksReadersMeanwhile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	b := s.NewBatch()
	refs, data := putChunks(t, b, 64, 16<<10, 5)
	if err := s.Commit(context.Background(), b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	damaged := 17
	damageChunk(t, s, dir, refs[damaged].ID)
	for round := range 20 {
		s.cache = newCache(s.cache.budget, s.cache.bufSize) // cold
		var wg sync.WaitGroup
		var runErr error
		wg.Go(func() {
			ks, err := s.AcquireChunks(context.Background(), refs)
			runErr = err
			for _, k := range ks {
				k.Release()
			}
		})
		errs := make([]error, len(refs))
		for i := range refs {
			wg.Go(func() {
				k, err := s.AcquireChunk(context.Background(), refs[i])
				if err == nil {
					if !bytes.Equal(k.Data, data[i]) {
						err = errors.New("wrong bytes")
					}
					k.Release()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if !errors.Is(runErr, ErrCorrupt) {
			t.Fatalf("round %d: AcquireChunks over a damaged chunk: %v, want ErrCorrupt", round, runErr)
		}
		for i, err := range errs {
			if i == damaged && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("round %d: damaged chunk %d: %v, want ErrCorrupt", round, i, err)
			}
			if i != damaged && err != nil {
				t.Fatalf("round %d: chunk %d: %v", round, i, err)
			}
		}
	}
}

// damageChunk flips a byte in the middle of packed chunk id's object.
func damageChunk(t *testing.T, s *Store, dir string, id ID) {
	t.Helper()
	var info ChunkInfo
	if err := s.View(func(tx *Tx) error {
		var ok bool
		var err error
		info, ok, err = tx.Chunk(id)
		if err == nil && !ok {
			err = errors.New("no row")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !info.Packed() {
		t.Fatalf("chunk %v is not packed", id)
	}
	f, err := os.OpenFile(filepath.Join(ObjectsDir(dir), "packs", info.Pack.String()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	at := int64(info.Offset) + int64(info.StoredLen)/2
	var c [1]byte
	if _, err := f.ReadAt(c[:], at); err != nil {
		t.Fatal(err)
	}
	c[0] ^= 0x10
	if _, err := f.WriteAt(c[:], at); err != nil {
		t.Fatal(err)
	}
}
