package main

import (
	"context"
	"fmt"
	"io"

	"github.com/ckptfs/ckptfs/gc"
)

// runSync asks the daemon of MOUNTPOINT for an upload round and waits for it:
// exit 0 means every file committed before the call is in the bucket.
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
	var res struct{}
	return callDaemon(ctx, t.socket, controlRequest{Op: "sync"}, func(gc.Progress) {}, &res)
}
