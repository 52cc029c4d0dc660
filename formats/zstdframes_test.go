package formats

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// ocdbtValues returns n zstd frames of compressible bytes (a bf16-like
// pattern: random low bytes, few high ones), 1.5 KiB to maxRaw before
// compression (400 KiB: some hold several blocks); every third without a
// checksum.
func ocdbtValues(t testing.TB, seed uint64, n, maxRaw int) [][]byte {
	crc, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	if err != nil {
		t.Fatal(err)
	}
	noCRC, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([][]byte, n)
	for i := range out {
		raw := make([]byte, 1536+r.IntN(maxRaw))
		for j := range raw {
			if j%2 == 0 {
				raw[j] = byte(r.Uint32())
			} else {
				raw[j] = 0x3c + byte(r.IntN(3))
			}
		}
		enc := crc
		if i%3 == 2 {
			enc = noCRC
		}
		out[i] = enc.EncodeAll(raw, nil)
	}
	return out
}

// ocdbtNode is a b-tree node: magic, length, body.
func ocdbtNode(seed uint64, body int) []byte {
	b := binary.LittleEndian.AppendUint64(append([]byte{}, ocdbtNodeMagic[:]...), uint64(12+body))
	return append(b, randBytes(seed, body)...)
}

// buildOCDBTFile lays out values in order, each followed by tail(i) (a
// zarr3 shard index; nil for none), with a node after every nodeEvery'th
// value (0: none) and two at the end, and pads the file with zeros to a
// multiple of 4096 (tensorstore writes its nodes after the values of a
// batch). It returns the file, where each value starts, and the bytes of
// its nodes and padding.
func buildOCDBTFile(values [][]byte, order []int, tail func(i int) []byte, nodeEvery int, nodeSeed uint64) (data []byte, starts []int64, other int) {
	var b bytes.Buffer
	node := func(k int) {
		n := ocdbtNode(nodeSeed+uint64(k), 300+k*7)
		b.Write(n)
		other += len(n)
	}
	for k, i := range order {
		starts = append(starts, int64(b.Len()))
		b.Write(values[i])
		if tail != nil {
			b.Write(tail(i))
		}
		if nodeEvery > 0 && k%nodeEvery == nodeEvery-1 {
			node(k)
		}
	}
	node(len(order))
	node(len(order) + 1)
	pad := (4096 - b.Len()%4096) % 4096
	b.Write(make([]byte, pad))
	return b.Bytes(), starts, other + pad
}

// TestZstdFrames: an OCDBT data file is cut at every frame and node (its
// index stays unknown), and the same values in another order and other
// files (what orbax's next save of an unchanged model writes) store
// nothing again but the nodes and the padding; with zarr3 shard indexes
// after the frames too.
func TestZstdFrames(t *testing.T) {
	values := ocdbtValues(t, 7, 24, 400<<10)
	order := make([]int, len(values))
	for i := range order {
		order[i] = i
	}
	shuffled := rand.New(rand.NewPCG(9, 2)).Perm(len(values))
	for _, tc := range []struct {
		name      string
		tail      func(i int) []byte
		nodeEvery int
		// slack is what a reordered file may store again beyond its nodes
		// and padding. zarr3: the first chunk of the value first in the
		// file (cut before its magic, where the others are cut after it)
		// and of the one that was first before.
		slack int64
	}{
		{"zarr2", nil, 4, 0},
		{"zarr3", func(i int) []byte { return randBytes(uint64(1000+i), 16*(1+i%3)+4) }, 0, 2 * 128 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, starts, _ := buildOCDBTFile(values, order, tc.tail, tc.nodeEvery, 1)
			cuts, ix := chunk(a, 1<<20, 0)
			checkCuts(t, a, cuts, ix, 1<<20)
			checkIndex(t, a, ix)
			if ix.Format != "" || len(ix.Tensors) != 0 {
				t.Fatalf("format %q, %d parts; want unknown", ix.Format, len(ix.Tensors))
			}
			isCut := map[int64]bool{}
			for _, c := range cuts {
				isCut[c] = true
			}
			for k, off := range starts {
				// zarr3: a frame after an index is found by its magic, and
				// cut just after it.
				start, end := off, off+int64(len(values[order[k]]))
				if tc.tail != nil {
					start += 4
				}
				if k > 0 && !isCut[start] || !isCut[end] {
					t.Fatalf("value %d [%d,%d): no cut at %d or at its end", k, off, end, start)
				}
			}
			checkSplitsAndParse(t, a, cuts, ix)

			b, _, other := buildOCDBTFile(values, shuffled, tc.tail, tc.nodeEvery, 2)
			cb, _ := chunk(b, 1<<20, 0)
			added := addedBytes(a, cuts, b, cb)
			if added > int64(other)+tc.slack {
				t.Errorf("the reordered file stores %d of %d bytes again; its nodes and padding are %d", added, len(b), other)
			}
			// CDC alone, for the log.
			pre := []byte("not a zstd file")
			ca, _ := chunk(append(pre, a...), 1<<20, 0)
			cc, _ := chunk(append(pre, b...), 1<<20, 0)
			t.Logf("%s: the reordered file of %d bytes stores %d again (nodes and padding: %d); by CDC alone: %d",
				tc.name, len(b), added, other, addedBytes(append(pre, a...), ca, append(pre, b...), cc))
		})
	}
}

