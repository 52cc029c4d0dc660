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
//
// When a process cannot be named (the daemon is out of file descriptors and
// cannot open /proc/<tid>/status, or the thread is gone) the rule errs toward
// committing: a close whose caller is unknown commits, and so does every
// close after a change or an open whose caller was unknown. A needless commit
// of a half-written file costs a version that the writer's own close
// replaces; a skipped one leaves close(2) reporting success for bytes that a
// later RELEASE may fail to commit where nobody sees it.
type handle struct {
	write   bool // opened for writing
	creator bool // made the file (O_CREAT), even read-only

	mu       sync.Mutex
	opener   int          // thread group that opened the description, or a caller constant
	changers map[int]bool // thread groups that changed the file through it
	unknown  bool         // a change came from a thread group that could not be named
	tgids    map[uint32]int
}

// Callers that are not a thread group (tgidLocked's results below 0).
const (
	unknownCaller = -1 // a process that could not be named
	kernelCaller  = -2 // the kernel itself (writeback of mmapped pages: pid 0), or no FUSE request
)

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
	switch tg := h.tgidLocked(ctx); {
	case tg >= 0:
		h.changers[tg] = true
	case tg == unknownCaller:
		h.unknown = true
	}
}

// commitsOnClose reports whether the caller's close through h commits the
// file. A reader's close never does: it could catch a writer half-way. When
// a caller involved cannot be named, it does (see handle).
func (h *handle) commitsOnClose(ctx context.Context) bool {
	if h == nil || (!h.write && !h.creator) {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tg := h.tgidLocked(ctx)
	switch {
	case tg == unknownCaller || h.unknown:
		return true
	case tg < 0:
		return false
	case len(h.changers) == 0:
		return h.opener == unknownCaller || tg == h.opener
	default:
		return h.changers[tg]
	}
}

// mayCommit reports whether releasing h may commit (it could write).
func (h *handle) mayCommit() bool { return h != nil && (h.write || h.creator) }

// tgidLocked returns the caller's thread group, or unknownCaller or
// kernelCaller (mu held).
func (h *handle) tgidLocked(ctx context.Context) int {
	c, ok := ctx.(*fuse.Context)
	if !ok || c.Pid == 0 {
		return kernelCaller
	}
	if tg, ok := h.tgids[c.Pid]; ok {
		return tg
	}
	tg := threadGroup(c.Pid)
	if tg >= 0 && len(h.tgids) < 64 { // an unknown one may be known next time
		h.tgids[c.Pid] = tg
	}
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
