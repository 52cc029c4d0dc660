package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ckptfs/ckptfs/cas"
)

func runStats(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print JSON")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	stats, err := readStats(pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(stats)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	for _, k := range sortedKeys(stats) {
		v := stats[k]
		if n, ok := v.(float64); ok && (k == "logical_bytes" || k == "unique_bytes" || k == "stored_bytes" || k == "store_read_bytes" || k == "cache_bytes" || k == "reencode_pending_bytes" || k == "pack_bytes" || k == "packed_bytes" || k == "inline_bytes") {
			fmt.Fprintf(tw, "%s\t%.0f\t(%s)\n", k, n, formatBytes(int64(n)))
			continue
		}
		if n, ok := v.(float64); ok {
			fmt.Fprintf(tw, "%s\t%.0f\n", k, n)
			continue
		}
		fmt.Fprintf(tw, "%s\t%v\n", k, v)
	}
	if u, ok := stats["unique_bytes"].(float64); ok && u > 0 {
		if l, ok := stats["logical_bytes"].(float64); ok {
			fmt.Fprintf(tw, "dedup ratio\t%s\t(logical / unique)\n", formatRatio(l/u))
		}
		if s, ok := stats["stored_bytes"].(float64); ok {
			fmt.Fprintf(tw, "compression\t%s\t(stored / unique)\n", formatSig(s/u, 3))
		}
	}
	if p, ok := stats["pack_bytes"].(float64); ok && p > 0 {
		if l, ok := stats["packed_bytes"].(float64); ok {
			fmt.Fprintf(tw, "pack dead bytes\t%.0f\t(%s: dead chunks in packs with live ones)\n", p-l, formatBytes(int64(p-l)))
		}
	}
	return tw.Flush()
}

// readStats reads PATH/.ckptfs/stats.json of a mount, or opens an unmounted
// store read-only. What PATH is, and the errors when it is neither (a dead
// mount, a directory the user may not read), are probeTarget's.
func readStats(path string) (map[string]any, error) {
	kind, data, err := probeTarget(path)
	if err != nil {
		return nil, err
	}
	if kind == kindMount {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("%s: bad stats.json: %w", path, err)
		}
		return m, nil
	}
	store, err := openStore(path, cas.Options{ReadOnly: true})
	if errors.Is(err, cas.ErrLocked) {
		return nil, fmt.Errorf("%w: run stats on its mountpoint instead", err)
	}
	if errors.Is(err, cas.ErrNotStore) {
		return nil, fmt.Errorf("%s is %w", path, errNotTarget)
	}
	if err != nil {
		return nil, err
	}
	defer store.Close()
	st, err := store.Stats()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}
