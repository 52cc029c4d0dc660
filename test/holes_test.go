package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// sparseNumpy writes a 64 GiB float32 array with numpy's open_memmap (a
// write of its last byte, then a shared mapping) and stores a few values far
// apart; check reads it back with np.load(mmap_mode="r") and compares those
// values and zeros around them.
const sparseNumpy = `
import sys
import numpy as np
mode, path = sys.argv[1], sys.argv[2]
n = 16 << 30  # float32 elements: 64 GiB
at = [0, 12345678, n // 2 + 7, n - 1]
if mode == "write":
    a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n,))
    for i in at:
        a[i] = i + 0.5
    a.flush()
    del a
else:
    a = np.load(path, mmap_mode="r")
    assert a.shape == (n,) and a.dtype == np.float32, (a.shape, a.dtype)
    for i in at:
        assert a[i] == np.float32(i + 0.5), (i, a[i])
    for i in [1, 1 << 20, 3 << 30, n // 2, n - 2]:
        assert a[i] == 0, (i, a[i])
    assert not a[(1 << 30):(1 << 30) + (1 << 20)].any()
print("ok")
`

// TestSparseNumpyMemmap: numpy's open_memmap of a 64 GiB array into the
// mount, a few values stored, commits in a client process without writing
// or storing the zeros (the file is mostly a hole), and reads back after a
// restart. It used to cost about 1.3 s per GiB of extension.
func TestSparseNumpyMemmap(t *testing.T) {
	py := os.Getenv("CKPTFS_VENV")
	if py == "" {
		t.Fatal("CKPTFS_VENV is not set: numpy comes from the e2e venv")
	}
	py = filepath.Join(py, "bin", "python")
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	path := filepath.Join(mnt, "runs", "big.npy")
	run := func(mode string) {
		t.Helper()
		cmd := exec.Command(py, "-c", sparseNumpy, mode, path)
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(120 * time.Second): // a hang guard, not a timing assertion
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("numpy %s did not finish within 120 s: %s", mode, out)
		}
		if err != nil || string(out) != "ok\n" {
			t.Fatalf("numpy %s: %v: %s", mode, err, out)
		}
	}
	d := startDaemon(t, store, mnt)
	run("write")
	d.stop(syscall.SIGTERM)
	d = startDaemon(t, store, mnt)
	run("check")
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size < 64<<30 || st.Blocks*512 > 64<<20 {
		t.Errorf("size %d, %d bytes of blocks: want 64 GiB in no more than 64 MiB", st.Size, st.Blocks*512)
	}
	if out, err := exec.Command(ckptfsBin, "du", filepath.Dir(path)).CombinedOutput(); err != nil {
		t.Errorf("du: %v: %s", err, out)
	}
	d.stop(syscall.SIGTERM)
	// The store's own tools walk a manifest with holes: fsck finds nothing
	// wrong, gc frees nothing the file uses, and it still reads back.
	for _, args := range [][]string{{"fsck", store}, {"gc", "--grace", "0s", store}, {"fsck", store}} {
		if out, err := exec.Command(ckptfsBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("ckptfs %v: %v: %s", args, err, out)
		}
	}
	d = startDaemon(t, store, mnt)
	run("check")
	d.stop(syscall.SIGTERM)
	var stored int64
	err := filepath.Walk(filepath.Join(store, "objects"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			stored += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if stored > 64<<20 {
		t.Errorf("the store holds %d bytes of objects for a 64 GiB file of four values", stored)
	}
}
