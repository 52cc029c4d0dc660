package fusefs

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// TestOpenAfterRemoteRemoval: a refresh (ApplyRemote) removes or replaces a
// file whose entry the kernel still caches until the refresh's notification
// reaches it; an OPEN in that window comes to the detached node, whose
// catalog record is gone. It must answer ESTALE, on which the kernel looks
// the name up again and opens what the catalog holds now, not EIO (before:
// the missing manifest read as a damaged catalog; a writer's open with
// O_TRUNC failed so in TestRemoteRandomFaults, seed 29).
func TestOpenAfterRemoteRemoval(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/a.bin")
	if err := os.WriteFile(p, randBytes(5, 70000), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	in := m.fsys.treeNode("runs/a.bin")
	if in == nil {
		t.Fatal("runs/a.bin is not in the tree after a stat")
	}
	n, ok := in.Operations().(*fileNode)
	if !ok {
		t.Fatalf("runs/a.bin is a %T", in.Operations())
	}
	// close(2) returns before the kernel's RELEASE reaches the daemon: the
	// node stays pinned (its handle open) until then.
	waitFor(t, 10*time.Second, time.Millisecond, func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.settled()
	}, func() string {
		return "runs/a.bin still has state beyond the catalog 10 s after its close (no RELEASE?)"
	})
	n.mu.Lock()
	n.manifest = nil // not open: a node holds no manifest once closed
	n.mu.Unlock()
	ctx := context.Background()
	err := m.fsys.ApplyRemote(ctx, []string{"runs/a.bin"}, func(busy func(string) bool) ([]string, error) {
		if busy("runs/a.bin") {
			t.Fatal("runs/a.bin is busy though closed")
		}
		return []string{"runs/a.bin"}, m.cas.Update(func(tx *cas.Tx) error {
			dir, _ := lookupPath(tx, "runs")
			ino, _ := tx.Lookup(dir, "a.bin")
			if err := tx.Unlink(dir, "a.bin"); err != nil {
				return err
			}
			return tx.DeleteNode(ino)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, flags := range []uint32{syscall.O_RDONLY, syscall.O_WRONLY | syscall.O_TRUNC} {
		if _, _, errno := n.Open(ctx, flags); !errors.Is(errno, syscall.ESTALE) {
			t.Errorf("open(%#x) of the node a refresh removed: %v, want ESTALE", flags, errno)
		}
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat after the refresh: %v, want ENOENT", err)
	}
}

// TestRefreshKeepsOtherLinks: a refresh that removes or replaces one name of
// a file with hard links (cas/remote drops that link only) leaves the node
// its other names: writes through them are committed. The node used to be
// detached as a file with no name, so they never were, and were gone at
// the next mount.
func TestRefreshKeepsOtherLinks(t *testing.T) {
	m, p, q := refreshedLink(t)
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of the removed name: %v, want ENOENT", err)
	}
	if st := statOf(t, q); st.Nlink != 1 {
		t.Errorf("the name left has %d links, want 1", st.Nlink)
	}
	if err := os.WriteFile(q, []byte("new through q"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.remount()
	if got, err := os.ReadFile(q); err != nil || string(got) != "new through q" {
		t.Errorf("after a remount q reads %q (%v), want what was written through it", got, err)
	}
}

// TestRefreshDropsTheKnownName: a refresh that removes the name a
// hard-linked file knows itself by (the one it was created under) leaves it
// knowing none: a later fork of it, through its other name beside a reader,
// must not commit under the removed one (it did: the removed name came back
// with the new bytes, the other kept the old, and after a remount it named
// a missing node).
func TestRefreshDropsTheKnownName(t *testing.T) {
	m, p, q := refreshedLink(t)
	r, err := os.Open(q)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(q, []byte("new through q"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.Close()
	for _, when := range []string{"mounted", "remounted"} {
		if got, err := os.ReadFile(q); err != nil || string(got) != "new through q" {
			t.Errorf("%s: q reads %q (%v), want what was written through it", when, got, err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: stat of the removed name: %v, want ENOENT", when, err)
		}
		if when == "mounted" {
			m.remount()
		}
	}
}

// refreshedLink mounts a store holding runs/p with a hard link runs/q, both
// looked up and settled, and applies a refresh that removes runs/p (as
// cas/remote does: that link only). It returns the mount and both paths.
func refreshedLink(t *testing.T) (m *testMount, p, q string) {
	t.Helper()
	m = newMount(t)
	p, q = m.path("runs/p"), m.path("runs/q")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p, q); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p, q} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	n := m.fsys.treeNode("runs/q").Operations().(*fileNode)
	waitFor(t, 10*time.Second, time.Millisecond, func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.settled()
	}, func() string { return "runs/q still has state beyond the catalog 10 s after its close" })
	err := m.fsys.ApplyRemote(context.Background(), []string{"runs/p"}, func(busy func(string) bool) ([]string, error) {
		return []string{"runs/p"}, m.cas.Update(func(tx *cas.Tx) error {
			dir, _ := lookupPath(tx, "runs")
			ino, _ := tx.Lookup(dir, "p")
			if err := tx.Unlink(dir, "p"); err != nil {
				return err
			}
			_, err := tx.DropLink(ino, time.Now().UnixNano())
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, p, q
}
