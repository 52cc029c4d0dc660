package formats

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// wantTensor is what a test expects of one tensor. bytes, when set, must
// equal the file's bytes at [Offset, Offset+Length).
type wantTensor struct {
	dtype string
	shape []int64
	bytes []byte
	len   int64 // checked when bytes is nil; -1 to skip
}

// sample is a file with its expected parse.
type sample struct {
	name    string
	data    []byte
	format  string
	tensors map[string]wantTensor
}

func f32s(seed uint64, n int) []byte { return randBytes(seed, 4*n) }

// builtSamples hand-encodes one or more files of every format.
func builtSamples(t testing.TB) []sample {
	var out []sample

	// safetensors
	st := []stTensor{
		{"a.weight", "F32", []int64{64, 64}, f32s(1, 64*64)},
		{"a.bias", "F32", []int64{64}, f32s(2, 64)},
		{"emb", "BF16", []int64{300, 512}, randBytes(3, 300*512*2)},
		{"ids", "I64", []int64{10}, randBytes(4, 80)},
		{"flag", "BOOL", []int64{3}, []byte{1, 0, 1}},
		{"empty", "F16", []int64{0, 4}, nil},
		{"scalar", "F64", nil, randBytes(5, 8)},
		{"e4m3", "F8_E4M3", []int64{7}, randBytes(6, 7)},
	}
	want := map[string]wantTensor{}
	canon := map[string]string{"F32": "f32", "BF16": "bf16", "I64": "i64", "BOOL": "bool", "F16": "f16", "F64": "f64", "F8_E4M3": "f8_e4m3"}
	for _, x := range st {
		shape := x.shape
		if shape == nil {
			shape = []int64{}
		}
		want[x.name] = wantTensor{dtype: canon[x.dtype], shape: shape, bytes: x.data}
	}
	out = append(out, sample{"safetensors", buildSafetensors(st, map[string]string{"format": "pt"}), fmtSafetensors, want})

	// npy
	d := f32s(7, 100*50)
	out = append(out, sample{"npy", buildNPY("<f4", []int64{100, 50}, d), fmtNPY,
		map[string]wantTensor{"": {dtype: "f32", shape: []int64{100, 50}, bytes: d}}})
	out = append(out, sample{"npy-scalar", buildNPY("<i8", nil, randBytes(8, 8)), fmtNPY,
		map[string]wantTensor{"": {dtype: "i64", shape: []int64{}, bytes: randBytes(8, 8)}}})

	// npz
	w1, w2 := f32s(9, 40*30), randBytes(10, 2*77)
	members := []zipMember{{"w.npy", buildNPY("<f4", []int64{40, 30}, w1)}, {"h.npy", buildNPY("<f2", []int64{77}, w2)}}
	npzWant := map[string]wantTensor{"w": {dtype: "f32", shape: []int64{40, 30}, bytes: w1}, "h": {dtype: "f16", shape: []int64{77}, bytes: w2}}
	out = append(out, sample{"npz-sized", buildNPZ(t, members, false, false), fmtNPZ, npzWant})
	out = append(out, sample{"npz-descriptors", buildNPZ(t, members, true, false), fmtNPZ, npzWant})
	out = append(out, sample{"npz-deflated", buildNPZ(t, members, false, true), fmtNPZ, map[string]wantTensor{}})

	// gguf
	tokens := make([]string, 1000)
	for i := range tokens {
		tokens[i] = strings.Repeat("t", i%17) + string(rune('a'+i%26))
	}
	gt := []ggufTensor{
		{"token_embd.weight", 1, []uint64{128, 16}, randBytes(11, 128*16*2)},
		{"blk.0.attn_q.weight", 2, []uint64{64, 4}, randBytes(12, 8*18)},
		{"output_norm.weight", 0, []uint64{100}, f32s(13, 100)},
		{"blk.0.ffn.weight", 30, []uint64{33, 3}, randBytes(14, 99*2)},
	}
	ggWant := map[string]wantTensor{
		"token_embd.weight":   {dtype: "f16", shape: []int64{16, 128}, bytes: gt[0].data},
		"blk.0.attn_q.weight": {dtype: "q4_0", shape: []int64{4, 64}, bytes: gt[1].data},
		"output_norm.weight":  {dtype: "f32", shape: []int64{100}, bytes: gt[2].data},
		"blk.0.ffn.weight":    {dtype: "bf16", shape: []int64{3, 33}, bytes: gt[3].data},
	}
	kvs := []ggufKV{{"general.architecture", "llama"}, {"tokenizer.ggml.tokens", tokens}}
	out = append(out, sample{"gguf", buildGGUF(kvs, gt, 32), fmtGGUF, ggWant})
	out = append(out, sample{"gguf-align64", buildGGUF(append(kvs, ggufKV{"general.alignment", uint32(64)}), gt, 64), fmtGGUF, ggWant})

	// torch: typed storages, a tied weight, a transposed view, a slice with
	// a storage offset, an empty tensor and an untyped float8 storage.
	s0, s1, s2, s3 := f32s(15, 32*64), randBytes(16, 2*64), randBytes(17, 8*10), randBytes(18, 48)
	pts := []ptTensor{
		{"model.embed.weight", "0", "FloatStorage", "", 32 * 64, 0, []int64{32, 64}, []int64{64, 1}},
		{"model.lm_head.weight", "0", "FloatStorage", "", 32 * 64, 0, []int64{32, 64}, []int64{64, 1}},
		{"model.embed_t", "0", "FloatStorage", "", 32 * 64, 0, []int64{64, 32}, []int64{1, 64}},
		{"model.rows", "0", "FloatStorage", "", 32 * 64, 2 * 64, []int64{3, 64}, []int64{64, 1}},
		{"model.norm.weight", "1", "HalfStorage", "", 64, 0, []int64{64}, []int64{1}},
		{"model.ids", "2", "LongStorage", "", 10, 0, []int64{10}, []int64{1}},
		{"model.empty", "2", "LongStorage", "", 10, 0, []int64{0, 5}, []int64{5, 1}},
		{"model.fp8", "3", "UntypedStorage", "float8_e4m3fn", 48, 0, []int64{6, 8}, []int64{8, 1}},
	}
	pkl := stateDictPickle(pts)
	storages := []zipMember{{"0", s0}, {"1", s1}, {"2", s2}, {"3", s3}}
	ptWant := map[string]wantTensor{
		"model.embed.weight":   {dtype: "f32", shape: []int64{32, 64}, bytes: s0},
		"model.lm_head.weight": {dtype: "f32", shape: []int64{32, 64}, bytes: s0},
		"model.embed_t":        {dtype: "f32", shape: []int64{64, 32}, bytes: s0},
		"model.rows":           {dtype: "f32", shape: []int64{3, 64}, bytes: s0[2*64*4 : 5*64*4]},
		"model.norm.weight":    {dtype: "f16", shape: []int64{64}, bytes: s1},
		"model.ids":            {dtype: "i64", shape: []int64{10}, bytes: s2},
		"model.empty":          {dtype: "i64", shape: []int64{0, 5}, bytes: []byte{}},
		"model.fp8":            {dtype: "f8_e4m3", shape: []int64{6, 8}, bytes: s3},
	}
	out = append(out, sample{"torch", buildTorchZip(torchRecords("model", pkl, storages)), fmtTorch, ptWant})
	// Many tensors: a data.pkl of ~150 KB, found by several scan rounds.
	var many []ptTensor
	var manyStorages []zipMember
	manyWant := map[string]wantTensor{}
	for i := range 1500 {
		key := fmt.Sprint(i)
		d := randBytes(uint64(1000+i), 2*(i%7+1))
		many = append(many, ptTensor{fmt.Sprintf("layers.%d.norm.weight", i), key, "BFloat16Storage", "", int64(i%7 + 1), 0, []int64{int64(i%7 + 1)}, []int64{1}})
		manyStorages = append(manyStorages, zipMember{key, d})
		manyWant[many[i].name] = wantTensor{dtype: "bf16", shape: []int64{int64(i%7 + 1)}, bytes: d}
	}
	out = append(out, sample{"torch-many", buildTorchZip(torchRecords("archive", stateDictPickle(many), manyStorages)), fmtTorch, manyWant})
	out = append(out, sample{"torch-desc64", buildTorchZipDesc(torchRecords("archive", pkl, storages), true), fmtTorch, ptWant})
	// Archives one after another (distcp), with end records without zip64
	// (the fixture's have them): the first archive's tensors are named
	// "0.<name>", the second's "1.<name>".
	seqWant := map[string]wantTensor{}
	for n, w := range ptWant {
		seqWant["0."+n], seqWant["1."+n] = w, w
	}
	out = append(out, sample{"distcp-built", slices.Concat(buildTorchZip(torchRecords("model", pkl, storages)),
		buildTorchZipDesc(torchRecords("archive", pkl, storages), true)), fmtDistcp, seqWant})
	return out
}

