package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/catalog"
)

func TestFinalName(t *testing.T) {
	for in, want := range map[string]string{
		"model.safetensors":                     "model.safetensors",
		"model.safetensors.tmp":                 "model.safetensors",
		"model.safetensors.tmp.4242":            "model.safetensors",
		"optimizer.pt.part":                     "optimizer.pt",
		"model.safetensors~":                    "model.safetensors",
		"a.tmpfile":                             "a.tmpfile",
		".tmp":                                  ".tmp",
		".model.safetensors.tmp":                "model.safetensors",
		".model.safetensors.ckptfs-import-4242": "model.safetensors", // ckptfs import
		".model.safetensors.Xy12Ab":             "model.safetensors", // rsync
		".model.safetensors.Xy12A":              ".model.safetensors.Xy12A",
		".model.safetensors.Xy-2Ab":             ".model.safetensors.Xy-2Ab",
		".model.pickle":                         ".model.pickle", // a hidden file, six small letters
		".bashrc":                               ".bashrc",
		"..tmp":                                 "..tmp",
		"model.Xy12Ab":                          "model.Xy12Ab",
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
	waiting := func() int64 { return deltaWaiting(t, m) }
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

// TestHintPassesStepsWithoutTheFile: a step directory without the file (a
// save that crashed before its commit) does not end the chain: the next
// save's previous version is the step before it, so that with the latest
// save kept whole that step's plans are released instead of waiting for
// good; past maxHintSiblings such steps the search gives up (a new chain),
// reading a bounded number of rows.
func TestHintPassesStepsWithoutTheFile(t *testing.T) {
	var mu sync.Mutex
	var prev *cas.Manifest
	var walked int
	hook := func(f *FS) {
		f.hintHook = func(p *cas.Manifest, w int) {
			mu.Lock()
			defer mu.Unlock()
			prev, walked = p, w
		}
	}
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		cas0: cas.Options{DeltaLatestWhole: true}, opts: []Option{hook, WithReencodeIdle(time.Hour)}}
	m.mount()
	t.Cleanup(m.unmount)
	manifest := func(step string) *cas.Manifest { return committedStepFile(t, m, step) }
	waiting := func() int64 { return deltaWaiting(t, m) }
	mkdir := func(step string) {
		t.Helper()
		if err := os.MkdirAll(m.path("run/"+step), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	save := func(step string, n int) *cas.Manifest {
		t.Helper()
		mkdir(step)
		mu.Lock()
		prev = nil
		mu.Unlock()
		// A 1 MiB tensor: objects of their own, which deltas may code.
		mustWrite(t, m.path("run/"+step+"/model.safetensors"), stepTensorFile(n, 256<<10))
		mu.Lock()
		defer mu.Unlock()
		return prev
	}
	save("0001", 1)
	save("0002", 2)
	w2 := waiting()
	if w2 == 0 {
		t.Fatal("the second save has no waiting plans")
	}
	// 0003 crashed before its commit; then 0004 is saved.
	mkdir("0003")
	if p := save("0004", 4); p == nil || !slices.Equal(p.Chunks, manifest("0002").Chunks) {
		t.Fatalf("0004's previous version: %v, want 0002's", p)
	}
	if got := waiting(); got != w2 {
		t.Errorf("after 0004: %d chunks wait, want %d (0004's only: 0002's released)", got, w2)
	}
	// More steps without the file than the search passes over: a new chain.
	for i := range maxHintSiblings {
		mkdir(fmt.Sprintf("%04d", 5+i))
	}
	if p := save(fmt.Sprintf("%04d", 5+maxHintSiblings), 9); p != nil {
		t.Errorf("a previous version %d empty steps back: %v", maxHintSiblings, p.Chunks)
	}
	mu.Lock()
	defer mu.Unlock()
	if walked > 4*maxHintSiblings {
		t.Errorf("the search read %d directory rows", walked)
	}
}

// deltaWaiting is the store's delta_waiting counter.
func deltaWaiting(t *testing.T, m *testMount) int64 {
	t.Helper()
	var n int64
	if err := m.cas.View(func(tx *cas.Tx) error { n = tx.Counts().DeltaWaiting; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// committedStepFile is the committed manifest of run/STEP/model.safetensors.
func committedStepFile(t testing.TB, m *testMount, step string) *cas.Manifest {
	t.Helper()
	var got *cas.Manifest
	if err := m.cas.View(func(tx *cas.Tx) error {
		_, got = versionAt(tx, catalog.RootIno, []string{"run", step, "model.safetensors"})
		return nil
	}); err != nil || got == nil {
		t.Fatalf("no committed run/%s/model.safetensors: %v", step, err)
	}
	return got
}
