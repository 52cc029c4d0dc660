package object

import (
	"encoding/binary"
	"fmt"
)

// Delta coding (issue #15, the LMC seed): a chunk whose bytes are close to
// another chunk's (the same tensor range one checkpoint earlier) is stored as
// the element-wise difference from that base, entropy coded like any payload.
//
// Two transforms, both exact on the bit patterns (never float arithmetic):
//
//   - XOR (deltaXOR): d = raw ^ base. Byte-local, so a byte plane whose bytes
//     did not change is all zeros (the sign+exponent plane of weights).
//   - ULP difference (deltaSub), for 2- and 4-byte elements: each element's
//     bits are mapped to a monotone unsigned integer (m(u) = u^0x80.. if the
//     sign is clear, ^u if set), subtracted with wrap-around, and the signed
//     result zigzag-coded so that small steps either way are small numbers.
//     A carry (mantissa 0x7f -> 0x80) costs one unit, where XOR flips eight
//     bits; this wins on slowly drifting values such as Adam's second moment.
//
// Trailing bytes that do not fill an element are XORed. The delta bytes are then
// coded by the ordinary payload coder (appendEncoded: byte grouping with a
// per-plane choice of raw, run, Huffman and zstd; or zstd or raw), so a near-
// empty high plane costs a few bytes (run or zstd) instead of Huffman's one
// bit per byte.
type deltaTransform uint8

const (
	deltaXOR deltaTransform = 1
	deltaSub deltaTransform = 2
)

func (t deltaTransform) String() string {
	s := fmt.Sprintf("transform(%d)", uint8(t))
	switch t &^ deltaClassed {
	case deltaXOR:
		s = "xor"
	case deltaSub:
		s = "sub"
	}
	if t&deltaClassed != 0 {
		s += "+classes"
	}
	return s
}

// makeDelta writes the delta of raw against base into dst. All three have the
// same length; elem is 2 or 4 for deltaSub (any value for deltaXOR).
func makeDelta(t deltaTransform, elem int, dst, raw, base []byte) {
	n := 0
	if t == deltaSub {
		switch elem {
		case 2:
			n = len(raw) &^ 1
			for i := 0; i < n; i += 2 {
				r := mono16(binary.LittleEndian.Uint16(raw[i:]))
				b := mono16(binary.LittleEndian.Uint16(base[i:]))
				d := r - b
				binary.LittleEndian.PutUint16(dst[i:], d<<1^uint16(int16(d)>>15))
			}
		case 4:
			n = len(raw) &^ 3
			for i := 0; i < n; i += 4 {
				r := mono32(binary.LittleEndian.Uint32(raw[i:]))
				b := mono32(binary.LittleEndian.Uint32(base[i:]))
				d := r - b
				binary.LittleEndian.PutUint32(dst[i:], d<<1^uint32(int32(d)>>31))
			}
		}
	}
	xorBytes(dst[n:], raw[n:], base[n:])
}

// undoDelta turns the delta in buf back into the raw bytes, in place.
func undoDelta(t deltaTransform, elem int, buf, base []byte) {
	n := 0
	if t == deltaSub {
		switch elem {
		case 2:
			n = len(buf) &^ 1
			undoSub16(buf[:n], buf[:n], base[:n])
		case 4:
			n = len(buf) &^ 3
			undoSub32(buf[:n], buf[:n], base[:n])
		}
	}
	xorBytes(buf[n:], buf[n:], base[n:])
}

// mono16 maps a 16-bit float's bits to an unsigned integer in the order of
// the values (negative: ^u, positive: u|0x8000), without a branch: the
// sign is random in weights, so a branch mispredicts half the time.
func mono16(u uint16) uint16 { return u ^ (uint16(int16(u)>>15) | 0x8000) }

func unmono16(v uint16) uint16 { return v ^ (uint16(int16(^v)>>15) | 0x8000) }

func mono32(u uint32) uint32 { return u ^ (uint32(int32(u)>>31) | 0x80000000) }

func unmono32(v uint32) uint32 { return v ^ (uint32(int32(^v)>>31) | 0x80000000) }

// deltaVariants are the transforms the encoder tries, in order.
var deltaVariants = [...]deltaTransform{deltaSub | deltaClassed, deltaXOR | deltaClassed, deltaSub, deltaXOR}

// deltaClassGain is the default Coder.classGain. A classed delta decodes at
// about half the speed of a plain one (BenchmarkDeltaVariantDecode: bf16 on
// the workload 250-330 against 480-670 CPU MB/s), so near-ties go to the
// plain one. Where classes are kept they save much more: on the workload
// (keyframe every 5 saves) bf16 stays 0.416 with any gain up to 0.05 (0.418
// at 0.10, 0.466 without classes: they save 10-20% where they win), fp32
// goes 0.7111 to 0.7114 at 0.03 (0.739 without classes).
const deltaClassGain = 0.02

