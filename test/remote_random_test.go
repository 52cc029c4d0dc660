package test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Environment of TestRemoteRandomFaults (make soak sets them larger).
const (
	faultSeedEnv = "CKPTFS_FAULT_SEED" // the run's seed; default 1
	faultOpsEnv  = "CKPTFS_FAULT_OPS"  // operations per run; default 70
)

// faultWriter is one writer mount of the randomized test and the model of
// what it committed: path → content (nil: removed), and which of its paths
// changed since its last successful sync.
type faultWriter struct {
	name    string
	store   string
	mnt     string
	d       *daemon
	paused  bool
	local   map[string][]byte
	pending map[string]bool
}

// TestRemoteRandomFaults is a Jepsen-style test of the remote tier: three
// writer mounts and two reading mounts on one prefix, a seeded sequence of
// writes, overwrites, removals, renames and syncs, mixed with faults: a
// writer SIGSTOPped past its lease and resumed, a writer SIGKILLed and
// restarted on its store, the S3 server killed and restarted or paused,
// gc on a random writer (beside live writers: it trashes, and purges what
// every live writer acknowledged), and gc in a maintenance window (the other writers unmount, unsynced changes and
// all, and rejoin after it). Each writer owns its paths (their order is
// its own); one more path is written by all of them (a race). It checks:
//   - every read, on any mount at any time, is a whole version some writer
//     wrote to that path, or absent, or EIO while a fault lasts: never
//     wrong bytes;
//   - once the faults end and every writer has synced: every path whose
//     last change was acknowledged by a sync that returned 0 reads back
//     exactly so (or is absent, for a removal) from a fresh reader, and the
//     raced path is one whole version everywhere;
//   - fsck --read-data is clean on every writer and on the fresh reader.
//
// It prints the counts: operations, faults, syncs (ok and failed), gc
// runs (done, refused: a purge not acknowledged yet or a lost session, and
// stopped at a deadline), reads, files checked.
func TestRemoteRandomFaults(t *testing.T) {
	seed := uint64(1)
	if s := os.Getenv(faultSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", faultSeedEnv, s, err)
		}
		seed = v
	}
	ops := 70
	if s := os.Getenv(faultOpsEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("%s=%q: want a positive number", faultOpsEnv, s)
		}
		ops = v
	}
	t.Logf("seed %d (%s=%d reproduces), %d operations", seed, faultSeedEnv, seed, ops)
	rng := rand.New(rand.NewPCG(seed, 0x6a65))

	e := newFaultEnv(t, "random")
	const lease = 3 * time.Second
	t.Setenv(leaseEnv, lease.String())
	t.Setenv(refreshEnv, "500ms")
	t.Setenv("CKPTFS_REMOTE_TIMEOUT", "2s")

	// versions[p] holds the hash of every version ever written to p.
	// history[p] lists them in the order written, to say which one a
	// failing read returned.
	versions := map[string]map[[32]byte]bool{}
	history := map[string][][32]byte{}
	note := func(p string, b []byte) {
		if versions[p] == nil {
			versions[p] = map[[32]byte]bool{}
		}
		h := sha256.Sum256(b)
		versions[p][h] = true
		history[p] = append(history[p], h)
	}
	// which names the version b is among those written to p.
	which := func(p string, b []byte) string {
		h := sha256.Sum256(b)
		for i := len(history[p]) - 1; i >= 0; i-- {
			if history[p][i] == h {
				return fmt.Sprintf("version %d of the %d written there", i+1, len(history[p]))
			}
		}
		return "bytes no writer wrote there"
	}
	var ws []*faultWriter
	for i := range 3 {
		w := &faultWriter{name: fmt.Sprintf("W%d", i), local: map[string][]byte{}, pending: map[string]bool{}}
		w.store, w.mnt = e.dir(w.name), e.dir(w.name+"-mnt")
		w.d = startDaemon(t, w.store, w.mnt, remoteFlag, e.url)
		ws = append(ws, w)
	}
	t.Cleanup(func() { // what the writers' daemons logged, when it failed
		if t.Failed() {
			for _, w := range ws {
				log := w.d.stderr.String()
				t.Logf("%s's daemon logged:\n%s", w.name, log[max(0, len(log)-4000):])
			}
		}
	})
	var readers []string
	for i := range 2 {
		_, m := e.reader(fmt.Sprintf("R%d", i))
		readers = append(readers, m)
	}
	const raced = "raced.bin"
	acked := map[string][]byte{} // path → content its last acknowledged sync published (nil: removed)
	var count struct {
		ops, pauses, kills, serverStops, serverPauses, syncOK, syncFail, gcDone, gcRefused, gcStopped, reads, eio int
	}
	serverDown := false

	// check reads p on mnt: a version written to p, absent, or EIO in a fault.
	check := func(mnt, p string) {
		b, err := os.ReadFile(filepath.Join(mnt, p))
		count.reads++
		switch {
		case err == nil:
			if !versions[p][sha256.Sum256(b)] {
				t.Fatalf("%s on %s: %d bytes that no writer wrote there", p, mnt, len(b))
			}
		case errors.Is(err, os.ErrNotExist):
		case errors.Is(err, syscall.EIO):
			count.eio++
		default:
			t.Fatalf("%s on %s: %v (want a version, ENOENT or EIO)", p, mnt, err)
		}
	}
	// sync reports whether a sync of w returned 0; held is set when it
	// failed because files wait for a trash list's purge.
	sync := func(w *faultWriter) (held bool) {
		code, msg := syncMount(t, w.mnt, 2*time.Minute)
		if code != 0 {
			count.syncFail++
			held = strings.Contains(msg, "wait for the collection's trash")
			if !serverDown && !strings.Contains(msg, "lost the remote") && !strings.Contains(msg, "superseded") {
				t.Logf("%s: sync failed: %s", w.name, strings.TrimSpace(msg))
			}
			return held
		}
		count.syncOK++
		for p := range w.pending {
			acked[p] = w.local[p]
		}
		clear(w.pending)
		return false
	}
	write := func(w *faultWriter, p string, b []byte) {
		note(p, b)
		put(t, filepath.Join(w.mnt, p), b)
		if p != raced {
			w.local[p], w.pending[p] = b, true
		}
	}
	owned := func(w *faultWriter) []string {
		var ps []string
		for p, b := range w.local {
			if b != nil {
				ps = append(ps, p)
			}
		}
		sort.Strings(ps) // the seed picks the same one in every run
		return ps
	}
	live := func() []*faultWriter {
		var l []*faultWriter
		for _, w := range ws {
			if !w.paused {
				l = append(l, w)
			}
		}
		return l
	}

	for i := 0; i < ops; i++ {
		count.ops++
		lw := live()
		w := lw[rng.IntN(len(lw))]
		switch r := rng.IntN(100); {
		case r < 30: // a new file or an overwrite of one of w's
			p := fmt.Sprintf("%s/f%d.bin", w.name, rng.IntN(6))
			if err := os.MkdirAll(filepath.Join(w.mnt, w.name), 0o755); err != nil {
				t.Fatal(err)
			}
			write(w, p, randBytes(rng.Uint64(), 1+rng.IntN(3<<20)))
		case r < 36:
			write(w, raced, randBytes(rng.Uint64(), 1+rng.IntN(1<<20)))
		case r < 42: // remove one of w's
			if ps := owned(w); len(ps) > 0 {
				p := ps[rng.IntN(len(ps))]
				if err := os.Remove(filepath.Join(w.mnt, p)); err != nil {
					t.Fatalf("%s: remove %s: %v", w.name, p, err)
				}
				w.local[p], w.pending[p] = nil, true
			}
		case r < 48: // rename one of w's to another of its names
			if ps := owned(w); len(ps) > 0 {
				p := ps[rng.IntN(len(ps))]
				q := fmt.Sprintf("%s/f%d.bin", w.name, rng.IntN(6))
				if q != p {
					if err := os.Rename(filepath.Join(w.mnt, p), filepath.Join(w.mnt, q)); err != nil {
						t.Fatalf("%s: rename %s %s: %v", w.name, p, q, err)
					}
					note(q, w.local[p])
					w.local[q], w.local[p] = w.local[p], nil
					w.pending[q], w.pending[p] = true, true
				}
			}
		case r < 70:
			sync(w)
		case r < 80: // reads on every mount
			var ps []string
			for p := range versions {
				ps = append(ps, p)
			}
			for _, m := range append(readers, w.mnt) {
				for k := 0; k < 3 && len(ps) > 0; k++ {
					check(m, ps[rng.IntN(len(ps))])
				}
			}
		case r < 84: // pause w past its lease, resume it
			count.pauses++
			w.d.cmd.Process.Signal(syscall.SIGSTOP)
			w.paused = true
			time.Sleep(lease + lease/2)
			w.d.cmd.Process.Signal(syscall.SIGCONT)
			w.paused = false
		case r < 88: // kill w, restart it on its store
			count.kills++
			w.d.kill()
			w.d = startDaemon(t, w.store, w.mnt, remoteFlag, e.url)
		case r < 92: // the server dies and comes back
			count.serverStops++
			e.srv.Stop()
			serverDown = true
			check(readers[rng.IntN(len(readers))], raced)
			time.Sleep(500 * time.Millisecond)
			e.srv.Restart()
			serverDown = false
		case r < 95: // the server stalls a moment
			count.serverPauses++
			e.srv.Pause()
			time.Sleep(time.Second)
			e.srv.Resume()
		case r < 98: // gc beside live writers: it trashes, or purges what every live writer acknowledged
			code, out := gcGrace0(t, w.mnt)
			switch {
			case code == 0:
				count.gcDone++
			case strings.Contains(out, "not acknowledged yet") || strings.Contains(out, "lost the remote"):
				count.gcRefused++
			case collectionStopped(out):
				count.gcStopped++
			default:
				t.Fatalf("%s: gc: exit %d: %s", w.name, code, out)
			}
		default: // a maintenance window: the others unmount, w collects, they come back
			for _, o := range ws {
				if o != w {
					o.d.stop(syscall.SIGTERM)
				}
			}
			// A session whose daemon was killed is live until it has been
			// silent for a whole lease; then it is fenced and no longer
			// counts.
			for try := 0; ; try++ {
				code, out := gcGrace0(t, w.mnt)
				if code == 0 {
					break
				}
				// A collection also stops, deleting no more, when its lease
				// or a request's deadline runs out (a loaded machine, a
				// short test lease): the next one goes on. Under load the
				// collector's own session can be fenced (its renewals late
				// for a whole 3 s lease): it rejoins, and the next goes on.
				stopped := collectionStopped(out) || strings.Contains(out, "lost the remote")
				if try == 10 || !strings.Contains(out, "not acknowledged yet") && !stopped {
					t.Fatalf("%s: gc with every other writer unmounted, %d leases on: exit %d: %s", w.name, try, code, out)
				}
				if stopped {
					count.gcStopped++
					continue
				}
				count.gcRefused++
				time.Sleep(lease + lease/2)
			}
			count.gcDone++
			for _, o := range ws {
				if o != w {
					o.d = startDaemon(t, o.store, o.mnt, remoteFlag, e.url)
				}
			}
		}
	}

	// The faults end: every writer syncs until it succeeds (a session that
	// lost the remote fails once and rejoins; a superseded race fails once;
	// files held back by a trash list publish once a gc purged it).
	for _, w := range ws {
		for try := 0; ; try++ {
			before := count.syncOK
			held := sync(w)
			if count.syncOK > before {
				break
			}
			if held {
				time.Sleep(time.Second) // every live writer's round acknowledges the list
				if code, out := gcGrace0(t, w.mnt); code != 0 {
					t.Logf("%s: gc to purge the trash: exit %d: %s", w.name, code, strings.TrimSpace(out))
				}
			}
			if try == 3 {
				t.Fatalf("%s: sync keeps failing after the faults ended", w.name)
			}
		}
	}
	// Everything acknowledged, as a fresh reader sees it.
	_, fresh := e.reader("fresh")
	checked := 0
	// A fresh reader starts from the bucket's state: it must show every
	// acknowledged change at once, with no wait.
	for p, want := range acked {
		checked++
		got, err := os.ReadFile(filepath.Join(fresh, p))
		switch {
		case want == nil && errors.Is(err, os.ErrNotExist):
		case want == nil && err == nil:
			t.Errorf("%s: removed by an acknowledged sync, a fresh reader reads %d bytes (%s)", p, len(got), which(p, got))
		case err != nil:
			t.Errorf("%s: acknowledged as %s, a fresh reader: %v", p, which(p, want), err)
		case !bytes.Equal(got, want):
			t.Errorf("%s: acknowledged as %s, a fresh reader reads %s", p, which(p, want), which(p, got))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// The raced path: one whole version on every mount once they converge.
	if versions[raced] != nil {
		var all []string
		for _, w := range ws {
			all = append(all, w.mnt)
		}
		all = append(append(all, readers...), fresh)
		deadline := time.Now().Add(30 * time.Second)
		for {
			seen := map[[32]byte]bool{}
			for _, m := range all {
				b, err := os.ReadFile(filepath.Join(m, raced))
				if err != nil {
					t.Fatalf("%s on %s: %v", raced, m, err)
				}
				h := sha256.Sum256(b)
				if !versions[raced][h] {
					t.Fatalf("%s on %s: a mix of versions", raced, m)
				}
				seen[h] = true
			}
			if len(seen) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the mounts show %d versions 30 s after the last sync", raced, len(seen))
			}
			time.Sleep(200 * time.Millisecond)
		}
		checked++
	}
	for _, m := range append([]string{fresh}, ws[0].mnt, ws[1].mnt, ws[2].mnt) {
		if code, out, errOut := ckptfs(t, "fsck", "--read-data", m); code != 0 {
			t.Errorf("fsck --read-data %s: exit %d:\n%s%s", m, code, out, errOut)
		}
	}
	t.Logf("%d operations; faults: %d pauses past the lease, %d kills, %d server restarts, %d server stalls; "+
		"syncs %d ok, %d failed; gc %d done, %d refused, %d stopped at a deadline; %d reads (%d EIO in faults); "+
		"%d paths checked from a fresh reader: 0 lost, 0 wrong",
		count.ops, count.pauses, count.kills, count.serverStops, count.serverPauses,
		count.syncOK, count.syncFail, count.gcDone, count.gcRefused, count.gcStopped, count.reads, count.eio, checked)
}

// collectionStopped reports whether gc's output says the collection stopped
// at its lease (a request's deadline, or the lease checked between
// deletes): it deleted no more, and the next gc goes on.
func collectionStopped(out string) bool {
	return strings.Contains(out, "deadline exceeded") || strings.Contains(out, "lease ran out")
}
