package cas

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func TestDeltaTransformsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specials32 := []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00001, 1, 0xffffffff, 0x7fffffff}
	for _, tr := range []deltaTransform{deltaXOR, deltaSub} {
		for _, elem := range []int{2, 4} {
			for _, n := range []int{0, 1, 3, 7, 8, 9, 64, 1001} {
				raw, base := make([]byte, n), make([]byte, n)
				for i := range raw {
					raw[i], base[i] = byte(rng.Uint32()), byte(rng.Uint32())
				}
				// specials and near-equal values at the front
				for i := 0; i+4 <= n && i/4 < len(specials32); i += 4 {
					binary.LittleEndian.PutUint32(raw[i:], specials32[i/4])
					binary.LittleEndian.PutUint32(base[i:], specials32[(i/4+3)%len(specials32)])
				}
				d := make([]byte, n)
				makeDelta(tr, elem, d, raw, base)
				undoDelta(tr, elem, d, base)
				if !bytes.Equal(d, raw) {
					t.Fatalf("%v elem %d len %d: round trip differs", tr, elem, n)
				}
			}
		}
	}
}

// TestDeltaSubSmallSteps: a one-ULP step in either direction, across zero and
// across a mantissa carry, codes to a small number (which is the point of the
// ULP transform).
func TestDeltaSubSmallSteps(t *testing.T) {
	cases := []struct{ a, b float32 }{
		{1.0, math.Nextafter32(1.0, 2)},
		{1.0, math.Nextafter32(1.0, 0)},
		{-1.0, math.Nextafter32(-1.0, 0)},
		{0, math.Nextafter32(0, 1)},
		{0, math.Nextafter32(0, -1)},
	}
	for _, c := range cases {
		raw, base := make([]byte, 4), make([]byte, 4)
		binary.LittleEndian.PutUint32(raw, math.Float32bits(c.b))
		binary.LittleEndian.PutUint32(base, math.Float32bits(c.a))
		d := make([]byte, 4)
		makeDelta(deltaSub, 4, d, raw, base)
		if z := binary.LittleEndian.Uint32(d); z > 4 {
			t.Errorf("%g -> %g: zigzag delta %d, want <= 4", c.a, c.b, z)
		}
	}
}

// syntheticStep returns a chunk of n float elements (elem 2: bf16, 4: fp32)
// drawn around zero and the same chunk after an Adam-like step: every element
// moved by about rel of the typical magnitude.
func syntheticStep(seed uint64, n, elem int, rel float64) (base, next []byte) {
	rng := rand.New(rand.NewPCG(seed, 7))
	base, next = make([]byte, n*elem), make([]byte, n*elem)
	for i := range n {
		w := rng.NormFloat64() * 0.02
		v := w + rng.NormFloat64()*0.02*rel
		if elem == 2 {
			binary.LittleEndian.PutUint16(base[2*i:], uint16(math.Float32bits(float32(w))>>16))
			binary.LittleEndian.PutUint16(next[2*i:], uint16(math.Float32bits(float32(v))>>16))
		} else {
			binary.LittleEndian.PutUint32(base[4*i:], math.Float32bits(float32(w)))
			binary.LittleEndian.PutUint32(next[4*i:], math.Float32bits(float32(v)))
		}
	}
	return base, next
}

func BenchmarkDeltaDecode(b *testing.B) {
	c, err := newCodecs()
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	for _, elem := range []int{2, 4} {
		base, next := syntheticStep(1, (1<<20)/elem, elem, 0.01)
		id, bid := Sum(next), Sum(base)
		obj := c.encodeDeltaObject(next, base, bid, elem, new(deltaScratch))
		std, _ := c.encodeObject(next, Hint{ElemSize: elem})
		bf := func(ID) ([]byte, func(), error) { return base, func() {}, nil }
		buf := make([]byte, len(next))
		alloc := func(int) []byte { return buf }
		b.Run(fmt.Sprintf("elem%d/delta", elem), func(b *testing.B) {
			b.SetBytes(int64(len(next)))
			b.ReportMetric(float64(len(obj))/float64(len(next)), "ratio")
			for b.Loop() {
				if _, err := c.decodeObjectInto(id, obj, alloc, bf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("elem%d/standalone", elem), func(b *testing.B) {
			b.SetBytes(int64(len(next)))
			b.ReportMetric(float64(len(std))/float64(len(next)), "ratio")
			for b.Loop() {
				if _, err := c.decodeObjectInto(id, std, alloc, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
