package formats

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// seeds returns the samples and hostile inputs whose name starts with one
// of the prefixes, skipping large ones (they slow the fuzzer down).
func seeds(f *testing.F, prefixes ...string) {
	match := func(name string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	for _, s := range allSamples(f) {
		if match(s.name) && len(s.data) < 16<<10 {
			f.Add(s.data)
		}
	}
	for _, h := range hostile(f) {
		if match(h.name) && len(h.data) < 16<<10 {
			f.Add(h.data)
		}
	}
}

// fuzzParse checks Parse never panics, fails only with ErrFormat, and
// returns well-formed indexes.
func fuzzParse(t *testing.T, data []byte) {
	ix, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("error %v does not wrap ErrFormat", err)
		}
		return
	}
	checkIndex(t, data, ix)
}

func FuzzParseSafetensors(f *testing.F) {
	seeds(f, "safetensors", "st/")
	f.Add(buildSafetensors([]stTensor{{"a", "F32", []int64{2, 2}, randBytes(1, 16)}, {"b", "BF16", []int64{3}, randBytes(2, 6)}}, map[string]string{"format": "pt"}))
	f.Fuzz(fuzzParse)
}

func FuzzParseTorch(f *testing.F) {
	seeds(f, "torch", "fixture-state", "fixture-opt", "fixture-check", "fixture-legacy", "fixture-distcp", "torch/")
	f.Fuzz(fuzzParse)
}

func FuzzParseGGUF(f *testing.F) {
	seeds(f, "gguf")
	f.Add(buildGGUF([]ggufKV{{"general.architecture", "x"}}, []ggufTensor{{"t", 0, []uint64{4}, randBytes(1, 16)}, {"q", 2, []uint64{32}, randBytes(2, 18)}}, 32))
	f.Fuzz(fuzzParse)
}

func FuzzParseNPY(f *testing.F) {
	seeds(f, "npy", "npz", "fixture-np")
	f.Fuzz(fuzzParse)
}

// FuzzChunker checks that the Chunker never panics, cuts the same way
// however the stream is split, keeps its cut invariants, and that whenever
// it learns a format, Parse agrees with it exactly.
func FuzzChunker(f *testing.F) {
	for _, s := range allSamples(f) {
		if len(s.data) < 16<<10 {
			f.Add(s.data, uint16(7))
		}
	}
	for _, h := range hostile(f) {
		if len(h.data) < 16<<10 {
			f.Add(h.data, uint16(1))
		}
	}
	for _, d := range treeSeeds(f) {
		f.Add(d, uint16(5))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		const mc = 256
		cuts, ix := chunk(data, mc, 0)
		checkCuts(t, data, cuts, ix, mc)
		checkIndex(t, data, ix)
		cuts2, ix2 := chunk(data, mc, int(split%4096)+1)
		if !reflect.DeepEqual(cuts, cuts2) || !reflect.DeepEqual(ix, ix2) {
			t.Fatalf("writes of %d bytes cut differently", split%4096+1)
		}
		if ix.Format == "" {
			return
		}
		pix, err := Parse(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("Chunker learned %s, Parse failed: %v", ix.Format, err)
		}
		if !reflect.DeepEqual(ix, pix) {
			t.Fatalf("Chunker index\n%+v\nParse index\n%+v", ix, pix)
		}
	})
}

// treeSeeds are small tree models and pickles: synthetic ones of each part
// format and the real ones in testdata (gen_trees.py).
func treeSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, tc := range treeCases {
		out = append(out, tc.build(7, 3))
	}
	// An OCDBT data file: small frames, a zarr3 shard index, a node.
	vs := ocdbtValues(f, 11, 3, 2<<10)
	ocdbt, _, _ := buildOCDBTFile(vs, []int{0, 1, 2}, func(i int) []byte { return randBytes(uint64(i), 20) }, 2, 1)
	out = append(out, ocdbt)
	for _, name := range []string{"trees_xgb.json", "trees_xgb.ubj", "trees_lgb.txt", "trees_sklearn.pkl", "trees_sklearn.joblib"} {
		data, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// FuzzParseTrees fuzzes the part formats' scanners (XGBoost JSON and UBJ,
// LightGBM text, pickles, zstd frames) through Parse, and checks the Chunker on the same
// bytes cuts alike however writes split them and agrees with Parse.
func FuzzParseTrees(f *testing.F) {
	for _, d := range treeSeeds(f) {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzParse(t, data)
		cuts, ix := chunk(data, 256, 0)
		checkCuts(t, data, cuts, ix, 256)
		checkIndex(t, data, ix)
		cuts2, ix2 := chunk(data, 256, 13)
		if !reflect.DeepEqual(cuts, cuts2) || !reflect.DeepEqual(ix, ix2) {
			t.Fatalf("writes of 13 bytes cut differently")
		}
		pix, err := Parse(bytes.NewReader(data), int64(len(data)))
		if ix.Format != "" && (err != nil || !reflect.DeepEqual(ix, pix)) {
			t.Fatalf("Chunker index\n%+v\nParse index\n%+v (%v)", ix, pix, err)
		}
	})
}

// FuzzDCPMetadata: ParseDCPMetadata never panics on a damaged .metadata,
// and what it returns is well-formed.
func FuzzDCPMetadata(f *testing.F) {
	md, err := os.ReadFile("testdata/dcp_shard.metadata")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(md)
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := ParseDCPMetadata(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		for _, it := range items {
			if it.Offset < 0 || it.Length < 0 {
				t.Fatalf("item %+v: negative range", it)
			}
		}
	})
}
