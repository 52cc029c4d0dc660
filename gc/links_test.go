package gc

import (
	"context"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

// Hard links: a file with several names is one file to fsck (counted once)
// and its chunks stay while any name does; fsck reports a node whose record
// counts more names than entries name it (a later unlink of every name would
// leave it in no directory), and an entry beyond the count.
func TestFsckAndCollectWithLinks(t *testing.T) {
	s := newStore(t)
	data := chunkData(7, 3000)
	ino, _ := commitFile(t, s, "a", data)
	link := func(name string, count bool) {
		t.Helper()
		err := s.Update(func(tx *cas.Tx) error {
			if count {
				if _, err := tx.AddLink(ino, 1); err != nil {
					return err
				}
			}
			return tx.Link(cas.RootIno, name, ino)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	link("b", true)
	res, err := Fsck(context.Background(), s, FsckOptions{ReadData: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 0 || res.Files != 1 {
		t.Fatalf("two names of one file: %d files, problems %+v", res.Files, res.Problems)
	}
	// Remove "a" as an unlink does: one name less, the chunks stay for "b".
	err = s.Update(func(tx *cas.Tx) error {
		if err := tx.Unlink(cas.RootIno, "a"); err != nil {
			return err
		}
		_, err := tx.DropLink(ino, 2)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(context.Background(), s, Options{}); err != nil {
		t.Fatal(err)
	}
	mustFsck(t, s)

	kinds := func() map[string]int {
		t.Helper()
		res, err := Fsck(context.Background(), s, FsckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		k := map[string]int{}
		for _, p := range res.Problems {
			k[p.Kind]++
		}
		return k
	}
	link("c", true) // b, c: counted 2
	link("d", false)
	if k := kinds(); k["duplicate-entry"] != 1 || len(k) != 1 {
		t.Fatalf("an entry beyond the count: %v", k)
	}
	err = s.Update(func(tx *cas.Tx) error {
		if err := tx.Unlink(cas.RootIno, "d"); err != nil {
			return err
		}
		if err := tx.Unlink(cas.RootIno, "c"); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(); k["link-count"] != 1 || len(k) != 1 {
		t.Fatalf("fewer entries than the count: %v", k)
	}
}