// DeltaScratch is the scratch of one delta encode.
type DeltaScratch struct {
	d, perm, best, bestClassed []byte
}

// appendDeltaPayload appends to dst the coded delta of raw against base (same
// length) under the variant that codes smallest, and returns the payload
// codec (CodecRaw for a classed payload, whose classes carry their own) and
// the transform byte. A classed variant is kept only when it codes smaller
// than the best plain one by more than the Coder's classGain: it decodes at
// about half the plain one's speed (deltaClassGain).
func (c *Coder) appendDeltaPayload(dst, raw, base []byte, elem int, s *DeltaScratch) (Codec, deltaTransform, []byte) {
	start := len(dst)
	s.d = growBuf(s.d, len(raw))
	var (
		bestCodec       Codec
		bestT, bestCT   deltaTransform
		have, haveClass bool
	)
	for _, t := range deltaVariants {
		op := t &^ deltaClassed
		if (op == deltaSub || t&deltaClassed != 0) && elem != 2 && elem != 4 {
			continue
		}
		if t&deltaClassed != 0 && len(raw)/elem < 2*deltaMinClass {
			continue
		}
		if t&deltaClassed != 0 {
			s.perm = growBuf(s.perm, len(raw))
			dst = c.appendClassed(dst[:start], raw, base, s.perm, op, elem)
			if !haveClass || len(dst)-start < len(s.bestClassed) {
				s.bestClassed = append(s.bestClassed[:0], dst[start:]...)
				bestCT, haveClass = t, true
			}
			continue
		}
		makeDelta(op, elem, s.d, raw, base)
		var codec Codec
		codec, dst = c.appendEncoded(dst[:start], s.d, Hint{ElemSize: elem})
		if !have || len(dst)-start < len(s.best) {
			s.best = append(s.best[:0], dst[start:]...)
			bestCodec, bestT, have = codec, t, true
		}
	}
	if haveClass && float64(len(s.bestClassed)) < float64(len(s.best))*(1-c.classGain) {
		return CodecRaw, bestCT, append(dst[:start], s.bestClassed...)
	}
	return bestCodec, bestT, append(dst[:start], s.best...)
}

// Exponent classes. The step an optimizer takes is roughly the same in
// absolute terms across a tensor (Adam normalises it), so in units of the
// element's last place it is larger the smaller the element: the delta's
// distribution depends on the base element's exponent. A classed payload
// (deltaClassed set in the transform byte) therefore reorders the delta's
// elements by the exponent of the base element at the same index (a stable
// counting sort) and codes each class on its own, with its own Huffman tables.
// The decoder knows the base, so the classes cost nothing to transmit. On the
// tiny GPT-2 workload this saves ~10% of a bf16 delta and ~3% of an fp32 one
// (test/delta, notes in cas's doc.go).
//
// Classes: the exponent byte of the base element (bf16: bits 7..14, fp32:
// bits 23..30); exponents with fewer than deltaMinClass elements share one
// class after all others (classesOf). The payload is
//
//	K u16 (number of non-empty classes, as the decoder derives them) |
//	K × (codec u8 | encoded length u32 LE) | class 0 data | ... |
//	trailing bytes (len % elem) XORed with the base's
//
// each class's data being its elements' delta bytes coded by appendEncoded.
const (
	deltaClassed  = 0x80
	deltaMinClass = 2048
)

// deltaClasses is the class layout of one base: the dense class of each
// exponent byte, the elements in each class and where each class starts.
type deltaClasses struct {
	of     [256]uint8 // exponent byte → class
	counts []int      // elements per class, in class order
}

// DeltaMayPay reports whether a delta of raw against base (same length)
// can pay, from a sample of their elements: for floats (elem 2 or 4), the
// share whose sign and exponent agree must reach deltaMinAgree. An unrelated
// base, the previous run's file of the same name that a new run's first
// save is suggested against, agrees on about a tenth (two N(0, 0.02)
// tensors: 0.106); an Adam step of 1% of the weights' scale on 0.95, of 30%
// on 0.49 (its delta still saves 12%); of 100% on 0.21, where the delta no
// longer pays (0.973 of the standalone size, bf16, tensortest.SyntheticStep).
// The encoder tries four transforms, each a whole encode: this sample
// spares them where none can win. Other element sizes: true.
func DeltaMayPay(raw, base []byte, elem int) bool {
	if elem != 2 && elem != 4 || len(raw) != len(base) {
		return true
	}
	n := len(raw) / elem
	step := max(1, n/deltaAgreeSamples)
	sampled, same := 0, 0
	for i := 0; i < n; i += step {
		sampled++
		if exponent(raw, elem, i) == exponent(base, elem, i) && signOf(raw, elem, i) == signOf(base, elem, i) {
			same++
		}
	}
	return float64(same) >= deltaMinAgree*float64(sampled)
}

