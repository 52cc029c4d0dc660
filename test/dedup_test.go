package test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// stTensor is one tensor for writeSafetensors.
type stTensor struct {
	name  string
	dtype string // "F32", "BF16", ...
	shape []int64
	data  []byte
}

// writeSafetensors writes tensors in the given order in the safetensors
// layout: u64 header length, JSON header padded with spaces to 8 bytes, data.
func writeSafetensors(t testing.TB, path string, tensors []stTensor) int {
	t.Helper()
	header := map[string]any{}
	var off int64
	for _, x := range tensors {
		header[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int64{off, off + int64(len(x.data))}}
		off += int64(len(x.data))
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	buf = append(buf, h...)
	for _, x := range tensors {
		buf = append(buf, x.data...)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return 8 + len(h)
}

func f32Tensor(name string, seed uint64, n int) stTensor {
	return stTensor{name: name, dtype: "F32", shape: []int64{int64(n / 4)}, data: randBytes(seed, n)}
}

// TestTensorShiftDedup: B puts a new 1 MiB tensor in front of A's tensors
// (shifting every offset) and changes one 1 MiB tensor; storing B adds at most
// 2.2 MiB plus B's header.
func TestTensorShiftDedup(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	var a []stTensor
	for i := 0; i < 24; i++ {
		a = append(a, f32Tensor(fmt.Sprintf("layer.%02d.weight", i), uint64(i+1), 1<<20))
	}
	b := append([]stTensor{f32Tensor("aaa.new", 1000, 1<<20)}, a...)
	b = append([]stTensor{}, b...)
	b[6] = f32Tensor(a[5].name, 2000, 1<<20) // a changed tensor
	writeSafetensors(t, filepath.Join(mnt, "runs/r/1/model.safetensors"), a)
	before := statsJSON(t, mnt)["unique_bytes"]
	hdr := writeSafetensors(t, filepath.Join(mnt, "runs/r/2/model.safetensors"), b)
	added := statsJSON(t, mnt)["unique_bytes"] - before
	limit := int64(22<<20)/10 + int64(hdr) // 2.2 MiB plus the header
	t.Logf("B adds %d bytes to unique_bytes (limit %d; header %d)", added, limit, hdr)
	if added > limit {
		t.Fatalf("B added %d bytes, limit %d", added, limit)
	}

	// diff says the same, tensor by tensor.
	code, out, errOut := ckptfs(t, "diff", "--json", filepath.Join(mnt, "runs/r/1/model.safetensors"), filepath.Join(mnt, "runs/r/2/model.safetensors"))
	if code != 0 {
		t.Fatalf("diff: %s", errOut)
	}
	var diff struct {
		Counts     map[string]int `json:"counts"`
		AddedBytes int64          `json:"added_bytes"`
		Tensors    []struct{ Name, Status string }
	}
	if err := json.Unmarshal([]byte(out), &diff); err != nil {
		t.Fatal(err)
	}
	if diff.Counts["same"] != 23 || diff.Counts["changed"] != 1 || diff.Counts["added"] != 1 || diff.Counts["removed"] != 0 {
		t.Fatalf("diff counts %v", diff.Counts)
	}
	for _, x := range diff.Tensors {
		want := "same"
		switch x.Name {
		case "aaa.new":
			want = "added"
		case a[5].name:
			want = "changed"
		}
		if x.Status != want {
			t.Errorf("%s: %s, want %s", x.Name, x.Status, want)
		}
	}
	if diff.AddedBytes > limit || diff.AddedBytes < 2<<20 {
		t.Errorf("diff added_bytes %d", diff.AddedBytes)
	}
	// The same diff of local copies (parsed, not read from manifests) agrees.
	local := t.TempDir()
	writeSafetensors(t, filepath.Join(local, "a.safetensors"), a)
	writeSafetensors(t, filepath.Join(local, "b.safetensors"), b)
	code, out2, _ := ckptfs(t, "diff", "--json", filepath.Join(local, "a.safetensors"), filepath.Join(local, "b.safetensors"))
	if code != 0 || out2 != out {
		t.Errorf("diff of local copies differs from diff in the mount:\n%s\n%s", out2, out)
	}
	d.stop(syscall.SIGTERM)
}

// TestHPSweepDedup is the seed's sweep: 8 runs × 10 steps, a frozen 40 MiB
// backbone shared by all, a 0.5 MiB head that changes every step.
func TestHPSweepDedup(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	var backbone []stTensor
	for i := 0; i < 20; i++ {
		backbone = append(backbone, stTensor{name: fmt.Sprintf("backbone.%02d.weight", i), dtype: "BF16", shape: []int64{1024, 1024}, data: randBytes(uint64(i+1), 2<<20)})
	}
	var logical int64
	for run := 0; run < 8; run++ {
		for step := 0; step < 10; step++ {
			head := stTensor{name: "head.weight", dtype: "BF16", shape: []int64{256, 1024}, data: randBytes(uint64(10000+run*100+step), 512<<10)}
			p := filepath.Join(mnt, "runs", fmt.Sprintf("run-%d", run), fmt.Sprint(step), "model.safetensors")
			writeSafetensors(t, p, append(append([]stTensor{}, backbone...), head))
			st, _ := os.Stat(p)
			logical += st.Size()
		}
	}
	st := statsJSON(t, mnt)
	limit := int64(float64(40<<20+80*(512<<10)) * 1.05)
	t.Logf("logical %d, unique %d (limit %d), stored %d, chunks %d", st["logical_bytes"], st["unique_bytes"], limit, st["stored_bytes"], st["chunks"])
	if st["logical_bytes"] != logical {
		t.Fatalf("logical_bytes %d, want %d", st["logical_bytes"], logical)
	}
	if st["unique_bytes"] > limit {
		t.Fatalf("unique_bytes %d > %d", st["unique_bytes"], limit)
	}
	d.stop(syscall.SIGTERM)
}

// TestTensorsCommand lists a checkpoint's tensors from its manifest in the
// mount and by parsing a local copy; both agree with what was written.
func TestTensorsCommand(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	tensors := []stTensor{
		{name: "emb", dtype: "BF16", shape: []int64{10, 8}, data: randBytes(1, 160)},
		{name: "w", dtype: "F32", shape: []int64{3, 4, 5}, data: randBytes(2, 240)},
		{name: "b", dtype: "I64", shape: []int64{}, data: randBytes(3, 8)},
	}
	inMount := filepath.Join(mnt, "runs/x/model.safetensors")
	writeSafetensors(t, inMount, tensors)
	local := filepath.Join(t.TempDir(), "model.safetensors")
	writeSafetensors(t, local, tensors)
	type listing struct {
		Format  string `json:"format"`
		Tensors []struct {
			Name   string  `json:"name"`
			DType  string  `json:"dtype"`
			Shape  []int64 `json:"shape"`
			Offset int64   `json:"offset"`
			Length int64   `json:"length"`
		} `json:"tensors"`
	}
	var got [2]listing
	for i, p := range []string{inMount, local} {
		code, out, errOut := ckptfs(t, "tensors", "--json", p)
		if code != 0 {
			t.Fatalf("tensors %s: %s", p, errOut)
		}
		if err := json.Unmarshal([]byte(out), &got[i]); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := json.Marshal(got[0])
	b, _ := json.Marshal(got[1])
	if string(a) != string(b) {
		t.Fatalf("mount and local listings differ:\n%s\n%s", a, b)
	}
	want := map[string]string{"emb": "bf16 [10 8] 160", "w": "f32 [3 4 5] 240", "b": "i64 [] 8"}
	var names []string
	for _, x := range got[0].Tensors {
		names = append(names, x.Name)
		if s := fmt.Sprintf("%s %v %d", x.DType, x.Shape, x.Length); s != want[x.Name] {
			t.Errorf("%s: %s, want %s", x.Name, s, want[x.Name])
		}
	}
	sort.Strings(names)
	if got[0].Format != "safetensors" || strings.Join(names, ",") != "b,emb,w" {
		t.Fatalf("listing: %+v", got[0])
	}
	code, out, _ := ckptfs(t, "tensors", inMount)
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "[3, 4, 5]") {
		t.Fatalf("table:\n%s", out)
	}
	if code, _, errOut := ckptfs(t, "tensors", filepath.Join(mnt, ".ckptfs/stats.json")); code != 1 || !strings.Contains(errOut, "no committed content") {
		t.Errorf("tensors of a virtual file: %d %s", code, errOut)
	}
	notCkpt := filepath.Join(mnt, "runs/x/notes.txt")
	if err := os.WriteFile(notCkpt, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := ckptfs(t, "tensors", notCkpt); code != 1 || !strings.Contains(errOut, "not a checkpoint") {
		t.Errorf("tensors of a non-checkpoint: %d %s", code, errOut)
	}
	d.stop(syscall.SIGTERM)
}
