package object

import "encoding/binary"

// Byte-group transforms. split cuts n little-endian elements of 2 or 4 bytes
// into planes (plane j holds byte j of every element), after rotating each
// element left by one bit when rot is set; merge is the inverse. Rotating moves
// the sign to bit 0, so that the most significant byte holds the whole 8-bit
// exponent of a bf16 or fp32 (ZipNN makes the same move); that plane then codes
// about 0.1 bit per element smaller than sign+7 exponent bits.
//
// The loops work on 64-bit words (SWAR): eight elements per iteration.

// rotl32 rotates each 32-bit lane of w left by one bit; rotr32 undoes it.
func rotl32(w uint64) uint64 { return (w<<1)&0xFFFFFFFEFFFFFFFE | (w>>31)&0x0000000100000001 }
func rotr32(w uint64) uint64 { return (w>>1)&0x7FFFFFFF7FFFFFFF | (w<<31)&0x8000000080000000 }

// zip2 interleaves the bytes of a and b: bytes a0 b0 a1 b1 ... a3 b3, then
// a4 b4 ... a7 b7 (two delta swaps per output word).
func zip2(a, b uint64) (uint64, uint64) {
	x := a&0xFFFFFFFF | b<<32
	y := a>>32 | b&0xFFFFFFFF00000000
	t := (x ^ x>>16) & 0x00000000FFFF0000
	x ^= t ^ t<<16
	u := (y ^ y>>16) & 0x00000000FFFF0000
	y ^= u ^ u<<16
	t = (x ^ x>>8) & 0x0000FF000000FF00
	x ^= t ^ t<<8
	u = (y ^ y>>8) & 0x0000FF000000FF00
	y ^= u ^ u<<8
	return x, y
}

// unzip2 is the inverse of zip2.
func unzip2(x, y uint64) (uint64, uint64) {
	t := (x ^ x>>8) & 0x0000FF000000FF00
	x ^= t ^ t<<8
	u := (y ^ y>>8) & 0x0000FF000000FF00
	y ^= u ^ u<<8
	t = (x ^ x>>16) & 0x00000000FFFF0000
	x ^= t ^ t<<16
	u = (y ^ y>>16) & 0x00000000FFFF0000
	y ^= u ^ u<<16
	return x&0xFFFFFFFF | y<<32, x>>32 | y&0xFFFFFFFF00000000
}

// Rotating 16-bit elements by one bit, done on eight elements' low bytes L and
// high bytes H at once.
func rotlPlanes(L, H uint64) (uint64, uint64) {
	return (L<<1)&0xFEFEFEFEFEFEFEFE | (H>>7)&0x0101010101010101,
		(H<<1)&0xFEFEFEFEFEFEFEFE | (L>>7)&0x0101010101010101
}

func rotrPlanes(L, H uint64) (uint64, uint64) {
	return (L>>1)&0x7F7F7F7F7F7F7F7F | (H&0x0101010101010101)<<7,
		(H>>1)&0x7F7F7F7F7F7F7F7F | (L&0x0101010101010101)<<7
}

func split2Go(raw []byte, p0, p1 []byte, rot bool) {
	n := len(p0)
	p1 = p1[:n]
	raw = raw[:2*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		r := raw[2*i : 2*i+16]
		// unzip2, written out: the compiler does not inline it.
		x := binary.LittleEndian.Uint64(r[0:])
		y := binary.LittleEndian.Uint64(r[8:])
		t := (x ^ x>>8) & 0x0000FF000000FF00
		x ^= t ^ t<<8
		u := (y ^ y>>8) & 0x0000FF000000FF00
		y ^= u ^ u<<8
		t = (x ^ x>>16) & 0x00000000FFFF0000
		x ^= t ^ t<<16
		u = (y ^ y>>16) & 0x00000000FFFF0000
		y ^= u ^ u<<16
		L, H := x&0xFFFFFFFF|y<<32, x>>32|y&0xFFFFFFFF00000000
		if rot {
			L, H = rotlPlanes(L, H)
		}
		binary.LittleEndian.PutUint64(p0[i:], L)
		binary.LittleEndian.PutUint64(p1[i:], H)
	}
	for ; i < n; i++ {
		v := uint16(raw[2*i]) | uint16(raw[2*i+1])<<8
		if rot {
			v = v<<1 | v>>15
		}
		p0[i], p1[i] = byte(v), byte(v>>8)
	}
}

