package stage

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// spoolWait bounds how long a write waits for a spool file (newSpool).
const spoolWait = 20 * time.Second

// spoolBudget is how many spool files may be open at once: a quarter of the
// file limit (and at least 4). The local backend keeps another quarter for
// objects written but not yet synced; the rest serves object reads, the
// catalog, the FUSE device and the listeners.
func spoolBudget() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 256
	}
	return int(max(4, min(lim.Cur/4, 1<<16)))
}

// newSpool creates a spool file for file ino (cas.Store.NewSpool); closeSpool
// gives it back.
//
// A spool holds a descriptor for as long as its file is being written, and
// nothing bounds how many files users write at once. Were spools to take the
// last descriptors, every commit would stall (a commit opens objects before
// it gives its spool back), and reads would too. So at most spoolBudget of
// them are open; a write that finds none free waits for one, up to
// spoolWait, then fails with EMFILE: an error the writer sees, instead of a
// daemon that cannot commit what it already accepted.
func (p *Pool) newSpool(ctx context.Context, ino uint64) (*os.File, error) {
	select {
	case p.spoolSlots <- struct{}{}:
	default:
		t := time.NewTimer(spoolWait)
		defer t.Stop()
		select {
		case p.spoolSlots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, fmt.Errorf("create spool file: %d files are being written out of order at once, the most this daemon's file limit allows: %w", cap(p.spoolSlots), syscall.EMFILE)
		}
	}
	sp, err := p.store.NewSpool(ctx, fmt.Sprintf("%d-*", ino))
	if err != nil {
		<-p.spoolSlots
		return nil, err
	}
	return sp, nil
}

// closeSpool closes a spool file from newSpool.
func (p *Pool) closeSpool(sp *os.File) {
	_ = sp.Close() // an unlinked scratch file: nothing left to lose
	<-p.spoolSlots
}

// spoolChunks writes the chunks of manifest m that start below limit into
// spool at their offsets (up to limit bytes; its holes are left as they
// are), and returns where the last one written ends.
func (p *Pool) spoolChunks(ctx context.Context, spool *os.File, m *cas.Manifest, limit int64) (int64, error) {
	var end int64
	for i, off := range m.Offsets() {
		if off >= limit {
			break
		}
		c, err := p.store.AcquireChunk(ctx, m.Chunks[i])
		if err != nil {
			return end, err
		}
		data := c.Data[:min(int64(len(c.Data)), limit-off)]
		_, err = spool.WriteAt(data, off)
		c.Release()
		if err != nil {
			return end, err
		}
		end = off + int64(len(data))
	}
	return end, nil
}
