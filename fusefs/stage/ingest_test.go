package stage

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
)

// TestIngestSmallSourceAllocates: ingesting a small file from a source that
// lends no blocks (a spooled file) allocates about the file, not a whole
// readBlock (a 4 KiB spooled file took a fresh 4 MiB buffer, faulted in page
// by page: some ms of CPU for each such commit); a large one still reads in
// blocks of readBlock, and every chunk comes out as the bytes put in.
func TestIngestSmallSourceAllocates(t *testing.T) {
	cases := []struct {
		name     string
		size     int
		maxAlloc uint64
	}{
		{"4 KiB", 4 << 10, 1 << 20},
		{"one byte", 1, 1 << 20},
		{"three blocks", 3*readBlock + 12345, 0},
	}
	for _, tc := range cases {
		data := bytes.Repeat([]byte("0123456789abcdef"), tc.size/16+1)[:tc.size]
		var mu sync.Mutex
		got := map[cas.ID][]byte{}
		put := func(_ context.Context, chunk []byte, _ string, _ int64) (cas.ChunkRef, error) {
			id := cas.Sum(chunk)
			mu.Lock()
			defer mu.Unlock()
			got[id] = append([]byte(nil), chunk...)
			return cas.ChunkRef{ID: id, Len: uint32(len(chunk))}, nil
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		refs, _, n, err := ingest(context.Background(), fixedSource{bytes.NewReader(data), int64(len(data))}, formats.NewChunker(1<<20), put)
		runtime.ReadMemStats(&after)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("%s: ingest: %d bytes, %v", tc.name, n, err)
		}
		var back []byte
		for _, r := range refs {
			back = append(back, got[r.ID]...)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("%s: the chunks hold %d bytes, not the file's %d", tc.name, len(back), len(data))
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; tc.maxAlloc > 0 && alloc > tc.maxAlloc {
			t.Errorf("%s: ingest allocated %d bytes for a %d-byte file", tc.name, alloc, len(data))
		}
	}
}
