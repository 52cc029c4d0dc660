package catalog

import (
	"errors"
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

// TestChunkRecordVersions: a version-1 row (no pack) and a version-2 row
// (pack and offset) round-trip; an unpacked row is still written as
// version 1, so an older ckptfs reads it; malformed records are refused.
func TestChunkRecordVersions(t *testing.T) {
	pack := object.Sum([]byte("pack"))
	for _, c := range []struct {
		info ChunkInfo
		ver  byte
		n    int
	}{
		{ChunkInfo{RawLen: 5, StoredLen: 29, Codec: 1}, 1, 10},
		{ChunkInfo{RawLen: 5, StoredLen: 29, Codec: 1, Pack: pack, Offset: 1 << 20}, 2, 46},
	} {
		b := c.info.marshal()
		if b[0] != c.ver || len(b) != c.n {
			t.Fatalf("%+v: version %d, %d bytes; want %d, %d", c.info, b[0], len(b), c.ver, c.n)
		}
		got, err := unmarshalChunkInfo(b)
		if err != nil || got != c.info {
			t.Fatalf("%+v: round trip %+v %v", c.info, got, err)
		}
	}
	for _, bad := range [][]byte{
		append([]byte{2}, make([]byte, 9)...),  // version 2, version-1 length
		append([]byte{1}, make([]byte, 45)...), // version 1, version-2 length
		append([]byte{2}, make([]byte, 45)...), // version 2 with a zero pack
	} {
		if _, err := unmarshalChunkInfo(bad); err == nil {
			t.Fatalf("record %x accepted", bad)
		}
	}
}

// TestPackRowsAndFormat: the first pack moves a format-2 or format-3
// store to format 6 (older binaries refuse it); a pack's row counts its
// chunks and goes with the last; a chunk row naming a pack without a row,
// or past its end, is refused.
func TestPackRowsAndFormat(t *testing.T) {
	for _, start := range []int{formatSealed, formatDeltas} {
		d, _ := testDB(t)
		pack := object.Sum([]byte("pack"))
		a, b := object.Sum([]byte("a")), object.Sum([]byte("b"))
		ia := ChunkInfo{RawLen: 10, StoredLen: 34, Pack: pack, Offset: 0}
		ib := ChunkInfo{RawLen: 10, StoredLen: 34, Pack: pack, Offset: 34}
		err := d.Update(func(tx *Tx) error {
			if err := tx.b(bucketMeta).Put(keyFormat, []byte{0, 0, 0, byte(start)}); err != nil {
				return err
			}
			if _, err := tx.Index().Add(a, ia); err == nil {
				t.Errorf("format %d: a chunk row naming an unrecorded pack was accepted", start)
			}
			if err := tx.Index().AddPack(pack, 68); err != nil {
				return err
			}
			if _, err := tx.Index().Add(a, ChunkInfo{RawLen: 10, StoredLen: 34, Pack: pack, Offset: 40}); err == nil {
				t.Errorf("format %d: a chunk past its pack's end was accepted", start)
			}
			for id, info := range map[ID]ChunkInfo{a: ia, b: ib} {
				if _, err := tx.Index().Add(id, info); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var f int
		if err := d.View(func(tx *Tx) error { f = tx.Format(); return nil }); err != nil {
			t.Fatal(err)
		}
		if f != formatPacks {
			t.Fatalf("format %d after the first pack from %d, want %d", f, start, formatPacks)
		}
		err = d.Update(func(tx *Tx) error {
			p, ok, err := tx.Pack(pack)
			if err != nil || !ok || p != (PackInfo{Size: 68, Live: 2, LiveBytes: 68}) {
				t.Fatalf("pack row %+v %v %v", p, ok, err)
			}
			if err := tx.Index().Delete(a, ia); err != nil {
				return err
			}
			if c := tx.Counts(); c.Packs != 1 || c.PackBytes != 68 || c.PackedBytes != 34 {
				t.Fatalf("counts after one delete: %+v", c)
			}
			if err := tx.Index().Delete(b, ib); err != nil {
				return err
			}
			if _, ok, _ := tx.Pack(pack); ok {
				t.Fatal("pack row kept after its last chunk went")
			}
			if c := tx.Counts(); c.Packs != 0 || c.PackBytes != 0 || c.PackedBytes != 0 {
				t.Fatalf("counts after the last delete: %+v", c)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestDamagedPackRow: a flipped byte in a pack row is an error wrapping
// ErrCatalogDamaged, never another row.
func TestDamagedPackRow(t *testing.T) {
	d, _ := testDB(t)
	pack := object.Sum([]byte("pack"))
	err := d.Update(func(tx *Tx) error {
		if err := tx.Index().AddPack(pack, 100); err != nil {
			return err
		}
		v := append([]byte(nil), tx.b(bucketPacks).Get(pack[:])...)
		v[3] ^= 1
		return tx.b(bucketPacks).Put(pack[:], v)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = d.View(func(tx *Tx) error { _, _, err := tx.Pack(pack); return err })
	if !errors.Is(err, ErrCatalogDamaged) {
		t.Fatalf("damaged pack row: %v, want ErrCatalogDamaged", err)
	}
}

// TestOpenAddsPacksBucket: a catalog made before packs (no packs bucket)
// gets the bucket at a writable Open, and then records packs; opened
// read-only, it reads every chunk as unpacked.
func TestOpenAddsPacksBucket(t *testing.T) {
	d, path := testDB(t)
	id := object.Sum([]byte("old"))
	if err := d.Update(func(tx *Tx) error {
		if _, err := tx.Index().Add(id, ChunkInfo{RawLen: 3, StoredLen: 27}); err != nil {
			return err
		}
		return tx.tx.DeleteBucket(bucketPacks)
	}); err != nil {
		t.Fatal(err)
	}
	d.Close()

	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.View(func(tx *Tx) error {
		if _, ok, err := tx.Pack(object.Sum([]byte("pack"))); ok || err != nil {
			t.Fatalf("pack in a catalog without packs: %v %v", ok, err)
		}
		info, ok, err := tx.Chunk(id)
		if !ok || err != nil || info.Packed() {
			t.Fatalf("old row read-only: %+v %v %v", info, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ro.Close()

	d, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pack := object.Sum([]byte("pack"))
	if err := d.Update(func(tx *Tx) error {
		if err := tx.Index().AddPack(pack, 30); err != nil {
			return err
		}
		_, err := tx.Index().Add(object.Sum([]byte("new")), ChunkInfo{RawLen: 3, StoredLen: 27, Pack: pack, Offset: 3})
		return err
	}); err != nil {
		t.Fatalf("pack in a catalog opened after packs: %v", err)
	}
}
