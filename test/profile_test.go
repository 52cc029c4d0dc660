package test

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// TestProfilesWritten: CKPTFS_CPUPROFILE and CKPTFS_MEMPROFILE make the
// daemon write a CPU profile and an allocations profile at its unmount,
// each a gzipped pprof protobuf that names what was measured and the
// daemon's own functions (what `go tool pprof bin/ckptfs FILE` reads);
// CKPTFS_TRACE an execution trace (what `go tool trace` reads).
func TestProfilesWritten(t *testing.T) {
	dir := t.TempDir()
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cpu, mem := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "allocs.prof")
	tr := filepath.Join(dir, "trace.out")
	cmd := exec.Command(ckptfsBin, "mount", store, mnt)
	cmd.Env = append(os.Environ(), "CKPTFS_CPUPROFILE="+cpu, "CKPTFS_MEMPROFILE="+mem, "CKPTFS_TRACE="+tr)
	d, err := launch(t, cmd, store, mnt, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 { // something to allocate: commits of small files
		if err := os.WriteFile(filepath.Join(mnt, "f"+string(rune('a'+i%26))), randBytes(uint64(i), 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.stop(syscall.SIGTERM)
	// An execution trace starts with the header "go 1.N trace" and, for
	// 200 commits, holds far more than its header.
	if raw, err := os.ReadFile(tr); err != nil {
		t.Errorf("trace not written: %v", err)
	} else if !regexp.MustCompile(`^go 1\.[0-9]+ trace\x00`).Match(raw) || len(raw) < 4096 {
		t.Errorf("trace.out is not an execution trace: %d bytes starting %q", len(raw), raw[:min(len(raw), 16)])
	}
	for _, c := range []struct {
		path  string
		wants []string
	}{
		{cpu, []string{"cpu", "nanoseconds"}},
		{mem, []string{"alloc_space", "alloc_objects", "github.com/ckptfs/ckptfs/"}},
	} {
		raw, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatalf("profile not written: %v", err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("%s: not a gzipped profile: %v", c.path, err)
		}
		pb, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		for _, w := range c.wants {
			if !bytes.Contains(pb, []byte(w)) {
				t.Errorf("%s does not name %q", filepath.Base(c.path), w)
			}
		}
	}
}
