package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// fakeReencoder records when it was called and answers from a script.
type fakeReencoder struct {
	mu    sync.Mutex
	calls []time.Time
	queue int   // rows left; more is queue > 0 after a call
	err   error // returned by every call when set
}

func (r *fakeReencoder) ReencodeBacklog() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(r.queue) << 20 // 1 MiB chunks
}

func (r *fakeReencoder) Reencode(ctx context.Context, n int) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, time.Now())
	if r.err != nil {
		return r.queue > 0, r.err
	}
	if r.queue > 0 {
		r.queue--
	}
	return r.queue > 0, nil
}

func (r *fakeReencoder) snapshot() ([]time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.calls...), r.queue
}

// syncBuffer is a log destination safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runFake runs the re-encoder on r with policy p until the test ends.
func runFake(t *testing.T, r reencoder, p reencodePolicy) (*FS, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	f := &FS{log: log.New(&logs, "", 0), act: activity{epoch: time.Now()}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.runReencoder(ctx, r, p)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("the re-encoder did not stop when its context ended")
		}
	})
	return f, &logs
}

// TestReencoderRunsOnlyWhenIdle: no call while activity is noted or an
// operation is in progress; the queue drains once the filesystem is idle.
func TestReencoderRunsOnlyWhenIdle(t *testing.T) {
	// Activity is noted every idle/20: only a scheduling stall of nearly the
	// idle time could let a call slip in.
	const idle = 200 * time.Millisecond
	r := &fakeReencoder{queue: 50}
	f, _ := runFake(t, r, reencodePolicy{idle: idle, backoffMin: time.Second, backoffMax: time.Second, busyBacklog: 1 << 40})

	// Busy with reads and writes: steady activity.
	for end := time.Now().Add(4 * idle); time.Now().Before(end); time.Sleep(idle / 20) {
		f.noteActivity()
	}
	if calls, _ := r.snapshot(); len(calls) != 0 {
		t.Fatalf("%d calls while active", len(calls))
	}
	// Busy with one long operation (a commit): no activity noted meanwhile.
	end := f.beginActivity()
	time.Sleep(4 * idle)
	if calls, _ := r.snapshot(); len(calls) != 0 {
		t.Fatalf("%d calls during a long operation", len(calls))
	}
	end()
	stopped := time.Now()

	waitFor(t, 5*time.Second, 10*time.Millisecond, func() bool { _, left := r.snapshot(); return left == 0 }, func() string {
		calls, left := r.snapshot()
		return fmt.Sprintf("queue not drained: %d left after %d calls", left, len(calls))
	})
	if calls, _ := r.snapshot(); calls[0].Sub(stopped) < idle {
		t.Fatalf("first call %v after the last activity, want ≥ %v", calls[0].Sub(stopped), idle)
	}
	// Activity again: the runner stops between chunks.
	r.mu.Lock()
	r.queue = 1000
	r.mu.Unlock()
	f.noteActivity()
	time.Sleep(idle / 2)
	before, _ := r.snapshot()
	for end := time.Now().Add(3 * idle); time.Now().Before(end); time.Sleep(idle / 20) {
		f.noteActivity()
	}
	if after, _ := r.snapshot(); len(after) != len(before) {
		t.Fatalf("%d calls while active again", len(after)-len(before))
	}
}

// TestReencoderKeepsUpWhileBusy: a backlog over the threshold is worked
// down while the filesystem stays busy, to the threshold and no further.
func TestReencoderKeepsUpWhileBusy(t *testing.T) {
	const idle = 200 * time.Millisecond
	r := &fakeReencoder{queue: 40} // 40 MiB
	f, _ := runFake(t, r, reencodePolicy{idle: idle, backoffMin: time.Second, backoffMax: time.Second, busyBacklog: 10 << 20})
	end := f.beginActivity() // a long operation: never idle meanwhile
	defer end()
	waitFor(t, 10*time.Second, 5*time.Millisecond, func() bool { _, left := r.snapshot(); return left <= 10 }, func() string {
		_, left := r.snapshot()
		return fmt.Sprintf("backlog of %d MiB not worked down while busy", left)
	})
	time.Sleep(3 * idle)
	if _, left := r.snapshot(); left != 10 {
		t.Fatalf("%d MiB left: while busy the runner goes down to the threshold (10), not further", left)
	}
}

