package object

import (
	"bytes"
	"testing"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// TestSplit2Kernels: the split2/merge2 in use (SSE2 on amd64) agree with the
// Go versions on every length around the 16-element blocks.
func TestSplit2Kernels(t *testing.T) {
	raw := tensortest.PseudoRandom(2*(1<<16+37), 5)
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 100, 1 << 16, 1<<16 + 37} {
		for _, rot := range []bool{false, true} {
			a0, a1 := make([]byte, n), make([]byte, n)
			b0, b1 := make([]byte, n), make([]byte, n)
			split2(raw, a0, a1, rot)
			split2Go(raw, b0, b1, rot)
			if !bytes.Equal(a0, b0) || !bytes.Equal(a1, b1) {
				t.Fatalf("split2 n=%d rot=%v", n, rot)
			}
			out := make([]byte, 2*n+3)
			merge2(out, a0, a1, rot)
			if !bytes.Equal(out[:2*n], raw[:2*n]) || !bytes.Equal(out[2*n:], []byte{0, 0, 0}) {
				t.Fatalf("merge2 n=%d rot=%v", n, rot)
			}
		}
	}
}

// TestMerge4Kernel: merge4 in use (SSE2 on amd64) agrees with merge4Go on
// every length around the 16-element blocks and does not write past.
func TestMerge4Kernel(t *testing.T) {
	raw := tensortest.PseudoRandom(4*(1<<12+37), 6)
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 100, 1 << 12, 1<<12 + 37} {
		for _, rot := range []bool{false, true} {
			var p [4][]byte
			for j := range p {
				p[j] = raw[j*n : (j+1)*n]
			}
			got, want := make([]byte, 4*n+3), make([]byte, 4*n+3)
			merge4(got[:4*n], p[0], p[1], p[2], p[3], rot)
			merge4Go(want[:4*n], p[0], p[1], p[2], p[3], rot)
			if !bytes.Equal(got, want) {
				t.Fatalf("merge4 n=%d rot=%v", n, rot)
			}
		}
	}
}
