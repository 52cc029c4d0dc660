package formats

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// A torch data.pkl is interpreted, never executed: gopickle's VM runs with a
// FindClass hook that maps an allow-list of globals to inert Go values
// (storage classes, dtypes, recorders for torch._utils._rebuild_* calls)
// and rejects every other global, and a PersistentLoad hook that turns
// ('storage', class, key, location, numel) ids into storageRef records.
// Before the VM runs, scanPickle walks the opcodes and bounds what the VM
// can allocate: every length argument must lie inside the pickle, and the
// opcode count and MARK depth are capped.

const (
	// maxPickleOps caps the opcodes of one data.pkl. gopickle allocates at
	// most ~230 bytes per opcode (an empty dict on the stack), so this
	// bounds the VM to ~250 MB; a state dict takes ~25 opcodes per tensor,
	// so files of up to ~40k tensors parse.
	maxPickleOps = 1 << 20
	// maxPickleMarks caps the MARK nesting depth.
	maxPickleMarks = 1024
	// maxPickleDepth caps the nesting depth of the unpickled object that the
	// tensor walk follows.
	maxPickleDepth = 256
	// maxPickleLong caps the bytes of a LONG1/LONG4 integer (gopickle
	// decodes big integers in quadratic time); torch writes at most 9.
	maxPickleLong = 32
	// maxPickleLine caps the text argument of numeric, memo and GLOBAL
	// opcodes.
	maxPickleLine = 1024
)

// Pickle opcode argument kinds (see Python's pickletools).
const (
	pkInvalid = iota
	pkNone
	pkU1
	pkU2
	pkI4
	pkU8 // FRAME: transparent to the scan
	pkF8
	pkLong1
	pkLong4
	pkStr1
	pkStr4
	pkStr8
	pkLine
	pkLine2
)

// pickleArgs gives each opcode's argument kind; pkInvalid rejects it.
var pickleArgs = func() (t [256]uint8) {
	for _, c := range []byte("(.012NQRabd}el]ost)u\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98") {
		t[c] = pkNone
	}
	for _, c := range []byte("Khq\x80\x82") {
		t[c] = pkU1
	}
	t['M'], t['\x83'] = pkU2, pkU2
	for _, c := range []byte("Jjr\x84") {
		t[c] = pkI4
	}
	t['\x95'] = pkU8
	t['G'] = pkF8
	t['\x8a'] = pkLong1
	t['\x8b'] = pkLong4
	for _, c := range []byte("UC\x8c") {
		t[c] = pkStr1
	}
	for _, c := range []byte("TBX") {
		t[c] = pkStr4
	}
	for _, c := range []byte("\x8d\x8e\x96") {
		t[c] = pkStr8
	}
	for _, c := range []byte("ILFSVPgp") {
		t[c] = pkLine
	}
	t['c'], t['i'] = pkLine2, pkLine2
	return t
}()

// pickleScan finds the end of a pickle and checks that every opcode's
// argument fits inside it. It can resume after errShort when more bytes
// arrive.
type pickleScan struct {
	maxOps int  // opcodes allowed; 0: maxPickleOps
	pos    int  // offset of the next opcode
	ops    int  // opcodes seen
	marks  int  // open MARKs
	end    int  // offset just past STOP, once found
	done   bool // STOP seen
}

