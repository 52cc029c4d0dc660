package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSignalsDoNotInterruptChanges: the kernel interrupts a FUSE request
// whenever its caller takes a signal, fatal or not. A writer whose thread
// takes a signal every 50 µs (SIGURG, which Go's runtime ignores) streams a
// file, reads the start back (a READ that spills the stream to its spool),
// patches below its cursor, writes on, grows the file with ftruncate and
// fsyncs it, all with raw system calls that do not retry EINTR. Every call
// must succeed and the file must read back whole: before, the spill gave up
// at the first interrupt and the staged content was lost (EINTR, then EIO).
func TestSignalsDoNotInterruptChanges(t *testing.T) {
	m := newMount(t)
	p := m.path("runs/signals.bin")
	const mb = 1 << 20
	data := randBytes(91, 24*mb)
	patch := randBytes(92, 5000)
	want := append([]byte(nil), data...)
	copy(want[10:], patch)
	want = append(want, make([]byte, mb)...) // the ftruncate's zeros

	type result struct {
		signals int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		// The thread stays locked to this goroutine and exits with it: it
		// takes signals that nothing else should.
		runtime.LockOSThread()
		tid := unix.Gettid()
		stop := make(chan struct{})
		sent := make(chan int, 1)
		go func() {
			n := 0
			defer func() { sent <- n }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if unix.Tgkill(os.Getpid(), tid, unix.SIGURG) == nil {
					n++
				}
				time.Sleep(50 * time.Microsecond)
			}
		}()
		err := signalledWrites(p, data, patch, mb)
		close(stop)
		done <- result{<-sent, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("with %d signals sent to the writer: %v", r.signals, r.err)
	}
	if r.signals < 100 {
		t.Fatalf("only %d signals reached the writer: the test did not interrupt anything", r.signals)
	}
	mustEqualFile(t, p, want)
	t.Logf("%d signals sent to the writer, no call interrupted", r.signals)
}

// signalledWrites is TestSignalsDoNotInterruptChanges's writer, in raw
// system calls (no EINTR retry).
func signalledWrites(p string, data, patch []byte, mb int) error {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			unix.Close(fd) // the mount unmounts only with no file open
		}
	}()
	half := len(data) / 2
	for off := 0; off < half; off += mb {
		if _, err := unix.Pwrite(fd, data[off:off+mb], int64(off)); err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
	}
	time.Sleep(50 * time.Millisecond) // the stream stores chunks
	got := make([]byte, 4096)
	if _, err := unix.Pread(fd, got, 0); err != nil {
		return fmt.Errorf("read back the start: %w", err)
	}
	if !bytes.Equal(got, data[:4096]) {
		return errors.New("read back the start: other bytes")
	}
	if _, err := unix.Pwrite(fd, patch, 10); err != nil {
		return fmt.Errorf("patch below the cursor: %w", err)
	}
	for off := half; off < len(data); off += mb {
		if _, err := unix.Pwrite(fd, data[off:off+mb], int64(off)); err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
	}
	if err := unix.Ftruncate(fd, int64(len(data)+mb)); err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	closed = true
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
