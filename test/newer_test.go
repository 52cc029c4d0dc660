package test

import (
	"encoding/binary"
	"path/filepath"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
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
	db, err := bolt.Open(filepath.Join(dir, "catalog.db"), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("format"), binary.BigEndian.AppendUint32(nil, 99))
	})
	if err != nil {
		t.Fatal(err)
	}
}
