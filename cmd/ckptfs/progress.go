package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/gc"
	"golang.org/x/sys/unix"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// redrawEvery is the shortest time between two redraws of a progress bar.
const redrawEvery = 250 * time.Millisecond

// progressBar reports a long command's progress on w (stderr): on a
// terminal, one line (formatProgress) redrawn at most every redrawEvery and
// cleared by finish; on anything else (a log, a pipe) nothing until finish,
// which writes one summary line. update may be called from any goroutine, as
// often as the work likes.
type progressBar struct {
	w     io.Writer
	on    bool      // w is a terminal
	began time.Time // for elapsed

	mu    sync.Mutex
	last  time.Time   // of the last redraw
	drew  bool        // the line holds a bar
	start time.Time   // when the latest update's phase began, for its rate and ETA
	final gc.Progress // the latest update, drawn or not
}

func newProgressBar(w io.Writer) *progressBar {
	return &progressBar{w: w, on: isTerminal(w), began: time.Now()}
}

func (p *progressBar) update(pr gc.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if pr.Phase != p.final.Phase {
		p.start = now
	}
	p.final = pr
	if !p.on || now.Sub(p.last) < redrawEvery {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, "\r\033[K%s", formatProgress(pr, now.Sub(p.start)))
	p.drew = true
}

// waiting draws, until stop is called or ctx ends, "PHASE WHAT ELAPSED"
// redrawn every redrawEvery: for a call that blocks with no progress to
// report (an fsync), so that the line does not sit still. Updates meanwhile
// are kept but not drawn.
func (p *progressBar) waiting(ctx context.Context, phase, what string) (stop func()) {
	if !p.on {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		t := time.NewTicker(redrawEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p.mu.Lock()
			fmt.Fprintf(p.w, "\r\033[K%-6s %s  %s", phase, what, formatETA(time.Since(start)))
			p.drew = true
			p.last = time.Now()
			p.mu.Unlock()
		}
	})
	return func() { cancel(); wg.Wait() }
}

// latest returns the last update, drawn or not.
func (p *progressBar) latest() gc.Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.final
}

// elapsed is the time since the bar was made.
func (p *progressBar) elapsed() time.Duration { return time.Since(p.began) }

// formatProgress is one line of the bar: the phase, a bar when the total is
// known, done/total in human units (bytes as KiB/MiB/GiB when pr.Bytes), the
// rate over elapsed, and the time left at that rate.
func formatProgress(pr gc.Progress, elapsed time.Duration) string {
	amount := func(n int64) string {
		if pr.Bytes {
			return formatBytes(n)
		}
		return humanCount(float64(n))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s ", pr.Phase)
	if pr.Total > 0 {
		const width = 30
		fill := int(float64(width) * float64(pr.Done) / float64(pr.Total))
		fill = max(0, min(width, fill))
		fmt.Fprintf(&b, "[%s%s] %s/%s", strings.Repeat("#", fill), strings.Repeat(".", width-fill), amount(pr.Done), amount(pr.Total))
	} else {
		b.WriteString(amount(pr.Done))
	}
	if elapsed >= 500*time.Millisecond && pr.Done > 0 {
		rate := float64(pr.Done) / elapsed.Seconds()
		if pr.Bytes {
			fmt.Fprintf(&b, "  %s/s", formatBytes(int64(rate)))
		} else {
			fmt.Fprintf(&b, "  %s/s", humanCount(rate))
		}
		if pr.Total > pr.Done {
			left := time.Duration(float64(pr.Total-pr.Done) / rate * float64(time.Second))
			fmt.Fprintf(&b, "  ETA %s", formatETA(left))
		}
	}
	return b.String()
}

// humanCount is n with a k or M suffix past ten thousand, in formatSig's
// three significant digits (25.0k, 100k, 12.3M).
func humanCount(n float64) string {
	switch {
	case n >= 10e6:
		return formatSig(n/1e6, 3) + "M"
	case n >= 10e3:
		return formatSig(n/1e3, 3) + "k"
	default:
		return fmt.Sprintf("%.0f", n)
	}
}

// formatETA rounds d to what a person reads: 42s, 3m10s, 2h05m.
func formatETA(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()+0.5))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

// finish clears the bar's line on a terminal; elsewhere it writes summary,
// when not empty, as one line: the record a log keeps of the command's
// progress. Its callers leave summary empty with --json (whose output stays
// as it was) and when the command's own output says the same.
func (p *progressBar) finish(summary string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drew {
		fmt.Fprint(p.w, "\r\033[K")
		p.drew = false
	}
	if !p.on && summary != "" {
		fmt.Fprintln(p.w, summary)
	}
}

// formatRate is n bytes over d as "768.0 MiB in 8.0s (96.0 MiB/s)".
func formatRate(n int64, d time.Duration) string {
	s := fmt.Sprintf("%s in %.1fs", formatBytes(n), d.Seconds())
	if d > 0 && n > 0 {
		s += fmt.Sprintf(" (%s/s)", formatBytes(int64(float64(n)/d.Seconds())))
	}
	return s
}
