package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
)

// Memory sizing. Without --cache-size the daemon sizes its chunk cache from
// the memory it may use: the smallest memory limit of the cgroups it runs in
// (cgroup v2 memory.max, v1 memory.limit_in_bytes, each up the hierarchy) and
// physical memory. The cache gets a quarter of that, between minCacheSize and
// cas.DefaultCacheSize; the Go memory limit (which makes the collector run
// before the heap outgrows the budget) is the cache plus memoryOverhead, but
// at most three quarters of the budget, leaving the rest to what Go does not
// count (the kernel's page cache charged to the cgroup, thread stacks outside
// the runtime, the catalog's mapping). Under a 128 MiB cgroup the default
// 256 MiB cache made the daemon thrash and get OOM-killed reading a 1 GiB
// torch.save file lazily (issue #13); it now gets a 32 MiB cache and a 96 MiB
// Go limit. The memory that files being written hold in streams
// (fusefs.WithWriteMemory) is a quarter of the budget too, at most
// fusefs.DefaultWriteMemory: under 128 MiB one 24 MiB stream window (or a
// few 4 MiB ones of small files), further writers spool to disk instead of
// pushing the heap past the Go limit. --write-memory sets it (a machine
// where many large files are written at once: each stream of a large file
// holds about 24 MiB, and a spooled file is stored only
// at its close, two at a time); the Go limit grows by what it adds beyond
// the default, within the budget's three quarters as ever.
//
// The nodes the kernel may keep looked up (fusefs.WithNodeLimit; about 2 KiB
// of RSS each) get a sixteenth of the budget, between
// fusefs.DefaultNodeLimit and maxNodeLimit: 8,192 (16 MiB) under a 256 MiB
// cgroup or less, 16,384 from 512 MiB up. More lets a walk over more files
// than that go without looking the forgotten ones up again; the cap keeps
// the daemon's memory independent of the number of files in the store
// (16,384 nodes are about 32 MiB). --node-limit sets it (-1: never prune).

// maxNodeLimit is the largest node limit taken from the memory budget.
const maxNodeLimit = 2 * fusefs.DefaultNodeLimit

// nodeBytes is about what a looked-up node costs the daemon (fusefs/nodes.go).
const nodeBytes = 2 << 10

// minCacheSize is the smallest default cache: a few chunks per reader.
const minCacheSize = 16 << 20

// memBudget is the memory the daemon may use, and where that figure came from.
type memBudget struct {
	bytes  int64
	source string
}

// cgroupFS is where the cgroup files are read: the host's root, or a test's
// fake tree.
type cgroupFS struct {
	root string // "/" in production
}

func (c cgroupFS) open(p string) (*os.File, error) { return os.Open(filepath.Join(c.root, p)) }

// readLimit reads a memory limit file: "max" (v2) or a number; ok is false
// for no limit.
func (c cgroupFS) readLimit(p string) (int64, bool) {
	b, err := os.ReadFile(filepath.Join(c.root, p))
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" || s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	// v1 reports "no limit" as a page-rounded 2^63-1.
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}

// memoryBudget returns the smallest of physical memory (phys) and the memory
// limits of the cgroups the process belongs to, per /proc/self/cgroup and
// /proc/self/mountinfo under c.root.
func (c cgroupFS) memoryBudget(phys int64) memBudget {
	best := memBudget{phys, "physical memory"}
	mounts, err := c.cgroupMounts()
	if err != nil {
		return best
	}
	f, err := c.open("/proc/self/cgroup")
	if err != nil {
		return best
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var mnt, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			mnt, file = mounts.v2, "memory.max"
		case hasController(parts[1], "memory"):
			mnt, file = mounts.v1memory, "memory.limit_in_bytes"
		}
		if mnt == "" {
			continue
		}
		// The limit of every ancestor applies too.
		for p := path.Clean("/" + parts[2]); ; p = path.Dir(p) {
			f := path.Join(mnt, p, file)
			if n, ok := c.readLimit(f); ok && n < best.bytes {
				best = memBudget{n, f}
			}
			if p == "/" {
				break
			}
		}
	}
	return best
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// cgroupMounts holds where the cgroup v2 hierarchy and the v1 memory
// controller are mounted ("" if not).
type cgroupMounts struct{ v2, v1memory string }

