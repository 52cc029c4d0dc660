package formats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// GGUF layout (little-endian): "GGUF", u32 version (2 or 3), u64
// tensor_count, u64 kv_count, kv_count key/value pairs, tensor_count tensor
// infos (name, u32 n_dims, u64 ne[n_dims] fastest-varying first, u32 type,
// u64 offset relative to the data section), zero padding up to the
// alignment (general.alignment, default 32), then the data section.

const (
	ggufMagic            = "GGUF"
	ggufDefaultAlignment = 32
	ggufMaxDims          = 8     // ggml uses 4; allow a little more
	ggufMaxName          = 65535 // ggml uses 64
	ggufMaxArrayDepth    = 4
)

// GGUF metadata value types.
const (
	ggufU8 = iota
	ggufI8
	ggufU16
	ggufI16
	ggufU32
	ggufI32
	ggufF32
	ggufBool
	ggufString
	ggufArray
	ggufU64
	ggufI64
	ggufF64
)

// ggufFixedSize is the size of each fixed-width value type.
var ggufFixedSize = [...]int64{ggufU8: 1, ggufI8: 1, ggufU16: 2, ggufI16: 2, ggufU32: 4, ggufI32: 4,
	ggufF32: 4, ggufBool: 1, ggufU64: 8, ggufI64: 8, ggufF64: 8}

// ggufHeader is what a GGUF header says.
type ggufHeader struct {
	infoEnd int64    // end of the tensor infos (start of the header padding)
	tensors []Tensor // with file offsets
}

// errShort reports that a buffer ended before the structure did.
var errShort = errors.New("short buffer")

// ggufCursor reads little-endian values from a prefix of a file. When a read
// runs past the prefix it records in need how long the prefix must be.
type ggufCursor struct {
	b    []byte
	i    int64
	need int64
}

func (c *ggufCursor) take(n int64) ([]byte, error) {
	if n < 0 || n > maxHeaderSize || c.i+n > maxHeaderSize {
		return nil, fmt.Errorf("header exceeds %d bytes", maxHeaderSize)
	}
	if c.i+n > int64(len(c.b)) {
		c.need = c.i + n
		return nil, errShort
	}
	p := c.b[c.i : c.i+n]
	c.i += n
	return p, nil
}

