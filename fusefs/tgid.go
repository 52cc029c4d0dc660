package fusefs

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// threadGroups names the thread group (process) of the threads that send
// FUSE requests, for the FLUSH rule of handle. FUSE gives the caller's
// thread id; /proc/<tid>/status names its thread group, at the price of an
// open, a read of a page the kernel formats, and a close: about 5 % of the
// daemon's CPU when 8 writers create small files, each create asking for
// its opener once. The answers are kept for tgidFresh, across handles.
//
// Why a kept answer stays right: a thread id names another thread only
// after its thread has exited and the kernel has handed the id out again,
// and Linux hands ids out in turn up to pid_max (at least 32768), so that
// needs at least that many threads made in between. An answer younger than
// tgidFresh is wrong only if a machine made that many in under that time;
// a handle already keeps the answers it got for its whole life (it asks
// once per caller), which this does not lengthen. Unknown callers (no
// /proc entry, no descriptor left) are never kept: they are asked again.
type threadGroups struct {
	mu sync.Mutex
	m  map[uint32]threadGroupAt
}

type threadGroupAt struct {
	tg int
	at time.Time
}

const (
	tgidFresh = time.Second
	tgidKept  = 4096 // answers kept at most; past it the stale ones go, or all
)

// of returns the thread group of tid, or unknownCaller. A nil c asks /proc
// each time.
func (c *threadGroups) of(tid uint32) int {
	if c == nil {
		return threadGroup(tid)
	}
	now := time.Now()
	c.mu.Lock()
	e, ok := c.m[tid]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < tgidFresh {
		return e.tg
	}
	tg := threadGroup(tid)
	if tg < 0 {
		return tg
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[uint32]threadGroupAt)
	}
	if len(c.m) >= tgidKept {
		for k, e := range c.m {
			if now.Sub(e.at) >= tgidFresh {
				delete(c.m, k)
			}
		}
		if len(c.m) >= tgidKept {
			clear(c.m)
		}
	}
	c.m[tid] = threadGroupAt{tg, now}
	return tg
}

// threadGroup returns the thread group (process) id of thread tid, or
// unknownCaller.
func threadGroup(tid uint32) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return unknownCaller
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Tgid:"); ok {
			tg, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return unknownCaller
			}
			return tg
		}
	}
	return unknownCaller
}
