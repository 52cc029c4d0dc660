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
	w    io.Writer
	on   bool
	mu   sync.Mutex
	last time.Time
	drew bool
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
	p.last = time.Now()
	line := fmt.Sprintf("%-6s %d", pr.Phase, pr.Done)
	if pr.Total > 0 {
		const width = 30
		fill := int(float64(width) * float64(pr.Done) / float64(pr.Total))
		fill = max(0, min(width, fill))
		line = fmt.Sprintf("%-6s [%s%s] %d/%d", pr.Phase, strings.Repeat("#", fill), strings.Repeat(".", width-fill), pr.Done, pr.Total)
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
	p.drew = true
}

// done clears the bar's line.
func (p *progressBar) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drew {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
