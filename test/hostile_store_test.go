package test

import (
	"bytes"
	"errors"
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

// TestDiskFullFreesFailedWrite: a save that fails with ENOSPC must not leave
// its chunks behind (no commit ever named them), or every later save fails
// too until someone runs `gc --grace 0s`. The store is on a 64 MiB tmpfs that
// other files fill to 20 MiB free; a 40 MiB save fails; the space it took is
// free again at once; after deleting 16 MiB of other files a 30 MiB save
// succeeds (no gc) and reads back byte-exact.
func TestDiskFullFreesFailedWrite(t *testing.T) {
	fsDir := t.TempDir()
	if err := syscall.Mount("tmpfs", fsDir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	defer syscall.Unmount(fsDir, syscall.MNT_DETACH)
	store, mnt := filepath.Join(fsDir, "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	kept := filepath.Join(mnt, "runs/kept.bin")
	if err := os.WriteFile(kept, randBytes(1, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(fsDir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	ballast1, ballast2 := filepath.Join(fsDir, "ballast1"), filepath.Join(fsDir, "ballast2")
	if err := os.WriteFile(ballast1, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ballast2, make([]byte, free()-20<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	before := free()
	err := os.WriteFile(filepath.Join(mnt, "runs/big.bin"), randBytes(2, 40<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		var st syscall.Statfs_t
		syscall.Statfs(filepath.Join(mnt, "runs"), &st)
		t.Fatalf("a 40 MiB save with %d MiB free: %v, want ENOSPC (now %d MiB free; mount fs type %#x)\n%s", before>>20, err, free()>>20, st.Type, d.stderr)
	}
	after := free()
	t.Logf("free before the failed save %.1f MiB, after %.1f MiB", float64(before)/(1<<20), float64(after)/(1<<20))
	if after < before-2<<20 {
		t.Errorf("the failed save left %.1f MiB behind", float64(before-after)/(1<<20))
	}
	if err := os.Remove(ballast1); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(mnt, "runs/again.bin")
	if err := os.WriteFile(again, randBytes(3, 30<<20), 0o644); err != nil {
		t.Fatalf("a 30 MiB save after freeing 16 MiB (%.1f MiB free): %v", float64(free())/(1<<20), err)
	}
	for p, want := range map[string][]byte{kept: randBytes(1, 2<<20), again: randBytes(3, 30<<20)} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %v, or its bytes differ", p, err)
		}
	}
	if code, out, errOut := ckptfs(t, "fsck", "--read-data", mnt); code != 0 {
		t.Fatalf("fsck: %s %s", out, errOut)
	}
	d.stop(syscall.SIGTERM)
}
