package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
)

// fakeCgroups writes files (path → content) under a temp root.
func fakeCgroups(t *testing.T, files map[string]string) cgroupFS {
	root := t.TempDir()
	for p, s := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cgroupFS{root: root}
}

const (
	hybridMounts = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	v2Mounts = `25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
`
	noLimitV1 = "9223372036854771712\n"
)

func TestMemoryBudget(t *testing.T) {
	const phys = 24 << 30
	tests := []struct {
		name   string
		files  map[string]string
		bytes  int64
		source string
	}{
		{"v1 hybrid, limit on own cgroup", map[string]string{
			"/proc/self/mountinfo":                            hybridMounts,
			"/proc/self/cgroup":                               "4:memory:/a/b\n0::/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes":     noLimitV1,
			"/sys/fs/cgroup/memory/a/memory.limit_in_bytes":   noLimitV1,
			"/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": "134217728\n",
			"/sys/fs/cgroup/unified/memory.max":               "max\n", // no memory controller there in practice
		}, 128 << 20, "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes"},
		{"v1, parent's limit is smaller", map[string]string{
			"/proc/self/mountinfo":                            hybridMounts,
			"/proc/self/cgroup":                               "4:memory:/a/b\n",
			"/sys/fs/cgroup/memory/a/memory.limit_in_bytes":   "536870912\n",
			"/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": "1073741824\n",
		}, 512 << 20, "/sys/fs/cgroup/memory/a/memory.limit_in_bytes"},
		{"v2", map[string]string{
			"/proc/self/mountinfo":                     v2Mounts,
			"/proc/self/cgroup":                        "0::/user.slice/job\n",
			"/sys/fs/cgroup/user.slice/memory.max":     "max\n",
			"/sys/fs/cgroup/user.slice/job/memory.max": "268435456\n",
		}, 256 << 20, "/sys/fs/cgroup/user.slice/job/memory.max"},
		{"no limit", map[string]string{
			"/proc/self/mountinfo":                        hybridMounts,
			"/proc/self/cgroup":                           "4:memory:/\n0::/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": noLimitV1,
		}, phys, "physical memory"},
		{"limit above RAM", map[string]string{
			"/proc/self/mountinfo":          v2Mounts,
			"/proc/self/cgroup":             "0::/big\n",
			"/sys/fs/cgroup/big/memory.max": "107374182400\n",
		}, phys, "physical memory"},
		{"no /proc", map[string]string{}, phys, "physical memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fakeCgroups(t, tt.files).memoryBudget(phys)
			if got.bytes != tt.bytes || got.source != tt.source {
				t.Fatalf("budget %d from %q, want %d from %q", got.bytes, got.source, tt.bytes, tt.source)
			}
		})
	}
}

func TestPlanMemory(t *testing.T) {
	tests := []struct {
		name                 string
		cacheFlag, budget    int64
		wantCache, wantLimit int64
		wantWrite            int64
		nodeFlag, wantNodes  int
	}{
		{"128 MiB cgroup", 0, 128 << 20, 32 << 20, 96 << 20, 32 << 20, 0, fusefs.DefaultNodeLimit},
		{"tiny cgroup: the cache floor", 0, 32 << 20, minCacheSize, 24 << 20, 8 << 20, 0, fusefs.DefaultNodeLimit},
		{"1 GiB cgroup: more nodes", 0, 1 << 30, cas.DefaultCacheSize, cas.DefaultCacheSize + memoryOverhead, fusefs.DefaultWriteMemory, 0, maxNodeLimit},
		{"big machine: the default cache, the node cap", 0, 24 << 30, cas.DefaultCacheSize, cas.DefaultCacheSize + memoryOverhead, fusefs.DefaultWriteMemory, 0, maxNodeLimit},
		{"flag wins over the budget", 64 << 20, 24 << 30, 64 << 20, 64<<20 + memoryOverhead, fusefs.DefaultWriteMemory, 50000, 50000},
		{"flag under a cgroup: the Go limit stays inside it", 256 << 20, 128 << 20, 256 << 20, 96 << 20, 32 << 20, -1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planMemory(tt.cacheFlag, 0, tt.nodeFlag, memBudget{tt.budget, "test"})
			if p.cache != tt.wantCache || p.goLimit != tt.wantLimit || p.write != tt.wantWrite || p.nodes != tt.wantNodes {
				t.Fatalf("cache %d, Go limit %d, write memory %d, nodes %d; want %d, %d, %d, %d",
					p.cache, p.goLimit, p.write, p.nodes, tt.wantCache, tt.wantLimit, tt.wantWrite, tt.wantNodes)
			}
		})
	}
}

// TestPlanWriteMemory: --write-memory replaces the budget's share, and the
// Go limit grows by what it adds beyond the default (still within three
// quarters of a budget), with a warning when the flags do not fit.
func TestPlanWriteMemory(t *testing.T) {
	tests := []struct {
		name                 string
		writeFlag, budget    int64
		wantWrite, wantLimit int64
		warn                 bool
	}{
		{"default", 0, 24 << 30, fusefs.DefaultWriteMemory, cas.DefaultCacheSize + memoryOverhead, false},
		{"more on a big machine", 512 << 20, 24 << 30, 512 << 20, cas.DefaultCacheSize + memoryOverhead + 512<<20 - fusefs.DefaultWriteMemory, false},
		{"less than the default", 32 << 20, 24 << 30, 32 << 20, cas.DefaultCacheSize + memoryOverhead, false},
		{"more than a 1 GiB cgroup holds", 1 << 30, 1 << 30, 1 << 30, 3 << 28, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planMemory(0, tt.writeFlag, 0, memBudget{tt.budget, "test"})
			if p.write != tt.wantWrite || p.goLimit != tt.wantLimit {
				t.Fatalf("write memory %d, Go limit %d; want %d, %d", p.write, p.goLimit, tt.wantWrite, tt.wantLimit)
			}
			s := p.String()
			if got := strings.Contains(s, "do not fit the budget"); got != tt.warn {
				t.Errorf("warning %v, want %v: %s", got, tt.warn, s)
			}
			if got := strings.Contains(s, "(--write-memory)"); got != (tt.writeFlag > 0) {
				t.Errorf("says --write-memory %v, want %v: %s", got, tt.writeFlag > 0, s)
			}
		})
	}
}
