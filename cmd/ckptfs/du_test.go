package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// duStore makes a store of steps files: each has the shared backbone chunk
// and one chunk of its own. It returns the files' inode numbers.
func duStore(t testing.TB, steps int) (*cas.Store, []uint64, []byte) {
	t.Helper()
	// On tmpfs when there is one: the store's fsyncs are not what is tested.
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "ckptfs-du-"); err == nil {
			dir = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	s, err := cas.Open(filepath.Join(dir, "store"), cas.Options{CacheSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	b := s.NewBatch()
	backbone := make([]byte, 4096)
	for i := range backbone {
		backbone[i] = byte(i * 7)
	}
	shared, err := b.Put(ctx, backbone)
	if err != nil {
		t.Fatal(err)
	}
	inos := make([]uint64, steps)
	manifests := make([]*cas.Manifest, steps)
	for i := range steps {
		own, err := b.Put(ctx, []byte(fmt.Sprintf("the head of step %d, %0100d", i, i)))
		if err != nil {
			t.Fatal(err)
		}
		manifests[i] = &cas.Manifest{Chunks: []cas.ChunkRef{shared, own}}
		if inos[i], err = s.AllocIno(); err != nil {
			t.Fatal(err)
		}
	}
	err = s.Commit(ctx, b, func(tx *cas.Tx) error {
		for i, m := range manifests {
			if err := tx.PutManifest(inos[i], m); err != nil {
				return err
			}
			if err := tx.PutNode(cas.Node{Ino: inos[i], Mode: 0o100644, Size: m.Size()}); err != nil {
				return err
			}
			if err := tx.Link(cas.RootIno, fmt.Sprint(i), inos[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, inos, backbone
}

func TestDiskUsage(t *testing.T) {
	s, inos, backbone := duStore(t, 5)
	groups := [][]uint64{{inos[0]}, {inos[1], inos[2]}, {inos[0], inos[1], inos[2], inos[3], inos[4]}}
	res, err := diskUsage(s, nil, groups)
	if err != nil {
		t.Fatal(err)
	}
	head := int64(len(fmt.Sprintf("the head of step %d, %0100d", 0, 0)))
	bb := int64(len(backbone))
	for i, tc := range []struct {
		files, chunks, frees int
		unique, freesBytes   int64
	}{
		{1, 2, 1, bb + head, head},          // its head; the backbone is shared
		{2, 3, 2, bb + 2*head, 2 * head},    // two heads
		{5, 6, 6, bb + 5*head, bb + 5*head}, // every file: the backbone too
	} {
		u := res.Groups[i]
		if u.Files != tc.files || u.Chunks != tc.chunks || u.FreesChunks != tc.frees || u.UniqueBytes != tc.unique || u.FreesBytes != tc.freesBytes {
			t.Errorf("group %d: %+v, want %+v", i, u, tc)
		}
		if u.FreesStoredBytes == 0 {
			t.Errorf("group %d: no stored bytes freed", i)
		}
	}
	if res.Total.FreesChunks != 6 {
		t.Errorf("total: %+v", res.Total)
	}
	// An open file (a live manifest) that is not one of the groups' keeps
	// its chunks.
	live := &cas.Manifest{Chunks: []cas.ChunkRef{{ID: cas.Sum(backbone), Len: uint32(bb)}}}
	res, err = diskUsage(s, []*cas.Manifest{live}, groups[2:])
	if err != nil {
		t.Fatal(err)
	}
	if u := res.Groups[0]; u.FreesChunks != 5 || u.FreesBytes != 5*head {
		t.Errorf("with an open file: %+v", u)
	}
}

// TestDiskUsageOnePathPerStepIsLinear: du with one group per file costs
// about the same per file at 4,000 files as at 500 (it was groups ×
// manifests × chunks: 3.8 s for 3,000 paths). Timings on a shared machine,
// under the race detector, are noisy (its memory costs grow with the heap:
// the linear code measured 8x–38x for 8x the files, the quadratic one 45x),
// so the test fails only when both the ratio and the time say quadratic: 8x
// the files taking over 24x the time and over 2 s (the quadratic code: 5.4 s
// with -race, 20 ms per call for the linear one without it;
// BenchmarkDiskUsage4000).
func TestDiskUsageOnePathPerStepIsLinear(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 3,300 files")
	}
	timeIt := func(steps int) time.Duration {
		s, inos, _ := duStore(t, steps)
		groups := make([][]uint64, len(inos))
		for i, ino := range inos {
			groups[i] = []uint64{ino}
		}
		best := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			res, err := diskUsage(s, nil, groups)
			if err != nil {
				t.Fatal(err)
			}
			best = min(best, time.Since(start))
			if len(res.Groups) != steps || res.Groups[steps-1].FreesChunks != 1 || res.Total.FreesChunks != steps+1 {
				t.Fatalf("%d steps: wrong answer %+v", steps, res.Total)
			}
		}
		return best
	}
	small, large := timeIt(500), timeIt(4000)
	t.Logf("du of 500 paths: %v; of 4,000: %v (%.1fx)", small, large, float64(large)/float64(small))
	if large > 24*small && large > 2*time.Second {
		t.Errorf("du of 4,000 one-file paths took %v, %.0fx the time of 500 (%v): not linear", large, float64(large)/float64(small), small)
	}
}

func BenchmarkDiskUsage4000(b *testing.B) {
	s, inos, _ := duStore(b, 4000)
	groups := make([][]uint64, len(inos))
	for i, ino := range inos {
		groups[i] = []uint64{ino}
	}
	b.ResetTimer()
	for range b.N {
		if _, err := diskUsage(s, nil, groups); err != nil {
			b.Fatal(err)
		}
	}
}