func (c cgroupFS) cgroupMounts() (cgroupMounts, error) {
	f, err := c.open("/proc/self/mountinfo")
	if err != nil {
		return cgroupMounts{}, err
	}
	defer f.Close()
	return parseCgroupMounts(f)
}

// parseCgroupMounts reads mountinfo lines: "ID PARENT MAJ:MIN ROOT MOUNTPOINT
// OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS". A mount of a cgroup's
// subtree (ROOT not "/", as in some containers) is used only if it shows the
// root of the hierarchy.
func parseCgroupMounts(r io.Reader) (cgroupMounts, error) {
	var m cgroupMounts
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 || fields[3] != "/" {
			continue
		}
		mnt := unescapeMountinfo(fields[4])
		switch fstype, super := fields[sep+1], fields[sep+3]; {
		case fstype == "cgroup2" && m.v2 == "":
			m.v2 = mnt
		case fstype == "cgroup" && hasController(super, "memory") && m.v1memory == "":
			m.v1memory = mnt
		}
	}
	return m, sc.Err()
}

// physicalMemory returns the machine's RAM in bytes.
func physicalMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// memoryPlan is the cache size and Go memory limit for a mount.
type memoryPlan struct {
	cache, goLimit int64
	write          int64 // memory of streams (fusefs.WithWriteMemory)
	writeFlag      bool  // write came from --write-memory
	nodes          int   // node limit (fusefs.WithNodeLimit)
	budget         memBudget
	fromBudget     bool // the cache size came from the budget, not --cache-size
}

// planMemory sizes the cache (unless the user gave one, cacheSize > 0), the
// write memory (unless the user gave it, writeMem > 0), the node limit
// (unless the user gave one, nodeLimit != 0) and the Go memory limit from
// the budget.
func planMemory(cacheSize, writeMem int64, nodeLimit int, b memBudget) memoryPlan {
	p := memoryPlan{cache: cacheSize, nodes: nodeLimit, budget: b}
	if p.nodes == 0 {
		p.nodes = fusefs.DefaultNodeLimit
		if b.bytes > 0 {
			p.nodes = int(min(max(b.bytes/16/nodeBytes, fusefs.DefaultNodeLimit), maxNodeLimit))
		}
	}
	if p.cache <= 0 {
		p.fromBudget = true
		p.cache = cas.DefaultCacheSize
		if b.bytes > 0 {
			p.cache = min(max(b.bytes/4, minCacheSize), cas.DefaultCacheSize)
		}
	}
	p.write = fusefs.DefaultWriteMemory
	if b.bytes > 0 {
		p.write = min(p.write, b.bytes/4)
	}
	if writeMem > 0 {
		p.write, p.writeFlag = writeMem, true
	}
	p.goLimit = p.need()
	if b.bytes > 0 {
		p.goLimit = min(p.goLimit, b.bytes/4*3)
	}
	return p
}

// need is the heap the plan's cache and write memory take with the
// daemon's other needs (memoryOverhead counts the default write memory).
func (p memoryPlan) need() int64 {
	return p.cache + memoryOverhead + max(0, p.write-fusefs.DefaultWriteMemory)
}

func (p memoryPlan) String() string {
	how := "--cache-size"
	if p.fromBudget {
		how = "a quarter of the memory budget, at most " + fmtMiB(cas.DefaultCacheSize)
	}
	write := fmtMiB(p.write)
	if p.writeFlag {
		write += " (--write-memory)"
	}
	s := fmt.Sprintf("chunk cache %s (%s); memory budget %s (%s); Go memory limit %s; write memory %s; node limit %d",
		fmtMiB(p.cache), how, fmtMiB(p.budget.bytes), p.budget.source, fmtMiB(p.goLimit), write, p.nodes)
	if (!p.fromBudget || p.writeFlag) && p.need() > p.goLimit {
		s += fmt.Sprintf("; warning: the cache, the write memory and the daemon's other %s do not fit the budget", fmtMiB(memoryOverhead))
	}
	return s
}

func fmtMiB(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
