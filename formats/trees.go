package formats

import (
	"bytes"
	"errors"
	"fmt"
)

// maxPartDepth bounds the container nesting the JSON and UBJSON scanners
// follow (XGBoost writes 7 levels).
const maxPartDepth = 64

// maxPartKey bounds the object keys the scanners remember; longer keys are
// never the ones they look for.
const maxPartKey = 64

// xgbTreesPath is the key path of XGBoost's tree list.
var xgbTreesPath = [4]string{"learner", "gradient_booster", "model", "trees"}

// treeList follows the containers of a JSON-like document and reports the
// entries of learner.gradient_booster.model.trees as parts. JSON and UBJSON
// share it.
type treeList struct {
	stack      []byte   // '{' or '[' per open container
	keys       []string // the current member's key per level ("" in arrays)
	treesDepth int      // len(stack) inside the trees array; 0 outside
	treeStart  int64
	seenTrees  bool
	rootDone   bool
	out        []Tensor
}

// open pushes a container; it reports whether it is the trees array.
func (t *treeList) open(kind byte) (bool, error) {
	if t.rootDone {
		return false, errors.New("trees: bytes after the document")
	}
	if len(t.stack) >= maxPartDepth {
		return false, fmt.Errorf("trees: nesting deeper than %d", maxPartDepth)
	}
	isTrees := kind == '[' && t.treesDepth == 0 && len(t.stack) == len(xgbTreesPath)
	if isTrees {
		for i, k := range xgbTreesPath {
			if t.keys[i] != k || t.stack[i] != '{' {
				isTrees = false
			}
		}
	}
	t.stack = append(t.stack, kind)
	t.keys = append(t.keys, "")
	if isTrees {
		t.treesDepth, t.seenTrees = len(t.stack), true
	}
	return isTrees, nil
}

// isTreeStart reports whether a container opened now is a tree.
func (t *treeList) isTreeStart() bool { return t.treesDepth > 0 && len(t.stack) == t.treesDepth }

// close pops a container of kind. It reports whether that ended a tree
// (which then spans [t.treeStart, end)) or the trees array.
func (t *treeList) close(kind byte, end int64) (tree, trees bool, err error) {
	if len(t.stack) == 0 || t.stack[len(t.stack)-1] != kind {
		return false, false, errors.New("trees: unbalanced containers")
	}
	t.stack, t.keys = t.stack[:len(t.stack)-1], t.keys[:len(t.keys)-1]
	switch {
	case t.treesDepth > 0 && len(t.stack) == t.treesDepth:
		if len(t.out) >= maxParts {
			return false, false, fmt.Errorf("trees: more than %d trees", maxParts)
		}
		t.out = append(t.out, Tensor{Name: partName("tree", len(t.out)), DType: DTypeTree,
			Offset: t.treeStart, Length: end - t.treeStart})
		return true, false, nil
	case t.treesDepth > 0 && len(t.stack) == t.treesDepth-1:
		t.treesDepth = 0
		return false, true, nil
	}
	if len(t.stack) == 0 {
		t.rootDone = true
	}
	return false, false, nil
}

func (t *treeList) setKey(k []byte, long bool) {
	if len(t.keys) > 0 {
		if long {
			t.keys[len(t.keys)-1] = "\x00"
		} else {
			t.keys[len(t.keys)-1] = string(k)
		}
	}
}

func (t *treeList) parts() []Tensor          { return t.out }
func (t *treeList) complete() bool           { return t.rootDone && t.seenTrees }
func (t *treeList) dataLen() (int64, string) { return 0, "" }
func (t *treeList) inObject() bool           { return len(t.stack) > 0 && t.stack[len(t.stack)-1] == '{' }
func (t *treeList) closingTrees() bool       { return t.treesDepth > 0 && len(t.stack) == t.treesDepth }

