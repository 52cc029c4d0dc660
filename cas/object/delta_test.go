package object

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
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

func BenchmarkDeltaDecode(b *testing.B) {
	c, err := NewCoder()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, elem := range []int{2, 4} {
		base, next := tensortest.SyntheticStep(1, (1<<20)/elem, elem, 0.01)
		id, bid := Sum(next), Sum(base)
		obj := c.EncodeDelta(next, base, bid, elem, new(DeltaScratch))
		std, _ := c.Encode(next, Hint{ElemSize: elem})
		bf := func(ID) ([]byte, func(), error) { return base, func() {}, nil }
		buf := make([]byte, len(next))
		alloc := func(int) []byte { return buf }
		b.Run(fmt.Sprintf("elem%d/delta", elem), func(b *testing.B) {
			b.SetBytes(int64(len(next)))
			b.ReportMetric(float64(len(obj))/float64(len(next)), "ratio")
			for b.Loop() {
				if _, err := c.DecodeInto(id, obj, alloc, bf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("elem%d/standalone", elem), func(b *testing.B) {
			b.SetBytes(int64(len(next)))
			b.ReportMetric(float64(len(std))/float64(len(next)), "ratio")
			for b.Loop() {
				if _, err := c.DecodeInto(id, std, alloc, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestDeltaObjectRoundTrip(t *testing.T) {
	c, err := NewCoder()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := new(DeltaScratch)
	for _, elem := range []int{0, 2, 4} {
		for _, n := range []int{0, 1, 5, 100, 4097, 3 * deltaMinClass * 4, 256 << 10} {
			for _, rel := range []float64{0, 1e-3, 1e-2, 1} {
				if n == 256<<10 && rel != 1e-3 {
					continue // the large chunk once: -race makes it slow
				}
				e := max(elem, 2)
				base, next := tensortest.SyntheticStep(uint64(n), n/e, e, rel)
				base = append(base, make([]byte, n%e)...) // a tail shorter than an element
				for i := range n % e {
					next = append(next, byte(i+1))
				}
				if len(base) != len(next) {
					t.Fatalf("setup: %d != %d", len(base), len(next))
				}
				id, bid := Sum(next), Sum(base)
				if id == bid {
					continue // the same chunk: deduplicated, never a delta
				}
				obj := c.EncodeDelta(next, base, bid, elem, s)
				h, err := ParseHeader(obj)
				if err != nil || !h.Delta || h.Base != bid {
					t.Fatalf("elem %d n %d: header %+v, %v", elem, n, h, err)
				}
				got, err := c.DecodeInto(id, obj, nil, func(b ID) ([]byte, func(), error) {
					if b != bid {
						t.Fatalf("asked for base %v, want %v", b, bid)
					}
					return base, func() {}, nil
				})
				if err != nil || !bytes.Equal(got, next) {
					t.Fatalf("elem %d n %d rel %g (%v): round trip: %v", elem, n, rel, h.transform, err)
				}
				if n == 256<<10 && elem != 0 {
					std, _ := c.Encode(next, Hint{ElemSize: elem})
					if len(obj) >= len(std) {
						t.Errorf("elem %d: delta %d bytes, standalone %d: a 0.1%% step should code smaller as a delta", elem, len(obj), len(std))
					}
				}
			}
		}
	}
}

// TestDeltaObjectRefusals: a delta decodes only against its own base, and
// never where a standalone chunk is required (a base's loader).
// errMissing stands for the error of a base that cannot be read.
var errMissing = errors.New("base chunk is missing")

func TestDeltaObjectRefusals(t *testing.T) {
	c, err := NewCoder()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base, next := tensortest.SyntheticStep(3, 64<<10, 2, 0.01)
	id, bid := Sum(next), Sum(base)
	obj := c.EncodeDelta(next, base, bid, 2, new(DeltaScratch))
	other := bytes.Clone(base)
	other[100] ^= 1
	cases := []struct {
		name string
		obj  []byte
		base BaseFunc
	}{
		{"no base loader", obj, nil},
		{"wrong base bytes", obj, func(ID) ([]byte, func(), error) { return other, func() {}, nil }},
		{"short base", obj, func(ID) ([]byte, func(), error) { return base[:100], func() {}, nil }},
		{"base missing", obj, func(ID) ([]byte, func(), error) { return nil, nil, errMissing }},
		{"flags set", func() []byte { o := bytes.Clone(obj); o[6] = 1; return o }(), func(ID) ([]byte, func(), error) { return base, func() {}, nil }},
		{"bad transform", func() []byte { o := bytes.Clone(obj); o[HeaderSize+32] = 9; return o }(), func(ID) ([]byte, func(), error) { return base, func() {}, nil }},
		{"payload bit flip", func() []byte { o := bytes.Clone(obj); o[len(o)-1] ^= 4; return o }(), func(ID) ([]byte, func(), error) { return base, func() {}, nil }},
	}
	for _, tc := range cases {
		if _, err := c.DecodeInto(id, tc.obj, nil, tc.base); !errors.Is(err, ErrCorrupt) && !errors.Is(err, errMissing) {
			t.Errorf("%s: err %v, want ErrCorrupt or errMissing", tc.name, err)
		}
	}
	// The payload bit flip with a re-computed CRC reaches the decoder and the
	// hash check: still never wrong bytes.
	o := bytes.Clone(obj)
	o[len(o)-1] ^= 4
	binary.LittleEndian.PutUint32(o[16:], crc32.Checksum(o[HeaderSize:], castagnoli))
	if got, err := c.DecodeInto(id, o, nil, func(ID) ([]byte, func(), error) { return base, func() {}, nil }); err == nil && !bytes.Equal(got, next) {
		t.Fatal("wrong bytes returned without an error")
	} else if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err %v, want ErrCorrupt", err)
	}
}

// FuzzDeltaDecode: whatever the object and the base, decoding a delta
// object returns an error or the bytes that hash to the ID, never panics.
func FuzzDeltaDecode(f *testing.F) {
	c, err := NewCoder()
	if err != nil {
		f.Fatal(err)
	}
	s := new(DeltaScratch)
	for _, elem := range []int{0, 2, 4} {
		base, next := tensortest.SyntheticStep(uint64(elem), 3*deltaMinClass, max(elem, 2), 0.01)
		f.Add(c.EncodeDelta(next, base, Sum(base), elem, s), base, true)
		f.Add(c.EncodeDelta(next[:300], base[:300], Sum(base[:300]), elem, s), base[:300], false)
	}
	f.Fuzz(func(t *testing.T, obj, base []byte, fixCRC bool) {
		if len(obj) > HeaderSize && fixCRC {
			binary.LittleEndian.PutUint32(obj[12:], uint32(len(obj)-HeaderSize))
			binary.LittleEndian.PutUint32(obj[16:], crc32.Checksum(obj[HeaderSize:], castagnoli))
		}
		h, err := ParseHeader(obj)
		if err != nil {
			return
		}
		var id ID // what the decode is checked against: the hash of what it should give
		if len(base) == int(h.RawLen) {
			id = Sum(base)
		}
		got, err := c.DecodeInto(id, obj, nil, func(ID) ([]byte, func(), error) { return base, func() {}, nil })
		if err == nil && Sum(got) != id {
			t.Fatal("decoded bytes do not hash to the ID")
		}
	})
}

// TestDeltaClassGain: the encoder keeps a classed delta only when it codes
// smaller than the best plain one by more than classGain.
func TestDeltaClassGain(t *testing.T) {
	c, err := NewCoder()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base, next := tensortest.SyntheticStep(31, 64<<10, 2, 0.01)
	for _, tc := range []struct {
		gain    float64
		classed bool
	}{{-1, true}, {1, false}} {
		c.classGain = tc.gain
		obj := c.EncodeDelta(next, base, Sum(base), 2, new(DeltaScratch))
		h, err := ParseHeader(obj)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.transform&deltaClassed != 0; got != tc.classed {
			t.Errorf("gain %v: transform %v", tc.gain, h.transform)
		}
		if raw, err := c.DecodeInto(Sum(next), obj, nil, func(ID) ([]byte, func(), error) { return base, func() {}, nil }); err != nil || !bytes.Equal(raw, next) {
			t.Errorf("gain %v: round trip: %v", tc.gain, err)
		}
	}
}

// TestDeltaMayPay: the sample lets through every base a delta against pays
// for (an Adam step of 1% and of 30% of the weights' scale) and stops
// unrelated ones, against which no transform pays (checked: the delta is
// not 1/32 smaller than the standalone encoding); sizes other than 2 and 4
// bytes always go through.
func TestDeltaMayPay(t *testing.T) {
	c, err := NewCoder()
	if err != nil {
		t.Fatal(err)
	}
	var scratch DeltaScratch
	for _, elem := range []int{2, 4} {
		cases := []struct {
			name string
			rel  float64 // < 0: an unrelated chunk of the same distribution
			want bool
		}{
			{"1% step", 0.01, true},
			{"30% step", 0.3, true},
			{"unrelated", -1, false},
			{"300% step", 3, false},
		}
		for _, tc := range cases {
			base, next := tensortest.SyntheticStep(5, 256<<10, elem, max(tc.rel, 0.01))
			if tc.rel < 0 {
				next, _ = tensortest.SyntheticStep(6, 256<<10, elem, 0.01)
			}
			if got := DeltaMayPay(next, base, elem); got != tc.want {
				t.Errorf("elem %d, %s: DeltaMayPay %v, want %v", elem, tc.name, got, tc.want)
			}
			std, _ := c.Encode(next, Hint{ElemSize: elem})
			d := c.EncodeDelta(next, base, ID{}, elem, &scratch)
			if pays := len(d) < len(std)-len(std)/32; pays && !tc.want {
				t.Errorf("elem %d, %s: stopped, but its delta pays (%d bytes against %d)", elem, tc.name, len(d), len(std))
			} else if !pays && tc.want {
				t.Errorf("elem %d, %s: the case's delta does not pay (%d bytes against %d): a wrong case", elem, tc.name, len(d), len(std))
			}
		}
	}
	unrelated := tensortest.PseudoRandom(64<<10, 1)
	for _, elem := range []int{0, 1, 8} {
		if !DeltaMayPay(unrelated, tensortest.PseudoRandom(64<<10, 2), elem) {
			t.Errorf("elem %d: stopped; only float elements are sampled", elem)
		}
	}
}
