package formats

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
)

// Synthetic tree models: n trees of random sizes, the same trees (by index)
// in every model of a seed, so model(seed, 40) and model(seed, 60) are two
// warm-start saves.

// synthTree returns tree i's node count and values.
func synthTree(seed uint64, i int) (int, []float64) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	nodes := 10 + r.IntN(120)
	v := make([]float64, nodes)
	for k := range v {
		v[k] = r.NormFloat64()
	}
	return nodes, v
}

func buildXGBJSON(seed uint64, n int) []byte {
	var b strings.Builder
	b.WriteString(`{"learner":{"attributes":{},"feature_names":[],"gradient_booster":{"model":{"gbtree_model_param":{"num_parallel_tree":"1","num_trees":"`)
	fmt.Fprintf(&b, `%d"},"iteration_indptr":[`, n)
	for i := 0; i <= n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, i)
	}
	b.WriteString(`],"trees":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		nodes, v := synthTree(seed, i)
		b.WriteString(`{"base_weights":[`)
		for k, x := range v {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%.7E", x)
		}
		fmt.Fprintf(&b, `],"id":%d,"name":"a \"quoted\" [tree] {%d}","tree_param":{"num_nodes":"%d"}}`, i, i, nodes)
	}
	b.WriteString(`]},"name":"gbtree"},"objective":{"name":"reg:squarederror"}},"version":[3,2,0]}`)
	return []byte(b.String())
}

// ubjWriter writes the UBJSON XGBoost writes: keys and lengths as 'L'
// int64s, counted arrays, typed float arrays.
type ubjWriter struct{ bytes.Buffer }

func (w *ubjWriter) int64(v int64) { w.WriteByte('L'); binary.Write(&w.Buffer, binary.BigEndian, v) }
func (w *ubjWriter) key(k string)  { w.int64(int64(len(k))); w.WriteString(k) }
func (w *ubjWriter) str(s string)  { w.WriteByte('S'); w.key(s) }

func buildXGBUBJ(seed uint64, n int) []byte {
	var w ubjWriter
	w.WriteByte('{')
	w.key("learner")
	w.WriteByte('{')
	w.key("attributes")
	w.WriteString("{}")
	w.key("gradient_booster")
	w.WriteByte('{')
	w.key("model")
	w.WriteByte('{')
	w.key("iteration_indptr")
	w.WriteString("[#")
	w.int64(int64(n + 1))
	for i := 0; i <= n; i++ {
		w.WriteByte('l')
		binary.Write(&w.Buffer, binary.BigEndian, int32(i))
	}
	w.key("trees")
	w.WriteString("[#")
	w.int64(int64(n))
	for i := 0; i < n; i++ {
		nodes, v := synthTree(seed, i)
		w.WriteByte('{')
		w.key("base_weights")
		w.WriteString("[$d#")
		w.int64(int64(len(v)))
		for _, x := range v {
			binary.Write(&w.Buffer, binary.BigEndian, float32(x))
		}
		w.key("id")
		w.int64(int64(i))
		w.key("split_type")
		w.WriteString("[$U#")
		w.int64(int64(nodes))
		w.Write(make([]byte, nodes))
		w.key("tree_param")
		w.WriteByte('{')
		w.key("num_nodes")
		w.str(fmt.Sprint(nodes))
		w.WriteString("}}")
	}
	w.WriteByte('}') // model
	w.key("name")
	w.str("gbtree")
	w.WriteString("}") // gradient_booster
	w.key("objective")
	w.WriteString("{")
	w.key("name")
	w.str("reg:squarederror")
	w.WriteString("}}") // objective, learner
	w.key("version")
	w.WriteString("[#")
	w.int64(3)
	w.WriteString("i\x03i\x02i\x00}")
	return w.Bytes()
}

func buildLightGBM(seed uint64, n int) []byte {
	var b strings.Builder
	b.WriteString("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nmax_feature_idx=19\ntree_sizes=")
	trees := make([]string, n)
	for i := range trees {
		_, v := synthTree(seed, i)
		var t strings.Builder
		fmt.Fprintf(&t, "Tree=%d\nnum_leaves=%d\nleaf_value=", i, len(v))
		for _, x := range v {
			fmt.Fprintf(&t, "%.17g ", x)
		}
		t.WriteString("\nTreeX=not a tree\nshrinkage=0.1\n\n\n")
		trees[i] = t.String()
		fmt.Fprintf(&b, "%d ", len(trees[i]))
	}
	b.WriteString("\n\n")
	for _, t := range trees {
		b.WriteString(t)
	}
	b.WriteString("end of trees\n\nfeature_importances:\nColumn_0=12\n\nparameters:\n[boosting: gbdt]\nend of parameters\n\npandas_categorical:null\n")
	return []byte(b.String())
}

// buildPickle writes a protocol 4 pickle of {"n": n, "trees": [bytes...]}
// framed as CPython frames it, with frames of about frame bytes (CPython:
// 64 KiB); buffers of 64 KiB or more go outside frames.
func buildPickle(seed uint64, n, frame int) []byte {
	var ops [][]byte
	op := func(b ...byte) { ops = append(ops, b) }
	bytesOp := func(p []byte) {
		var h []byte
		switch {
		case len(p) < 256:
			h = []byte{'C', byte(len(p))}
		default:
			h = binary.LittleEndian.AppendUint32([]byte{'B'}, uint32(len(p)))
		}
		ops = append(ops, append(h, p...))
	}
	str := func(s string) { op(append([]byte{0x8c, byte(len(s))}, s...)...) }
	op('}', 0x94, '(')
	str("n")
	op(append([]byte{'J'}, binary.LittleEndian.AppendUint32(nil, uint32(n))...)...)
	str("state")
	bytesOp(randBytes(seed+1000, 2496)) // a RandomState-like buffer
	str("trees")
	op(']', 0x94, '(')
	for i := 0; i < n; i++ {
		_, v := synthTree(seed, i)
		p := make([]byte, 8*len(v))
		for k, x := range v {
			binary.LittleEndian.PutUint64(p[8*k:], math.Float64bits(x))
		}
		str("tree")
		bytesOp(p)
		bytesOp(p[:min(len(p), 100)])
		if i == 3 {
			bytesOp(randBytes(seed+uint64(i), 70000)) // an unframed big buffer
		}
	}
	op('e', 'u', '.')
	out := []byte{0x80, 4}
	var cur []byte
	flush := func() {
		if len(cur) > 0 {
			out = append(out, 0x95)
			out = binary.LittleEndian.AppendUint64(out, uint64(len(cur)))
			out = append(out, cur...)
			cur = nil
		}
	}
	for _, o := range ops {
		if len(o) >= 65536 {
			flush()
			out = append(out, o...)
			continue
		}
		cur = append(cur, o...)
		if len(cur) >= frame {
			flush()
		}
	}
	flush()
	return out
}

type treeCase struct {
	name   string
	format string
	build  func(seed uint64, n int) []byte
	// parts is how many parts a model of n trees lists
	parts func(seed uint64, n int) int
}

func treesOnly(_ uint64, n int) int { return n }

// pickleBuffers counts the buffers buildPickle writes of at least
// minPartBuf bytes.
func pickleBuffers(seed uint64, n int) int {
	k := 1 // the state
	if n > 3 {
		k++ // the big one
	}
	for i := 0; i < n; i++ {
		if nodes, _ := synthTree(seed, i); 8*nodes >= minPartBuf {
			k++
		}
	}
	return k
}

var treeCases = []treeCase{
	{"xgboost-json", fmtXGBoostJSON, buildXGBJSON, treesOnly},
	{"xgboost-ubj", fmtXGBoostUBJ, buildXGBUBJ, treesOnly},
	{"lightgbm", fmtLightGBM, buildLightGBM, treesOnly},
	{"pickle", fmtPickle, func(s uint64, n int) []byte { return buildPickle(s, n, 8<<10) }, pickleBuffers},
}

// chunkSet returns the hashes of data's chunks.
func chunkSet(data []byte, cuts []int64) map[[32]byte]bool {
	out := map[[32]byte]bool{}
	prev := int64(0)
	for _, c := range cuts {
		out[sha256.Sum256(data[prev:c])] = true
		prev = c
	}
	return out
}

// TestPartFormats checks the cuts and parts of each part format on
// synthetic models: parts where the format puts them, each tree starting a
// chunk or grouped, cuts independent of how writes split the stream, Parse
// agreeing with the Chunker.
func TestPartFormats(t *testing.T) {
	for _, tc := range treeCases {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.build(1, 40)
			cuts, ix := chunk(data, 1<<20, 0)
			checkCuts(t, data, cuts, ix, 1<<20)
			checkIndex(t, data, ix)
			if ix.Format != tc.format {
				t.Fatalf("format %q, want %q", ix.Format, tc.format)
			}
			if len(ix.Tensors) != tc.parts(1, 40) {
				t.Fatalf("%d parts, want %d", len(ix.Tensors), tc.parts(1, 40))
			}
			for _, p := range ix.Tensors {
				b := data[p.Offset : p.Offset+p.Length]
				switch {
				case p.DType == DTypeTree && tc.format == fmtLightGBM:
					if !bytes.HasPrefix(b, []byte("Tree="+strings.TrimPrefix(p.Name, "tree.")+"\n")) {
						t.Fatalf("%s starts %q", p.Name, b[:min(len(b), 20)])
					}
				case p.DType == DTypeTree:
					if b[0] != '{' || b[len(b)-1] != '}' {
						t.Fatalf("%s is %q...%q", p.Name, b[:1], b[len(b)-1:])
					}
				case p.DType != DTypeBuffer:
					t.Fatalf("part %+v", p)
				}
			}
			// The skeleton and the trees never share a chunk.
			isCut := map[int64]bool{}
			for _, c := range cuts {
				isCut[c] = true
			}
			first, last := ix.Tensors[0], ix.Tensors[len(ix.Tensors)-1]
			edges := map[string][2]int64{
				fmtXGBoostJSON: {first.Offset, last.Offset + last.Length},
				fmtXGBoostUBJ:  {first.Offset, last.Offset + last.Length},
				fmtLightGBM:    {first.Offset + int64(len(lgbTree)), last.Offset + last.Length + int64(len(lgbEnd))},
			}
			if e, ok := edges[tc.format]; ok && (!isCut[e[0]] || !isCut[e[1]]) {
				t.Fatalf("no cut at the tree list's start %d (%v) or end %d (%v)", e[0], isCut[e[0]], e[1], isCut[e[1]])
			}
			checkSplitsAndParse(t, data, cuts, ix)
			// Small chunk limits scale the grouping down with CDC.
			c3, ix3 := chunk(data, 256, 1000)
			checkCuts(t, data, c3, ix3, 256)
			if ix3.Format != tc.format {
				t.Fatalf("maxChunk 256: format %q", ix3.Format)
			}
		})
	}
}

// checkSplitsAndParse checks that writes of 1, 7 and 4093 bytes cut data
// as whole writes did (cuts, ix; maxChunk 1 MiB) and that Parse agrees.
func checkSplitsAndParse(t *testing.T, data []byte, cuts []int64, ix *Index) {
	t.Helper()
	for _, feed := range []int{1, 7, 4093} {
		c2, ix2 := chunk(data, 1<<20, feed)
		if !reflect.DeepEqual(cuts, c2) || !reflect.DeepEqual(ix, ix2) {
			t.Fatalf("writes of %d bytes cut differently", feed)
		}
	}
	pix, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil || !reflect.DeepEqual(ix, pix) {
		t.Fatalf("Parse: %v\n%+v\nChunker:\n%+v", err, pix, ix)
	}
}

// TestPartFormatsWarmStart saves a model of 40 trees, then of 60 (the same
// first 40): the second costs its 20 new trees, its skeleton and at most a
// few groups of trees, never the old trees again.
func TestPartFormatsWarmStart(t *testing.T) {
	for _, tc := range treeCases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.build(2, 40), tc.build(2, 60)
			ca, ixa := chunk(a, 1<<20, 0)
			cb, ixb := chunk(b, 1<<20, 0)
			have := chunkSet(a, ca)
			var added int64
			prev := int64(0)
			for _, c := range cb {
				if !have[sha256.Sum256(b[prev:c])] {
					added += c - prev
				}
				prev = c
			}
			var oldParts, newParts int64
			for _, p := range ixa.Tensors {
				oldParts += p.Length
			}
			for _, p := range ixb.Tensors {
				newParts += p.Length
			}
			grown := newParts - oldParts         // the new trees
			skeleton := int64(len(b)) - newParts // everything else
			slack := int64(3*partGroup + 3*cdcMin)
			if limit := grown + skeleton + slack; added > limit {
				t.Fatalf("60 trees after 40 add %d bytes; new parts %d, skeleton %d: want <= %d", added, grown, skeleton, limit)
			}
			t.Logf("added %d bytes for %d bytes of new parts (file %d -> %d)", added, grown, len(a), len(b))
		})
	}
}

// TestPartFormatsMalformed: a truncated or corrupted model is cut (validly)
// and indexed as unknown, never refused.
func TestPartFormatsMalformed(t *testing.T) {
	for _, tc := range treeCases {
		data := tc.build(3, 12)
		cases := map[string][]byte{
			"truncated": data[:len(data)*2/3],
			"short":     data[:11],
		}
		if tc.format != fmtLightGBM { // LightGBM text has no syntax to break
			cases["trailing"] = append(append([]byte{}, data...), "garbage"...)
			cases["corrupt"] = append(append(append([]byte{}, data[:len(data)/2]...), 0x01, ']', '}', 0x02), data[len(data)/2:]...)
		}
		for name, d := range cases {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				cuts, ix := chunk(d, 1<<20, 999)
				checkCuts(t, d, cuts, ix, 1<<20)
				if ix.Format != "" {
					t.Fatalf("format %q for a %s model", ix.Format, name)
				}
				pix, err := Parse(bytes.NewReader(d), int64(len(d)))
				if err != nil || pix.Format != "" {
					t.Fatalf("Parse: %v, %+v", err, pix)
				}
			})
		}
	}
}

// TestPartFormatsFixtures runs real models (testdata/gen_trees.py) through
// the Chunker.
func TestPartFormatsFixtures(t *testing.T) {
	for _, tc := range []struct {
		file, format string
		trees        int // parts of DType tree
		buffers      int // parts of DType buffer, at least
	}{
		{"trees_xgb.json", fmtXGBoostJSON, 4, 0},
		{"trees_xgb.ubj", fmtXGBoostUBJ, 4, 0},
		{"trees_lgb.txt", fmtLightGBM, 4, 0},
		{"trees_sklearn.pkl", fmtPickle, 0, 4},
		{"trees_sklearn.joblib", fmtPickle, 0, 4},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			cuts, ix := chunk(data, 1<<20, 0)
			checkCuts(t, data, cuts, ix, 1<<20)
			checkIndex(t, data, ix)
			if ix.Format != tc.format {
				t.Fatalf("format %q, want %q", ix.Format, tc.format)
			}
			n := map[string]int{}
			for _, p := range ix.Tensors {
				n[p.DType]++
			}
			if n[DTypeTree] != tc.trees || n[DTypeBuffer] < tc.buffers {
				t.Fatalf("parts %v, want %d trees and at least %d buffers", n, tc.trees, tc.buffers)
			}
		})
	}
}

// TestLightGBMAppendedTail: lightgbm's save_model commits the file the
// library wrote, then appends "pandas_categorical:null": both versions
// share every chunk but the appended line's.
func TestLightGBMAppendedTail(t *testing.T) {
	full := buildLightGBM(4, 30)
	first := full[:bytes.LastIndex(full, []byte("\npandas_categorical:"))]
	c1, ix1 := chunk(first, 1<<20, 0)
	c2, ix2 := chunk(full, 1<<20, 0)
	if ix1.Format != fmtLightGBM || ix2.Format != fmtLightGBM {
		t.Fatalf("formats %q, %q", ix1.Format, ix2.Format)
	}
	have := chunkSet(first, c1)
	prev := int64(0)
	for _, c := range c2 {
		if !have[sha256.Sum256(full[prev:c])] && prev < int64(len(first)) {
			t.Fatalf("chunk [%d,%d) of the full file is new; the first commit ends at %d", prev, c, len(first))
		}
		prev = c
	}
}
