package fusefs

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// waitMount mounts a fresh store that keeps the latest save whole, with the
// re-encoder idle (plans released stay queued).
func waitMount(t *testing.T) *testMount {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(),
		cas0: cas.Options{DeltaLatestWhole: true}, opts: []Option{WithReencodeIdle(time.Hour)}}
	m.mount()
	t.Cleanup(m.unmount)
	return m
}

// tensorsFile is a safetensors file of 1 MiB F32 tensors, each named and
// at the step given: values of its name that change a little from step to
// step (as stepTensorFile's). A tensor at the same step in two files is
// the same chunks.
func tensorsFile(tensors ...string) []byte {
	const n = 256 << 10
	hdr := map[string]any{}
	for i := 0; i < len(tensors); i += 2 {
		hdr[tensors[i]] = map[string]any{"dtype": "F32", "shape": []int{n}, "data_offsets": []int{i / 2 * 4 * n, (i/2 + 1) * 4 * n}}
	}
	h, _ := json.Marshal(hdr)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	for i := 1; i < len(tensors); i += 2 {
		var step int
		fmt.Sscan(tensors[i], &step)
		h := fnv.New64a()
		h.Write([]byte(tensors[i-1]))
		phase := float64(h.Sum64() % 1000)
		for j := range n {
			v := float32(math.Sin(float64(j)+phase)) + float32(step)*1e-3*float32(j%7)
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b
}

// waitState is what the catalog says of the waiting plans: the counter, the
// rows not released, and the rows of the chunks of the file at path p
// (committed), waiting and released.
type waitState struct {
	counter, rows           int64
	fileWaits, fileReleased int
}

func waitsOf(t *testing.T, m *testMount, p string) waitState {
	t.Helper()
	var st waitState
	var ino uint64
	if p != "" {
		var err error
		if ino, err = inoAt(m, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.cas.View(func(tx *cas.Tx) error {
		st.counter = tx.Counts().DeltaWaiting
		if err := tx.ForEachDeltaWait(func(id cas.ID, w cas.DeltaWait) error {
			if !w.Released {
				st.rows++
			}
			return nil
		}); err != nil {
			return err
		}
		if ino == 0 {
			return nil
		}
		mf, ok, err := tx.Manifest(ino)
		if err != nil || !ok {
			return fmt.Errorf("no manifest for %s: %v", p, err)
		}
		for _, c := range mf.Chunks {
			if w, ok, err := tx.DeltaWait(c.ID); err != nil {
				return err
			} else if ok && w.Released {
				st.fileReleased++
			} else if ok {
				st.fileWaits++
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st.counter != st.rows {
		t.Errorf("delta_waiting is %d, the catalog holds %d waiting plans", st.counter, st.rows)
	}
	return st
}

// inoAt is the catalog's inode number of the file at p in the mount.
func inoAt(m *testMount, p string) (uint64, error) {
	var ino uint64
	err := m.cas.View(func(tx *cas.Tx) error {
		ino = lookupIno(tx, p)
		if ino == 0 {
			return fmt.Errorf("%s: not in the catalog", p)
		}
		return nil
	})
	return ino, err
}

func lookupIno(tx *cas.Tx, p string) uint64 {
	ino := uint64(cas.RootIno)
	for _, name := range pathNames(p) {
		next, ok := tx.Lookup(ino, name)
		if !ok {
			return 0
		}
		ino = next
	}
	return ino
}

// pathNames is the names of relative path p.
func pathNames(p string) []string { return strings.Split(filepath.Clean(p), "/") }

// TestRenameReleasesWaits: with the latest save kept whole, a rename that
// takes a file out of its run (its run's next save would find the version
// before it) releases its waiting plans into the re-encode queue; one that
// keeps it the latest of its run (the run renamed or moved whole, a step
// directory or a file renamed from its temporary name) keeps them waiting;
// one that moves a step into its run releases the step it follows. Before,
// a step moved out of its run waited for good, and so did the step a step
// moved in follows.
func TestRenameReleasesWaits(t *testing.T) {
	m := waitMount(t)
	save := func(dir, name string, step int) {
		t.Helper()
		if err := os.MkdirAll(m.path(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, m.path(dir+"/"+name), stepTensorFile(step, 256<<10))
	}
	mv := func(a, b string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(m.path(b)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(m.path(a), m.path(b)); err != nil {
			t.Fatal(err)
		}
	}
	// expect checks the waits of the chunks of the file at p, and that the
	// store's are the run's latest file's, all of them waits.
	expect := func(what, p string, waits, released, all int) {
		t.Helper()
		st := waitsOf(t, m, p)
		if st.fileWaits != waits || st.fileReleased != released || st.rows != int64(all) {
			t.Errorf("%s: %s has %d chunks waiting and %d released, the store %d waiting; want %d, %d and %d",
				what, p, st.fileWaits, st.fileReleased, st.rows, waits, released, all)
		}
	}
	save("run/0001", "model.safetensors", 1)
	save("run/0002", "model.safetensors", 2)
	w := waitsOf(t, m, "run/0002/model.safetensors").fileWaits
	if w == 0 {
		t.Fatal("the second save has no waiting plans")
	}

	// HF Trainer's way: a step saved in a temporary directory, renamed in
	// place.
	save("run/tmp-0003", "model.safetensors", 3)
	mv("run/tmp-0003", "run/0003")
	expect("a step directory renamed from its temporary name", "run/0003/model.safetensors", w, 0, w)

	// The run renamed, moved away and back: its latest save stays its latest.
	mv("run", "run-b")
	mv("run-b", "other/run")
	expect("the run moved whole", "other/run/0003/model.safetensors", w, 0, w)
	mv("other/run", "run")

	// A file written under a temporary name, renamed to its final one.
	save("run/0004", "model.safetensors.tmp", 4)
	mv("run/0004/model.safetensors.tmp", "run/0004/model.safetensors")
	expect("a file renamed from its temporary name", "run/0004/model.safetensors", w, 0, w)
	expect("the step before", "run/0003/model.safetensors", 0, w, w)

	// The latest step archived: the run's next save finds 0003.
	mv("run/0004", "archive/0004")
	expect("a step moved out of its run", "archive/0004/model.safetensors", 0, w, 0)

	// The run goes on; its latest file renamed within its step.
	save("run/0005", "model.safetensors", 5)
	expect("the next step", "run/0005/model.safetensors", w, 0, w)
	mv("run/0005/model.safetensors", "run/0005/best.safetensors")
	expect("a file renamed to another name", "run/0005/best.safetensors", 0, w, 0)

	// A lone file moved to another directory.
	save("run/0006", "model.safetensors", 6)
	mv("run/0006/model.safetensors", "keep/model.safetensors")
	expect("a file moved out of its step", "keep/model.safetensors", 0, w, 0)

	// A step written elsewhere (where it finds no previous version) and
	// moved into its run: the run's latest step before it is released, as
	// its save there would have.
	save("run/0007", "model.safetensors", 7)
	expect("the next step", "run/0007/model.safetensors", w, 0, w)
	save("staging/0008", "model.safetensors", 8)
	expect("a step saved elsewhere", "run/0007/model.safetensors", w, 0, w)
	mv("staging/0008", "run/0008")
	expect("a step moved into its run", "run/0007/model.safetensors", 0, w, 0)
}

// TestDeleteDropsWaits: the waiting plans of content that no file holds any
// more (its last name removed, or new content committed over it) are
// dropped with it, and delta_waiting says so at once, not at the next
// collection; the chunks that the content taking its place still names
// keep theirs, and a file with another name keeps its own. Each section
// names its tensors apart, so that no content is one the store holds.
func TestDeleteDropsWaits(t *testing.T) {
	m := waitMount(t)
	write := func(p string, content []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(m.path(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, m.path(p), content)
	}
	rename := func(a, b string) {
		t.Helper()
		if err := os.Rename(m.path(a), m.path(b)); err != nil {
			t.Fatal(err)
		}
	}
	write("run/0001/model.safetensors", tensorsFile("a", "1", "b", "1"))
	write("run/0002/model.safetensors", tensorsFile("a", "2", "b", "2"))
	tensor := waitsOf(t, m, "").counter / 2 // the waiting chunks of one tensor (the chunker cuts it in several)
	if tensor == 0 {
		t.Fatal("the second save has no waiting plans")
	}
	expect := func(what string, tensors int64) {
		t.Helper()
		if st := waitsOf(t, m, ""); st.counter != tensors*tensor {
			t.Errorf("%s: delta_waiting %d, want %d tensors' chunks (%d)", what, st.counter, tensors, tensors*tensor)
		}
	}

	// Two names: removing one deletes nothing.
	if err := os.Link(m.path("run/0002/model.safetensors"), m.path("run/0002/copy.safetensors")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m.path("run/0002/copy.safetensors")); err != nil {
		t.Fatal(err)
	}
	expect("one of two names removed", 2)
	if err := os.Remove(m.path("run/0002/model.safetensors")); err != nil {
		t.Fatal(err)
	}
	expect("the latest save deleted", 0)

	// A step removed whole; the step before it is found past the empty 0002.
	write("run/0003/model.safetensors", tensorsFile("a", "3", "b", "3"))
	expect("the next save", 2)
	if err := os.RemoveAll(m.path("run/0003")); err != nil {
		t.Fatal(err)
	}
	expect("the latest step removed", 0)

	// Overwritten in place: tensor fa changed (its old chunks released, the
	// commit's suggestion), fb not (the latest version's still: it waits on).
	write("flat/model.safetensors", tensorsFile("fa", "1", "fb", "1"))
	write("flat/model.safetensors", tensorsFile("fa", "2", "fb", "2"))
	expect("a file overwritten", 2)
	write("flat/model.safetensors", tensorsFile("fa", "3", "fb", "2"))
	expect("a file overwritten, fb unchanged", 2)
	// New content that pairs with nothing: the old content's plans go.
	write("flat/model.safetensors", tensorsFile("fc", "4", "fd", "4"))
	expect("a file overwritten with other tensors", 0)

	// New versions written under a temporary name and renamed over the
	// file: the replaced version's changed chunks are released by the
	// commit, its unchanged ones wait on in the new version.
	write("ren/model.safetensors", tensorsFile("ra", "1", "rb", "1"))
	write("ren/model.safetensors.tmp", tensorsFile("ra", "2", "rb", "2"))
	rename("ren/model.safetensors.tmp", "ren/model.safetensors")
	expect("renamed over its previous version", 2)
	write("ren/model.safetensors.tmp", tensorsFile("ra", "3", "rb", "2"))
	rename("ren/model.safetensors.tmp", "ren/model.safetensors")
	if st := waitsOf(t, m, "ren/model.safetensors"); st.counter != 2*tensor || st.fileWaits != int(2*tensor) {
		t.Errorf("renamed over its previous version, rb unchanged: %+v, want ra's and rb's chunks of the new version waiting (%d)", st, 2*tensor)
	}
	write("ren/model.safetensors.tmp", tensorsFile("rc", "4"))
	rename("ren/model.safetensors.tmp", "ren/model.safetensors")
	expect("renamed over by other tensors", 0)
}
