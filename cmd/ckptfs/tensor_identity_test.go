package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/fusefs"
)

// stepFiles is a step directory to write: file (slash path) -> tensor name
// -> seed of its values (tinySafetensors).
type stepFiles map[string]map[string]int

func writeStepFiles(t *testing.T, dir string, files stepFiles) {
	t.Helper()
	for name, seeds := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, tinySafetensors(seeds), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// identityCase is two steps and what log and diff must say of them.
type identityCase struct {
	name       string
	a, b       stepFiles
	tensorsA   int
	tensorsB   int
	changed    int      // log's CHANGED at B
	rows       []string // diff's rows but the same ones: "status name"
	sameB      []string // diff's same rows
	diffFilesB []string // the JSON's file of each of B's tensors, sorted by name
}

// TestLogAndDiffIdentifyTensorsAlike: log and diff name a step's tensors
// one way (see "Tensor identity" in runhistory.go): a name that several
// files of a step hold is FILE:NAME in every file, in both steps compared;
// any other name is bare, so a tensor that moves between shards is the same
// tensor. log's TENSORS and CHANGED are what diff of the two steps counts.
// Before, log counted such a name once (its files' hashes combined) while
// diff counted it per file, prefixing only the second file's copy.
func TestLogAndDiffIdentifyTensorsAlike(t *testing.T) {
	mnt := mountForTest(t) // log through the daemon's tree op, diff from the manifests
	for i, tc := range []identityCase{{
		name:     "one file: bare names",
		a:        stepFiles{"model.safetensors": {"w": 1, "v": 2}},
		b:        stepFiles{"model.safetensors": {"w": 3, "v": 2, "u": 4}},
		tensorsA: 2, tensorsB: 3, changed: 2,
		rows:       []string{"added u", "changed w"},
		sameB:      []string{"v"},
		diffFilesB: []string{"model.safetensors", "model.safetensors", "model.safetensors"},
	}, {
		name:     "two files, one name: each its own tensor",
		a:        stepFiles{"a.safetensors": {"x": 1}, "b.safetensors": {"x": 1}},
		b:        stepFiles{"a.safetensors": {"x": 1}, "b.safetensors": {"x": 2}},
		tensorsA: 2, tensorsB: 2, changed: 1,
		rows:       []string{"changed b.safetensors:x"},
		sameB:      []string{"a.safetensors:x"},
		diffFilesB: []string{"a.safetensors", "b.safetensors"},
	}, {
		name:     "a model and its export: every copy qualified",
		a:        stepFiles{"model.pt.safetensors": {"w1": 1, "w2": 2}, "model.safetensors": {"w1": 1, "w2": 2}},
		b:        stepFiles{"model.pt.safetensors": {"w1": 5, "w2": 2}, "model.safetensors": {"w1": 5, "w2": 2}},
		tensorsA: 4, tensorsB: 4, changed: 2,
		rows:       []string{"changed model.pt.safetensors:w1", "changed model.safetensors:w1"},
		sameB:      []string{"model.pt.safetensors:w2", "model.safetensors:w2"},
		diffFilesB: []string{"model.pt.safetensors", "model.pt.safetensors", "model.safetensors", "model.safetensors"},
	}, {
		name:     "some names shared: only those qualified",
		a:        stepFiles{"a.safetensors": {"x": 1, "y": 2}, "b.safetensors": {"x": 3, "z": 4}},
		b:        stepFiles{"a.safetensors": {"x": 1, "y": 5}, "b.safetensors": {"x": 6, "z": 4}},
		tensorsA: 4, tensorsB: 4, changed: 2,
		rows:       []string{"changed b.safetensors:x", "changed y"},
		sameB:      []string{"a.safetensors:x", "z"},
		diffFilesB: []string{"a.safetensors", "b.safetensors", "a.safetensors", "b.safetensors"},
	}, {
		name:     "shards: a tensor moving between them is the same",
		a:        stepFiles{"model-1-of-2.safetensors": {"a": 1, "b": 2}, "model-2-of-2.safetensors": {"c": 3}},
		b:        stepFiles{"model-1-of-2.safetensors": {"a": 1, "b": 5, "c": 3}, "model-2-of-2.safetensors": {"d": 4}},
		tensorsA: 3, tensorsB: 4, changed: 2,
		rows:       []string{"changed b", "added d"},
		sameB:      []string{"a", "c"},
		diffFilesB: []string{"model-1-of-2.safetensors", "model-1-of-2.safetensors", "model-1-of-2.safetensors", "model-2-of-2.safetensors"},
	}, {
		name:     "the copy dropped: it is removed, the other pairs with itself",
		a:        stepFiles{"a.safetensors": {"x": 1}, "b.safetensors": {"x": 1}},
		b:        stepFiles{"b.safetensors": {"x": 1}},
		tensorsA: 2, tensorsB: 1, changed: 1,
		rows:       []string{"removed a.safetensors:x"},
		sameB:      []string{"b.safetensors:x"},
		diffFilesB: []string{"b.safetensors"},
	}, {
		name:     "a copy added in a sub-directory",
		a:        stepFiles{"model.safetensors": {"x": 1, "y": 2}},
		b:        stepFiles{"model.safetensors": {"x": 1, "y": 2}, "ema/model.safetensors": {"x": 7}},
		tensorsA: 2, tensorsB: 3, changed: 1,
		rows:       []string{"added ema/model.safetensors:x"},
		sameB:      []string{"model.safetensors:x", "y"},
		diffFilesB: []string{"ema/model.safetensors", "model.safetensors", "model.safetensors"},
	}} {
		for where, run := range map[string]string{"local": filepath.Join(t.TempDir(), "r"), "mount": filepath.Join(mnt, "runs", strconv.Itoa(i))} {
			t.Run(tc.name+"/"+where, func(t *testing.T) { checkTensorIdentity(t, run, tc) })
		}
	}
}

// checkTensorIdentity writes steps a and b as run/1 and run/2 and checks
// what log and diff say of them.
func checkTensorIdentity(t *testing.T, run string, tc identityCase) {
	sa, sb := filepath.Join(run, "1"), filepath.Join(run, "2")
	writeStepFiles(t, sa, tc.a)
	writeStepFiles(t, sb, tc.b)

	code, out, errOut := runCLI("log", "--json", run)
	var lg struct {
		Steps []struct {
			Tensors        int `json:"tensors"`
			TensorsChanged int `json:"tensors_changed"`
		} `json:"steps"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &lg) != nil || len(lg.Steps) != 2 {
		t.Fatalf("log: exit %d %s %s", code, out, errOut)
	}
	if got, want := lg.Steps, []int{tc.tensorsA, tc.tensorsA, tc.tensorsB, tc.changed}; got[0].Tensors != want[0] || got[0].TensorsChanged != want[1] || got[1].Tensors != want[2] || got[1].TensorsChanged != want[3] {
		t.Errorf("log: tensors/changed %d/%d, %d/%d; want %d/%d, %d/%d", got[0].Tensors, got[0].TensorsChanged, got[1].Tensors, got[1].TensorsChanged, want[0], want[1], want[2], want[3])
	}

	code, out, errOut = runCLI("diff", "--json", sa, sb)
	var res struct {
		Tensors []struct {
			Name, File, Status string
		} `json:"tensors"`
		Counts map[string]int `json:"counts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("diff --json: exit %d %s %s", code, out, errOut)
	}
	var rows, same, filesB []string
	for _, e := range res.Tensors {
		if e.Status == "same" {
			same = append(same, e.Name)
		} else {
			rows = append(rows, e.Status+" "+e.Name)
		}
		if e.Status != "removed" {
			filesB = append(filesB, e.File)
		}
	}
	if !slices.Equal(rows, tc.rows) || !slices.Equal(same, tc.sameB) || !slices.Equal(filesB, tc.diffFilesB) {
		t.Errorf("diff --json: rows %q, same %q, B's files %q; want %q, %q, %q", rows, same, filesB, tc.rows, tc.sameB, tc.diffFilesB)
	}
	c := res.Counts
	if c["same"]+c["changed"]+c["removed"] != tc.tensorsA || c["same"]+c["changed"]+c["added"] != tc.tensorsB || c["changed"]+c["added"]+c["removed"] != tc.changed {
		t.Errorf("diff counts %v disagree with log's %d, %d tensors, %d changed", c, tc.tensorsA, tc.tensorsB, tc.changed)
	}

	// The text names the rows as the JSON does.
	code, out, errOut = runCLI("diff", sa, sb)
	if code != 0 {
		t.Fatalf("diff: exit %d %s %s", code, out, errOut)
	}
	var textRows []string
	table, _, _ := strings.Cut(out, "\nsame ") // the counts follow the rows
	for _, line := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(line)
		textRows = append(textRows, f[0]+" "+f[1])
	}
	if !slices.Equal(textRows, tc.rows) {
		t.Errorf("diff: rows %q, want %q\n%s", textRows, tc.rows, out)
	}
}

