package object

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

func newTestCoder(t testing.TB) *Coder {
	t.Helper()
	c, err := NewCoder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type codecCase struct {
	name string
	data []byte
	hint Hint
}

func codecCases() []codecCase {
	const mib = 1 << 20
	sparse := tensortest.GaussBF16(mib/2, 0.02, 9)
	for i := 0; i < len(sparse); i += 2 {
		if i%20 != 0 {
			sparse[i], sparse[i+1] = 0, 0
		}
	}
	// fp32 weights that were bf16 (low half zero), and a ramp (arange).
	clean := tensortest.GaussF32(mib/4, 0.02, 10)
	for i := 0; i < len(clean); i += 4 {
		clean[i], clean[i+1] = 0, 0
	}
	ramp := make([]byte, 4*10000)
	for i := range 10000 {
		binary.LittleEndian.PutUint32(ramp[4*i:], math.Float32bits(float32(i)))
	}
	var cs []codecCase
	for _, h := range []Hint{{}, {ElemSize: 2}, {ElemSize: 4}, {ElemSize: 3}, {ElemSize: 8}} {
		for _, d := range []struct {
			name string
			data []byte
		}{
			{"empty", nil},
			{"one", []byte{7}},
			{"three", []byte{1, 2, 3}},
			{"tiny", tensortest.GaussBF16(7, 0.02, 1)},
			{"random", tensortest.PseudoRandom(300001, 2)},
			{"zeros", make([]byte, mib)},
			{"constant", bytes.Repeat([]byte{0x3c}, 65537)},
			{"text", bytes.Repeat([]byte("step 10 loss 0.123\n"), 5000)},
			{"bf16", tensortest.GaussBF16(mib/2, 0.02, 3)},
			{"bf16-odd", tensortest.GaussBF16(mib/2, 0.02, 4)[:mib-1]},
			{"bf16-small", tensortest.GaussBF16(1000, 0.02, 5)},
			{"fp16", tensortest.GaussF16(mib/2, 0.02, 6)},
			{"fp32", tensortest.GaussF32(mib/4, 0.02, 7)},
			{"fp32-odd", tensortest.GaussF32(mib/4, 0.02, 8)[:mib-3]},
			{"fp32-unit", tensortest.GaussF32(100000, 1, 11)},
			{"bf16-sparse", sparse},
			{"fp32-clean", clean},
			{"fp32-ramp", ramp},
		} {
			cs = append(cs, codecCase{fmt.Sprintf("%s/elem%d", d.name, h.ElemSize), d.data, h})
		}
	}
	return cs
}

// TestCodecRoundTrip: every kind of data under every hint decodes to itself,
// through the object layer, with its codec's payload intact.
func TestCodecRoundTrip(t *testing.T) {
	c := newTestCoder(t)
	for _, tc := range codecCases() {
		t.Run(tc.name, func(t *testing.T) {
			obj, codec := c.Encode(tc.data, tc.hint)
			got, err := c.Decode(Sum(tc.data), obj)
			if err != nil {
				t.Fatalf("%v: %v", codec, err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Fatalf("%v: round trip differs", codec)
			}
			if len(obj) > HeaderSize+len(tc.data) {
				t.Errorf("%v: object %d bytes for %d raw", codec, len(obj), len(tc.data))
			}
			t.Logf("%-9v ratio %.4f", codec, float64(len(obj))/float64(max(1, len(tc.data))))
		})
	}
}

// TestCodecChoice: the codec each kind of data gets.
func TestCodecChoice(t *testing.T) {
	c := newTestCoder(t)
	const mib = 1 << 20
	cases := []struct {
		name  string
		data  []byte
		hint  Hint
		codec Codec
		ratio float64 // upper bound on object/raw, 0: none
	}{
		{"bf16 hinted", tensortest.GaussBF16(mib/2, 0.02, 1), Hint{ElemSize: 2}, CodecByteGroup, 0.68},
		{"fp16 hinted", tensortest.GaussF16(mib/2, 0.02, 1), Hint{ElemSize: 2}, CodecByteGroup, 0.90},
		{"fp32 hinted", tensortest.GaussF32(mib/4, 0.02, 1), Hint{ElemSize: 4}, CodecByteGroup, 0.85},
		{"bf16 unhinted", tensortest.GaussBF16(mib/2, 0.02, 1), Hint{}, CodecZstd, 0.80},
		{"random hinted", tensortest.PseudoRandom(mib, 1), Hint{ElemSize: 2}, CodecRaw, 0},
		{"random unhinted", tensortest.PseudoRandom(mib, 1), Hint{}, CodecRaw, 0},
		{"zeros hinted", make([]byte, mib), Hint{ElemSize: 4}, CodecByteGroup, 0.001},
		{"text hinted", bytes.Repeat([]byte("step 10 loss 0.123\n"), 5000), Hint{ElemSize: 2}, CodecZstd, 0.01},
		{"tiny hinted", tensortest.GaussBF16(10, 0.02, 1), Hint{ElemSize: 2}, CodecRaw, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj, codec := c.Encode(tc.data, tc.hint)
			ratio := float64(len(obj)) / float64(len(tc.data))
			if codec != tc.codec {
				t.Errorf("codec %v, want %v (ratio %.4f)", codec, tc.codec, ratio)
			}
			if tc.ratio > 0 && ratio > tc.ratio {
				t.Errorf("ratio %.4f, want ≤ %.4f", ratio, tc.ratio)
			}
			t.Logf("%v ratio %.4f", codec, ratio)
		})
	}
}

// TestByteGroupPlaneMethods: each plane method appears where expected and
// round-trips, including a zstd plane.
func TestByteGroupPlaneMethods(t *testing.T) {
	c := newTestCoder(t)
	// bf16 with 90% exact zeros: the exponent plane is mostly one byte (zstd
	// tried), the low plane is mostly zero too.
	sparse := tensortest.GaussBF16(1<<19, 0.02, 3)
	for i := 0; i < len(sparse); i += 2 {
		if i%20 != 0 {
			sparse[i], sparse[i+1] = 0, 0
		}
	}
	clean := tensortest.GaussF32(1<<18, 0.02, 2) // bf16 weights saved as fp32
	for i := 0; i < len(clean); i += 4 {
		clean[i], clean[i+1] = 0, 0
	}
	// Values the Huffman code's sample misses: an exact zero (exponent 0,
	// far below the sample's range) and a huge value, at an odd position.
	outliers := tensortest.GaussBF16(1<<19, 0.02, 4)
	binary.LittleEndian.PutUint16(outliers[2*5001:], 0) // not in the sample (see sampleHistogram)
	binary.LittleEndian.PutUint16(outliers[2*400003:], tensortest.BF16Bits(3e38))
	cases := []struct {
		name    string
		data    []byte
		e       int
		methods []byte
	}{
		{"bf16", tensortest.GaussBF16(1<<19, 0.02, 1), 2, []byte{bgRaw, bgHuffman}},
		{"bf16-outliers", outliers, 2, []byte{bgRaw, bgHuffman}},
		{"fp32", tensortest.GaussF32(1<<18, 0.02, 1), 4, []byte{bgRaw, bgHuffman}}, // wide
		{"fp32-clean", clean, 4, []byte{bgRun, bgRun, bgRaw, bgHuffman}},
		{"zeros", make([]byte, 4096), 4, []byte{bgRun, bgRun, bgRun, bgRun}},
		{"sparse", sparse, 2, []byte{bgZstd, bgZstd}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := c.appendByteGroup(nil, tc.data, tc.e)
			if !ok {
				t.Fatal("not byte-grouped")
			}
			for j, m := range tc.methods {
				if got := p[2+5*j]; got != m {
					t.Errorf("plane %d method %d, want %d", j, got, m)
				}
			}
			out := make([]byte, len(tc.data))
			if err := c.decodeByteGroup(out, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, tc.data) {
				t.Fatal("round trip differs")
			}
		})
	}
}

