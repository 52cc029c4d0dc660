package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// runSync asks the daemon of MOUNTPOINT for an upload round and waits for it:
// exit 0 means every file committed before the call is in the bucket. While
// it waits, stderr shows the upload's progress on a terminal; at the end
// stdout says what went up, whether or not it is a terminal (so no summary
// on stderr: that line is it).
func runSync(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	t, err := resolveTarget(pos[0])
	if err != nil {
		return err
	}
	if t.socket == "" {
		return fmt.Errorf("%s is not mounted: sync talks to the daemon of a mountpoint", pos[0])
	}
	bar := newProgressBar(stderr)
	var raw json.RawMessage
	err = callDaemon(ctx, t.socket, controlRequest{Op: "sync"}, bar.update, &raw)
	bar.finish("")
	if err != nil {
		return err
	}
	var res syncResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("the daemon's answer: %w", err)
	}
	fmt.Fprintln(stdout, formatSync(res, string(raw) == "{}"))
	return nil
}

// formatSync is sync's last line. old says the daemon runs a ckptfs from
// before sync said what it uploaded (its answer is {}).
func formatSync(r syncResult, old bool) string {
	d := time.Duration(r.Seconds * float64(time.Second))
	switch {
	case old:
		return "synced: everything committed is in the bucket (the daemon, an older ckptfs, does not say what it uploaded)"
	case r.Chunks == 0 && r.Present == 0:
		return fmt.Sprintf("nothing to upload: everything committed is in %s", r.Remote)
	}
	s := fmt.Sprintf("uploaded %s, %s to %s", countOf(r.Chunks, "chunk"), formatRate(r.RawBytes, d), r.Remote)
	if sent := formatBytes(r.SentBytes); sent != formatBytes(r.RawBytes) {
		s += "; " + sent + " sent"
	}
	if r.Present > 0 {
		s += fmt.Sprintf("; %s there already", countOf(r.Present, "chunk was", "chunks were"))
	}
	return s
}

// countOf writes n with its noun: one, or else plural (the noun with an s
// when no plural is given).
func countOf(n int64, one string, plural ...string) string {
	if n == 1 {
		return "1 " + one
	}
	if len(plural) > 0 {
		return fmt.Sprintf("%d %s", n, plural[0])
	}
	return fmt.Sprintf("%d %ss", n, one)
}
