package test

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/cas/catalog"
)

// makeNewerStore creates a store whose catalog claims a format version from
// the future, by creating a store with the CLI and rewriting one key.
func makeNewerStore(t *testing.T, dir string) {
	t.Helper()
	if code, _, errOut := ckptfs(t, "mount", dir, filepath.Join(dir, "no-such-mountpoint")); code != 1 {
		t.Fatalf("expected the mount to fail: %s", errOut)
	}
	// The mount failed before creating anything; create the store offline.
	mnt := t.TempDir()
	d := startDaemon(t, dir, mnt)
	d.stop(syscall.SIGTERM)
	catalog.SetFormat(t, filepath.Join(dir, "catalog.db"), 99)
}
