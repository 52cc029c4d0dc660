package object

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"testing"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// chunkPair is a chunk (b) and its base (a).
type chunkPair struct{ a, b []byte }

// BenchmarkDeltaClassPasses times the passes of a classed delta's decode
// that are not entropy decoding: deriving the classes from the base and
// undoing the grouped delta.
func BenchmarkDeltaClassPasses(b *testing.B) {
	for _, elem := range []int{2, 4} {
		base, next := tensortest.SyntheticStep(1, (1<<20)/elem, elem, 0.01)
		n := len(base) / elem
		perm, out := make([]byte, len(base)), make([]byte, len(base))
		for _, t := range []deltaTransform{deltaXOR, deltaSub} {
			cl := classesOf(base, elem, n)
			makeClassedDelta(t, elem, &cl, perm, next, base, n)
			b.Run(fmt.Sprintf("elem%d/%v/classesOf", elem, t), func(b *testing.B) {
				b.SetBytes(int64(len(base)))
				for b.Loop() {
					cl = classesOf(base, elem, n)
				}
			})
			b.Run(fmt.Sprintf("elem%d/%v/undo", elem, t), func(b *testing.B) {
				b.SetBytes(int64(len(base)))
				for b.Loop() {
					undoClassedDelta(t, elem, &cl, out, perm, base, n)
				}
				if !slices.Equal(out, next) {
					b.Fatal("undo differs")
				}
			})
		}
	}
}

// BenchmarkDeltaVariantDecode decodes the same chunks as each delta variant
// (forced) and standalone, against bases given in memory: the codec's share
// of a delta read, per variant. Chunks: bf16 (and fp32) pairs from
// $CKPTFS_DELTA_DIR saves one apart, or syntheticStep.
func BenchmarkDeltaVariantDecode(b *testing.B) {
	c, err := NewCoder()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, elem := range []int{2, 4} {
		var pairs []chunkPair
		if dir := os.Getenv("CKPTFS_DELTA_DIR"); dir != "" {
			kind := map[int]string{2: "bf16/model.safetensors", 4: "fp32/model.safetensors"}[elem]
			steps, _ := filepath.Glob(filepath.Join(dir, "step-*"))
			sort.Strings(steps)
			fa, err := tensortest.CutFile(filepath.Join(steps[len(steps)-2], kind), 1<<20)
			if err != nil {
				b.Fatal(err)
			}
			fb, err := tensortest.CutFile(filepath.Join(steps[len(steps)-1], kind), 1<<20)
			if err != nil {
				b.Fatal(err)
			}
			for i := range min(len(fa), len(fb)) {
				if fa[i].Elem == elem && len(fa[i].Data) == len(fb[i].Data) && len(fa[i].Data) >= 64<<10 {
					pairs = append(pairs, chunkPair{fa[i].Data, fb[i].Data})
				}
			}
		} else {
			for i := range 8 {
				a, bb := tensortest.SyntheticStep(uint64(i), (1<<20)/elem, elem, 0.01)
				pairs = append(pairs, chunkPair{a, bb})
			}
		}
		var total int64
		for _, p := range pairs {
			total += int64(len(p.b))
		}
		buf := make([]byte, 1<<20)
		alloc := func(n int) []byte { return buf[:n] }
		type coded struct {
			id, bid ID
			obj     []byte
			base    []byte
		}
		run := func(name string, objs []coded) {
			var stored int64
			for _, o := range objs {
				stored += int64(len(o.obj))
			}
			b.Run(fmt.Sprintf("elem%d/%s", elem, name), func(b *testing.B) {
				b.SetBytes(total)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				c0 := tensortest.ThreadCPU()
				for b.Loop() {
					for _, o := range objs {
						var bf BaseFunc
						if o.base != nil {
							bf = func(ID) ([]byte, func(), error) { return o.base, func() {}, nil }
						}
						if _, err := c.DecodeInto(o.id, o.obj, alloc, bf); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(stored)/float64(total), "ratio")
				// CPU time of this thread: what the machine's other
				// processes disturb least.
				b.ReportMetric(float64(total)*float64(b.N)/(tensortest.ThreadCPU()-c0).Seconds()/1e6, "cpu-MB/s")
			})
		}
		var std []coded
		for _, p := range pairs {
			obj, _ := c.Encode(p.b, Hint{ElemSize: elem})
			std = append(std, coded{id: Sum(p.b), obj: obj})
		}
		run("standalone", std)
		for _, t := range deltaVariants {
			var objs []coded
			for _, p := range pairs {
				obj := encodeDeltaVariant(c, t, p.b, p.a, elem)
				objs = append(objs, coded{Sum(p.b), Sum(p.a), obj, p.a})
			}
			run(t.String(), objs)
		}
	}
}

// encodeDeltaVariant is EncodeDelta with the variant forced.
func encodeDeltaVariant(c *Coder, t deltaTransform, raw, base []byte, elem int) []byte {
	obj := make([]byte, HeaderSize+DeltaExtSize)
	var codec Codec
	if t&deltaClassed != 0 {
		obj = c.appendClassed(obj, raw, base, make([]byte, len(raw)), t&^deltaClassed, elem)
	} else {
		d := make([]byte, len(raw))
		makeDelta(t, elem, d, raw, base)
		codec, obj = c.appendEncoded(obj, d, Hint{ElemSize: elem})
	}
	x := obj[HeaderSize:]
	bid := Sum(base)
	copy(x[:32], bid[:])
	x[32] = byte(t)
	x[33] = byte(elem)
	payload := obj[HeaderSize:]
	hdr := Header{Codec: codec, RawLen: uint32(len(raw)), PayloadLen: uint32(len(payload)),
		CRC: crc32.Checksum(payload, castagnoli), Delta: true}
	copy(obj, hdr.marshal())
	return obj
}

// BenchmarkHuffmanSmallPlanes decodes Huffman planes of a bf16 sub delta's
// low byte (about 5 bits a symbol) and high byte (about 1), of the sizes a
// classed delta's classes have, with the multi-symbol table and with the
// single-symbol one only: where hufSingleMax should be.
func BenchmarkHuffmanSmallPlanes(b *testing.B) {
	base, next := tensortest.SyntheticStep(3, 256<<10, 2, 0.01)
	z := make([]byte, len(base))
	makeDelta(deltaSub, 2, z, next, base)
	for _, plane := range []int{0, 1} {
		p := make([]byte, len(z)/2)
		for i := range p {
			p[i] = z[2*i+plane]
		}
		for _, n := range []int{2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10} {
			var h hufEnc
			_, lo, hi, _ := h.histogram(p[:n])
			h.buildLengths()
			sec, _ := h.appendHuffman(nil, p[:n], lo, hi, false)
			dst := make([]byte, n)
			for _, multi := range []bool{false, true} {
				b.Run(fmt.Sprintf("plane%d/n%d/multi=%v", plane, n, multi), func(b *testing.B) {
					var d hufDec
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					c0 := tensortest.ThreadCPU()
					for b.Loop() {
						if err := d.decode(dst, sec, multi); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64((tensortest.ThreadCPU()-c0).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/symbol")
					b.ReportMetric(float64(len(sec))*8/float64(n), "bits/symbol")
				})
			}
		}
	}
}
