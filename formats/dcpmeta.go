package formats

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nlpodyssey/gopickle/types"
)

// torch.distributed.checkpoint's .metadata is a pickle of a Metadata
// dataclass. Its storage_data maps each item (a MetadataIndex: the
// state-dict key and, for a shard of a tensor, the shard's offset in the
// whole tensor) to where its bytes lie (a _StorageInfo: a .distcp file of
// the checkpoint's directory, an offset and a length). That is what names
// the archives of a distcp file (see stepZipNext), which are numbered only.
// The pickle is interpreted as data.pkl is (scanned and bounded first,
// never executed): DCP's own classes become records of the state BUILD
// gives them, torch's globals come from findClass, anything else is
// refused.

// DCPItem is one item of a torch.distributed.checkpoint: a tensor, a shard
// of one, or a non-tensor value, and where its bytes lie.
type DCPItem struct {
	// FQN is the state-dict key path joined with ".".
	FQN string
	// ShardOffset is a tensor shard's offset in the whole tensor, one
	// number per dimension; nil for a non-tensor value.
	ShardOffset []int64
	// File is the item's file, relative to the checkpoint's directory.
	File string
	// Offset and Length are the item's byte range in File: one torch.save
	// archive of a distcp file.
	Offset, Length int64
}

// maxDCPOps caps the opcodes of a .metadata: about 100,000 items (tensor
// shards of all ranks; a data.pkl's cap, maxPickleOps, stopped at about
// 10,000). Measured: 50,000 items are a 10 MB file that parses in 0.8 s
// into 310 MB of heap. gopickle allocates at most ~230 bytes an opcode,
// ~2 GB at the cap for a hostile file. Only the CLI reads .metadata.
const maxDCPOps = 1 << 23

// ParseDCPMetadata interprets a torch.distributed.checkpoint .metadata
// file and returns its items, sorted by file and offset.
func ParseDCPMetadata(b []byte) ([]DCPItem, error) {
	s := pickleScan{maxOps: maxDCPOps}
	if err := s.scan(b); err != nil {
		if err == errShort {
			err = errors.New("no STOP")
		}
		return nil, fmt.Errorf("%w: dcp metadata: pickle: %v", ErrFormat, err)
	}
	obj, err := unpickle(b[:s.end], findDCPClass, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: dcp metadata: %v", ErrFormat, err)
	}
	md, ok := obj.(*dcpObject)
	if !ok || md.class != "Metadata" {
		return nil, fmt.Errorf("%w: dcp metadata: not a torch.distributed.checkpoint Metadata", ErrFormat)
	}
	sd, ok := md.fields["storage_data"].(*types.Dict)
	var items []DCPItem
	if !ok {
		return nil, fmt.Errorf("%w: dcp metadata: no storage_data", ErrFormat)
	}
	for _, e := range *sd {
		k, kok := e.Key.(*dcpObject)
		v, vok := e.Value.(*dcpObject)
		if !kok || !vok || k.class != "MetadataIndex" || v.class != "_StorageInfo" {
			return nil, fmt.Errorf("%w: dcp metadata: storage_data holds something other than MetadataIndex -> _StorageInfo", ErrFormat)
		}
		fqn, ok1 := k.fields["fqn"].(string)
		file, ok2 := v.fields["relative_path"].(string)
		off, ok3 := pyInt(v.fields["offset"])
		n, ok4 := pyInt(v.fields["length"])
		if !ok1 || !ok2 || !ok3 || !ok4 || off < 0 || n < 0 {
			return nil, fmt.Errorf("%w: dcp metadata: item %q: missing or bad fqn, relative_path, offset or length", ErrFormat, fqn)
		}
		it := DCPItem{FQN: fqn, File: file, Offset: off, Length: n}
		if so, ok := pyInts(k.fields["offset"]); ok {
			it.ShardOffset = so
		}
		items = append(items, it)
	}
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].File != items[j].File {
			return items[i].File < items[j].File
		}
		return items[i].Offset < items[j].Offset
	})
	return items, nil
}

// dcpClass is a class of torch.distributed.checkpoint: instantiating or
// calling it gives a dcpObject.
type dcpClass struct{ name string }

// dcpObject keeps the string-keyed state BUILD gives it (a dataclass's
// fields); other state is dropped.
type dcpObject struct {
	class  string
	fields map[string]any
}

func (c *dcpClass) PyNew(args ...any) (any, error) {
	return &dcpObject{class: c.name, fields: map[string]any{}}, nil
}
func (c *dcpClass) Call(args ...any) (any, error) { return c.PyNew() }

func (o *dcpObject) PySetState(state any) error {
	if t, ok := state.(*types.Tuple); ok && t.Len() == 2 {
		state = t.Get(0) // (dict, slot state): a dataclass with slots has no dict
		if state == nil {
			state = t.Get(1)
		}
	}
	if d, ok := state.(*types.Dict); ok {
		for _, e := range *d {
			if k, ok := e.Key.(string); ok {
				o.fields[k] = e.Value
			}
		}
	}
	return nil
}

// torchSize is torch.Size: called with a tuple, it is that tuple.
type torchSize struct{}

func (torchSize) Call(args ...any) (any, error) {
	if len(args) == 1 {
		if t, ok := args[0].(*types.Tuple); ok {
			return t, nil
		}
	}
	return types.NewTupleFromSlice(nil), nil
}

func findDCPClass(module, name string) (any, error) {
	if module == "torch.distributed.checkpoint" || strings.HasPrefix(module, "torch.distributed.checkpoint.") {
		return &dcpClass{name}, nil
	}
	if module == "torch" && name == "Size" {
		return torchSize{}, nil
	}
	if module == "pathlib" && strings.HasSuffix(name, "Path") { // StorageMeta.checkpoint_id
		return &pyGlobal{module, name}, nil
	}
	return findClass(module, name)
}
