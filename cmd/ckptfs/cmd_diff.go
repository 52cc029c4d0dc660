package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/ckptfs/ckptfs/formats"
	"github.com/ckptfs/ckptfs/fusefs"
)

// tensorDiff is one tensor's fate from A to B.
type tensorDiff struct {
	// Name is the tensor's identity: its name, or FILE:NAME where several
	// files of a step directory hold the name (see "Tensor identity" in
	// runhistory.go).
	Name string `json:"name"`
	// File is the file holding it in a step directory B (in A when
	// removed), relative to the directory; empty for a lone file.
	File   string  `json:"file,omitempty"`
	Status string  `json:"status"` // same, changed, added, removed
	Bytes  int64   `json:"bytes"`  // the tensor's size in B (in A when removed)
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
}

type diffResult struct {
	A, B        string           `json:"-"`
	Tensors     []tensorDiff     `json:"tensors"`
	Counts      map[string]int   `json:"counts"`
	Bytes       map[string]int64 `json:"bytes"`
	AddedBytes  int64            `json:"added_bytes"` // bytes of B's chunks that A lacks: what storing B costs beside A
	AddedChunks int              `json:"added_chunks"`
	// Unit is what the entries are: "tensors", or for two tree models
	// (XGBoost, LightGBM) "trees", for two pickles "buffers" (issue #29).
	Unit         string `json:"unit"`
	SizeA, SizeB int64  `json:"-"`
}

func runDiff(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print JSON")
	pos, err := parseArgs(fl, args, 2)
	if err != nil {
		return err
	}
	namer := newDCPNamer()
	a, err := loadDiffView(ctx, pos[0], namer)
	if err != nil {
		return err
	}
	b, err := loadDiffView(ctx, pos[1], namer)
	if err != nil {
		return err
	}
	if namer.err != nil {
		fmt.Fprintf(stderr, "ckptfs diff: tensors of torch.distributed.checkpoint shards compared by their number in the shard: %v\n", namer.err)
	} else {
		nameTensors(a.Index.Tensors, a.dcpNames)
		nameTensors(b.Index.Tensors, b.dcpNames)
	}
	if err := checkComparable(a.fileView, b.fileView); err != nil {
		return err
	}
	res := diffSides(a, b)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tNAME\tDTYPE\tSHAPE\tBYTES")
	for _, t := range res.Tensors {
		if t.Status == "same" {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", t.Status, t.Name, t.DType, shapeString(t.Shape), t.Bytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range []string{"same", "changed", "added", "removed"} {
		fmt.Fprintf(stdout, "%-8s %5d %s  %s\n", s, res.Counts[s], res.Unit, formatBytes(res.Bytes[s]))
	}
	fmt.Fprintf(stdout, "B adds %s in %d chunks beyond A (B is %s)\n", formatBytes(res.AddedBytes), res.AddedChunks, formatBytes(b.Size))
	return nil
}

// isCheckpoint reports whether v has tensors (a checkpoint format ckptfs
// parses, or a directory holding at least one).
func isCheckpoint(v *fileView) bool { return v.Index != nil && len(v.Index.Tensors) > 0 }

// checkComparable refuses a diff that could not mean anything tensor by
// tensor: a checkpoint against a file that is not one, or two files neither
// of which is one (diff(1) or cmp(1) compare those).
func checkComparable(a, b *fileView) error {
	ca, cb := isCheckpoint(a), isCheckpoint(b)
	switch {
	case ca && cb:
		return nil
	case !ca && !cb:
		return fmt.Errorf("neither %s nor %s is a checkpoint (no tensors in a format ckptfs parses: safetensors, torch.save, torch.distributed.checkpoint shards, GGUF, npy, npz; no trees in an XGBoost, LightGBM or pickled model): compare them with cmp or diff", a.Path, b.Path)
	case !ca:
		return fmt.Errorf("%s is not a checkpoint (no tensors in a format ckptfs parses), so it cannot be compared with %s tensor by tensor", a.Path, b.Path)
	default:
		return fmt.Errorf("%s is not a checkpoint (no tensors in a format ckptfs parses), so it cannot be compared with %s tensor by tensor", b.Path, a.Path)
	}
}

// diffSide is one side of a diff: a file's view, or a step directory's as
// one view, with the file holding each of its tensors.
type diffSide struct {
	*fileView
	// files[i] is the path of the file holding Index.Tensors[i], relative
	// to the directory and slash-separated; nil for a lone file.
	files []string
	// dcpNames[i], when not "", is the state-dict key of Index.Tensors[i]
	// in a distcp file (see dcpNamer), which runDiff names it by when it
	// could name every distcp tensor of both sides.
	dcpNames []string
}

// file is the file holding the i'th tensor: for a lone file, its name.
func (s diffSide) file(i int) string {
	if s.files == nil {
		return filepath.Base(s.Path)
	}
	return s.files[i]
}

// fileTensors lists the side's tensors with their files.
func (s diffSide) fileTensors() []fileTensor {
	ts := make([]fileTensor, len(s.Index.Tensors))
	for i, t := range s.Index.Tensors {
		ts[i] = fileTensor{file: s.file(i), name: t.Name, hash: t.Hash}
	}
	return ts
}

// loadDiffView loads a file, or a directory (a step of a sharded checkpoint:
// model-00001-of-00004.safetensors and the like) as one view: the tensors of
// every checkpoint file in it, under their own names (diffSides names them
// as log does), the chunks of every file.
func loadDiffView(ctx context.Context, path string, namer *dcpNamer) (diffSide, error) {
	st, err := os.Stat(path)
	if err != nil {
		return diffSide{}, err
	}
	if !st.IsDir() {
		v, err := loadFileView(ctx, path)
		if err != nil {
			return diffSide{}, err
		}
		return diffSide{fileView: v, dcpNames: namer.names(v)}, nil
	}
	side := diffSide{fileView: &fileView{Path: path, Index: &fusefs.FileIndex{Format: "directory"}}, files: []string{}}
	v := side.fileView
	roots := newMountRoots() // a step of 1,000 ranks' files: one look-up
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".ckptfs" {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fv, err := loadFileViewIn(ctx, p, roots)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(path, p)
		v.Size += fv.Size
		v.Chunks = append(v.Chunks, fv.Chunks...)
		if fv.Index != nil {
			rel = filepath.ToSlash(rel)
			names := namer.names(fv)
			for i, t := range fv.Index.Tensors {
				v.Index.Tensors = append(v.Index.Tensors, t)
				side.files = append(side.files, rel)
				if names != nil {
					side.dcpNames = append(side.dcpNames, names[i])
				} else {
					side.dcpNames = append(side.dcpNames, "")
				}
			}
		}
		return nil
	})
	if err != nil {
		return diffSide{}, err
	}
	return side, nil
}