// TestByteGroupTransforms checks split/merge against a byte loop on every
// length and both rotations.
func TestByteGroupTransforms(t *testing.T) {
	raw := tensortest.PseudoRandom(4*67, 3)
	for n := range 67 {
		for _, rot := range []bool{false, true} {
			p := [4][]byte{make([]byte, n), make([]byte, n), make([]byte, n), make([]byte, n)}
			split2(raw, p[0], p[1], rot)
			for i := range n {
				v := binary.LittleEndian.Uint16(raw[2*i:])
				if rot {
					v = v<<1 | v>>15
				}
				if p[0][i] != byte(v) || p[1][i] != byte(v>>8) {
					t.Fatalf("split2 n=%d rot=%v element %d", n, rot, i)
				}
			}
			out := make([]byte, 2*n)
			merge2(out, p[0], p[1], rot)
			if !bytes.Equal(out, raw[:2*n]) {
				t.Fatalf("merge2 n=%d rot=%v", n, rot)
			}
			split4(raw, p[0], p[1], p[2], p[3], rot)
			for i := range n {
				v := binary.LittleEndian.Uint32(raw[4*i:])
				if rot {
					v = v<<1 | v>>31
				}
				for j := range 4 {
					if p[j][i] != byte(v>>(8*j)) {
						t.Fatalf("split4 n=%d rot=%v element %d plane %d", n, rot, i, j)
					}
				}
			}
			out = make([]byte, 4*n)
			merge4(out, p[0], p[1], p[2], p[3], rot)
			if !bytes.Equal(out, raw[:4*n]) {
				t.Fatalf("merge4 n=%d rot=%v", n, rot)
			}
			A := make([]byte, 3*n)
			split4wide(raw, A, p[3], rot)
			for i := range n {
				if A[3*i] != p[0][i] || A[3*i+1] != p[1][i] || A[3*i+2] != p[2][i] {
					t.Fatalf("split4wide n=%d rot=%v element %d", n, rot, i)
				}
			}
			clear(out)
			merge4wide(out, A, p[3], rot)
			if !bytes.Equal(out, raw[:4*n]) {
				t.Fatalf("merge4wide n=%d rot=%v", n, rot)
			}
		}
	}
}

