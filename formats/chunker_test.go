package formats

import (
	"bytes"
	"crypto/sha256"
	"reflect"
	"strings"
	"testing"
)

// chunk feeds data to a new Chunker in pieces of feed bytes (all at once if
// feed ≤ 0) and returns all cuts and the learned index.
func chunk(data []byte, maxChunk, feed int) ([]int64, *Index) {
	c := NewChunker(maxChunk)
	var cuts []int64
	if feed <= 0 {
		feed = len(data) + 1
	}
	for p := data; len(p) > 0; {
		n := min(feed, len(p))
		cuts = append(cuts, c.Write(p[:n])...)
		p = p[n:]
	}
	rest, ix := c.Close()
	return append(cuts, rest...), ix
}

// checkCuts verifies the cut invariants: increasing, ending at the size, no
// chunk longer than its limit, and in a known format every data segment
// starts and ends at cuts and is cut every maxChunk bytes from its start.
func checkCuts(t testing.TB, data []byte, cuts []int64, ix *Index, maxChunk int) {
	t.Helper()
	if len(data) == 0 {
		if len(cuts) != 0 {
			t.Fatalf("cuts %v for an empty file", cuts)
		}
		return
	}
	if cuts[len(cuts)-1] != int64(len(data)) {
		t.Fatalf("last cut %d, size %d", cuts[len(cuts)-1], len(data))
	}
	isCut := map[int64]bool{0: true}
	prev := int64(0)
	limit := int64(max(maxChunk, cdcMax))
	for _, c := range cuts {
		if c <= prev || c-prev > limit {
			t.Fatalf("bad chunk [%d,%d) (limit %d)", prev, c, limit)
		}
		isCut[c] = true
		prev = c
	}
	if ix.Format == "" {
		return
	}
	for _, s := range ix.Segments {
		if s.Kind != KindData || s.Length < minDataChunk {
			continue // small segments are CDC-cut with their neighbours
		}
		want := segmentCuts(s, int64(maxChunk))
		for _, p := range want {
			if !isCut[p] {
				t.Fatalf("data segment %+v: no cut at %d (want %v)", s, p, want)
			}
		}
		inside := map[int64]bool{}
		for _, p := range want {
			inside[p] = true
		}
		for c := range isCut {
			if c > s.Offset && c < s.Offset+s.Length && !inside[c] {
				t.Fatalf("data segment %+v: stray cut at %d", s, c)
			}
		}
	}
}

// segmentCuts returns the cuts a data segment must have, its ends included:
// every maxChunk bytes from its start; for a segment longer than both edges
// (and maxChunk above the head edge), whatever the format, its first edgeHead
// and last edgeTail bytes are chunks of their own and the pieces between
// start after the head.
func segmentCuts(s Segment, maxChunk int64) []int64 {
	start, end := s.Offset, s.Offset+s.Length
	cuts := []int64{start}
	p, tail := start, end
	if maxChunk > edgeHead && s.Length > edgeHead+edgeTail {
		p, tail = start+edgeHead, end-edgeTail
		cuts = append(cuts, p)
	}
	for p < tail {
		p = min(p+maxChunk, tail)
		cuts = append(cuts, p)
	}
	if tail != end {
		cuts = append(cuts, end)
	}
	return cuts
}

func TestChunkerMatchesParse(t *testing.T) {
	for _, s := range allSamples(t) {
		t.Run(s.name, func(t *testing.T) {
			want, err := Parse(bytes.NewReader(s.data), int64(len(s.data)))
			if err != nil {
				t.Fatal(err)
			}
			for _, mc := range []int{4096, 1 << 20} {
				cuts, ix := chunk(s.data, mc, 0)
				if !reflect.DeepEqual(ix, want) {
					t.Fatalf("maxChunk %d: Chunker index\n%+v\nParse index\n%+v", mc, ix, want)
				}
				checkCuts(t, s.data, cuts, ix, mc)
			}
		})
	}
}

