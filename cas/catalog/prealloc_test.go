package catalog

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// TestWrittenTail: as the catalog grows, its file is written (no hole) at
// least half a step past bbolt's high-water mark, for Update and
// UpdateAround alike; every row committed is read back after a reopen, and
// the file passes Check.
func TestWrittenTail(t *testing.T) {
	d, path := testDB(t)
	val := bytes.Repeat([]byte{0xa5}, 3000) // about a page per row: the mark moves
	put := func(i int) func(*Tx) error {
		return func(tx *Tx) error { return RawPut(tx, "meta", fmt.Appendf(nil, "tail-%05d", i), val) }
	}
	const rows = 600 // ~2.4 MiB of pages: the tail is extended several times
	for i := range rows {
		var err error
		if i%2 == 0 {
			err = d.Update(put(i))
		} else {
			err = d.UpdateAround(put(i), func() func() { return func() {} })
		}
		if err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
		if i%100 != 99 {
			continue
		}
		var mark int64
		if err := d.db.View(func(tx *bolt.Tx) error { mark = tx.Size(); return nil }); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(int(f.Fd()), mark, unix.SEEK_HOLE)
		f.Close()
		if err != nil {
			t.Fatalf("SEEK_HOLE past the mark %d: %v", mark, err)
		}
		if hole < mark+tailStepMin/2 {
			t.Errorf("after %d commits: the first hole is at %d, %d bytes past the mark %d; want at least %d",
				i+1, hole, hole-mark, mark, tailStepMin/2)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Check(path); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if err := d2.View(func(tx *Tx) error {
		for i := range rows {
			if v := RawGet(tx, "meta", fmt.Appendf(nil, "tail-%05d", i)); !bytes.Equal(v, val) {
				return fmt.Errorf("row %d: %d bytes, want %d", i, len(v), len(val))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
