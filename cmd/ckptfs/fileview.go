package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
	"github.com/ckptfs/ckptfs/fusefs"
)

// fileView is what tensors and diff know of a file: its chunks and tensor
// index, from its manifest in a mount (no data read) or by chunking a local
// file exactly as a commit would.
type fileView struct {
	Path    string
	Size    int64
	InMount bool
	Chunks  []fusefs.ChunkJSON
	Index   *fusefs.FileIndex
	// Ino and Ctime are the file's inode number and change time (in a
	// mount: its last commit), when the caller stat'ed it.
	Ino   uint64
	Ctime int64
}

func loadFileView(ctx context.Context, path string) (*fileView, error) {
	return loadFileViewIn(ctx, path, nil)
}

// loadFileViewIn is loadFileView with the mount roots of a walk over many
// files (nil: none).
func loadFileViewIn(ctx context.Context, path string, roots *mountRoots) (*fileView, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if root, ok := roots.of(path, st.Dev); ok {
		data, err := os.ReadFile(filepath.Join(root, ".ckptfs", "manifests", strconv.FormatUint(st.Ino, 10)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s has no committed content in the store (still being written, or a .ckptfs file)", path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: reading its manifest: %w", path, err)
		}
		var m fusefs.ManifestJSON
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("%s: bad manifest: %w", path, err)
		}
		return &fileView{Path: path, Size: m.Size, InMount: true, Chunks: m.Chunks, Index: m.Index}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	refs, ix, err := fusefs.IndexFile(ctx, f, st.Size, cas.DefaultChunkSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	v := &fileView{Path: path, Size: st.Size, Index: ix, Chunks: make([]fusefs.ChunkJSON, len(refs))}
	for i, r := range refs {
		v.Chunks[i] = fusefs.ChunkJSON{ID: r.ID.String(), Len: r.Len}
	}
	return v, nil
}

// mountRootOf finds the root of the ckptfs mount holding path (on device dev):
// the nearest ancestor with .ckptfs/stats.json on the same device.
func mountRootOf(path string, dev uint64) (string, bool) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", false
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(dir, ".ckptfs", "stats.json"), &st) == nil {
			var ds syscall.Stat_t
			if syscall.Stat(dir, &ds) == nil && ds.Dev == dev {
				return dir, true
			}
		}
		if dir == "/" {
			return "", false
		}
	}
}

// mountRoots remembers mountRootOf's answers by directory and device, for a
// walk over many files: the answer depends on nothing else, and each costs
// a stat of every ancestor's .ckptfs/stats.json (whose size the daemon
// computes for every stat). A nil *mountRoots asks every time. Safe for
// concurrent use.
type mountRoots struct {
	mu   sync.Mutex
	seen map[mountRootKey]mountRootAnswer
}

type mountRootKey struct {
	dir string
	dev uint64
}

type mountRootAnswer struct {
	root string
	ok   bool
}

func newMountRoots() *mountRoots {
	return &mountRoots{seen: map[mountRootKey]mountRootAnswer{}}
}

// of is mountRootOf(path, dev), remembered.
func (m *mountRoots) of(path string, dev uint64) (string, bool) {
	if m == nil {
		return mountRootOf(path, dev)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", false
	}
	k := mountRootKey{filepath.Dir(abs), dev}
	m.mu.Lock()
	a, ok := m.seen[k]
	m.mu.Unlock()
	if ok {
		return a.root, a.ok
	}
	a.root, a.ok = mountRootOf(abs, dev)
	m.mu.Lock()
	m.seen[k] = a
	m.mu.Unlock()
	return a.root, a.ok
}

// whyNotParsed says why a file has no tensor index: formats.Parse's reason
// for a file that starts like a checkpoint but is not a valid one ("global
// os.system is not allowed", "header length ... exceeds ..."), else that its
// format is not one ckptfs parses. It reads the file (through the mount, for
// one in a mount): only the parts a parser looks at.
func whyNotParsed(path string) error {
	unknown := errors.New("not a checkpoint format ckptfs parses (safetensors, torch, torch.distributed.checkpoint shards, GGUF, npy, npz; XGBoost JSON/UBJ, LightGBM text and pickled models)")
	f, err := os.Open(path)
	if err != nil {
		return unknown
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return unknown
	}
	ix, err := formats.Parse(f, st.Size())
	switch {
	case err != nil:
		return fmt.Errorf("not a valid checkpoint: %w", err)
	case ix.Format == "":
		return unknown
	default:
		return fmt.Errorf("a %s file without a tensor index: ckptfs could not follow its layout as it was written (a compressed zip member?), or an older ckptfs that did not parse %s files committed it (a copy indexes it: cp it, then mv the copy over it)", ix.Format, ix.Format)
	}
}