// The cuts must not depend on how the stream is split into writes.
func TestChunkerWriteSizes(t *testing.T) {
	samples := append(allSamples(t), sample{name: "random", data: randBytes(99, 3<<20)})
	for _, s := range samples {
		t.Run(s.name, func(t *testing.T) {
			const mc = 64 << 10
			want, wantIx := chunk(s.data, mc, 0)
			feeds := []int{1, 7, 4096, 100003}
			if len(s.data) > 1<<20 {
				feeds = feeds[1:] // 1-byte writes of megabytes are slow under -race
			}
			for _, feed := range feeds {
				got, ix := chunk(s.data, mc, feed)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("feed %d: %d cuts differ from whole-file writes (%d cuts)", feed, len(got), len(want))
				}
				if !reflect.DeepEqual(ix, wantIx) {
					t.Fatalf("feed %d: index differs", feed)
				}
			}
		})
	}
}

// chunkHashes returns the SHA-256 of every chunk.
func chunkHashes(data []byte, cuts []int64) map[[32]byte]bool {
	m := map[[32]byte]bool{}
	prev := int64(0)
	for _, c := range cuts {
		m[sha256.Sum256(data[prev:c])] = true
		prev = c
	}
	return m
}

// bigSafetensors builds a file whose "big" tensor is preceded by a tensor
// of n elements, so the big tensor lands at different offsets.
func bigSafetensors(n int, big []byte) []byte {
	return buildSafetensors([]stTensor{
		{"big", "F16", []int64{int64(len(big) / 2)}, big},
		{"pre", "F64", []int64{int64(n)}, randBytes(uint64(n), 8*n)},
	}, nil)
}

func TestChunkerShiftedTensor(t *testing.T) {
	const mc = 64 << 10
	big := randBytes(42, 1<<20+1000)
	a, b := bigSafetensors(10, big), bigSafetensors(3333, big)
	ca, ixa := chunk(a, mc, 0)
	cb, ixb := chunk(b, mc, 0)
	if ixa.Format != fmtSafetensors || ixb.Format != fmtSafetensors {
		t.Fatal("not parsed")
	}
	off := func(ix *Index) int64 {
		for _, tn := range ix.Tensors {
			if tn.Name == "big" {
				return tn.Offset
			}
		}
		return -1
	}
	if off(ixa) == off(ixb) {
		t.Fatal("test setup: the big tensor did not move")
	}
	// Every chunk of the big tensor in a must be a chunk of b.
	hb := chunkHashes(b, cb)
	prev, shared := int64(0), 0
	for _, c := range ca {
		if prev >= off(ixa) && c <= off(ixa)+int64(len(big)) {
			if !hb[sha256.Sum256(a[prev:c])] {
				t.Fatalf("chunk [%d,%d) of the tensor is not in the shifted file", prev, c)
			}
			shared++
		}
		prev = c
	}
	if want := len(segmentCuts(Segment{Length: int64(len(big))}, mc)) - 1; shared != want {
		t.Fatalf("%d tensor chunks, want %d", shared, want)
	}
}

func TestChunkerChangeInsideTensor(t *testing.T) {
	const mc = 64 << 10
	for _, s := range builtSamples(t) {
		if s.format == "" || len(s.tensors) == 0 {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			ix, err := Parse(bytes.NewReader(s.data), int64(len(s.data)))
			if err != nil {
				t.Fatal(err)
			}
			var target Tensor
			for _, tn := range ix.Tensors {
				if tn.Length > target.Length {
					target = tn
				}
			}
			mod := bytes.Clone(s.data)
			pos := target.Offset + target.Length/2
			mod[pos] ^= 0xff
			ca, _ := chunk(s.data, mc, 0)
			cb, _ := chunk(mod, mc, 0)
			if !reflect.DeepEqual(ca, cb) {
				t.Fatal("a changed byte inside a tensor moved cuts")
			}
			prev := int64(0)
			for _, c := range ca {
				same := bytes.Equal(s.data[prev:c], mod[prev:c])
				if inside := prev <= pos && pos < c; same == inside {
					t.Fatalf("chunk [%d,%d): changed=%v, contains the change=%v", prev, c, !same, inside)
				}
				prev = c
			}
		})
	}
}

