package main

import (
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

// progressBar draws one updating line on a terminal; on anything else it
// draws nothing.
type progressBar struct {
	w     io.Writer
	on    bool
	mu    sync.Mutex
	last  time.Time
	drew  bool
	phase string    // the phase being drawn
	start time.Time // when it began, for its rate and ETA
}

func newProgressBar(w io.Writer) *progressBar {
	return &progressBar{w: w, on: isTerminal(w)}
}

func (p *progressBar) update(pr gc.Progress) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 100*time.Millisecond && pr.Done != pr.Total {
		return
	}
	now := time.Now()
	if pr.Phase != p.phase {
		p.phase, p.start = pr.Phase, now
	}
	p.last = now
	fmt.Fprintf(p.w, "\r\033[K%s", formatProgress(pr, now.Sub(p.start)))
	p.drew = true
}

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

// done clears the bar's line.
func (p *progressBar) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drew {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
