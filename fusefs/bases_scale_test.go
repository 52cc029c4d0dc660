package fusefs

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/catalog"
)

// stepSafetensors is a safetensors file of one 64 KiB F32 tensor that
// changes a little from step to step (a chunk large enough for a hint).
func stepSafetensors(step int) []byte { return stepTensorFile(step, 16<<10) }

// stepTensorFile is a safetensors file of one F32 tensor of n elements that
// changes a little from step to step.
func stepTensorFile(step, n int) []byte {
	h, _ := json.Marshal(map[string]any{"w": map[string]any{"dtype": "F32", "shape": []int{n}, "data_offsets": []int{0, 4 * n}}})
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	for i := range n {
		v := float32(math.Sin(float64(i))) + float32(step)*1e-3*float32(i%7)
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// TestHintAmongManySteps (issue #27): in a run of 10⁴ step directories, a
// new step's commit finds its predecessor's file as the previous version,
// reading a few directory rows, not the run's listing (Tx.Walked: a
// listing reads every step); after renames and removals through the mount
// and after a remount it still finds the step before it, and the catalog's
// index of entries agrees with the entries.
func TestHintAmongManySteps(t *testing.T) {
	const steps = 10000
	type search struct {
		prev   *cas.Manifest
		walked int
	}
	var mu sync.Mutex
	var seen []search
	hook := func(f *FS) {
		f.hintHook = func(prev *cas.Manifest, walked int) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, search{prev, walked})
		}
	}
	m := newMount(t, hook)
	save := func(step string, n int) {
		t.Helper()
		if err := os.MkdirAll(m.path("run/"+step), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, m.path("run/"+step+"/model.safetensors"), stepSafetensors(n))
	}
	save(fmt.Sprintf("step-%d", steps-1), steps-1)

	// The other steps, empty, straight into the catalog (10⁴ mkdirs
	// through the mount would take the test's time): before and after.
	m.unmount()
	var names []string
	for i := range steps + 100 {
		if i != steps-1 && i != steps {
			names = append(names, fmt.Sprintf("step-%d", i))
		}
	}
	addEmptyDirs(t, m.store, "run", names)
	m.mount()

	// want checks that saving step found the file of prevStep.
	want := func(step string, n int, prevStep string) {
		t.Helper()
		mu.Lock()
		seen = nil
		mu.Unlock()
		save(step, n)
		wantM := committedStepFile(t, m, prevStep)
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Fatalf("%s: the commit looked for no previous version", step)
		}
		for _, s := range seen {
			if s.prev == nil || !slices.Equal(s.prev.Chunks, wantM.Chunks) {
				t.Errorf("%s: previous version %+v, want %s's %+v", step, s.prev, prevStep, wantM)
			}
			if s.walked > 4 {
				t.Errorf("%s: the search for the previous version read %d directory rows of a run of %d steps", step, s.walked, steps+100)
			}
		}
	}
	want(fmt.Sprintf("step-%d", steps), steps, fmt.Sprintf("step-%d", steps-1))

	// A small file's chunk goes inline, and an inline chunk is never a
	// delta: its commit does not look for a previous version, though the
	// step before has one.
	small := func(n int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%08d", n)), 512) }
	mustWrite(t, m.path(fmt.Sprintf("run/step-%d/config.json", steps-1)), small(1))
	mu.Lock()
	seen = nil
	mu.Unlock()
	mustWrite(t, m.path(fmt.Sprintf("run/step-%d/config.json", steps)), small(2))
	mu.Lock()
	if len(seen) != 0 {
		t.Errorf("a 4 KiB file's commit looked for its previous version (%d searches)", len(seen))
	}
	mu.Unlock()

	// Renamed and removed through the mount.
	if err := os.Rename(m.path(fmt.Sprintf("run/step-%d", steps-1)), m.path(fmt.Sprintf("run/step-%db", steps-1))); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(m.path(fmt.Sprintf("run/step-%d", steps))); err != nil {
		t.Fatal(err)
	}
	want(fmt.Sprintf("step-%d", steps), steps+1, fmt.Sprintf("step-%db", steps-1))
	if err := os.Rename(m.path(fmt.Sprintf("run/step-%db", steps-1)), m.path("run/zzz")); err != nil {
		t.Fatal(err)
	}
	want(fmt.Sprintf("step-%d", steps+1), steps+2, fmt.Sprintf("step-%d", steps))

	m.remount()
	want(fmt.Sprintf("step-%d", steps+2), steps+3, fmt.Sprintf("step-%d", steps+1))
	if err := m.cas.View(catalog.DirOrderMismatch); err != nil {
		t.Error(err)
	}
}

// addEmptyDirs puts empty directories named names in directory dir (under
// the root) of the catalog of store, which no mount has open.
func addEmptyDirs(tb testing.TB, store, dir string, names []string) {
	tb.Helper()
	s, err := cas.Open(store, cas.Options{CacheSize: 64 << 20, Objects: local.New(cas.ObjectsDir(store), local.Options{})})
	if err != nil {
		tb.Fatal(err)
	}
	inos := make([]uint64, len(names))
	for i := range inos {
		if inos[i], err = s.AllocIno(); err != nil {
			tb.Fatal(err)
		}
	}
	now := time.Now().UnixNano()
	err = s.Update(func(tx *cas.Tx) error {
		parent, ok := tx.Lookup(catalog.RootIno, dir)
		if !ok {
			return fmt.Errorf("no directory %s", dir)
		}
		for i, name := range names {
			if err := tx.PutNode(cas.Node{Ino: inos[i], Mode: syscall.S_IFDIR | 0o755, Atime: now, Mtime: now, Ctime: now}); err != nil {
				return err
			}
			if err := tx.Link(parent, name, inos[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkCommitAmongSteps (issue #27): a step's save (mkdir, a 64 KiB
// safetensors file written and closed: its commit, delta hints included)
// in a run of 100 steps and in a run of 10⁴, one after the other in each
// iteration, each first every other time. Reports each one's time per save and many/few, which is 1
// when a commit costs O(its file) and grows with the run otherwise.
func BenchmarkCommitAmongSteps(b *testing.B) {
	const few, many = 100, 10000
	m := &testMount{t: b, store: filepath.Join(b.TempDir(), "store"), dir: b.TempDir()}
	m.mount()
	b.Cleanup(m.unmount)
	for _, run := range []string{"few", "many"} {
		if err := os.Mkdir(m.path(run), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	m.unmount()
	for run, n := range map[string]int{"few": few, "many": many} {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("step-%d", i)
		}
		addEmptyDirs(b, m.store, run, names)
	}
	m.mount()
	save := func(run string, step int) time.Duration {
		start := time.Now()
		d := m.path(fmt.Sprintf("%s/step-%d", run, step))
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
		mustWrite(b, filepath.Join(d, "model.safetensors"), stepSafetensors(step))
		return time.Since(start)
	}
	var tFew, tMany time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 { // each first every other time
			tFew += save("few", few+i)
			tMany += save("many", many+i)
		} else {
			tMany += save("many", many+i)
			tFew += save("few", few+i)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(tFew.Microseconds())/float64(b.N), "few-µs/save")
	b.ReportMetric(float64(tMany.Microseconds())/float64(b.N), "many-µs/save")
	b.ReportMetric(float64(tMany)/float64(tFew), "many/few")
	b.ReportMetric(0, "ns/op")
}
