package formats

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// xTensor is an f32 vector to save in every container.
type xTensor struct {
	name string
	data []byte
}

// containers returns the same tensors saved as a torch zip (one storage
// record each, as torch.save writes a state dict), a safetensors file (as
// safetensors.save_file writes the dict: sorted, packed), a GGUF file
// (32-byte alignment, padded) and an npz (each tensor a stored member).
func containers(t testing.TB, ts []xTensor) map[string][]byte {
	var pts []ptTensor
	var recs []zipMember
	var sts []stTensor
	var ggs []ggufTensor
	var npz []zipMember
	for i, x := range ts {
		n := int64(len(x.data) / 4)
		key := fmt.Sprint(i)
		pts = append(pts, ptTensor{x.name, key, "FloatStorage", "", n, 0, []int64{n}, []int64{1}})
		recs = append(recs, zipMember{key, x.data})
		sts = append(sts, stTensor{x.name, "F32", []int64{n}, x.data})
		ggs = append(ggs, ggufTensor{x.name, 0, []uint64{uint64(n)}, x.data})
		npz = append(npz, zipMember{x.name + ".npy", buildNPY("<f4", []int64{n}, x.data)})
	}
	return map[string][]byte{
		fmtTorch:       buildTorchZip(torchRecords("archive", stateDictPickle(pts), recs)),
		fmtSafetensors: buildSafetensors(sts, map[string]string{"format": "pt"}),
		fmtGGUF:        buildGGUF([]ggufKV{{"general.architecture", "llama"}}, ggs, 32),
		fmtNPZ:         buildNPZ(t, npz, false, false),
	}
}

// tensorChunks returns, for each tensor, the hashes of the chunks that make
// up its bytes, or nil where its range is not a run of whole chunks.
func tensorChunks(data []byte, cuts []int64, ix *Index) map[string][][32]byte {
	starts := map[int64]int{0: 0}
	for i, c := range cuts {
		starts[c] = i + 1
	}
	out := map[string][][32]byte{}
	for _, tn := range ix.Tensors {
		i, ok := starts[tn.Offset]
		if !ok {
			out[tn.Name] = nil
			continue
		}
		var hs [][32]byte
		for p := tn.Offset; i < len(cuts) && p < tn.Offset+tn.Length; i++ {
			hs = append(hs, sha256.Sum256(data[p:cuts[i]]))
			p = cuts[i]
		}
		if i == 0 || cuts[i-1] != tn.Offset+tn.Length {
			hs = nil
		}
		out[tn.Name] = hs
	}
	return out
}

