package main

// Run history: log, best and report read a run directory as a sequence of
// steps.
//
// A run directory (RUN_DIR) holds one sub-directory per saved step. Its
// children that are directories (not symlinks to them) with a step number are
// its steps: the whole name if numeric ("500"), else the trailing number
// ("checkpoint-500", "step_10", "epoch3"). Children without a number (HF's
// "runs/" TensorBoard logs, "final") are not steps and are listed as skipped.
// Steps are ordered by number, then name.
//
// A step's files are every regular file below its directory (symlinks are not
// followed). In a mount their chunks and tensor index come from the
// manifests (no data is read); elsewhere the files are chunked as a commit
// would (fileview.go), so the numbers say what storing them would cost.
//
// In a mount, log, best and report ask the daemon (the control op "tree",
// runtree.go and runbatch.go) for the run's steps, up to 1,024 at a time
// (fewer for steps of many chunks), each batch one catalog read: every file's figures and each step's metrics files,
// with no FUSE request per file. Cost at 10⁴ tiny steps, this 2-core
// machine loaded: about 0.3 s of client CPU and 0.2 s of the daemon's for
// log (14-22 s, 1.5-2.3 ms a step, by the walk); du asks the daemon to
// find a directory's files in the catalog (GroupDirs). The walk through the
// mount below is the path for a daemon that does not know the op, and the
// reference the tree's answers are tested against (runbatch_test.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"syscall"

	"github.com/ckptfs/ckptfs/gc"
	"golang.org/x/sync/errgroup"
)

// stepDir is one step directory of a run.
type stepDir struct {
	Step int64
	Name string // the directory's name
	Path string // absolute
}

var trailingNumber = regexp.MustCompile(`[0-9]+$`)

