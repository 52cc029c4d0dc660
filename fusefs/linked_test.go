package fusefs

import (
	"os"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/catalog"
)

// TestRenameRecordsWhenNamed: a rename of a committed file or of a
// directory records when the entry got its new name (the remote tier's
// stamp of the moved path: catalog/linked.go); a create records nothing,
// and a file created later beside it does not move it.
func TestRenameRecordsWhenNamed(t *testing.T) {
	m := newMount(t)
	mustWrite(t, m.path("a.tmp"), []byte("saved"))
	if err := os.Mkdir(m.path("d.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixNano()
	for _, r := range [][2]string{{"a.tmp", "a"}, {"d.tmp", "d"}} {
		if err := os.Rename(m.path(r[0]), m.path(r[1])); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now().UnixNano()
	mustWrite(t, m.path("b"), []byte("later"))
	if err := m.cas.View(func(tx *cas.Tx) error {
		for _, name := range []string{"a", "d", "b"} {
			ino, ok := tx.Lookup(catalog.RootIno, name)
			if !ok {
				t.Fatalf("no %s", name)
			}
			at, err := tx.Linked(catalog.RootIno, name, ino)
			if err != nil {
				return err
			}
			if renamed := name != "b"; renamed && (at < before || at > after) || !renamed && at != 0 {
				t.Errorf("%s: named at %d, want between %d and %d for a rename, 0 for a create", name, at, before, after)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