// jsonTrees scans XGBoost's JSON model. It follows strings and containers
// only (a value's syntax is not checked: XGBoost itself rejects bad JSON at
// load time, and the cuts only need the structure). Cuts: after the '[' of
// the trees list (always), after each tree's '}' (grouped), before the ']'
// (always), so the skeleton and the trees never share a chunk.
type jsonTrees struct {
	treeList
	pos      int64
	inString bool
	escape   bool
	isKey    bool
	expect   bool // in an object, a key comes next
	key      []byte
	keyLong  bool
	held     bool // the byte at pos had its cut before it
}

func newJSONTrees() *jsonTrees { return &jsonTrees{} }

func (s *jsonTrees) scan(b []byte) (int, cutRule, error) {
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if s.inString {
			switch {
			case s.escape:
				s.escape = false
			case ch == '\\':
				s.escape = true
			case ch == '"':
				s.inString = false
				if s.isKey {
					s.setKey(s.key, s.keyLong)
				}
				continue
			}
			if s.isKey {
				if len(s.key) < maxPartKey {
					s.key = append(s.key, ch)
				} else {
					s.keyLong = true
				}
			}
			continue
		}
		switch ch {
		case '"':
			s.inString, s.isKey = true, s.inObject() && s.expect
			s.key, s.keyLong = s.key[:0], false
			s.expect = false
		case ':':
		case ',':
			s.expect = s.inObject()
		case '{', '[':
			start := s.pos + int64(i)
			if s.isTreeStart() {
				s.treeStart = start
			}
			isTrees, err := s.open(ch)
			if err != nil {
				return i, cutNone, err
			}
			s.expect = ch == '{'
			if isTrees {
				return s.advance(i + 1), cutAlways, nil
			}
		case '}', ']':
			if ch == ']' && s.closingTrees() && !s.held {
				s.held = true
				return s.advance(i), cutAlways, nil
			}
			s.held = false
			open := byte('{')
			if ch == ']' {
				open = '['
			}
			tree, _, err := s.close(open, s.pos+int64(i)+1)
			if err != nil {
				return i, cutNone, err
			}
			s.expect = false
			if tree {
				return s.advance(i + 1), cutGroup, nil
			}
		case ' ', '\t', '\r', '\n':
		default:
			if s.rootDone {
				return i, cutNone, errors.New("xgboost json: bytes after the document")
			}
		}
	}
	return s.advance(len(b)), cutNone, nil
}

func (s *jsonTrees) advance(n int) int { s.pos += int64(n); return n }

// lgbTrees scans LightGBM's text model: a header of key=value lines, then
// "Tree=N" blocks, then "end of trees" and the feature importances and
// parameters. Cuts: after "Tree=" of the first tree and after "end of
// trees" (always), after "Tree=" of every later tree (grouped), and after
// the "end of parameters" line (always: the Python package appends a
// pandas_categorical line to the file the library wrote, so each save is
// written, closed and committed twice). A cut a few bytes
// into a line is as stable as one at its start: each chunk of trees is
// "N\n<tree N>...\n\nTree=".
type lgbTrees struct {
	pos       int64
	atLine    bool // pos is at a line start or inside the line's first bytes
	line      [len(lgbParamsEnd)]byte
	lineN     int
	lineStart int64
	trees     int
	treeStart int64
	inTrees   bool
	ended     bool
	params    int // 1: in the "end of parameters" line; 2: past it
	out       []Tensor
}

const lgbTree, lgbEnd, lgbParamsEnd = "Tree=", "end of trees", "end of parameters"

