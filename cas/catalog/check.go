package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"syscall"
)

// ErrCatalogDamaged is wrapped by errors about a catalog whose pages or
// records do not check: Open refuses such a store, reads of a damaged record
// fail, and fsck names the damage.
var ErrCatalogDamaged = errors.New("catalog is damaged")

// bbolt's on-disk page format (go.etcd.io/bbolt/internal/common, v1.x): a
// 16-byte page header, then elements of 16 bytes, then keys and values.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	boltPageHeader   = 16
	boltElemSize     = 16
	boltMetaSize     = 64 // magic .. checksum
	boltBranchPage   = 0x01
	boltLeafPage     = 0x02
	boltMetaPage     = 0x04
	boltFreelistPage = 0x10
	boltBucketLeaf   = 0x01
	boltNoFreelist   = ^uint64(0)
)

// Check walks the B+tree of the bbolt file at path from its current
// meta page, with every offset and length bounds-checked, before bbolt opens
// it. bbolt trusts its pages: a flipped flags, count or offset byte makes it
// panic, in a goroutine of its own while it rebuilds the freelist at Open
// (which cannot be recovered), or fault on an address past its mapping. This
// check refuses such a file with an error that names the page. It checks what
// bbolt's Tx.Check does (bounds, page types, each page referenced once, keys
// in order) plus the element offsets bbolt never checks; it reads only
// reachable pages, so damage to a free page does not matter.
func Check(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size < 2*1024 {
		return fmt.Errorf("%w: %s is %d bytes, too small for a catalog", ErrCatalogDamaged, path, size)
	}
	// Read the file once in order first: where it fits in memory the walk
	// then finds every page cached, read at the disk's sequential pace; in
	// a memory cgroup smaller than the file it costs that one pass, and the
	// walk reads what it needs a page at a time (walkFile).
	if err := readThrough(f, size); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return walkFile(f, path, size)
}

// readThrough reads the first size bytes of f in order, into a small buffer
// that it reuses: the page cache keeps what memory allows.
func readThrough(f *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// walkFile maps the first size bytes of f, the catalog at path, and checks
// its pages.
func walkFile(f *os.File, path string, size int64) error {
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s: %w", path, err)
	}
	defer syscall.Munmap(data)
	// The walk goes in key order, which is no order in the file: without
	// this advice each fault on a page not cached reads around it
	// (read_ahead_kb, 8 MiB on this machine's disk), and in a 128 MiB
	// memory cgroup those reads evicted the pages the walk needed next: a
	// catalog of 609 MiB read 45 GiB there and the mount did not finish in
	// four minutes. bbolt gives its own mapping the same advice.
	if err := syscall.Madvise(data, syscall.MADV_RANDOM); err != nil && !errors.Is(err, syscall.ENOSYS) {
		return fmt.Errorf("madvise %s: %w", path, err)
	}
	if _, err := checkBoltPages(data); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCatalogDamaged, path, err)
	}
	return nil
}

type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	hwm      uint64 // pages in use: every reachable page id is below it
	txid     uint64
}

