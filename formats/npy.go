package formats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// .npy layout: "\x93NUMPY", u8 major, u8 minor, header length (u16 LE for
// v1, u32 LE for v2/v3), an ASCII (v3: UTF-8) Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (10,), } padded with
// spaces and a newline, then prod(shape)*itemsize bytes of data.

const npyMagic = "\x93NUMPY"

// npyHeader is what a .npy header says.
type npyHeader struct {
	hdrLen int64  // bytes before the data
	dtype  string // canonical dtype, or the native descr, or "" if not a plain type
	shape  []int64
	nbytes int64 // data bytes, or -1 when the dtype has no fixed size (objects, structured)
}

// parseNPYHeader parses the .npy header at the start of b. When b is too
// short it returns need > len(b), the length it needs.
func parseNPYHeader(b []byte) (h npyHeader, need int, err error) {
	if len(b) < 8 {
		return h, 8, nil
	}
	if string(b[:6]) != npyMagic {
		return h, 0, errors.New("bad magic")
	}
	var start, hlen int
	switch b[6] {
	case 1:
		if len(b) < 10 {
			return h, 10, nil
		}
		start, hlen = 10, int(binary.LittleEndian.Uint16(b[8:]))
	case 2, 3:
		if len(b) < 12 {
			return h, 12, nil
		}
		n := binary.LittleEndian.Uint32(b[8:])
		if n > maxNPYHeader {
			return h, 0, fmt.Errorf("header length %d exceeds %d", n, maxNPYHeader)
		}
		start, hlen = 12, int(n)
	default:
		return h, 0, fmt.Errorf("unsupported version %d.%d", b[6], b[7])
	}
	if len(b) < start+hlen {
		return h, start + hlen, nil
	}
	p := pyLitParser{s: b[start : start+hlen]}
	v, err := p.value(0)
	if err != nil {
		return h, 0, err
	}
	dict, ok := v.(pyDict)
	if !ok {
		return h, 0, errors.New("header is not a dict")
	}
	h.hdrLen = int64(start + hlen)
	var fortranOK bool
	var descr any
	for i := range dict.keys {
		k, _ := dict.keys[i].(string)
		switch k {
		case "descr":
			descr = dict.vals[i]
		case "fortran_order":
			_, fortranOK = dict.vals[i].(bool)
		case "shape":
			t, ok := dict.vals[i].([]any)
			if !ok || len(t) > maxDims {
				return h, 0, errors.New("bad shape")
			}
			h.shape = make([]int64, len(t))
			for j, d := range t {
				n, ok := d.(int64)
				if !ok || n < 0 {
					return h, 0, errors.New("bad shape")
				}
				h.shape[j] = n
			}
		}
	}
	if descr == nil || !fortranOK || h.shape == nil {
		return h, 0, errors.New("header lacks descr, fortran_order or shape")
	}
	h.nbytes = -1
	if s, ok := descr.(string); ok {
		if size := npyItemSize(s); size > 0 {
			n := size
			for _, d := range h.shape {
				if n, ok = mulCheck(n, d); !ok {
					return h, 0, errors.New("shape overflows")
				}
			}
			h.nbytes = n
			h.dtype = s
			if c, ok := npyDTypes[s]; ok {
				h.dtype = c
			}
		}
	}
	return h, 0, nil
}

// npyItemSize returns the element size of a simple numpy descr such as
// "<f4", "|S10", "<U3" or "<M8[ns]", or 0 when it has none (objects).
func npyItemSize(s string) int64 {
	if len(s) > 0 && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=') {
		s = s[1:]
	}
	if len(s) < 2 {
		return 0
	}
	kind, digits := s[0], s[1:]
	if i := indexByte(digits, '['); i >= 0 {
		if kind != 'M' && kind != 'm' || digits[len(digits)-1] != ']' {
			return 0
		}
		digits = digits[:i]
	}
	n, err := strconv.ParseInt(digits, 10, 32)
	if err != nil || n <= 0 {
		return 0
	}
	switch kind {
	case 'b', 'i', 'u', 'f', 'c', 'S', 'a', 'V', 'M', 'm':
		return n
	case 'U':
		return 4 * n
	}
	return 0
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// parseNPY parses a whole .npy file.
func parseNPY(r io.ReaderAt, size int64) (*Index, error) {
	b, err := readRange(r, 0, min(size, 12))
	if err != nil {
		return nil, err
	}
	h, need, err := parseNPYHeader(b)
	if err == nil && need > 0 {
		if int64(need) > size {
			return nil, errorf(fmtNPY, "truncated header")
		}
		if b, err = readRange(r, 0, int64(need)); err != nil {
			return nil, err
		}
		h, need, err = parseNPYHeader(b)
	}
	if err != nil {
		return nil, errorf(fmtNPY, "%v", err)
	}
	if need > 0 {
		return nil, errorf(fmtNPY, "truncated header")
	}
	return npyIndex(h, size)
}

