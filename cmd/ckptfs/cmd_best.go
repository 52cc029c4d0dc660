package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
)

func runBest(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	metric := fl.String("metric", "", "the metric to rank steps by (required), e.g. val_loss or eval_loss")
	mode := fl.String("mode", "min", "min: the lowest value is best; max: the highest")
	asJSON := fl.Bool("json", false, "print JSON (step, name, path, metric, value)")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	if *metric == "" || (*mode != "min" && *mode != "max") {
		if *metric == "" {
			fmt.Fprintf(stderr, "ckptfs best: --metric is required\n\n")
		} else {
			fmt.Fprintf(stderr, "ckptfs best: --mode must be min or max, not %q\n\n", *mode)
		}
		fl.Usage()
		return errUsage
	}
	steps, skipped, err := listSteps(pos[0])
	if err != nil {
		return err
	}
	if len(steps) == 0 {
		return errNoSteps(pos[0], skipped)
	}
	var best *stepDir
	var bestValue float64
	have := map[string]bool{}
	for i, sd := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, warns, err := readStepMetrics(sd)
		if err != nil {
			return err
		}
		for _, w := range warns {
			fmt.Fprintf(stderr, "ckptfs best: warning: %s\n", w)
		}
		for k := range m {
			have[k] = true
		}
		v, ok := m[*metric]
		if !ok || math.IsNaN(v) {
			continue
		}
		// Ties go to the earliest step.
		if best == nil || (*mode == "min" && v < bestValue) || (*mode == "max" && v > bestValue) {
			best, bestValue = &steps[i], v
		}
	}
	if best == nil {
		if len(have) == 0 {
			return fmt.Errorf("no step of %s has metrics (%s or %s in the step directory)", pos[0], metricsFile, trainerStateFile)
		}
		return fmt.Errorf("no step of %s has metric %q; metrics found: %s", pos[0], *metric, strings.Join(sortedKeys(have), ", "))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Step   int64   `json:"step"`
			Name   string  `json:"name"`
			Path   string  `json:"path"`
			Metric string  `json:"metric"`
			Mode   string  `json:"mode"`
			Value  float64 `json:"value"`
		}{best.Step, best.Name, best.Path, *metric, *mode, bestValue})
	}
	_, err = fmt.Fprintln(stdout, best.Path)
	return err
}