func (s *lgbTrees) scan(b []byte) (int, cutRule, error) {
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if ch == '\n' {
			s.atLine, s.lineN, s.lineStart = true, 0, s.pos+int64(i)+1
			if s.params == 1 {
				// lightgbm's save_model appends "\npandas_categorical:..."
				// after the C++ writer closed the file: one commit ends here.
				s.params = 2
				return s.advance(i + 1), cutAlways, nil
			}
			continue
		}
		if !s.atLine {
			continue
		}
		if s.lineN < len(s.line) {
			s.line[s.lineN] = ch
			s.lineN++
		}
		l := s.line[:s.lineN]
		switch {
		case string(l) == lgbTree && !s.ended:
			s.atLine = false
			rule := cutGroup
			if len(s.out) >= maxParts {
				return i, cutNone, fmt.Errorf("lightgbm: more than %d trees", maxParts)
			}
			if s.inTrees {
				s.endTree()
			} else {
				rule = cutAlways
			}
			s.inTrees, s.treeStart = true, s.lineStart
			return s.advance(i + 1), rule, nil
		case string(l) == lgbEnd && s.inTrees:
			s.atLine = false
			s.endTree()
			s.inTrees, s.ended = false, true
			return s.advance(i + 1), cutAlways, nil
		case string(l) == lgbParamsEnd && s.ended && s.params == 0:
			s.atLine, s.params = false, 1
		case !bytes.HasPrefix([]byte(lgbTree), l) && !bytes.HasPrefix([]byte(lgbEnd), l) &&
			!bytes.HasPrefix([]byte(lgbParamsEnd), l):
			s.atLine = false
		}
	}
	return s.advance(len(b)), cutNone, nil
}

func (s *lgbTrees) endTree() {
	s.out = append(s.out, Tensor{Name: partName("tree", len(s.out)), DType: DTypeTree,
		Offset: s.treeStart, Length: s.lineStart - s.treeStart})
}

func (s *lgbTrees) advance(n int) int        { s.pos += int64(n); return n }
func (s *lgbTrees) dataLen() (int64, string) { return 0, "" }
func (s *lgbTrees) parts() []Tensor          { return s.out }
func (s *lgbTrees) complete() bool           { return s.ended }

// ubjTrees scans XGBoost's UBJSON model byte by byte: markers, big-endian
// numbers, strings, keys (a length without the 'S' marker), and containers
// with an optional '$' element type and '#' count (a counted container has
// no end marker; a typed one has no per-element markers, and a typed array
// of fixed-size elements is skipped whole). Cuts as for JSON: after the
// trees array's header, after each tree, and at the array's end.
type ubjTrees struct {
	treeList
	at       int64 // file offset of the byte being looked at (after scan's loop: of the next)
	st       ubjState
	frames   []ubjFrame // per open container, parallel to treeList.stack
	num      [8]byte    // a number being read
	numN     int
	numW     int
	then     ubjState // what the number read is for
	skip     int64
	skipEnds bool // the skip is a typed array's elements: it closes the array
	key      []byte
	keyLen   int64
	treesHdr bool // the trees array's header is being read
	held     bool // the byte at `at` had its cut before it
}

type ubjState uint8

const (
	ubjValue    ubjState = iota // a value's marker (or an array's ']')
	ubjKey                      // a member's key length marker (or an object's '}')
	ubjInt                      // an integer's marker, for then
	ubjNumber                   // reading an integer's or number's bytes, for then
	ubjHeader                   // just after '[' or '{': '$', '#' or the first element
	ubjType                     // the '$' element type
	ubjHash                     // the '#' after a '$' type
	ubjSkip                     // skipping bytes
	ubjKeyBytes                 // reading a key
	ubjDone                     // after the root value
)

// What an integer read is for (ubjState values reused as tags).
const (
	forValue  ubjState = iota // a number value
	forStrLen                 // a string's length
	forKeyLen                 // a key's length
	forCount                  // a container's count
)

type ubjFrame struct {
	typ     byte  // element type after '$', 0 if none
	counted bool  // '#' given: no end marker
	left    int64 // elements (members) left in a counted container
}

// ubjWidth is the payload size of a fixed-size UBJSON type, or -1.
func ubjWidth(m byte) int {
	switch m {
	case 'Z', 'N', 'T', 'F':
		return 0
	case 'i', 'U', 'C':
		return 1
	case 'I':
		return 2
	case 'l', 'd':
		return 4
	case 'L', 'D':
		return 8
	}
	return -1
}

// maxUBJLen bounds lengths and counts (a sanity bound, not a memory one:
// nothing is buffered).
const maxUBJLen = 1 << 50

func newUBJTrees() *ubjTrees { return &ubjTrees{} }