// TestHuffmanRoundTrip codes planes of many shapes: sizes around the stream
// and fast-loop thresholds, skewed and flat histograms, symbol ranges wider
// than the pair window.
func TestHuffmanRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var enc hufEnc
	var dec hufDec
	gens := map[string]func(n int) []byte{
		"geometric": func(n int) []byte {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(100 + min(60, int(r.ExpFloat64()*2)))
			}
			return p
		},
		"wide": func(n int) []byte { // range > 128: single-symbol encoder
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.IntN(3)) * 120
			}
			return p
		},
		"two": func(n int) []byte {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.IntN(2))
			}
			p[0], p[n-1] = 0, 1
			return p
		},
		"deep": func(n int) []byte { // Fibonacci-like counts force length limiting
			p := make([]byte, 0, n)
			a, b := 1, 1
			for s := 0; len(p) < n; s++ {
				for range min(a, n-len(p)) {
					p = append(p, byte(s))
				}
				a, b = b, a+b
			}
			r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
			return p
		},
		"bf16exp": func(n int) []byte {
			d := tensortest.GaussBF16(n, 0.02, 7)
			p := make([]byte, n)
			q := make([]byte, n)
			split2(d, q, p, true)
			return p
		},
	}
	for name, gen := range gens {
		for _, n := range []int{2, 3, 7, 8, 9, 47, 48, 49, 100, 1000, hufStreamMin - 1, hufStreamMin, hufStreamMin + 3, 100003, 1 << 19} {
			p := gen(n)
			distinct, lo, hi, _ := enc.histogram(p)
			if distinct < 2 {
				continue
			}
			enc.buildLengths()
			bound := hufSectionSize(n, lo, hi, enc.encodedBits())
			sec, _ := enc.appendHuffman([]byte{0xAA}, p, lo, hi, false)
			if sec[0] != 0xAA {
				t.Fatal("appendHuffman changed dst's prefix")
			}
			sec = sec[1:]
			if len(sec) > bound {
				t.Errorf("%s n=%d: section %d bytes, bound %d", name, n, len(sec), bound)
			}
			out := make([]byte, n)
			if err := dec.decodeHuffman(out, sec); err != nil {
				t.Fatalf("%s n=%d: %v", name, n, err)
			}
			if !bytes.Equal(out, p) {
				t.Fatalf("%s n=%d: round trip differs", name, n)
			}
		}
	}
}