// scan continues over b (the pickle's bytes so far, from its start). It
// returns nil once STOP is found, errShort if b ends first, or an error.
func (s *pickleScan) scan(b []byte) error {
	for !s.done {
		if s.pos >= len(b) {
			return errShort
		}
		op := b[s.pos]
		kind := pickleArgs[op]
		p := s.pos + 1
		var n int // argument bytes after p
		switch kind {
		case pkInvalid:
			return fmt.Errorf("pickle: opcode %#x at %d not allowed", op, s.pos)
		case pkNone:
		case pkU1:
			n = 1
		case pkU2:
			n = 2
		case pkI4:
			n = 4
		case pkU8, pkF8:
			n = 8
		case pkLong1, pkStr1:
			if p >= len(b) {
				return errShort
			}
			n = 1 + int(b[p])
			if kind == pkLong1 && (b[p] == 0 || b[p] > maxPickleLong) {
				return fmt.Errorf("pickle: LONG1 of %d bytes at %d", b[p], s.pos)
			}
		case pkLong4, pkStr4:
			if p+4 > len(b) {
				return errShort
			}
			v := binary.LittleEndian.Uint32(b[p:])
			if v > maxHeaderSize || kind == pkLong4 && (v == 0 || v > maxPickleLong) {
				return fmt.Errorf("pickle: argument of %d bytes at %d", v, s.pos)
			}
			n = 4 + int(v)
		case pkStr8:
			if p+8 > len(b) {
				return errShort
			}
			v := binary.LittleEndian.Uint64(b[p:])
			if v > maxHeaderSize {
				return fmt.Errorf("pickle: argument of %d bytes at %d", v, s.pos)
			}
			n = 8 + int(v)
		case pkLine, pkLine2:
			lines := 1
			if kind == pkLine2 {
				lines = 2
			}
			q := p
			for range lines {
				i := bytes.IndexByte(b[q:], '\n')
				if i < 0 {
					return errShort
				}
				q += i + 1
			}
			n = q - p
			if n > maxPickleLine && strings.IndexByte("ILFgpci", op) >= 0 {
				return fmt.Errorf("pickle: %q argument of %d bytes at %d", op, n, s.pos)
			}
		}
		if p+n > len(b) {
			return errShort
		}
		switch op {
		case '\x80':
			if b[p] > pickle.HighestProtocol {
				return fmt.Errorf("pickle: protocol %d", b[p])
			}
		case '\x95': // FRAME: its size must fit in what follows
			if binary.LittleEndian.Uint64(b[p:]) > maxHeaderSize {
				return fmt.Errorf("pickle: frame too large at %d", s.pos)
			}
			if int(binary.LittleEndian.Uint64(b[p:])) > len(b)-(p+n) {
				if len(b)-(p+n) >= maxHeaderSize {
					return fmt.Errorf("pickle: frame too large at %d", s.pos)
				}
				return errShort
			}
		case '(':
			if s.marks++; s.marks > maxPickleMarks {
				return fmt.Errorf("pickle: MARKs nest deeper than %d", maxPickleMarks)
			}
		case 't', 'l', 'd', 'e', 'u', '\x90', '\x91', '1', 'o', 'i':
			if s.marks--; s.marks < 0 {
				return fmt.Errorf("pickle: opcode %q at %d without MARK", op, s.pos)
			}
		case '.':
			s.done, s.end = true, p
		}
		s.pos = p + n
		if s.ops++; s.ops > cmp.Or(s.maxOps, maxPickleOps) {
			return fmt.Errorf("pickle: more than %d opcodes", cmp.Or(s.maxOps, maxPickleOps))
		}
	}
	return nil
}

// storageRef is a persistent id ('storage', class, key, location, numel):
// record data/<key> holds numel elements of elemSize bytes.
type storageRef struct {
	key      string
	dtype    string // "" for UntypedStorage
	elemSize int64  // 1 for UntypedStorage
	numel    int64
}

// nbytes is the size of the storage's record.
func (s *storageRef) nbytes() (int64, bool) { return mulCheck(s.numel, s.elemSize) }

// tensorRec records a _rebuild_tensor_v2/v3 call.
type tensorRec struct {
	storage *storageRef
	dtype   string // canonical; from v3's dtype argument, else the storage's
	offset  int64  // in elements
	size    []int64
	stride  []int64
}

// pyGlobal is an allowed global that is inert: calling it, or building an
// object from it, gives a pyObject.
type pyGlobal struct{ module, name string }

// pyObject is an instance of an inert global. It accepts and drops state,
// items and attributes.
type pyObject struct{ class *pyGlobal }

func (g *pyGlobal) Call(args ...any) (any, error)  { return &pyObject{g}, nil }
func (g *pyGlobal) PyNew(args ...any) (any, error) { return &pyObject{g}, nil }
func (o *pyObject) PySetState(any) error           { return nil }
func (o *pyObject) PyDictSet(k, v any) error       { return nil }
func (o *pyObject) PySetAttr(string, any) error    { return nil }
func (o *pyObject) Set(k, v any)                   {}
func (o *pyObject) Append(v any)                   {}
func (o *pyObject) Add(v any)                      {}

// storageClass is a torch.<X>Storage global.
type storageClass struct {
	dtype    string
	elemSize int64
}