func (c *ggufCursor) u32() (uint32, error) {
	p, err := c.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (c *ggufCursor) u64() (uint64, error) {
	p, err := c.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

// str reads a GGUF string of at most max bytes.
func (c *ggufCursor) str(max uint64) ([]byte, error) {
	n, err := c.u64()
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, fmt.Errorf("string of %d bytes exceeds %d", n, max)
	}
	return c.take(int64(n))
}

// skipValue skips one metadata value of type t.
func (c *ggufCursor) skipValue(t uint32, depth int) error {
	switch {
	case t == ggufString:
		_, err := c.str(maxHeaderSize)
		return err
	case t == ggufArray:
		if depth >= ggufMaxArrayDepth {
			return errors.New("arrays nest too deeply")
		}
		et, err := c.u32()
		if err != nil {
			return err
		}
		n, err := c.u64()
		if err != nil {
			return err
		}
		if n > maxHeaderSize {
			return fmt.Errorf("array of %d elements exceeds the header limit", n)
		}
		if int(et) < len(ggufFixedSize) && et != ggufString && et != ggufArray {
			_, err := c.take(int64(n) * ggufFixedSize[et])
			return err
		}
		for range n {
			if err := c.skipValue(et, depth+1); err != nil {
				return err
			}
		}
		return nil
	case int(t) < len(ggufFixedSize):
		_, err := c.take(ggufFixedSize[t])
		return err
	}
	return fmt.Errorf("unknown value type %d", t)
}

// parseGGUFHeader parses the GGUF header at the start of b. When b is too
// short it returns need > len(b), the length it needs at least.
func parseGGUFHeader(b []byte) (h ggufHeader, need int64, err error) {
	c := &ggufCursor{b: b}
	h, err = c.header()
	if err == errShort {
		return h, c.need, nil
	}
	return h, 0, err
}

func (c *ggufCursor) header() (h ggufHeader, err error) {
	magic, err := c.take(4)
	if err != nil {
		return h, err
	}
	if string(magic) != ggufMagic {
		return h, errors.New("bad magic")
	}
	version, err := c.u32()
	if err != nil {
		return h, err
	}
	if version != 2 && version != 3 {
		return h, fmt.Errorf("unsupported version %#x", version)
	}
	nTensors, err := c.u64()
	if err != nil {
		return h, err
	}
	nKV, err := c.u64()
	if err != nil {
		return h, err
	}
	// Each KV takes at least 13 bytes and each tensor info at least 28.
	if nKV > maxHeaderSize/13 || nTensors > maxHeaderSize/28 {
		return h, fmt.Errorf("%d tensors and %d KVs exceed the header limit", nTensors, nKV)
	}
	alignment, err := c.metadata(nKV)
	if err != nil {
		return h, err
	}
	infos := make([]ggufInfo, 0, min(nTensors, 1024))
	names := make(map[string]bool)
	for range nTensors {
		in, err := c.tensorInfo(alignment)
		if err != nil {
			return h, err
		}
		if names[in.t.Name] {
			return h, fmt.Errorf("duplicate tensor %q", in.t.Name)
		}
		names[in.t.Name] = true
		infos = append(infos, in)
	}
	h.infoEnd = c.i
	dataStart := (uint64(c.i) + alignment - 1) / alignment * alignment
	h.tensors = make([]Tensor, len(infos))
	for i, in := range infos {
		if in.offset > uint64(maxInt64)-dataStart || uint64(in.t.Length) > uint64(maxInt64)-dataStart-in.offset {
			return h, fmt.Errorf("tensor %q: offset overflows", in.t.Name)
		}
		in.t.Offset = int64(dataStart + in.offset)
		h.tensors[i] = in.t
	}
	sortTensors(h.tensors)
	for i := 1; i < len(h.tensors); i++ {
		if p := h.tensors[i-1]; p.Offset+p.Length > h.tensors[i].Offset {
			return h, fmt.Errorf("tensors %q and %q overlap", p.Name, h.tensors[i].Name)
		}
	}
	return h, nil
}

// metadata reads nKV key-value pairs and returns the data alignment
// (general.alignment, a power of two, else the default); other values are
// skipped.
func (c *ggufCursor) metadata(nKV uint64) (uint64, error) {
	alignment := uint64(ggufDefaultAlignment)
	for range nKV {
		key, err := c.str(ggufMaxName)
		if err != nil {
			return 0, err
		}
		t, err := c.u32()
		if err != nil {
			return 0, err
		}
		if string(key) == "general.alignment" {
			if t != ggufU32 {
				return 0, fmt.Errorf("general.alignment has type %d, want u32", t)
			}
			a, err := c.u32()
			if err != nil {
				return 0, err
			}
			if a == 0 || a&(a-1) != 0 {
				return 0, fmt.Errorf("alignment %d is not a power of two", a)
			}
			alignment = uint64(a)
			continue
		}
		if err := c.skipValue(t, 0); err != nil {
			return 0, err
		}
	}
	return alignment, nil
}

// ggufInfo is a tensor info of a GGUF header: the tensor (no Offset yet)
// and its offset from the start of the data.
type ggufInfo struct {
	t      Tensor
	offset uint64
}

// tensorInfo reads one tensor info: name, dims, type and offset, and works
// out the tensor's shape (outermost first) and byte length.
func (c *ggufCursor) tensorInfo(alignment uint64) (ggufInfo, error) {
	name, err := c.str(ggufMaxName)
	if err != nil {
		return ggufInfo{}, err
	}
	nd, err := c.u32()
	if err != nil {
		return ggufInfo{}, err
	}
	if nd > ggufMaxDims {
		return ggufInfo{}, fmt.Errorf("tensor %q has %d dims", name, nd)
	}
	ne := make([]int64, nd)
	for j := range ne {
		v, err := c.u64()
		if err != nil {
			return ggufInfo{}, err
		}
		if v > maxInt64 {
			return ggufInfo{}, fmt.Errorf("tensor %q: dimension %d too large", name, v)
		}
		ne[j] = int64(v)
	}
	typ, err := c.u32()
	if err != nil {
		return ggufInfo{}, err
	}
	off, err := c.u64()
	if err != nil {
		return ggufInfo{}, err
	}
	gt, ok := ggmlTypes[typ]
	if !ok {
		return ggufInfo{}, fmt.Errorf("tensor %q: unknown type %d", name, typ)
	}
	if off%alignment != 0 {
		return ggufInfo{}, fmt.Errorf("tensor %q: offset %d not aligned to %d", name, off, alignment)
	}
	// nbytes = ne0/blk*bytes*ne1*...; ne0 must be a whole number of blocks.
	nbytes := int64(1)
	shape := make([]int64, nd)
	for j, v := range ne {
		shape[int(nd)-1-j] = v
		if j == 0 {
			if v%gt.blk != 0 {
				return ggufInfo{}, fmt.Errorf("tensor %q: ne0 %d not a multiple of block size %d", name, v, gt.blk)
			}
			if v, ok = mulCheck(v/gt.blk, gt.bytes); !ok {
				return ggufInfo{}, fmt.Errorf("tensor %q: size overflows", name)
			}
		}
		if nbytes, ok = mulCheck(nbytes, v); !ok {
			return ggufInfo{}, fmt.Errorf("tensor %q: size overflows", name)
		}
	}
	if nd == 0 {
		nbytes = gt.bytes // a 0-dim tensor is one element; only block size 1 makes sense
		if gt.blk != 1 {
			return ggufInfo{}, fmt.Errorf("tensor %q: scalar of block type %s", name, gt.name)
		}
	}
	return ggufInfo{Tensor{Name: string(name), DType: gt.name, Shape: shape, Length: nbytes}, off}, nil
}

// parseGGUF parses a whole GGUF file.
func parseGGUF(r io.ReaderAt, size int64) (*Index, error) {
	n := min(size, 1<<20)
	for {
		b, err := readRange(r, 0, n)
		if err != nil {
			return nil, err
		}
		h, need, err := parseGGUFHeader(b)
		if err != nil {
			return nil, errorf(fmtGGUF, "%v", err)
		}
		if need == 0 {
			return ggufIndex(h, size)
		}
		if need > size {
			return nil, errorf(fmtGGUF, "truncated header: needs %d bytes, file has %d", need, size)
		}
		n = min(max(need, 2*n), size, maxHeaderSize)
	}
}

// ggufIndex lays out a GGUF file of size bytes with header h.
func ggufIndex(h ggufHeader, size int64) (*Index, error) {
	data := make([]rangeSeg, len(h.tensors))
	for i, t := range h.tensors {
		data[i] = rangeSeg{t.Offset, t.Length, t.DType}
	}
	segs, err := layout(fmtGGUF, size, h.infoEnd, KindMeta, KindOther, data)
	if err != nil {
		return nil, err
	}
	return &Index{Format: fmtGGUF, Segments: segs, Tensors: h.tensors}, nil
}
