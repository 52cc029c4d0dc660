package formats

import "encoding/binary"

// OCDBT data files (tensorstore's key-value store, which orbax-checkpoint
// saves JAX arrays into by default) hold each stored value, one zarr chunk
// of one array, as one zstd frame, and the store's b-tree nodes, back to
// back, with no header, index or alignment; a file may end in zeros. Orbax
// writes the same compressed bytes for an unchanged array in every save,
// but batches them into new files in whatever order its threads finish:
// content-defined cutting alone loses the chunk across every boundary whose
// neighbour changed, all of a value smaller than a chunk (an unchanged
// re-save of an 8-way sharded model stored 61% of its bytes again). The
// scanner below cuts at every frame and node boundary, and content-defined
// cutting restarts inside each value at its first byte, so a value stored
// before keeps its chunks wherever it lands (0.15 MiB of 13.5 per re-save
// in that case; a changed value costs about its changed blocks).
//
// The frames are followed, not decoded: a frame header's descriptor byte
// gives the header's length, and each block's 3-byte header its size (RFC
// 8878), so the scanner reads a few bytes every 128 KiB at most. A node is
// a 4-byte magic and a little-endian 64-bit length that covers the whole
// node. Bytes that are neither (a zarr3 shard's index, raw values written
// without compression) are searched for the next magic; there the cut goes
// just after the magic, whose four bytes are the same for every frame, so a
// value's chunks are alike whatever precedes it. A plain .zst file (one
// frame, or frames written by a parallel compressor) is read the same way.
//
// The scan only adds cuts: the file's index stays unknown (Format ""), with
// no parts. Listing frames would name them "frame.N" in files whose names
// change with every save, which log and diff would pair by nothing.

// fmtZstdFrames is the Chunker's format while it scans such a file; its
// Index says unknown.
const fmtZstdFrames = "zstd-frames"

var (
	zstdMagic      = [4]byte{0x28, 0xb5, 0x2f, 0xfd}
	ocdbtNodeMagic = [4]byte{0x0c, 0xdb, 0x20, 0xde}
	ocdbtManMagic  = [4]byte{0x0c, 0xdb, 0x3a, 0x2a} // manifest.ocdbt
)

// zstdMaxBlock is the largest block a frame may hold (RFC 8878 3.1.1.2.3).
const zstdMaxBlock = 128 << 10

// maxOCDBTNode bounds the length an OCDBT node may claim.
const maxOCDBTNode = 1 << 40

type zfState uint8

const (
	zfSeg     zfState = iota // at a segment boundary: its magic (hdr) or a zero
	zfZero                   // a run of zeros
	zfOther                  // unknown bytes: searched for a magic
	zfFHD                    // a frame's header descriptor
	zfBlock                  // a block header (hdr)
	zfNodeLen                // a node's length (hdr)
	zfSkip                   // skip bytes, then then
)

// zstdFrames scans zstd frames and OCDBT nodes (see above).
type zstdFrames struct {
	pos      int64 // file offset of b[0] in scan
	st       zfState
	hdr      [8]byte
	hdrN     int
	win      uint32 // the last four bytes of an unknown run, first byte highest
	skip     int64
	then     zfState // after a skip: zfBlock, or zfSeg at a segment's end
	checksum bool    // the frame ends in a 4-byte checksum
	last     bool    // the block being skipped is the frame's last
}

func sniffZstdFrames(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	m := [4]byte(b[:4])
	return m == zstdMagic || m == ocdbtNodeMagic || m == ocdbtManMagic
}

func (s *zstdFrames) scan(b []byte) (int, cutRule, error) {
	// A skip that ends where b does still ends its segment here.
	for i := 0; i < len(b) || s.st == zfSkip && s.skip == 0; {
		switch s.st {
		case zfSkip:
			k := min(s.skip, int64(len(b)-i))
			s.skip -= k
			i += int(k)
			if s.skip > 0 {
				continue
			}
			s.st = s.then
			if s.then == zfSeg { // a segment ends: cut
				return s.advance(i), cutAlways, nil
			}
		case zfSeg:
			if s.hdrN == 0 && b[i] == 0 {
				s.st = zfZero
				continue
			}
			s.hdr[s.hdrN] = b[i]
			s.hdrN++
			i++
			if s.hdrN < 4 {
				continue
			}
			if !s.begin([4]byte(s.hdr[:4])) {
				s.st, s.win = zfOther, binary.BigEndian.Uint32(s.hdr[:4])
			}
		case zfZero:
			if b[i] != 0 {
				s.st, s.win = zfOther, 0
				continue
			}
			i++
		case zfOther:
			s.win = s.win<<8 | uint32(b[i])
			i++
			var m [4]byte
			binary.BigEndian.PutUint32(m[:], s.win)
			if s.begin(m) {
				// A cut after the magic (see above).
				return s.advance(i), cutAlways, nil
			}
		case zfFHD:
			fhd := b[i]
			i++
			if fhd&0x08 != 0 { // reserved bit
				s.st, s.win = zfOther, uint32(fhd)
				continue
			}
			single := fhd&0x20 != 0
			s.checksum = fhd&0x04 != 0
			n := int64([4]int{0, 1, 2, 4}[fhd&3]) // dictionary ID
			if !single {
				n++ // window descriptor
			}
			switch fcs := fhd >> 6; {
			case fcs > 0:
				n += 1 << fcs // 2, 4 or 8 bytes
			case single:
				n++
			}
			s.st, s.skip, s.then, s.hdrN = zfSkip, n, zfBlock, 0
		case zfBlock:
			s.hdr[s.hdrN] = b[i]
			s.hdrN++
			i++
			if s.hdrN < 3 {
				continue
			}
			h := uint32(s.hdr[0]) | uint32(s.hdr[1])<<8 | uint32(s.hdr[2])<<16
			s.hdrN = 0
			typ, size := h>>1&3, int64(h>>3)
			if typ == 3 || size > zstdMaxBlock {
				s.st, s.win = zfOther, h
				continue
			}
			if typ == 1 { // RLE: one byte repeated
				size = 1
			}
			s.last = h&1 != 0
			s.st, s.skip, s.then = zfSkip, size, zfBlock
			if s.last {
				if s.checksum {
					s.skip += 4
				}
				s.then = zfSeg
			}
		case zfNodeLen:
			s.hdr[s.hdrN] = b[i]
			s.hdrN++
			i++
			if s.hdrN < 8 {
				continue
			}
			n := binary.LittleEndian.Uint64(s.hdr[:8])
			s.hdrN = 0
			if n < 12 || n > maxOCDBTNode {
				s.st, s.win = zfOther, uint32(n)
				continue
			}
			s.st, s.skip, s.then = zfSkip, int64(n)-12, zfSeg
		}
	}
	return s.advance(len(b)), cutNone, nil
}

// begin starts the segment whose magic is m, if it is one.
func (s *zstdFrames) begin(m [4]byte) bool {
	s.hdrN = 0
	switch m {
	case zstdMagic:
		s.st = zfFHD
	case ocdbtNodeMagic, ocdbtManMagic:
		s.st = zfNodeLen
	default:
		return false
	}
	return true
}

func (s *zstdFrames) advance(n int) int        { s.pos += int64(n); return n }
func (s *zstdFrames) dataLen() (int64, string) { return 0, "" }
func (s *zstdFrames) parts() []Tensor          { return nil }

// complete: the file may end between segments, in zeros or in unknown
// bytes, not inside a frame or node.
func (s *zstdFrames) complete() bool {
	return s.st == zfSeg && s.hdrN == 0 || s.st == zfZero || s.st == zfOther
}
