package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// reportPage is the page's template: inline CSS and JS, no network. The JS
// reads the JSON that replaces reportPlaceholder and draws everything; it sets
// data-rendered="ok" on <html> when it is done, or writes what failed into
// <pre id="errors"> (what the test checks in a headless browser).
//
//go:embed report.html
var reportPage string

const reportPlaceholder = "/*CKPTFS-DATA*/"

// reportData is what the page draws.
type reportData struct {
	Run          string    `json:"run"`
	Generated    string    `json:"generated"`
	LogicalBytes int64     `json:"logical_bytes"`
	UniqueBytes  int64     `json:"unique_bytes"`
	Steps        []stepRow `json:"steps"`
	Metrics      []string  `json:"metrics"`
	Tensors      []string  `json:"tensors"`
	// Grid has one string per tensor, one letter per step: a (added: absent
	// at the previous step), c (changed), s (same), r (removed: present at the
	// previous step, absent now), . (absent).
	Grid []string `json:"grid"`
}

func runReport(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	out := fl.String("o", "", "the HTML file to write (required; - for stdout)")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	if *out == "" {
		fmt.Fprintf(stderr, "ckptfs report: -o FILE.html is required\n\n")
		fl.Usage()
		return errUsage
	}
	h, err := loadSteps(ctx, "report", pos[0], stderr)
	if err != nil {
		return err
	}
	page, err := renderReport(h, time.Now())
	if err != nil {
		return err
	}
	if *out == "-" {
		_, err = stdout.Write(page)
		return err
	}
	tmp := *out + ".tmp"
	if err := os.WriteFile(tmp, page, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, *out); err != nil {
		os.Remove(tmp)
		return err
	}
	abs, _ := filepath.Abs(*out)
	fmt.Fprintf(stdout, "wrote %s (%d steps, %d tensors, %d metrics)\n", abs, len(h.Steps), countTensors(h), len(metricNames(h.Steps)))
	return nil
}

func countTensors(h *runHistory) int {
	set := map[string]bool{}
	for _, s := range h.Steps {
		for name := range s.tensors {
			set[name] = true
		}
	}
	return len(set)
}

func renderReport(h *runHistory, now time.Time) ([]byte, error) {
	d := reportData{
		Run:          h.RunDir,
		Generated:    now.Format("2006-01-02 15:04:05 MST"),
		LogicalBytes: h.LogicalBytes,
		UniqueBytes:  h.UniqueBytes,
		Steps:        h.Steps,
		Metrics:      metricNames(h.Steps),
	}
	set := map[string]bool{}
	for _, s := range h.Steps {
		for name := range s.tensors {
			set[name] = true
		}
	}
	for name := range set {
		d.Tensors = append(d.Tensors, name)
	}
	sort.Slice(d.Tensors, func(i, j int) bool { return naturalLess(d.Tensors[i], d.Tensors[j]) })
	d.Grid = make([]string, len(d.Tensors))
	for i, name := range d.Tensors {
		row := make([]byte, len(h.Steps))
		var prev string
		var had bool
		for j, s := range h.Steps {
			k, ok := s.tensors[name]
			switch {
			case !ok && had:
				row[j] = 'r'
			case !ok:
				row[j] = '.'
			case !had:
				row[j] = 'a'
			case k == prev:
				row[j] = 's'
			default:
				row[j] = 'c'
			}
			prev, had = k, ok
		}
		d.Grid[i] = string(row)
	}
	if d.Tensors == nil {
		d.Tensors = []string{}
	}
	// json.Marshal escapes <, > and &, so the data cannot close the script
	// element it sits in.
	data, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(reportPage, reportPlaceholder) {
		return nil, fmt.Errorf("report template lacks its data placeholder")
	}
	return bytes.Replace([]byte(reportPage), []byte(reportPlaceholder), data, 1), nil
}

// naturalLess orders names with numbers by value: layer.2 before layer.10.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := isDigit(a[0]), isDigit(b[0])
		if da && db {
			na, ra := splitDigits(a)
			nb, rb := splitDigits(b)
			ta, tb := strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(ta) != len(tb) {
				return len(ta) < len(tb)
			}
			if ta != tb {
				return ta < tb
			}
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func splitDigits(s string) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i], s[i:]
}