func (s *ubjTrees) complete() bool { return s.st == ubjDone && s.treeList.complete() }

func (s *ubjTrees) scan(b []byte) (int, cutRule, error) {
	base := s.at
	for i := 0; i < len(b); {
		s.at = base + int64(i)
		r, n, err := s.step(b[i:])
		i += n
		s.at = base + int64(i)
		if err != nil {
			return i, cutNone, fmt.Errorf("xgboost ubj: %w at %d", err, s.at)
		}
		if r != cutNone {
			return i, r, nil
		}
	}
	return len(b), cutNone, nil
}

// step consumes bytes from the start of b (non-empty) and returns the cut
// due after them. It consumes nothing only when it returns a cut due before
// b[0] (held).
func (s *ubjTrees) step(b []byte) (cutRule, int, error) {
	ch := b[0]
	switch s.st {
	case ubjDone:
		return cutNone, 0, errors.New("bytes after the document")
	case ubjSkip:
		k := int(min(s.skip, int64(len(b))))
		s.skip -= int64(k)
		if s.skip > 0 {
			return cutNone, k, nil
		}
		if s.skipEnds {
			s.skipEnds = false
			r, err := s.closeFrame()
			return r, k, err
		}
		r, err := s.valueDone()
		return r, k, err
	case ubjKeyBytes:
		k := int(min(s.keyLen, int64(len(b))))
		if room := maxPartKey - len(s.key); room > 0 {
			s.key = append(s.key, b[:min(k, room)]...)
		}
		s.keyLen -= int64(k)
		if s.keyLen == 0 {
			s.setKey(s.key, len(s.key) >= maxPartKey)
			s.st = ubjValue
		}
		return cutNone, k, nil
	case ubjNumber:
		s.num[s.numN] = ch
		if s.numN++; s.numN < s.numW {
			return cutNone, 1, nil
		}
		r, err := s.number()
		return r, 1, err
	case ubjInt:
		w := ubjWidth(ch)
		if w < 1 || ch == 'd' || ch == 'D' || ch == 'C' {
			return cutNone, 0, fmt.Errorf("integer marker %q", ch)
		}
		s.num[0], s.numN, s.numW, s.st = ch, 0, w, ubjNumber
		return cutNone, 1, nil
	case ubjType:
		if ubjWidth(ch) < 0 && ch != 'S' && ch != 'H' {
			return cutNone, 0, fmt.Errorf("element type %q", ch)
		}
		s.frames[len(s.frames)-1].typ = ch
		s.st = ubjHash
		return cutNone, 1, nil
	case ubjHash:
		if ch != '#' {
			return cutNone, 0, errors.New("typed container without a count")
		}
		s.st, s.then = ubjInt, forCount
		return cutNone, 1, nil
	case ubjHeader:
		switch ch {
		case '$':
			s.st = ubjType
			return cutNone, 1, nil
		case '#':
			s.st, s.then = ubjInt, forCount
			return cutNone, 1, nil
		}
		// An uncounted container: its elements start here.
		if s.treesHdr {
			s.treesHdr = false
			s.st = s.elementState()
			return cutAlways, 0, nil
		}
		s.st = s.elementState()
		return cutNone, 0, nil
	}
	// ubjKey or ubjValue: an end marker, a key length or a value.
	var f *ubjFrame
	if len(s.frames) > 0 {
		f = &s.frames[len(s.frames)-1]
	}
	if f != nil && !f.counted && f.typ == 0 && (ch == ']' || ch == '}') {
		if ch != closer(s.stack[len(s.stack)-1]) {
			return cutNone, 0, errors.New("unbalanced containers")
		}
		if ch == ']' && s.closingTrees() && !s.held {
			s.held = true
			return cutAlways, 0, nil
		}
		s.held = false
		s.at++
		r, err := s.closeFrame()
		return r, 1, err
	}
	if s.st == ubjKey {
		s.st, s.then = ubjInt, forKeyLen
		return cutNone, 0, nil
	}
	if f != nil && f.typ != 0 {
		r, err := s.value(f.typ, s.at) // a typed container's elements have no marker
		return r, 0, err
	}
	s.at++
	r, err := s.value(ch, s.at-1)
	return r, 1, err
}

