package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/gc"
)

// TestProgressBar: on a terminal a burst of updates draws once, the next
// draw waits redrawEvery, and finish clears the line and writes no summary;
// elsewhere updates draw nothing and finish writes its summary, one line.
func TestProgressBar(t *testing.T) {
	pr := func(done int64) gc.Progress {
		return gc.Progress{Phase: "import", Done: done, Total: 100 << 20, Bytes: true}
	}
	for _, tc := range []struct {
		name     string
		terminal bool
		summary  string
		want     string // after finish, with \r\033[K written as |
	}{
		{"terminal", true, "import: copied", "|import [..............................] 1.00 MiB/100 MiB|import [##############################] 100 MiB/100 MiB|"},
		{"pipe", false, "import: copied", "import: copied\n"},
		{"pipe, --json", false, "", ""},
	} {
		var buf bytes.Buffer
		p := &progressBar{w: &buf, on: tc.terminal, began: time.Now()}
		for i := int64(1); i <= 100; i++ { // a burst: one draw
			p.update(pr(i << 20))
		}
		time.Sleep(redrawEvery)
		p.update(pr(100 << 20))
		if got := p.latest(); got != pr(100<<20) {
			t.Errorf("%s: latest %+v", tc.name, got)
		}
		p.finish(tc.summary)
		if got := strings.ReplaceAll(buf.String(), "\r\033[K", "|"); got != tc.want {
			t.Errorf("%s: wrote %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestProgressWaiting: waiting redraws its line with the time elapsed until
// stopped, on a terminal only.
func TestProgressWaiting(t *testing.T) {
	for _, terminal := range []bool{true, false} {
		var buf bytes.Buffer
		p := &progressBar{w: &buf, on: terminal, began: time.Now()}
		stop := p.waiting(context.Background(), "commit", "runs/a.bin (1.0 GiB)")
		time.Sleep(5*redrawEvery + redrawEvery/2)
		stop()
		n := strings.Count(buf.String(), "\r\033[Kcommit runs/a.bin (1.0 GiB)  ")
		after := buf.Len()
		time.Sleep(2 * redrawEvery)
		switch {
		case terminal && (n < 2 || n > 5):
			t.Errorf("terminal: %d redraws in 5.5 redraw periods: %q", n, buf.String())
		case !terminal && buf.Len() != 0:
			t.Errorf("not a terminal: wrote %q", buf.String())
		case buf.Len() != after:
			t.Errorf("drew after stop: %q", buf.String())
		}
	}
}

// TestThrottle: the daemon passes on the first and last progress of each
// phase, and no more than one per progressEvery in between.
func TestThrottle(t *testing.T) {
	var sent []gc.Progress
	send := throttle(func(p gc.Progress) { sent = append(sent, p) })
	for i := range int64(1000) {
		send(gc.Progress{Phase: "read", Done: i, Total: 1000})
	}
	send(gc.Progress{Phase: "read", Done: 1000, Total: 1000})
	send(gc.Progress{Phase: "sweep", Done: 0, Total: 10})
	send(gc.Progress{Phase: "sweep", Done: 5, Total: 10})
	time.Sleep(progressEvery)
	send(gc.Progress{Phase: "sweep", Done: 6, Total: 10})
	want := []gc.Progress{
		{Phase: "read", Done: 0, Total: 1000},
		{Phase: "read", Done: 1000, Total: 1000},
		{Phase: "sweep", Done: 0, Total: 10},
		{Phase: "sweep", Done: 6, Total: 10},
	}
	if len(sent) != len(want) {
		t.Fatalf("sent %+v, want %+v", sent, want)
	}
	for i := range want {
		if sent[i] != want[i] {
			t.Errorf("sent %+v, want %+v", sent, want)
			break
		}
	}
}

func TestFormatSync(t *testing.T) {
	for _, tc := range []struct {
		r    syncResult
		old  bool
		want string
	}{
		{syncResult{Remote: "s3://b/p", Chunks: 3, RawBytes: 300 << 20, SentBytes: 120 << 20, Present: 2, Seconds: 3},
			false, "uploaded 3 chunks, 300 MiB in 3.0s (100 MiB/s) to s3://b/p; 120 MiB sent; 2 chunks were there already"},
		{syncResult{Remote: "s3://b/p", Chunks: 1, RawBytes: 1 << 20, SentBytes: 1<<20 + 40, Seconds: 0.5},
			false, "uploaded 1 chunk, 1.00 MiB in 0.5s (2.00 MiB/s) to s3://b/p"},
		{syncResult{Remote: "s3://b/p", Present: 4, Seconds: 0.1},
			false, "uploaded 0 chunks, 0 B in 0.1s to s3://b/p; 4 chunks were there already"},
		{syncResult{Remote: "s3://b/p", Seconds: 0.1}, false, "nothing to upload: everything committed is in s3://b/p"},
		{syncResult{}, true, "synced: everything committed is in the bucket (the daemon, an older ckptfs, does not say what it uploaded)"},
	} {
		if got := formatSync(tc.r, tc.old); got != tc.want {
			t.Errorf("formatSync(%+v, %v) = %q, want %q", tc.r, tc.old, got, tc.want)
		}
	}
}
