package formats

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// joblib.dump writes a numpy array as a NumpyArrayWrapper object (its state:
// shape, order, dtype, whether the data is aligned) and then, outside the
// pickle's opcodes, the array's raw bytes: one byte of padding length, that
// many bytes of padding (when aligned), the elements; an array of objects
// (sklearn's estimators_) is a nested pickle instead. To step over those
// bytes the scanner keeps a small model of the pickle machine's stack: ints,
// short strings, flat tuples, globals, and the dicts and objects a wrapper
// is built from; anything else is an opaque value. Nothing is called.

// pvKind is the kind of a pickle value the scanner tracks.
type pvKind uint8

const (
	pvOther pvKind = iota
	pvInt
	pvStr
	pvTuple  // t holds its items (scalars; nested values are pvOther)
	pvDict   // w holds the wrapper fields among its items
	pvGlobal // s is "module\x00name"
	pvObj    // s is its class; w its wrapper fields once built
	pvDType  // i is its item size (0: objects or unknown), s its canonical name
)

type pv struct {
	kind pvKind
	i    int64
	s    string
	t    []pv
	w    *arrayInfo
}

// arrayInfo is what a NumpyArrayWrapper's state says.
type arrayInfo struct {
	shape    []int64
	shapeOK  bool
	itemsize int64 // 0: object array
	dtype    string
	dtypeOK  bool
	aligned  bool
}

// Limits of the stack model: a real joblib pickle stays far below them.
const (
	maxPVStack  = 1 << 14 // values on the stack (each at most ~1 KiB: a tuple of 16)
	maxPVMemo   = 1 << 14 // memo entries kept (later ones read as opaque)
	maxPVTuple  = 16      // items of a tuple kept
	maxPVStr    = 40      // bytes of a string kept
	maxPVNested = 8       // pickles nested in pickles (object arrays)
)

const joblibWrapper = "joblib.numpy_pickle\x00NumpyArrayWrapper"

// pvm is the stack model of one pickle.
type pvm struct {
	stack []pv
	marks []int
	memo  map[int64]pv
	memoN int64
}

func (m *pvm) push(v pv) error {
	if len(m.stack) >= maxPVStack {
		return fmt.Errorf("pickle: stack deeper than %d", maxPVStack)
	}
	m.stack = append(m.stack, v)
	return nil
}

// pop removes n values (opaque ones if the stack holds fewer above the
// last mark: the scanner never fails on what it does not model).
func (m *pvm) pop(n int) []pv {
	floor := 0
	if len(m.marks) > 0 {
		floor = m.marks[len(m.marks)-1]
	}
	out := make([]pv, n)
	k := min(n, len(m.stack)-floor)
	copy(out[n-k:], m.stack[len(m.stack)-k:])
	m.stack = m.stack[:len(m.stack)-k]
	return out
}

// popMark removes the values above the last mark, and the mark.
func (m *pvm) popMark() ([]pv, error) {
	if len(m.marks) == 0 {
		return nil, errors.New("pickle: no MARK")
	}
	at := m.marks[len(m.marks)-1]
	m.marks = m.marks[:len(m.marks)-1]
	out := m.stack[at:]
	m.stack = m.stack[:at]
	return out, nil
}

func (m *pvm) top() *pv {
	if len(m.stack) == 0 || len(m.marks) > 0 && m.marks[len(m.marks)-1] == len(m.stack) {
		return nil
	}
	return &m.stack[len(m.stack)-1]
}

func (m *pvm) put(i int64) {
	if t := m.top(); t != nil && (len(m.memo) < maxPVMemo || m.memo[i].kind != pvOther) {
		if m.memo == nil {
			m.memo = map[int64]pv{}
		}
		m.memo[i] = *t
	}
}

func tupleOf(items []pv) pv {
	if len(items) > maxPVTuple {
		return pv{}
	}
	t := make([]pv, len(items))
	for i, it := range items {
		if it.kind == pvInt || it.kind == pvStr {
			t[i] = pv{kind: it.kind, i: it.i, s: it.s}
		}
	}
	return pv{kind: pvTuple, t: t}
}

// setItem records a dict item of a wrapper's state.
func setItem(d *pv, k, v pv) {
	if d == nil || d.kind != pvDict || k.kind != pvStr {
		return
	}
	if d.w == nil {
		d.w = &arrayInfo{}
	}
	switch k.s {
	case "shape":
		if v.kind != pvTuple {
			return
		}
		d.w.shape, d.w.shapeOK = make([]int64, len(v.t)), true
		for i, x := range v.t {
			if x.kind != pvInt || x.i < 0 {
				d.w.shapeOK = false
			}
			d.w.shape[i] = x.i
		}
	case "dtype":
		d.w.dtypeOK = v.kind == pvDType
		d.w.itemsize, d.w.dtype = v.i, v.s
	case "numpy_array_alignment_bytes":
		d.w.aligned = true
	}
}

