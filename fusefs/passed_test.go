package fusefs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"syscall"
	"testing"
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
// chunks go first, not the one just passed), and leaves little cached.
func TestStreamReadsEachChunkOnce(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	const size = 48 * M
	data := compressible(7, size)
	for _, swapped := range []bool{false, true} {
		m := newMount(t)
		mustWrite(t, m.path("stream"), data)
		m.remount()
		f, err := os.Open(m.path("stream"))
		if err != nil {
			t.Fatal(err)
		}
		n := m.fileNodeAt("stream")
		before, _ := m.cas.Stats()
		read := func(off int64) {
			dest := make([]byte, 256*K)
			res, errno := n.read(context.Background(), nil, dest, off)
			if errno != 0 {
				t.Fatal(errno)
			}
			got, _ := res.Bytes(dest)
			if string(got) != string(data[off:off+int64(len(got))]) {
				t.Fatalf("wrong bytes at %d", off)
			}
			res.(interface{ Done() }).Done()
		}
		for off := int64(0); off < size; off += 512 * K {
			if swapped {
				read(off + 256*K)
				read(off)
			} else {
				read(off)
				read(off + 256*K)
			}
		}
		after, _ := m.cas.Stats()
		t.Logf("swapped=%v: read %.1f MiB from the store for a %d MiB file; %.1f MiB cached after",
			swapped, float64(after.StoreReadBytes-before.StoreReadBytes)/M, size/M, float64(after.CacheBytes)/M)
		if got := after.StoreReadBytes - before.StoreReadBytes; got != size {
			t.Errorf("swapped=%v: read %d bytes from the store for a file of %d", swapped, got, size)
		}
		if after.CacheBytes > 24*M {
			t.Errorf("swapped=%v: %d MiB cached after the stream", swapped, after.CacheBytes/M)
		}
		f.Close()
		m.unmount()
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
	t.Logf("O_RDWR reads of %d MiB: first pass read %.1f MiB from the store, second %.1f MiB", size/M, float64(first)/M, float64(second)/M)
	if second > M {
		t.Errorf("second pass through an O_RDWR (direct I/O) handle read %.1f MiB from the store again", float64(second)/M)
	}
	_ = syscall.O_DIRECT
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

// TestStreamOfTensorsReadsEachChunkOnce: as TestReviewSwappedReadsReload, for a
// safetensors file streamed whole (torch.load without mmap, a copy): its
// chunks are 1 MiB, each straddles four READs, and the one whose tail a READ
// answered first passes is read again, whole, for the READ before it.
func TestStreamOfTensorsReadsEachChunkOnce(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	data := safetensorsOf(12, 4*M)
	size := int64(len(data))
	for _, swapped := range []bool{false, true} {
		m := newMount(t)
		mustWrite(t, m.path("model.safetensors"), data)
		m.remount()
		f, err := os.Open(m.path("model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		n := m.fileNodeAt("model.safetensors")
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
			if string(got) != string(data[off:off+int64(len(got))]) {
				t.Fatalf("wrong bytes at %d", off)
			}
			res.(interface{ Done() }).Done()
		}
		// The kernel's pairs need not line up with the chunks: one READ
		// first, then pairs.
		read(0)
		for off := int64(256 * K); off < size; off += 512 * K {
			if swapped {
				read(off + 256*K)
				read(off)
			} else {
				read(off)
				read(off + 256*K)
			}
		}
		after, _ := m.cas.Stats()
		t.Logf("swapped=%v: read %.1f MiB from the store for a %.1f MiB file; %.1f MiB cached after",
			swapped, float64(after.StoreReadBytes-before.StoreReadBytes)/M, float64(size)/M, float64(after.CacheBytes)/M)
		if got := after.StoreReadBytes - before.StoreReadBytes; got != int64(size) {
			t.Errorf("swapped=%v: read %d bytes from the store for a file of %d", swapped, got, size)
		}
		f.Close()
		m.unmount()
	}
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
