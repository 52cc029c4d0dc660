package main

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/prometheus/client_golang/prometheus"
)

// distinctStats returns a cas.Stats whose every numeric field (embedded
// structs' too) holds its own value, 1, 2, 3...
func distinctStats(t *testing.T) cas.Stats {
	t.Helper()
	var st cas.Stats
	v := reflect.ValueOf(&st).Elem()
	n := 0
	for _, f := range reflect.VisibleFields(v.Type()) {
		fv := v.FieldByIndex(f.Index)
		if !f.IsExported() || !fv.CanSet() {
			continue
		}
		n++
		switch {
		case fv.CanInt():
			fv.SetInt(int64(n))
		case fv.CanUint():
			fv.SetUint(uint64(n))
		case fv.CanFloat():
			fv.SetFloat(float64(n))
		}
	}
	return st
}

// storeMetrics gathers the ckptfs_store_* gauges of a collector reading st:
// value and help by name.
func storeMetrics(t *testing.T, st cas.Stats) (values map[string]float64, help map[string]string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newStoreCollector(func() (cas.Stats, error) { return st, nil }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values, help = map[string]float64{}, map[string]string{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge() == nil {
			t.Errorf("%s: want one gauge, got %v", mf.GetName(), mf.GetMetric())
			continue
		}
		values[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		help[mf.GetName()] = mf.GetHelp()
	}
	return values, help
}

// TestStoreMetricsServeStatsJSON: /metrics has a gauge ckptfs_store_KEY for
// every numeric key of stats.json (cas.Stats as the daemon marshals it),
// with that key's value, and no other.
func TestStoreMetricsServeStatsJSON(t *testing.T) {
	st := distinctStats(t)
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	values, _ := storeMetrics(t, st)
	var keys []string
	for k, x := range fields {
		n, ok := x.(float64)
		if !ok {
			continue
		}
		keys = append(keys, k)
		got, ok := values["ckptfs_store_"+k]
		if !ok {
			t.Errorf("stats.json's %s has no gauge ckptfs_store_%s", k, k)
		} else if got != n {
			t.Errorf("ckptfs_store_%s = %v, stats.json's %s is %v", k, got, k, n)
		}
	}
	if len(values) != len(keys) {
		t.Errorf("%d gauges for %d numeric stats.json figures: %v", len(values), len(keys), values)
	}
	// The figures that were missing once, by name.
	for _, k := range []string{"delta_chunks", "delta_waiting", "packs", "pack_bytes", "packed_bytes", "inline_chunks",
		"inline_bytes", "format_version", "remote_pending_bytes", "remote_uploaded_bytes", "remote_read_bytes", "files", "chunk_size"} {
		if _, ok := values["ckptfs_store_"+k]; !ok {
			t.Errorf("no ckptfs_store_%s", k)
		}
	}
}

// TestStoreGaugesHaveHelp: every ckptfs_store_* gauge has its own help line
// in storeGaugeHelp, and storeGaugeHelp names no figure stats.json lacks.
func TestStoreGaugesHaveHelp(t *testing.T) {
	_, help := storeMetrics(t, cas.Stats{})
	names := map[string]bool{}
	for _, g := range storeGaugeFields() {
		names[g.name] = true
		if storeGaugeHelp[g.name] == "" {
			t.Errorf("stats.json's %s: add its help to storeGaugeHelp (prometheus.go); it is served as %q", g.name, help["ckptfs_store_"+g.name])
		}
	}
	var stale []string
	for k := range storeGaugeHelp {
		if !names[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("storeGaugeHelp words figures stats.json does not have: %v", stale)
	}
}