// readBoltMeta decodes and validates the meta page at off, as bbolt's
// Meta.Validate does (magic, version, FNV-64a checksum).
func readBoltMeta(data []byte, off int) (boltMeta, error) {
	if off+boltPageHeader+boltMetaSize > len(data) {
		return boltMeta{}, errors.New("meta page past the end of the file")
	}
	m := data[off+boltPageHeader : off+boltPageHeader+boltMetaSize]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != boltMagic || le.Uint32(m[4:]) != boltVersion {
		return boltMeta{}, errors.New("meta page has a bad magic or version")
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if h.Sum64() != le.Uint64(m[56:]) {
		return boltMeta{}, errors.New("meta page checksum mismatch")
	}
	meta := boltMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		hwm: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	if ps := meta.pageSize; ps < 1024 || ps > 1<<20 || ps&(ps-1) != 0 {
		return boltMeta{}, fmt.Errorf("meta page names page size %d", ps)
	}
	return meta, nil
}

// checkBoltPages checks the file's bytes and returns the pages in use.
func checkBoltPages(data []byte) (pageSet, error) {
	// bbolt reads meta 0 at offset 0 and meta 1 one page further, the page
	// size coming from meta 0 (or the OS page size when meta 0 is invalid),
	// and uses the valid one with the higher transaction id.
	m0, err0 := readBoltMeta(data, 0)
	ps := os.Getpagesize()
	if err0 == nil {
		ps = int(m0.pageSize)
	}
	m1, err1 := readBoltMeta(data, ps)
	var meta boltMeta
	switch {
	case err0 == nil && err1 == nil:
		meta = m0
		if m1.txid > m0.txid {
			meta = m1
		}
	case err0 == nil:
		meta = m0
	case err1 == nil:
		meta = m1
	default:
		return nil, fmt.Errorf("both meta pages are invalid: %v; %v", err0, err1)
	}
	c := &boltChecker{data: data, ps: uint64(meta.pageSize), hwm: meta.hwm}
	if meta.hwm < 3 || meta.hwm > uint64(len(data))/c.ps {
		return nil, fmt.Errorf("meta page says %d pages, the file holds %d", meta.hwm, uint64(len(data))/c.ps)
	}
	c.seen = newPageSet(meta.hwm)
	c.seen.add(0)
	c.seen.add(1)
	if meta.freelist != boltNoFreelist {
		if err := c.checkFreelist(meta.freelist); err != nil {
			return nil, err
		}
	}
	if _, err := c.checkTree(meta.root, nil, nil, 0); err != nil {
		return nil, err
	}
	return c.seen, nil
}

type boltChecker struct {
	data []byte
	ps   uint64
	hwm  uint64
	seen pageSet
}

// pageSet is a set of page ids below a bound: a bit a page, so that the
// check of a catalog of 10⁶ files (gigabytes of inline chunks, a million
// pages and more) holds 128 KiB per million pages, not a map of them
// (tens of MiB of the daemon's anonymous memory at every open).
type pageSet []uint64

func newPageSet(n uint64) pageSet { return make(pageSet, (n+63)/64) }

func (s pageSet) has(id uint64) bool { return s[id/64]&(1<<(id%64)) != 0 }

func (s pageSet) add(id uint64) { s[id/64] |= 1 << (id % 64) }

// page returns the bytes of page id and its overflow pages, after checking
// its header and that no other reference reached it.
func (c *boltChecker) page(id uint64) (flags uint16, count int, buf []byte, err error) {
	if id < 2 || id >= c.hwm {
		return 0, 0, nil, fmt.Errorf("page %d is out of bounds (%d pages)", id, c.hwm)
	}
	h := c.data[id*c.ps : id*c.ps+boltPageHeader]
	le := binary.LittleEndian
	if got := le.Uint64(h[0:]); got != id {
		return 0, 0, nil, fmt.Errorf("page %d: header names page %d", id, got)
	}
	flags, count = le.Uint16(h[8:]), int(le.Uint16(h[10:]))
	overflow := uint64(le.Uint32(h[12:]))
	if id+overflow >= c.hwm {
		return 0, 0, nil, fmt.Errorf("page %d: %d overflow pages run past page %d", id, overflow, c.hwm)
	}
	for p := id; p <= id+overflow; p++ {
		if c.seen.has(p) {
			return 0, 0, nil, fmt.Errorf("page %d is referenced twice", p)
		}
		c.seen.add(p)
	}
	return flags, count, c.data[id*c.ps : (id+overflow+1)*c.ps], nil
}

func (c *boltChecker) checkFreelist(id uint64) error {
	flags, count, buf, err := c.page(id)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if flags != boltFreelistPage {
		return fmt.Errorf("freelist page %d has flags %#x", id, flags)
	}
	ids := buf[boltPageHeader:]
	n := uint64(count)
	if count == 0xFFFF { // the real count is the first id
		if len(ids) < 8 {
			return fmt.Errorf("freelist page %d is truncated", id)
		}
		n, ids = binary.LittleEndian.Uint64(ids), ids[8:]
	}
	if n > uint64(len(ids))/8 {
		return fmt.Errorf("freelist page %d claims %d ids", id, n)
	}
	for i := range n {
		if p := binary.LittleEndian.Uint64(ids[8*i:]); p < 2 || p >= c.hwm {
			return fmt.Errorf("freelist page %d names page %d", id, p)
		}
	}
	return nil
}

// element returns the key and (for a leaf) value of element i of a page's
// bytes buf, bounds-checked. bbolt writes keys and values packed in element
// order right after the element headers; element checks that they are, so a
// changed count, position or size is seen even where the bytes it points at
// stay inside the page.
// Call it for i = 0, 1, ... with the same next, which tracks that.
func element(buf []byte, count, i int, leaf bool, next *uint64) (flags uint32, key, val []byte, child uint64, err error) {
	off := boltPageHeader + i*boltElemSize
	if count > (len(buf)-boltPageHeader)/boltElemSize {
		return 0, nil, nil, 0, fmt.Errorf("%d elements do not fit", count)
	}
	e := buf[off : off+boltElemSize]
	le := binary.LittleEndian
	var pos, ksize, vsize uint64
	if leaf {
		flags, pos, ksize, vsize = le.Uint32(e[0:]), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
	} else {
		pos, ksize, child = uint64(le.Uint32(e[0:])), uint64(le.Uint32(e[4:])), le.Uint64(e[8:])
	}
	start := uint64(off) + pos
	if start+ksize+vsize > uint64(len(buf)) {
		return 0, nil, nil, 0, fmt.Errorf("element %d runs past its page", i)
	}
	if *next == 0 {
		*next = uint64(boltPageHeader + count*boltElemSize) // where element 0's key starts
	}
	if start != *next {
		return 0, nil, nil, 0, fmt.Errorf("element %d starts at %d, not at %d (packed after the element headers and the elements before it)", i, start, *next)
	}
	*next = start + ksize + vsize
	return flags, buf[start : start+ksize], buf[start+ksize : start+ksize+vsize], child, nil
}

// checkTree checks the subtree at page id, whose keys must lie in
// [lo, hi) (nil: unbounded), and returns its largest key.
func (c *boltChecker) checkTree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	if depth > 64 {
		return nil, fmt.Errorf("page %d: the tree is too deep", id)
	}
	flags, count, buf, err := c.page(id)
	if err != nil {
		return nil, err
	}
	switch flags {
	case boltBranchPage:
		if count == 0 {
			return nil, fmt.Errorf("branch page %d is empty", id)
		}
		var last []byte
		prev := lo
		var next uint64
		keys, children := make([][]byte, count), make([]uint64, count)
		for i := range count {
			var err error
			if _, keys[i], _, children[i], err = element(buf, count, i, false, &next); err != nil {
				return nil, fmt.Errorf("branch page %d: %w", id, err)
			}
		}
		for i := range count {
			key, child := keys[i], children[i]
			if err := keyInOrder(key, prev, hi, i); err != nil {
				return nil, fmt.Errorf("branch page %d: %w", id, err)
			}
			bound := hi
			if i+1 < count {
				bound = keys[i+1]
			}
			var err error
			if last, err = c.checkTree(child, key, bound, depth+1); err != nil {
				return nil, err
			}
			prev = last
		}
		return last, nil
	case boltLeafPage:
		return c.checkLeaf(fmt.Sprintf("leaf page %d", id), buf, count, lo, hi, depth, true)
	}
	return nil, fmt.Errorf("page %d has flags %#x where a branch or leaf page belongs", id, flags)
}