// fixtureSamples loads the files made by testdata/gen_fixtures.py.
func fixtureSamples(t testing.TB) []sample {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	torchWant := func(name string) map[string]wantTensor {
		var j map[string]struct {
			DType string  `json:"dtype"`
			Shape []int64 `json:"shape"`
			Hex   string  `json:"hex"`
		}
		if err := json.Unmarshal(read(name), &j); err != nil {
			t.Fatal(err)
		}
		m := map[string]wantTensor{}
		for k, v := range j {
			b, _ := hex.DecodeString(v.Hex)
			m[k] = wantTensor{dtype: map[string]string{"torch.float32": "f32", "torch.float16": "f16",
				"torch.bfloat16": "bf16", "torch.int64": "i64", "torch.bool": "bool", "torch.float64": "f64", "torch.int32": "i32"}[v.DType],
				shape: v.Shape, bytes: b}
		}
		return m
	}
	sd := torchWant("torch_state_dict.json")
	// The transposed view spans its whole storage, not its contiguous copy.
	sd["proj.weight_t"] = wantTensor{dtype: "f32", shape: []int64{16, 8}, len: 8 * 16 * 4}
	weights := readNPYData(t, read("np_array.npy"))
	return []sample{
		{"fixture-state-dict", read("torch_state_dict.pt"), fmtTorch, sd},
		{"fixture-optimizer", read("torch_optimizer.pt"), fmtTorch, torchWant("torch_optimizer.json")},
		{"fixture-checkpoint", read("torch_checkpoint.pt"), fmtTorch, nil},
		{"fixture-legacy", read("torch_legacy.pt"), "", map[string]wantTensor{}},
		{"fixture-npz", read("np_arrays.npz"), fmtNPZ, map[string]wantTensor{
			"weights": {dtype: "f32", shape: []int64{10, 20}, bytes: weights},
			"ids":     {dtype: "i64", shape: []int64{7}, len: 56},
			"flags":   {dtype: "bool", shape: []int64{3}, bytes: []byte{1, 0, 1}},
			"half":    {dtype: "f16", shape: []int64{3, 3}, len: 18},
			"scalar":  {dtype: "f64", shape: []int64{}, len: 8},
			"names":   {dtype: "<U3", shape: []int64{2}, len: 24},
		}},
		{"fixture-npz-compressed", read("np_compressed.npz"), fmtNPZ, map[string]wantTensor{}},
		{"fixture-npy", read("np_array.npy"), fmtNPY, map[string]wantTensor{"": {dtype: "f32", shape: []int64{10, 20}, bytes: weights}}},
		{"fixture-npy-fortran", read("np_fortran.npy"), fmtNPY, map[string]wantTensor{"": {dtype: "i32", shape: []int64{3, 4}, len: 48}}},
		// torch.distributed.checkpoint's shard of one process (gen_distcp.py):
		// archives 0-2 hold non-tensor values, 3 a tuple of two tensors (named
		// 0.0 and 0.1), 4-7 one tensor each (named 1-4).
		{"fixture-distcp", read("dcp_shard.distcp"), fmtDistcp, torchWant("dcp_shard.json")},
	}
}

