package catalog

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

// testDB creates and opens a catalog in a temporary directory.
func testDB(t *testing.T) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "catalog.db")
	if err := Create(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

// TestCreateOpen: a created catalog holds the root directory, its chunk
// size and format 2; a second writer is refused with ErrLocked, and a newer
// format with ErrNewerFormat.
func TestCreateOpen(t *testing.T) {
	d, path := testDB(t)
	if d.Format() != formatSealed || d.ChunkSize() != 1<<20 {
		t.Fatalf("format %d chunk size %d", d.Format(), d.ChunkSize())
	}
	if err := d.View(func(tx *Tx) error {
		n, ok, err := tx.Node(RootIno)
		if err != nil || !ok || !n.IsDir() {
			t.Fatalf("root: %+v %v %v", n, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if !Locked(path, false) {
		t.Fatal("Locked says the catalog is free while it is open")
	}
	d.Close()
	SetFormat(t, path, FormatVersion+1)
	if _, err := Open(path, Options{ReadOnly: true}); !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("newer format: %v, want ErrNewerFormat", err)
	}
}

// TestReserveInos: reservations never overlap, and start at FirstIno.
func TestReserveInos(t *testing.T) {
	d, _ := testDB(t)
	a, err := d.ReserveInos(10)
	if err != nil || a != FirstIno {
		t.Fatalf("first reservation %d %v", a, err)
	}
	b, err := d.ReserveInos(10)
	if err != nil || b != a+10 {
		t.Fatalf("second reservation %d %v", b, err)
	}
}

// TestBookkeepingRows: the index, queue, delta and upload rows keep their
// counters, and the queue is walked in order, wrapping round once.
func TestBookkeepingRows(t *testing.T) {
	d, _ := testDB(t)
	ids := []ID{object.Sum([]byte("a")), object.Sum([]byte("b")), object.Sum([]byte("c"))}
	err := d.Update(func(tx *Tx) error {
		for _, id := range ids {
			if added, err := tx.Index().Add(id, ChunkInfo{RawLen: 100, StoredLen: 124}); err != nil || !added {
				t.Fatalf("add %v: %v %v", id, added, err)
			}
			if err := tx.Queue().Add(id, Hint{ElemSize: 2}, 100); err != nil {
				return err
			}
		}
		if added, err := tx.Index().Add(ids[0], ChunkInfo{RawLen: 100, StoredLen: 124}); err != nil || added {
			t.Fatalf("second add: %v %v", added, err)
		}
		if err := tx.Index().SetStored(ids[0], 60, object.CodecZstd); err != nil {
			return err
		}
		if err := tx.Deltas().Put(ids[1], DeltaLink{Base: ids[0], Dist: 1}); err != nil {
			return err
		}
		if err := tx.Deltas().Put(ids[2], DeltaLink{Base: ids[1], Dist: 1}); !errors.Is(err, ErrDeltaRefused) {
			t.Fatalf("delta against a delta: %v, want ErrDeltaRefused", err)
		}
		return tx.Uploads().Add(ids[:1])
	})
	if err != nil {
		t.Fatal(err)
	}
	err = d.View(func(tx *Tx) error {
		c := tx.Counts()
		if c.Chunks != 3 || c.UniqueBytes != 300 || c.StoredBytes != 60+2*124 || c.ReencodePending != 3 || c.ReencodePendingBytes != 300 || c.DeltaChunks != 1 {
			t.Fatalf("counts %+v", c)
		}
		if tx.Format() != formatDeltas || !tx.IsBase(ids[0]) || !tx.HasBaseRow(ids[0], ids[1]) {
			t.Fatalf("format %d, base rows %v %v", tx.Format(), tx.IsBase(ids[0]), tx.HasBaseRow(ids[0], ids[1]))
		}
		if !tx.Uploads().Has(ids[0]) || tx.Uploads().Has(ids[1]) {
			t.Fatal("uploaded set")
		}
		first, more, err := tx.Queue().Next(nil, 2)
		if err != nil || len(first) != 2 || !more {
			t.Fatalf("next: %v %v %v", first, more, err)
		}
		rest, more, err := tx.Queue().Next(first[1][:], 3)
		if err != nil || len(rest) != 3 || more || rest[1] != first[0] {
			t.Fatalf("next after %v: %v %v %v", first[1], rest, more, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Update(func(tx *Tx) error {
		if err := tx.Deltas().Drop(ids[1]); err != nil {
			return err
		}
		for _, id := range ids {
			if err := tx.Queue().Remove(id); err != nil {
				return err
			}
			info, _, err := tx.Chunk(id)
			if err != nil {
				return err
			}
			if err := tx.Index().Delete(id, info); err != nil {
				return err
			}
		}
		return tx.Uploads().Forget(ids)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.View(func(tx *Tx) error {
		if c := tx.Counts(); c != (Counts{Dirs: 1}) { // the root
			t.Fatalf("counts after removing everything: %+v", c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestHolesFormat: a manifest without holes leaves the format alone; the
// first with a hole moves the store to formatHoles (an older ckptfs then
// refuses it), and a delta row after that does not move it back.
func TestHolesFormat(t *testing.T) {
	d, _ := testDB(t)
	a, b := object.Sum([]byte("a")), object.Sum([]byte("b"))
	format := func() int {
		f := 0
		_ = d.View(func(tx *Tx) error { f = tx.Format(); return nil })
		return f
	}
	steps := []struct {
		name string
		put  func(tx *Tx) error
		want int
	}{
		{"plain manifest", func(tx *Tx) error {
			return tx.PutManifest(FirstIno, &Manifest{Chunks: []ChunkRef{{a, 1}}})
		}, formatSealed},
		{"manifest with a hole", func(tx *Tx) error {
			return tx.PutManifest(FirstIno+1, &Manifest{Holes: []Hole{{0, 1 << 40}}})
		}, formatHoles},
		{"delta row", func(tx *Tx) error {
			for _, id := range []ID{a, b} {
				if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 1, StoredLen: 30}); err != nil {
					return err
				}
			}
			return tx.Deltas().Put(b, DeltaLink{Base: a, Dist: 1})
		}, formatHoles},
	}
	for _, s := range steps {
		if err := d.Update(s.put); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if f := format(); f != s.want {
			t.Fatalf("after %s: format %d, want %d", s.name, f, s.want)
		}
	}
	err := d.View(func(tx *Tx) error {
		m, ok, err := tx.Manifest(FirstIno + 1)
		if err != nil || !ok || m.Size() != 1<<40 || len(m.Chunks) != 0 {
			t.Fatalf("hole manifest back: %+v %v %v", m, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