// TestChunkerSameTensorsAcrossFormats: a tensor of at least minDataChunk
// bytes yields the same chunks in a torch zip, a safetensors file, a GGUF
// file and an npz (issue #26: exporting a torch.save checkpoint to
// safetensors must store almost nothing new). Smaller tensors are cut with
// the bytes around them, which differ between containers: they are saved
// alongside here so that their neighbours move the big ones around, but
// their chunks are not compared.
func TestChunkerSameTensorsAcrossFormats(t *testing.T) {
	f32 := func(seed uint64, bytes int) []byte { return randBytes(seed, bytes) }
	cases := []struct {
		name    string
		tensors []xTensor
	}{
		{"one", []xTensor{{"w", f32(1, 300<<10)}}},
		{"boundaries", []xTensor{
			{"min", f32(2, minDataChunk)},
			{"min+4", f32(3, minDataChunk+4)},
			{"edges", f32(4, edgeHead+edgeTail)},
			{"edges+4", f32(5, edgeHead+edgeTail+4)},
			{"64k+head", f32(6, 64<<10+edgeHead)},
			{"64k+edges", f32(7, 64<<10+edgeHead+edgeTail)},
			{"1m+edges+4", f32(8, 1<<20+edgeHead+edgeTail+4)},
			{"3m+68", f32(9, 3<<20+68)},
		}},
		{"state dict", []xTensor{ // GPT-2-like: small biases between big weights
			{"h.0.ln_1.weight", f32(10, 1024)},
			{"h.0.ln_1.bias", f32(11, 1024)},
			{"h.0.attn.c_attn.weight", f32(12, 256*768*4)},
			{"h.0.attn.c_attn.bias", f32(13, 768*4)},
			{"h.0.attn.c_proj.weight", f32(14, 256*256*4)},
			{"h.0.attn.c_proj.bias", f32(15, 1024)},
			{"h.0.mlp.c_fc.weight", f32(16, 256*1024*4)},
			{"h.0.mlp.c_fc.bias", f32(17, 1024*4)},
			{"step", f32(18, 4)},
			{"wpe.weight", f32(19, 64*256*4)},
		}},
	}
	for _, tc := range cases {
		files := containers(t, tc.tensors)
		for _, mc := range []int{4096, 64 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("%s/mc=%d", tc.name, mc), func(t *testing.T) {
				got := map[string]map[string][][32]byte{}
				for format, data := range files {
					cuts, ix := chunk(data, mc, 0)
					if ix.Format != format {
						t.Fatalf("%s: parsed as %q", format, ix.Format)
					}
					checkCuts(t, data, cuts, ix, mc)
					got[format] = tensorChunks(data, cuts, ix)
				}
				for _, x := range tc.tensors {
					if len(x.data) < minDataChunk {
						continue
					}
					want := got[fmtTorch][x.name]
					if want == nil {
						t.Fatalf("torch: tensor %s is not a run of whole chunks", x.name)
					}
					if n := len(segmentCuts(Segment{Length: int64(len(x.data))}, int64(mc))) - 1; len(want) != n {
						t.Fatalf("torch: tensor %s has %d chunks, want %d", x.name, len(want), n)
					}
					for format, m := range got {
						if !reflect.DeepEqual(m[x.name], want) {
							t.Errorf("%s: tensor %s (%d bytes) has other chunks than in torch: %d vs %d",
								format, x.name, len(x.data), len(m[x.name]), len(want))
						}
					}
				}
			})
		}
	}
}

// TestChunkerSameTensorsRealFiles: the same state dict saved by torch.save
// (torch 2.15: 64-byte aligned records, data descriptors) and by
// safetensors.save_file (testdata/gen_xformat.py) has the same tensors, by
// name, and each tensor of at least MinDataChunk bytes has the same chunks.
func TestChunkerSameTensorsRealFiles(t *testing.T) {
	pt, err := os.ReadFile(filepath.Join("testdata", "xformat.pt"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(filepath.Join("testdata", "xformat.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mc := range []int{4096, 16 << 10, 1 << 20} {
		cpt, ixpt := chunk(pt, mc, 0)
		cst, ixst := chunk(st, mc, 0)
		if ixpt.Format != fmtTorch || ixst.Format != fmtSafetensors {
			t.Fatalf("parsed as %q and %q", ixpt.Format, ixst.Format)
		}
		checkCuts(t, pt, cpt, ixpt, mc)
		checkCuts(t, st, cst, ixst, mc)
		hpt, hst := tensorChunks(pt, cpt, ixpt), tensorChunks(st, cst, ixst)
		if len(hpt) != 8 || len(hst) != len(hpt) {
			t.Fatalf("%d tensors in torch, %d in safetensors, want 8", len(hpt), len(hst))
		}
		own := 0
		for _, tn := range ixpt.Tensors {
			if tn.Length < MinDataChunk {
				continue
			}
			own++
			if hpt[tn.Name] == nil || !reflect.DeepEqual(hpt[tn.Name], hst[tn.Name]) {
				t.Errorf("mc %d: tensor %s (%d bytes): %d chunks in torch, %d in safetensors, not the same",
					mc, tn.Name, tn.Length, len(hpt[tn.Name]), len(hst[tn.Name]))
			}
		}
		if own != 5 {
			t.Fatalf("%d tensors of at least %d bytes, want 5", own, MinDataChunk)
		}
	}
}
