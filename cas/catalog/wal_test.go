package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// dump returns every bucket, key and value of the catalog, sorted, as text:
// two catalogs with the same rows dump the same. The format keys are as a
// closed catalog has them (see "Format while open").
func dump(t *testing.T, d *DB) string {
	t.Helper()
	var sb strings.Builder
	if err := d.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			var rows []string
			if err := b.ForEach(func(k, v []byte) error {
				switch {
				case bytes.Equal(name, bucketMeta) && bytes.Equal(k, keyFormatAtRest):
					return nil
				case bytes.Equal(name, bucketMeta) && bytes.Equal(k, keyFormat):
					if r := b.Get(keyFormatAtRest); r != nil {
						v = r
					}
				}
				rows = append(rows, fmt.Sprintf("%s %x=%x", name, k, v))
				return nil
			}); err != nil {
				return err
			}
			sort.Strings(rows)
			fmt.Fprintf(&sb, "bucket %s: %d rows\n%s\n", name, len(rows), strings.Join(rows, "\n"))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// walWork runs one write transaction of a random mix of every kind of row.
func walWork(t *testing.T, d *DB, rng *rand.Rand, k int) {
	t.Helper()
	id := func(i int) (x ID) {
		binary.BigEndian.PutUint64(x[:], uint64(i))
		x[31] = byte(k)
		return x
	}
	first, err := d.ReserveInos(2)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Update(func(tx *Tx) error {
		name := fmt.Sprintf("f%d", k)
		if err := tx.PutNode(Node{Ino: first, Mode: syscall.S_IFREG | 0o644, Size: int64(k)}); err != nil {
			return err
		}
		if err := tx.Link(RootIno, name, first); err != nil {
			return err
		}
		obj := make([]byte, 500+rng.IntN(4000))
		for i := range obj {
			obj[i] = byte(rng.Uint32())
		}
		c := id(k)
		if _, err := tx.Index().AddInline(c, ChunkInfo{RawLen: uint32(len(obj)), StoredLen: uint32(len(obj)), Inline: true}, obj); err != nil {
			return err
		}
		m := &Manifest{Chunks: []ChunkRef{{ID: c, Len: uint32(len(obj))}}}
		if k%5 == 0 {
			m.AddHole(4096)
		}
		if err := tx.PutManifest(first, m); err != nil {
			return err
		}
		if err := tx.Queue().Add(c, Hint{}, uint32(len(obj))); err != nil {
			return err
		}
		if err := tx.Uploads().Add([]ID{c}); err != nil {
			return err
		}
		if k%3 == 0 && k > 0 { // remove an earlier file
			old := fmt.Sprintf("f%d", rng.IntN(k))
			if ino, ok := tx.Lookup(RootIno, old); ok {
				if err := tx.Unlink(RootIno, old); err != nil {
					return err
				}
				if err := tx.DeleteNode(ino); err != nil {
					return err
				}
			}
			if err := tx.Uploads().Forget([]ID{id(k - 1)}); err != nil {
				return err
			}
		}
		if k%7 == 0 {
			if err := RawPut(tx, "meta", []byte(fmt.Sprintf("test-%d", k%4)), obj[:8]); err != nil {
				return err
			}
		}
		if k%11 == 0 {
			if err := DeleteBucket(tx, string(bucketRemoteChunk)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if k%13 == 0 { // a failed transaction: nothing of it is kept, nor logged
		boom := errors.New("boom")
		if err := d.Update(func(tx *Tx) error {
			if err := RawPut(tx, "meta", []byte("never"), []byte{1}); err != nil {
				return err
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("failed update: %v", err)
		}
	}
}

// crashImage writes, in a new directory, what a power loss at this moment
// could leave of the open catalog d at path, at worst: the log as written
// (its records file cleared from logCut on, when not 0),
// and the catalog file with every page that differs from the last
// checkpoint's file (ck) overwritten with garbage, as unsynced pages may be
// (the meta pages too). It returns the image's catalog path.
func crashImage(t *testing.T, path string, ck []byte, logCut int) string {
	t.Helper()
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(filepath.Join(filepath.Dir(path), walName))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(filepath.Dir(path), walDataName))
	if err != nil {
		t.Fatal(err)
	}
	if logCut > 0 { // a torn write: nothing of the records from logCut on
		clear(data[logCut:])
	}
	const ps = 4096
	for off := 0; off < len(cur); off += ps {
		end := min(off+ps, len(cur))
		if end <= len(ck) && bytes.Equal(cur[off:end], ck[off:end]) {
			continue
		}
		for i := off; i < end; i++ {
			cur[i] = 0xAA
		}
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "catalog.db")
	if err := os.WriteFile(img, cur, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, walName), log, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, walDataName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return img
}

// recovered opens what Recover makes of img, read-only.
func recovered(t *testing.T, img string) *DB {
	t.Helper()
	r, err := Open(img, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the crash image: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := os.Stat(filepath.Join(filepath.Dir(img), walName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the log is still there after recovery: %v", err)
	}
	return r
}

// TestWALRecovery: after any number of transactions, checkpoints included,
// from several writers at once, the checkpoint's file with every later page
// destroyed plus the log recover to exactly the rows of the live catalog.
func TestWALRecovery(t *testing.T) {
	for _, tc := range []struct {
		name       string
		writers    int
		txs        int
		checkpoint int64
	}{
		{"one writer, no checkpoint", 1, 60, 1 << 30},
		{"one writer, checkpoints", 1, 200, 64 << 10},
		{"four writers, checkpoints", 4, 100, 96 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, path := testDB(t)
			var ck []byte
			var checkpoints int
			copyFile := func() {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Error(err)
				}
				ck = b
				checkpoints++
			}
			d.wmu.Lock()
			d.checkpointBytes, d.onCheckpoint = tc.checkpoint, copyFile
			copyFile() // the checkpoint Open took
			d.wmu.Unlock()
			var wg sync.WaitGroup
			for w := range tc.writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for i := range tc.txs {
						walWork(t, d, rng, w*tc.txs+i)
					}
				}()
			}
			wg.Wait()
			if tc.checkpoint < 1<<30 && checkpoints < 3 {
				t.Fatalf("%d checkpoints: the case does not test them", checkpoints)
			}
			d.wmu.Lock()
			img := crashImage(t, path, ck, 0)
			d.wmu.Unlock()
			want := dump(t, d)
			r := recovered(t, img)
			if got := dump(t, r); got != want {
				t.Fatalf("recovered catalog differs from the live one:\n%s", firstDiff(got, want))
			}
			var live int
			d.View(func(tx *Tx) error { live = tx.Format(); return nil })
			if r.Format() != uint32(live) || live == formatWAL {
				t.Fatalf("recovered format %d, live %d", r.Format(), live)
			}
		})
	}
}

// TestWALTornAppend: a log whose last record is cut anywhere recovers to
// the state after the record before it (a commit returns only once its
// record is durable: a cut one was never acknowledged).
func TestWALTornAppend(t *testing.T) {
	d, path := testDB(t)
	ck, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(filepath.Dir(path), walName)
	rng := rand.New(rand.NewPCG(7, 7))
	var states []string
	var ends []int
	for k := range 12 { // one record each
		if err := d.Update(func(tx *Tx) error {
			v := make([]byte, 100+rng.IntN(3000))
			for i := range v {
				v[i] = byte(rng.Uint32())
			}
			if err := RawPut(tx, "meta", []byte(fmt.Sprintf("torn-%d", k%5)), v); err != nil {
				return err
			}
			if k%4 == 3 {
				return RawDelete(tx, "meta", []byte(fmt.Sprintf("torn-%d", k%5-1)))
			}
			return tx.PutNode(Node{Ino: FirstIno + uint64(k), Mode: syscall.S_IFREG | 0o600, Size: int64(k)})
		}); err != nil {
			t.Fatal(err)
		}
		d.wmu.Lock()
		end := int(d.wal.size)
		d.wmu.Unlock()
		states, ends = append(states, dump(t, d)), append(ends, end)
	}
	for i := 1; i < len(ends); i++ {
		for _, cut := range []int{1, 8, 17, (ends[i] - ends[i-1]) / 2, ends[i] - ends[i-1] - 1} {
			r := recovered(t, crashImage(t, path, ck, ends[i-1]+cut))
			if got := dump(t, r); got != states[i-1] {
				t.Fatalf("record %d cut after %d bytes: not the state before it:\n%s", i, cut, firstDiff(got, states[i-1]))
			}
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a closed catalog keeps its log: %v", err)
	}
}

// TestWALFormatWhileOpen: an open catalog is at format 8 on disk (older
// ckptfs versions refuse it) and reports its own; a clean close puts its
// own back; a crash leaves 8 until recovery.
func TestWALFormatWhileOpen(t *testing.T) {
	d, path := testDB(t)
	onDisk := func() int {
		var f int
		b, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		b.View(func(tx *bolt.Tx) error {
			f = int(binary.BigEndian.Uint32(tx.Bucket(bucketMeta).Get(keyFormat)))
			return nil
		})
		return f
	}
	if d.Format() != formatSealed {
		t.Fatalf("open catalog reports format %d, want its own %d", d.Format(), formatSealed)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	walWork(t, d, rng, 0) // an inline chunk: the store moves to 7, a hole to 5
	var f int
	d.View(func(tx *Tx) error { f = tx.Format(); return nil })
	if f != formatInline {
		t.Fatalf("after an inline chunk the store is at %d, want %d", f, formatInline)
	}
	d.View(func(tx *Tx) error {
		f = int(binary.BigEndian.Uint32(tx.b(bucketMeta).Get(keyFormat)))
		return nil
	})
	if f != formatWAL {
		t.Fatalf("an open catalog's format key is %d, want %d", f, formatWAL)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := onDisk(); got != formatInline {
		t.Fatalf("after a clean close the catalog is at %d, want %d", got, formatInline)
	}
}

// firstDiff returns the first line where a and b differ, with its neighbours.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n got  %s\n want %s", i, x, y)
		}
	}
	return "(no line differs)"
}

// TestWALMap: the log's mapping in a process limited in address space.
func TestWALMap(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		size  int64
		want  int
	}{
		{unix.RLIM_INFINITY, 10 << 30, walMaxMap},
		{8 << 30, 100 << 20, 2 << 30}, // a quarter, the rest for Go
		{8 << 30, 600 << 20, 0},       // not four times the catalog: no log
		{128 << 20, 1 << 20, 0},       // under 64 MiB
		{1 << 50, 1 << 20, walMaxMap},
	} {
		if got := walMapFor(tc.limit, tc.size); got != tc.want {
			t.Errorf("limit %d, catalog %d: mapping %d, want %d", tc.limit, tc.size, got, tc.want)
		}
	}
}

// TestUpdateAroundReleasesBeforeAfter: UpdateAround's after (which takes
// the caller's lock again) runs once the catalog's writer lock is released,
// also when the transaction changed nothing or failed: a writer that took
// the caller's lock meanwhile and waits for the catalog would otherwise
// never get it.
func TestUpdateAroundReleasesBeforeAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(*Tx) error
	}{
		{"no change", func(*Tx) error { return nil }},
		{"a change", func(tx *Tx) error { return RawPut(tx, "meta", []byte("k"), []byte("v")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := testDB(t)
			var mu sync.Mutex // the caller's lock
			taken := make(chan struct{})
			done := make(chan error, 2)
			mu.Lock()
			go func() {
				done <- d.UpdateAround(tc.fn, func() func() {
					mu.Unlock()
					<-taken // the other writer holds the caller's lock now
					return mu.Lock
				})
				mu.Unlock()
			}()
			go func() {
				mu.Lock()
				close(taken)
				done <- d.Update(func(tx *Tx) error { return RawPut(tx, "meta", []byte("k2"), []byte("v")) })
				mu.Unlock()
			}()
			for range 2 {
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("deadlock: after waits for the caller's lock with the catalog's held")
				}
			}
		})
	}
}

// TestWALStaleGeneration: a checkpoint writes the next records over the
// last generation's, from the start of the records file; records of equal
// size make an older record begin exactly where the newer ones end, with
// the very sequence number that would come next. Recovery must stop there
// (the record names the older generation), not replay it.
func TestWALStaleGeneration(t *testing.T) {
	d, path := testDB(t)
	put := func(k int, v byte) {
		if err := d.Update(func(tx *Tx) error {
			return RawPut(tx, "meta", []byte(fmt.Sprintf("stale-%03d", k)), bytes.Repeat([]byte{v}, 100))
		}); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 10 { // generation A: ten records of one size
		put(k, 'a')
	}
	d.wmu.Lock()
	if err := d.checkpoint(); err != nil {
		t.Fatal(err)
	}
	d.wmu.Unlock()
	ck, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Generation B: two records of the same size, over A's first two, that
	// change rows A's later records wrote (A's sixth, replayed, would put
	// row 5 back as it was before).
	put(5, 'b')
	put(6, 'b')
	want := dump(t, d)
	r := recovered(t, crashImage(t, path, ck, 0))
	if got := dump(t, r); got != want {
		t.Fatalf("recovery replayed the older generation's records:\n%s", firstDiff(got, want))
	}
}
