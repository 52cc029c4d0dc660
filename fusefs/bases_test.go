package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

func TestFinalName(t *testing.T) {
	for in, want := range map[string]string{
		"model.safetensors":          "model.safetensors",
		"model.safetensors.tmp":      "model.safetensors",
		"model.safetensors.tmp.4242": "model.safetensors",
		"optimizer.pt.part":          "optimizer.pt",
		"model.safetensors~":         "model.safetensors",
		"a.tmpfile":                  "a.tmpfile",
		".tmp":                       ".tmp",
	} {
		if got := finalName(in); got != want {
			t.Errorf("finalName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPairChunks(t *testing.T) {
	id := func(b byte) cas.ID { var x cas.ID; x[0] = b; return x }
	const k = 64 << 10
	prev := []cas.ChunkRef{{ID: id(1), Len: 100}, {ID: id(2), Len: k}, {ID: id(3), Len: k}, {ID: id(4), Len: k}}
	pix := &FileIndex{Tensors: []TensorEntry{
		{Name: "a", DType: "BF16", Offset: 100, Length: 2 * k},
		{Name: "b", DType: "BF16", Offset: 100 + 2*k, Length: k},
	}}
	// The new version's header grew by 8 bytes; tensor b changed shape.
	refs := []cas.ChunkRef{{ID: id(11), Len: 108}, {ID: id(12), Len: k}, {ID: id(13), Len: k}, {ID: id(14), Len: k}}
	ix := &FileIndex{Tensors: []TensorEntry{
		{Name: "a", DType: "BF16", Offset: 108, Length: 2 * k},
		{Name: "b", DType: "F32", Offset: 108 + 2*k, Length: k},
	}}
	for _, c := range []struct {
		name    string
		ix, pix *FileIndex
		refs    []cas.ChunkRef
		want    [][2]cas.ID
	}{
		{"by tensor", ix, pix, refs, [][2]cas.ID{{id(12), id(2)}, {id(13), id(3)}}},
		{"by offset without an index", nil, nil,
			[]cas.ChunkRef{{ID: id(11), Len: 100}, {ID: id(12), Len: k}, {ID: id(13), Len: k / 2}, {ID: id(2), Len: k}},
			[][2]cas.ID{{id(12), id(2)}}}, // not a chunk of another length, nor one where no old chunk starts
	} {
		got := pairChunks(&cas.Manifest{Chunks: c.refs}, c.ix, &cas.Manifest{Chunks: prev}, c.pix)
		if len(got) != len(c.want) {
			t.Errorf("%s: pairs %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: pair %d %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
}

// TestLatestWholeReleasedByStoredContent: with the latest save kept whole
// (cas.Options.DeltaLatestWhole), a save whose tensors the store holds
// already (it goes back to an earlier step's content) still releases the
// waiting delta plans of the save before it: it looks for its previous
// version although none of its chunks is new.
func TestLatestWholeReleasedByStoredContent(t *testing.T) {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		cas0: cas.Options{DeltaLatestWhole: true}, opts: []Option{WithReencodeIdle(time.Hour)}}
	m.mount()
	t.Cleanup(m.unmount)
	waiting := func() int64 {
		t.Helper()
		var n int64
		if err := m.cas.View(func(tx *cas.Tx) error { n = tx.Counts().DeltaWaiting; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, step := range []int{1, 2, 1} {
		dir := m.path(fmt.Sprintf("run/%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// A 1 MiB tensor: an object of its own, not packed.
		mustWrite(t, filepath.Join(dir, "model.safetensors"), stepTensorFile(step, 256<<10))
		// Only the second save's tensor chunks wait for a later version.
		if got := waiting(); (got > 0) != (i == 1) {
			t.Fatalf("after save %d: %d chunks wait", i, got)
		}
	}
}
