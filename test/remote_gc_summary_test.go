package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRemoteGCSummary: ckptfs gc on a writer of a remote store, whose local
// objects are copies it fetched from the bucket, reports this machine's
// figures and the bucket's apart, on stdout and in the one-line summary on
// stderr (which used to add the bucket's freed bytes and chunks to the
// local ones and then say "of N objects", the local count), and prints no
// raw size it does not know: a fetched copy has no catalog row, so its raw
// size is not recorded (it used to print "(0 B raw)").
func TestRemoteGCSummary(t *testing.T) {
	e := newFaultEnv(t, "summary")
	t.Setenv(refreshEnv, "500ms")
	a, mA := e.writer("A")
	gone, keep := randBytes(401, 3<<20), randBytes(402, 1<<20)
	put(t, filepath.Join(mA, "gone.bin"), gone)
	put(t, filepath.Join(mA, "keep.bin"), keep)
	e.sync(mA)

	// B fetches both files' chunks into its store.
	_, mB := e.writer("B")
	for _, p := range []string{"gone.bin", "keep.bin"} {
		waitRemoteFile(t, filepath.Join(mB, p))
		if _, err := os.ReadFile(filepath.Join(mB, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(mA, "gone.bin")); err != nil {
		t.Fatal(err)
	}
	e.sync(mA)
	a.stop(syscall.SIGTERM) // B alone: its gc deletes in the bucket at once
	e.sync(mB)              // B applied the removal
	if _, err := os.Lstat(filepath.Join(mB, "gone.bin")); err == nil {
		t.Fatal("gone.bin is still on B after its sync")
	}

	time.Sleep(1100 * time.Millisecond) // the server's 1 s mtimes
	code, out, errOut := ckptfs(t, "gc", "--grace", "0", mB)
	if code != 0 {
		t.Fatalf("gc: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("stdout:\n%sstderr:\n%s", out, errOut)
	if strings.Contains(out+errOut, "0 B raw") {
		t.Errorf("gc prints a raw size of 0 B for objects whose raw size it does not know:\n%s%s", out, errOut)
	}
	local := regexp.MustCompile(`(?m)^local: freed ([0-9]+) chunks, ([0-9.]+ [KMG]?i?B) \(raw size not recorded: copies fetched from the bucket, or objects no commit named\)$`).FindStringSubmatch(out)
	if local == nil || local[1] == "0" {
		t.Fatalf("stdout has no line of the local objects freed (B's fetched copies of gone.bin), labelled local, without a raw size:\n%s", out)
	}
	bucket := regexp.MustCompile(`(?m)^remote: freed ([0-9]+) of ([0-9]+) chunk objects in the bucket, ([0-9.]+ [KMG]?i?B) `).FindStringSubmatch(out)
	if bucket == nil || bucket[1] == "0" {
		t.Fatalf("stdout has no line of the bucket's chunk objects freed (gone.bin's):\n%s", out)
	}
	objects := regexp.MustCompile(`(?m)^local: objects ([0-9]+),`).FindStringSubmatch(out)
	if objects == nil {
		t.Fatalf("stdout has no count of the local objects, labelled local:\n%s", out)
	}
	// The summary: the same figures, each under its own name.
	want := `^gc: local: freed ` + regexp.QuoteMeta(local[2]) + ` \(` + local[1] + ` chunks\) of ` + objects[1] + ` objects; ` +
		`remote: freed ` + regexp.QuoteMeta(bucket[3]) + ` \(` + bucket[1] + ` of ` + bucket[2] + ` chunk objects in the bucket\) in [0-9.]+s\n$`
	if !regexp.MustCompile(want).MatchString(errOut) {
		t.Errorf("stderr %q, want one line matching %q", errOut, want)
	}
}
