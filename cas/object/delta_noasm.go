//go:build !amd64 || purego

package object

func gatherClassed(elem int, dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool {
	return gatherClassedGo(elem, dst, perm, base, of, off)
}

func undoSub16(out, z, base []byte) { undoSub16Go(out, z, base) }
func undoSub32(out, z, base []byte) { undoSub32Go(out, z, base) }
func xorBytes(dst, a, b []byte)     { xorBytesGo(dst, a, b) }
