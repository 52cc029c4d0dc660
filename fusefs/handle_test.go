package fusefs

import (
	"context"
	"os"
	"testing"
	"time"

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
	// Each case asks /proc, then the file system's kept answers, shared by
	// every case as by every handle of a mount.
	var groups threadGroups
	for _, via := range []struct {
		name   string
		groups *threadGroups
	}{{"proc", nil}, {"kept", &groups}} {
		for _, c := range cases {
			t.Run(via.name+"/"+c.name, func(t *testing.T) {
				h := newHandle(c.opener, c.write, via.groups)
				if c.changer != nil {
					h.noteChange(c.changer)
				}
				if got := h.commitsOnClose(c.closer); got != c.want {
					t.Errorf("commitsOnClose = %v, want %v", got, c.want)
				}
			})
		}
	}
}

// TestThreadGroupsKept: an answer is kept for tgidFresh and asked again
// after it; an unknown caller is never kept; past tgidKept the stale
// answers go first.
func TestThreadGroupsKept(t *testing.T) {
	me := uint32(os.Getpid())
	const gone = 1 << 30 // above pid_max: /proc has no such entry
	now := time.Now()
	cases := []struct {
		name  string
		tid   uint32
		kept  *threadGroupAt // planted before asking
		want  int
		after bool // kept after asking
	}{
		{"asked, then kept", me, nil, os.Getpid(), true},
		{"a fresh answer is used", me, &threadGroupAt{tg: 42, at: now}, 42, true},
		{"a stale answer is asked again", me, &threadGroupAt{tg: 42, at: now.Add(-tgidFresh)}, os.Getpid(), true},
		{"unknown, not kept", gone, nil, unknownCaller, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var g threadGroups
			if c.kept != nil {
				g.m = map[uint32]threadGroupAt{c.tid: *c.kept}
			}
			if got := g.of(c.tid); got != c.want {
				t.Errorf("of(%d) = %d, want %d", c.tid, got, c.want)
			}
			if e, ok := g.m[c.tid]; ok != c.after || (ok && e.tg != c.want) {
				t.Errorf("kept %v (%+v), want kept %v with %d", ok, e, c.after, c.want)
			}
		})
	}
	t.Run("full", func(t *testing.T) {
		var g threadGroups
		g.m = map[uint32]threadGroupAt{}
		for i := range uint32(tgidKept) {
			at := now
			if i%2 == 0 {
				at = now.Add(-2 * tgidFresh)
			}
			g.m[gone+1+i] = threadGroupAt{tg: 7, at: at}
		}
		if got := g.of(me); got != os.Getpid() {
			t.Fatalf("of(me) = %d, want %d", got, os.Getpid())
		}
		if want := tgidKept/2 + 1; len(g.m) != want {
			t.Errorf("%d answers kept, want %d (the fresh half and the new one)", len(g.m), want)
		}
	})
}