// TestHuffmanWindowCheck: coding with a code made from a sample notices bytes
// outside the code's window, below and above it, in the 8-byte loop and in
// the tail.
func TestHuffmanWindowCheck(t *testing.T) {
	var enc hufEnc
	base := make([]byte, 1000)
	for i := range base {
		base[i] = byte(100 + i%20)
	}
	for _, tc := range []struct {
		pos int
		val byte
		ok  bool
	}{{-1, 0, true}, {5, 99, false}, {5, 0, false}, {17, 120, false}, {17, 255, false}, {997, 99, false}, {997, 130, false}, {500, 119, true}} {
		p := bytes.Clone(base)
		if tc.pos >= 0 {
			p[tc.pos] = tc.val
		}
		enc.histogram(base)
		enc.buildLengths()
		out, ok := enc.appendHuffman([]byte{1, 2}, p, 100, 119, true)
		if ok != tc.ok {
			t.Errorf("byte %d at %d: ok %v", tc.val, tc.pos, ok)
		}
		if !ok && !bytes.Equal(out, []byte{1, 2}) {
			t.Errorf("byte %d at %d: dst changed on failure", tc.val, tc.pos)
		}
		if ok {
			var dec hufDec
			got := make([]byte, len(p))
			if err := dec.decodeHuffman(got, out[2:]); err != nil || !bytes.Equal(got, p) {
				t.Errorf("byte %d at %d: round trip: %v", tc.val, tc.pos, err)
			}
		}
	}
}

// TestCodecCorruption: damaging a byte of any codec's payload (with the
// payload CRC fixed up, so that the codec itself sees the damage) gives
// ErrCorrupt (a decode error, or bytes whose hash is not the chunk's name),
// never a panic or wrong bytes. A few bits do not matter to a decoder (the
// transform of an all-zero chunk, spare bits of a zstd frame): those decode to
// the right bytes, which the hash check confirms.
func TestCodecCorruption(t *testing.T) {
	c := newTestCoder(t)
	sparse := tensortest.GaussBF16(1<<16, 0.02, 3)
	for i := 0; i < len(sparse); i += 2 {
		if i%20 != 0 {
			sparse[i], sparse[i+1] = 0, 0
		}
	}
	cases := []codecCase{
		{"zstd", bytes.Repeat([]byte("step 10 loss 0.123\n"), 500), Hint{}},
		{"raw", tensortest.PseudoRandom(5000, 1), Hint{}},
		{"bg-bf16", tensortest.GaussBF16(1<<15, 0.02, 1), Hint{ElemSize: 2}},
		{"bg-fp32-odd", tensortest.GaussF32(1<<14, 0.02, 1)[:1<<16-1], Hint{ElemSize: 4}},
		{"bg-zstd-planes", sparse, Hint{ElemSize: 2}},
		{"bg-runs", make([]byte, 4096), Hint{ElemSize: 2}},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj, codec := c.Encode(tc.data, tc.hint)
			t.Logf("codec %v, %d bytes", codec, len(obj))
			id := Sum(tc.data)
			payload := len(obj) - HeaderSize
			positions := []int{}
			for i := range min(payload, 200) { // the sub-headers
				positions = append(positions, HeaderSize+i)
			}
			for range 150 {
				positions = append(positions, HeaderSize+r.IntN(payload))
			}
			tried, harmless := 0, 0
			for _, pos := range positions {
				for _, flip := range []byte{1, 0x80, 0xff} {
					bad := bytes.Clone(obj)
					bad[pos] ^= flip
					fixCRC(bad)
					got, err := c.Decode(id, bad)
					switch {
					case err == nil && bytes.Equal(got, tc.data):
						harmless++ // a bit the decoder does not need
					case !errors.Is(err, ErrCorrupt):
						t.Fatalf("flip %#x at %d: %v (%d bytes)", flip, pos, err, len(got))
					}
					tried++
				}
			}
			t.Logf("%d of %d damaged payloads decoded to the right bytes anyway", harmless, tried)
			if harmless > tried/10 {
				t.Errorf("%d of %d damaged payloads went unnoticed by the decoder", harmless, tried)
			}
			// Truncated and extended payloads.
			for _, l := range []int{HeaderSize, HeaderSize + 1, max(HeaderSize, len(obj)/2), len(obj) - 1} {
				bad := bytes.Clone(obj[:l])
				binary.LittleEndian.PutUint32(bad[12:], uint32(l-HeaderSize))
				fixCRC(bad)
				if _, err := c.Decode(id, bad); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("truncated to %d: %v", l, err)
				}
			}
			bad := append(bytes.Clone(obj), 0)
			binary.LittleEndian.PutUint32(bad[12:], uint32(len(bad)-HeaderSize))
			fixCRC(bad)
			if _, err := c.Decode(id, bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("extended: %v", err)
			}
		})
	}
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// fixCRC recomputes an object's payload checksum.
func fixCRC(obj []byte) {
	binary.LittleEndian.PutUint32(obj[16:], crc32c(obj[HeaderSize:]))
}

