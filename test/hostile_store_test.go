package test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestImportRefusesSymlinkInDest: a symlink already in the mount (an earlier
// import keeps the source's links verbatim) must not lead `ckptfs import`,
// which runs as root, to write outside the store. Nor may an absolute DEST be
// quietly re-rooted under the mount.
func TestImportRefusesSymlinkInDest(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	outside := t.TempDir() // a host directory the import must not touch
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "model.bin"), randBytes(1, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(src, "outside_link")); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, store, mnt)
	importJSON(t, mnt, src, "runs/imp1") // copies outside_link as a link
	if target, err := os.Readlink(filepath.Join(mnt, "runs/imp1/outside_link")); err != nil || target != outside {
		t.Fatalf("the imported link: %q %v", target, err)
	}

	for _, dest := range []string{"runs/imp1/outside_link/escaped", "runs/imp1/outside_link/a/b", "runs/imp1/outside_link"} {
		code, out, errOut := ckptfs(t, "import", mnt, src, dest)
		if code == 0 {
			t.Errorf("import to %s through a symlink succeeded: %s", dest, out)
		}
		if !strings.Contains(errOut, "symlink") && !strings.Contains(errOut, "exists") {
			t.Errorf("import to %s: unclear refusal %q", dest, errOut)
		}
		ents, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Fatalf("import to %s wrote %d entries outside the store (%s)", dest, len(ents), ents[0].Name())
		}
	}
	code, out, errOut := ckptfs(t, "import", mnt, src, filepath.Join(outside, "abs"))
	if code == 0 || !strings.Contains(errOut, "absolute") {
		t.Errorf("import to an absolute DEST: exit %d %s %s", code, out, errOut)
	}
	if _, err := os.Lstat(filepath.Join(mnt, strings.TrimPrefix(outside, "/"))); err == nil {
		t.Errorf("import to an absolute DEST created it under the mount")
	}
	d.stop(syscall.SIGTERM)
}
