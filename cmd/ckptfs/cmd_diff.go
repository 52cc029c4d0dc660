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
	Name   string  `json:"name"`
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
	a, err := loadDiffView(ctx, pos[0])
	if err != nil {
		return err
	}
	b, err := loadDiffView(ctx, pos[1])
	if err != nil {
		return err
	}
	if err := checkComparable(a, b); err != nil {
		return err
	}
	res := diffViews(a, b)
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
		return fmt.Errorf("neither %s nor %s is a checkpoint (no tensors in a format ckptfs parses: safetensors, torch.save, GGUF, npy, npz; no trees in an XGBoost, LightGBM or pickled model): compare them with cmp or diff", a.Path, b.Path)
	case !ca:
		return fmt.Errorf("%s is not a checkpoint (no tensors in a format ckptfs parses), so it cannot be compared with %s tensor by tensor", a.Path, b.Path)
	default:
		return fmt.Errorf("%s is not a checkpoint (no tensors in a format ckptfs parses), so it cannot be compared with %s tensor by tensor", b.Path, a.Path)
	}
}

// loadDiffView loads a file, or a directory (a step of a sharded checkpoint:
// model-00001-of-00004.safetensors and the like) as one view: the tensors of
// every checkpoint file in it, the chunks of every file.
func loadDiffView(ctx context.Context, path string) (*fileView, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return loadFileView(ctx, path)
	}
	v := &fileView{Path: path, Index: &fusefs.FileIndex{Format: "directory"}}
	seen := map[string]bool{}
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
			for _, t := range fv.Index.Tensors {
				if seen[t.Name] { // two files of the step name one tensor: tell them apart
					t.Name = rel + ":" + t.Name
				}
				seen[t.Name] = true
				v.Index.Tensors = append(v.Index.Tensors, t)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
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
	res := diffResult{Counts: map[string]int{}, Bytes: map[string]int64{}, Tensors: []tensorDiff{}, Unit: "tensors"}
	if formats.IsPartFormat(a.Index.Format) && a.Index.Format == b.Index.Format {
		res.Unit = partUnit(b.Index.Tensors)
	}
	inA := map[string]fusefs.TensorEntry{}
	for _, t := range a.Index.Tensors {
		inA[t.Name] = t
	}
	if res.Unit == "buffers" {
		// A pickle's buffers are numbered in file order, so one added in
		// the middle renumbers those after it: pair them by their bytes.
		return diffByHash(a, b, res)
	}
	inB := map[string]bool{}
	for _, t := range b.Index.Tensors {
		inB[t.Name] = true
		d := tensorDiff{Name: t.Name, Bytes: t.Length, DType: t.DType, Shape: t.Shape}
		old, ok := inA[t.Name]
		switch {
		case !ok:
			d.Status = "added"
		case old.Hash == t.Hash:
			d.Status = "same"
		default:
			d.Status = "changed"
		}
		res.Tensors = append(res.Tensors, d)
	}
	for _, t := range a.Index.Tensors {
		if !inB[t.Name] {
			res.Tensors = append(res.Tensors, tensorDiff{Name: t.Name, Status: "removed", Bytes: t.Length, DType: t.DType, Shape: t.Shape})
		}
	}
	return finishDiff(a, b, res)
}

// diffByHash classifies B's entries as same (A has the same bytes, under
// any name) or added, and A's entries whose bytes B lacks as removed.
func diffByHash(a, b *fileView, res diffResult) diffResult {
	inA, inB := map[string]bool{}, map[string]bool{}
	for _, t := range a.Index.Tensors {
		inA[t.Hash] = true
	}
	for _, t := range b.Index.Tensors {
		inB[t.Hash] = true
		d := tensorDiff{Name: t.Name, Bytes: t.Length, DType: t.DType, Shape: t.Shape, Status: "added"}
		if inA[t.Hash] {
			d.Status = "same"
		}
		res.Tensors = append(res.Tensors, d)
	}
	for _, t := range a.Index.Tensors {
		if !inB[t.Hash] {
			res.Tensors = append(res.Tensors, tensorDiff{Name: t.Name, Status: "removed", Bytes: t.Length, DType: t.DType, Shape: t.Shape})
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
