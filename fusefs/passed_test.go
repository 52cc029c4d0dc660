package fusefs

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

// compressible returns n pseudo-random bytes of 4 bits each: zstd-encoded
// chunks, decoded into buffers of their own (no spans).
func compressible(seed uint64, n int) []byte {
	b := randBytes(seed, n)
	for i := range b {
		b[i] &= 0x0f
	}
	return b
}

// TestStreamReadsEachChunkOnce: a cold stream whose two READs in flight are
// answered in either order (doc.go: half of them second first, traced)
// reads each chunk from the store once, though the second READ passes the
// chunk the two share before the first has read its head (the oldest spent
// chunks go first, not the one just passed; the first READ passes it
// again), and leaves little cached. For FastCDC's ~32 KiB chunks (coded:
// decoded into buffers of their own) and a tensor file's 1 MiB chunks,
// each straddling four READs, whose pairs need not line up with them.
func TestStreamReadsEachChunkOnce(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	tests := []struct {
		name  string
		data  []byte
		first int64 // one READ before the pairs
	}{
		{"small chunks", compressible(7, 48*M), 0},
		{"tensor file", safetensorsOf(12, 4*M), 256 * K},
	}
	for _, tt := range tests {
		for _, swapped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/swapped=%v", tt.name, swapped), func(t *testing.T) {
				data, size := tt.data, int64(len(tt.data))
				m := newMount(t)
				mustWrite(t, m.path("f"), data)
				m.remount()
				f, err := os.Open(m.path("f")) // the node's manifest, loaded
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				n := m.fileNodeAt("f")
				before, _ := m.cas.Stats()
				read := func(off int64) {
					if off >= size {
						return
					}
					dest := make([]byte, 256*K)
					res, errno := n.read(context.Background(), nil, dest, off)
					if errno != 0 {
						t.Fatal(errno)
					}
					got, _ := res.Bytes(dest)
					if !bytes.Equal(got, data[off:off+int64(len(got))]) {
						t.Fatalf("wrong bytes at %d", off)
					}
					res.(*chunkResult).Done()
				}
				if tt.first > 0 {
					read(0)
				}
				for off := tt.first; off < size; off += 512 * K {
					if swapped {
						read(off + 256*K)
						read(off)
					} else {
						read(off)
						read(off + 256*K)
					}
				}
				after, _ := m.cas.Stats()
				if got := after.StoreReadBytes - before.StoreReadBytes; got != size {
					t.Errorf("read %d bytes from the store for a file of %d", got, size)
				}
				if after.CacheBytes > 24*M {
					t.Errorf("%d MiB cached after the stream, want at most 24", after.CacheBytes/M)
				}
			})
		}
	}
}

// TestDirectIOReadsKeepChunks: a handle opened O_RDWR is FOPEN_DIRECT_IO:
// the page cache holds none of what it reads, so its READs pass nothing.
// Reading the same 16 MiB twice through it, the chunk cache (64 MiB) serves
// the second pass.
func TestDirectIOReadsKeepChunks(t *testing.T) {
	const M = 1 << 20
	const size = 16 * M
	data := randBytes(9, size)
	m := newMount(t)
	mustWrite(t, m.path("f"), data)
	m.remount()
	f, err := os.OpenFile(m.path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, M)
	pass := func() int64 {
		before, _ := m.cas.Stats()
		for off := int64(0); off < size; off += M {
			if _, err := f.ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
			if string(buf) != string(data[off:off+M]) {
				t.Fatalf("wrong bytes at %d", off)
			}
		}
		after, _ := m.cas.Stats()
		return after.StoreReadBytes - before.StoreReadBytes
	}
	first := pass()
	second := pass()
	if first < size || second > M {
		t.Logf("O_RDWR reads of %d MiB: first pass read %.1f MiB from the store, second %.1f MiB", size/M, float64(first)/M, float64(second)/M)
	}
	if second > M {
		t.Errorf("second pass through an O_RDWR (direct I/O) handle read %.1f MiB from the store again", float64(second)/M)
	}
}

// safetensorsOf builds a safetensors file of n U8 tensors of each bytes,
// random (its chunks: 1 MiB within each tensor).
func safetensorsOf(n, each int) []byte {
	hdr := map[string]any{}
	for i := range n {
		hdr[fmt.Sprintf("t%03d", i)] = map[string]any{"dtype": "U8", "shape": []int{each}, "data_offsets": []int{i * each, (i + 1) * each}}
	}
	h, _ := json.Marshal(hdr)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	return append(b, randBytes(11, n*each)...)
}