// deltaAgreeSamples is how many elements DeltaMayPay looks at, at most;
// deltaMinAgree the share of them that must agree.
const (
	deltaAgreeSamples = 4096
	deltaMinAgree     = 0.15
)

// signOf returns the sign bit of element i of b.
func signOf(b []byte, elem, i int) byte {
	return b[elem*i+elem-1] >> 7
}

// exponent returns the exponent byte of element i of base.
func exponent(base []byte, elem, i int) byte {
	if elem == 2 {
		return byte(binary.LittleEndian.Uint16(base[2*i:]) >> 7)
	}
	return byte(binary.LittleEndian.Uint32(base[4*i:]) >> 23)
}

// classesOf derives the classes of the first n elements of base: exponents
// in increasing order, each with at least deltaMinClass elements, then one
// class for all the rarer exponents, if any. At most 256 classes.
//
// The histogram is counted in four interleaved parts: element after element
// one counter is loaded, bumped and stored, and the next element, of the
// same exponent more often than not, waits for that store; four counters
// per exponent give the core four chains to overlap (0.77–1.15 to 0.60–0.67
// ms for a bf16 MiB).
func classesOf(base []byte, elem, n int) deltaClasses {
	var h [4][256]uint32
	if elem == 2 {
		b := base[:2*n]
		i := 0
		for ; i+8 <= len(b); i += 8 {
			w := binary.LittleEndian.Uint64(b[i:])
			h[0][byte(w>>7)]++
			h[1][byte(w>>23)]++
			h[2][byte(w>>39)]++
			h[3][byte(w>>55)]++
		}
		for ; i < len(b); i += 2 {
			h[0][byte(binary.LittleEndian.Uint16(b[i:])>>7)]++
		}
	} else {
		b := base[:4*n]
		i := 0
		for ; i+16 <= len(b); i += 16 {
			w0, w1 := binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])
			h[0][byte(w0>>23)]++
			h[1][byte(w0>>55)]++
			h[2][byte(w1>>23)]++
			h[3][byte(w1>>55)]++
		}
		for ; i < len(b); i += 4 {
			h[0][byte(binary.LittleEndian.Uint32(b[i:])>>23)]++
		}
	}
	var hist [256]int
	for e := range hist {
		hist[e] = int(h[0][e]) + int(h[1][e]) + int(h[2][e]) + int(h[3][e])
	}
	var cl deltaClasses
	rare := 0
	for _, c := range hist {
		if c >= deltaMinClass {
			cl.counts = append(cl.counts, c)
		} else {
			rare += c
		}
	}
	rareClass := uint8(len(cl.counts) & 0xff) // len ≤ 255 when any exponent is rare
	k := 0
	for e, c := range hist {
		if c >= deltaMinClass {
			cl.of[e] = uint8(k)
			k++
		} else {
			cl.of[e] = rareClass
		}
	}
	if rare > 0 {
		cl.counts = append(cl.counts, rare)
	}
	return cl
}

// offsets returns the first element index of each class.
func (cl *deltaClasses) offsets() (off [256]int) {
	pos := 0
	for i, c := range cl.counts {
		off[i] = pos
		pos += c
	}
	return off
}

// makeClassedDelta writes the delta of the first n elements of raw against
// base into perm, grouped by class (a stable counting sort).
func makeClassedDelta(t deltaTransform, elem int, cl *deltaClasses, perm, raw, base []byte, n int) {
	off := cl.offsets()
	switch {
	case elem == 2 && t == deltaSub:
		for i := range n {
			bv := binary.LittleEndian.Uint16(base[2*i:])
			d := mono16(binary.LittleEndian.Uint16(raw[2*i:])) - mono16(bv)
			k := cl.of[byte(bv>>7)]
			binary.LittleEndian.PutUint16(perm[2*off[k]:], d<<1^uint16(int16(d)>>15))
			off[k]++
		}
	case elem == 2:
		for i := range n {
			bv := binary.LittleEndian.Uint16(base[2*i:])
			k := cl.of[byte(bv>>7)]
			binary.LittleEndian.PutUint16(perm[2*off[k]:], binary.LittleEndian.Uint16(raw[2*i:])^bv)
			off[k]++
		}
	case t == deltaSub:
		for i := range n {
			bv := binary.LittleEndian.Uint32(base[4*i:])
			d := mono32(binary.LittleEndian.Uint32(raw[4*i:])) - mono32(bv)
			k := cl.of[byte(bv>>23)]
			binary.LittleEndian.PutUint32(perm[4*off[k]:], d<<1^uint32(int32(d)>>31))
			off[k]++
		}
	default:
		for i := range n {
			bv := binary.LittleEndian.Uint32(base[4*i:])
			k := cl.of[byte(bv>>23)]
			binary.LittleEndian.PutUint32(perm[4*off[k]:], binary.LittleEndian.Uint32(raw[4*i:])^bv)
			off[k]++
		}
	}
}

