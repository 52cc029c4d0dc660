package fsutil

import (
	"context"
	"fmt"
	"os"
)

// SyncDir fsyncs directory dir, making its entries (creates, renames,
// removals) durable; opening it waits for a descriptor (OpenRetry) under ctx.
func SyncDir(ctx context.Context, dir string) error {
	d, err := OpenRetry(ctx, func() (*os.File, error) { return os.Open(dir) })
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