// TestColdReadOfTensorsReadsEachChunkOnce: cold reads of a safetensors file
// through the kernel (read(2) of 4 MiB buffers, READs as the kernel sends
// them) read each chunk from the store once (a chunk passed and evicted
// before its other READ got there would be read twice).
func TestColdReadOfTensorsReadsEachChunkOnce(t *testing.T) {
	const M = 1 << 20
	data := safetensorsOf(24, 4*M)
	m := newMount(t)
	mustWrite(t, m.path("model.safetensors"), data)
	for round := range 4 {
		m.remount()
		before, _ := m.cas.Stats()
		mustEqualFile(t, m.path("model.safetensors"), data)
		after, _ := m.cas.Stats()
		t.Logf("round %d: read %.1f MiB from the store for a %.1f MiB file; %.1f MiB cached after",
			round, float64(after.StoreReadBytes-before.StoreReadBytes)/M, float64(len(data))/M, float64(after.CacheBytes)/M)
		if got := after.StoreReadBytes - before.StoreReadBytes; got != int64(len(data)) {
			t.Errorf("round %d: read %d bytes from the store for a file of %d", round, got, len(data))
		}
	}
}

// TestColdStreamLeavesCacheRoom: a stream's chunks, once read past, leave
// the chunk cache first (cas.Chunk.Passed), since the page cache holds
// them: a cold read of a file smaller than the cache leaves about the spent
// share cached, not the whole file, while a lazy reader's chunks stay.
func TestColdStreamLeavesCacheRoom(t *testing.T) {
	m := newMount(t) // 64 MiB cache: 8 MiB of it spent chunks at most
	const size = 48 << 20
	data := randBytes(31, size)
	mustWrite(t, m.path("runs/stream"), data)
	lazy := randBytes(32, 4<<20)
	mustWrite(t, m.path("runs/lazy"), lazy)
	m.unmount()
	m.mount()
	buf := make([]byte, 64<<10)
	f, err := os.Open(m.path("runs/lazy"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 1<<20); err != nil || !bytes.Equal(buf, lazy[1<<20:1<<20+len(buf)]) {
		t.Fatalf("lazy read: %v", err)
	}
	f.Close()
	mustEqualFile(t, m.path("runs/stream"), data)
	st, err := m.cas.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a cold stream of %d MiB: %.1f MiB cached", size>>20, float64(st.CacheBytes)/(1<<20))
	// Left: what was read before the reads made a stream (streakBytes),
	// the spent share (8 MiB) and the spans' slack; before, the whole file.
	if st.CacheBytes > 24<<20 {
		t.Errorf("after a cold stream of %d MiB: %d MiB cached, want at most 24", size>>20, st.CacheBytes>>20)
	}
	refs, _, err := IndexFile(context.Background(), bytes.NewReader(lazy), int64(len(lazy)), cas.DefaultChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	var off int64
	for _, r := range refs {
		if off <= 1<<20 && 1<<20 < off+int64(r.Len) && !m.cas.Cached(r.ID) {
			t.Errorf("the lazy reader's chunk at %d left the cache", off)
		}
		off += int64(r.Len)
	}
}

// TestWholeFileReadsLeaveCacheRoom: small files read whole (a walk that
// reads every file of a store) leave at most the spent share of the chunk
// cache behind, not every file they read: the page cache holds them.
func TestWholeFileReadsLeaveCacheRoom(t *testing.T) {
	m := newMount(t) // 64 MiB cache: 8 MiB of it spent chunks at most
	const files, size = 1500, 16 << 10
	if err := os.MkdirAll(m.path("runs/ranks"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return m.path(fmt.Sprintf("runs/ranks/%04d", i)) }
	for i := range files {
		mustWrite(t, name(i), randBytes(uint64(1000+i), size))
	}
	m.unmount()
	m.mount()
	for i := range files {
		mustEqualFile(t, name(i), randBytes(uint64(1000+i), size))
	}
	st, err := m.cas.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after reading %d files of %d KiB: %.1f MiB cached", files, size>>10, float64(st.CacheBytes)/(1<<20))
	if st.CacheBytes > 12<<20 {
		t.Errorf("after reading %d MiB of small files: %d MiB cached, want at most the spent share (8 MiB) and some", files*size>>20, st.CacheBytes>>20)
	}
}
