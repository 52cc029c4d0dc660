package formats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// ErrFormat is wrapped by every error Parse returns: the file starts like a
// known format but is truncated, inconsistent, or exceeds a safety limit.
// Callers test it with errors.Is and fall back to content-defined chunking.
var ErrFormat = errors.New("formats: malformed file")

// Safety limits. They bound the memory a hostile file can make a parser or a
// Chunker use; real checkpoints stay far below them.
const (
	// maxHeaderSize bounds every header the parsers hold in memory: the
	// safetensors JSON header (the reference implementation's limit), the
	// GGUF header (KVs + tensor infos), a torch data.pkl and the
	// central-directory-free zip lookahead.
	maxHeaderSize = 100_000_000
	// maxNPYHeader bounds a .npy header (numpy itself refuses > 10000 bytes
	// unless told otherwise).
	maxNPYHeader = 1 << 20
	// maxDims bounds the rank of a tensor in every format.
	maxDims = 64
)

// Format names used in Index.Format.
const (
	fmtSafetensors = "safetensors"
	fmtTorch       = "torch"
	fmtDistcp      = "distcp" // torch.save archives one after another (see stepZipNext)
	fmtGGUF        = "gguf"
	fmtNPY         = "npy"
	fmtNPZ         = "npz"
)

// Tensor is one tensor's location in a file.
type Tensor struct {
	// Name is the safetensors key, the torch state-dict key path joined with
	// "." (e.g. "model.layer.0.weight" or "state.0.exp_avg"; "" for a bare
	// tensor saved on its own), the GGUF tensor name, or the npz member name
	// without its ".npy" suffix ("" for a .npy file).
	Name string
	// DType is the canonical lower-case element type ("f32", "bf16",
	// "f8_e4m3", "q4_0", ...); see DTypeBits. Types without a canonical
	// name (e.g. big-endian or string numpy dtypes) keep their native
	// spelling ("<U10", ">f4").
	DType string
	// Shape is in C order (slowest-varying dimension first) for every
	// format, GGUF included. A scalar has an empty shape.
	Shape []int64
	// Offset is the byte offset of the tensor's first element in the file.
	Offset int64
	// Length is the number of bytes from Offset to the end of the tensor's
	// last element. For a non-contiguous torch view it spans the gaps.
	Length int64
}

// SegmentKind classifies a segment of a file.
type SegmentKind uint8

const (
	// KindOther marks bytes no parser understood: unknown formats, padding
	// between GGUF tensors, trailing bytes.
	KindOther SegmentKind = iota
	// KindMeta marks format structure: headers, pickles, zip local headers,
	// data descriptors and central directories.
	KindMeta
	// KindData marks one tensor's (or one torch storage record's, or one
	// npz member's array) raw element bytes.
	KindData
)

// String returns "other", "meta" or "data".
func (k SegmentKind) String() string {
	switch k {
	case KindOther:
		return "other"
	case KindMeta:
		return "meta"
	case KindData:
		return "data"
	}
	return fmt.Sprintf("SegmentKind(%d)", uint8(k))
}

// Segment is a byte range of a file.
type Segment struct {
	Offset, Length int64
	Kind           SegmentKind
	// DType is the element type of a KindData segment when known (see
	// Tensor.DType), so that a compressor knows the element width; it is
	// "" for other kinds.
	DType string
}

// Index is what a parser learned about a file.
type Index struct {
	// Format is "safetensors", "torch", "distcp" (torch.save archives one
	// after another, as torch.distributed.checkpoint writes them; the
	// tensors are numbered "0", "1", ... counting only the archives that
	// hold tensors, "k.<name>" for one of several in an archive), "gguf",
	// "npy", "npz", a part format
	// ("xgboost-json", "xgboost-ubj", "lightgbm", "pickle"; see
	// IsPartFormat), or "" when the format is unknown (or, from a Chunker,
	// when the stream did not parse).
	Format string
	// Segments are ascending, non-overlapping and together cover the whole
	// file: metadata segments, one KindData segment per non-empty tensor
	// data range (safetensors, gguf, npy), per torch storage record, or per
	// npz member array, and KindOther for the rest. Adjacent non-data
	// segments of one kind are merged. An unknown format gives one KindOther
	// segment (none for an empty file).
	Segments []Segment
	// Tensors are sorted by Offset, then Name. In a part format they are
	// its parts (trees, pickled buffers; see DTypeTree, DTypeBuffer).
	Tensors []Tensor
}

