//go:build amd64 && !purego

package object

// Kernels of undoing a delta (delta_amd64.s; delta_kernels.go has the Go
// versions and the figures). SSE2 is part of every amd64 CPU. The SSE2
// kernels take a multiple of 16 bytes; the wrappers give the rest to Go.

//go:noescape
func gather2Asm(dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool

//go:noescape
func gather4Asm(dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool

//go:noescape
func undoSub16SSE2(out, z, base []byte)

//go:noescape
func undoSub32SSE2(out, z, base []byte)

//go:noescape
func xorSSE2(dst, a, b []byte)

// gatherClassed is gatherClassedGo.
func gatherClassed(elem int, dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool {
	n := len(dst) / elem * elem
	dst, base = dst[:n], base[:n] // the kernels read base as far as dst
	if elem == 2 {
		return gather2Asm(dst, perm, base, of, off)
	}
	return gather4Asm(dst, perm, base, of, off)
}

// undoSub16 is undoSub16Go.
func undoSub16(out, z, base []byte) {
	n := len(z)
	out, base = out[:n], base[:n]
	m := n &^ 15
	undoSub16SSE2(out[:m], z[:m], base[:m])
	undoSub16Go(out[m:], z[m:], base[m:])
}

// undoSub32 is undoSub32Go.
func undoSub32(out, z, base []byte) {
	n := len(z)
	out, base = out[:n], base[:n]
	m := n &^ 15
	undoSub32SSE2(out[:m], z[:m], base[:m])
	undoSub32Go(out[m:], z[m:], base[m:])
}

// xorBytes is xorBytesGo.
func xorBytes(dst, a, b []byte) {
	n := len(dst)
	a, b = a[:n], b[:n]
	m := n &^ 15
	xorSSE2(dst[:m], a[:m], b[:m])
	xorBytesGo(dst[m:], a[m:], b[m:])
}