// diffViews pairs A's and B's tensors by name, whatever the files' formats:
// a torch.save and its safetensors export compare tensor by tensor (issue
// #26), as ckptfs names torch tensors by their key path joined with ".". A
// tensor is "same" when its hashes match, and they match across formats:
// formats cuts a tensor's bytes by one rule in every container and fusefs
// hashes tensors under 4 KiB by their bytes (see fusefs.TensorEntry). A
// torch tensor that views part of a larger storage is named by the storage,
// so it reads as "changed" against the same bytes stored on their own.
func diffViews(a, b *fileView) diffResult {
	return diffSides(diffSide{fileView: a}, diffSide{fileView: b})
}

// diffSides is diffViews of two sides, files or step directories. Tensors
// are named and paired by their identity, as log pairs them (see "Tensor
// identity" in runhistory.go): by name, or by FILE:NAME where A or B holds
// the name in several files. The names of the entries are these identities.
func diffSides(a, b diffSide) diffResult {
	res := diffResult{Counts: map[string]int{}, Bytes: map[string]int64{}, Tensors: []tensorDiff{}, Unit: "tensors"}
	if formats.IsPartFormat(a.Index.Format) && a.Index.Format == b.Index.Format {
		res.Unit = partUnit(b.Index.Tensors)
	}
	ta, tb := a.fileTensors(), b.fileTensors()
	sa, sb := sharedNames(ta), sharedNames(tb)
	entries := func(s diffSide, ts []fileTensor) []tensorDiff {
		out := make([]tensorDiff, len(ts))
		for i, t := range s.Index.Tensors {
			out[i] = tensorDiff{Name: tensorID(ts[i].file, t.Name, sa, sb), Bytes: t.Length, DType: t.DType, Shape: t.Shape}
			if s.files != nil {
				out[i].File = ts[i].file
			}
		}
		return out
	}
	ea, eb := entries(a, ta), entries(b, tb)
	if res.Unit == "buffers" {
		// A pickle's buffers are numbered in file order, so one added in
		// the middle renumbers those after it: pair them by their bytes.
		return diffByHash(a.fileView, b.fileView, ea, eb, res)
	}
	inA := tensorKeys(ta, sa, sb) // identity -> hash, as log keys them
	inB := map[string]bool{}
	for i, t := range b.Index.Tensors {
		d := eb[i]
		if inB[d.Name] { // a name twice in one file: once, as log counts it
			continue
		}
		inB[d.Name] = true
		old, ok := inA[d.Name]
		switch {
		case !ok:
			d.Status = "added"
		case old == t.Hash:
			d.Status = "same"
		default:
			d.Status = "changed"
		}
		res.Tensors = append(res.Tensors, d)
	}
	for i := range a.Index.Tensors {
		if d := ea[i]; !inB[d.Name] {
			inB[d.Name] = true
			d.Status = "removed"
			res.Tensors = append(res.Tensors, d)
		}
	}
	return finishDiff(a.fileView, b.fileView, res)
}

// diffByHash classifies B's entries (eb, of b's tensors) as same (A has the
// same bytes, under any name) or added, and A's entries (ea) whose bytes B
// lacks as removed.
func diffByHash(a, b *fileView, ea, eb []tensorDiff, res diffResult) diffResult {
	inA, inB := map[string]bool{}, map[string]bool{}
	for _, t := range a.Index.Tensors {
		inA[t.Hash] = true
	}
	for i, t := range b.Index.Tensors {
		inB[t.Hash] = true
		d := eb[i]
		d.Status = "added"
		if inA[t.Hash] {
			d.Status = "same"
		}
		res.Tensors = append(res.Tensors, d)
	}
	for i, t := range a.Index.Tensors {
		if !inB[t.Hash] {
			d := ea[i]
			d.Status = "removed"
			res.Tensors = append(res.Tensors, d)
		}
	}
	return finishDiff(a, b, res)
}

// finishDiff sorts the entries, counts them and adds up B's new chunks.
func finishDiff(a, b *fileView, res diffResult) diffResult {
	sort.SliceStable(res.Tensors, func(i, j int) bool { return res.Tensors[i].Name < res.Tensors[j].Name })
	for _, t := range res.Tensors {
		res.Counts[t.Status]++
		res.Bytes[t.Status] += t.Bytes
	}
	have := map[string]bool{}
	for _, c := range a.Chunks {
		have[c.ID] = true
	}
	for _, c := range b.Chunks {
		if !have[c.ID] {
			have[c.ID] = true
			res.AddedBytes += int64(c.Len)
			res.AddedChunks++
		}
	}
	return res
}
