package test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// version is one content a path may hold; the zero version means absent.
type version struct {
	seed uint64
	size int
}

func (v version) bytes() []byte {
	if v.size == 0 {
		return nil
	}
	return randBytes(v.seed, v.size)
}

var absent = version{}

// pathState is what the model knows of one path: its committed version, and
// the versions an operation in flight when the daemon died may have left.
type pathState struct {
	committed version
	inflight  []version
}

// crashWorkload changes a few paths through the mount until the mount fails
// (the daemon was killed), keeping a model of what each path may hold.
type crashWorkload struct {
	mnt   string
	mu    sync.Mutex
	paths map[string]*pathState
	errs  []string // how each worker's last operation failed
}

func (w *crashWorkload) begin(p string, v version) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paths[p].inflight = append(w.paths[p].inflight, v)
}

func (w *crashWorkload) done(p string, v version) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paths[p].committed, w.paths[p].inflight = v, nil
}

// run performs operations on its own paths until one fails.
func (w *crashWorkload) run(rng *rand.Rand, worker int) {
	mine := []string{}
	for p := range w.paths {
		if filepath.Base(filepath.Dir(p)) == fmt.Sprint("w", worker) {
			mine = append(mine, p)
		}
	}
	for i := 0; ; i++ {
		p := mine[rng.Intn(len(mine))]
		full := filepath.Join(w.mnt, p)
		v := version{seed: rng.Uint64(), size: 1 + rng.Intn(3<<20)}
		var err error
		switch op := rng.Intn(10); {
		case op < 4: // new version by temp file + rename while open (safetensors)
			w.begin(p, v)
			err = writeViaRename(full, v.bytes())
		case op < 8: // in place, O_TRUNC (torch.save)
			w.begin(p, v)
			err = os.WriteFile(full, v.bytes(), 0o644)
		default:
			w.begin(p, absent)
			err = os.Remove(full)
			if errors.Is(err, os.ErrNotExist) {
				err = nil
			}
			v = absent
		}
		if err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Sprintf("%s: %v", p, err))
			w.mu.Unlock()
			return // the daemon is gone; this operation stays in flight
		}
		w.done(p, v)
	}
}

func writeViaRename(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func shaOf(b []byte) [32]byte { return sha256.Sum256(b) }

// verify checks every path against the model after a remount.
func (w *crashWorkload) verify(t *testing.T, round int) {
	t.Helper()
	for p, st := range w.paths {
		got, err := os.ReadFile(filepath.Join(w.mnt, p))
		exists := err == nil
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: %s: %v", round, p, err)
		}
		var match *version
		for _, v := range append([]version{st.committed}, st.inflight...) {
			v := v
			if (v == absent && !exists) || (v != absent && exists && len(got) == v.size && shaOf(got) == shaOf(v.bytes())) {
				match = &v
				break
			}
		}
		if match == nil {
			t.Logf("workers stopped on: %q", w.errs)
			for _, v := range st.inflight {
				want := v.bytes()
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				zeros := 0
				for j := i; j < len(got) && got[j] == 0; j++ {
					zeros++
				}
				t.Logf("vs in-flight %d bytes: first difference at %d, then %d zero bytes", len(want), i, zeros)
			}
			t.Fatalf("round %d: %s holds %d bytes (exists %v); committed %+v, in flight %+v", round, p, len(got), exists, st.committed, st.inflight)
		}
		st.committed, st.inflight = *match, nil
		// The temporary name of an unfinished rename never survives.
		if _, err := os.Stat(filepath.Join(w.mnt, p+".tmp")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: %s.tmp exists after the crash: %v", round, p, err)
		}
	}
}

// TestCrashSafety kills the daemon with SIGKILL at random moments while files
// are written, renamed into place, overwritten, unlinked and collected, then
// remounts and checks that nothing committed was lost.
func TestCrashSafety(t *testing.T) {
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	const workers = 3
	w := &crashWorkload{mnt: mnt, paths: map[string]*pathState{}}
	for i := 0; i < workers; i++ {
		for j := 0; j < 4; j++ {
			w.paths[fmt.Sprintf("runs/w%d/f%d", i, j)] = &pathState{}
		}
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	d := startDaemon(t, store, mnt)
	for i := 0; i < workers; i++ {
		if err := os.MkdirAll(filepath.Join(mnt, fmt.Sprintf("runs/w%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kills := 0
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		for i := 0; i < workers; i++ {
			wg.Add(1)
			seed := rng.Int63()
			go func() {
				defer wg.Done()
				w.run(rand.New(rand.NewSource(seed)), i)
			}()
		}
		stopGC := make(chan struct{})
		gcDone := make(chan struct{})
		go func() { // collections at grace 0, killed along with the daemon
			defer close(gcDone)
			for {
				select {
				case <-stopGC:
					return
				default:
				}
				ckptfsQuiet("gc", "--grace", "0", mnt)
			}
		}()
		time.Sleep(time.Duration(20+rng.Intn(400)) * time.Millisecond)
		d.cmd.Process.Kill()
		<-d.done
		d.done <- nil
		kills++
		close(stopGC)
		wg.Wait()
		<-gcDone

		d = startDaemon(t, store, mnt)
		w.verify(t, round)
		w.errs = nil
		if ents, err := os.ReadDir(filepath.Join(store, "spool")); err != nil || len(ents) != 0 {
			t.Fatalf("round %d: spool not emptied: %v %d", round, err, len(ents))
		}
		if code, out, errOut := ckptfs(t, "fsck", mnt); code != 0 {
			t.Fatalf("round %d: fsck: %s %s", round, out, errOut)
		}
	}
	code, out, errOut := ckptfs(t, "fsck", "--read-data", mnt)
	if code != 0 {
		t.Fatalf("final fsck --read-data: %s %s", out, errOut)
	}
	t.Logf("%d kills; %s", kills, bytes.TrimSpace([]byte(out)))
	d.stop(syscall.SIGTERM)
}

// ckptfsQuiet runs the CLI and ignores the outcome (used while the daemon may
// be killed under it).
func ckptfsQuiet(args ...string) {
	cmd := execCommand(ckptfsBin, args...)
	_ = cmd.Run() // the daemon may die under it: that is the point
}
