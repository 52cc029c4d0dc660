package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// TestCheckMemoryPerPage: the page check before every open holds a bit per
// page, not a map entry: at 10⁶ small files the catalog has a million pages
// and more, and the check runs in the daemon at each mount. The heap it
// holds for a catalog of thousands of pages stays within an eighth of a
// byte a page plus a fixed allowance (a map of them held tens of bytes a
// page).
func TestCheckMemoryPerPage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	db := rowsCatalog(t, path, 20)
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

// TestCheckReadsOnlyPagesInUse: the check's walk reads the pages it visits
// and not the file around them. It goes in key order, no order in the file,
// and a fault on a mapping without MADV_RANDOM reads around the page
// (read_ahead_kb: 8 MiB on the disk this was found on), which in a 128 MiB
// memory cgroup evicted what the walk needed next: a catalog of 609 MiB
// read 45 GiB and the mount did not finish. Here a file most of whose pages
// are free is walked with its page cache dropped, and the pages cached
// afterwards are counted (mincore). Check reads the file through in order
// before the walk, so that a catalog that fits in memory is read at the
// disk's sequential pace: TestCheckReadsThrough.
func TestCheckReadsOnlyPagesInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	db := rowsCatalog(t, path, 8)
	err := db.Update(func(tx *bolt.Tx) error { // most pages free, the rest spread over the file
		b := tx.Bucket([]byte("rows"))
		for i := range 8000 {
			if i%50 != 0 {
				if err := b.Delete(fmt.Appendf(nil, "%08d", i)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ps, inUse, err := PagesInUse(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	cached := func() int { return cachedPages(t, f, st.Size()) * os.Getpagesize() / ps }
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	total := int(st.Size()) / ps
	if n := cached(); n > total/10 {
		t.Skipf("%d of %d pages still cached after FADV_DONTNEED: this file system keeps them (tmpfs?), nothing to measure", n, total)
	}
	if total < 10*len(inUse) {
		t.Fatalf("%d pages in use of %d: the file is not mostly free pages", len(inUse), total)
	}
	if err := walkFile(f, path, st.Size()); err != nil { // Check without its read-through
		t.Fatal(err)
	}
	t.Logf("in use %d, total %d, cached %d", len(inUse), total, cached())
	if n, limit := cached(), 2*len(inUse)+16; n > limit {
		t.Errorf("the check left %d of the file's %d pages cached, %d in use: want at most %d", n, total, len(inUse), limit)
	}
}

// TestCheckReadsThrough: Check reads the whole file in order before its walk
// (a cold catalog that fits in memory is then read at the disk's sequential
// pace, not a page a fault), and still refuses a damaged one.
func TestCheckReadsThrough(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	if err := Create(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	pages := int(st.Size()) / os.Getpagesize()
	cached := func() int { return cachedPages(t, f, st.Size()) }
	if n := cached(); n == pages {
		t.Skipf("all %d pages still cached after FADV_DONTNEED: this file system keeps them (tmpfs?), nothing to measure", pages)
	}
	if err := Check(path); err != nil {
		t.Fatal(err)
	}
	if n := cached(); n != pages {
		t.Errorf("after Check %d of the file's %d pages are cached, want all", n, pages)
	}
	ps, inUse, err := PagesInUse(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[int(inUse[len(inUse)-1])*ps+8] ^= 0xFF // a page in use: its flags
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(path); !errors.Is(err, ErrCatalogDamaged) {
		t.Errorf("Check of a damaged catalog: %v, want ErrCatalogDamaged", err)
	}
}

// rowsCatalog opens a bbolt file at path (as the catalog does: no synced
// freelist) and puts txs transactions of 1,000 rows of 1,500 bytes, two or
// three a 4 KiB leaf page, in bucket "rows".
func rowsCatalog(t *testing.T, path string, txs int) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 1500)
	for k := range txs {
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("rows"))
			if err != nil {
				return err
			}
			for i := k * 1000; i < (k+1)*1000; i++ {
				if err := b.Put(fmt.Appendf(nil, "%08d", i), val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// cachedPages counts the OS pages of f's first size bytes that are in the
// page cache (mincore of a mapping of them).
func cachedPages(t *testing.T, f *os.File, size int64) int {
	t.Helper()
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	vec := make([]byte, (len(data)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