// TestOldObjectsDecode: objects of codecs 0 and 1 written the way the first
// version of the store wrote them (zstd without literal entropy coding) still
// decode.
func TestOldObjectsDecode(t *testing.T) {
	c := newTestCoder(t)
	old, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true), zstd.WithEncoderCRC(false))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	text := bytes.Repeat([]byte("step 10 loss 0.123\n"), 5000)
	for _, tc := range []struct {
		codec   Codec
		raw     []byte
		payload []byte
	}{
		{CodecRaw, tensortest.PseudoRandom(1000, 1), tensortest.PseudoRandom(1000, 1)},
		{CodecRaw, nil, nil},
		{CodecZstd, text, old.EncodeAll(text, nil)},
		{CodecZstd, make([]byte, 1<<20), old.EncodeAll(make([]byte, 1<<20), nil)},
	} {
		h := Header{Codec: tc.codec, RawLen: uint32(len(tc.raw)), PayloadLen: uint32(len(tc.payload)), CRC: crc32c(tc.payload)}
		obj := append(h.marshal(), tc.payload...)
		got, err := c.Decode(Sum(tc.raw), obj)
		if err != nil || !bytes.Equal(got, tc.raw) {
			t.Fatalf("codec %v: %v", tc.codec, err)
		}
	}
}

// TestCodecConcurrent encodes and decodes from several goroutines sharing one
// Coder (run with -race).
func TestCodecConcurrent(t *testing.T) {
	c := newTestCoder(t)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 6 {
				data := tensortest.GaussF32(1<<14+g*7+i, 0.02, uint64(g*10+i))
				h := Hint{ElemSize: 4}
				if i%2 == 1 {
					data, h = tensortest.GaussBF16(1<<15+i, 0.02, uint64(g)), Hint{ElemSize: 2}
				}
				obj, _ := c.Encode(data, h)
				got, err := c.Decode(Sum(data), obj)
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("goroutine %d/%d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzDecodePayload feeds arbitrary payloads of every codec to the decoder: it
// must return an error or exactly rawLen bytes, never panic.
func FuzzDecodePayload(f *testing.F) {
	c, err := NewCoder()
	if err != nil {
		f.Fatal(err)
	}
	for _, tc := range []codecCase{
		{"bf16", tensortest.GaussBF16(3000, 0.02, 1), Hint{ElemSize: 2}},
		{"fp32", tensortest.GaussF32(1100, 0.02, 1)[:4399], Hint{ElemSize: 4}},
		{"zeros", make([]byte, 600), Hint{ElemSize: 2}},
		{"text", bytes.Repeat([]byte("abc"), 100), Hint{}},
	} {
		obj, codec := c.Encode(tc.data, tc.hint)
		f.Add(uint8(codec), uint16(len(tc.data)), obj[HeaderSize:])
	}
	f.Fuzz(func(t *testing.T, codec uint8, rawLen uint16, payload []byte) {
		out, err := c.decode(Codec(codec%4), payload, int(rawLen))
		if err == nil && len(out) != int(rawLen) {
			t.Fatalf("decoded %d bytes, want %d", len(out), rawLen)
		}
	})
}

// FuzzByteGroupRoundTrip encodes arbitrary bytes with every hint and checks
// that they decode to themselves.
func FuzzByteGroupRoundTrip(f *testing.F) {
	c, err := NewCoder()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tensortest.GaussBF16(500, 0.02, 1), uint8(2))
	f.Add(tensortest.GaussF32(300, 1, 1), uint8(4))
	f.Add(bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 300), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, e uint8) {
		obj, codec := c.Encode(data, Hint{ElemSize: int(e % 5)})
		got, err := c.Decode(Sum(data), obj)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%v: %v", codec, err)
		}
	})
}

