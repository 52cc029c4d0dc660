package object

import "encoding/binary"

// The inner loops of undoing a delta (delta.go), in plain Go. On amd64 the
// multiple-of-16-bytes part runs in SSE2 and the gathers in assembly
// (delta_amd64.s); these versions do the rest, and everything elsewhere.
//
// Measured on the 2-core EPYC (bf16, 1 MiB, CPU time, machine loaded; the
// Go loops of the first version, one pass per element doing all of it, are
// the reference): the classed undo took 4.3–4.6 ns an element, the assembly
// gather then SSE2 undo 1.5; the SSE2 undo alone 0.22 ns, where Go's scalar
// version costs as much as the gather.

// gatherClassedGo copies to dst, element after element (elem bytes each),
// the next element of perm in the class of the base element at the same
// index: the inverse of makeClassedDelta's stable grouping. off holds each
// class's next element in perm and is advanced. It reports false, having
// stopped, when a class runs past the end of perm (which classes derived
// from this base cannot do).
func gatherClassedGo(elem int, dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool {
	np := uint32(len(perm) / elem)
	if elem == 2 {
		for i := 0; i+2 <= len(dst); i += 2 {
			k := of[byte(binary.LittleEndian.Uint16(base[i:])>>7)]
			p := off[k]
			if p >= np {
				return false
			}
			off[k] = p + 1
			dst[i], dst[i+1] = perm[2*p], perm[2*p+1]
		}
		return true
	}
	for i := 0; i+4 <= len(dst); i += 4 {
		k := of[byte(binary.LittleEndian.Uint32(base[i:])>>23)]
		p := off[k]
		if p >= np {
			return false
		}
		off[k] = p + 1
		copy(dst[i:i+4], perm[4*p:4*p+4])
	}
	return true
}

// undoSub16Go sets out[i] = unmono16(mono16(base[i]) + unzigzag(z[i])) for
// the 16-bit elements of z (out may be z): the inverse of deltaSub.
func undoSub16Go(out, z, base []byte) {
	for i := 0; i+2 <= len(z); i += 2 {
		u := binary.LittleEndian.Uint16(z[i:])
		d := u>>1 ^ -(u & 1)
		b := mono16(binary.LittleEndian.Uint16(base[i:]))
		binary.LittleEndian.PutUint16(out[i:], unmono16(b+d))
	}
}

// undoSub32Go is undoSub16Go for 32-bit elements.
func undoSub32Go(out, z, base []byte) {
	for i := 0; i+4 <= len(z); i += 4 {
		u := binary.LittleEndian.Uint32(z[i:])
		d := u>>1 ^ -(u & 1)
		b := mono32(binary.LittleEndian.Uint32(base[i:]))
		binary.LittleEndian.PutUint32(out[i:], unmono32(b+d))
	}
}

// xorBytesGo sets dst[i] = a[i] ^ b[i] (dst may be a), eight bytes at a time.
func xorBytesGo(dst, a, b []byte) {
	n := len(dst) &^ 7
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], binary.LittleEndian.Uint64(a[i:])^binary.LittleEndian.Uint64(b[i:]))
	}
	for i := n; i < len(dst); i++ {
		dst[i] = a[i] ^ b[i]
	}
}
