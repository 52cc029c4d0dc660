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

func (t *treeList) parts() []Tensor    { return t.out }
func (t *treeList) complete() bool     { return t.rootDone && t.seenTrees }
func (t *treeList) dataLen() int64     { return 0 }
func (t *treeList) inObject() bool     { return len(t.stack) > 0 && t.stack[len(t.stack)-1] == '{' }
func (t *treeList) closingTrees() bool { return t.treesDepth > 0 && len(t.stack) == t.treesDepth }

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
			tree, _, err := s.close(map[byte]byte{'}': '{', ']': '['}[ch], s.pos+int64(i)+1)
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
// trees" (always), after "Tree=" of every later tree (grouped). A cut a few
// bytes into a line is as stable as one at its start: each chunk of trees
// is "N\n<tree N>...\n\nTree=".
type lgbTrees struct {
	pos       int64
	atLine    bool // pos is at a line start or inside the line's first bytes
	line      [12]byte
	lineN     int
	lineStart int64
	trees     int
	treeStart int64
	inTrees   bool
	ended     bool
	out       []Tensor
}

const lgbTree, lgbEnd = "Tree=", "end of trees"

func (s *lgbTrees) scan(b []byte) (int, cutRule, error) {
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if ch == '\n' {
			s.atLine, s.lineN, s.lineStart = true, 0, s.pos+int64(i)+1
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
		case !bytes.HasPrefix([]byte(lgbTree), l) && !bytes.HasPrefix([]byte(lgbEnd), l):
			s.atLine = false
		}
	}
	return s.advance(len(b)), cutNone, nil
}

func (s *lgbTrees) endTree() {
	s.out = append(s.out, Tensor{Name: partName("tree", len(s.out)), DType: DTypeTree,
		Offset: s.treeStart, Length: s.lineStart - s.treeStart})
}

func (s *lgbTrees) advance(n int) int { s.pos += int64(n); return n }
func (s *lgbTrees) dataLen() int64    { return 0 }
func (s *lgbTrees) parts() []Tensor   { return s.out }
func (s *lgbTrees) complete() bool    { return s.ended }

// ubjTrees scans XGBoost's UBJSON model (stub until its scanner lands).
type ubjTrees struct{ treeList }

func newUBJTrees() *ubjTrees { return &ubjTrees{} }

func (s *ubjTrees) scan(b []byte) (int, cutRule, error) {
	return 0, cutNone, errors.New("xgboost ubj: not followed yet")
}