// TestReencoderLogsAndBacksOff: every error is logged, and calls after
// errors are spaced by a doubling back-off.
func TestReencoderLogsAndBacksOff(t *testing.T) {
	r := &fakeReencoder{queue: 5, err: errors.New("disk on fire")}
	p := reencodePolicy{idle: 10 * time.Millisecond, backoffMin: 40 * time.Millisecond, backoffMax: 160 * time.Millisecond, busyBacklog: 1 << 40}
	_, logs := runFake(t, r, p)
	var calls []time.Time
	waitFor(t, 10*time.Second, 20*time.Millisecond, func() bool { calls, _ = r.snapshot(); return len(calls) >= 6 },
		func() string { return fmt.Sprintf("only %d calls", len(calls)) })
	want := []time.Duration{40, 80, 160, 160, 160}
	for i, w := range want {
		if gap := calls[i+1].Sub(calls[i]); gap < w*time.Millisecond {
			t.Errorf("gap %d: %v, want ≥ %vms", i, gap, int(w))
		}
	}
	// A call is counted when it starts and logged after it failed: wait
	// for the sixth call's line (CI once read the log between the two).
	var n int
	waitFor(t, 10*time.Second, 20*time.Millisecond, func() bool { n = strings.Count(logs.String(), "disk on fire"); return n >= 6 },
		func() string { return fmt.Sprintf("%d errors logged for %d calls:\n%s", n, len(calls), logs) })
}

func TestActivity(t *testing.T) {
	f := &FS{act: activity{epoch: time.Now().Add(-time.Hour)}}
	if w := f.act.idleWait(time.Minute); w != 0 {
		t.Fatalf("idle for an hour, but wait %v", w)
	}
	f.noteActivity()
	if w := f.act.idleWait(time.Minute); w < 59*time.Second {
		t.Fatalf("just active, but wait %v", w)
	}
	// Within the granularity a second note may be skipped, never lost.
	f.noteActivity()
	if w := f.act.idleWait(time.Minute); w < 59*time.Second {
		t.Fatalf("wait %v", w)
	}
	end := f.beginActivity()
	f.act.last.Store(0) // as if the operation started long ago
	if w := f.act.idleWait(time.Minute); w != time.Minute {
		t.Fatalf("operation in progress, but wait %v", w)
	}
	end()
	if w := f.act.idleWait(time.Minute); w < 59*time.Second {
		t.Fatalf("operation just ended, but wait %v", w)
	}
}

// BenchmarkNoteActivity: the cost added to every FUSE read and write.
func BenchmarkNoteActivity(b *testing.B) {
	f := &FS{act: activity{epoch: time.Now()}}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			f.noteActivity()
		}
	})
}

// TestBackgroundReencodeThroughMount: a file committed while no inline
// encoder is free is stored raw, and the mount's re-encoder stores it encoded
// once the filesystem is idle; the bytes read back unchanged.
func TestBackgroundReencodeThroughMount(t *testing.T) {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		cas0: cas.Options{InlineEncoders: -1}, opts: []Option{WithReencodeIdle(50 * time.Millisecond)}}
	m.mount()
	t.Cleanup(m.unmount)

	// 4-bit noise: zstd stores it in about half the bytes.
	data := randBytes(7, 3<<20+123)
	for i := range data {
		data[i] &= 0x0f
	}
	m.fsys.noteActivity()
	mustWrite(t, m.path("runs/w.bin"), data)
	if st := m.stats(); st.UniqueBytes != int64(len(data)) {
		t.Fatalf("after commit: %+v", st)
	}
	waitFor(t, 20*time.Second, 50*time.Millisecond, func() bool { return m.stats().ReencodePending == 0 },
		func() string { return fmt.Sprintf("the queue did not drain: %+v", m.stats()) })
	if st := m.stats(); st.StoredBytes > st.UniqueBytes*3/4 {
		t.Fatalf("re-encoded, but stored %d of %d bytes", st.StoredBytes, st.UniqueBytes)
	}
	mustEqualFile(t, m.path("runs/w.bin"), data)
	m.remount() // read from the objects, not the cache
	mustEqualFile(t, m.path("runs/w.bin"), data)

	// Close stops the runner, and only once is needed.
	m.fsys.Close()
	select {
	case <-m.fsys.bgDone:
	default:
		t.Fatal("the re-encoder still runs after Close")
	}
	m.fsys.Close()
}

// TestReencodeOff: WithReencodeIdle(0) leaves the queue alone.
func TestReencodeOff(t *testing.T) {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		cas0: cas.Options{InlineEncoders: -1}, opts: []Option{WithReencodeIdle(0)}}
	m.mount()
	t.Cleanup(m.unmount)
	data := bytes.Repeat([]byte("step 1 loss 0.5\n"), 100000)
	mustWrite(t, m.path("runs/log.txt"), data)
	time.Sleep(300 * time.Millisecond)
	if st := m.stats(); st.ReencodePending == 0 {
		t.Fatalf("queue drained with the re-encoder off: %+v", st)
	}
	mustEqualFile(t, m.path("runs/log.txt"), data)
}
