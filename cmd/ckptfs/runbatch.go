package main

// log, best and report of a run in a mount ask its daemon for the run's
// steps with the control op "tree" (runtree.go), a batch of steps at a
// time, instead of walking the mount: the answers carry each file's inode,
// size, ctime, chunks and tensors and the content of each step's metrics
// files, so that a step costs no FUSE request at all. The rows are the ones
// the walk makes (loadStep): a file's figures are its committed manifest's,
// a file with no committed content yet is counted as pending, an empty file
// as empty. A metrics file the answer has no content for (a symlink, one
// being written, one over maxTreeContent) is read through the mount, as the
// walk reads it. A daemon older than the op answers "unknown operation":
// then, and outside a mount, the commands walk.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ckptfs/ckptfs/fusefs"
	"github.com/ckptfs/ckptfs/gc"
)

// A tree request asks for a batch of step directories, sized so that its
// answer holds about treeItems files, chunks and tensors (a few MB of
// JSON): the first asks for treeFirst steps, each next one for as many as
// the last answer's items per step fit, between treeMin and treeMax. Tiny
// steps go 1,024 at a time; steps of 10⁴ chunks each, one by one, so that
// neither the daemon nor the client holds more than one bounded answer.
const (
	treeItems = 1 << 17
	treeFirst = 16
	treeMin   = 1
	treeMax   = 1024
)

// nextTreeBatch sizes the batch after an answer of items for steps steps.
func nextTreeBatch(items, steps int) int {
	perStep := max(1, (items+steps-1)/steps)
	return max(treeMin, min(treeMax, treeItems/perStep))
}

// mountedRun is a run directory in a mount.
type mountedRun struct {
	abs    string // the run directory
	ino    uint64 // its inode number, the catalog's
	socket string // the daemon's control socket
}

// openRunMount returns the mount holding runDir, when it is a directory in
// one with a live daemon.
func openRunMount(ctx context.Context, runDir string) (*mountedRun, bool) {
	abs, err := filepath.Abs(runDir)
	if err != nil {
		return nil, false
	}
	var st syscall.Stat_t
	if syscall.Stat(abs, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, false // the walk says why
	}
	root, dev, err := mountRootFor(abs)
	if err != nil || dev != st.Dev {
		return nil, false
	}
	t, err := resolveTarget(root)
	if err != nil || t.socket == "" {
		return nil, false
	}
	return &mountedRun{abs: abs, ino: catalogIno(abs, root, st.Ino), socket: t.socket}, true
}

// tree asks the daemon; ok is false when it does not know the op.
func (rm *mountedRun) tree(ctx context.Context, req controlRequest) (treeResult, bool, error) {
	req.Op = "tree"
	var res treeResult
	err := callDaemon(ctx, rm.socket, req, func(gc.Progress) {}, &res)
	if err != nil && strings.Contains(err.Error(), `unknown operation "tree"`) {
		return res, false, nil
	}
	if err != nil {
		return res, false, fmt.Errorf("ask the daemon for %s: %w", rm.abs, err)
	}
	if len(res.Dirs) != len(req.Dirs) {
		return res, false, fmt.Errorf("ask the daemon for %s: %d directories answered for %d", rm.abs, len(res.Dirs), len(req.Dirs))
	}
	return res, true, nil
}

// steps lists the run's steps and the names of its other directories; ok is
// false when the daemon cannot say (an older daemon, or the directory
// gone from the catalog since the stat).
func (rm *mountedRun) steps(ctx context.Context) (steps []stepDir, inos []uint64, skipped []string, ok bool, err error) {
	res, ok, err := rm.tree(ctx, controlRequest{Dirs: []uint64{rm.ino}, Depth: 1})
	if err != nil || !ok || !res.Dirs[0].Found {
		return nil, nil, nil, false, err
	}
	var dirs []string
	ino := map[string]uint64{}
	for _, e := range res.Dirs[0].Entries {
		if e.Type == "dir" {
			dirs = append(dirs, e.Path)
			ino[e.Path] = e.Ino
		}
	}
	steps, skipped = classifySteps(rm.abs, dirs)
	for _, sd := range steps {
		inos = append(inos, ino[sd.Name])
	}
	return steps, inos, skipped, true, nil
}