// checkLeaf checks the elements of a leaf page (or of an inline bucket's
// page, which may hold no sub-buckets).
func (c *boltChecker) checkLeaf(what string, buf []byte, count int, lo, hi []byte, depth int, subBuckets bool) ([]byte, error) {
	prev := lo
	var next uint64
	for i := range count {
		flags, key, val, _, err := element(buf, count, i, true, &next)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := keyInOrder(key, prev, hi, i); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		prev = key
		switch flags {
		case 0:
		case boltBucketLeaf:
			if !subBuckets {
				return nil, fmt.Errorf("%s: an inline bucket holds a bucket", what)
			}
			if err := c.checkBucket(fmt.Sprintf("%s, bucket %q", what, key), val, depth); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s: element %d has flags %#x", what, i, flags)
		}
	}
	return prev, nil
}

// checkBucket checks a bucket's value: its header and its inline page or tree.
func (c *boltChecker) checkBucket(what string, val []byte, depth int) error {
	if len(val) < 16 {
		return fmt.Errorf("%s: header of %d bytes", what, len(val))
	}
	root := binary.LittleEndian.Uint64(val)
	if root != 0 {
		_, err := c.checkTree(root, nil, nil, depth+1)
		return err
	}
	inline := val[16:]
	if len(inline) < boltPageHeader {
		return fmt.Errorf("%s: inline page of %d bytes", what, len(inline))
	}
	if flags := binary.LittleEndian.Uint16(inline[8:]); flags != boltLeafPage {
		return fmt.Errorf("%s: inline page has flags %#x", what, flags)
	}
	count := int(binary.LittleEndian.Uint16(inline[10:]))
	_, err := c.checkLeaf(what, inline, count, nil, nil, depth, false)
	return err
}

// keyInOrder checks key i of a page against the previous key (or the lower
// bound, for the first) and the upper bound.
func keyInOrder(key, prev, hi []byte, i int) error {
	switch {
	case i == 0 && prev != nil && bytes.Compare(prev, key) > 0,
		i > 0 && bytes.Compare(prev, key) >= 0:
		return fmt.Errorf("key %d (%x) is out of order", i, key)
	case hi != nil && bytes.Compare(key, hi) >= 0:
		return fmt.Errorf("key %d (%x) is past its parent's bound", i, key)
	}
	return nil
}

// PagesInUse returns the page size and the sorted ids of the pages in use
// (meta pages included) of the intact catalog at path, for tests that
// damage them.
func PagesInUse(path string) (pageSize int, ids []uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, err
	}
	seen, err := checkBoltPages(data)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", path, err)
	}
	for id := range uint64(len(seen)) * 64 {
		if seen.has(id) {
			ids = append(ids, id)
		}
	}
	m, err := readBoltMeta(data, 0)
	if err != nil {
		return 0, nil, err
	}
	return int(m.pageSize), ids, nil
}