// listSteps returns runDir's step directories in step order, and the names of
// the child directories that have no step number.
func listSteps(runDir string) (steps []stepDir, skipped []string, err error) {
	abs, err := filepath.Abs(runDir)
	if err != nil {
		return nil, nil, err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, nil, err
	}
	if !st.IsDir() {
		return nil, nil, fmt.Errorf("%s is not a directory", runDir)
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, nil, err
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	steps, skipped = classifySteps(abs, dirs)
	return steps, skipped, nil
}

// classifySteps sorts the child directories of run directory abs (names in
// name order) into steps, in step order, and the names without a step
// number.
func classifySteps(abs string, dirs []string) (steps []stepDir, skipped []string) {
	for _, name := range dirs {
		n, err := strconv.ParseInt(trailingNumber.FindString(name), 10, 64)
		if err != nil { // no trailing digits, or too many
			skipped = append(skipped, name)
			continue
		}
		steps = append(steps, stepDir{Step: n, Name: name, Path: filepath.Join(abs, name)})
	}
	sort.Slice(steps, func(i, j int) bool {
		if steps[i].Step != steps[j].Step {
			return steps[i].Step < steps[j].Step
		}
		return steps[i].Name < steps[j].Name
	})
	return steps, skipped
}

// stepRow is what log prints for one step.
type stepRow struct {
	Step           int64     `json:"step"`
	Name           string    `json:"name"`
	Path           string    `json:"path"`
	Files          int       `json:"files"`
	LogicalBytes   int64     `json:"logical_bytes"`   // sum of the files' sizes
	UniqueBytes    int64     `json:"unique_bytes"`    // bytes of the step's distinct chunks
	AddedBytes     int64     `json:"added_bytes"`     // bytes of distinct chunks new to the store: no earlier step of the run has them, nor (in a mount) a file outside the run committed before the step
	AddedChunks    int       `json:"added_chunks"`    // how many such chunks
	Tensors        int       `json:"tensors"`         // the step's tensors: one per name, one per file holding it where several files do (see "Tensor identity")
	TensorsChanged int       `json:"tensors_changed"` // tensors whose bytes differ from the previous step's, added or removed: diff's changed+added+removed (all, at the first step)
	PendingFiles   int       `json:"pending_files,omitempty"`
	Metrics        metricMap `json:"metrics"`

	// tensors maps each tensor's identity (tensorID, qualified as the
	// report's grid needs: see finishHistory) to its hash.
	tensors map[string]string
}

// runHistory is log's answer for one run.
type runHistory struct {
	RunDir       string    `json:"run_dir"`
	Steps        []stepRow `json:"steps"`
	LogicalBytes int64     `json:"logical_bytes"` // all steps
	UniqueBytes  int64     `json:"unique_bytes"`  // distinct chunks of all steps: the run's cost in a store of its own
	Skipped      []string  `json:"skipped,omitempty"`
	Warnings     []string  `json:"warnings,omitempty"`
}

// loadSteps is loadHistory for a command: it fails when runDir has no step
// directory and prints the history's warnings to stderr.
func loadSteps(ctx context.Context, cmd, runDir string, stderr io.Writer) (*runHistory, error) {
	h, err := loadHistory(ctx, runDir)
	if err != nil {
		return nil, err
	}
	if len(h.Steps) == 0 {
		return nil, errNoSteps(runDir, h.Skipped)
	}
	for _, w := range h.Warnings {
		fmt.Fprintf(stderr, "ckptfs %s: warning: %s\n", cmd, w)
	}
	return h, nil
}

// loadHistory reads every step of runDir: files, chunks, tensors, metrics.
// In a mount whose daemon answers the tree op, a few requests to it do
// (runbatch.go); elsewhere, step by step through the file system.
func loadHistory(ctx context.Context, runDir string) (*runHistory, error) {
	if rm, ok := openRunMount(ctx, runDir); ok {
		h, rows, ok, err := rm.loadHistory(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			return finishHistory(ctx, h, rows)
		}
	}
	return loadHistoryWalk(ctx, runDir)
}

// loadHistoryWalk is loadHistory step by step through the file system.
func loadHistoryWalk(ctx context.Context, runDir string) (*runHistory, error) {
	steps, skipped, err := listSteps(runDir)
	if err != nil {
		return nil, err
	}
	abs, _ := filepath.Abs(runDir) // listSteps succeeded with it
	h := &runHistory{RunDir: abs, Steps: []stepRow{}, Skipped: skipped}
	rows := make([]loadedStep, 0, len(steps))
	for _, sd := range steps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		row, warns, err := loadStep(ctx, sd)
		if err != nil {
			return nil, err
		}
		h.Warnings = append(h.Warnings, warns...)
		rows = append(rows, row)
	}
	return finishHistory(ctx, h, rows)
}

// finishHistory adds rows, the loaded steps in order, to h: what each step
// changed and added to the store.
func finishHistory(ctx context.Context, h *runHistory, rows []loadedStep) (*runHistory, error) {
	// In a mount, a chunk that a file outside the run committed before the
	// step is not new to the store either: a copy of another run adds
	// nothing. The daemon knows every file's chunks and commit time.
	earlier, err := earliestOutside(ctx, h.RunDir, rows)
	if err != nil {
		return nil, err
	}
	// The report draws one grid row per tensor across the run: a name that
	// several files hold at any step is FILE:NAME at every step.
	runShared := map[string]bool{}
	for _, row := range rows {
		maps.Copy(runShared, sharedNames(row.fileTensors))
	}
	seen := map[string]bool{} // chunks of earlier steps
	var prev []fileTensor
	for _, row := range rows {
		row.TensorsChanged = tensorsChanged(prev, row.fileTensors)
		prev = row.fileTensors
		row.tensors = tensorKeys(row.fileTensors, runShared)
		for id, n := range row.chunks {
			if seen[id] {
				continue
			}
			seen[id] = true
			if t, ok := earlier[id]; ok && t < row.since {
				continue
			}
			row.AddedBytes += int64(n)
			row.AddedChunks++
		}
		h.LogicalBytes += row.LogicalBytes
		h.UniqueBytes += row.AddedBytes
		h.Steps = append(h.Steps, row.stepRow)
	}
	return h, nil
}