// TestRawObjectCRC: the CRC-32C of a standalone raw object's payload is not
// computed by a hashed decode (the hash covers every payload byte), so a
// damaged payload is found by the hash, a damaged CRC field alone decodes
// to the right bytes, and both are still found by CheckCRC and by
// DecodeBase (which does not hash). A coded payload keeps its CRC.
func TestRawObjectCRC(t *testing.T) {
	c := newTestCoder(t)
	random := tensortest.PseudoRandom(5000, 7)
	text := bytes.Repeat([]byte("step 10 loss 0.123\n"), 500)
	cases := []struct {
		name      string
		data      []byte
		codec     Codec
		pos       int  // byte to flip
		decodeOK  bool // Decode still returns the right bytes
		wantInMsg string
	}{
		{"raw payload", random, CodecRaw, HeaderSize + 1234, false, "content hash"},
		{"raw CRC field", random, CodecRaw, 16, true, ""},
		{"zstd payload", text, CodecZstd, HeaderSize + 7, false, "checksum"},
		{"zstd CRC field", text, CodecZstd, 16, false, "checksum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj, codec := c.Encode(tc.data, Hint{})
			if codec != tc.codec {
				t.Fatalf("codec %v, want %v", codec, tc.codec)
			}
			id := Sum(tc.data)
			if _, err := c.Decode(id, obj); err != nil {
				t.Fatalf("sound object: %v", err)
			}
			bad := bytes.Clone(obj)
			bad[tc.pos] ^= 0x10
			got, err := c.Decode(id, bad)
			switch {
			case tc.decodeOK && (err != nil || !bytes.Equal(got, tc.data)):
				t.Fatalf("Decode: %v, right bytes %v", err, bytes.Equal(got, tc.data))
			case !tc.decodeOK && !errors.Is(err, ErrCorrupt):
				t.Fatalf("Decode: %v, want ErrCorrupt", err)
			case !tc.decodeOK && !strings.Contains(err.Error(), tc.wantInMsg):
				t.Fatalf("Decode: %v, want %q", err, tc.wantInMsg)
			}
			if err := CheckCRC(id, bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("CheckCRC: %v, want ErrCorrupt", err)
			}
			if err := CheckCRC(id, obj); err != nil {
				t.Fatalf("CheckCRC of the sound object: %v", err)
			}
			if _, err := c.DecodeBase(id, bad, nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeBase: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestSmallInputEncoder: inputs up to smallInput go to an encoder of their
// own, so that a small file's commit does not queue behind a large chunk's
// encode (zenc runs one at a time); it encodes them as small as zenc does,
// and its frames decode to the input.
func TestSmallInputEncoder(t *testing.T) {
	c := newTestCoder(t)
	if c.zstdFor(4<<10) == c.zstdFor(4<<20) || c.zstdFor(smallInput) != c.zsmall || c.zstdFor(smallInput+1) != c.zenc {
		t.Fatal("small and large inputs share one encoder")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	noise := make([]byte, 16<<10)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	cases := []struct {
		name     string
		raw      []byte
		wantZstd bool
	}{
		{"text", []byte(strings.Repeat(`{"step": 100, "loss": 2.31},`, 140)), true},
		{"random", noise, false},
		{"at the limit", bytes.Repeat([]byte("abcdefgh"), smallInput/8), true},
	}
	for _, tc := range cases {
		small := c.zsmall.EncodeAll(tc.raw, nil)
		large := c.zenc.EncodeAll(tc.raw, nil)
		if len(small) > len(large)+16 { // a frame header may differ by some bytes
			t.Errorf("%s: %d bytes from the small-input encoder, %d from the other", tc.name, len(small), len(large))
		}
		obj, codec := c.Encode(tc.raw, Hint{})
		if (codec == CodecZstd) != tc.wantZstd {
			t.Errorf("%s: codec %v, want zstd %v", tc.name, codec, tc.wantZstd)
		}
		got, err := c.Decode(Sum(tc.raw), obj)
		if err != nil || !bytes.Equal(got, tc.raw) {
			t.Fatalf("%s: decode: %v (equal %v)", tc.name, err, bytes.Equal(got, tc.raw))
		}
	}
}
