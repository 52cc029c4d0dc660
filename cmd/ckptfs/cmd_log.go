package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

func runLog(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print JSON")
	only := fl.String("metrics", "", "comma-separated metrics to show as columns (default: all)")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	h, err := loadSteps(ctx, "log", pos[0], stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(h)
	}
	names := metricNames(h.Steps)
	if *only != "" {
		known := map[string]bool{}
		for _, n := range names {
			known[n] = true
		}
		var unknown []string
		names = nil
		for _, n := range strings.Split(*only, ",") {
			n = strings.TrimSpace(n)
			if n == "" {
				continue
			}
			if !known[n] {
				unknown = append(unknown, n)
			}
			names = append(names, n)
		}
		if len(unknown) > 0 {
			have := "none"
			if k := metricNames(h.Steps); len(k) > 0 {
				have = strings.Join(k, ", ")
			}
			return usageError(c, stderr, "--metrics: no step has %s (metrics found: %s)", strings.Join(unknown, ", "), have)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	head := append([]string{"STEP", "DIR", "FILES", "LOGICAL", "ADDED", "TENSORS", "CHANGED"}, names...)
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range h.Steps {
		cells := []string{strconv.FormatInt(r.Step, 10), r.Name, strconv.Itoa(r.Files), formatBytes(r.LogicalBytes),
			formatBytes(r.AddedBytes), strconv.Itoa(r.Tensors), strconv.Itoa(r.TensorsChanged)}
		for _, n := range names {
			if v, ok := r.Metrics[n]; ok {
				cells = append(cells, formatMetric(v))
			} else {
				cells = append(cells, "-")
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d steps: %s logical, %s of distinct chunks (%s)\n",
		len(h.Steps), formatBytes(h.LogicalBytes), formatBytes(h.UniqueBytes), ratioString(h.LogicalBytes, h.UniqueBytes))
	if len(h.Skipped) > 0 {
		fmt.Fprintf(stdout, "not steps (no step number): %s\n", strings.Join(h.Skipped, ", "))
	}
	return nil
}

// errNoSteps says what a step directory is.
func errNoSteps(runDir string, skipped []string) error {
	msg := fmt.Sprintf("%s has no step directories (sub-directories named by a step number: 500, checkpoint-500, step_10)", runDir)
	if len(skipped) > 0 {
		msg += "; it has " + strings.Join(skipped, ", ")
	}
	return fmt.Errorf("%s", msg)
}

// formatMetric prints a metric to 4 significant digits (formatSig), as the
// report does.
func formatMetric(v float64) string {
	return formatSig(v, 4)
}

// ratioString is logical/unique as "6.50x".
func ratioString(logical, unique int64) string {
	if unique == 0 {
		return "no new bytes"
	}
	return formatRatio(float64(logical) / float64(unique))
}
