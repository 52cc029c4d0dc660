package stage

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
	"github.com/ckptfs/ckptfs/test/testrand"
)

// countingReader reads zeros and counts the bytes asked for.
type countingReader struct{ n atomic.Int64 }

func (r *countingReader) ReadAt(p []byte, off int64) (int, error) {
	r.n.Add(int64(len(p)))
	clear(p)
	return len(p), nil
}

// TestViewsHashEachStorageOnce: views into one storage (torch views, slices)
// cost no byte reads: each is named by its storage's chunks, hashed once. It
// used to hash each view's bytes, N views of a storage reading N times its
// size (1000 views of 64 MiB: 47-62 s of commit).
func TestViewsHashEachStorageOnce(t *testing.T) {
	const segOff, segLen, chunk = 100, 4 << 20, 1 << 20
	chunks := func(salt byte) ([]cas.ChunkRef, []int64) {
		refs := []cas.ChunkRef{{ID: cas.Sum([]byte("meta")), Len: segOff}}
		starts := []int64{0}
		for off := int64(0); off < segLen; off += chunk {
			refs = append(refs, cas.ChunkRef{ID: cas.Sum([]byte{byte(off >> 20), salt}), Len: chunk})
			starts = append(starts, segOff+off)
		}
		return refs, starts
	}
	fix := &formats.Index{Format: "torch", Segments: []formats.Segment{
		{Offset: 0, Length: segOff, Kind: formats.KindMeta},
		{Offset: segOff, Length: segLen, Kind: formats.KindData, DType: "f32"},
	}}
	fix.Tensors = append(fix.Tensors, formats.Tensor{Name: "whole", DType: "f32", Offset: segOff, Length: segLen})
	for i := range 100 {
		fix.Tensors = append(fix.Tensors, formats.Tensor{Name: "v" + itoa(i), DType: "f32",
			Offset: segOff + 4*int64(i+1), Length: segLen - 4*int64(i+1)})
	}
	// The same view twice: equal hashes.
	fix.Tensors = append(fix.Tensors, formats.Tensor{Name: "again", DType: "f32", Offset: segOff + 4, Length: segLen - 4})

	refs, starts := chunks(0)
	var r countingReader
	ix, err := buildIndex(&r, fix, refs, starts)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.n.Load(); n != 0 {
		t.Fatalf("hashing %d tensors read %d bytes (%.1f× the storage); want 0", len(fix.Tensors), n, float64(n)/segLen)
	}
	seen := map[string]string{}
	for _, e := range ix.Tensors[:len(ix.Tensors)-1] {
		if other, dup := seen[e.Hash]; dup {
			t.Fatalf("tensors %s and %s (different ranges) hash alike", other, e.Name)
		}
		seen[e.Hash] = e.Name
	}
	if last := ix.Tensors[len(ix.Tensors)-1]; last.Hash != ix.Tensors[1].Hash {
		t.Fatalf("the same view hashes %s and %s", last.Hash, ix.Tensors[1].Hash)
	}
	// Another storage's bytes: every view's hash changes.
	refs2, _ := chunks(1)
	ix2, err := buildIndex(&r, fix, refs2, starts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ix.Tensors {
		if ix.Tensors[i].Hash == ix2.Tensors[i].Hash {
			t.Fatalf("tensor %s hashes alike over different storages", ix.Tensors[i].Name)
		}
	}
}

// TestIndexTensorLimit: a file of more tensors than MaxIndexTensors keeps no
// tensor index (a GGUF of 800k empty tensors grew the catalog by 136 MB).
func TestIndexTensorLimit(t *testing.T) {
	for _, n := range []int{MaxIndexTensors, MaxIndexTensors + 1} {
		fix := &formats.Index{Format: "gguf"}
		for i := range n {
			fix.Tensors = append(fix.Tensors, formats.Tensor{Name: itoa(i), DType: "f32", Offset: 0})
		}
		var r countingReader
		ix, err := buildIndex(&r, fix, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		kept, omitted := len(ix.Tensors), ix.TensorsOmitted
		if n <= MaxIndexTensors && (kept != n || omitted != 0) || n > MaxIndexTensors && (kept != 0 || omitted != n) {
			t.Errorf("%d tensors: index keeps %d, omits %d", n, kept, omitted)
		}
		if ix.Format != "gguf" {
			t.Errorf("format %q", ix.Format)
		}
	}
}

// itoa names test tensors (as fusefs's tests do).
func itoa(n int) string {
	return strings.TrimSpace(strings.ReplaceAll(time.Duration(n).String(), "ns", ""))
}

func randBytes(seed uint64, n int) []byte { return testrand.Bytes(seed, n) }

// TestSmallTensorHashIgnoresCuts: a tensor under formats.MinDataChunk is cut
// with the container's bytes around it, so whether its range happens to be a
// run of whole chunks depends on the file. Its hash must not: the same bytes
// in a torch.save (between zip headers) and in its safetensors export (alone
// between two big tensors) hash alike (issue #26).
func TestSmallTensorHashIgnoresCuts(t *testing.T) {
	small := []byte("0123456789abcdef0123456789abcdef") // 32 bytes
	hash := func(pre int, ownChunk bool) string {
		data := append(append(make([]byte, pre), small...), make([]byte, 50)...)
		fix := &formats.Index{Format: "x",
			Segments: []formats.Segment{
				{Offset: 0, Length: int64(pre), Kind: formats.KindMeta},
				{Offset: int64(pre), Length: int64(len(small)), Kind: formats.KindData, DType: "u8"},
				{Offset: int64(pre + len(small)), Length: 50, Kind: formats.KindMeta},
			},
			Tensors: []formats.Tensor{{Name: "s", DType: "u8", Offset: int64(pre), Length: int64(len(small))}}}
		var refs []cas.ChunkRef
		var starts []int64
		cut := func(a, b int) {
			refs = append(refs, cas.ChunkRef{ID: cas.Sum(data[a:b]), Len: uint32(b - a)})
			starts = append(starts, int64(a))
		}
		if ownChunk {
			cut(0, pre)
			cut(pre, pre+len(small))
			cut(pre+len(small), len(data))
		} else {
			cut(0, len(data))
		}
		ix, err := buildIndex(bytes.NewReader(data), fix, refs, starts)
		if err != nil {
			t.Fatal(err)
		}
		return ix.Tensors[0].Hash
	}
	a, b, c := hash(100, true), hash(7, false), hash(64, true)
	if a != b || a != c {
		t.Fatalf("the same small tensor hashes %s, %s and %s", a, b, c)
	}
}
