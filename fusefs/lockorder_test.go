package fusefs

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/fusefs/internal/lockorder"
)

// TestLockOrderChecked: built with ckptfs_lockorder (make test-go), the
// locks of FS and fileNode report an inversion of the documented order,
// and not the order itself.
func TestLockOrderChecked(t *testing.T) {
	if !lockorder.Enabled {
		t.Skip("built without the ckptfs_lockorder tag")
	}
	f := &FS{}
	origin, fork := &fileNode{}, &fileNode{}
	if v := lockorder.Catch(func() {
		origin.releaseMu.Lock()
		origin.commitMu.Lock()
		origin.mu.Lock()
		fork.mu.LockNested()
		f.nsMu.Lock()
		f.viewMu.Lock()
		origin.attrMu.Lock()
		origin.attrMu.Unlock()
		f.viewMu.Unlock()
		f.nsMu.Unlock()
		fork.mu.Unlock()
		origin.mu.Unlock()
		origin.commitMu.Unlock()
		origin.releaseMu.Unlock()
	}); len(v) != 0 {
		t.Fatalf("the documented lock order was reported:\n%s", v[0])
	}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"file.mu under nsMu", func() { f.nsMu.Lock(); origin.mu.Lock(); origin.mu.Unlock(); f.nsMu.Unlock() }},
		{"commitMu under file.mu", func() { origin.mu.RLock(); origin.commitMu.Lock(); origin.commitMu.Unlock(); origin.mu.RUnlock() }},
		{"nsMu under viewMu", func() { f.viewMu.RLock(); f.nsMu.Lock(); f.nsMu.Unlock(); f.viewMu.RUnlock() }},
		{"an origin's mu under its fork's", func() { fork.mu.Lock(); origin.mu.Lock(); origin.mu.Unlock(); fork.mu.Unlock() }},
	} {
		if v := lockorder.Catch(c.fn); len(v) != 1 {
			t.Errorf("%s: %d inversions reported, want 1", c.name, len(v))
		}
	}
}

// TestLockOrderInversionFailsTests: an inversion that no test expects
// fails the test binary (TestMain), even though the test that made it
// passes: the binary runs TestLockOrderInverted, which inverts nsMu and a
// file's mu, in a child process.
func TestLockOrderInversionFailsTests(t *testing.T) {
	if !lockorder.Enabled {
		t.Skip("built without the ckptfs_lockorder tag")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockOrderInverted$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CKPTFS_TEST_INVERT=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a run with an inversion passed:\n%s", out)
	}
	if !strings.Contains(string(out), "lock order inverted: file.mu taken while holding FS.nsMu") {
		t.Fatalf("a run with an inversion failed without naming it (%v):\n%s", err, out)
	}
}

// TestLockOrderInverted takes a file's mu under nsMu, against the order
// (only as TestLockOrderInversionFailsTests's child).
func TestLockOrderInverted(t *testing.T) {
	if os.Getenv("CKPTFS_TEST_INVERT") == "" {
		t.Skip("run by TestLockOrderInversionFailsTests")
	}
	f, n := &FS{}, &fileNode{}
	f.nsMu.Lock()
	n.mu.Lock()
	n.mu.Unlock()
	f.nsMu.Unlock()
}