// TestTensorsChangedMatchesDiff checks the rule itself on synthetic steps:
// tensorsChanged of two steps is what diffSides counts as changed, added
// and removed, and a step's count of tensors is what diffSides pairs.
func TestTensorsChangedMatchesDiff(t *testing.T) {
	steps := [][]fileTensor{
		nil,
		{{"m.safetensors", "x", "1"}},
		{{"m.safetensors", "x", "1"}, {"m.pt", "x", "1"}},
		{{"m.safetensors", "x", "2"}, {"m.pt", "x", "1"}, {"m.pt", "y", "3"}},
		{{"m.pt", "x", "2"}, {"m.pt", "y", "3"}},
		{{"s1", "x", "2"}, {"s2", "y", "3"}},
		{{"s2", "x", "2"}, {"s1", "y", "3"}, {"s1", "z", "3"}},
		{{"a/m", "x", "2"}, {"b/m", "x", "2"}, {"a/m", "y", "3"}},
	}
	side := func(ts []fileTensor) diffSide {
		s := diffSide{fileView: &fileView{Path: "step", Index: &fusefs.FileIndex{Format: "directory"}}, files: []string{}}
		for _, t := range ts {
			s.Index.Tensors = append(s.Index.Tensors, fusefs.TensorEntry{Name: t.name, Hash: t.hash})
			s.files = append(s.files, t.file)
		}
		return s
	}
	for i := range steps {
		for j := range steps {
			a, b := steps[i], steps[j]
			res := diffSides(side(a), side(b))
			c := res.Counts
			if got, want := tensorsChanged(a, b), c["changed"]+c["added"]+c["removed"]; got != want {
				t.Errorf("steps %d -> %d: tensorsChanged %d, diff %v", i, j, got, c)
			}
			nA := len(tensorKeys(a, sharedNames(a)))
			nB := len(tensorKeys(b, sharedNames(b)))
			if c["same"]+c["changed"]+c["removed"] != nA || c["same"]+c["changed"]+c["added"] != nB {
				t.Errorf("steps %d -> %d: diff %v, steps of %d and %d tensors", i, j, c, nA, nB)
			}
			names := map[string]bool{}
			for _, e := range res.Tensors {
				if names[e.Name] {
					t.Errorf("steps %d -> %d: %s twice in %v", i, j, e.Name, res.Tensors)
				}
				names[e.Name] = true
			}
			if i == j && c["same"] != nA {
				t.Errorf("step %d against itself: %v", i, c)
			}
		}
	}
}
