package catalog

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestCheckMemoryPerPage: the page check before every open holds a bit per
// page, not a map entry: at 10⁶ small files the catalog has a million pages
// and more, and the check runs in the daemon at each mount. The heap it
// holds for a catalog of thousands of pages stays within an eighth of a
// byte a page plus a fixed allowance (a map of them held tens of bytes a
// page).
func TestCheckMemoryPerPage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 1500) // two or three rows a 4 KiB leaf page
	for batch := range 20 {
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("rows"))
			if err != nil {
				return err
			}
			for i := range 1000 {
				if err := b.Put(fmt.Appendf(nil, "%08d", batch*1000+i), val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// What the check holds (the set of pages it returns, live until the
	// end of the check): the heap after a collection, with the set alive.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	seen, err := checkBoltPages(data)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(data) // read before, and not what the check holds
	pages := 0
	for id := range uint64(len(seen)) * 64 {
		if seen.has(id) {
			pages++
		}
	}
	if pages < 5000 {
		t.Fatalf("%d pages in use, want a catalog of 5,000 and more", pages)
	}
	t.Logf("held %d bytes for %d pages", int64(after.HeapAlloc)-int64(before.HeapAlloc), pages)
	const fixed = 16 << 10
	if held, limit := int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(pages/8+fixed); held > limit {
		t.Errorf("checking %d pages holds %d bytes, want at most %d", pages, held, limit)
	}
}
