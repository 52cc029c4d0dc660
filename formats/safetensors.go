package formats

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"
)

// safetensors layout: u64 LE header length N | N bytes of JSON | data.
// Tensor i occupies [8+N+begin_i, 8+N+end_i); the reference reader requires
// the ranges to tile [0, size-8-N) exactly, in any header order.

// parseSafetensors parses a whole safetensors file.
func parseSafetensors(r io.ReaderAt, size int64) (*Index, error) {
	if size < 8 {
		return nil, errorf(fmtSafetensors, "file of %d bytes has no header length", size)
	}
	var lb [8]byte
	if _, err := readFull(r, lb[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n > maxHeaderSize {
		return nil, errorf(fmtSafetensors, "header length %d exceeds %d", n, maxHeaderSize)
	}
	if int64(n) > size-8 {
		return nil, errorf(fmtSafetensors, "header length %d exceeds file size %d", n, size)
	}
	hdr, err := readRange(r, 8, int64(n))
	if err != nil {
		return nil, err
	}
	tensors, dataLen, err := parseSafetensorsHeader(hdr)
	if err != nil {
		return nil, err
	}
	if want := 8 + int64(n) + dataLen; want != size {
		return nil, errorf(fmtSafetensors, "header describes %d bytes, file has %d", want, size)
	}
	return safetensorsIndex(tensors, 8+int64(n), size)
}

// safetensorsIndex lays out the segments of a validated file.
func safetensorsIndex(tensors []Tensor, headEnd, size int64) (*Index, error) {
	data := make([]rangeSeg, 0, len(tensors))
	for _, t := range tensors {
		data = append(data, rangeSeg{t.Offset, t.Length, t.DType})
	}
	segs, err := layout(fmtSafetensors, size, headEnd, KindMeta, KindOther, data)
	if err != nil {
		return nil, err
	}
	ts := append([]Tensor(nil), tensors...)
	sortTensors(ts)
	return &Index{Format: fmtSafetensors, Segments: segs, Tensors: ts}, nil
}

// readFull reads len(b) bytes at off.
func readFull(r io.ReaderAt, b []byte, off int64) (int, error) {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return n, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// parseSafetensorsHeader parses and validates the JSON header hdr (the N
// bytes after the length). It returns the tensors with file offsets
// (8+N+begin), sorted by offset, and the length of the data buffer.
func parseSafetensorsHeader(hdr []byte) ([]Tensor, int64, error) {
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, 0, errorf(fmtSafetensors, "header does not start with '{'")
	}
	if !utf8.Valid(hdr) {
		return nil, 0, errorf(fmtSafetensors, "header is not UTF-8")
	}
	base := 8 + int64(len(hdr))
	d := json.NewDecoder(bytes.NewReader(hdr))
	d.UseNumber()
	bad := func(what string, err error) error {
		if err != nil {
			return errorf(fmtSafetensors, "header: %s: %v", what, err)
		}
		return errorf(fmtSafetensors, "header: %s", what)
	}
	if err := expectDelim(d, '{'); err != nil {
		return nil, 0, bad("top level", err)
	}
	type entry struct {
		t          Tensor
		begin, end int64
	}
	var entries []entry
	seen := make(map[string]bool)
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, 0, bad("key", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, 0, bad("key is not a string", nil)
		}
		if seen[name] {
			return nil, 0, bad("duplicate key "+strconv.Quote(name), nil)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := skipStringMap(d); err != nil {
				return nil, 0, bad("__metadata__", err)
			}
			continue
		}
		e := entry{t: Tensor{Name: name}}
		var haveDType, haveShape, haveOffsets bool
		if err := expectDelim(d, '{'); err != nil {
			return nil, 0, bad("tensor "+strconv.Quote(name), err)
		}
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				return nil, 0, bad("tensor field", err)
			}
			field, _ := tok.(string)
			switch field {
			case "dtype":
				tok, err := d.Token()
				s, ok := tok.(string)
				if err != nil || !ok {
					return nil, 0, bad("dtype of "+strconv.Quote(name), err)
				}
				c, ok := safetensorsDTypes[s]
				if !ok {
					return nil, 0, bad("unknown dtype "+strconv.Quote(s), nil)
				}
				e.t.DType, haveDType = c, true
			case "shape":
				dims, err := readIntArray(d, maxDims)
				if err != nil {
					return nil, 0, bad("shape of "+strconv.Quote(name), err)
				}
				e.t.Shape, haveShape = dims, true
			case "data_offsets":
				offs, err := readIntArray(d, 2)
				if err != nil || len(offs) != 2 {
					return nil, 0, bad("data_offsets of "+strconv.Quote(name), err)
				}
				e.begin, e.end, haveOffsets = offs[0], offs[1], true
			default:
				var skip json.RawMessage
				if err := d.Decode(&skip); err != nil {
					return nil, 0, bad("field "+strconv.Quote(field), err)
				}
			}
		}
		if err := expectDelim(d, '}'); err != nil {
			return nil, 0, bad("tensor "+strconv.Quote(name), err)
		}
		if !haveDType || !haveShape || !haveOffsets {
			return nil, 0, bad("tensor "+strconv.Quote(name)+" lacks dtype, shape or data_offsets", nil)
		}
		entries = append(entries, e)
	}
	if err := expectDelim(d, '}'); err != nil {
		return nil, 0, bad("top level", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, 0, bad("trailing bytes after the header object", nil)
	}
	sort.SliceStable(entries, func(i, j int) bool {
		if entries[i].begin != entries[j].begin {
			return entries[i].begin < entries[j].begin
		}
		return entries[i].end < entries[j].end
	})
	var pos int64
	tensors := make([]Tensor, 0, len(entries))
	for _, e := range entries {
		if e.begin != pos || e.end < e.begin {
			return nil, 0, errorf(fmtSafetensors, "tensor %q: data_offsets [%d,%d) do not continue at %d", e.t.Name, e.begin, e.end, pos)
		}
		nel := int64(1)
		for _, s := range e.t.Shape {
			var ok bool
			if nel, ok = mulCheck(nel, s); !ok {
				return nil, 0, errorf(fmtSafetensors, "tensor %q: shape overflows", e.t.Name)
			}
		}
		bits, ok := mulCheck(nel, int64(dtypeBits[e.t.DType]))
		if !ok || bits%8 != 0 {
			return nil, 0, errorf(fmtSafetensors, "tensor %q: %d elements of %s are not a whole number of bytes", e.t.Name, nel, e.t.DType)
		}
		if e.end-e.begin != bits/8 {
			return nil, 0, errorf(fmtSafetensors, "tensor %q: %d bytes for shape %v of %s, want %d", e.t.Name, e.end-e.begin, e.t.Shape, e.t.DType, bits/8)
		}
		if e.end > maxInt64-base {
			return nil, 0, errorf(fmtSafetensors, "tensor %q: offset overflows", e.t.Name)
		}
		e.t.Offset, e.t.Length = base+e.begin, e.end-e.begin
		tensors = append(tensors, e.t)
		pos = e.end
	}
	return tensors, pos, nil
}

const maxInt64 = 1<<63 - 1

// expectDelim reads one token and checks it is the delimiter want.
func expectDelim(d *json.Decoder, want json.Delim) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return errors.New("expected " + want.String())
	}
	return nil
}

// skipStringMap consumes a JSON object of string values (or null).
func skipStringMap(d *json.Decoder) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil
	}
	if tok != json.Delim('{') {
		return errors.New("not an object")
	}
	for d.More() {
		for range 2 {
			tok, err := d.Token()
			if err != nil {
				return err
			}
			if _, ok := tok.(string); !ok {
				return errors.New("values must be strings")
			}
		}
	}
	return expectDelim(d, '}')
}

// readIntArray reads a JSON array of at most max non-negative integers.
func readIntArray(d *json.Decoder, max int) ([]int64, error) {
	if err := expectDelim(d, '['); err != nil {
		return nil, err
	}
	out := []int64{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, errors.New("not a number")
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || v < 0 {
			return nil, errors.New("not a non-negative integer: " + string(num))
		}
		if len(out) == max {
			return nil, errors.New("too many elements")
		}
		out = append(out, v)
	}
	return out, expectDelim(d, ']')
}
