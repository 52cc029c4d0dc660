package cas

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/cas/catalog"
)

// TestRecordsAreChecked: every catalog record carries a checksum over its key
// and value; any one flipped byte of a value is an error wrapping
// ErrCatalogDamaged, never a different record.
func TestRecordsAreChecked(t *testing.T) {
	s := testStore(t, Options{})
	ref := put(t, s, pseudoRandom(5000, 1))
	m := &Manifest{Chunks: []ChunkRef{ref}, Extra: []byte(`{"format":"x"}`)}
	const ino = FirstIno + 7
	if err := s.Update(func(tx *Tx) error {
		if err := tx.PutNode(Node{Ino: ino, Mode: 0o100644, Size: 5000}); err != nil {
			return err
		}
		if err := tx.Link(RootIno, "f", ino); err != nil {
			return err
		}
		return tx.PutManifest(ino, m)
	}); err != nil {
		t.Fatal(err)
	}
	reads := []struct {
		bucket string
		key    []byte
		read   func(tx *Tx) error
	}{
		{"nodes", catalog.NodeKey(ino), func(tx *Tx) error { _, _, err := tx.Node(ino); return err }},
		{"manifests", catalog.NodeKey(ino), func(tx *Tx) error { _, _, err := tx.Manifest(ino); return err }},
		{"chunks", ref.ID[:], func(tx *Tx) error { _, _, err := tx.Chunk(ref.ID); return err }},
		{"dirents", catalog.DirentKey(RootIno, "f"), func(tx *Tx) error {
			return tx.Children(RootIno, func(string, uint64) error { return nil })
		}},
	}
	for _, r := range reads {
		var orig []byte
		if err := s.View(func(tx *Tx) error { orig = catalog.RawGet(tx, r.bucket, r.key); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s.View(r.read); err != nil {
			t.Fatalf("%s: intact record: %v", r.bucket, err)
		}
		for i := range orig {
			bad := bytes.Clone(orig)
			bad[i] ^= 0x04
			if err := s.Update(func(tx *Tx) error { return catalog.RawPut(tx, r.bucket, r.key, bad) }); err != nil {
				t.Fatal(err)
			}
			if err := s.View(r.read); !errors.Is(err, ErrCatalogDamaged) {
				t.Fatalf("%s: byte %d flipped: %v, want ErrCatalogDamaged", r.bucket, i, err)
			}
		}
		if err := s.Update(func(tx *Tx) error { return catalog.RawPut(tx, r.bucket, r.key, orig) }); err != nil {
			t.Fatal(err)
		}
	}
	// A dirent moved under another key (a flipped key byte) does not check.
	if err := s.Update(func(tx *Tx) error {
		v := catalog.RawGet(tx, "dirents", catalog.DirentKey(RootIno, "f"))
		return catalog.RawPut(tx, "dirents", catalog.DirentKey(RootIno, "g"), v)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.View(func(tx *Tx) error { return tx.Children(RootIno, func(string, uint64) error { return nil }) }); !errors.Is(err, ErrCatalogDamaged) {
		t.Fatalf("a record under another key: %v, want ErrCatalogDamaged", err)
	}
}

// TestFormat1StoreIsMigrated: a store written before records were sealed
// (format 1) opens read-only as it is, and a writable Open seals every record
// and moves it to format 2, keeping its content.
func TestFormat1StoreIsMigrated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := pseudoRandom(3000, 2)
	ref := put(t, s, data)
	b := s.NewBatch()
	if _, err := b.Put(context.Background(), pseudoRandom(3000, 3)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), b, func(tx *Tx) error {
		if err := tx.Queue().Add(ref.ID, Hint{ElemSize: 2}, ref.Len); err != nil {
			return err
		}
		if err := tx.PutNode(Node{Ino: FirstIno, Mode: 0o100600, Size: int64(ref.Len), Mtime: 42}); err != nil {
			return err
		}
		if err := tx.Link(RootIno, "model.bin", FirstIno); err != nil {
			return err
		}
		return tx.PutManifest(FirstIno, &Manifest{Chunks: []ChunkRef{ref}})
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Rewrite it as format 1: every value unsealed.
	catalog.Unseal(t, filepath.Join(dir, catalogName))

	check := func(s *Store, wantFormat uint32) {
		t.Helper()
		if s.format != wantFormat {
			t.Fatalf("format %d, want %d", s.format, wantFormat)
		}
		if err := s.View(func(tx *Tx) error {
			ino, ok := tx.Lookup(RootIno, "model.bin")
			if !ok || ino != FirstIno {
				t.Fatalf("lookup: %d %v", ino, ok)
			}
			n, ok, err := tx.Node(FirstIno)
			if err != nil || !ok || n.Mtime != 42 {
				t.Fatalf("node: %+v %v %v", n, ok, err)
			}
			m, ok, err := tx.Manifest(FirstIno)
			if err != nil || !ok || len(m.Chunks) != 1 || m.Chunks[0] != ref {
				t.Fatalf("manifest: %+v %v %v", m, ok, err)
			}
			if _, ok, err := tx.PendingReencode(ref.ID); err != nil || !ok {
				t.Fatalf("queue row: %v %v", ok, err)
			}
			return tx.ForEachChunk(func(ID, ChunkInfo) error { return nil })
		}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReadChunk(context.Background(), ref)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read: %v", err)
		}
	}
	ro, err := openLocal(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	check(ro, 1)
	ro.Close()
	rw, err := openLocal(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	check(rw, 2)
	if err := rw.View(func(tx *Tx) error {
		return catalog.RawForEach(tx, "nodes", func(k, v []byte) error {
			if !catalog.IsSealed(v) {
				t.Errorf("node %x not sealed after migration", k)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
}