// readNPYData returns the data bytes of a .npy file (header length from v1).
func readNPYData(t testing.TB, b []byte) []byte {
	return b[10+int(binary.LittleEndian.Uint16(b[8:])):]
}

func allSamples(t testing.TB) []sample { return append(builtSamples(t), fixtureSamples(t)...) }

// checkIndex verifies the structural invariants of an index of data.
func checkIndex(t testing.TB, data []byte, ix *Index) {
	t.Helper()
	var pos int64
	for i, s := range ix.Segments {
		if s.Offset != pos || s.Length <= 0 {
			t.Fatalf("segment %d %+v: want offset %d and positive length", i, s, pos)
		}
		if s.Kind != KindData && s.DType != "" {
			t.Fatalf("segment %d %+v: dtype on a non-data segment", i, s)
		}
		if i > 0 && s.Kind != KindData && ix.Segments[i-1].Kind == s.Kind {
			t.Fatalf("segment %d %+v: not merged with its neighbour", i, s)
		}
		pos += s.Length
	}
	if pos != int64(len(data)) {
		t.Fatalf("segments cover %d bytes, file has %d", pos, len(data))
	}
	for i, tn := range ix.Tensors {
		if tn.Offset < 0 || tn.Length < 0 || tn.Offset+tn.Length > int64(len(data)) {
			t.Fatalf("tensor %+v outside the file", tn)
		}
		if i > 0 && (ix.Tensors[i-1].Offset > tn.Offset) {
			t.Fatalf("tensors not sorted at %d", i)
		}
		if tn.Length == 0 || IsPartFormat(ix.Format) && (tn.DType == DTypeTree || tn.Length < minDataChunk) {
			continue // a tree, or a small pickle buffer: a part of the metadata
		}
		in := false
		for _, s := range ix.Segments {
			if s.Kind == KindData && s.Offset <= tn.Offset && tn.Offset+tn.Length <= s.Offset+s.Length {
				in = true
			}
		}
		if !in {
			t.Fatalf("tensor %q [%d,+%d) is not inside one data segment", tn.Name, tn.Offset, tn.Length)
		}
	}
}

