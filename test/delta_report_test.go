package test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// trainingElems is the elements of each of trainingSteps' tensors.
const trainingElems = 256 << 10

// trainingSteps returns n saves of a state dict of tensors bf16 tensors of
// 512 KiB, each save a small step from the one before (an optimizer's).
func trainingSteps(tensors, n int) [][]stTensor {
	rng := rand.New(rand.NewPCG(26, 3))
	w := make([][]float64, tensors)
	for i := range w {
		w[i] = make([]float64, trainingElems)
		for j := range w[i] {
			w[i][j] = rng.NormFloat64() * 0.02
		}
	}
	out := make([][]stTensor, n)
	for s := range out {
		for i := range w {
			b := make([]byte, 2*trainingElems)
			for j := range w[i] {
				if s > 0 {
					w[i][j] += rng.NormFloat64() * 0.0002
				}
				binary.LittleEndian.PutUint16(b[2*j:], uint16(math.Float32bits(float32(w[i][j]))>>16))
			}
			out[s] = append(out[s], stTensor{name: fmt.Sprintf("layer.%d.weight", i), dtype: "BF16", shape: []int64{trainingElems}, data: b})
		}
	}
	return out
}

// TestDeltaReportsAgree (issue #26, item 3): with delta coding, du, gc and
// fsck tell one story through a mount. Deleting a step whose tensors are
// the bases of later steps' deltas frees nothing, and du says so (the bases
// are kept, for the live deltas); gc frees what du said and reports the
// bases it kept; fsck counts them as referenced; a damaged base is one
// problem naming the files of its deltas; deleting the rest frees what du
// said, bases included.
func TestDeltaReportsAgree(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)

	// Four saves of four 512 KiB bf16 tensors, each a small step from the
	// last: the first save's tensors become the keyframes (bases).
	const tensors = 4
	const elems = trainingElems
	steps := []string{"100", "110", "120", "130"}
	for s, ts := range trainingSteps(tensors, len(steps)) {
		writeSafetensors(t, filepath.Join(mnt, "runs/r", steps[s], "model.safetensors"), ts)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for statsJSON(t, mnt)["reencode_pending"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the re-encode queue did not drain")
		}
		time.Sleep(200 * time.Millisecond)
	}
	deltas := statsJSON(t, mnt)["delta_chunks"]

	// The first save's chunks: its tensors are the bases.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "runs/r/100/model.safetensors"), &st); err != nil {
		t.Fatal(err)
	}
	var m struct {
		Chunks []struct {
			ID  string `json:"id"`
			Len int64  `json:"len"`
		} `json:"chunks"`
	}
	raw, err := os.ReadFile(filepath.Join(mnt, ".ckptfs", "manifests", strconv.FormatUint(st.Ino, 10)))
	if err != nil || json.Unmarshal(raw, &m) != nil {
		t.Fatalf("manifest: %v %s", err, raw)
	}

	// Every data chunk of the first save (all but its header's chunk; a
	// tensor is one or more chunks, as the chunker cuts it) is the base of
	// one delta in each later save but the last, whose chunks stay whole
	// until a next save (--delta-latest whole, the default).
	bases := len(m.Chunks) - 1
	if bases < tensors || deltas != int64(bases*(len(steps)-2)) {
		t.Fatalf("%d delta chunks from the %d data chunks of the first save, want %d", deltas, bases, bases*(len(steps)-2))
	}
	if w := statsJSON(t, mnt)["delta_waiting"]; w != int64(bases) {
		t.Fatalf("stats: %d chunks wait for a next save to be coded as deltas, want the last save's %d", w, bases)
	}

	type usage struct {
		FreesBytes       int64 `json:"frees_bytes"`
		FreesChunks      int   `json:"frees_chunks"`
		FreesStoredBytes int64 `json:"frees_stored_bytes"`
		KeptBytes        int64 `json:"kept_bytes"`
		KeptChunks       int   `json:"kept_chunks"`
		KeptStoredBytes  int64 `json:"kept_stored_bytes"`
		KeptForDeltas    int   `json:"kept_for_deltas"`
		WaitingChunks    int   `json:"waiting_chunks"`
	}
	type gcResult struct {
		Chunks            int   `json:"freed_chunks"`
		FreedBytes        int64 `json:"freed_bytes"`
		FreedRawBytes     int64 `json:"freed_raw_bytes"`
		BasesKept         int   `json:"bases_kept"`
		BasesKeptBytes    int64 `json:"bases_kept_bytes"`
		BasesKeptRawBytes int64 `json:"bases_kept_raw_bytes"`
		LiveDeltas        int   `json:"live_deltas"`
	}
	type problem struct {
		Kind       string   `json:"kind"`
		Chunk      string   `json:"chunk"`
		Deltas     int      `json:"deltas"`
		DeltaFiles []string `json:"delta_files"`
	}
	type fsckResult struct {
		Bases        int       `json:"bases"`
		Unreferenced int       `json:"unreferenced"`
		Problems     []problem `json:"problems"`
		Notes        []problem `json:"notes"`
	}
	du := func(paths ...string) usage {
		var out struct {
			Total usage `json:"total"`
		}
		ckptfsJSON(t, &out, append([]string{"du", "--json"}, paths...)...)
		return out.Total
	}
	agree := func(what string, u usage, g gcResult) {
		t.Helper()
		if g.Chunks != u.FreesChunks || g.FreedRawBytes != u.FreesBytes || g.FreedBytes != u.FreesStoredBytes {
			t.Errorf("%s: gc freed %d chunks, %d B (%d raw); du said %d, %d B (%d raw)", what, g.Chunks, g.FreedBytes, g.FreedRawBytes, u.FreesChunks, u.FreesStoredBytes, u.FreesBytes)
		}
		if g.BasesKept != u.KeptChunks || g.BasesKeptRawBytes != u.KeptBytes || g.BasesKeptBytes != u.KeptStoredBytes || g.LiveDeltas != u.KeptForDeltas {
			t.Errorf("%s: gc kept %d bases, %d B (%d raw) for %d deltas; du said %d, %d B (%d raw) for %d", what, g.BasesKept, g.BasesKeptBytes, g.BasesKeptRawBytes, g.LiveDeltas, u.KeptChunks, u.KeptStoredBytes, u.KeptBytes, u.KeptForDeltas)
		}
	}

	// du says which chunks wait for a next save: the last save's.
	last := filepath.Join(mnt, "runs/r", steps[len(steps)-1])
	if u := du(last); u.WaitingChunks != bases {
		t.Errorf("du of the last save: %d chunks waiting, want %d", u.WaitingChunks, bases)
	}
	if _, out, _ := ckptfs(t, "du", last); !strings.Contains(out, fmt.Sprintf("%d changed chunks", bases)) || !strings.Contains(out, "stay whole as the latest save of their tensors") {
		t.Errorf("du does not say that the last save's chunks wait:\n%s", out)
	}
	if u := du(filepath.Join(mnt, "runs/r", steps[1])); u.WaitingChunks != 0 {
		t.Errorf("du of a delta-coded save: %d chunks waiting", u.WaitingChunks)
	}

	// Deleting the first save frees nothing but what only it holds (the
	// header chunk, if its own), and keeps its tensors for the deltas.
	first := filepath.Join(mnt, "runs/r/100")
	u := du(first)
	if u.KeptChunks != bases || u.KeptBytes != tensors*2*elems || u.KeptForDeltas != int(deltas) || u.FreesBytes >= 2*elems {
		t.Errorf("du of the first save: %+v; want %d bases kept for %d deltas, freeing less than a tensor", u, bases, deltas)
	}
	if _, out, _ := ckptfs(t, "du", first); !strings.Contains(out, fmt.Sprintf("bases of %d live deltas", deltas)) {
		t.Errorf("du does not say why it keeps the bases:\n%s", out)
	}
	if err := os.RemoveAll(first); err != nil {
		t.Fatal(err)
	}
	var g gcResult
	ckptfsJSON(t, &g, "gc", "--json", "--grace", "0", mnt)
	agree("the first save", u, g)
	var f fsckResult
	ckptfsJSON(t, &f, "fsck", "--json", mnt)
	// No notes either: the latest save's plans wait for a next one, and
	// are not stale for it.
	if f.Unreferenced != 0 || f.Bases != bases || len(f.Problems) != 0 || len(f.Notes) != 0 {
		t.Errorf("fsck after gc: %+v; want no unreferenced objects, %d bases, no notes", f, bases)
	}

	// A damaged base is one problem, with its deltas' files.
	base := m.Chunks[len(m.Chunks)-1].ID // the last tensor's (last) chunk
	obj := filepath.Join(store, "objects", base[:2], base[2:4], base[4:])
	good, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0x40
	if err := os.WriteFile(obj, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ckptfs(t, "fsck", "--json", "--read-data", mnt)
	if code != 1 || jsonUnmarshal(out, &f) != nil {
		t.Fatalf("fsck --read-data of a damaged base: exit %d\n%s%s", code, out, errOut)
	}
	want := []string{"/runs/r/110/model.safetensors", "/runs/r/120/model.safetensors"}
	if len(f.Problems) != 1 || f.Problems[0].Chunk != base || f.Problems[0].Kind != "corrupt-chunk" || f.Problems[0].Deltas != len(want) || !slices.Equal(f.Problems[0].DeltaFiles, want) {
		t.Errorf("fsck --read-data of a damaged base: %+v; want one corrupt-chunk of %s with %d deltas in %v", f.Problems, base, len(want), want)
	}
	if err := os.WriteFile(obj, good, 0o600); err != nil {
		t.Fatal(err)
	}

	// Deleting the other saves frees their deltas and, with the last of
	// them, the bases.
	var rest []string
	for _, s := range steps[1:] {
		rest = append(rest, filepath.Join(mnt, "runs/r", s))
	}
	u = du(rest...)
	if u.KeptChunks != 0 || u.FreesBytes < int64(len(steps))*tensors*2*elems {
		t.Errorf("du of the other saves: %+v; want every tensor of every save freed, bases too", u)
	}
	for _, p := range rest {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	ckptfsJSON(t, &g, "gc", "--json", mnt)
	agree("the other saves", u, g)
	ckptfsJSON(t, &f, "fsck", "--json", mnt)
	if st := statsJSON(t, mnt); st["chunks"] != 0 || f.Unreferenced != 0 || f.Bases != 0 {
		t.Errorf("after deleting everything: %d chunks indexed, fsck %+v", st["chunks"], f)
	}
}

// TestDeltaWaitsLeaveWithTheSave: with the latest save kept whole, what
// du and delta_waiting call waiting is the changed chunks of each run's
// latest save, and only those. The run renamed whole keeps its latest save
// waiting; its latest step moved out of the run is released at the rename
// (the run's next save finds the step before it) and becomes deltas, and
// du says nothing waits there; a deleted latest step's plans go with it at
// the deletion, not at the next gc. Before, the moved step waited for good
// and du said it waited for the next save; the deleted one counted until
// a collection.
func TestDeltaWaitsLeaveWithTheSave(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	const tensors = 2
	saves := trainingSteps(tensors, 4)
	for s, step := range []string{"100", "110", "120"} {
		writeSafetensors(t, filepath.Join(mnt, "runs/r", step, "model.safetensors"), saves[s])
	}
	drained := func() map[string]int64 {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			st := statsJSON(t, mnt)
			if st["reencode_pending"] == 0 {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatal("the re-encode queue did not drain")
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	st := drained()
	w, deltas := st["delta_waiting"], st["delta_chunks"]
	if w < tensors || deltas != w {
		t.Fatalf("after three saves: %d chunks waiting, %d deltas; want the last save's tensors waiting, as many as the second's deltas", w, deltas)
	}
	waiting := func(p string) (int, string) {
		t.Helper()
		var out struct {
			Total struct {
				WaitingChunks int `json:"waiting_chunks"`
			} `json:"total"`
		}
		ckptfsJSON(t, &out, "du", "--json", p)
		_, text, _ := ckptfs(t, "du", p)
		return out.Total.WaitingChunks, text
	}

	// The run renamed whole: its latest save is its latest still.
	if err := os.Rename(filepath.Join(mnt, "runs/r"), filepath.Join(mnt, "runs/r2")); err != nil {
		t.Fatal(err)
	}
	latest := filepath.Join(mnt, "runs/r2/120")
	if n, text := waiting(latest); n != int(w) || statsJSON(t, mnt)["delta_waiting"] != w || !strings.Contains(text, "stay whole as the latest save") {
		t.Errorf("the run renamed: du says %d chunks wait, want %d:\n%s", n, w, text)
	}

	// Its latest step archived: released, coded as deltas, and du says so.
	archived := filepath.Join(mnt, "archive/120")
	if err := os.MkdirAll(filepath.Dir(archived), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(latest, archived); err != nil {
		t.Fatal(err)
	}
	if n, text := waiting(archived); n != 0 || strings.Contains(text, "changed chunks") {
		t.Errorf("the latest step moved out of its run: du says %d chunks wait:\n%s", n, text)
	}
	if st := drained(); st["delta_waiting"] != 0 || st["delta_chunks"] != deltas+w {
		t.Errorf("the latest step moved out of its run: %d chunks waiting, %d deltas; want none waiting, %d deltas", st["delta_waiting"], st["delta_chunks"], deltas+w)
	}

	// The run goes on from 110; its new latest step deleted.
	next := filepath.Join(mnt, "runs/r2/130")
	writeSafetensors(t, filepath.Join(next, "model.safetensors"), saves[3])
	if n := statsJSON(t, mnt)["delta_waiting"]; n != w {
		t.Errorf("the run's next save: %d chunks waiting, want %d", n, w)
	}
	if err := os.RemoveAll(next); err != nil {
		t.Fatal(err)
	}
	if n := statsJSON(t, mnt)["delta_waiting"]; n != 0 {
		t.Errorf("the latest step deleted: %d chunks waiting, want none", n)
	}
	var f struct {
		Problems []json.RawMessage `json:"problems"`
		Notes    []json.RawMessage `json:"notes"`
	}
	ckptfsJSON(t, &f, "fsck", "--json", mnt)
	if len(f.Problems) != 0 || len(f.Notes) != 0 {
		t.Errorf("fsck: problems %s, notes %s", f.Problems, f.Notes)
	}
}

// TestImportDeltas: `ckptfs import` of a run's steps codes them as deltas as
// saves into the mount do: it imports the steps in natural order ("2" before
// "10", which bytewise order reverses) and writes each file under a
// temporary name that the commit's search for the previous version reads
// as the final one (fusefs: finalName). The second of three steps becomes
// deltas; the third, the latest, stays whole, its plans waiting.
func TestImportDeltas(t *testing.T) {
	src, store, mnt := t.TempDir(), filepath.Join(t.TempDir(), "store"), t.TempDir()
	const tensors = 4
	for s, ts := range trainingSteps(tensors, 3) {
		writeSafetensors(t, filepath.Join(src, []string{"1", "2", "10"}[s], "model.safetensors"), ts)
	}
	importJSON(t, store, src, "runs/r") // into the store: import mounts it, and encodes before it unmounts
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	sameTree(t, src, filepath.Join(mnt, "runs/r"))
	st := statsJSON(t, mnt)
	t.Logf("after the import: %d delta chunks, %d waiting", st["delta_chunks"], st["delta_waiting"])
	if st["delta_chunks"] < tensors || st["delta_waiting"] < tensors {
		t.Errorf("after the import: %d delta chunks, %d waiting, want step 2's and step 10's data chunks (%d tensors each)", st["delta_chunks"], st["delta_waiting"], tensors)
	}
	if st["delta_chunks"] != st["delta_waiting"] {
		t.Errorf("%d delta chunks, %d waiting: want as many (step 2's and step 10's tensors are cut alike)", st["delta_chunks"], st["delta_waiting"])
	}
}