// undoClassedDelta is the inverse of makeClassedDelta: it writes the first n
// raw elements into out from the grouped delta in perm. It goes through the
// elements in blocks that stay in the core's cache: the block's deltas
// gathered back into element order (gatherClassed), then undone in place
// (undoSub16/32, xorBytes). It reports false when perm and the classes
// disagree (cannot happen: cl is derived from base).
func undoClassedDelta(t deltaTransform, elem int, cl *deltaClasses, out, perm, base []byte, n int) bool {
	const block = 16 << 10 // bytes
	var off [256]uint32
	pos := 0
	for k, c := range cl.counts {
		off[k] = uint32(pos)
		pos += c
	}
	perm = perm[:n*elem]
	for s := 0; s < n*elem; s += block {
		e := min(s+block, n*elem)
		ob, bb := out[s:e], base[s:e]
		if !gatherClassed(elem, ob, perm, bb, &cl.of, &off) {
			return false
		}
		switch {
		case t == deltaXOR:
			xorBytes(ob, ob, bb)
		case elem == 2:
			undoSub16(ob, ob, bb)
		default:
			undoSub32(ob, ob, bb)
		}
	}
	return true
}

// appendClassed appends the classed payload of raw against base under
// transform t to dst. perm is scratch of len(raw) bytes.
func (c *Coder) appendClassed(dst, raw, base, perm []byte, t deltaTransform, elem int) []byte {
	n := len(raw) / elem
	cl := classesOf(base, elem, n)
	makeClassedDelta(t, elem, &cl, perm, raw, base, n)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(cl.counts)))
	hdr := len(dst)
	for range cl.counts {
		dst = append(dst, 0, 0, 0, 0, 0)
	}
	pos := 0
	for j, cnt := range cl.counts {
		seg := perm[pos*elem : (pos+cnt)*elem]
		pos += cnt
		start := len(dst)
		var codec Codec
		codec, dst = c.appendEncoded(dst, seg, Hint{ElemSize: elem})
		dst[hdr+5*j] = byte(codec)
		binary.LittleEndian.PutUint32(dst[hdr+5*j+1:], uint32(len(dst)-start))
	}
	tail := len(dst)
	dst = append(dst, raw[n*elem:]...)
	xorBytes(dst[tail:], dst[tail:], base[n*elem:])
	return dst
}

// decodeClassed decodes a classed payload made under transform t against
// base into out (the raw bytes: the delta is undone too). perm is scratch.
func (c *Coder) decodeClassed(out, payload, base []byte, t deltaTransform, elem int, perm []byte) error {
	if elem != 2 && elem != 4 {
		return fmt.Errorf("classed delta with element size %d", elem)
	}
	n := len(out) / elem
	cl := classesOf(base, elem, n)
	k := len(cl.counts)
	if len(payload) < 2 || int(binary.LittleEndian.Uint16(payload)) != k || len(payload) < 2+5*k {
		return fmt.Errorf("classed delta: class table does not match the base (%d classes)", k)
	}
	tab := payload[2 : 2+5*k]
	body := payload[2+5*k:]
	pos := 0
	for j, cnt := range cl.counts {
		codec := Codec(tab[5*j])
		l := binary.LittleEndian.Uint32(tab[5*j+1:])
		if uint64(l) > uint64(len(body)) {
			return fmt.Errorf("classed delta: class %d overruns the payload", j)
		}
		size := cnt * elem
		seg := perm[pos*elem : pos*elem+size : pos*elem+size]
		got, err := c.decodeInto(codec, body[:l], size, func(int) []byte { return seg })
		if err != nil {
			return fmt.Errorf("classed delta: class %d: %w", j, err)
		}
		if len(got) != size || &got[0] != &seg[0] {
			return fmt.Errorf("classed delta: class %d decoded to %d bytes, want %d", j, len(got), size)
		}
		body = body[l:]
		pos += cnt
	}
	if len(body) != len(out)-n*elem {
		return fmt.Errorf("classed delta: %d trailing bytes, want %d", len(body), len(out)-n*elem)
	}
	if !undoClassedDelta(t, elem, &cl, out, perm, base, n) {
		return fmt.Errorf("classed delta: the classes overrun the deltas")
	}
	xorBytes(out[n*elem:], body, base[n*elem:])
	return nil
}