// stackOp applies opcode op (arg: its fixed-size argument; n: the length
// of a string argument) to the model. It returns a wrapper just built, if
// any: its array's bytes follow.
func (m *pvm) stackOp(op byte, arg []byte, n int64) (*arrayInfo, error) {
	switch op {
	case '(':
		if len(m.marks) >= maxPickleMarks {
			return nil, fmt.Errorf("pickle: MARKs nest deeper than %d", maxPickleMarks)
		}
		m.marks = append(m.marks, len(m.stack))
	case '0':
		if len(m.marks) > 0 && m.marks[len(m.marks)-1] == len(m.stack) {
			m.marks = m.marks[:len(m.marks)-1]
		} else {
			m.pop(1)
		}
	case '1', 'e', 0x90:
		_, err := m.popMark()
		return nil, err
	case '2':
		v := pv{}
		if t := m.top(); t != nil {
			v = *t
		}
		return nil, m.push(v)
	case 'J':
		return nil, m.push(pv{kind: pvInt, i: int64(int32(binary.LittleEndian.Uint32(arg)))})
	case 'K':
		return nil, m.push(pv{kind: pvInt, i: int64(arg[0])})
	case 'M':
		return nil, m.push(pv{kind: pvInt, i: int64(binary.LittleEndian.Uint16(arg))})
	case 'X', 0x8c, 0x8d, 'T', 'U':
		if n <= maxPVStr {
			return nil, m.push(pv{kind: pvStr}) // its text is filled in as it streams past
		}
		return nil, m.push(pv{})
	case ')':
		return nil, m.push(pv{kind: pvTuple})
	case '}':
		return nil, m.push(pv{kind: pvDict})
	case 't':
		items, err := m.popMark()
		if err != nil {
			return nil, err
		}
		return nil, m.push(tupleOf(items))
	case 0x85, 0x86, 0x87:
		return nil, m.push(tupleOf(m.pop(int(op - 0x84))))
	case 'l', 'd', 0x91, 'o':
		if _, err := m.popMark(); err != nil {
			return nil, err
		}
		return nil, m.push(pv{})
	case 'i':
		if _, err := m.popMark(); err != nil {
			return nil, err
		}
		return nil, m.push(pv{})
	case 'a':
		m.pop(1)
	case 's':
		kv := m.pop(2)
		setItem(m.top(), kv[0], kv[1])
	case 'u':
		items, err := m.popMark()
		if err != nil {
			return nil, err
		}
		d := m.top()
		for i := 0; i+1 < len(items); i += 2 {
			setItem(d, items[i], items[i+1])
		}
	case 0x93:
		mn := m.pop(2)
		if mn[0].kind == pvStr && mn[1].kind == pvStr {
			return nil, m.push(pv{kind: pvGlobal, s: mn[0].s + "\x00" + mn[1].s})
		}
		return nil, m.push(pv{})
	case 'R':
		return nil, m.reduce()
	case 0x81, 0x92:
		return nil, m.newObj(op)
	case 'b':
		return m.build(), nil
	case 'q':
		m.put(int64(arg[0]))
	case 'r':
		m.put(int64(binary.LittleEndian.Uint32(arg)))
	case 0x94:
		m.put(m.memoN)
		m.memoN++
	case 'h', 'j':
		i := int64(arg[0])
		if op == 'j' {
			i = int64(binary.LittleEndian.Uint32(arg))
		}
		return nil, m.push(m.memo[i])
	case 'Q', 0x98, 'p', '.', 0x80, 0x95:
		// BINPERSID and READONLY_BUFFER replace the top; PUT (text) is not
		// modelled; STOP, PROTO and FRAME leave the stack alone.
	case 0x8a, 0x8b, 'I', 'L', 'F', 'G', 'S', 'V', 'B', 'C', 0x8e, 0x96, 'N', 0x88, 0x89,
		']', 0x8f, 'c', 'g', 'P', 0x82, 0x83, 0x84, 0x97:
		return nil, m.push(pv{})
	}
	return nil, nil
}

// reduce is REDUCE: a call of numpy.dtype(name, ...) becomes the dtype;
// any other call an unknown value.
func (m *pvm) reduce() error {
	fa := m.pop(2)
	if fa[0].kind == pvGlobal && fa[0].s == "numpy\x00dtype" && fa[1].kind == pvTuple && len(fa[1].t) > 0 && fa[1].t[0].kind == pvStr {
		name := fa[1].t[0].s
		dt := pv{kind: pvDType, i: npyItemSize(name), s: name}
		if c, ok := npyDTypes["<"+name]; ok {
			dt.s = c
		} else if c, ok := npyDTypes["|"+name]; ok {
			dt.s = c
		}
		return m.push(dt)
	}
	return m.push(pv{})
}

// newObj is NEWOBJ (cls, args) or NEWOBJ_EX (cls, args, kwargs): an object
// of a known class, or an unknown value.
func (m *pvm) newObj(op byte) error {
	k := 2
	if op == 0x92 {
		k = 3
	}
	args := m.pop(k)
	if args[0].kind == pvGlobal {
		return m.push(pv{kind: pvObj, s: args[0].s})
	}
	return m.push(pv{})
}

// build is BUILD: the state of a structured dtype gives its item size; the
// state of a joblib array wrapper, complete, gives the array whose bytes
// follow (returned), and the wrapper becomes the array (unknown here).
func (m *pvm) build() *arrayInfo {
	st := m.pop(1)[0]
	t := m.top()
	switch {
	case t == nil:
	case t.kind == pvDType && st.kind == pvTuple && len(st.t) >= 6 && st.t[5].kind == pvInt && st.t[5].i > 0:
		t.i = st.t[5].i // a structured or void dtype's item size
		if t.s == "" || t.s[0] == 'V' {
			t.s = ""
		}
	case t.kind == pvObj && t.s == joblibWrapper && st.kind == pvDict && st.w != nil && st.w.shapeOK && st.w.dtypeOK:
		w := *st.w
		*t = pv{} // the unpickler replaces the wrapper by its array
		return &w
	}
	return nil
}