func TestChunkerCDCResync(t *testing.T) {
	data := randBytes(7, 8<<20)
	ins := append(append(bytes.Clone(data[:3<<20]), randBytes(8, 100)...), data[3<<20:]...)
	del := append(bytes.Clone(data[:5<<20]), data[5<<20+777:]...)
	ca, _ := chunk(data, 1<<20, 0)
	ha := chunkHashes(data, ca)
	if avg := len(data) / len(ca); avg < 20<<10 || avg > 60<<10 {
		t.Errorf("average chunk %d bytes, want about 32 KiB", avg)
	}
	for name, b := range map[string][]byte{"insert": ins, "delete": del} {
		cb, _ := chunk(b, 1<<20, 0)
		hb := chunkHashes(b, cb)
		newChunks := 0
		for h := range hb {
			if !ha[h] {
				newChunks++
			}
		}
		if newChunks > 5 {
			t.Errorf("%s: %d of %d chunks are new, want ≤ 5", name, newChunks, len(hb))
		}
	}
}

func TestChunkerEmptyAndTiny(t *testing.T) {
	for _, data := range [][]byte{nil, {1}, []byte("PK\x03\x04"), []byte("GGUF"), []byte(npyMagic)} {
		cuts, ix := chunk(data, 0, 0)
		checkCuts(t, data, cuts, ix, defaultMaxChunk)
		if ix.Format != "" {
			t.Fatalf("%q: format %q", data, ix.Format)
		}
	}
}

// The Chunker buffers headers, never tensor data.
func TestChunkerMemory(t *testing.T) {
	big := randBytes(3, 64<<20)
	data := bigSafetensors(10, big)
	c := NewChunker(1 << 20)
	for p := data; len(p) > 0; {
		n := min(1<<20, len(p))
		c.Write(p[:n])
		p = p[n:]
		if cap(c.buf) > 64<<10 {
			t.Fatalf("pending buffer holds %d bytes", cap(c.buf))
		}
	}
	if _, ix := c.Close(); ix.Format != fmtSafetensors {
		t.Fatal("not parsed")
	}
}

// TestChunkerCutTypes: chunks of a tensor carry its dtype, others none.
func TestChunkerCutTypes(t *testing.T) {
	data := randBytes(3, 3<<20+100)
	sample := buildSafetensors([]stTensor{
		{name: "a", dtype: "BF16", shape: []int64{int64(len(data)) / 2}, data: data},
	}, nil)
	c := NewChunker(1 << 20)
	var cuts []Cut
	for off := 0; off < len(sample); off += 100000 {
		cuts = append(cuts, c.WriteCuts(sample[off:min(off+100000, len(sample))])...)
	}
	rest, ix := c.CloseCuts()
	cuts = append(cuts, rest...)
	if ix.Format != "safetensors" {
		t.Fatalf("format %q", ix.Format)
	}
	data0 := ix.Tensors[0].Offset
	prev := int64(0)
	for _, k := range cuts {
		inData := prev >= data0
		if want := map[bool]string{true: "bf16", false: ""}[inData]; k.DType != want {
			t.Errorf("chunk [%d,%d): dtype %q, want %q", prev, k.End, k.DType, want)
		}
		prev = k.End
	}
}

