package stage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/formats"
)

// BenchmarkCommitIngest measures the commit path (cut, hash, encode, write,
// sync) on a 256 MiB safetensors file of fresh bf16 tensors, outside FUSE.
func BenchmarkCommitIngest(b *testing.B) {
	dir := b.TempDir()
	if d := os.Getenv("CKPTFS_BENCH_DIR"); d != "" {
		dir = d
	}
	const tensors, tsize = 64, 4 << 20
	header := map[string]any{}
	for i := 0; i < tensors; i++ {
		header[fmt.Sprintf("t%03d", i)] = map[string]any{"dtype": "BF16", "shape": []int{tsize / 2}, "data_offsets": []int{i * tsize, (i + 1) * tsize}}
	}
	h, _ := json.Marshal(header)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	path := filepath.Join(dir, "model.safetensors")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	f.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(h))))
	f.Write(h)
	size := int64(8 + len(h) + tensors*tsize)
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		// Fresh bytes each round, so nothing dedupes.
		for t := 0; t < tensors; t++ {
			f.WriteAt(randBytes(uint64(i*1000+t+1), tsize), int64(8+len(h)+t*tsize))
		}
		store := filepath.Join(dir, fmt.Sprint("store", i))
		s, err := cas.Open(store, cas.Options{Objects: local.New(cas.ObjectsDir(store), local.Options{})})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		batch := s.NewBatch()
		put := func(ctx context.Context, data []byte, dtype string, off int64) (cas.ChunkRef, error) {
			return putChunk(ctx, batch, data, dtype, off)
		}
		if _, _, _, err := ingest(context.Background(), fixedSource{f, size}, formats.NewChunker(s.ChunkSize()), put); err != nil {
			b.Fatal(err)
		}
		if err := batch.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		batch.Release()
		s.Close()
		os.RemoveAll(filepath.Join(dir, fmt.Sprint("store", i)))
	}
	f.Close()
}
