package fusefs

import (
	"context"
	"os"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestCommitsOnClose is the FLUSH rule of handle, with the callers it cannot
// name: a close that lies (returns 0, then the commit at RELEASE fails where
// nobody sees it) is worse than a needless commit, so an unknown caller
// commits.
func TestCommitsOnClose(t *testing.T) {
	caller := func(pid int) context.Context {
		return &fuse.Context{Caller: fuse.Caller{Pid: uint32(pid)}}
	}
	me, other := os.Getpid(), 1 // init: a process that exists and is not us
	const gone = 1 << 30        // above pid_max: /proc has no such entry
	if _, err := os.Stat("/proc/1/status"); err != nil {
		t.Fatalf("/proc/1/status: %v", err)
	}
	cases := []struct {
		name    string
		write   bool
		opener  context.Context
		changer context.Context // nil: no change through the handle
		closer  context.Context
		want    bool
	}{
		{"opener closes, nothing written", true, caller(me), nil, caller(me), true},
		{"another process closes, nothing written", true, caller(me), nil, caller(other), false},
		{"changer closes", true, caller(other), caller(me), caller(me), true},
		{"a forked child that did not write closes", true, caller(me), caller(me), caller(other), false},
		{"closer unknown", true, caller(me), caller(me), caller(gone), true},
		{"opener unknown, nothing written", true, caller(gone), nil, caller(other), true},
		{"changer unknown", true, caller(me), caller(gone), caller(other), true},
		{"kernel writeback changed it", true, caller(me), caller(0), caller(other), false},
		{"reader, closer unknown", false, caller(me), nil, caller(gone), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHandle(c.opener, c.write)
			if c.changer != nil {
				h.noteChange(c.changer)
			}
			if got := h.commitsOnClose(c.closer); got != c.want {
				t.Errorf("commitsOnClose = %v, want %v", got, c.want)
			}
		})
	}
}
