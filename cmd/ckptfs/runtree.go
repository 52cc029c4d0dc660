package main

// The control op "tree" answers log, best, report and du for a whole run in
// a few requests instead of several FUSE round trips per file (a stat walk
// up to the mount root, a look-up and a read of .ckptfs/manifests/<ino>, and
// the reads of the metrics files: 3.2 ms a step at 10⁴ steps). The daemon
// reads the directories, nodes and manifests of the asked subtrees in one
// catalog read transaction, adds the files created and not committed yet
// (fusefs.UncommittedFiles: what READDIR adds from the tree), and then, with
// the transaction closed (a read of a chunk must not wait inside one),
// reads the small files the client names (a step's metrics.json and
// trainer_state.json), verified as any read.
//
// What the answer says of a file is what the catalog says: its committed
// size and chunks and its last commit's ctime. Through the mount, a file
// being rewritten stats with its new size; log counts a committed file by
// its manifest either way, so the figures agree. A daemon that does not know
// the op answers "unknown operation" and the client walks the mount as it
// did before (runbatch.go).

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
)

// maxTreeContent bounds a file whose content a tree request returns; a
// larger one (a long run's trainer_state.json) is read through the mount.
const maxTreeContent = 4 << 20

// treeEntry is one entry below a tree request's directory.
type treeEntry struct {
	Path    string `json:"path"` // relative to the directory, slash-separated
	Ino     uint64 `json:"ino"`
	Type    string `json:"type"` // "dir", "file", "symlink" or "other"
	Size    int64  `json:"size,omitempty"`
	Ctime   int64  `json:"ctime,omitempty"`
	Pending bool   `json:"pending,omitempty"` // a file with no committed content yet
	// With Chunks: a committed file's chunks (hex ID, length) and tensors
	// (name, content hash).
	Chunks  []treeChunk  `json:"chunks,omitempty"`
	Tensors [][2]string  `json:"tensors,omitempty"`
	Content *treeContent `json:"content,omitempty"`
}

type treeChunk struct {
	ID  string `json:"id"`
	Len uint32 `json:"len"`
}

// treeContent is a file's bytes, when asked for and committed and at most
// maxTreeContent.
type treeContent struct {
	Data []byte `json:"data"`
}

// treeDir is the answer for one directory of the request.
type treeDir struct {
	Ino     uint64      `json:"ino"`
	Found   bool        `json:"found"` // a directory in the catalog
	Entries []treeEntry `json:"entries"`
}

type treeResult struct {
	Dirs []treeDir `json:"dirs"`
}

// treeWalk is one request's walk.
type treeWalk struct {
	tx      *cas.Tx
	req     controlRequest
	pending map[uint64][]fusefs.UncommittedFile // directory → its uncommitted files
	content map[string]bool
	reads   []treeRead
}

// treeRead is a content to read once the transaction is closed.
type treeRead struct {
	dir, entry int
	m          *cas.Manifest
}

