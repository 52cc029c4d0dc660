package main

// A step's metrics come from files its trainer wrote beside the checkpoint:
//
//   - metrics.json: a flat JSON object of name → number (what a training loop
//     writes with json.dump({"val_loss": …}));
//   - trainer_state.json (Hugging Face Trainer): the entries of its
//     log_history whose "step" is the checkpoint's step (the training log and
//     the evaluation log of that step, merged in order), or, when none is, the
//     last entry before it. The checkpoint's step is the file's global_step,
//     else the directory's step number.
//
// Both may exist; metrics.json wins on a name both have. Values that are not
// numbers (strings, nested objects, null) are left out. Python's NaN,
// Infinity and -Infinity, which json.dump writes although JSON does not allow
// them, are kept: a diverged run's loss is NaN, and log shows it as NaN (log
// --json and the report write them as null; best never picks a NaN).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
)

const (
	metricsFile      = "metrics.json"
	trainerStateFile = "trainer_state.json"
)

// readStepMetrics returns sd's metrics (never nil) and warnings about files
// that could not be parsed (a half-written metrics file must not stop log).
func readStepMetrics(sd stepDir) (map[string]float64, []string, error) {
	return stepMetricsFrom(sd, func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(sd.Path, name)) })
}

// stepMetricsFrom is readStepMetrics with the step's files read by read,
// which returns an error wrapping fs.ErrNotExist for a file that is absent.
func stepMetricsFrom(sd stepDir, read func(name string) ([]byte, error)) (map[string]float64, []string, error) {
	out := map[string]float64{}
	var warns []string
	data, err := read(trainerStateFile)
	switch {
	case err == nil:
		if err := trainerStateMetrics(data, sd.Step, out); err != nil {
			warns = append(warns, fmt.Sprintf("%s: %v", filepath.Join(sd.Path, trainerStateFile), err))
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, err
	}
	data, err = read(metricsFile)
	switch {
	case err == nil:
		var m map[string]any
		if err := json.Unmarshal(sanitizeJSON(data), &m); err != nil {
			warns = append(warns, fmt.Sprintf("%s: %v", filepath.Join(sd.Path, metricsFile), err))
			break
		}
		mergeNumbers(out, m)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, err
	}
	return out, warns, nil
}

func trainerStateMetrics(data []byte, dirStep int64, out map[string]float64) error {
	var ts struct {
		GlobalStep *float64         `json:"global_step"`
		LogHistory []map[string]any `json:"log_history"`
	}
	if err := json.Unmarshal(sanitizeJSON(data), &ts); err != nil {
		return err
	}
	step := float64(dirStep)
	if ts.GlobalStep != nil && *ts.GlobalStep > 0 {
		step = *ts.GlobalStep
	}
	var exact []map[string]any
	var before map[string]any
	for _, e := range ts.LogHistory {
		s, ok := e["step"].(float64)
		if !ok {
			continue
		}
		switch {
		case s == step:
			exact = append(exact, e)
		case s < step:
			before = e
		}
	}
	if len(exact) == 0 && before != nil {
		exact = append(exact, before)
	}
	for _, e := range exact {
		mergeNumbers(out, e)
	}
	return nil
}

// mergeNumbers copies m's numeric values except "step" into out.
func mergeNumbers(out map[string]float64, m map[string]any) {
	for k, v := range m {
		if k == "step" {
			continue
		}
		switch v := v.(type) {
		case float64:
			out[k] = v
		case string:
			if f, ok := nonFinite[v]; ok {
				out[k] = f
			}
		}
	}
}

// nonFinite maps the strings sanitizeJSON writes for Python's bare tokens to
// their values. They cannot collide with a real string value: a JSON string
// cannot hold a raw NUL byte.
var nonFinite = map[string]float64{
	"\x00NaN": math.NaN(), "\x00Infinity": math.Inf(1), "\x00-Infinity": math.Inf(-1),
}

// metricMap is a step's metrics; NaN and ±Inf are written to JSON as null
// (encoding/json refuses them).
type metricMap map[string]float64

func (m metricMap) MarshalJSON() ([]byte, error) {
	clean := make(map[string]*float64, len(m))
	for k, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			clean[k] = nil
			continue
		}
		clean[k] = &v
	}
	return json.Marshal(clean)
}

// sanitizeJSON replaces the bare tokens NaN, Infinity and -Infinity that
// Python's json module writes (outside strings) with strings nonFinite
// knows, written as JSON escapes of a NUL byte and the token.
func sanitizeJSON(b []byte) []byte {
	var out bytes.Buffer
	last := 0
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			continue
		}
		for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
			if bytes.HasPrefix(b[i:], []byte(tok)) {
				out.Write(b[last:i])
				out.WriteString(`"\u0000` + tok + `"`)
				i += len(tok) - 1
				last = i + 1
				break
			}
		}
	}
	if last == 0 {
		return b
	}
	out.Write(b[last:])
	return out.Bytes()
}

// metricNames returns the names any step has, sorted.
func metricNames(rows []stepRow) []string {
	set := map[string]bool{}
	for _, r := range rows {
		for k := range r.Metrics {
			set[k] = true
		}
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
