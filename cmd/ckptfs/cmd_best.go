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
	var best *stepDir
	var bestValue float64
	have := map[string]bool{}
	n, skipped, err := forEachStepMetrics(ctx, pos[0], func(sd stepDir, m map[string]float64, warns []string) error {
		for _, w := range warns {
			fmt.Fprintf(stderr, "ckptfs best: warning: %s\n", w)
		}
		for k := range m {
			have[k] = true
		}
		v, ok := m[*metric]
		if !ok || math.IsNaN(v) {
			return nil
		}
		// Ties go to the earliest step.
		if best == nil || (*mode == "min" && v < bestValue) || (*mode == "max" && v > bestValue) {
			best, bestValue = &sd, v
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return errNoSteps(pos[0], skipped)
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

// forEachStepMetrics calls fn with each step of runDir, in order, and its
// metrics and their warnings: through the daemon in a mount that answers the
// tree op (runbatch.go), else step by step through the file system. It
// returns the number of steps and the directories that are not steps.
func forEachStepMetrics(ctx context.Context, runDir string, fn func(sd stepDir, m map[string]float64, warns []string) error) (int, []string, error) {
	if rm, ok := openRunMount(ctx, runDir); ok {
		steps, inos, skipped, ok, err := rm.steps(ctx)
		if err != nil {
			return 0, nil, err
		}
		if ok {
			ok, err = rm.forEachStep(ctx, steps, inos, false, func(sd stepDir, d treeDir) error {
				m, warns, err := stepMetricsFromTree(sd, d)
				if err != nil {
					return err
				}
				return fn(sd, m, warns)
			})
			if err != nil || ok {
				return len(steps), skipped, err
			}
		}
	}
	steps, skipped, err := listSteps(runDir)
	if err != nil {
		return 0, nil, err
	}
	for _, sd := range steps {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		m, warns, err := readStepMetrics(sd)
		if err != nil {
			return 0, nil, err
		}
		if err := fn(sd, m, warns); err != nil {
			return 0, nil, err
		}
	}
	return len(steps), skipped, nil
}
