// Package testrand makes the reproducible pseudo-random bytes the tests write:
// the same seed and length give the same bytes in every package and every run,
// so a failure names data that can be made again, and bytes that must not
// dedupe (different seeds) do not.
package testrand

// Bytes returns n bytes of an xorshift64 stream seeded by seed: 8 bytes per
// step, little-endian. Incompressible enough that the store keeps them raw.
func Bytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(x >> (8 * j))
		}
	}
	return b
}
