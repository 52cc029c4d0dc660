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
	d := json.NewDecoder(bytes.NewReader(hdr))
	d.UseNumber()
	if err := expectDelim(d, '{'); err != nil {
		return nil, 0, badHeader("top level", err)
	}
	var entries []stEntry
	seen := make(map[string]bool)
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, 0, badHeader("key", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, 0, badHeader("key is not a string", nil)
		}
		if seen[name] {
			return nil, 0, badHeader("duplicate key "+strconv.Quote(name), nil)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := skipStringMap(d); err != nil {
				return nil, 0, badHeader("__metadata__", err)
			}
			continue
		}
		e, err := readSTEntry(d, name)
		if err != nil {
			return nil, 0, err
		}
		entries = append(entries, e)
	}
	if err := expectDelim(d, '}'); err != nil {
		return nil, 0, badHeader("top level", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, 0, badHeader("trailing bytes after the header object", nil)
	}
	return layoutSTEntries(entries, 8+int64(len(hdr)))
}

// stEntry is one tensor of a safetensors header, its data_offsets relative
// to the end of the header.
type stEntry struct {
	t          Tensor
	begin, end int64
}

// badHeader is the error of a safetensors header that fails at what.
func badHeader(what string, err error) error {
	if err != nil {
		return errorf(fmtSafetensors, "header: %s: %v", what, err)
	}
	return errorf(fmtSafetensors, "header: %s", what)
}

// readSTEntry reads the object of tensor name: dtype, shape and
// data_offsets, all three required; other fields are skipped.
func readSTEntry(d *json.Decoder, name string) (stEntry, error) {
	e := stEntry{t: Tensor{Name: name}}
	var haveDType, haveShape, haveOffsets bool
	if err := expectDelim(d, '{'); err != nil {
		return e, badHeader("tensor "+strconv.Quote(name), err)
	}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return e, badHeader("tensor field", err)
		}
		field, _ := tok.(string)
		switch field {
		case "dtype":
			tok, err := d.Token()
			s, ok := tok.(string)
			if err != nil || !ok {
				return e, badHeader("dtype of "+strconv.Quote(name), err)
			}
			c, ok := safetensorsDTypes[s]
			if !ok {
				return e, badHeader("unknown dtype "+strconv.Quote(s), nil)
			}
			e.t.DType, haveDType = c, true
		case "shape":
			dims, err := readIntArray(d, maxDims)
			if err != nil {
				return e, badHeader("shape of "+strconv.Quote(name), err)
			}
			e.t.Shape, haveShape = dims, true
		case "data_offsets":
			offs, err := readIntArray(d, 2)
			if err != nil || len(offs) != 2 {
				return e, badHeader("data_offsets of "+strconv.Quote(name), err)
			}
			e.begin, e.end, haveOffsets = offs[0], offs[1], true
		default:
			var skip json.RawMessage
			if err := d.Decode(&skip); err != nil {
				return e, badHeader("field "+strconv.Quote(field), err)
			}
		}
	}
	if err := expectDelim(d, '}'); err != nil {
		return e, badHeader("tensor "+strconv.Quote(name), err)
	}
	if !haveDType || !haveShape || !haveOffsets {
		return e, badHeader("tensor "+strconv.Quote(name)+" lacks dtype, shape or data_offsets", nil)
	}
	return e, nil
}

// layoutSTEntries orders the entries by offset and checks that they tile
// the data from its start, each as long as its shape and dtype say; it
// returns the tensors at file offsets (base is the data's first byte) and
// the data's length.
func layoutSTEntries(entries []stEntry, base int64) ([]Tensor, int64, error) {
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