// hugeHeaderSamples returns files whose header (safetensors JSON, torch
// data.pkl, GGUF KVs) is larger than a stream may hold uncut, with the
// tensor each must still index.
func hugeHeaderSamples(t testing.TB, headerBytes int) []sample {
	blob := strings.Repeat("x", headerBytes)
	w0 := f32s(21, 3000)
	st := buildSafetensors([]stTensor{{"w", "F32", []int64{3000}, w0}}, map[string]string{"blob": blob})

	var w pkw
	w.op(0x80, 2).global("collections", "OrderedDict").op(')', 'R', '(')
	w.str("blob").str(blob)
	w.str("w").tensor(ptTensor{"w", "0", "FloatStorage", "", 3000, 0, []int64{3000}, []int64{1}})
	w.op('u', '.')
	pt := buildTorchZip(torchRecords("archive", w.Bytes(), []zipMember{{"0", w0}}))

	gg := buildGGUF([]ggufKV{{"blob", blob}}, []ggufTensor{{"w", 0, []uint64{3000}, w0}}, 32)
	want := map[string]wantTensor{"w": {dtype: "f32", shape: []int64{3000}, bytes: w0}}
	return []sample{{"safetensors", st, fmtSafetensors, want}, {"torch", pt, fmtTorch, want}, {"gguf", gg, fmtGGUF, want}}
}

// TestChunkerHugeHeaderLag: headers of any legal size stream through. A
// writer that may hold only so many uncut bytes (fusefs's stream) must
// never wait for a cut the Chunker makes only after the whole header: the
// uncut tail stays within MaxLag after every Write, and the file is still
// indexed and cut as when written at once.
func TestChunkerHugeHeaderLag(t *testing.T) {
	const mc, feed = 1 << 20, 4 << 20 // fusefs feeds 4 MiB at a time
	for _, s := range hugeHeaderSamples(t, 40<<20) {
		t.Run(s.name, func(t *testing.T) {
			c := NewChunker(mc)
			var cuts []int64
			last, written := int64(0), int64(0)
			for p := s.data; len(p) > 0; {
				n := min(feed, len(p))
				got := c.Write(p[:n])
				p, written = p[n:], written+int64(n)
				if len(got) > 0 {
					last = got[len(got)-1]
				}
				if lag := written - last; lag > MaxLag(mc) {
					t.Fatalf("at %d bytes written the last cut is at %d: lag %d > MaxLag %d", written, last, lag, MaxLag(mc))
				}
				cuts = append(cuts, got...)
			}
			rest, ix := c.Close()
			cuts = append(cuts, rest...)
			if ix.Format != s.format {
				t.Fatalf("format %q, want %q", ix.Format, s.format)
			}
			checkTensors(t, s.data, ix, s.tensors)
			checkCuts(t, s.data, cuts, ix, mc)
			if whole, _ := chunk(s.data, mc, 0); !reflect.DeepEqual(cuts, whole) {
				t.Fatalf("%d cuts differ from whole-file writes (%d cuts)", len(cuts), len(whole))
			}
		})
	}
}

