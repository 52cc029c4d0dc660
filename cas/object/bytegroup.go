package object

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
)

// Payload of a CodecByteGroup object (codec 2), for raw bytes of length L made
// of n = L/E elements of E bytes (E = 2 or 4) and t = L%E trailing bytes:
//
//	E u8 | transform u8                                   sub-header
//	P × (method u8 | encoded length u32 LE)                one per plane, in order
//	plane 0 data | ... | plane P-1 data                   back to back
//	t trailing bytes, stored as they are
//
// transform bit 0 (rotate): each element was rotated left by one bit before
// splitting, which moves the sign to bit 0 so that the top byte holds the whole
// 8-bit exponent of a bf16 or fp32 (ZipNN does the same). Bit 1 (wide, E = 4
// only): two planes, the low three bytes of every element kept together (3n
// bytes) and the top bytes (n bytes); without it there are P = E planes of n
// bytes, plane j holding byte j of every element. Other bits must be zero.
//
// Each plane is stored by one method:
//
//	0 raw      its bytes (encoded length = plane length)
//	1 run      one byte repeated (encoded length 1)
//	2 huffman  the section described in bytegroup_huff.go
//	3 zstd     one zstd frame of exactly the plane length
//
// The lengths must add up to the payload exactly, and decoding never writes past
// the raw length the object header gives.

const (
	bgRotate = 1 << 0
	bgWide   = 1 << 1

	bgRaw     = 0
	bgRun     = 1
	bgHuffman = 2
	bgZstd    = 3

	bgMaxPlanes = 4
)

// Thresholds of the encoder's choices.
const (
	// bgMinElems: chunks with fewer elements are not byte-grouped (headers
	// would eat the gain).
	bgMinElems = 64
	// bgSampleRuns × bgSampleRun elements are sampled to estimate the entropy
	// of each byte position.
	bgSampleRuns = 64
	bgSampleRun  = 64
	// bgRawEntropy: a plane whose sampled entropy is at least this many bits
	// per byte is stored raw (Huffman would save under 2%; the estimate from
	// 4096 samples is biased low by ~0.05 bit).
	bgRawEntropy = 7.8
	// bgPlaneSaving: an entropy-coded plane must save this fraction of the
	// plane, or the plane is stored raw.
	bgPlaneSaving = 1.0 / 64
	// bgZstdTry: when the most frequent byte of a plane is more than this
	// fraction, zstd is tried too (Huffman cannot go below one bit a byte).
	bgZstdTry = 0.5
	// bgKeepSaving: a byte-grouped chunk that saves less than this fraction is
	// compared with zstd on the whole chunk.
	bgKeepSaving = 0.10
)

var errBGCorrupt = errors.New("corrupt byte-grouped payload")

// bgEnc is the scratch of one byte-group encode.
type bgEnc struct {
	planes [bgMaxPlanes][]byte
	huf    hufEnc
	tmp    []byte // zstd output of a plane
}

// bgDec is the scratch of one byte-group decode.
type bgDec struct {
	planes [bgMaxPlanes][]byte
	huf    hufDec
}

