package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/gc"
)

// errFaults makes fsck exit non-zero after printing what it found.
var errFaults = errors.New("faults found")

func runFsck(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	readData := fl.Bool("read-data", false, "decode every chunk and check its hash (reads the whole store)")
	asJSON := fl.Bool("json", false, "print JSON")
	remoteURL := fl.String("remote", "", "s3://BUCKET/PREFIX of an unmounted store: also check in the bucket the chunks the store does not hold (a mounted store checks its own remote)")
	pos, err := parseArgs(fl, args, 1)
	if err != nil {
		return err
	}
	t, err := resolveTarget(pos[0])
	if err != nil {
		return err
	}
	bar := newProgressBar(stderr)
	var res gc.FsckResult
	if t.socket != "" {
		err = callDaemon(ctx, t.socket, controlRequest{Op: "fsck", ReadData: *readData}, bar.update, &res)
	} else {
		var s *cas.Store
		opts := cas.Options{KeepSpool: true}
		var objects *tiered.Backend
		if *remoteURL != "" {
			if objects, err = openTiered(ctx, *remoteURL, t.storeDir, tiered.DefaultCacheSize, remoteOptions{}); err != nil {
				return err
			}
			opts.Objects = objects
		}
		s, err = openStore(t.storeDir, opts)
		if err != nil {
			if objects != nil {
				objects.Close()
			}
			return err
		}
		defer s.Close()
		fopts := gc.FsckOptions{ReadData: *readData, Progress: bar.update}
		if objects != nil {
			fopts.Remote = remote.New(s, objects)
		}
		res, err = gc.Fsck(ctx, s, fopts)
	}
	if err != nil {
		bar.finish("")
		return err
	}
	if *asJSON {
		bar.finish("")
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		bar.finish(fsckSummary(res, *readData, bar.latest(), bar.elapsed()))
		for _, p := range res.Problems {
			fmt.Fprintln(stdout, p)
		}
		for _, name := range res.SpoolLeftovers {
			fmt.Fprintf(stdout, "note: spool leftover %s (the next mount removes it)\n", name)
		}
		for _, n := range res.Notes {
			fmt.Fprintf(stdout, "note: %v\n", n)
		}
		if res.ReencodePending > 0 || res.ReencodeInFlight > 0 {
			fmt.Fprintf(stdout, "note: %d chunks stored raw wait for re-encoding (the mounted daemon does it when idle)", res.ReencodePending)
			if res.ReencodeInFlight > 0 {
				fmt.Fprintf(stdout, "; %d of them are re-encoded and await their index update (a re-encode under way, or one a crash interrupted: the next one finishes it)", res.ReencodeInFlight)
			}
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "checked %d files, %d directories, %d chunks", res.Files, res.Dirs, res.Chunks)
		if res.Bases > 0 {
			fmt.Fprintf(stdout, " and %d bases of their deltas", res.Bases)
		}
		if *readData {
			fmt.Fprintf(stdout, " (%d objects read and verified)", res.ObjectsRead)
		}
		fmt.Fprintf(stdout, "; %d unreferenced objects (ckptfs gc frees those of deleted files at once, and any no commit ever named once older than its --grace)", res.Unreferenced)
		if res.UnreferencedPacks > 0 {
			fmt.Fprintf(stdout, "; %d packs gc frees whole, %s (%d that no commit named: a crash's)", res.UnreferencedPacks, formatBytes(res.UnreferencedPackBytes), res.OrphanPacks)
		}
		fmt.Fprintf(stdout, "; %d problems\n", len(res.Problems))
	}
	if !res.OK() {
		return fmt.Errorf("%w: %d problems", errFaults, len(res.Problems))
	}
	return nil
}

// fsckSummary is fsck's line on stderr when that is not a terminal: what it
// checked, and with --read-data the bytes it read and verified and how fast
// (from the last progress of the "read" phase, whose Done is bytes).
func fsckSummary(res gc.FsckResult, readData bool, last gc.Progress, d time.Duration) string {
	s := fmt.Sprintf("fsck: checked %d files, %d chunks", res.Files, res.Chunks)
	if readData {
		s += fmt.Sprintf(", read and verified %d objects", res.ObjectsRead)
	}
	if readData && last.Phase == "read" && last.Bytes {
		s += ", " + formatRate(last.Done, d)
	} else {
		s += fmt.Sprintf(" in %.1fs", d.Seconds())
	}
	return s + fmt.Sprintf("; %d problems", len(res.Problems))
}
