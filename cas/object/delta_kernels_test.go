package object

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// TestDeltaKernels: the kernels in use (assembly and SSE2 on amd64) agree
// with the Go versions on every length around their 16-byte blocks, in
// place too, and undo what the transforms did.
func TestDeltaKernels(t *testing.T) {
	for _, elem := range []int{2, 4} {
		base, next := tensortest.SyntheticStep(9, (1<<16+37)/elem*elem, elem, 0.05)
		for _, n := range []int{0, 1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 48, 100, 1 << 16, 1<<16 + 37} {
			n = min(n, len(base))
			t.Run(fmt.Sprintf("elem%d/len%d", elem, n), func(t *testing.T) {
				m := n / elem * elem
				z := make([]byte, n)
				makeDelta(deltaSub, elem, z, next[:n], base[:n])
				undo := map[int]func(out, z, base []byte){2: undoSub16, 4: undoSub32}[elem]
				undoGo := map[int]func(out, z, base []byte){2: undoSub16Go, 4: undoSub32Go}[elem]
				got, want := make([]byte, m+3), make([]byte, m+3)
				undo(got[:m], z[:m], base[:m])
				undoGo(want[:m], z[:m], base[:m])
				if !bytes.Equal(got, want) || !bytes.Equal(got[:m], next[:m]) {
					t.Fatal("undoSub differs")
				}
				inPlace := bytes.Clone(z[:m])
				undo(inPlace, inPlace, base[:m])
				if !bytes.Equal(inPlace, next[:m]) {
					t.Fatal("undoSub in place differs")
				}
				x := make([]byte, n+3)
				xorBytes(x[:n], next[:n], base[:n])
				xg := make([]byte, n+3)
				xorBytesGo(xg[:n], next[:n], base[:n])
				if !bytes.Equal(x, xg) {
					t.Fatal("xorBytes differs")
				}
				xorBytes(x[:n], x[:n], base[:n])
				if !bytes.Equal(x[:n], next[:n]) {
					t.Fatal("xorBytes in place does not undo")
				}
			})
		}
	}
}

// TestGatherClassed: the gather in use agrees with the Go version and undoes
// makeClassedDelta's grouping, block after block as undoClassedDelta calls
// it; offsets that overrun the deltas stop it with false, never a read past
// them.
func TestGatherClassed(t *testing.T) {
	for _, elem := range []int{2, 4} {
		base, next := tensortest.SyntheticStep(10, 6*deltaMinClass+13, elem, 0.05)
		n := len(base) / elem
		cl := classesOf(base, elem, n)
		if len(cl.counts) < 3 {
			t.Fatalf("elem %d: %d classes, the test wants several", elem, len(cl.counts))
		}
		perm := make([]byte, n*elem)
		makeClassedDelta(deltaXOR, elem, &cl, perm, next, base, n)
		start := func() (off [256]uint32) {
			pos := 0
			for k, c := range cl.counts {
				off[k] = uint32(pos)
				pos += c
			}
			return off
		}
		for _, blk := range []int{1, 7, 16, 1000, n} {
			for name, gather := range map[string]func(int, []byte, []byte, []byte, *[256]uint8, *[256]uint32) bool{
				"in use": gatherClassed, "go": gatherClassedGo,
			} {
				out := make([]byte, n*elem)
				off := start()
				for s := 0; s < n; s += blk {
					e := min(s+blk, n)
					if !gather(elem, out[s*elem:e*elem], perm, base[s*elem:e*elem], &cl.of, &off) {
						t.Fatalf("elem %d, %s, block %d: refused", elem, name, blk)
					}
				}
				xorBytes(out, out, base[:n*elem])
				if !bytes.Equal(out, next[:n*elem]) {
					t.Fatalf("elem %d, %s, block %d: differs", elem, name, blk)
				}
			}
		}
		for name, gather := range map[string]func(int, []byte, []byte, []byte, *[256]uint8, *[256]uint32) bool{
			"in use": gatherClassed, "go": gatherClassedGo,
		} {
			off := start()
			for k := range cl.counts {
				off[k] += uint32(n / 2) // every class starts half-way: the last ones overrun
			}
			if gather(elem, make([]byte, n*elem), perm, base, &cl.of, &off) {
				t.Errorf("elem %d, %s: overrunning offsets accepted", elem, name)
			}
		}
	}
}

// TestHuffmanSingleAndMulti: a Huffman section decodes to the same bytes
// with the single-symbol table as with the multi-symbol one, whatever the
// plane's size (decodeHuffman picks by size), and a damaged section fails
// either way.
func TestHuffmanSingleAndMulti(t *testing.T) {
	base, next := tensortest.SyntheticStep(4, 64<<10, 2, 0.01)
	z := make([]byte, len(base))
	makeDelta(deltaSub, 2, z, next, base)
	for _, plane := range []int{0, 1} {
		p := make([]byte, len(z)/2)
		for i := range p {
			p[i] = z[2*i+plane]
		}
		for _, n := range []int{3, 64, 1000, hufStreamMin - 1, hufStreamMin, hufSingleMax, hufSingleMax + 1, len(p)} {
			var h hufEnc
			if distinct, lo, hi, _ := h.histogram(p[:n]); distinct > 1 {
				h.buildLengths()
				sec, _ := h.appendHuffman(nil, p[:n], lo, hi, false)
				for _, multi := range []bool{false, true} {
					var d hufDec
					got := make([]byte, n)
					if err := d.decode(got, sec, multi); err != nil || !bytes.Equal(got, p[:n]) {
						t.Fatalf("plane %d, %d symbols, multi %v: %v", plane, n, multi, err)
					}
					bad := bytes.Clone(sec)
					bad = bad[:len(bad)-1]
					if err := d.decode(got, bad, multi); err == nil {
						t.Errorf("plane %d, %d symbols, multi %v: a truncated section decoded", plane, n, multi)
					}
				}
			}
		}
	}
}