func (*storageClass) Call(args ...any) (any, error) {
	return nil, errors.New("storage classes are not callable in a checkpoint")
}

// dtypeValue is a torch.<dtype> global, e.g. torch.float8_e4m3fn.
type dtypeValue struct{ dtype string }

// dictFactory is collections.defaultdict / Counter: it builds a plain dict.
type dictFactory struct{}

func (dictFactory) Call(args ...any) (any, error) { return types.NewDict(), nil }

// rebuildFunc is one of torch's tensor reconstruction functions.
type rebuildFunc struct{ name string }

func (f *rebuildFunc) Call(args ...any) (any, error) {
	switch f.name {
	case "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3":
		return rebuildTensor(f.name, args)
	case "_rebuild_parameter", "_rebuild_parameter_with_state":
		if len(args) < 1 {
			return nil, fmt.Errorf("%s: no arguments", f.name)
		}
		return args[0], nil
	case "_rebuild_from_type_v2", "_rebuild_from_type":
		// (func, type, args, state): the result is func(*args) viewed as type.
		if len(args) >= 3 {
			if fn, ok := args[0].(*rebuildFunc); ok && !strings.HasPrefix(fn.name, "_rebuild_from_type") {
				if t, ok := args[2].(*types.Tuple); ok {
					return fn.Call(*t...)
				}
			}
		}
	}
	// Quantized, sparse, nested, meta and subclass tensors: not indexed.
	return &pyObject{&pyGlobal{"torch._utils", f.name}}, nil
}

// rebuildTensor records _rebuild_tensor[_v2|_v3](storage, storage_offset,
// size, stride, ...[, dtype (v3)]).
func rebuildTensor(name string, args []any) (any, error) {
	if len(args) < 4 || name == "_rebuild_tensor_v3" && len(args) < 7 {
		return nil, fmt.Errorf("%s: %d arguments", name, len(args))
	}
	st, ok := args[0].(*storageRef)
	if !ok {
		return nil, fmt.Errorf("%s: first argument is %T, not a storage", name, args[0])
	}
	off, ok := pyInt(args[1])
	if !ok || off < 0 {
		return nil, fmt.Errorf("%s: bad storage offset (%T)", name, args[1])
	}
	size, ok1 := pyInts(args[2])
	stride, ok2 := pyInts(args[3])
	if !ok1 || !ok2 || len(size) != len(stride) || len(size) > maxDims {
		return nil, fmt.Errorf("%s: bad size (%T) or stride (%T)", name, args[2], args[3])
	}
	t := &tensorRec{storage: st, dtype: st.dtype, offset: off, size: size, stride: stride}
	if name == "_rebuild_tensor_v3" {
		dt, ok := args[6].(*dtypeValue)
		if !ok {
			return nil, fmt.Errorf("%s: dtype argument is %T", name, args[6])
		}
		t.dtype = dt.dtype
	}
	return t, nil
}

