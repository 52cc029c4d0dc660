package test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refreshEnv sets the interval of every mount's rounds (cmd/ckptfs).
const refreshEnv = "CKPTFS_REMOTE_REFRESH"

// waitContent waits until path reads as want on a mount (nil want: until
// it is gone), and returns how long that took. Every read on the way must
// be a whole version: one of allowed, or absent.
func waitContent(t *testing.T, path string, want []byte, allowed ...[]byte) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got, err := os.ReadFile(path)
		switch {
		case want == nil && errors.Is(err, os.ErrNotExist):
			return time.Since(start)
		case err == nil && want != nil && bytes.Equal(got, want):
			return time.Since(start)
		case err == nil:
			ok := false
			for _, a := range append(allowed, want) {
				ok = ok || bytes.Equal(got, a)
			}
			if !ok {
				t.Fatalf("%s read %d bytes that are no version written", path, len(got))
			}
		case !errors.Is(err, os.ErrNotExist):
			t.Fatalf("%s: %v", path, err)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%s: not as wanted within 30 s", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRemoteMultiWriter: three writer mounts (three stores) and a reader on
// one prefix. Disjoint files reach every mount; one path written by two
// writers ends as one whole version everywhere; a rename and an unlink by
// one writer apply on every other mount, the reader's included, while they
// are mounted. It logs the propagation delay and the cost of a sync.
func TestRemoteMultiWriter(t *testing.T) {
	e := newFaultEnv(t, "multi")
	t.Setenv(refreshEnv, "500ms")
	t.Setenv(leaseEnv, "3s")
	var mnts []string
	var ds []*daemon
	for _, name := range []string{"W1", "W2", "W3"} {
		d, m := e.writer(name)
		mnts, ds = append(mnts, m), append(ds, d)
	}
	_, mR := e.reader("R")
	all := append(append([]string{}, mnts...), mR)

	// Disjoint files: each on every mount.
	data := make([][]byte, 3)
	var worst time.Duration
	for i, m := range mnts {
		data[i] = randBytes(uint64(200+i), (1+i)<<20)
		put(t, filepath.Join(m, name(i)), data[i])
		start := time.Now()
		e.sync(m)
		syncTook := time.Since(start)
		for _, other := range all {
			if d := waitContent(t, filepath.Join(other, name(i)), data[i]); d > worst {
				worst = d
			}
		}
		t.Logf("%s: sync %v", name(i), syncTook.Round(time.Millisecond))
	}
	t.Logf("propagation after a sync, worst of 3 files x 4 mounts: %v (refresh 500ms)", worst.Round(time.Millisecond))

	// One path from two writers: one whole version everywhere.
	va, vb := randBytes(210, 2<<20), randBytes(211, 2<<20)
	put(t, filepath.Join(mnts[0], "same.bin"), va)
	put(t, filepath.Join(mnts[1], "same.bin"), vb)
	codeA, msgA := syncMount(t, mnts[0], time.Minute)
	codeB, msgB := syncMount(t, mnts[1], time.Minute)
	t.Logf("syncs of one path: W1 exit %d %s; W2 exit %d %s", codeA, strings.TrimSpace(msgA), codeB, strings.TrimSpace(msgB))
	if codeA != 0 && !strings.Contains(msgA, "superseded") || codeB != 0 && !strings.Contains(msgB, "superseded") {
		t.Fatalf("a sync failed for another reason than a lost race")
	}
	var winner []byte
	deadline := time.Now().Add(30 * time.Second)
	for winner == nil {
		var seen [][]byte
		for _, m := range all {
			got, err := os.ReadFile(filepath.Join(m, "same.bin"))
			if errors.Is(err, os.ErrNotExist) {
				got = nil // not there yet
			} else if err != nil {
				t.Fatalf("same.bin on %s: %v", m, err)
			} else if !bytes.Equal(got, va) && !bytes.Equal(got, vb) {
				t.Fatalf("same.bin on %s is a mix of versions", m)
			}
			seen = append(seen, got)
		}
		agree := true
		for _, s := range seen[1:] {
			agree = agree && bytes.Equal(s, seen[0])
		}
		if agree && seen[0] != nil {
			winner = seen[0]
		} else if time.Now().After(deadline) {
			t.Fatal("the mounts do not agree on same.bin after 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("same.bin: W%d's version won on every mount", map[bool]int{true: 1, false: 2}[bytes.Equal(winner, va)])

	// W3 renames its file, W1 removes W2's: every mount follows.
	if err := os.Rename(filepath.Join(mnts[2], name(2)), filepath.Join(mnts[2], "final.bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnts[0], name(1))); err != nil {
		t.Fatal(err)
	}
	e.sync(mnts[2])
	e.sync(mnts[0])
	for _, m := range all {
		waitContent(t, filepath.Join(m, "final.bin"), data[2])
		waitContent(t, filepath.Join(m, name(2)), nil, data[2])
		waitContent(t, filepath.Join(m, name(1)), nil, data[1])
	}
	e.expect("fresh", map[string][]byte{name(0): data[0], "final.bin": data[2], "same.bin": winner}, name(1), name(2))

	// The cost of a sync of one small file with three writers live.
	var took []time.Duration
	for i := range 5 {
		put(t, filepath.Join(mnts[0], "small.txt"), []byte{byte(i)})
		start := time.Now()
		e.sync(mnts[0])
		took = append(took, time.Since(start))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("sync of a 1-byte file with 3 writers and a reader live: median %v of 5 (min %v, max %v)",
		took[2].Round(time.Millisecond), took[0].Round(time.Millisecond), took[4].Round(time.Millisecond))

	// W3 stopped past its lease: resumed, its old session publishes
	// nothing, its sync says why, and its next sync (a new session) does.
	if err := ds[2].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	late := randBytes(220, 1<<20)
	time.Sleep(4 * time.Second)
	if err := ds[2].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(mnts[2], "late.bin"), late)
	code, msg := syncMount(t, mnts[2], time.Minute)
	if code == 0 || !strings.Contains(msg, "lost the remote") {
		t.Fatalf("sync of a writer stopped past its lease: exit %d: %s", code, msg)
	}
	t.Logf("W3's sync after SIGCONT: %s", strings.TrimSpace(msg))
	e.sync(mnts[2])
	for _, m := range all {
		waitContent(t, filepath.Join(m, "late.bin"), late)
	}
}

func name(i int) string { return []string{"w1.bin", "w2.bin", "w3.bin"}[i] }

// TestRemoteRefreshOpenFile: a reading mount with a file open keeps
// reading the version it opened while a writer replaces it; the new
// version takes the path once the file is closed.
func TestRemoteRefreshOpenFile(t *testing.T) {
	e := newFaultEnv(t, "open")
	t.Setenv(refreshEnv, "300ms")
	_, mW := e.writer("W")
	_, mR := e.reader("R")
	v1, v2 := randBytes(230, 1<<20), randBytes(231, 3<<20)
	put(t, filepath.Join(mW, "f.bin"), v1)
	e.sync(mW)
	waitContent(t, filepath.Join(mR, "f.bin"), v1)
	fd, err := os.Open(filepath.Join(mR, "f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(mW, "f.bin"), v2)
	e.sync(mW)
	time.Sleep(1500 * time.Millisecond) // several refreshes
	got := make([]byte, len(v1)+1)
	n, err := fd.ReadAt(got, 0)
	if n != len(v1) || !bytes.Equal(got[:n], v1) {
		t.Fatalf("the open file read %d bytes (%v), not the version it opened", n, err)
	}
	fd.Close()
	d := waitContent(t, filepath.Join(mR, "f.bin"), v2, v1)
	t.Logf("the new version took the path %v after the close", d.Round(time.Millisecond))
}