// npyIndex lays out a .npy file of size bytes with header h.
func npyIndex(h npyHeader, size int64) (*Index, error) {
	ix := &Index{Format: fmtNPY}
	var b segmentBuilder
	b.add(0, h.hdrLen, KindMeta, "")
	switch {
	case h.nbytes < 0:
		b.add(h.hdrLen, size-h.hdrLen, KindOther, "")
	case h.hdrLen+h.nbytes != size:
		return nil, errorf(fmtNPY, "header describes %d data bytes, file has %d", h.nbytes, size-h.hdrLen)
	default:
		b.add(h.hdrLen, h.nbytes, KindData, h.dtype)
		ix.Tensors = []Tensor{{DType: h.dtype, Shape: h.shape, Offset: h.hdrLen, Length: h.nbytes}}
	}
	ix.Segments = b.segs
	return ix, nil
}

// pyDict is a parsed Python dict literal, in source order.
type pyDict struct{ keys, vals []any }

// pyLitParser parses the Python literals numpy writes in .npy headers:
// str, int, True/False/None, tuples, lists and dicts.
type pyLitParser struct {
	s []byte
	i int
}

const maxLitDepth = 16

func (p *pyLitParser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t' || p.s[p.i] == '\r') {
		p.i++
	}
}

func (p *pyLitParser) value(depth int) (any, error) {
	if depth > maxLitDepth {
		return nil, errors.New("header nests too deeply")
	}
	p.skipSpace()
	if p.i >= len(p.s) {
		return nil, errors.New("header ends early")
	}
	switch c := p.s[p.i]; {
	case c == '\'' || c == '"':
		j := p.i + 1
		for j < len(p.s) && p.s[j] != c {
			if p.s[j] == '\\' {
				return nil, errors.New("escapes in header strings are not supported")
			}
			j++
		}
		if j >= len(p.s) {
			return nil, errors.New("unterminated string")
		}
		s := string(p.s[p.i+1 : j])
		p.i = j + 1
		return s, nil
	case c == '(' || c == '[':
		closer := byte(')')
		if c == '[' {
			closer = ']'
		}
		p.i++
		items := []any{}
		for {
			p.skipSpace()
			if p.i < len(p.s) && p.s[p.i] == closer {
				p.i++
				return items, nil
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			items = append(items, v)
			if err := p.sep(closer); err != nil {
				return nil, err
			}
		}
	case c == '{':
		p.i++
		var d pyDict
		for {
			p.skipSpace()
			if p.i < len(p.s) && p.s[p.i] == '}' {
				p.i++
				return d, nil
			}
			k, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			p.skipSpace()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, errors.New("expected ':'")
			}
			p.i++
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.keys, d.vals = append(d.keys, k), append(d.vals, v)
			if err := p.sep('}'); err != nil {
				return nil, err
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		j := p.i + 1
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		if j < len(p.s) && p.s[j] == 'L' { // Python 2 long
			j++
		}
		txt := string(p.s[p.i:j])
		if txt[len(txt)-1] == 'L' {
			txt = txt[:len(txt)-1]
		}
		n, err := strconv.ParseInt(txt, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad integer %q", txt)
		}
		p.i = j
		return n, nil
	default:
		for _, w := range []struct {
			word string
			v    any
		}{{"True", true}, {"False", false}, {"None", nil}} {
			if len(p.s)-p.i >= len(w.word) && string(p.s[p.i:p.i+len(w.word)]) == w.word {
				p.i += len(w.word)
				return w.v, nil
			}
		}
		return nil, fmt.Errorf("unexpected %q in header", c)
	}
}

// sep consumes a ',' or peeks at closer.
func (p *pyLitParser) sep(closer byte) error {
	p.skipSpace()
	if p.i < len(p.s) {
		if p.s[p.i] == ',' {
			p.i++
			return nil
		}
		if p.s[p.i] == closer {
			return nil
		}
	}
	return fmt.Errorf("expected ',' or %q", closer)
}