// pyInt converts a pickled int to int64.
func pyInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// pyInts converts a tuple (or torch.Size, a tuple subclass) of non-negative ints.
func pyInts(v any) ([]int64, bool) {
	var items []any
	switch x := v.(type) {
	case *types.Tuple:
		items = *x
	case *types.List:
		items = *x
	default:
		return nil, false
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := pyInt(it)
		if !ok || n < 0 {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// findClass is the allow-list of globals a checkpoint may name.
func findClass(module, name string) (any, error) {
	switch module {
	case "torch._utils", "torch._tensor":
		if strings.HasPrefix(name, "_rebuild_") {
			return &rebuildFunc{name}, nil
		}
	case "torch":
		if dt, ok := torchStorageDTypes[name]; ok {
			return &storageClass{dt, int64(dtypeBits[dt] / 8)}, nil
		}
		if name == "UntypedStorage" {
			return &storageClass{"", 1}, nil
		}
		if dt, ok := torchDTypes[name]; ok {
			return &dtypeValue{dt}, nil
		}
		switch name {
		case "device", "Size", "Tensor", "strided", "sparse_coo", "sparse_csr", "_mkldnn",
			"contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
			"per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams":
			return &pyGlobal{module, name}, nil
		}
	case "torch.nn.parameter":
		switch name {
		case "Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer":
			return &pyGlobal{module, name}, nil
		}
	case "torch.serialization":
		if name == "_get_layout" {
			return &pyGlobal{module, name}, nil
		}
	case "collections":
		switch name {
		case "defaultdict", "Counter":
			return dictFactory{}, nil
		}
	case "builtins", "__builtin__":
		switch name {
		case "set", "frozenset", "slice", "complex", "bytearray", "range", "object":
			return &pyGlobal{module, name}, nil
		}
	case "_codecs":
		if name == "encode" {
			return &pyGlobal{module, name}, nil
		}
	case "numpy.core.multiarray", "numpy._core.multiarray":
		if name == "_reconstruct" || name == "scalar" {
			return &pyGlobal{module, name}, nil
		}
	case "numpy":
		if name == "ndarray" || name == "dtype" {
			return &pyGlobal{module, name}, nil
		}
	case "numpy.dtypes":
		if strings.HasSuffix(name, "DType") {
			return &pyGlobal{module, name}, nil
		}
	case "argparse":
		if name == "Namespace" {
			return &pyGlobal{module, name}, nil
		}
	}
	return nil, fmt.Errorf("global %s.%s is not allowed", module, name)
}

// torchPickle is what data.pkl says about storages and tensors.
type torchPickle struct {
	storages map[string]*storageRef
	tensors  []namedTensor
	dtypes   map[string]string // storage key -> element dtype, "" if unknown
}

type namedTensor struct {
	name string
	rec  *tensorRec
}

// loadTorchPickle interprets a complete data.pkl (scanned by scanPickle).
func loadTorchPickle(pkl []byte) (tp *torchPickle, err error) {
	var s pickleScan
	if err := s.scan(pkl); err != nil {
		if err == errShort {
			err = errors.New("pickle: no STOP")
		}
		return nil, err
	}
	if s.end != len(pkl) {
		return nil, fmt.Errorf("pickle: %d bytes after STOP", len(pkl)-s.end)
	}
	tp = &torchPickle{storages: make(map[string]*storageRef)}
	obj, err := unpickle(pkl, findClass, tp.persistentLoad)
	if err != nil {
		return nil, err
	}
	w := walker{budget: 4*len(pkl) + 1024, onPath: make(map[any]bool)}
	if err := w.walk(obj, nil, 0); err != nil {
		return nil, err
	}
	tp.tensors = w.out
	// A storage's dtype is its class's, or for an UntypedStorage that of
	// the first tensor viewing it.
	tp.dtypes = make(map[string]string, len(tp.storages))
	for key, s := range tp.storages {
		tp.dtypes[key] = s.dtype
	}
	for _, nt := range tp.tensors {
		if b := dtypeBits[nt.rec.dtype]; tp.dtypes[nt.rec.storage.key] == "" && b > 0 && b%8 == 0 {
			tp.dtypes[nt.rec.storage.key] = nt.rec.dtype
		}
	}
	return tp, nil
}

// unpickle runs gopickle's VM over a scanned pickle with the given hooks
// (persistentLoad may be nil).
func unpickle(pkl []byte, find func(module, name string) (any, error), persistentLoad func(any) (any, error)) (obj any, err error) {
	u := pickle.NewUnpickler(bytes.NewReader(pkl))
	u.FindClass = find
	u.PersistentLoad = persistentLoad
	defer func() {
		// gopickle panics on some malformed input (odd DICT item counts,
		// unhashable set or dict keys); report those as errors.
		if r := recover(); r != nil {
			obj, err = nil, fmt.Errorf("pickle: %v", r)
		}
	}()
	obj, err = u.Load()
	if err != nil {
		// gopickle's messages may print whole objects: keep them short.
		msg := err.Error()
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		return nil, errors.New("pickle: " + msg)
	}
	return obj, nil
}

// persistentLoad maps ('storage', class, key, location, numel) to a storageRef.
func (tp *torchPickle) persistentLoad(pid any) (any, error) {
	t, ok := pid.(*types.Tuple)
	if !ok || t.Len() < 5 || t.Get(0) != "storage" {
		return nil, fmt.Errorf("pickle: unsupported persistent id (%T)", pid)
	}
	cls, ok := t.Get(1).(*storageClass)
	if !ok {
		return nil, fmt.Errorf("pickle: persistent id names %T, not a storage class", t.Get(1))
	}
	var key string
	switch k := t.Get(2).(type) {
	case string:
		key = k
	case int:
		key = strconv.Itoa(k)
	default:
		return nil, fmt.Errorf("pickle: storage key of type %T", t.Get(2))
	}
	numel, ok := pyInt(t.Get(4))
	if !ok || numel < 0 {
		return nil, fmt.Errorf("pickle: bad storage numel (%T)", t.Get(4))
	}
	if s, ok := tp.storages[key]; ok {
		if s.dtype != cls.dtype || s.numel != numel {
			return nil, fmt.Errorf("pickle: storage %q described twice differently", key)
		}
		return s, nil
	}
	s := &storageRef{key: key, dtype: cls.dtype, elemSize: cls.elemSize, numel: numel}
	if _, ok := s.nbytes(); !ok {
		return nil, fmt.Errorf("pickle: storage %q size overflows", key)
	}
	tp.storages[key] = s
	return s, nil
}

// walker collects the tensors of an unpickled object with their key paths.
type walker struct {
	budget int          // remaining visits; shared sub-objects are visited per path
	onPath map[any]bool // containers on the current path, to cut cycles
	out    []namedTensor
}

func (w *walker) walk(v any, path []string, depth int) error {
	if w.budget--; w.budget < 0 {
		return errors.New("pickle: object graph too large to walk")
	}
	if depth > maxPickleDepth {
		return fmt.Errorf("pickle: objects nest deeper than %d", maxPickleDepth)
	}
	switch x := v.(type) {
	case *tensorRec:
		w.out = append(w.out, namedTensor{strings.Join(path, "."), x})
		return nil
	case *types.OrderedDict, *types.Dict, *types.List, *types.Tuple:
		if w.onPath[x] {
			return nil
		}
		w.onPath[x] = true
		defer delete(w.onPath, x)
	default:
		return nil
	}
	child := func(k string, c any) error {
		switch c.(type) {
		case *tensorRec, *types.OrderedDict, *types.Dict, *types.List, *types.Tuple:
			return w.walk(c, append(path[:len(path):len(path)], k), depth+1)
		}
		return nil
	}
	switch x := v.(type) {
	case *types.OrderedDict:
		for e := x.List.Front(); e != nil; e = e.Next() {
			ent := e.Value.(*types.OrderedDictEntry)
			if err := child(keyString(ent.Key), ent.Value); err != nil {
				return err
			}
		}
	case *types.Dict:
		// Python keeps the last value of a repeated key, at the first position.
		last := make(map[string]int, len(*x))
		for i, e := range *x {
			last[keyString(e.Key)] = i
		}
		for _, e := range *x {
			k := keyString(e.Key)
			if j := last[k]; j >= 0 {
				last[k] = -1
				if err := child(k, (*x)[j].Value); err != nil {
					return err
				}
			}
		}
	case *types.List:
		for i, c := range *x {
			if err := child(strconv.Itoa(i), c); err != nil {
				return err
			}
		}
	case *types.Tuple:
		for i, c := range *x {
			if err := child(strconv.Itoa(i), c); err != nil {
				return err
			}
		}
	}
	return nil
}

// keyString renders a dict key as a name component.
func keyString(k any) string {
	switch x := k.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	case *big.Int:
		return x.String()
	case bool:
		if x {
			return "True"
		}
		return "False"
	case nil:
		return "None"
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprintf("%T", k)
}

// span returns a tensor's byte offset inside its storage record and its
// byte length: Σ (size_i-1)*stride_i + 1 elements, 0 if any size is 0.
func (t *tensorRec) span() (off, n int64, ok bool) {
	itemsize := int64(dtypeBits[t.dtype] / 8)
	if itemsize == 0 {
		return 0, 0, false
	}
	off, ok = mulCheck(t.offset, itemsize)
	if !ok {
		return 0, 0, false
	}
	last := int64(0)
	for i, s := range t.size {
		if s == 0 {
			return off, 0, true
		}
		d, ok := mulCheck(s-1, t.stride[i])
		if !ok || last > maxInt64-d {
			return 0, 0, false
		}
		last += d
	}
	if n, ok = mulCheck(last+1, itemsize); !ok {
		return 0, 0, false
	}
	return off, n, true
}