// forEachStep asks for the steps a batch at a time and calls fn with each
// step's answer, in order: every file with its chunks when withChunks, else
// only the step's own files. ok is false as for steps.
func (rm *mountedRun) forEachStep(ctx context.Context, steps []stepDir, inos []uint64, withChunks bool, fn func(sd stepDir, d treeDir) error) (bool, error) {
	req := controlRequest{WantChunks: withChunks, Content: []string{trainerStateFile, metricsFile}}
	if !withChunks {
		req.Depth = 1
	}
	batch := treeFirst
	for lo := 0; lo < len(steps); lo += len(req.Dirs) {
		req.Dirs = inos[lo:min(lo+batch, len(steps))]
		res, ok, err := rm.tree(ctx, req)
		if err == nil && !ok && lo > 0 { // fn had steps: no walk after it
			err = fmt.Errorf("ask the daemon for %s: it no longer answers tree requests", rm.abs)
		}
		if err != nil || !ok {
			return false, err
		}
		items := 0
		for i, d := range res.Dirs {
			if !d.Found { // removed since the listing: as the walk would fail
				return false, fmt.Errorf("%s: %w", steps[lo+i].Path, fs.ErrNotExist)
			}
			for _, e := range d.Entries {
				items += 1 + len(e.Chunks) + len(e.Tensors)
			}
			if err := fn(steps[lo+i], d); err != nil {
				return false, err
			}
		}
		batch = nextTreeBatch(items, len(res.Dirs))
	}
	return true, nil
}

// loadHistory is loadHistory through the daemon: the history without the
// store-wide figures (finishHistory), and the loaded steps.
func (rm *mountedRun) loadHistory(ctx context.Context) (*runHistory, []loadedStep, bool, error) {
	steps, inos, skipped, ok, err := rm.steps(ctx)
	if err != nil || !ok {
		return nil, nil, false, err
	}
	h := &runHistory{RunDir: rm.abs, Steps: []stepRow{}, Skipped: skipped}
	rows := make([]loadedStep, 0, len(steps))
	ok, err = rm.forEachStep(ctx, steps, inos, true, func(sd stepDir, d treeDir) error {
		row, warns, err := stepFromTree(sd, d)
		if err != nil {
			return err
		}
		h.Warnings = append(h.Warnings, warns...)
		rows = append(rows, row)
		return nil
	})
	if err != nil || !ok {
		return nil, nil, false, err
	}
	return h, rows, true, nil
}

// stepMetricsFromTree is readStepMetrics from a step's answer.
func stepMetricsFromTree(sd stepDir, d treeDir) (map[string]float64, []string, error) {
	return stepMetricsFrom(sd, func(name string) ([]byte, error) {
		p := filepath.Join(sd.Path, name)
		for _, e := range d.Entries {
			if e.Path != name {
				continue
			}
			if e.Type == "file" && e.Content != nil {
				return e.Content.Data, nil
			}
			return os.ReadFile(p) // as the walk reads it
		}
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	})
}

// stepFromTree is loadStep from a step's answer.
func stepFromTree(sd stepDir, d treeDir) (loadedStep, []string, error) {
	row := newLoadedStep(sd)
	m, warns, err := stepMetricsFromTree(sd, d)
	if err != nil {
		return row, nil, err
	}
	row.Metrics = m
	var views []*fileView
	var sizes []int64
	for _, e := range d.Entries {
		if e.Type != "file" {
			continue
		}
		p := filepath.Join(sd.Path, filepath.FromSlash(e.Path))
		switch {
		case e.Size == 0:
			views, sizes = append(views, &fileView{Path: p, Ctime: e.Ctime}), append(sizes, 0)
		case e.Pending:
			warns = append(warns, fmt.Sprintf("%s: no committed content yet (being written?); counted without its chunks", p))
			views, sizes = append(views, nil), append(sizes, e.Size)
		default:
			v := &fileView{Path: p, Size: e.Size, InMount: true, Ino: e.Ino, Ctime: e.Ctime, Chunks: make([]fusefs.ChunkJSON, len(e.Chunks))}
			for i, c := range e.Chunks {
				v.Chunks[i] = fusefs.ChunkJSON{ID: c.ID, Len: c.Len}
			}
			if len(e.Tensors) > 0 {
				v.Index = &fusefs.FileIndex{Tensors: make([]fusefs.TensorEntry, len(e.Tensors))}
				for i, t := range e.Tensors {
					v.Index.Tensors[i] = fusefs.TensorEntry{Name: t[0], Hash: t[1]}
				}
			}
			views, sizes = append(views, v), append(sizes, e.Size)
		}
	}
	row.addFiles(sd, views, sizes)
	return row, warns, nil
}
