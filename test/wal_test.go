package test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
)

// TestCatalogLog: the catalog's write-ahead log (cas/catalog/wal.go) as a
// user meets it. A daemon keeps catalog.wal beside catalog.db while it
// serves, also when limited in address space (ulimit -v: the log's fixed
// mapping is cut to fit); a clean unmount removes it; a daemon killed with
// files committed leaves it, and what opens the store next, a read-only
// `ckptfs stats` included, recovers every committed file from it.
func TestCatalogLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap []string
	}{
		{"unlimited", nil},
		{"ulimit -v 6 GiB", []string{"prlimit", fmt.Sprintf("--as=%d", 6<<30), "--"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
			logPath := filepath.Join(store, "catalog.wal")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			want := map[string][]byte{}
			write := func(name string, n int) {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				p := filepath.Join(mnt, "runs", name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, b, 0o644); err != nil {
					t.Fatal(err)
				}
				want[name] = b
			}
			check := func(when string) {
				for name, b := range want {
					got, err := os.ReadFile(filepath.Join(mnt, "runs", name))
					if err != nil || !bytes.Equal(got, b) {
						t.Fatalf("%s: runs/%s: %d bytes, %v; want the %d written", when, name, len(got), err, len(b))
					}
				}
			}

			d := startDaemonUnder(t, tc.wrap, store, mnt)
			for i := range 40 {
				write(fmt.Sprintf("step%d/rank%d.bin", i/8, i%8), 4096)
			}
			write("big.bin", 12<<20)
			if _, err := os.Stat(logPath); err != nil {
				t.Fatalf("no log beside the catalog of a serving daemon: %v", err)
			}
			d.stop(syscall.SIGTERM)
			if _, err := os.Stat(logPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the log is still there after a clean unmount: %v", err)
			}

			d = startDaemonUnder(t, tc.wrap, store, mnt)
			check("after a clean unmount")
			for i := range 40 {
				write(fmt.Sprintf("after/rank%d.bin", i), 1000+i)
			}
			d.kill()
			if _, err := os.Stat(logPath); err != nil {
				t.Fatalf("a killed daemon left no log: %v", err)
			}
			// A reader recovers first (as ext4 replays its journal on a
			// read-only mount).
			out, err := exec.Command(ckptfsBin, "stats", store).CombinedOutput()
			if err != nil {
				t.Fatalf("ckptfs stats after a kill: %v\n%s", err, out)
			}
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^files +%d$`, len(want))).Match(out) {
				t.Fatalf("ckptfs stats after the kill does not count the %d files committed:\n%s", len(want), out)
			}
			if _, err := os.Stat(logPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the log is still there after a reader recovered the store: %v", err)
			}
			d = startDaemonUnder(t, tc.wrap, store, mnt)
			check("after a kill and a reader's recovery")
			d.stop(syscall.SIGTERM)
			if out, err := exec.Command(ckptfsBin, "fsck", store).CombinedOutput(); err != nil {
				t.Fatalf("fsck: %v\n%s", err, out)
			}
		})
	}
}
