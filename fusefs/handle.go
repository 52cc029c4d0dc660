package fusefs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// handle is an open file description.
//
// Which closes commit: the kernel sends FLUSH for every close(2) of a
// descriptor of the description, including the copies a forked child closes at
// exec (close-on-exec) or exit. A training process whose data-loader workers
// fork while it saves a checkpoint would otherwise commit the checkpoint
// half-written. So a FLUSH commits only when the closing process is one that
// changed the file through this handle, or, when nothing was changed through
// it, the process that opened it (touch, open(O_TRUNC) then close). Processes
// are told apart by thread-group id: FUSE gives the caller's thread id, and
// /proc/<tid>/status names its thread group.
type handle struct {
	write   bool // opened for writing
	creator bool // made the file (O_CREAT), even read-only

	mu       sync.Mutex
	opener   int          // thread group that opened the description (-1: unknown)
	changers map[int]bool // thread groups that changed the file through it
	tgids    map[uint32]int
}

func newHandle(ctx context.Context, write bool) *handle {
	h := &handle{write: write, changers: map[int]bool{}, tgids: map[uint32]int{}}
	h.opener = h.tgidLocked(ctx)
	return h
}

// noteChange records that the caller changed the file through h.
func (h *handle) noteChange(ctx context.Context) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if tg := h.tgidLocked(ctx); tg >= 0 {
		h.changers[tg] = true
	}
}

// commitsOnClose reports whether the caller's close through h commits the
// file. A reader's close never does: it could catch a writer half-way.
func (h *handle) commitsOnClose(ctx context.Context) bool {
	if h == nil || (!h.write && !h.creator) {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tg := h.tgidLocked(ctx)
	if tg < 0 {
		return false
	}
	if len(h.changers) == 0 {
		return tg == h.opener
	}
	return h.changers[tg]
}

// mayCommit reports whether releasing h may commit (it could write).
func (h *handle) mayCommit() bool { return h != nil && (h.write || h.creator) }

// tgidLocked returns the caller's thread group, or -1 (mu held).
func (h *handle) tgidLocked(ctx context.Context) int {
	c, ok := ctx.(*fuse.Context)
	if !ok || c.Pid == 0 {
		return -1
	}
	if tg, ok := h.tgids[c.Pid]; ok {
		return tg
	}
	tg := threadGroup(c.Pid)
	if len(h.tgids) < 64 {
		h.tgids[c.Pid] = tg
	}
	return tg
}

// threadGroup returns the thread group (process) id of thread tid, or -1.
func threadGroup(tid uint32) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Tgid:"); ok {
			tg, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return -1
			}
			return tg
		}
	}
	return -1
}
