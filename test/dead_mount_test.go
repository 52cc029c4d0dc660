package test

// What gc, fsck, stats and du say of a path they cannot use: a mount whose
// daemon was killed, a store or mount of another user, the mount's own
// .ckptfs directory.

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDeadMountSaysTheDaemonIsGone: after kill -9 of the daemon its mount
// stays, answering ENOTCONN; the commands say so and what to do (mount again,
// unmount, or give the store), not "neither a mountpoint nor a store". The
// store then works unmounted, and mounting again clears the dead mount.
func TestDeadMountSaysTheDaemonIsGone(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "runs", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := ckptfs(t, "du", filepath.Join(mnt, ".ckptfs")); code != 1 || !strings.Contains(errOut, "control directory") || strings.Contains(errOut, "inode") {
		t.Errorf("du .ckptfs: exit %d: %q", code, errOut)
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.done <- <-d.done
	if !mounted(t, mnt) {
		t.Fatalf("%s is not mounted after kill -9 of its daemon", mnt)
	}
	for _, args := range [][]string{
		{"gc", mnt}, {"fsck", mnt}, {"stats", mnt}, {"du", filepath.Join(mnt, "runs")}, {"du", mnt}, {"gc", filepath.Join(mnt, "runs")},
	} {
		code, _, errOut := ckptfs(t, args...)
		want := []string{"daemon of this mount is gone", "not connected", "ckptfs mount " + store + " " + mnt, "umount " + mnt}
		if args[0] != "du" {
			want = append(want, "store directory, "+store)
		}
		if code != 1 || strings.Contains(errOut, "neither") || strings.Contains(errOut, "not in a ckptfs mount") {
			t.Errorf("ckptfs %s: exit %d: %q", strings.Join(args, " "), code, errOut)
			continue
		}
		for _, w := range want {
			if !strings.Contains(errOut, w) {
				t.Errorf("ckptfs %s: %q lacks %q", strings.Join(args, " "), errOut, w)
			}
		}
	}
	if code, _, errOut := ckptfs(t, "stats", store); code != 0 {
		t.Errorf("stats of the dead mount's store: exit %d: %s", code, errOut)
	}
	startDaemon(t, store, mnt) // clears the dead mount
	if data, err := os.ReadFile(filepath.Join(mnt, "runs", "f")); err != nil || string(data) != "x" {
		t.Errorf("after mounting again: %q, %v", data, err)
	}
}

// TestOtherUsersStoreIsPermissionDenied: an ordinary user given root's store
// (0700) or root's mount (no --allow-other) is told permission denied and
// whose it is, not that the store is not one, nor an error about
// .ckptfs/stats.json inside it.
func TestOtherUsersStoreIsPermissionDenied(t *testing.T) {
	u := newTestUser(t, "p")
	home, bin := sharedDir(t, u)
	dir := filepath.Dir(home) // root's, 0755
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, store, mnt)
	check := func(want string, args ...string) {
		t.Helper()
		code, _, errOut := u.run(t, bin, args...)
		if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, want) ||
			strings.Contains(errOut, "neither") || strings.Contains(errOut, "stats.json") {
			t.Errorf("%s as %s: exit %d: %q; want permission denied, %q", strings.Join(args, " "), u.name, code, errOut, want)
		}
	}
	for _, c := range []string{"stats", "gc", "fsck"} {
		check("it is the ckptfs mount of root", c, mnt)
	}
	check("it is in the ckptfs mount at "+mnt+" of root", "du", filepath.Join(mnt, "runs"))
	d.stop(syscall.SIGTERM)
	for _, c := range []string{"stats", "gc", "fsck"} {
		check(store+": permission denied: it belongs to root (mode 0700", c, store)
	}
}
