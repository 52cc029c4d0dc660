package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/fusefs"
)

// TestTreeParts: `tensors` lists a tree model's trees and skeleton, and
// `diff` of two saves counts trees (issue #29).
func TestTreeParts(t *testing.T) {
	tree := func(name string, off, n int64, hash string) fusefs.TensorEntry {
		return fusefs.TensorEntry{Name: name, DType: "tree", Offset: off, Length: n, Hash: hash}
	}
	a := &fileView{Path: "a.json", Size: 100, Index: &fusefs.FileIndex{Format: "xgboost-json",
		Tensors: []fusefs.TensorEntry{tree("tree.0", 10, 30, "h0"), tree("tree.1", 40, 40, "h1")}}}
	b := &fileView{Path: "b.json", Size: 150, Index: &fusefs.FileIndex{Format: "xgboost-json",
		Tensors: []fusefs.TensorEntry{tree("tree.0", 10, 30, "h0"), tree("tree.1", 40, 40, "h1x"), tree("tree.2", 80, 50, "h2")}}}
	var out bytes.Buffer
	if err := printParts(&out, b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tree.2    tree      80      50", "skeleton  skeleton  -       30",
		"b.json: xgboost-json, 3 trees (120 B), skeleton 30 B in 2 ranges, in 150 B"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tensors output lacks %q:\n%s", want, out.String())
		}
	}
	for _, tc := range []struct {
		a, b *fileView
		unit string
		want map[string]int
	}{
		{a, b, "trees", map[string]int{"same": 1, "changed": 1, "added": 1}},
		{b, a, "trees", map[string]int{"same": 1, "changed": 1, "removed": 1}},
	} {
		res := diffViews(tc.a, tc.b)
		if res.Unit != tc.unit {
			t.Errorf("unit %q, want %q", res.Unit, tc.unit)
		}
		for _, s := range []string{"same", "changed", "added", "removed"} {
			if res.Counts[s] != tc.want[s] {
				t.Errorf("%s -> %s: %d %s, want %d", tc.a.Path, tc.b.Path, res.Counts[s], s, tc.want[s])
			}
		}
	}
}

// TestPickleBuffersDiffByBytes: a pickle's buffers are renumbered when one
// is added before others, so diff pairs them by hash.
func TestPickleBuffersDiffByBytes(t *testing.T) {
	buf := func(name, hash string) fusefs.TensorEntry {
		return fusefs.TensorEntry{Name: name, DType: "buffer", Length: 10, Hash: hash}
	}
	view := func(bufs ...fusefs.TensorEntry) *fileView {
		return &fileView{Size: 100, Index: &fusefs.FileIndex{Format: "pickle", Tensors: bufs}}
	}
	a := view(buf("buffer.0", "t0"), buf("buffer.1", "t1"), buf("buffer.2", "score1"))
	b := view(buf("buffer.0", "t0"), buf("buffer.1", "t1"), buf("buffer.2", "t2"), buf("buffer.3", "score2"))
	res := diffViews(a, b)
	want := map[string]int{"same": 2, "added": 2, "removed": 1}
	if res.Unit != "buffers" || !reflect.DeepEqual(res.Counts, want) {
		t.Fatalf("unit %q counts %v, want buffers %v", res.Unit, res.Counts, want)
	}
}

// TestDCPNames: `tensors` and `diff` name a torch.distributed.checkpoint
// shard's tensors by the keys of the .metadata beside it; without one they
// keep the archive numbers the index gives them, on both sides of a diff,
// and say why.
func TestDCPNames(t *testing.T) {
	shard, err := os.ReadFile("../../formats/testdata/dcp_shard.distcp")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile("../../formats/testdata/dcp_shard.metadata")
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(t.TempDir(), "step-1"), filepath.Join(t.TempDir(), "step-2")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "__0_0.distcp"), shard, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(a, ".metadata"), md, 0o644); err != nil {
		t.Fatal(err)
	}
	tensorNames := func(dir string) (names []string, stderr string) {
		code, out, errOut := runCLI("tensors", "--json", filepath.Join(dir, "__0_0.distcp"))
		if code != 0 {
			t.Fatalf("tensors: exit %d: %s", code, errOut)
		}
		var l struct {
			Format  string `json:"format"`
			Tensors []struct {
				Name string `json:"name"`
			} `json:"tensors"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatal(err)
		}
		if l.Format != "distcp" {
			t.Fatalf("format %q, want distcp", l.Format)
		}
		for _, tn := range l.Tensors {
			names = append(names, tn.Name)
		}
		return names, errOut
	}
	if got, _ := tensorNames(a); !reflect.DeepEqual(got, []string{"bufs.0", "bufs.1", "layer.weight", "layer.bias", "norm.weight", "ids"}) {
		t.Errorf("with .metadata: tensors %q", got)
	}
	got, errOut := tensorNames(b)
	if !reflect.DeepEqual(got, []string{"0.0", "0.1", "1", "2", "3", "4"}) || !strings.Contains(errOut, ".metadata") {
		t.Errorf("without .metadata: tensors %q, stderr %q", got, errOut)
	}
	code, out, errOut := runCLI("diff", "--json", a, b)
	if code != 0 {
		t.Fatalf("diff: exit %d: %s", code, errOut)
	}
	var res diffResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Counts["same"] != 6 || len(res.Tensors) != 6 || res.Tensors[0].Name != "0.0" || !strings.Contains(errOut, "number in the shard") {
		t.Errorf("diff with .metadata on one side only: %+v, stderr %q", res, errOut)
	}
	if err := os.WriteFile(filepath.Join(b, ".metadata"), md, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = runCLI("diff", "--json", a, b); code != 0 {
		t.Fatalf("diff: exit %d: %s", code, errOut)
	}
	res = diffResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Counts["same"] != 6 || res.Tensors[0].Name != "bufs.0" || errOut != "" {
		t.Errorf("diff with .metadata on both sides: %+v, stderr %q", res, errOut)
	}

	// A shard of one item is one torch.save archive, named all the same.
	c := filepath.Join(t.TempDir(), "step-3")
	if err := os.MkdirAll(c, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{"dcp_single.distcp": "__0_0.distcp", "dcp_single.metadata": ".metadata"} {
		b, err := os.ReadFile("../../formats/testdata/" + src)
		if err == nil {
			err = os.WriteFile(filepath.Join(c, dst), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut = runCLI("tensors", filepath.Join(c, "__0_0.distcp"))
	if code != 0 || !strings.Contains(out, "only ") || errOut != "" {
		t.Errorf("a one-item shard: exit %d, %q, stderr %q", code, out, errOut)
	}
}
