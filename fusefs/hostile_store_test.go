package fusefs

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// TestWriteClearsSetID: a write by a caller without CAP_FSETID clears the
// setuid bit, and setgid on a group-executable file, as on ext4; root's
// write keeps them. The cleared mode is what stat shows at once and what
// the catalog keeps after a remount.
func TestWriteClearsSetID(t *testing.T) {
	m := newMount(t)
	cases := []struct {
		name       string
		mode, want os.FileMode
		fsuid      int
	}{
		{"suid-sgid-by-other", 0o6777, 0o0777, 1001},
		{"sgid-gx-by-other", 0o2777, 0o0777, 1001},
		{"sgid-no-gx-by-other", 0o2767, 0o2767, 1001}, // mandatory-locking marker: kept
		{"suid-by-root", 0o6777, 0o6777, 0},
		{"plain-by-other", 0o0777, 0o0777, 1001},
	}
	for _, c := range cases {
		p := m.path("runs/" + c.name)
		mustWrite(t, p, []byte("original content"))
		if err := os.Chmod(p, c.mode&os.ModePerm|goMode(c.mode)); err != nil {
			t.Fatal(err)
		}
		if got := statMode(t, p); got != uint32(c.mode) {
			t.Fatalf("%s: mode after chmod %o, want %o", c.name, got, c.mode)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$", p)
		cmd.Env = append(os.Environ(), "CKPTFS_TEST_CLIENT=write-fsuid", "CKPTFS_TEST_FSUID="+itoa(c.fsuid))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: writer: %v %s", c.name, err, out)
		}
		if got := statMode(t, p); got != uint32(c.want) {
			t.Errorf("%s: mode after the write %o, want %o", c.name, got, c.want)
		}
	}
	m.remount()
	for _, c := range cases {
		p := m.path("runs/" + c.name)
		if got := statMode(t, p); got != uint32(c.want) {
			t.Errorf("%s: mode after remount %o, want %o", c.name, got, c.want)
		}
		mustEqualFile(t, p, []byte("written"+"original content"[len("written"):]))
	}
}

func statMode(t *testing.T, p string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

// goMode turns the setuid/setgid bits of a Unix mode into os.FileMode's.
func goMode(m os.FileMode) os.FileMode {
	var g os.FileMode
	if m&0o4000 != 0 {
		g |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		g |= os.ModeSetgid
	}
	return g
}
