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
	sum := fmt.Sprintf("gc: %s %s (%d chunks", verb, formatBytes(res.FreedBytes+res.CollectResult.FreedBytes), res.Chunks+res.CollectResult.Freed)
	if res.FreedPacks > 0 {
		sum += fmt.Sprintf(", %d whole packs", res.FreedPacks)
	}
	switch {
	case res.Packs == 0:
		sum += fmt.Sprintf(") of %d objects", res.Objects)
	case res.Objects == 0:
		sum += fmt.Sprintf(") of %d packs", res.Packs)
	default:
		sum += fmt.Sprintf(") of %d objects and %d packs", res.Objects, res.Packs)
	}
	bar.finish(sum + fmt.Sprintf(" in %.1fs", bar.elapsed().Seconds()))
	fmt.Fprintf(stdout, "%s %d chunks, %s (%s raw)\n", verb, res.Chunks, formatBytes(res.FreedBytes), formatBytes(res.FreedRawBytes))
	fmt.Fprintf(stdout, "objects %d, referenced %d, unreferenced %d (%d kept: younger than %v; %d in use by commits)\n",
		res.Objects, res.Marked, res.Unreferenced, res.Young, time.Duration(grace), res.Skipped)
	if res.BasesKept > 0 {
		fmt.Fprintf(stdout, "kept %d chunks no file names, %s (%s raw): bases of %d live deltas (freed with the last of them)\n",
			res.BasesKept, formatBytes(res.BasesKeptBytes), formatBytes(res.BasesKeptRawBytes), res.LiveDeltas)
	}
	if res.PackedChunks > 0 || res.FreedPacks > 0 || res.PackDeadBytes > 0 || res.YoungPacks > 0 {
		fmt.Fprintf(stdout, "packs: %s %d chunks in packs, %d whole packs (%s; %d no commit named: a crash's); dead chunks in live packs hold %s (freed with each pack's last chunk); %d uncommitted packs kept: younger than %v\n",
			verb, res.PackedChunks, res.FreedPacks, formatBytes(res.FreedPackBytes), res.OrphanPacks, formatBytes(res.PackDeadBytes), res.YoungPacks, time.Duration(grace))
	}
	if r := res.CollectResult; r != (remote.CollectResult{}) {
		fmt.Fprintf(stdout, "remote: %s %d of %d chunk objects, %s (%d unreferenced kept: younger than %v)\n",
			verb, r.Freed, r.Objects, formatBytes(r.FreedBytes), r.Young, time.Duration(grace))
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
			fmt.Fprintf(stdout, "remote: %d trash list(s) younger than %v wait for a later gc\n", r.Pending, time.Duration(grace))
		}
	}
	if res.IndexRows > 0 || res.TempFiles > 0 {
		fmt.Fprintf(stdout, "index rows without objects removed %d, temporary files removed %d\n", res.IndexRows, res.TempFiles)
	}
	return nil
}