// earliestOutside asks the daemon of the mount holding runDir, when it is in
// one, for the earliest commit time of each of the run's chunks among the
// files outside the run. Outside a mount it returns nil: a local directory is
// measured on its own.
func earliestOutside(ctx context.Context, runDir string, rows []loadedStep) (map[string]int64, error) {
	var inos []uint64
	chunks := map[string]bool{}
	for _, r := range rows {
		inos = append(inos, r.inos...)
		for id := range r.chunks {
			chunks[id] = true
		}
	}
	if len(inos) == 0 {
		return nil, nil
	}
	root, _, err := mountRootFor(runDir)
	if err != nil {
		return nil, nil // not in a mount after all
	}
	t, err := resolveTarget(root)
	if err != nil || t.socket == "" {
		return nil, err
	}
	req := controlRequest{Op: "earliest", Groups: [][]uint64{inos}, Chunks: sortedKeys(chunks)}
	var out map[string]int64
	if err := callDaemon(ctx, t.socket, req, func(gc.Progress) {}, &out); err != nil {
		return nil, fmt.Errorf("ask the daemon which chunks the store had: %w", err)
	}
	return out, nil
}

// loadedStep is a stepRow with the step's distinct chunks and tensors.
type loadedStep struct {
	stepRow
	chunks      map[string]uint32
	fileTensors []fileTensor
	// In a mount: the files' inode numbers, and the earliest ctime (commit
	// time) of the step's files.
	inos  []uint64
	since int64
}

// viewWorkers is how many files of a step are loaded at once: manifests in a
// mount are small reads; local files are chunked and hashed, which IndexFile
// spreads over the cores itself.
const viewWorkers = 4

func newLoadedStep(sd stepDir) loadedStep {
	return loadedStep{
		stepRow: stepRow{Step: sd.Step, Name: sd.Name, Path: sd.Path},
		chunks:  map[string]uint32{},
	}
}

