package remote

import (
	"bytes"
	"context"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
)

// TestRemoteHardLinks: a file with three names is published as three
// entries with one manifest; a store that joins gets three files with the
// same bytes; and when the bucket changes one name and removes another, the
// merge into the store that has the links never changes the bytes of a
// name the bucket did not change through it: the names end as separate
// nodes, each with its own bytes and one name.
func TestRemoteHardLinks(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true})
	a, ra := testStore(t, remote)
	b, rb := testStore(t, remote)
	type view struct {
		ino   uint64
		nlink uint32
		size  int64
	}
	look := func(s *cas.Store, name string) view {
		t.Helper()
		v := view{size: -1}
		s.View(func(tx *cas.Tx) error {
			ino, ok := tx.Lookup(cas.RootIno, name)
			if !ok {
				return nil
			}
			n, _, _ := tx.Node(ino)
			m, _, _ := tx.Manifest(ino)
			v = view{ino, n.Nlink, m.Size()}
			return nil
		})
		return v
	}

	sa := join(t, a, ra)
	commitNamed(t, a, "f", pseudoRandom(1000, 50))
	if err := a.Update(func(tx *cas.Tx) error {
		ino, _ := tx.Lookup(cas.RootIno, "f")
		for _, name := range []string{"g", "keep"} {
			if _, err := tx.AddLink(ino, 1); err != nil {
				return err
			}
			if err := tx.Link(cas.RootIno, name, ino); err != nil {
				return err
			}
		}
		return tx.Uploads().CountCommit()
	}); err != nil {
		t.Fatal(err)
	}
	if err := ra.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	sa.Close(ctx)
	pub := readPublished(t, remote)
	var files []string
	for p, e := range pub {
		if e.kind() == syscall.S_IFREG {
			files = append(files, p)
		}
	}
	if len(files) != 3 {
		t.Fatalf("published: %d files (%v), want 3", len(files), files)
	}
	for _, p := range files[1:] {
		if !bytes.Equal(pub[p].Raw, pub[files[0]].Raw) {
			t.Fatalf("%s and %s: different manifests", p, files[0])
		}
	}

	sb := join(t, b, rb)
	f, g := look(b, "f"), look(b, "g")
	if f.size != 1000 || g.size != 1000 || f.ino == g.ino || f.nlink != 1 || g.nlink != 1 {
		t.Fatalf("joined store: f %+v g %+v, want separate files of 1000 bytes", f, g)
	}
	commitNamed(t, b, "f", pseudoRandom(2000, 51))
	if err := b.Update(func(tx *cas.Tx) error {
		ino, _ := tx.Lookup(cas.RootIno, "keep")
		if err := tx.Unlink(cas.RootIno, "keep"); err != nil {
			return err
		}
		if _, err := tx.DropLink(ino, 1); err != nil {
			return err
		}
		return tx.Uploads().CountCommit()
	}); err != nil {
		t.Fatal(err)
	}
	if err := rb.UploadRound(ctx, false); err != nil {
		t.Fatal(err)
	}
	sb.Close(ctx)

	join(t, a, ra)
	f, g = look(a, "f"), look(a, "g")
	if f.size != 2000 || g.size != 1000 || f.ino == g.ino || f.nlink != 1 || g.nlink != 1 {
		t.Errorf("after the merge: f %+v (want the bucket's 2000 bytes), g %+v (want its 1000), separate nodes of one name", f, g)
	}
	if st, _ := a.Stats(); st.Counts.Files != 2 {
		t.Errorf("after the merge the catalog counts %d files, want 2", st.Counts.Files)
	}
	if k := look(a, "keep"); k.size != -1 {
		t.Errorf("keep after the merge: %+v, want removed", k)
	}
}
