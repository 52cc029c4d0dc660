package test

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOrdinaryUserSpecialFiles: in a mount an ordinary user made through
// fusermount3, mkfifo and bind(2) of a UNIX socket work, and a device node
// is refused (mknod of a device needs CAP_MKNOD, which the kernel checks
// before ckptfs sees the request).
func TestOrdinaryUserSpecialFiles(t *testing.T) {
	alice := newTestUser(t, "a")
	home, bin := sharedDir(t, alice)
	store, mnt := filepath.Join(home, "store"), filepath.Join(home, "mnt")
	if code, _, errOut := alice.run(t, "mkdir", mnt); code != 0 {
		t.Fatal(errOut)
	}
	d := startUserDaemon(t, alice, bin, store, mnt)
	defer d.stop(syscall.SIGTERM)

	fifo, sock := filepath.Join(mnt, "fifo"), filepath.Join(mnt, "sock")
	if code, _, errOut := alice.run(t, "mkfifo", "-m", "0600", fifo); code != 0 {
		t.Fatalf("mkfifo: %s", errOut)
	}
	bind := `use IO::Socket::UNIX; IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => $ARGV[0], Listen => 1) or die "bind: $!\n"`
	if code, _, errOut := alice.run(t, "perl", "-e", bind, sock); code != 0 {
		t.Fatalf("bind: %s", errOut)
	}
	if code, _, _ := alice.run(t, "mknod", filepath.Join(mnt, "null"), "c", "1", "3"); code == 0 {
		t.Error("an ordinary user made a character device")
	}
	// Root cannot enter alice's mount: alice stats.
	for p, want := range map[string]string{fifo: "fifo", sock: "socket"} {
		code, out, errOut := alice.run(t, "stat", "-c", "%F %u", p)
		if code != 0 || out != fmt.Sprintf("%s %d\n", want, alice.uid) {
			t.Errorf("stat %s: %q %s, want %s owned by %d", p, out, errOut, want, alice.uid)
		}
	}
	if code, _, errOut := alice.run(t, "rm", fifo, sock); code != 0 {
		t.Fatalf("rm: %s", errOut)
	}
}
