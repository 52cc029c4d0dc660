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
// just after the magic (the scan cannot cut behind itself), whose four
// bytes are the same for every frame, so the chunks of a value after
// unknown bytes are alike whatever those bytes are. A value keeps its
// chunks as long as what precedes it stays of the same kind: in zarr3 every
// value follows its predecessor's shard index, except the first of a file
// and one after a node (tensorstore writes nodes after a batch's values),
// which are cut before their magic and so lose their first chunk when they
// move. A plain .zst file (one frame, or frames written by a parallel
// compressor) is read the same way.
//
// Forced cuts are rationed to one per KiB of the file so far (after a first
// 16): a file of empty 9-byte frames must not make a chunk of each (a
// chunk costs an index row and a manifest entry). Real data files, whose
// values are over 1 KiB (smaller ones sit in the b-tree), never run short.
//
// The scan only adds cuts: the file's index stays unknown (Format ""), with
// no parts, and Parse does not read such a file at all. Listing frames
// would name them "frame.N" in files whose names change with every save,
// which log and diff would pair by nothing. Appends to such a file copy it
// (CutsByContent is false: a content-only chunker cannot resume the scan).

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

// zfCutBytes and zfCutBurst ration forced cuts (see above).
const (
	zfCutBytes = 1 << 10
	zfCutBurst = 16
)

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
	cuts     int64   // forced cuts made
}

// cut makes a forced cut after the first i bytes of b, if the ration
// allows one there.
func (s *zstdFrames) cut(i int) (int, cutRule, bool) {
	if s.cuts >= (s.pos+int64(i))/zfCutBytes+zfCutBurst {
		return 0, cutNone, false
	}
	s.cuts++
	return s.advance(i), cutAlways, true
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
				if n, rule, ok := s.cut(i); ok {
					return n, rule, nil
				}
			}
		case zfSeg:
			if s.hdrN == 0 && b[i] == 0 {
				s.st = zfZero
				continue
			}
			i++
			if !s.gather(b[i-1], 4) {
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
				if n, rule, ok := s.cut(i); ok {
					return n, rule, nil
				}
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
			i++
			if !s.gather(b[i-1], 3) {
				continue
			}
			h := uint32(s.hdr[0]) | uint32(s.hdr[1])<<8 | uint32(s.hdr[2])<<16
			s.hdrN = 0
			typ, size := h>>1&3, int64(h>>3)
			if typ == 3 || size > zstdMaxBlock {
				s.st, s.win = zfOther, h>>16|h>>8&0xff<<8|h&0xff<<16 // its bytes in file order
				continue
			}
			if typ == 1 { // RLE: one byte repeated
				size = 1
			}
			s.st, s.skip, s.then = zfSkip, size, zfBlock
			if h&1 != 0 { // the frame's last block
				if s.checksum {
					s.skip += 4
				}
				s.then = zfSeg
			}
		case zfNodeLen:
			i++
			if !s.gather(b[i-1], 8) {
				continue
			}
			n := binary.LittleEndian.Uint64(s.hdr[:8])
			s.hdrN = 0
			if n < 12 || n > maxOCDBTNode {
				s.st, s.win = zfOther, binary.BigEndian.Uint32(s.hdr[4:8])
				continue
			}
			s.st, s.skip, s.then = zfSkip, int64(n)-12, zfSeg
		}
	}
	return s.advance(len(b)), cutNone, nil
}

// gather adds c to the header being read and reports whether it now holds
// n bytes.
func (s *zstdFrames) gather(c byte, n int) bool {
	s.hdr[s.hdrN] = c
	s.hdrN++
	return s.hdrN == n
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
