package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	refs, data := commitChunks(t, s, 64, 16<<10, 3) // 1 MiB: one pack
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
	refs, data := commitChunks(t, s, 64, 16<<10, 5)
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

// TestAcquireChunksInPlace: the raw chunks of a run read by AcquireChunks
// are verified and cached where the read put them (one buffer, which the
// budget counts whole), when they fill at least half of it; compressible
// chunks of the same run are decoded into buffers of their own; a sparse
// run is copied out. Every chunk reads back its own bytes, from the run
// and later from the cache, and once the cache lets the chunks go and the
// readers release them, the buffer is kept for the next run.
func TestAcquireChunksInPlace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	b := s.NewBatch()
	var refs []ChunkRef
	var data [][]byte
	for i := range 64 {
		d := pseudoRandom(16<<10, byte(i))
		d[0], d[1] = byte(i), 0xfe
		if i%8 == 3 { // compressible: zstd, not raw
			d = bytes.Repeat([]byte{byte(i), 'x', 'y', 'z'}, 4<<10)
		}
		ref, err := b.Put(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		refs, data = append(refs, ref), append(data, d)
	}
	mustCommit(t, s, b)
	all, sparse := make([]int, 64), []int{}
	for i := range all {
		all[i] = i
		if i%3 == 0 {
			sparse = append(sparse, i)
		}
	}
	tests := []struct {
		name    string
		idx     []int
		inPlace bool // the run's raw chunks share the read's buffer
	}{
		{"all, raw and compressible", all, true},
		{"every third: gaps", sparse, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.cache = newCache(s.cache.budget, s.cache.bufSize) // cold
			want := make([]ChunkRef, len(tt.idx))
			for i, x := range tt.idx {
				want[i] = refs[x]
			}
			ks, err := s.AcquireChunks(context.Background(), want)
			if err != nil {
				t.Fatal(err)
			}
			var raws []*Chunk
			for i, k := range ks {
				if !bytes.Equal(k.Data, data[tt.idx[i]]) {
					t.Errorf("chunk %d: wrong bytes", tt.idx[i])
				}
				if tt.idx[i]%8 == 3 {
					if k.e.span != nil {
						t.Errorf("compressible chunk %d cached in the read's buffer", tt.idx[i])
					}
				} else {
					raws = append(raws, k)
				}
			}
			for _, k := range raws {
				if got := k.e.span != nil && k.e.span == raws[0].e.span; got != tt.inPlace {
					t.Fatalf("raw chunk in the read's buffer: %v, want %v", got, tt.inPlace)
				}
			}
			if tt.inPlace {
				sp := raws[0].e.span
				var entries int64
				for _, k := range raws {
					entries += held(k.e)
				}
				if entries != int64(cap(sp.buf)) {
					t.Errorf("the budget counts %d bytes for the span's entries, its buffer holds %d", entries, cap(sp.buf))
				}
			}
			// From the cache, while the run's Chunks are still held.
			for i, ref := range want {
				k, err := s.AcquireChunk(context.Background(), ref)
				if err != nil || !bytes.Equal(k.Data, data[tt.idx[i]]) {
					t.Fatalf("chunk %d from the cache: %v", tt.idx[i], err)
				}
				k.Release()
			}
			for _, id := range want {
				s.cache.drop(id.ID)
			}
			// In place, the buffer is the chunks' until they are released;
			// copied out, it was free once the run was done.
			if n, want := len(s.cache.spans), map[bool]int{true: 0, false: 1}[tt.inPlace]; n != want {
				t.Fatalf("%d span buffers kept while the run's chunks are held, want %d", n, want)
			}
			for _, k := range ks {
				k.Release()
			}
			if n := len(s.cache.spans); n != 1 {
				t.Fatalf("%d span buffers kept after the run's chunks went, want 1", n)
			}
		})
	}
}

// TestAcquireChunksInPlaceDamaged: a damaged raw chunk in a run read in
// place fails AcquireChunks and every read of it with ErrCorrupt, and its
// neighbours in the same buffer read back their own bytes, whole.
func TestAcquireChunksInPlaceDamaged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	refs, data := commitChunks(t, s, 64, 16<<10, 9)
	for _, damaged := range []int{0, 31, 63} {
		t.Run(fmt.Sprint(damaged), func(t *testing.T) {
			damageChunk(t, s, dir, refs[damaged].ID)
			defer damageChunk(t, s, dir, refs[damaged].ID) // the same flip again: repaired
			s.cache = newCache(s.cache.budget, s.cache.bufSize)
			if _, err := s.AcquireChunks(context.Background(), refs); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("AcquireChunks: %v, want ErrCorrupt", err)
			}
			var span *spanBuf
			for i, ref := range refs {
				k, err := s.AcquireChunk(context.Background(), ref)
				if i == damaged {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("damaged chunk %d: %v, want ErrCorrupt", i, err)
					}
					continue
				}
				if err != nil || !bytes.Equal(k.Data, data[i]) {
					t.Fatalf("chunk %d beside the damaged one: %v", i, err)
				}
				if k.e.span == nil || (span != nil && k.e.span != span) {
					t.Fatalf("chunk %d was not cached in the run's buffer", i)
				}
				span = k.e.span
				k.Release()
			}
		})
	}
}

// TestAcquireChunksInPlaceEviction: runs read in place into a cache too
// small for them all, by several readers at once, while their chunks are
// evicted and their buffers reused: every chunk read has its own bytes,
// the budget holds, and the buffers kept for reuse stay few.
func TestAcquireChunksInPlaceEviction(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := packedStore(t, dir, nil)
	defer s.Close()
	var refs []ChunkRef
	var data [][]byte
	for p := range 4 { // four packs of 64 chunks
		b := s.NewBatch()
		for i := range 64 {
			d := pseudoRandom(16<<10, byte(40*p+i))
			d[0], d[1], d[2] = byte(i), byte(p), 0xfd // distinct
			ref, err := b.Put(context.Background(), d)
			if err != nil {
				t.Fatal(err)
			}
			refs, data = append(refs, ref), append(data, d)
		}
		mustCommit(t, s, b)
	}
	s.cache = newCache(3<<20, s.cache.bufSize) // three runs of 1 MiB at most
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for round := range 8 {
				for at := (w * 32) % len(refs); at+32 <= len(refs); at += 32 {
					ks, err := s.AcquireChunks(context.Background(), refs[at:at+32])
					if err != nil {
						errs <- err
						return
					}
					for i, k := range ks {
						if !bytes.Equal(k.Data, data[at+i]) {
							errs <- fmt.Errorf("round %d: chunk %d: wrong bytes", round, at+i)
						}
					}
					for _, k := range ks {
						k.Release()
					}
					if used := s.cache.bytes(); used > s.cache.budget {
						errs <- fmt.Errorf("cache holds %d bytes, budget %d", used, s.cache.budget)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	if n := len(s.cache.spans); n > spanFreeKeep {
		t.Fatalf("%d span buffers kept", n)
	}
}
