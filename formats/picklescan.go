package formats

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Pickle parts. A pickled numpy array (sklearn's trees, any pickled array
// model) carries its raw bytes as the argument of a bytes opcode (protocol
// 3+: SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8) or, in protocol 2,
// as a latin-1 string (BINUNICODE) given to _codecs.encode. pickleParts
// walks the opcodes without running them, as pickleScan does for torch, but
// streaming: it keeps only an opcode's header (at most 9 bytes) and skips
// arguments. Every such argument of at least minPartBuf bytes is a part;
// one of at least minDataChunk bytes is a data segment, cut like a tensor.
//
// Cuts: before and after every FRAME header (protocol 4+ splits the stream
// into ~64 KiB frames whose 8-byte lengths differ between saves: the last
// frame of one save is longer in the next; cut apart, the header alone
// differs), and at the start of every buffer part (grouped).
type pickleParts struct {
	pos      int64
	hdr      [9]byte // the current opcode and its fixed-size argument so far
	hdrN     int
	need     int   // header bytes the current opcode takes (0: between opcodes)
	skip     int64 // argument bytes left to skip
	lines    int   // newline-ended lines left in a text argument
	lineLen  int
	held     bool // the FRAME at pos had its cut before it
	stopped  bool // STOP seen, at an opcode boundary
	bufs     int
	out      []Tensor
	data     int64
	dataType string
	cutAfter int64 // a buffer being skipped ends with a cut

	vm      pvm   // the stack model (joblib arrays)
	outer   []pvm // the pickles a nested one interrupts
	capture bool  // the string being skipped is kept in capBuf
	capBuf  []byte
	arr     int // arrNone, or where in a joblib array's bytes the scan is
	array   arrayBytes
}

// minPartBuf is the least argument size pickleParts calls a buffer.
const minPartBuf = 256

// minPartAlone is the least size of a buffer that is a chunk of its own
// (cut at both ends) although it is no data segment: a pickled model's
// skeleton holds such buffers (a RandomState's 2.5 KiB of state) between
// bytes that change with every save.
const minPartAlone = 2 << 10

// pickleHeader is the header size (opcode + fixed argument or length
// prefix) of opcode op, and whether the length prefix is that of a bytes
// argument to skip.
func pickleHeader(op byte) int {
	switch pickleArgs[op] {
	case pkU1, pkStr1, pkLong1:
		return 2
	case pkU2:
		return 3
	case pkI4, pkStr4, pkLong4:
		return 5
	case pkU8, pkF8, pkStr8:
		return 9
	}
	return 1
}

func (s *pickleParts) scan(b []byte) (int, cutRule, error) {
	i := 0
	for i < len(b) {
		if s.skip > 0 {
			k := int(min(s.skip, int64(len(b)-i)))
			if s.capture {
				s.capBuf = append(s.capBuf, b[i:i+k]...)
			}
			s.skip -= int64(k)
			i += k
			if s.skip > 0 {
				continue
			}
			if s.capture {
				s.capture = false
				if t := s.vm.top(); t != nil && t.kind == pvStr {
					t.s = string(s.capBuf)
				}
			}
			if s.cutAfter > 0 { // the end of a buffer of minPartAlone bytes
				s.cutAfter = 0
				return s.advance(i), cutAlways, nil
			}
			continue
		}
		if s.lines > 0 {
			for i < len(b) && s.lines > 0 {
				if b[i] == '\n' {
					s.lines--
				} else if s.lineLen++; s.lineLen > maxPickleLine {
					return i, cutNone, fmt.Errorf("pickle: text argument longer than %d bytes", maxPickleLine)
				}
				i++
			}
			continue
		}
		switch s.arr {
		case arrPad: // joblib: the padding length, then the padding
			s.skip, s.arr = int64(b[i]), arrData
			i++
			continue
		case arrData:
			s.arr = arrNone
			rule, err := s.buffer(s.pos+int64(i), s.array.nbytes, s.array.dtype)
			if err != nil {
				return i, cutNone, err
			}
			if rule != cutNone {
				return s.advance(i), rule, nil
			}
			continue
		case arrNested:
			if b[i] != 0x80 {
				return i, cutNone, errors.New("pickle: no pickle for an array of objects")
			}
			if len(s.outer) >= maxPVNested {
				return i, cutNone, fmt.Errorf("pickle: pickles nested deeper than %d", maxPVNested)
			}
			s.outer = append(s.outer, s.vm)
			s.vm, s.arr = pvm{}, arrNone
		}
		if s.need == 0 { // an opcode
			op := b[i]
			if s.stopped {
				if op != 0x80 {
					return i, cutNone, fmt.Errorf("pickle: %#x after STOP", op)
				}
				s.stopped = false
			}
			if pickleArgs[op] == pkInvalid {
				return i, cutNone, fmt.Errorf("pickle: opcode %#x not allowed", op)
			}
			if op == 0x95 && !s.held { // FRAME: a cut before its header
				s.held = true
				return s.advance(i), cutAlways, nil
			}
			s.held = false
			s.hdr[0], s.hdrN, s.need = op, 1, pickleHeader(op)
			i++
		}
		for s.hdrN < s.need && i < len(b) {
			s.hdr[s.hdrN] = b[i]
			s.hdrN++
			i++
		}
		if s.hdrN < s.need {
			break
		}
		rule, err := s.opcode(s.pos + int64(i))
		if err != nil {
			return i, cutNone, err
		}
		if rule != cutNone {
			return s.advance(i), rule, nil
		}
	}
	return s.advance(i), cutNone, nil
}

// Where the scanner is in a joblib array's bytes.
const (
	arrNone   = iota
	arrPad    // the padding length byte is next
	arrData   // the elements are next
	arrNested // a nested pickle (an array of objects) is next
)

// opcode acts on a complete opcode header; its argument starts at file
// offset at.
func (s *pickleParts) opcode(at int64) (cutRule, error) {
	op, arg := s.hdr[0], s.hdr[1:s.need]
	s.need, s.hdrN = 0, 0
	var n int64
	switch pickleArgs[op] {
	case pkLine:
		s.lines, s.lineLen = 1, 0
	case pkLine2:
		s.lines, s.lineLen = 2, 0
	case pkStr1, pkLong1:
		n = int64(arg[0])
	case pkStr4, pkLong4:
		n = int64(binary.LittleEndian.Uint32(arg))
	case pkStr8:
		v := binary.LittleEndian.Uint64(arg)
		if v > 1<<50 {
			return cutNone, fmt.Errorf("pickle: argument of %d bytes", v)
		}
		n = int64(v)
	}
	w, err := s.vm.stackOp(op, arg, n)
	if err != nil {
		return cutNone, err
	}
	if w != nil {
		return cutNone, s.startArray(w)
	}
	switch op {
	case '.':
		if k := len(s.outer); k > 0 { // the end of a nested pickle
			s.vm, s.outer = s.outer[k-1], s.outer[:k-1]
		} else {
			s.stopped = true
		}
		return cutNone, nil
	case 0x95:
		return cutAlways, nil // after a FRAME header
	case 0x80:
		if arg[0] > 5 {
			return cutNone, fmt.Errorf("pickle: protocol %d", arg[0])
		}
		return cutNone, nil
	}
	switch pickleArgs[op] {
	case pkLong1, pkLong4:
		if n == 0 || n > maxPickleLong {
			return cutNone, fmt.Errorf("pickle: LONG of %d bytes", n)
		}
		s.skip = n
		return cutNone, nil
	case pkStr1, pkStr4, pkStr8:
	default:
		return cutNone, nil
	}
	switch op {
	case 'C', 'B', 0x8e, 0x96, 'X', 0x8d: // bytes, bytearray, protocol 2's latin-1 buffers
		if n >= minPartBuf {
			return s.buffer(at, n, "")
		}
	}
	if t := s.vm.top(); t != nil && t.kind == pvStr && n > 0 {
		s.capture, s.capBuf = true, s.capBuf[:0]
	}
	s.skip = n
	return cutNone, nil
}

// startArray sets the scanner to step over the bytes of the array a joblib
// wrapper describes.
func (s *pickleParts) startArray(w *arrayInfo) error {
	if w.itemsize == 0 {
		s.arr = arrNested
		return nil
	}
	n := w.itemsize
	for _, d := range w.shape {
		var ok bool
		if n, ok = mulCheck(n, d); !ok || n > 1<<50 {
			return errors.New("pickle: array size overflows")
		}
	}
	s.array = arrayBytes{nbytes: n, dtype: w.dtype}
	s.arr = arrData
	if w.aligned {
		s.arr = arrPad
	}
	return nil
}

// arrayBytes is the array whose bytes come next.
type arrayBytes struct {
	nbytes int64
	dtype  string
}

// buffer handles a buffer of n bytes starting at offset at: a part if it
// has minPartBuf bytes, a data segment if minDataChunk.
func (s *pickleParts) buffer(at, n int64, dtype string) (cutRule, error) {
	if n < minPartBuf {
		s.skip = n
		return cutNone, nil
	}
	if len(s.out) >= maxParts {
		return cutNone, fmt.Errorf("pickle: more than %d buffers", maxParts)
	}
	s.out = append(s.out, Tensor{Name: partName("buffer", len(s.out)), DType: DTypeBuffer, Offset: at, Length: n})
	if n >= minDataChunk {
		s.data, s.dataType = n, dtype
		s.pos += n // the Chunker claims these bytes as data; the scan resumes after them
		return cutData, nil
	}
	s.skip = n
	if n >= minPartAlone {
		s.cutAfter = 1
		return cutAlways, nil
	}
	return cutGroup, nil
}

func (s *pickleParts) advance(n int) int        { s.pos += int64(n); return n }
func (s *pickleParts) dataLen() (int64, string) { return s.data, s.dataType }
func (s *pickleParts) parts() []Tensor          { return s.out }
func (s *pickleParts) complete() bool {
	return s.stopped && s.need == 0 && s.skip == 0 && s.lines == 0 && s.arr == arrNone
}