// TestChunkerTorchEdges: in a torch zip, each storage record's first 8 KiB
// and last 4 KiB are chunks of their own, so the pages around a local header
// (what torch.load reads to find each record) never share a chunk with the
// record's bulk; and the cuts follow the record, not the file offset, so the
// same storage at another offset still dedupes.
func TestChunkerTorchEdges(t *testing.T) {
	const mc = 64 << 10
	big := randBytes(7, 200<<10+64)
	build := func(pad int) []byte {
		var pts []ptTensor
		var sts []zipMember
		if pad > 0 {
			pts = append(pts, ptTensor{"pad", "p", "ByteStorage", "", int64(pad), 0, []int64{int64(pad)}, []int64{1}})
			sts = append(sts, zipMember{"p", randBytes(8, pad)})
		}
		for i, key := range []string{"0", "1", "2"} {
			d := big
			if i > 0 {
				d = randBytes(uint64(10+i), len(big))
			}
			pts = append(pts, ptTensor{"t" + key, key, "ByteStorage", "", int64(len(d)), 0, []int64{int64(len(d))}, []int64{1}})
			sts = append(sts, zipMember{key, d})
		}
		return buildTorchZip(torchRecords("archive", stateDictPickle(pts), sts))
	}
	a, b := build(0), build(5000)
	for _, data := range [][]byte{a, b} {
		cuts, ix := chunk(data, mc, 4093)
		if ix.Format != fmtTorch {
			t.Fatal("not parsed as torch")
		}
		checkCuts(t, data, cuts, ix, mc)
		starts := map[int64]bool{0: true}
		for _, c := range cuts {
			starts[c] = true
		}
		for _, tn := range ix.Tensors {
			if tn.Length != int64(len(big)) {
				continue
			}
			off, end := tn.Offset, tn.Offset+tn.Length
			for _, p := range []int64{off, off + edgeHead, end - edgeTail, end} {
				if !starts[p] {
					t.Errorf("tensor %s [%d,%d): no cut at %d", tn.Name, off, end, p)
				}
			}
		}
	}
	ca, ixa := chunk(a, mc, 0)
	cb, _ := chunk(b, mc, 0)
	hb := chunkHashes(b, cb)
	var t0 Tensor
	for _, tn := range ixa.Tensors {
		if tn.Name == "t0" {
			t0 = tn
		}
	}
	prev, shared := int64(0), 0
	for _, c := range ca {
		if prev >= t0.Offset && c <= t0.Offset+t0.Length {
			if !hb[sha256.Sum256(a[prev:c])] {
				t.Fatalf("chunk [%d,%d) of t0 is not in the shifted file", prev, c)
			}
			shared++
		}
		prev = c
	}
	if want := 2 + (len(big)-edgeHead-edgeTail+mc-1)/mc; shared != want {
		t.Fatalf("t0 has %d chunks, want %d", shared, want)
	}
}

// A file cut by content alone keeps its cuts when it grows: a Chunker started
// at any of its cuts but the last (NewContentChunker) cuts what follows as
// NewChunker does over the whole file, old bytes and appended ones. Files in
// a known format are not cut by content alone.
func TestContentChunkerResumesAtACut(t *testing.T) {
	old := randBytes(11, 3<<20)
	old = append([]byte("step,loss\n"), old...) // text-like head: no format
	grown := append(bytes.Clone(old), randBytes(12, 700<<10)...)
	if !CutsByContent(old[:16]) {
		t.Fatal("a CSV-like head is not cut by content alone")
	}
	oldCuts, _ := chunk(old, 1<<20, 0)
	full, fullIx := chunk(grown, 1<<20, 0)
	for _, i := range []int{0, len(oldCuts) / 2, len(oldCuts) - 2} {
		from := oldCuts[i]
		for _, feed := range []int{0, 4096, 100_000} {
			c := NewContentChunker(1 << 20)
			var rel []int64
			for p := grown[from:]; len(p) > 0; {
				n := len(p)
				if feed > 0 {
					n = min(feed, n)
				}
				rel = append(rel, c.Write(p[:n])...)
				p = p[n:]
			}
			rest, ix := c.Close()
			rel = append(rel, rest...)
			got := append([]int64(nil), oldCuts[:i+1]...)
			for _, r := range rel {
				got = append(got, from+r)
			}
			if !reflect.DeepEqual(got, full) {
				t.Fatalf("resumed at cut %d (%d), fed %d: %d cuts, want the whole file's %d", i, from, feed, len(got), len(full))
			}
			if ix.Format != "" || fullIx.Format != "" {
				t.Fatalf("formats %q and %q, want unknown", ix.Format, fullIx.Format)
			}
		}
	}
	for _, head := range [][]byte{
		[]byte("PK\x03\x04rest-of-zip"), []byte("GGUF\x03\x00\x00\x00\x00\x00"), []byte(npyMagic + "\x01\x00vv"),
		[]byte("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}"), []byte("\x80\x04\x95xxxxxxxx"), []byte(`{"learner":{}}`),
		[]byte("short"),
	} {
		if CutsByContent(head) {
			t.Errorf("%q is said to be cut by content alone", head)
		}
	}
}