// TestZstdFramesBroken: frames cut short, a reserved header bit, a block of
// type 3, a node of absurd length: the scan falls back to searching for the
// next magic, and the cuts stay well-formed and independent of how writes
// split the file.
func TestZstdFramesBroken(t *testing.T) {
	values := ocdbtValues(t, 3, 3, 400<<10)
	good := slices.Concat(values[0], values[1])
	fhd := bytes.Clone(good)
	fhd[4] |= 0x08
	typ3 := bytes.Clone(values[0])
	// The first block header follows the 4-byte magic, the descriptor and
	// the header fields it names.
	hl := 5 + zstdHeaderRest(typ3[4])
	typ3[hl] |= 0x06
	node := binary.LittleEndian.AppendUint64(append([]byte{}, ocdbtNodeMagic[:]...), 1<<62)
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"truncated", good[:len(good)-10]},
		{"reserved-bit", fhd},
		{"block-type-3", slices.Concat(typ3, values[2])},
		{"huge-node", slices.Concat(node, values[2])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cuts, ix := chunk(tc.data, 1<<20, 0)
			checkCuts(t, tc.data, cuts, ix, 1<<20)
			checkIndex(t, tc.data, ix)
			if ix.Format != "" {
				t.Fatalf("format %q", ix.Format)
			}
			c1, _ := chunk(tc.data, 1<<20, 1)
			if !reflect.DeepEqual(cuts, c1) {
				t.Fatal("1-byte writes cut differently")
			}
		})
	}
}

// zstdHeaderRest is the length of a frame header after its descriptor.
func zstdHeaderRest(fhd byte) int {
	n := []int{0, 1, 2, 4}[fhd&3]
	if fhd&0x20 == 0 {
		n++
	}
	if fcs := fhd >> 6; fcs > 0 {
		n += 1 << fcs
	} else if fhd&0x20 != 0 {
		n++
	}
	return n
}

// addedBytes is how many bytes of b's chunks a's chunks lack.
func addedBytes(a []byte, ca []int64, b []byte, cb []int64) int64 {
	have := chunkSet(a, ca)
	var added int64
	prev := int64(0)
	for _, c := range cb {
		if !have[sha256.Sum256(b[prev:c])] {
			added += c - prev
		}
		prev = c
	}
	return added
}

// TestZstdFramesResync: a block header that is not one, whose bytes and the
// next form a frame's magic, is searched like any unknown bytes: the cut
// goes after that magic.
func TestZstdFramesResync(t *testing.T) {
	frame := ocdbtValues(t, 5, 1, 64<<10)[0]
	// magic, a descriptor with a window byte and nothing else, the window
	// byte, then "28 b5 2f" (a raw block of 390,821 bytes: too large) and
	// "fd": the magic of the frame that follows.
	data := slices.Concat(zstdMagic[:], []byte{0x00, 0x58}, frame)
	cuts, ix := chunk(data, 1<<20, 0)
	checkCuts(t, data, cuts, ix, 1<<20)
	if !slices.Contains(cuts, 10) {
		t.Fatalf("cuts %v: none after the magic at 6", cuts[:min(len(cuts), 8)])
	}
	c1, _ := chunk(data, 1<<20, 1)
	if !reflect.DeepEqual(cuts, c1) {
		t.Fatal("1-byte writes cut differently")
	}
}

// TestZstdFramesRation: 8 MiB of empty 9-byte frames make about one cut a
// KiB, not one a frame.
func TestZstdFramesRation(t *testing.T) {
	empty := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00} // single segment, size 0, one empty last raw block
	data := bytes.Repeat(empty, (8<<20)/len(empty))
	cuts, ix := chunk(data, 1<<20, 0)
	checkCuts(t, data, cuts, ix, 1<<20)
	if max := len(data)/zfCutBytes + zfCutBurst + len(data)/(8<<10) + 1; len(cuts) > max {
		t.Fatalf("%d cuts in %d bytes of empty frames, want at most %d", len(cuts), len(data), max)
	}
	if len(cuts) < len(data)/zfCutBytes/2 {
		t.Fatalf("%d cuts in %d bytes: the frames were not followed", len(cuts), len(data))
	}
}