// elementState is the state at the start of the current container's next
// element.
func (s *ubjTrees) elementState() ubjState {
	if s.inObject() {
		return ubjKey
	}
	return ubjValue
}

// value starts a value of type m whose marker (if any) is at offset at.
func (s *ubjTrees) value(m byte, at int64) (cutRule, error) {
	switch m {
	case '[', '{':
		if s.isTreeStart() {
			s.treeStart = at
		}
		isTrees, err := s.open(m)
		if err != nil {
			return cutNone, err
		}
		s.frames = append(s.frames, ubjFrame{})
		s.treesHdr = isTrees
		s.st = ubjHeader
		return cutNone, nil
	case 'S', 'H':
		s.st, s.then = ubjInt, forStrLen
		return cutNone, nil
	}
	w := ubjWidth(m)
	if w < 0 {
		return cutNone, fmt.Errorf("marker %q", m)
	}
	if w == 0 {
		return s.valueDone()
	}
	s.num[0], s.numN, s.numW, s.then, s.st = m, 0, w, forValue, ubjNumber
	return cutNone, nil
}

// number acts on a complete number.
func (s *ubjTrees) number() (cutRule, error) {
	var v uint64
	for _, x := range s.num[:s.numW] {
		v = v<<8 | uint64(x)
	}
	if s.then == forValue {
		return s.valueDone()
	}
	n := int64(v)
	switch s.numW { // signed types but U (uint8)
	case 2:
		n = int64(int16(v))
	case 4:
		n = int64(int32(v))
	}
	if n < 0 || n > maxUBJLen {
		return cutNone, fmt.Errorf("length or count %d", n)
	}
	switch s.then {
	case forStrLen:
		s.skip, s.st = n, ubjSkip
		if n == 0 {
			return s.valueDone()
		}
	case forKeyLen:
		s.key, s.keyLen, s.st = s.key[:0], n, ubjKeyBytes
		if n == 0 {
			s.setKey(nil, false)
			s.st = ubjValue
		}
	case forCount:
		f := &s.frames[len(s.frames)-1]
		f.counted, f.left = true, n
		r := cutNone
		if s.treesHdr {
			s.treesHdr, r = false, cutAlways
		}
		if w := ubjWidth(f.typ); f.typ != 0 && w >= 0 && s.stack[len(s.stack)-1] == '[' {
			// A typed array of fixed-size elements: skip them whole.
			if w > 0 && n > maxUBJLen/int64(w) {
				return cutNone, fmt.Errorf("array of %d elements", n)
			}
			f.left = 0
			s.skip, s.st, s.skipEnds = n*int64(w), ubjSkip, true
			if s.skip == 0 {
				s.skipEnds = false
				return s.closeFrame()
			}
			return r, nil
		}
		s.st = s.elementState()
		if n == 0 {
			return s.closeFrame()
		}
		return r, nil
	}
	return cutNone, nil
}

// valueDone ends a value in the current container.
func (s *ubjTrees) valueDone() (cutRule, error) {
	if len(s.frames) == 0 {
		s.st = ubjDone
		return cutNone, nil
	}
	f := &s.frames[len(s.frames)-1]
	if f.counted {
		if f.left--; f.left <= 0 {
			return s.closeFrame()
		}
	}
	s.st = s.elementState()
	return cutNone, nil
}

// closeFrame ends the current container (at offset s.at): a value of its
// parent.
func (s *ubjTrees) closeFrame() (cutRule, error) {
	tree, trees, err := s.close(s.stack[len(s.stack)-1], s.at)
	if err != nil {
		return cutNone, err
	}
	s.frames = s.frames[:len(s.frames)-1]
	r, err := s.valueDone()
	switch {
	case trees:
		r = cutAlways
	case tree && r == cutNone:
		r = cutGroup
	}
	return r, err
}
