package catalog

import (
	"errors"
	"testing"
)

// A node with several names keeps its count and its tail (target, device
// number) through a record of version 2; one name is a version-1 record, as
// older binaries write and read it.
func TestLinkedNodeRecords(t *testing.T) {
	for _, n := range []Node{
		{Ino: 9, Mode: 0o100644, Size: 3, Mtime: 4, Nlink: 2},
		{Ino: 9, Mode: 0o120777, Size: 3, Target: "a/b", Nlink: 3},
		{Ino: 9, Mode: 0o020600, Rdev: 0x0103, Nlink: 65000},
		{Ino: 9, Mode: 0o100644, Size: 3, Nlink: 1},
	} {
		rec := n.marshal()
		want := byte(nodeRecordVersionLinks)
		if n.Nlink == 1 {
			want = nodeRecordVersion
		}
		if rec[0] != want {
			t.Errorf("nlink %d: record version %d, want %d", n.Nlink, rec[0], want)
		}
		back, err := unmarshalNode(9, rec)
		if err != nil || back != n {
			t.Errorf("round trip of %+v: %+v %v", n, back, err)
		}
	}
	one := Node{Ino: 9, Mode: 0o100644, Nlink: 2}
	rec := one.marshal()
	rec[45] = 1 // a version-2 record that counts one name
	if _, err := unmarshalNode(9, rec); err == nil {
		t.Error("a version-2 record of one name parsed")
	}
	if _, err := unmarshalNode(9, one.marshal()[:47]); err == nil {
		t.Error("a short version-2 record parsed")
	}
}

// TestLinksMigrateOldStore: a store written before hard links (format 2,
// and format 3 with deltas; format 1, unsealed, is migrated to 2 first)
// reads every node as having one name; its first link moves it to format 4
// in the same transaction, which an older ckptfs then refuses; AddLink and
// DropLink count names, PutNode keeps the count, and the last DropLink
// deletes the node and its manifest.
func TestLinksMigrateOldStore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format uint32
	}{{"format1", 1}, {"format2", formatSealed}, {"format3", formatDeltas}} {
		t.Run(tc.name, func(t *testing.T) {
			d, path := testDB(t)
			const ino = FirstIno
			err := d.Update(func(tx *Tx) error {
				if err := tx.PutNode(Node{Ino: ino, Mode: 0o100644, Size: 2}); err != nil {
					return err
				}
				if err := tx.PutManifest(ino, &Manifest{}); err != nil {
					return err
				}
				return tx.Link(RootIno, "a", ino)
			})
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			if tc.format == 1 {
				Unseal(t, path)
			} else {
				SetFormat(t, path, tc.format)
			}
			d, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			err = d.Update(func(tx *Tx) error {
				n, ok, err := tx.Node(ino)
				if err != nil || !ok || n.Nlink != 1 {
					t.Fatalf("old node: %+v %v %v", n, ok, err)
				}
				if f := tx.Format(); f != max(int(tc.format), formatSealed) {
					t.Fatalf("format %d before the first link", f)
				}
				if c, err := tx.AddLink(ino, 77); err != nil || c != 2 {
					t.Fatalf("AddLink: %d %v", c, err)
				}
				if n, _, _ := tx.Node(ino); n.Ctime != 77 {
					t.Fatalf("ctime after a link: %d", n.Ctime)
				}
				if _, err := tx.AddLink(RootIno, 77); err == nil {
					t.Fatal("a directory got a link")
				}
				if err := tx.Link(RootIno, "b", ino); err != nil {
					return err
				}
				return tx.PutNode(Node{Ino: ino, Mode: 0o100600, Size: 2}) // a chmod: the count stays
			})
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			d, err = Open(path, Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			err = d.View(func(tx *Tx) error {
				n, _, err := tx.Node(ino)
				if tx.Format() != formatLinks || n.Nlink != 2 || n.Mode != 0o100600 || err != nil {
					t.Fatalf("after link: format %d, node %+v %v", tx.Format(), n, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			d, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			err = d.Update(func(tx *Tx) error {
				if left, err := tx.DropLink(ino, 88); err != nil || left != 1 {
					t.Fatalf("first DropLink: %d %v", left, err)
				}
				if n, _, _ := tx.Node(ino); n.Nlink != 1 || n.Ctime != 88 {
					t.Fatalf("after one unlink: %+v", n)
				}
				if left, err := tx.DropLink(ino, 99); err != nil || left != 0 {
					t.Fatalf("last DropLink: %d %v", left, err)
				}
				_, hasNode, _ := tx.Node(ino)
				_, hasManifest, _ := tx.Manifest(ino)
				if hasNode || hasManifest || tx.Counts().Files != 0 {
					t.Fatalf("after the last unlink: node %v manifest %v counts %+v", hasNode, hasManifest, tx.Counts())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A node's names stop at MaxLinks (EMLINK).
func TestTooManyLinks(t *testing.T) {
	d, _ := testDB(t)
	err := d.Update(func(tx *Tx) error {
		if err := tx.PutNode(Node{Ino: FirstIno, Mode: 0o100644}); err != nil {
			return err
		}
		n, _, _ := tx.Node(FirstIno)
		n.Nlink = MaxLinks
		key := u64key(FirstIno)
		if err := tx.b(bucketNodes).Put(key, sealRecord(key, n.marshal())); err != nil {
			return err
		}
		if _, err := tx.AddLink(FirstIno, 1); !errors.Is(err, ErrTooManyLinks) {
			t.Fatalf("AddLink at MaxLinks: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
