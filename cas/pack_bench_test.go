package cas

import (
	"context"
	"path/filepath"
	"testing"
)

// BenchmarkReadSmallChunks reads 1024 chunks of 32 KiB (incompressible, as a
// file without a tensor layout is cut) from a store opened afresh (an empty
// chunk cache), stored as objects of their own (read with O_DIRECT, so from
// the disk each time) and in packs (read through the page cache, warm here
// as after a write), one at a time (AcquireChunk) and as a run
// (AcquireChunks). Compare the sub-benchmarks' ns/chunk in one run.
func BenchmarkReadSmallChunks(b *testing.B) {
	const n, size = 1024, 32 << 10
	for _, c := range []struct {
		name string
		pack int
		run  bool
	}{{"objects", -1, false}, {"packs", DefaultPackMaxChunk, false}, {"packs-run", DefaultPackMaxChunk, true}} {
		b.Run(c.name, func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			s, err := openLocal(dir, Options{PackMaxChunk: c.pack})
			if err != nil {
				b.Fatal(err)
			}
			bt := s.NewBatch()
			var refs []ChunkRef
			for i := range n {
				d := pseudoRandom(size, byte(i))
				d[0], d[1] = byte(i), byte(i>>8)
				ref, err := bt.Put(context.Background(), d)
				if err != nil {
					b.Fatal(err)
				}
				refs = append(refs, ref)
			}
			if err := s.Commit(context.Background(), bt, func(*Tx) error { return nil }); err != nil {
				b.Fatal(err)
			}
			s.Close()
			b.SetBytes(n * size)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				s, err := openLocal(dir, Options{PackMaxChunk: c.pack})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if c.run {
					ks, err := s.AcquireChunks(context.Background(), refs)
					if err != nil {
						b.Fatal(err)
					}
					for _, k := range ks {
						k.Release()
					}
				} else {
					for _, ref := range refs {
						k, err := s.AcquireChunk(context.Background(), ref)
						if err != nil {
							b.Fatal(err)
						}
						k.Release()
					}
				}
				b.StopTimer()
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/chunk")
		})
	}
}
