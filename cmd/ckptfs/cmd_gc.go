package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/gc"
)

func runGC(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	grace := duration(gc.DefaultGrace)
	fl.Var(&grace, "grace", "keep objects no commit ever named (a crashed writer's) younger than this (e.g. 1d, 12h, 0); chunks of deleted files are freed whatever their age")
	dryRun := fl.Bool("dry-run", false, "report what would be freed, delete nothing")
	asJSON := fl.Bool("json", false, "print JSON")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	if grace < 0 {
		return usageError(c, stderr, "--grace must not be negative")
	}
	t, err := resolveTarget(pos[0])
	if err != nil {
		return err
	}
	bar := newProgressBar(stderr)
	var res gc.Result
	if t.socket != "" {
		err = callDaemon(ctx, t.socket, controlRequest{Op: "gc", Grace: time.Duration(grace), DryRun: *dryRun}, bar.update, &res)
	} else {
		var s *cas.Store
		s, err = openStore(t.storeDir, cas.Options{})
		if err != nil {
			return err
		}
		defer s.Close()
		res, err = gc.Collect(ctx, s, gc.Options{Grace: time.Duration(grace), DryRun: *dryRun, Progress: bar.update})
	}
	if err != nil {
		bar.finish("")
		return err
	}
	verb := "freed"
	if res.DryRun {
		verb = "would free"
	}
	if *asJSON {
		bar.finish("")
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	bar.finish(gcSummary(res, verb) + fmt.Sprintf(" in %.1fs", bar.elapsed().Seconds()))
	writeGCResult(stdout, res, verb, time.Duration(grace))
	return nil
}

// The figures of a gc on a writer of a remote store are of two places: this
// machine's store (the object files in STORE/objects: the chunks this store
// committed and the copies it fetched from the bucket) and the bucket (its
// chunk objects, which every writer of the prefix shares). Both are printed,
// each under its own name ("local:", "remote:"), never added up. Without a
// remote collection the lines are unlabelled, as they always were.

// gcSummary is the one line gc writes on stderr at the end (before "in
// Ns"): what it freed here, and in the bucket when it collected there.
func gcSummary(res gc.Result, verb string) string {
	local := fmt.Sprintf("%s %s (%d chunks", verb, formatBytes(res.FreedBytes), res.Chunks)
	if res.FreedPacks > 0 {
		local += fmt.Sprintf(", %d whole packs", res.FreedPacks)
	}
	switch {
	case res.Packs == 0:
		local += fmt.Sprintf(") of %d objects", res.Objects)
	case res.Objects == 0:
		local += fmt.Sprintf(") of %d packs", res.Packs)
	default:
		local += fmt.Sprintf(") of %d objects and %d packs", res.Objects, res.Packs)
	}
	r := res.CollectResult
	if r == (remote.CollectResult{}) {
		return "gc: " + local
	}
	sum := fmt.Sprintf("gc: local: %s; remote: %s %s (%d of %d chunk objects in the bucket", local, verb, formatBytes(r.FreedBytes), r.Freed, r.Objects)
	if r.Trashed > 0 {
		sum += fmt.Sprintf(", %d put in a trash list", r.Trashed)
	}
	return sum + ")"
}

// rawNote is the parenthesis after n chunks of stored bytes freed (or
// kept) here, raw the raw bytes gc knows of them. gc knows a chunk's raw
// size from its catalog row, which only chunks this store committed have:
// a copy fetched from the bucket, or an object a crash left that no commit
// named, has none, and counts 0 in raw. So raw is left out when it is 0 (no
// chunk of the n had a row), and on a writer of a remote (fetched copies
// may be among the n) it is said to count only those committed here.
func rawNote(n int, raw int64, remoteRan bool) string {
	switch {
	case n == 0:
		return ""
	case raw == 0 && remoteRan:
		return " (raw size not recorded: copies fetched from the bucket, or objects no commit named)"
	case raw == 0:
		return " (raw size not recorded: objects no commit named)"
	case remoteRan:
		return fmt.Sprintf(" (%s raw in the chunks committed here; copies fetched from the bucket not counted)", formatBytes(raw))
	}
	return fmt.Sprintf(" (%s raw)", formatBytes(raw))
}

// writeGCResult prints res on stdout, the local figures first, then the
// bucket's.
func writeGCResult(stdout io.Writer, res gc.Result, verb string, grace time.Duration) {
	r := res.CollectResult
	remoteRan := r != (remote.CollectResult{})
	local := ""
	if remoteRan {
		local = "local: "
	}
	fmt.Fprintf(stdout, "%s%s %d chunks, %s%s\n", local, verb, res.Chunks, formatBytes(res.FreedBytes), rawNote(res.Chunks, res.FreedRawBytes, remoteRan))
	fmt.Fprintf(stdout, "%sobjects %d, referenced %d, unreferenced %d (%d kept: younger than %v; %d in use by commits)\n",
		local, res.Objects, res.Marked, res.Unreferenced, res.Young, grace, res.Skipped)
	if res.BasesKept > 0 {
		// Their stored sizes come from the catalog's rows too.
		size := ", " + formatBytes(res.BasesKeptBytes) + rawNote(res.BasesKept, res.BasesKeptRawBytes, remoteRan)
		if res.BasesKeptBytes == 0 && remoteRan {
			size = " (sizes not recorded: copies fetched from the bucket)"
		}
		fmt.Fprintf(stdout, "%skept %d chunks no file names%s: bases of %d live deltas (freed with the last of them)\n",
			local, res.BasesKept, size, res.LiveDeltas)
	}
	if res.PackedChunks > 0 || res.FreedPacks > 0 || res.PackDeadBytes > 0 || res.YoungPacks > 0 {
		fmt.Fprintf(stdout, "%spacks: %s %d chunks in packs, %d whole packs (%s; %d no commit named: a crash's); dead chunks in live packs hold %s (freed with each pack's last chunk); %d uncommitted packs kept: younger than %v\n",
			local, verb, res.PackedChunks, res.FreedPacks, formatBytes(res.FreedPackBytes), res.OrphanPacks, formatBytes(res.PackDeadBytes), res.YoungPacks, grace)
	}
	if res.IndexRows > 0 || res.TempFiles > 0 {
		fmt.Fprintf(stdout, "%sindex rows without objects removed %d, temporary files removed %d\n", local, res.IndexRows, res.TempFiles)
	}
	if !remoteRan {
		return
	}
	fmt.Fprintf(stdout, "remote: %s %d of %d chunk objects in the bucket, %s (%d unreferenced kept: younger than %v)\n",
		verb, r.Freed, r.Objects, formatBytes(r.FreedBytes), r.Young, grace)
	if r.Purged > 0 {
		fmt.Fprintf(stdout, "remote: purged %d trash list(s) every live writer acknowledged (their chunks nothing names are in the count above)\n", r.Purged)
	}
	if r.Trashed > 0 {
		trashed := "put"
		if res.DryRun {
			trashed = "would put"
		}
		fmt.Fprintf(stdout, "remote: %s %d chunk objects, %s, in trash list %s (other writers are live): a gc after the grace period, once each live writer acknowledged it, deletes those still unused\n",
			trashed, r.Trashed, formatBytes(r.TrashedBytes), r.TrashList)
	}
	if r.Pending > 0 {
		fmt.Fprintf(stdout, "remote: %d trash list(s) younger than %v wait for a later gc\n", r.Pending, grace)
	}
}