func merge2Go(out []byte, p0, p1 []byte, rot bool) {
	n := len(p0)
	p1 = p1[:n]
	out = out[:2*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		L := binary.LittleEndian.Uint64(p0[i:])
		H := binary.LittleEndian.Uint64(p1[i:])
		if rot {
			L, H = rotrPlanes(L, H)
		}
		// zip2, written out: the compiler does not inline it.
		x := L&0xFFFFFFFF | H<<32
		y := L>>32 | H&0xFFFFFFFF00000000
		t := (x ^ x>>16) & 0x00000000FFFF0000
		x ^= t ^ t<<16
		u := (y ^ y>>16) & 0x00000000FFFF0000
		y ^= u ^ u<<16
		t = (x ^ x>>8) & 0x0000FF000000FF00
		x ^= t ^ t<<8
		u = (y ^ y>>8) & 0x0000FF000000FF00
		y ^= u ^ u<<8
		o := out[2*i : 2*i+16]
		binary.LittleEndian.PutUint64(o[0:], x)
		binary.LittleEndian.PutUint64(o[8:], y)
	}
	for ; i < n; i++ {
		v := uint16(p0[i]) | uint16(p1[i])<<8
		if rot {
			v = v>>1 | v<<15
		}
		out[2*i], out[2*i+1] = byte(v), byte(v>>8)
	}
}