// checkTensors compares an index's tensors with the expectation.
func checkTensors(t testing.TB, data []byte, ix *Index, want map[string]wantTensor) {
	t.Helper()
	if want == nil {
		return
	}
	got := map[string]Tensor{}
	for _, tn := range ix.Tensors {
		got[tn.Name] = tn
	}
	if len(got) != len(want) {
		t.Errorf("got %d tensors %v, want %d", len(got), names(ix.Tensors), len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("tensor %q missing", name)
			continue
		}
		if g.DType != w.dtype || !reflect.DeepEqual(g.Shape, w.shape) {
			t.Errorf("tensor %q: dtype %q shape %v, want %q %v", name, g.DType, g.Shape, w.dtype, w.shape)
		}
		if w.bytes != nil {
			if !bytes.Equal(data[g.Offset:g.Offset+g.Length], w.bytes) {
				t.Errorf("tensor %q: bytes at [%d,+%d) differ from the tensor's", name, g.Offset, g.Length)
			}
		} else if w.len >= 0 && g.Length != w.len {
			t.Errorf("tensor %q: length %d, want %d", name, g.Length, w.len)
		}
	}
}

func names(ts []Tensor) []string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Name)
	}
	return s
}

func TestParse(t *testing.T) {
	for _, s := range allSamples(t) {
		t.Run(s.name, func(t *testing.T) {
			ix, err := Parse(bytes.NewReader(s.data), int64(len(s.data)))
			if err != nil {
				t.Fatal(err)
			}
			if ix.Format != s.format {
				t.Fatalf("format %q, want %q", ix.Format, s.format)
			}
			checkIndex(t, s.data, ix)
			checkTensors(t, s.data, ix, s.tensors)
		})
	}
}

func TestParseTorchCheckpointNames(t *testing.T) {
	b, err := os.ReadFile("testdata/torch_checkpoint.pt")
	if err != nil {
		t.Fatal(err)
	}
	ix, err := Parse(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(names(ix.Tensors), " ")
	for _, want := range []string{"model.0.weight", "model.2.bias", "optimizer.state.0.exp_avg", "optimizer.state.3.exp_avg_sq"} {
		if !strings.Contains(" "+got+" ", " "+want+" ") {
			t.Errorf("tensor %q missing from %s", want, got)
		}
	}
}

// A pickled nn.Module names classes outside the allow-list: Parse refuses
// it rather than guess, and the Chunker falls back to CDC.
func TestParseTorchModuleRejected(t *testing.T) {
	b, err := os.ReadFile("testdata/torch_module.pt")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse(bytes.NewReader(b), int64(len(b)))
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("Parse = %v, want a not-allowed global", err)
	}
	c := NewChunker(0)
	c.Write(b)
	if _, ix := c.Close(); ix.Format != "" {
		t.Fatalf("Chunker index format %q, want unknown", ix.Format)
	}
}