// Parse reads a whole file through r (size bytes) and returns its index.
//
// An unknown format gives an Index with Format "" and a nil error. A file
// that starts like a known format but is broken, truncated or exceeds a
// safety limit gives an error wrapping ErrFormat; callers then fall back to
// content-defined chunking. Parse never executes anything from the file
// (torch pickles are interpreted by an allow-list, see the package doc) and
// its memory use is bounded by the limits in the package doc, not by size.
// r may be read concurrently by other goroutines.
func Parse(r io.ReaderAt, size int64) (*Index, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrFormat, size)
	}
	var head [16]byte
	n, err := r.ReadAt(head[:min(int64(len(head)), size)], 0)
	if n < int(min(int64(len(head)), size)) {
		return nil, fmt.Errorf("formats: reading header: %w", err)
	}
	var ix *Index
	switch sniff(head[:n]) {
	case fmtSafetensors:
		ix, err = parseSafetensors(r, size)
	case fmtGGUF:
		ix, err = parseGGUF(r, size)
	case fmtNPY:
		ix, err = parseNPY(r, size)
	case "zip":
		ix, err = parseZip(r, size)
	default:
		if sc, format := sniffParts(head[:n]); sc != nil {
			if format == fmtZstdFrames {
				return unknownIndex(size), nil // cut by frames, indexed as unknown
			}
			return parseParts(r, size)
		}
		return unknownIndex(size), nil
	}
	if err == nil {
		err = checkTensorBounds(ix, size)
	}
	if err != nil {
		return nil, err
	}
	return ix, nil
}

// checkTensorBounds rejects tensors outside the file, including empty ones
// whose offset alone lies past its end.
func checkTensorBounds(ix *Index, size int64) error {
	for _, t := range ix.Tensors {
		if t.Offset < 0 || t.Length < 0 || t.Offset > size || t.Length > size-t.Offset {
			return errorf(ix.Format, "tensor %q [%d,+%d) lies outside the file of %d bytes", t.Name, t.Offset, t.Length, size)
		}
	}
	return nil
}

// sniff names the format family from a file's first bytes (at least 10
// when the file has them): a format name, "zip", or "".
func sniff(b []byte) string {
	switch {
	case len(b) >= 4 && string(b[:4]) == zipLocalSig:
		return "zip"
	case len(b) >= 4 && string(b[:4]) == ggufMagic:
		return fmtGGUF
	case len(b) >= 6 && string(b[:6]) == npyMagic:
		return fmtNPY
	case len(b) >= 10 && b[8] == '{' && strings.IndexByte("\"} \t\r\n", b[9]) >= 0:
		// Any length is sniffed (a JSON object must start "{\"" or "{}"),
		// so that a huge one fails with a clear error rather than passing
		// as unknown.
		if binary.LittleEndian.Uint64(b) >= 2 {
			return fmtSafetensors
		}
	}
	return ""
}

// unknownIndex is the index of a file nothing understood.
func unknownIndex(size int64) *Index {
	ix := &Index{}
	if size > 0 {
		ix.Segments = []Segment{{Offset: 0, Length: size, Kind: KindOther}}
	}
	return ix
}

// errorf wraps ErrFormat with a format name and a message.
func errorf(format, msg string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrFormat, format, fmt.Sprintf(msg, args...))
}

// segmentBuilder accumulates segments in file order, merging adjacent
// non-data segments of one kind and dropping empty ones.
type segmentBuilder struct {
	segs []Segment
	end  int64
}

// add appends [off, off+n). off must equal the end of the previous segment.
func (b *segmentBuilder) add(off, n int64, kind SegmentKind, dtype string) {
	if n <= 0 {
		return
	}
	if k := len(b.segs); k > 0 && kind != KindData {
		last := &b.segs[k-1]
		if last.Kind == kind && last.Offset+last.Length == off {
			last.Length += n
			b.end = off + n
			return
		}
	}
	if kind != KindData {
		dtype = ""
	}
	b.segs = append(b.segs, Segment{Offset: off, Length: n, Kind: kind, DType: dtype})
	b.end = off + n
}

// rangeSeg is a data range used to lay out segments.
type rangeSeg struct {
	off, n int64
	dtype  string
}

// layout sorts data ranges and fills the gaps with gapKind (and the region
// before the first range with headKind up to headEnd). It fails on overlaps
// and on ranges outside [0,size).
func layout(format string, size, headEnd int64, headKind, gapKind SegmentKind, data []rangeSeg) ([]Segment, error) {
	sort.SliceStable(data, func(i, j int) bool { return data[i].off < data[j].off })
	var b segmentBuilder
	b.add(0, headEnd, headKind, "")
	pos := headEnd
	for _, d := range data {
		if d.n == 0 {
			continue
		}
		if d.off < pos || d.n < 0 || d.off > size || d.n > size-d.off {
			return nil, errorf(format, "data range [%d,+%d) overlaps or leaves the file (size %d)", d.off, d.n, size)
		}
		b.add(pos, d.off-pos, gapKind, "")
		b.add(d.off, d.n, KindData, d.dtype)
		pos = d.off + d.n
	}
	b.add(pos, size-pos, gapKind, "")
	return b.segs, nil
}

// sortTensors orders tensors by offset, then name.
func sortTensors(ts []Tensor) {
	sort.SliceStable(ts, func(i, j int) bool {
		if ts[i].Offset != ts[j].Offset {
			return ts[i].Offset < ts[j].Offset
		}
		return ts[i].Name < ts[j].Name
	})
}

// mulCheck multiplies non-negative a and b, reporting overflow past max int64.
func mulCheck(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > (1<<63-1)/b {
		return 0, false
	}
	return a * b, true
}

// readAtLeast reads [off, off+n) of r, n bounded by the caller.
func readRange(r io.ReaderAt, off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	m, err := r.ReadAt(buf, off)
	if int64(m) == n {
		return buf, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return nil, err
}
