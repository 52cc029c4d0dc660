package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/test/s3test"
)

// TestRemoteCommitReadOnlyGC: with --commit=remote a close returns once the
// file is in the bucket (nothing is pending right after it, and a reading
// mount shows it without any ckptfs sync); a reading mount refuses writes;
// the writer's gc deletes from the bucket the chunks of a removed file and
// nothing a published file needs.
func TestRemoteCommitReadOnlyGC(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	url := srv.URL("seam")
	tmp := t.TempDir()
	dir := func(name string) string {
		p := filepath.Join(tmp, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mntA, mntB := dir("mntA"), dir("mntB")
	startDaemon(t, dir("storeA"), mntA, "--remote", url, "--commit=remote")
	one := randBytes(41, 6<<20)
	if err := os.WriteFile(filepath.Join(mntA, "one.bin"), one, 0o644); err != nil {
		t.Fatal(err)
	}
	st := statsJSON(t, mntA)
	if st["remote_pending_bytes"] != 0 || st["remote_uploaded_bytes"] < int64(len(one)) {
		t.Fatalf("right after a close with --commit=remote: pending %d, uploaded %d bytes (file %d)",
			st["remote_pending_bytes"], st["remote_uploaded_bytes"], len(one))
	}

	startDaemon(t, dir("storeB"), mntB, "--remote", url, "--read-only")
	if got, err := os.ReadFile(filepath.Join(mntB, "one.bin")); err != nil || !bytes.Equal(got, one) {
		t.Fatalf("one.bin on the reading mount, no sync called: %v", err)
	}
	err := os.WriteFile(filepath.Join(mntB, "new.bin"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("a write on the reading mount: %v, want EROFS", err)
	}

	// one.bin goes, two.bin comes; gc --grace 0 frees one.bin's chunks in
	// the bucket, and two.bin still reads from the bucket alone.
	if err := os.Remove(filepath.Join(mntA, "one.bin")); err != nil {
		t.Fatal(err)
	}
	two := randBytes(42, 3<<20)
	if err := os.WriteFile(filepath.Join(mntA, "two.bin"), two, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := ckptfs(t, "sync", mntA); code != 0 {
		t.Fatalf("sync: %s", errOut)
	}
	time.Sleep(1100 * time.Millisecond) // the server's LastModified has 1 s granularity
	code, out, errOut := ckptfs(t, "gc", "--grace", "0", "--json", mntA)
	if code != 0 {
		t.Fatalf("gc: %s %s", out, errOut)
	}
	var res struct {
		Freed  int `json:"remote_freed"`
		Remote int `json:"remote_objects"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("gc of the remote: freed %d of %d chunk objects", res.Freed, res.Remote)
	if res.Freed == 0 {
		t.Fatalf("gc freed %d chunk objects in the bucket, want one.bin's:\n%s", res.Freed, out)
	}
	waitRemoteFile(t, filepath.Join(mntB, "two.bin"))
	if got, err := os.ReadFile(filepath.Join(mntB, "two.bin")); err != nil || !bytes.Equal(got, two) {
		t.Fatalf("two.bin on the reading mount after the remote's gc: %v", err)
	}
}

// waitRemoteFile waits until a reading mount shows path (it refreshes from
// the bucket every 2 s).
func waitRemoteFile(t testing.TB, path string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear on the reading mount within 30 s", path)
		}
	}
}