func loadStep(ctx context.Context, sd stepDir) (loadedStep, []string, error) {
	row := newLoadedStep(sd)
	var warns []string
	m, mw, err := readStepMetrics(sd)
	if err != nil {
		return row, nil, err
	}
	row.Metrics = m
	warns = append(warns, mw...)

	var files []string
	err = filepath.WalkDir(sd.Path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return row, nil, err
	}
	views := make([]*fileView, len(files))
	roots := newMountRoots()
	sizes := make([]int64, len(files))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(viewWorkers)
	var mu sync.Mutex
	for i, p := range files {
		g.Go(func() error {
			v, size, err := loadStepFile(gctx, p, roots)
			if errors.Is(err, errNoManifest) {
				mu.Lock()
				warns = append(warns, fmt.Sprintf("%s: no committed content yet (being written?); counted without its chunks", p))
				mu.Unlock()
				err = nil
			}
			views[i], sizes[i] = v, size
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return row, nil, err
	}
	row.addFiles(sd, views, sizes)
	return row, warns, nil
}

// addFiles counts the step's files: views[i] (nil for a file with no
// committed content yet) of sizes[i] bytes.
func (row *loadedStep) addFiles(sd stepDir, views []*fileView, sizes []int64) {
	for i, v := range views {
		row.Files++
		row.LogicalBytes += sizes[i]
		if v == nil {
			row.PendingFiles++
			continue
		}
		if v.InMount {
			row.inos = append(row.inos, v.Ino)
			if row.since == 0 || v.Ctime < row.since {
				row.since = v.Ctime
			}
		}
		for _, c := range v.Chunks {
			if _, ok := row.chunks[c.ID]; !ok {
				row.chunks[c.ID] = c.Len
				row.UniqueBytes += int64(c.Len)
			}
		}
		if v.Index == nil {
			continue
		}
		rel, _ := filepath.Rel(sd.Path, v.Path) // v.Path is below sd.Path
		rel = filepath.ToSlash(rel)
		for _, t := range v.Index.Tensors {
			row.fileTensors = append(row.fileTensors, fileTensor{file: rel, name: t.Name, hash: t.Hash})
		}
	}
	row.Tensors = len(tensorKeys(row.fileTensors, sharedNames(row.fileTensors)))
}

// Tensor identity: how log (TENSORS, CHANGED), diff and report tell a
// step's tensors apart and pair them between steps.
//
// A tensor of a step is a name in one of its checkpoint files: the pair
// (file, name), the file's path relative to the step directory. It goes by
// its bare name when one file of the step holds that name: a lone checkpoint
// file, or the shards of a sharded one (a tensor that moves to another shard
// unchanged is the same tensor). When several files of the step hold the name
// (model.pt beside its model.safetensors export, a model and its EMA copy),
// each file's copy is a tensor of its own and every copy goes by FILE:NAME
// (model.pt:w1, model.safetensors:w1), so that no row is left bare beside
// its twin. Comparing two steps (diff A B; log's CHANGED, against the
// previous step), a name is qualified in both when either holds it in
// several files, so that each copy pairs with its own file's copy in the
// other step: dropping the model.pt export reads as model.pt:w1 removed,
// model.safetensors:w1 same. So for two steps A and B, log's TENSORS of B
// is diff's same+changed+added, of A same+changed+removed, and its CHANGED
// of B diff's changed+added+removed. The report draws one row per tensor
// over the whole run, so it qualifies a name at every step when any step
// holds it in several files.

// fileTensor is one tensor of a step: the file holding it (relative to the
// step directory, slash-separated), its name and its hash.
type fileTensor struct{ file, name, hash string }

// sharedNames returns the names that more than one file of ts holds (nil if
// none).
func sharedNames(ts []fileTensor) map[string]bool {
	var shared map[string]bool
	first := make(map[string]string, len(ts))
	for _, t := range ts {
		f, ok := first[t.name]
		switch {
		case !ok:
			first[t.name] = t.file
		case f != t.file:
			if shared == nil {
				shared = map[string]bool{}
			}
			shared[t.name] = true
		}
	}
	return shared
}

// tensorID is a tensor's identity: FILE:NAME when one of qualify has its
// name, else NAME.
func tensorID(file, name string, qualify ...map[string]bool) string {
	for _, q := range qualify {
		if q[name] {
			return file + ":" + name
		}
	}
	return name
}

// tensorKeys maps the identities of ts (tensorID with qualify) to their
// hashes.
func tensorKeys(ts []fileTensor, qualify ...map[string]bool) map[string]string {
	keys := make(map[string]string, len(ts))
	for _, t := range ts {
		// A name twice in one file (a pickle's): its first, as diff takes it.
		id := tensorID(t.file, t.name, qualify...)
		if _, dup := keys[id]; !dup {
			keys[id] = t.hash
		}
	}
	return keys
}

// tensorsChanged counts the tensors of cur whose hash differs from prev's,
// and those only one of them has, identified as diff of the two steps
// identifies them.
func tensorsChanged(prev, cur []fileTensor) int {
	sp, sc := sharedNames(prev), sharedNames(cur)
	a, b := tensorKeys(prev, sp, sc), tensorKeys(cur, sp, sc)
	n := 0
	for id, h := range b {
		if old, ok := a[id]; !ok || old != h {
			n++
		}
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			n++
		}
	}
	return n
}

var errNoManifest = errors.New("no committed content")

// loadStepFile loads one file's view; an empty file needs none. A file in a
// mount with no committed manifest yet gives errNoManifest and its size.
func loadStepFile(ctx context.Context, p string, roots *mountRoots) (*fileView, int64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", p, err)
	}
	ctime := st.Ctim.Nano()
	if st.Size == 0 {
		return &fileView{Path: p, Ctime: ctime}, 0, nil
	}
	if root, ok := roots.of(p, st.Dev); ok {
		_, err := os.Stat(filepath.Join(root, ".ckptfs", "manifests", strconv.FormatUint(st.Ino, 10)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, st.Size, errNoManifest
		}
	}
	v, err := loadFileViewIn(ctx, p, roots)
	if err != nil {
		return nil, 0, err
	}
	v.Ino, v.Ctime = st.Ino, ctime
	return v, v.Size, nil
}
