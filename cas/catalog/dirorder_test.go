package catalog

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// natLess is the order NaturalKey must give, written the plain way: runs of
// digits compare as numbers, the rest bytewise (the order fusefs's delta
// hints used before the index, by listing).
func natLess(a, b string) bool {
	run := func(s string) int {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i
	}
	for a != "" && b != "" {
		da, db := run(a), run(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

// TestNaturalKey: keys compare bytewise as names do in natural order, on
// the cases people name steps with and on random names of digits, letters
// and punctuation around '0'..'9'.
func TestNaturalKey(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{
		{"step-90", "step-100", true},
		{"step-100", "step-90", false},
		{"checkpoint-500", "checkpoint-1000", true},
		{"0200", "0210", true},
		{"007", "7", false}, // equal numbers: neither is less...
		{"7", "007", false},
		{"a", "b", true},
		{"a", "a", false},
		{"a1", "a1b", true},
		{"x10y2", "x10y10", true},
		{"global_step99", "global_step100", true},
		{"0", "00", false},
		{"0", "/", false}, // a digit against the bytes either side of the digits
		{"0", ":", true},
		{"9", ":", true},
		{"a0", "a", false},
		{"a", "a0", true},
	} {
		if got := natLess(c.a, c.b); got != c.less {
			t.Fatalf("reference natLess(%q, %q) = %v, want %v", c.a, c.b, got, c.less)
		}
		if got := bytes.Compare(NaturalKey(c.a), NaturalKey(c.b)) < 0; got != c.less {
			t.Errorf("NaturalKey(%q) < NaturalKey(%q) = %v, want %v", c.a, c.b, got, c.less)
		}
	}
	rng := rand.New(rand.NewPCG(27, 1))
	const alphabet = "0123456789/:-_a"
	name := func() string {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 100000 {
		a, b := name(), name()
		ka, kb := NaturalKey(a), NaturalKey(b)
		if natLess(a, b) != (bytes.Compare(ka, kb) < 0) || natLess(b, a) != (bytes.Compare(kb, ka) < 0) {
			t.Fatalf("%q %q: natLess %v/%v, keys %x %x", a, b, natLess(a, b), natLess(b, a), ka, kb)
		}
		if ak, bk := dirOrderKey(1, a), dirOrderKey(1, b); natLess(a, b) && bytes.Compare(ak, bk) >= 0 {
			t.Fatalf("%q before %q, but its row key %x is not before %x", a, b, ak, bk)
		}
	}
}

// prevByListing is PrevSibling the way it was done before the index: a
// listing of the whole directory, the greatest name in natural order below
// name, the first bytewise among equals.
func prevByListing(t *testing.T, tx *Tx, dir uint64, name string) (string, uint64, bool) {
	t.Helper()
	var best string
	var bestIno uint64
	if err := tx.Children(dir, func(child string, ino uint64) error {
		if natLess(child, name) && (bestIno == 0 || natLess(best, child)) {
			best, bestIno = child, ino
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return best, bestIno, bestIno != 0
}

// checkPrevSiblings asks PrevSibling for every name of dirs and some that
// are not there, and compares with a listing.
func checkPrevSiblings(t *testing.T, d *DB, dirs []uint64, extra []string) {
	t.Helper()
	if err := d.View(func(tx *Tx) error {
		if err := DirOrderMismatch(tx); err != nil {
			t.Fatal(err)
		}
		for _, dir := range dirs {
			names := append([]string(nil), extra...)
			if err := tx.Children(dir, func(n string, _ uint64) error { names = append(names, n); return nil }); err != nil {
				return err
			}
			for _, n := range names {
				wn, wi, wok := prevByListing(t, tx, dir, n)
				gn, gi, gok, err := tx.PrevSibling(dir, n)
				if err != nil || gn != wn || gi != wi || gok != wok {
					t.Fatalf("PrevSibling(%d, %q) = %q %d %v %v, listing says %q %d %v", dir, n, gn, gi, gok, err, wn, wi, wok)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPrevSibling: the index answers as a listing does after creates,
// renames (within and across directories, over an existing name) and
// removals, and after a reopen; an old catalog without the index gets it
// built at Open; a row an older ckptfs left stale (its entry removed
// without the index) is skipped.
func TestPrevSibling(t *testing.T) {
	d, path := testDB(t)
	const a, b = 100, 200
	rng := rand.New(rand.NewPCG(27, 2))
	names := []string{"step-90", "step-100", "step-0100", "step-99", "checkpoint-500", "checkpoint-1000",
		"0200", "0210", "7", "007", "a", "a1", "a1b", "x10y2", "x10y10", "tmp", "z"}
	for i := range 200 {
		names = append(names, fmt.Sprintf("step-%d", rng.IntN(10000)), fmt.Sprintf("global_step%d", i*10))
	}
	extra := []string{"step-5", "step-100000", "", "0", "step-"}
	for i, n := range names {
		if err := d.Update(func(tx *Tx) error { return tx.Link(a, n, uint64(1000+i)) }); err != nil {
			t.Fatal(err)
		}
	}
	checkPrevSiblings(t, d, []uint64{a, b}, extra)

	// Renames and removals, as fusefs does them: unlink and link, in one
	// transaction.
	for i := range 300 {
		err := d.Update(func(tx *Tx) error {
			from := names[rng.IntN(len(names))]
			ino, ok := tx.Lookup(a, from)
			if !ok {
				return nil
			}
			if err := tx.Unlink(a, from); err != nil {
				return err
			}
			switch i % 3 {
			case 0: // removed
				return nil
			case 1: // renamed in place, perhaps over another name
				return tx.Link(a, names[rng.IntN(len(names))], ino)
			default: // moved to the other directory
				return tx.Link(b, from, ino)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	checkPrevSiblings(t, d, []uint64{a, b}, extra)

	// Reopened: the rows are in the file.
	d.Close()
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkPrevSiblings(t, d, []uint64{a, b}, extra)

	// A catalog made before the index: Open builds it.
	if err := d.Update(func(tx *Tx) error { return DeleteBucket(tx, "dirorder") }); err != nil {
		t.Fatal(err)
	}
	if err := d.View(func(tx *Tx) error {
		_, _, ok, err := tx.PrevSibling(a, "zzz")
		if ok || err != nil {
			t.Fatalf("no index: PrevSibling found %v, %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if d, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	checkPrevSiblings(t, d, []uint64{a, b}, extra)

	// An older ckptfs removes an entry without its row: the row is skipped.
	var victim, before string
	if err := d.View(func(tx *Tx) error {
		var ok bool
		victim, _, ok, _ = tx.PrevSibling(a, "zzz")
		before, _, _ = prevByListing(t, tx, a, victim)
		if !ok {
			t.Fatal("directory a is empty")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(func(tx *Tx) error { return RawDelete(tx, "dirents", DirentKey(a, victim)) }); err != nil {
		t.Fatal(err)
	}
	if err := d.View(func(tx *Tx) error {
		if got, _, _, err := tx.PrevSibling(a, "zzz"); got != before || err != nil {
			t.Fatalf("stale row of %q: PrevSibling = %q, %v; want %q", victim, got, err, before)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPrevSiblingLargeDirectory: in a directory of 10⁴ steps, the entry
// before a step is found reading a row or two (Tx.Walked), not the
// directory.
func TestPrevSiblingLargeDirectory(t *testing.T) {
	d, _ := testDB(t)
	const dir, steps = 100, 10000
	if err := d.Update(func(tx *Tx) error {
		for i := range steps {
			if err := tx.Link(dir, fmt.Sprintf("step-%d", i), uint64(1000+i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.View(func(tx *Tx) error {
		for _, i := range []int{1, 10, 999, 1000, steps - 1, steps} {
			n, ino, ok, err := tx.PrevSibling(dir, fmt.Sprintf("step-%d", i))
			if want := fmt.Sprintf("step-%d", i-1); err != nil || !ok || n != want || ino != uint64(1000+i-1) {
				t.Errorf("PrevSibling(step-%d) = %q %d %v %v, want %q", i, n, ino, ok, err, want)
			}
		}
		if tx.Walked() > 6*2 {
			t.Errorf("6 PrevSiblings read %d rows", tx.Walked())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDirOrderBuiltForFormat1: a format-1 catalog (unsealed, made before
// the index) opened for writing is sealed and gets its index, in natural
// order; opened read-only, it has none and PrevSibling finds nothing.
func TestDirOrderBuiltForFormat1(t *testing.T) {
	d, path := testDB(t)
	const dir = 100
	names := []string{"step-10", "step-9", "step-100", "b", "a"}
	if err := d.Update(func(tx *Tx) error {
		for i, n := range names {
			if err := tx.Link(dir, n, uint64(1000+i)); err != nil {
				return err
			}
		}
		return DeleteBucket(tx, "dirorder")
	}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	Unseal(t, path)

	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.View(func(tx *Tx) error {
		if n, _, ok, err := tx.PrevSibling(dir, "step-100"); ok || err != nil {
			t.Errorf("read-only format 1: PrevSibling = %q %v %v, want nothing", n, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ro.Close()

	if d, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Format() != formatSealed {
		t.Fatalf("format %d after the migration", d.Format())
	}
	checkPrevSiblings(t, d, []uint64{dir}, []string{"step-11", "c"})
	if err := d.View(func(tx *Tx) error {
		if n, ino, ok, err := tx.PrevSibling(dir, "step-100"); n != "step-10" || ino != 1000 || !ok || err != nil {
			t.Errorf("PrevSibling(step-100) = %q %d %v %v, want step-10", n, ino, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