// split4wide cuts 4-byte elements (rotated when rot) into their low three
// bytes, kept together (A, 3 bytes an element), and their top byte (T).
func split4wide(raw []byte, A, T []byte, rot bool) {
	n := len(T)
	A = A[:3*n]
	raw = raw[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		r := raw[4*i : 4*i+32]
		w0 := binary.LittleEndian.Uint64(r[0:])
		w1 := binary.LittleEndian.Uint64(r[8:])
		w2 := binary.LittleEndian.Uint64(r[16:])
		w3 := binary.LittleEndian.Uint64(r[24:])
		if rot {
			w0, w1, w2, w3 = rotl32(w0), rotl32(w1), rotl32(w2), rotl32(w3)
		}
		q0 := w0&0xFFFFFF | (w0>>8)&0xFFFFFF000000
		q1 := w1&0xFFFFFF | (w1>>8)&0xFFFFFF000000
		q2 := w2&0xFFFFFF | (w2>>8)&0xFFFFFF000000
		q3 := w3&0xFFFFFF | (w3>>8)&0xFFFFFF000000
		a := A[3*i : 3*i+24]
		binary.LittleEndian.PutUint64(a[0:], q0|q1<<48)
		binary.LittleEndian.PutUint64(a[8:], q1>>16|q2<<32)
		binary.LittleEndian.PutUint64(a[16:], q2>>32|q3<<16)
		t0 := (w0>>24)&0xFF | (w0>>48)&0xFF00
		t1 := (w1>>24)&0xFF | (w1>>48)&0xFF00
		t2 := (w2>>24)&0xFF | (w2>>48)&0xFF00
		t3 := (w3>>24)&0xFF | (w3>>48)&0xFF00
		binary.LittleEndian.PutUint64(T[i:], t0|t1<<16|t2<<32|t3<<48)
	}
	for ; i < n; i++ {
		v := binary.LittleEndian.Uint32(raw[4*i:])
		if rot {
			v = v<<1 | v>>31
		}
		A[3*i], A[3*i+1], A[3*i+2], T[i] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
}

// merge4wide is the inverse of split4wide.
func merge4wide(out []byte, A, T []byte, rot bool) {
	n := len(T)
	A = A[:3*n]
	out = out[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		a := A[3*i : 3*i+24]
		a0 := binary.LittleEndian.Uint64(a[0:])
		a1 := binary.LittleEndian.Uint64(a[8:])
		a2 := binary.LittleEndian.Uint64(a[16:])
		t := binary.LittleEndian.Uint64(T[i:])
		q0 := a0
		q1 := a0>>48 | a1<<16
		q2 := a1>>32 | a2<<32
		q3 := a2 >> 16
		w0 := q0&0xFFFFFF | (q0<<8)&0xFFFFFF00000000 | (t&0xFF)<<24 | (t&0xFF00)<<48
		w1 := q1&0xFFFFFF | (q1<<8)&0xFFFFFF00000000 | (t&0xFF0000)<<8 | (t&0xFF000000)<<32
		w2 := q2&0xFFFFFF | (q2<<8)&0xFFFFFF00000000 | (t>>8)&0xFF000000 | (t&0xFF0000000000)<<16
		w3 := q3&0xFFFFFF | (q3<<8)&0xFFFFFF00000000 | (t>>24)&0xFF000000 | t&0xFF00000000000000
		if rot {
			w0, w1, w2, w3 = rotr32(w0), rotr32(w1), rotr32(w2), rotr32(w3)
		}
		o := out[4*i : 4*i+32]
		binary.LittleEndian.PutUint64(o[0:], w0)
		binary.LittleEndian.PutUint64(o[8:], w1)
		binary.LittleEndian.PutUint64(o[16:], w2)
		binary.LittleEndian.PutUint64(o[24:], w3)
	}
	for ; i < n; i++ {
		v := uint32(A[3*i]) | uint32(A[3*i+1])<<8 | uint32(A[3*i+2])<<16 | uint32(T[i])<<24
		if rot {
			v = v>>1 | v<<31
		}
		binary.LittleEndian.PutUint32(out[4*i:], v)
	}
}

func split4(raw []byte, p0, p1, p2, p3 []byte, rot bool) {
	n := len(p0)
	p1, p2, p3 = p1[:n], p2[:n], p3[:n]
	raw = raw[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		r := raw[4*i : 4*i+32]
		w0 := binary.LittleEndian.Uint64(r[0:])
		w1 := binary.LittleEndian.Uint64(r[8:])
		w2 := binary.LittleEndian.Uint64(r[16:])
		w3 := binary.LittleEndian.Uint64(r[24:])
		if rot {
			w0, w1, w2, w3 = rotl32(w0), rotl32(w1), rotl32(w2), rotl32(w3)
		}
		// Bytes 0 and 2 of elements 0-3 (e01) and 4-7 (e23), bytes 1 and 3
		// likewise, then each of those split again.
		e01, o01 := unzip2(w0, w1)
		e23, o23 := unzip2(w2, w3)
		b0, b2 := unzip2(e01, e23)
		b1, b3 := unzip2(o01, o23)
		binary.LittleEndian.PutUint64(p0[i:], b0)
		binary.LittleEndian.PutUint64(p1[i:], b1)
		binary.LittleEndian.PutUint64(p2[i:], b2)
		binary.LittleEndian.PutUint64(p3[i:], b3)
	}
	for ; i < n; i++ {
		v := binary.LittleEndian.Uint32(raw[4*i:])
		if rot {
			v = v<<1 | v>>31
		}
		p0[i], p1[i], p2[i], p3[i] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
}

func merge4Go(out []byte, p0, p1, p2, p3 []byte, rot bool) {
	n := len(p0)
	p1, p2, p3 = p1[:n], p2[:n], p3[:n]
	out = out[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		e01, e23 := zip2(binary.LittleEndian.Uint64(p0[i:]), binary.LittleEndian.Uint64(p2[i:]))
		o01, o23 := zip2(binary.LittleEndian.Uint64(p1[i:]), binary.LittleEndian.Uint64(p3[i:]))
		w0, w1 := zip2(e01, o01)
		w2, w3 := zip2(e23, o23)
		if rot {
			w0, w1, w2, w3 = rotr32(w0), rotr32(w1), rotr32(w2), rotr32(w3)
		}
		o := out[4*i : 4*i+32]
		binary.LittleEndian.PutUint64(o[0:], w0)
		binary.LittleEndian.PutUint64(o[8:], w1)
		binary.LittleEndian.PutUint64(o[16:], w2)
		binary.LittleEndian.PutUint64(o[24:], w3)
	}
	for ; i < n; i++ {
		v := uint32(p0[i]) | uint32(p1[i])<<8 | uint32(p2[i])<<16 | uint32(p3[i])<<24
		if rot {
			v = v>>1 | v<<31
		}
		binary.LittleEndian.PutUint32(out[4*i:], v)
	}
}
