package tensortest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"

	"github.com/ckptfs/ckptfs/formats"
)

// PseudoRandom returns n bytes of a fixed pseudo-random sequence chosen by
// seed (incompressible, cheap to make).
func PseudoRandom(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// GaussF32, GaussBF16 and GaussF16 return synthetic tensors: n elements
// drawn from N(0, sigma), little-endian.
func GaussF32(n int, sigma float64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64()*sigma)))
	}
	return b
}

// BF16Bits rounds an fp32 to bf16 (round to nearest even), as torch does.
func BF16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// F16Bits rounds an fp32 to IEEE half precision (round to nearest even).
func F16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int(u>>23&0xff) - 127 + 15
	mant := u & 0x7fffff
	switch {
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		half := uint32(1) << (shift - 1)
		v := mant >> shift
		if rem := mant & (1<<shift - 1); rem > half || rem == half && v&1 == 1 {
			v++
		}
		return sign | uint16(v)
	}
	v := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && v&1 == 1 {
		v++
	}
	return sign | uint16(v)
}

func gauss16(n int, sigma float64, seed uint64, conv func(float32) uint16) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], conv(float32(r.NormFloat64()*sigma)))
	}
	return b
}

func GaussBF16(n int, sigma float64, seed uint64) []byte { return gauss16(n, sigma, seed, BF16Bits) }
func GaussF16(n int, sigma float64, seed uint64) []byte  { return gauss16(n, sigma, seed, F16Bits) }

// SyntheticStep returns a chunk of n float elements (elem 2: bf16, 4: fp32)
// drawn around zero and the same chunk after an Adam-like step: every element
// moved by about rel of the typical magnitude.
func SyntheticStep(seed uint64, n, elem int, rel float64) (base, next []byte) {
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

// CutChunk is one chunk of a checkpoint cut by CutFile.
type CutChunk struct {
	Seg, Ord int // data segment ordinal (-1: not data), chunk ordinal in it
	Elem     int
	Data     []byte
}

// CutFile cuts a checkpoint as the commit path does: each data segment in
// chunks of chunkSize bytes from its start, the rest in chunks unhinted.
func CutFile(path string, chunkSize int64) ([]CutChunk, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ix, err := formats.Parse(f, int64(len(data)))
	if err != nil {
		return nil, err
	}
	var out []CutChunk
	seg := 0
	for _, s := range ix.Segments {
		e, si := 0, -1
		if s.Kind == formats.KindData {
			e = formats.DTypeBits(s.DType) / 8
			si = seg
			seg++
		}
		for off, ord := s.Offset, 0; off < s.Offset+s.Length; off, ord = off+chunkSize, ord+1 {
			out = append(out, CutChunk{Seg: si, Ord: ord, Elem: e, Data: data[off:min(off+chunkSize, s.Offset+s.Length)]})
		}
	}
	return out, nil
}