func TestParseUnknown(t *testing.T) {
	for _, data := range [][]byte{nil, []byte("x"), []byte(`{"xgboost": 1}`), randBytes(1, 5000), buildNPZ(t, []zipMember{{"a.txt", []byte("hi")}}, false, false)} {
		ix, err := Parse(bytes.NewReader(data), int64(len(data)))
		if err != nil || ix.Format != "" {
			t.Fatalf("Parse(%q...) = %+v, %v; want unknown", data[:min(len(data), 8)], ix, err)
		}
		checkIndex(t, data, ix)
	}
}

// TestDCPMetadataNamesArchives: .metadata's items name the archives of the
// distcp fixture; each tensor the index finds lies inside exactly one
// item's range, whose key is the tensor's (dcp_shard.json's "fqn").
func TestDCPMetadataNamesArchives(t *testing.T) {
	data, err := os.ReadFile("testdata/dcp_shard.distcp")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile("testdata/dcp_shard.metadata")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]struct {
		FQN string `json:"fqn"`
	}
	j, err := os.ReadFile("testdata/dcp_shard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(j, &want); err != nil {
		t.Fatal(err)
	}
	items, err := ParseDCPMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 8 { // 3 non-tensor values, a tuple, 4 tensors
		t.Fatalf("%d items, want 8: %+v", len(items), items)
	}
	ix, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range ix.Tensors {
		var in []DCPItem
		for _, it := range items {
			if it.File == "__0_0.distcp" && it.Offset <= tn.Offset && tn.Offset+tn.Length <= it.Offset+it.Length {
				in = append(in, it)
			}
		}
		// A tensor item has its shard's offset, one number per dimension;
		// the tuple, saved as bytes, none.
		if len(in) != 1 || in[0].FQN != want[tn.Name].FQN || in[0].ShardOffset != nil && len(in[0].ShardOffset) != len(tn.Shape) {
			t.Errorf("tensor %q [%d,+%d) lies in items %+v, want one: %q", tn.Name, tn.Offset, tn.Length, in, want[tn.Name].FQN)
		}
	}
	for _, bad := range [][]byte{md[:len(md)/2], []byte("\x80\x04}."), data[:200]} {
		if _, err := ParseDCPMetadata(bad); err == nil {
			t.Errorf("ParseDCPMetadata(%q...) succeeded", bad[:min(len(bad), 16)])
		}
	}
}

// TestDistcpNumbersTensorArchives: a non-tensor value added before the
// tensors (DCP writes those first) renames no tensor: only archives that
// hold tensors are numbered.
func TestDistcpNumbersTensorArchives(t *testing.T) {
	f4 := f32s(3, 4)
	w := ptTensor{"w", "0", "FloatStorage", "", 4, 0, []int64{4}, []int64{1}}
	value := torchWith([]byte("\x80\x02K\x05.")) // torch.save(5)
	var pk pkw
	bare := torchWith(pk.op(0x80, 2).tensor(w).op('.').Bytes(), zipMember{"0", f4}) // torch.save(tensor)
	dict := torchWith(stateDictPickle([]ptTensor{w}), zipMember{"0", f4})
	var got [][]string
	for _, data := range [][]byte{
		slices.Concat(value, bare, dict),
		slices.Concat(value, value, bare, value, dict),
	} {
		ix, err := Parse(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		_, cix := chunk(data, 4096, 0)
		if !reflect.DeepEqual(ix, cix) {
			t.Fatalf("Parse and the Chunker disagree:\n%+v\n%+v", ix, cix)
		}
		got = append(got, names(ix.Tensors))
	}
	if want := []string{"0", "1.w"}; !reflect.DeepEqual(got[0], want) || !reflect.DeepEqual(got[1], want) {
		t.Fatalf("tensor names %q and %q, want %q in both", got[0], got[1], want)
	}
}