func growBuf(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// bgPools holds the scratch of one Coder.
type bgPools struct {
	enc sync.Pool // *bgEnc
	dec sync.Pool // *bgDec
}

func (p *bgPools) getEnc() *bgEnc {
	if e, ok := p.enc.Get().(*bgEnc); ok {
		return e
	}
	return &bgEnc{}
}

func (p *bgPools) getDec() *bgDec {
	if d, ok := p.dec.Get().(*bgDec); ok {
		return d
	}
	return &bgDec{}
}

// bgPlanes is the number of planes of elements of e bytes under transform.
func bgPlanes(e int, transform byte) int {
	if transform&bgWide != 0 {
		return 2
	}
	return e
}

// appendByteGroup appends the byte-grouped payload of raw (elements of e
// bytes) to dst. It returns dst unchanged and false when raw is too short.
func (c *Coder) appendByteGroup(dst, raw []byte, e int) ([]byte, bool) {
	n := len(raw) / e
	if n < bgMinElems || (e != 2 && e != 4) {
		return dst, false
	}
	s := c.bg.getEnc()
	defer c.bg.enc.Put(s)
	rot := true
	entropy, lowZero := sampleEntropies(raw[:n*e], e, rot, &s.huf.hist)
	if lowZero {
		// fp32 that holds bf16 values: keep the two zero bytes zero (run
		// planes) rather than rotating the sign into one of them.
		rot = false
		entropy, _ = sampleEntropies(raw[:n*e], e, rot, &s.huf.hist)
	}
	var transform byte
	if rot {
		transform |= bgRotate
	}
	var planes [bgMaxPlanes][]byte
	var noise [bgMaxPlanes]bool // planes stored raw without a closer look
	switch {
	case e == 2:
		planes[0], planes[1] = growBuf(s.planes[0], n), growBuf(s.planes[1], n)
		split2(raw, planes[0], planes[1], rot)
		noise[0], noise[1] = entropy[0] >= bgRawEntropy, entropy[1] >= bgRawEntropy
	case entropy[0] >= bgRawEntropy && entropy[1] >= bgRawEntropy && entropy[2] >= bgRawEntropy:
		// The usual fp32: the mantissa bytes are noise. Keeping them together
		// makes splitting and merging about twice as fast.
		transform |= bgWide
		planes[0], planes[1] = growBuf(s.planes[0], 3*n), growBuf(s.planes[1], n)
		split4wide(raw, planes[0], planes[1], rot)
		noise[0], noise[1] = true, entropy[3] >= bgRawEntropy
	default:
		for j := range 4 {
			planes[j] = growBuf(s.planes[j], n)
			noise[j] = entropy[j] >= bgRawEntropy
		}
		split4(raw, planes[0], planes[1], planes[2], planes[3], rot)
	}
	np := bgPlanes(e, transform)
	for j := range np {
		s.planes[j] = planes[j]
	}
	hdr := len(dst)
	dst = append(dst, byte(e), transform)
	for range np {
		dst = append(dst, 0, 0, 0, 0, 0)
	}
	for j := range np {
		start := len(dst)
		var m byte
		if noise[j] {
			m, dst = bgRaw, append(dst, planes[j]...)
		} else {
			m, dst = c.appendPlane(dst, s, planes[j])
		}
		dst[hdr+2+5*j] = m
		binary.LittleEndian.PutUint32(dst[hdr+3+5*j:], uint32(len(dst)-start))
	}
	return append(dst, raw[n*e:]...), true
}

// appendPlane appends plane p by the cheapest method it finds. Large planes
// get their Huffman code from a sample (see sampleHistogram); when the sample
// missed a byte value the plane holds, the plane is counted in full.
func (c *Coder) appendPlane(dst []byte, s *bgEnc, p []byte) (byte, []byte) {
	n := len(p)
	if n >= hufSampleMin {
		distinct, lo, hi, maxCount, size := s.huf.sampleHistogram(p)
		if distinct > 1 && float64(maxCount) <= bgZstdTry*float64(size) && hi-lo < 120 {
			lo, hi = s.huf.widenSample(lo, hi)
			s.huf.buildLengths()
			bits := s.huf.encodedBits() * uint64(n) / uint64(size)
			if float64(hufSectionSize(n, lo, hi, bits)) > float64(n)*(1-bgPlaneSaving) {
				return bgRaw, append(dst, p...)
			}
			if out, ok := s.huf.appendHuffman(dst, p, lo, hi, true); ok {
				if len(out)-len(dst) < n {
					return bgHuffman, out
				}
				return bgRaw, append(dst, p...)
			}
		}
	}
	distinct, lo, hi, maxCount := s.huf.histogram(p)
	if distinct == 1 {
		return bgRun, append(dst, p[0])
	}
	s.huf.buildLengths()
	size := hufSectionSize(n, lo, hi, s.huf.encodedBits())
	best := bgRaw
	if float64(size) <= float64(n)*(1-bgPlaneSaving) {
		best = bgHuffman
	} else {
		size = n
	}
	if float64(maxCount) > bgZstdTry*float64(n) {
		s.tmp = c.zstdFor(len(p)).EncodeAll(p, s.tmp[:0])
		if len(s.tmp) < size && float64(len(s.tmp)) <= float64(n)*(1-bgPlaneSaving) {
			return bgZstd, append(dst, s.tmp...)
		}
	}
	if best == bgHuffman {
		out, _ := s.huf.appendHuffman(dst, p, lo, hi, false)
		return bgHuffman, out
	}
	return bgRaw, append(dst, p...)
}

// sampleEntropies estimates the order-0 entropy, in bits per byte, of each
// byte position of the elements of raw (e bytes each, rotated when rot), from
// bgSampleRuns runs of bgSampleRun elements spread over raw (all of it when it
// is small). lowZero reports 4-byte elements whose low two bytes (before any
// rotation) were all zero in the sample. hist is scratch.
func sampleEntropies(raw []byte, e int, rot bool, hist *[4][256]uint32) (h [bgMaxPlanes]float64, lowZero bool) {
	*hist = [4][256]uint32{}
	n := len(raw) / e
	var low uint32
	count := func(i int) {
		var v uint32
		if e == 2 {
			v = uint32(binary.LittleEndian.Uint16(raw[2*i:]))
			if rot {
				v = (v<<1 | v>>15) & 0xffff
			}
		} else {
			v = binary.LittleEndian.Uint32(raw[4*i:])
			low |= v
			if rot {
				v = v<<1 | v>>31
			}
		}
		for j := range e {
			hist[j][byte(v>>(8*j))]++
		}
	}
	total := 0
	if n <= 2*bgSampleRuns*bgSampleRun {
		for i := range n {
			count(i)
		}
		total = n
	} else {
		step := (n - bgSampleRun) / (bgSampleRuns - 1)
		for r := range bgSampleRuns {
			for i := r * step; i < r*step+bgSampleRun; i++ {
				count(i)
			}
		}
		total = bgSampleRuns * bgSampleRun
	}
	for j := range e {
		for _, c := range hist[j] {
			if c > 0 {
				q := float64(c) / float64(total)
				h[j] -= q * math.Log2(q)
			}
		}
	}
	return h, e == 4 && low&0xffff == 0
}

// decodeByteGroup decodes a byte-grouped payload into out, whose length is the
// raw length from the object header.
func (c *Coder) decodeByteGroup(out, payload []byte) error {
	if len(payload) < 2 {
		return errBGCorrupt
	}
	e, transform := int(payload[0]), payload[1]
	if (e != 2 && e != 4) || transform&^(bgRotate|bgWide) != 0 || (e == 2 && transform&bgWide != 0) {
		return fmt.Errorf("%w: element size %d, transform %#x", errBGCorrupt, e, transform)
	}
	np := bgPlanes(e, transform)
	hs := 2 + 5*np
	if len(payload) < hs {
		return fmt.Errorf("%w: short sub-header", errBGCorrupt)
	}
	n, tail := len(out)/e, len(out)%e
	s := c.bg.getDec()
	defer c.bg.dec.Put(s)

	var planes [bgMaxPlanes][]byte
	body := payload[hs:]
	for j := range np {
		size := n
		if transform&bgWide != 0 && j == 0 {
			size = 3 * n
		}
		m := payload[2+5*j]
		l := binary.LittleEndian.Uint32(payload[3+5*j:])
		if uint64(l) > uint64(len(body)) {
			return fmt.Errorf("%w: plane %d overruns the payload", errBGCorrupt, j)
		}
		enc := body[:l]
		body = body[l:]
		if m == bgRaw {
			if len(enc) != size {
				return fmt.Errorf("%w: raw plane %d is %d bytes, want %d", errBGCorrupt, j, len(enc), size)
			}
			planes[j] = enc
			continue
		}
		p := growBuf(s.planes[j], size)
		s.planes[j] = p
		planes[j] = p
		switch m {
		case bgRun:
			if len(enc) != 1 {
				return fmt.Errorf("%w: run plane %d", errBGCorrupt, j)
			}
			fill(p, enc[0])
		case bgHuffman:
			if err := s.huf.decodeHuffman(p, enc); err != nil {
				return fmt.Errorf("plane %d: %w", j, err)
			}
		case bgZstd:
			got, err := c.zdec.DecodeAll(enc, p[:0:size])
			if err != nil {
				return fmt.Errorf("%w: plane %d: zstd: %v", errBGCorrupt, j, err)
			}
			if len(got) != size || (size > 0 && &got[0] != &p[0]) {
				return fmt.Errorf("%w: zstd plane %d decoded to %d bytes, want %d", errBGCorrupt, j, len(got), size)
			}
		default:
			return fmt.Errorf("%w: plane %d has method %d", errBGCorrupt, j, m)
		}
	}
	if len(body) != tail {
		return fmt.Errorf("%w: %d trailing bytes, want %d", errBGCorrupt, len(body), tail)
	}
	rot := transform&bgRotate != 0
	switch {
	case e == 2:
		merge2(out, planes[0], planes[1], rot)
	case transform&bgWide != 0:
		merge4wide(out, planes[0], planes[1], rot)
	default:
		merge4(out, planes[0], planes[1], planes[2], planes[3], rot)
	}
	copy(out[n*e:], body)
	return nil
}

// fill sets every byte of p to v.
func fill(p []byte, v byte) {
	if len(p) == 0 {
		return
	}
	p[0] = v
	for i := 1; i < len(p); i *= 2 {
		copy(p[i:], p[:i])
	}
}
