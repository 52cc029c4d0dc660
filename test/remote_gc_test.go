package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRemoteGCBesideLiveWriter: ckptfs gc on a writer beside another live
// writer collects in two phases (cas/remote doc.go, step 8): the first run
// puts the chunks of a removed file into a trash list and deletes nothing;
// once the other writer's rounds acknowledged it, the next run purges it,
// deleting those chunks; every synced file still reads back from a fresh
// reader, and fsck --read-data is clean.
func TestRemoteGCBesideLiveWriter(t *testing.T) {
	e := newFaultEnv(t, "gc2")
	t.Setenv(leaseEnv, "4s")
	t.Setenv(refreshEnv, "500ms")
	_, mA := e.writer("A")
	_, mB := e.writer("B")
	gone, keep, other := randBytes(301, 2<<20), randBytes(302, 1<<20), randBytes(303, 1<<20)
	put(t, filepath.Join(mA, "gone.bin"), gone)
	put(t, filepath.Join(mA, "keep.bin"), keep)
	e.sync(mA)
	put(t, filepath.Join(mB, "other.bin"), other)
	e.sync(mB)
	if err := os.Remove(filepath.Join(mA, "gone.bin")); err != nil {
		t.Fatal(err)
	}
	e.sync(mA)
	e.sync(mB) // B has seen the removal

	code, out := gcGrace0(t, mA)
	if code != 0 {
		t.Fatalf("gc beside a live writer: exit %d: %s", code, out)
	}
	t.Logf("first gc:\n%s", out)
	trashed := regexp.MustCompile(`remote: put ([0-9]+) chunk objects, .* in trash list (\S+) `).FindStringSubmatch(out)
	if trashed == nil || trashed[1] == "0" {
		t.Fatalf("the first gc beside a live writer put nothing in the trash:\n%s", out)
	}
	if !strings.Contains(out, "remote: freed 0 of") {
		t.Fatalf("the first gc beside a live writer deleted chunks:\n%s", out)
	}

	// B's rounds (every 500 ms) acknowledge the list; the next gc purges it.
	var purged string
	for try := 0; ; try++ {
		code, out = gcGrace0(t, mA)
		if code == 0 {
			purged = out
			break
		}
		if try == 5 || !strings.Contains(out, "not acknowledged yet") && !collectionStopped(out) {
			t.Fatalf("the purge: exit %d: %s", code, out)
		}
		t.Logf("the purge waits: %s", strings.TrimSpace(out))
	}
	t.Logf("second gc:\n%s", purged)
	if !strings.Contains(purged, "remote: purged 1 trash list") {
		t.Fatalf("the second gc purged no trash list:\n%s", purged)
	}
	if freed := regexp.MustCompile(`remote: freed ([0-9]+) of`).FindStringSubmatch(purged); freed == nil || freed[1] == "0" {
		t.Fatalf("the purge freed no chunk object:\n%s", purged)
	}
	e.expect("R", map[string][]byte{"keep.bin": keep, "other.bin": other}, "gone.bin")
	for _, m := range []string{mA, mB} {
		if code, out, errOut := ckptfs(t, "fsck", "--read-data", m); code != 0 {
			t.Errorf("fsck --read-data %s: exit %d:\n%s%s", m, code, out, errOut)
		}
	}
}