// answerTree answers the control op "tree": for each of req.Dirs, its
// entries down to req.Depth levels (0: all), with chunks and tensors when
// req.WantChunks, and the content of the first-level files named in
// req.Content.
func answerTree(ctx context.Context, store *cas.Store, uncommitted []fusefs.UncommittedFile, req controlRequest) (treeResult, error) {
	w := &treeWalk{req: req, pending: map[uint64][]fusefs.UncommittedFile{}, content: map[string]bool{}}
	for _, u := range uncommitted {
		w.pending[u.Dir] = append(w.pending[u.Dir], u)
	}
	for _, n := range req.Content {
		w.content[n] = true
	}
	res := treeResult{Dirs: make([]treeDir, len(req.Dirs))}
	err := store.View(func(tx *cas.Tx) error {
		w.tx = tx
		for i, ino := range req.Dirs {
			if err := ctx.Err(); err != nil {
				return err
			}
			res.Dirs[i].Ino = ino
			n, ok, err := tx.Node(ino)
			if err != nil {
				return err
			}
			if !ok || !n.IsDir() {
				continue
			}
			res.Dirs[i].Found = true
			res.Dirs[i].Entries = []treeEntry{}
			if err := w.walk(&res.Dirs[i], i, ino, "", 1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return treeResult{}, err
	}
	for _, r := range w.reads {
		data, err := readManifest(ctx, store, r.m)
		if err != nil {
			e := &res.Dirs[r.dir].Entries[r.entry]
			return treeResult{}, fmt.Errorf("read %s (inode %d): %w", e.Path, e.Ino, err)
		}
		res.Dirs[r.dir].Entries[r.entry].Content = &treeContent{Data: data}
	}
	return res, nil
}

// walk appends dir's entries (prefix is its path) to out, in the order
// filepath.WalkDir visits them: by name, each directory's entries right
// after it.
func (w *treeWalk) walk(out *treeDir, di int, dir uint64, prefix string, depth int) error {
	type child struct {
		name string
		ino  uint64
		u    *fusefs.UncommittedFile
	}
	var kids []child
	byName := map[string]int{}
	err := w.tx.Children(dir, func(name string, ino uint64) error {
		byName[name] = len(kids)
		kids = append(kids, child{name: name, ino: ino})
		return nil
	})
	if err != nil {
		return err
	}
	// An uncommitted file takes its name's place (it replaces the committed
	// file at its first commit), as READDIR lists it.
	for i, u := range w.pending[dir] {
		if k, ok := byName[u.Name]; ok {
			if kids[k].ino != u.Ino {
				kids[k] = child{name: u.Name, ino: u.Ino, u: &w.pending[dir][i]}
			}
			continue
		}
		kids = append(kids, child{name: u.Name, ino: u.Ino, u: &w.pending[dir][i]})
	}
	slices.SortFunc(kids, func(a, b child) int { return strings.Compare(a.name, b.name) })
	for _, k := range kids {
		e := treeEntry{Path: path.Join(prefix, k.name), Ino: k.ino}
		if k.u != nil {
			e.Type, e.Size, e.Ctime, e.Pending = "file", k.u.Size, k.u.Ctime, true
			out.Entries = append(out.Entries, e)
			continue
		}
		n, ok, err := w.tx.Node(k.ino)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("directory %d entry %q names missing node %d", dir, k.name, k.ino)
		}
		e.Ctime = n.Ctime
		switch n.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			e.Type = "dir"
		case syscall.S_IFREG:
			e.Type, e.Size = "file", n.Size
		case syscall.S_IFLNK:
			e.Type = "symlink"
		default:
			e.Type = "other"
		}
		if e.Type == "file" {
			if err := w.file(out, di, &e, depth); err != nil {
				return err
			}
		}
		out.Entries = append(out.Entries, e)
		if e.Type == "dir" && (w.req.Depth == 0 || depth < w.req.Depth) {
			if err := w.walk(out, di, k.ino, e.Path, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// file fills in a regular file's manifest figures, and queues its content
// when asked for.
func (w *treeWalk) file(out *treeDir, di int, e *treeEntry, depth int) error {
	wantContent := depth == 1 && w.content[e.Path]
	if !w.req.WantChunks && !wantContent {
		return nil
	}
	m, ok, err := w.tx.Manifest(e.Ino)
	if err != nil {
		return err
	}
	if !ok {
		e.Pending = e.Size > 0
		return nil
	}
	e.Size = m.Size()
	if w.req.WantChunks {
		e.Chunks = make([]treeChunk, len(m.Chunks))
		for i, c := range m.Chunks {
			e.Chunks[i] = treeChunk{ID: c.ID.String(), Len: c.Len}
		}
		ix, err := fusefs.ParseFileIndex(m.Extra)
		if err != nil {
			return fmt.Errorf("%s (inode %d): tensor index: %w", e.Path, e.Ino, err)
		}
		if ix != nil {
			for _, t := range ix.Tensors {
				e.Tensors = append(e.Tensors, [2]string{t.Name, t.Hash})
			}
		}
	}
	if wantContent && e.Size <= maxTreeContent {
		w.reads = append(w.reads, treeRead{dir: di, entry: len(out.Entries), m: m})
	}
	return nil
}

// readManifest returns the bytes m describes, each chunk verified.
func readManifest(ctx context.Context, store *cas.Store, m *cas.Manifest) ([]byte, error) {
	out := make([]byte, 0, m.Size())
	hi := 0
	holes := func(i int) {
		for hi < len(m.Holes) && m.Holes[hi].Before == i {
			out = append(out, make([]byte, m.Holes[hi].Len)...)
			hi++
		}
	}
	for i, c := range m.Chunks {
		holes(i)
		data, err := store.ReadChunk(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, data...)
	}
	holes(len(m.Chunks))
	return out, nil
}
