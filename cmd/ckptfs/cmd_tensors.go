package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/ckptfs/ckptfs/formats"
	"github.com/ckptfs/ckptfs/fusefs"
)

func runTensors(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print JSON")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	v, err := loadFileView(ctx, pos[0])
	if err != nil {
		return err
	}
	namer := newDCPNamer()
	nameTensors(v.Index.Tensors, namer.names(v))
	if namer.err != nil {
		fmt.Fprintf(stderr, "ckptfs tensors: tensors named by their number in the shard: %v\n", namer.err)
	}
	if *asJSON {
		tensors := v.Index.Tensors
		if tensors == nil {
			tensors = []fusefs.TensorEntry{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Path    string               `json:"path"`
			Format  string               `json:"format"`
			Size    int64                `json:"size"`
			Tensors []fusefs.TensorEntry `json:"tensors"`
		}{v.Path, v.Index.Format, v.Size, tensors})
	}
	if v.Index.Format == "" {
		return fmt.Errorf("%s: %w", v.Path, whyNotParsed(v.Path))
	}
	if k := v.Index.TensorsOmitted; k > 0 {
		return fmt.Errorf("%s: a %s file of %d tensors, over the %d a tensor index keeps: stored whole, without one",
			v.Path, v.Index.Format, k, fusefs.MaxIndexTensors)
	}
	if formats.IsPartFormat(v.Index.Format) {
		return printParts(stdout, v)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDTYPE\tSHAPE\tOFFSET\tBYTES")
	var total int64
	for _, t := range v.Index.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", t.Name, t.DType, shapeString(t.Shape), t.Offset, t.Length)
		total += t.Length
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, %d tensors, %s of tensor data in %s\n", v.Path, v.Index.Format, len(v.Index.Tensors), formatBytes(total), formatBytes(v.Size))
	return nil
}

func shapeString(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// printParts lists the parts of a tree model or pickle: its trees (or
// pickled buffers) and its skeleton, the bytes around them (tree counts,
// parameters, the pickle's opcodes), which a warm-started save rewrites
// while its old trees keep their chunks.
func printParts(stdout io.Writer, v *fileView) error {
	unit := partUnit(v.Index.Tensors)
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tOFFSET\tBYTES")
	var total, pos int64
	var skeleton []string
	for _, t := range v.Index.Tensors {
		if t.Offset > pos {
			skeleton = append(skeleton, fmt.Sprintf("[%d,%d)", pos, t.Offset))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", t.Name, t.DType, t.Offset, t.Length)
		total += t.Length
		pos = max(pos, t.Offset+t.Length)
	}
	if pos < v.Size {
		skeleton = append(skeleton, fmt.Sprintf("[%d,%d)", pos, v.Size))
	}
	fmt.Fprintf(tw, "skeleton\tskeleton\t-\t%d\n", v.Size-total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, %d %s (%s), skeleton %s in %d ranges, in %s\n", v.Path, v.Index.Format,
		len(v.Index.Tensors), unit, formatBytes(total), formatBytes(v.Size-total), len(skeleton), formatBytes(v.Size))
	return nil
}

// partUnit names what a part format's parts are: "trees" (XGBoost,
// LightGBM) or "buffers" (pickles).
func partUnit(parts []fusefs.TensorEntry) string {
	for _, t := range parts {
		if t.DType == formats.DTypeTree {
			return "trees"
		}
	}
	return "buffers"
}
