package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/formats"
	"github.com/ckptfs/ckptfs/fusefs"
)

// maxDCPMetadata bounds the .metadata file tensors and diff read to name a
// distcp file's tensors (a model of 10⁵ tensors over 1,000 ranks writes a
// few tens of MB).
const maxDCPMetadata = 256 << 20

// dcpNamer names the tensors of torch.distributed.checkpoint shards by the
// state-dict keys their checkpoint's .metadata gives them. A distcp index
// numbers them in the shard's order ("0", "1", ...: formats names them so
// because a shard is committed before .metadata is written); tensors and
// diff show the keys instead, read when they run. Only files named
// *.distcp are named so: torch.save called twice into one .pt file makes a
// distcp file too, with no .metadata to look for. It keeps each directory's
// .metadata, read once, and the first error: a caller that names several
// files names all of them or none, so that a diff never pairs keys with
// numbers.
type dcpNamer struct {
	dirs map[string]dcpDir
	err  error
}

type dcpDir struct {
	items []formats.DCPItem
	err   error
}

func newDCPNamer() *dcpNamer { return &dcpNamer{dirs: map[string]dcpDir{}} }

// names returns the keys of v's tensors, in the order of v.Index.Tensors,
// when v is a distcp file (nil otherwise). Without a .metadata beside it,
// or with one that does not describe its archives, it returns nil and
// keeps the error in d.err.
func (d *dcpNamer) names(v *fileView) []string {
	if v.Index == nil || !strings.HasSuffix(v.Path, ".distcp") {
		return nil
	}
	// A shard of one item is one torch.save archive: format torch, its
	// tensor named "" (or by its path in what was saved).
	var inItem func(name string) string
	switch v.Index.Format {
	case "distcp": // "k", or "k.<path>" for one of several tensors of item k
		inItem = func(name string) string { _, rest, _ := strings.Cut(name, "."); return rest }
	case "torch":
		inItem = func(name string) string { return name }
	default:
		return nil
	}
	dir := filepath.Dir(v.Path)
	md, ok := d.dirs[dir]
	if !ok {
		md.items, md.err = readDCPMetadata(filepath.Join(dir, ".metadata"))
		d.dirs[dir] = md
	}
	if md.err != nil {
		d.fail(md.err)
		return nil
	}
	// The items are sorted by file and offset: the one holding a tensor is
	// the last of its file that starts at or before it.
	base := filepath.Base(v.Path)
	lo, _ := slices.BinarySearchFunc(md.items, base, func(it formats.DCPItem, f string) int { return strings.Compare(it.File, f) })
	hi, _ := slices.BinarySearchFunc(md.items, base+"\x00", func(it formats.DCPItem, f string) int { return strings.Compare(it.File, f) })
	items := md.items[lo:hi]
	names := make([]string, len(v.Index.Tensors))
	for i, t := range v.Index.Tensors {
		j, _ := slices.BinarySearchFunc(items, t.Offset+1, func(it formats.DCPItem, off int64) int { return cmp.Compare(it.Offset, off) })
		if j > 0 {
			if it := items[j-1]; t.Offset+t.Length <= it.Offset+it.Length {
				// An item saved as several tensors (DCP saves a tuple of
				// tensors as one item) keeps each one's path in it.
				names[i] = dcpTensorName(it)
				if p := inItem(t.Name); p != "" {
					names[i] += "." + p
				}
			}
		}
		if names[i] == "" {
			d.fail(fmt.Errorf("%s: its .metadata names no item holding tensor %s at offset %d (the .metadata of another save?)", v.Path, t.Name, t.Offset))
			return nil
		}
	}
	return names
}

func (d *dcpNamer) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// nameTensors renames ts by names (nil: keep them).
func nameTensors(ts []fusefs.TensorEntry, names []string) {
	for i, n := range names {
		if n != "" {
			ts[i].Name = n
		}
	}
}

// dcpTensorName is an item's key, with a shard's offset in the whole
// tensor when it is not the first shard: "layers.0.weight@512,0".
func dcpTensorName(it formats.DCPItem) string {
	for _, o := range it.ShardOffset {
		if o != 0 {
			s := make([]string, len(it.ShardOffset))
			for i, o := range it.ShardOffset {
				s[i] = strconv.FormatInt(o, 10)
			}
			return it.FQN + "@" + strings.Join(s, ",")
		}
	}
	return it.FQN
}

func readDCPMetadata(path string) ([]formats.DCPItem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDCPMetadata+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxDCPMetadata {
		return nil, fmt.Errorf("%s: over the %d bytes read to name tensors", path, maxDCPMetadata)
	}
	items, err := formats.ParseDCPMetadata(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return items, nil
}
