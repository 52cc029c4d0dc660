package powerloss

import (
	"math/rand"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"
)

// pageSize is the unit in which unsynced file data survives a Partial crash.
const pageSize = 4096

// RootIno is the inode number of the root directory (FUSE's root node ID).
const RootIno = 1

// Mode says what a crash keeps of the changes that were not made durable.
type Mode int

const (
	// DropAll keeps nothing that was not made durable.
	DropAll Mode = iota
	// Partial keeps each unsynced page and each namespace change with
	// probability 1/2, independently (see the package doc).
	Partial
)

func (m Mode) String() string {
	if m == Partial {
		return "partial"
	}
	return "drop-all"
}

// Stats count what a disk served and what its crash dropped.
type Stats struct {
	Ops       int64 // requests that changed something (syncs included)
	FileSyncs int64 // fsync and fdatasync of files
	DirSyncs  int64 // fsync of directories
	// RenamesOver counts renames onto an existing name (ckptfs: re-encoded
	// objects replacing raw ones).
	RenamesOver int64
	// Filled in by the crash: unsynced pages and namespace changes (creates,
	// unlinks, renames) that were lost and that survived.
	LostPages, KeptPages int64
	LostNsOps, KeptNsOps int64
	// Down is set once the power is cut.
	Down bool
}

// Disk is the simulated storage: the files and directories of one boot, each
// with its current and its durable state. Its methods are safe for
// concurrent use; Mount serves it over FUSE.
type Disk struct {
	mu      sync.Mutex
	inodes  map[uint64]*inode
	nextIno uint64
	log     []nsOp // namespace changes not yet durable, oldest first
	stats   Stats

	crashAt   int64 // crash when stats.Ops reaches it (0: not armed)
	crashMode Mode
	rng       *rand.Rand
	after     *Disk         // the disk as the next boot finds it; set by the crash
	crashed   chan struct{} // closed by the crash
}

type inode struct {
	ino                 uint64
	mode                uint32 // type and permission bits
	uid, gid            uint32
	atime, mtime, ctime time.Time
	nlink               int // names in the current tree

	// Regular files (and a symlink's target, in data only).
	data   []byte
	dur    []byte             // the durable content
	shared bool               // data and dur share an array (after a crash): copy before writing
	dirty  map[int64]struct{} // pages of data changed since the last sync

	// Directories.
	kids    map[string]uint64
	durKids map[string]uint64
}

// nsOp is a namespace change: the name (from, oldName) of ino is removed when
// from is not 0, and (to, newName) made to name ino when to is not 0. A create
// has only to, an unlink only from, a rename both.
type nsOp struct {
	from    uint64
	oldName string
	to      uint64
	newName string
	ino     uint64
}

func (op nsOp) touches(dir uint64) bool { return op.from == dir || op.to == dir }

// apply makes op's change in the directories kids returns.
func (op nsOp) apply(kids func(uint64) map[string]uint64) {
	if op.from != 0 {
		if m := kids(op.from); m != nil && m[op.oldName] == op.ino {
			delete(m, op.oldName)
		}
	}
	if op.to != 0 {
		if m := kids(op.to); m != nil {
			m[op.newName] = op.ino
		}
	}
}

// New returns an empty disk: a root directory, durable.
func New() *Disk {
	d := &Disk{inodes: map[uint64]*inode{}, nextIno: RootIno + 1, crashed: make(chan struct{})}
	now := time.Now()
	d.inodes[RootIno] = &inode{ino: RootIno, mode: syscall.S_IFDIR | 0o755, atime: now, mtime: now, ctime: now,
		nlink: 1, kids: map[string]uint64{}, durKids: map[string]uint64{}}
	return d
}

// CrashAfter arms the power cut: the n-th changing request from now (n >= 1)
// is not served, and neither is anything after it. seed drives Partial's
// choices.
func (d *Disk) CrashAfter(n int64, mode Mode, seed int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n < 1 {
		n = 1
	}
	d.crashAt, d.crashMode, d.rng = d.stats.Ops+n, mode, rand.New(rand.NewSource(seed))
}

// Crash cuts the power now (if it is not cut already).
func (d *Disk) Crash(mode Mode, seed int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.after == nil {
		d.crashMode, d.rng = mode, rand.New(rand.NewSource(seed))
		d.crashLocked()
	}
}

// Crashed is closed when the power has been cut.
func (d *Disk) Crashed() <-chan struct{} { return d.crashed }

// After returns the disk as the next boot finds it, or nil before the crash.
func (d *Disk) After() *Disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.after
}

// Stats returns the counters so far.
func (d *Disk) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.stats
	st.Down = d.after != nil
	return st
}

// begin locks the disk for one request, or fails it (unlocked) after the crash. A
// changing request counts towards the armed crash, which happens instead of it.
func (d *Disk) begin(changing bool) syscall.Errno {
	d.mu.Lock()
	if d.after != nil {
		d.mu.Unlock()
		return syscall.EIO
	}
	if changing {
		d.stats.Ops++
		if d.crashAt > 0 && d.stats.Ops >= d.crashAt {
			d.crashLocked()
			d.mu.Unlock()
			return syscall.EIO
		}
	}
	return 0
}

// crashLocked computes what survives and records it as d.after.
func (d *Disk) crashLocked() {
	rng, partial := d.rng, d.crashMode == Partial
	if rng == nil {
		rng = rand.New(rand.NewSource(1))
	}
	coin := func() bool { return partial && rng.Intn(2) == 0 }
	nd := &Disk{inodes: make(map[uint64]*inode, len(d.inodes)), nextIno: d.nextIno, crashed: make(chan struct{})}
	// Visit inodes in a fixed order, so a seed gives one outcome.
	inos := make([]uint64, 0, len(d.inodes))
	for ino := range d.inodes {
		inos = append(inos, ino)
	}
	sort.Slice(inos, func(i, j int) bool { return inos[i] < inos[j] })
	for _, ino := range inos {
		n := d.inodes[ino]
		c := &inode{ino: ino, mode: n.mode, uid: n.uid, gid: n.gid, atime: n.atime, mtime: n.mtime, ctime: n.ctime}
		switch n.mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			c.kids = cloneKids(n.durKids)
		case syscall.S_IFREG:
			c.data = d.survivingData(n, partial, rng)
		case syscall.S_IFLNK:
			c.data = append([]byte(nil), n.data...)
		}
		nd.inodes[ino] = c
	}
	kidsOf := func(ino uint64) map[string]uint64 {
		if n := nd.inodes[ino]; n != nil {
			return n.kids
		}
		return nil
	}
	for _, op := range d.log {
		if coin() {
			op.apply(kidsOf)
			d.stats.KeptNsOps++
		} else {
			d.stats.LostNsOps++
		}
	}
	// What no durable entry reaches is gone; count the names of the rest.
	reached := map[uint64]bool{RootIno: true}
	queue := []uint64{RootIno}
	for len(queue) > 0 {
		dir := nd.inodes[queue[0]]
		queue = queue[1:]
		for name, ino := range dir.kids {
			k := nd.inodes[ino]
			if k == nil {
				delete(dir.kids, name)
				continue
			}
			k.nlink++
			if !reached[ino] {
				reached[ino] = true
				if k.kids != nil {
					queue = append(queue, ino)
				}
			}
		}
	}
	nd.inodes[RootIno].nlink = 1
	for ino, n := range nd.inodes {
		if !reached[ino] {
			delete(nd.inodes, ino)
			continue
		}
		n.dur, n.shared = n.data, true
		if n.kids != nil {
			n.durKids = cloneKids(n.kids)
		}
	}
	d.after = nd
	close(d.crashed)
}

// survivingData is what a crash leaves of file n.
func (d *Disk) survivingData(n *inode, partial bool, rng *rand.Rand) []byte {
	// The crashed disk never changes again, so its durable bytes can be
	// the new disk's (copied on the next write).
	if len(n.dirty) == 0 {
		return n.dur
	}
	if !partial {
		d.stats.LostPages += int64(len(n.dirty))
		return n.dur
	}
	size := len(n.dur)
	lo, hi := min(len(n.dur), len(n.data)), max(len(n.dur), len(n.data))
	switch rng.Intn(3) {
	case 0:
		size = len(n.data)
	case 1:
		if hi > lo {
			size = min(hi, (lo+rng.Intn(hi-lo+1))/pageSize*pageSize)
			size = max(size, lo)
		}
	}
	out := make([]byte, size)
	copy(out, n.dur)
	pages := make([]int64, 0, len(n.dirty))
	for p := range n.dirty {
		pages = append(pages, p)
	}
	sort.Slice(pages, func(i, j int) bool { return pages[i] < pages[j] })
	for _, p := range pages {
		start := p * pageSize
		if start >= int64(size) || rng.Intn(2) == 0 {
			d.stats.LostPages++
			continue
		}
		d.stats.KeptPages++
		end := min(start+pageSize, int64(size))
		// The current page: its bytes, zeros past the current end.
		clear(out[start:end])
		if start < int64(len(n.data)) {
			copy(out[start:end], n.data[start:min(end, int64(len(n.data)))])
		}
	}
	return out
}

func cloneKids(m map[string]uint64) map[string]uint64 {
	c := make(map[string]uint64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// --- operations (called by the FUSE adapter, and by tests directly) ---

func (d *Disk) get(ino uint64) (*inode, syscall.Errno) {
	n := d.inodes[ino]
	if n == nil {
		return nil, syscall.ENOENT
	}
	return n, 0
}

func (d *Disk) dir(ino uint64) (*inode, syscall.Errno) {
	n, errno := d.get(ino)
	if errno != 0 {
		return nil, errno
	}
	if n.kids == nil {
		return nil, syscall.ENOTDIR
	}
	return n, 0
}

// Attr is what stat says of an inode.
type Attr struct {
	Ino                 uint64
	Mode                uint32
	Nlink               uint32
	Size                uint64
	Uid, Gid            uint32
	Atime, Mtime, Ctime time.Time
}

func (n *inode) attr() Attr {
	a := Attr{Ino: n.ino, Mode: n.mode, Nlink: uint32(n.nlink), Size: uint64(len(n.data)),
		Uid: n.uid, Gid: n.gid, Atime: n.atime, Mtime: n.mtime, Ctime: n.ctime}
	if n.kids != nil {
		a.Size = 4096
	}
	return a
}

// Lookup finds name in directory parent.
func (d *Disk) Lookup(parent uint64, name string) (Attr, syscall.Errno) {
	if errno := d.begin(false); errno != 0 {
		return Attr{}, errno
	}
	defer d.mu.Unlock()
	p, errno := d.dir(parent)
	if errno != 0 {
		return Attr{}, errno
	}
	ino, ok := p.kids[name]
	if !ok {
		return Attr{}, syscall.ENOENT
	}
	return d.attrOf(d.inodes[ino]), 0
}

// attrOf is n.attr with a directory's link count (2 + subdirectories).
func (d *Disk) attrOf(n *inode) Attr {
	a := n.attr()
	if n.kids != nil {
		a.Nlink = 2
		for _, k := range n.kids {
			if c := d.inodes[k]; c != nil && c.kids != nil {
				a.Nlink++
			}
		}
	}
	return a
}

// GetAttr returns ino's attributes.
func (d *Disk) GetAttr(ino uint64) (Attr, syscall.Errno) {
	if errno := d.begin(false); errno != 0 {
		return Attr{}, errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return Attr{}, errno
	}
	return d.attrOf(n), 0
}

// SetAttrs are the changes of a SetAttr; nil fields stay.
type SetAttrs struct {
	Mode         *uint32 // permission bits
	Uid, Gid     *uint32
	Size         *uint64
	Atime, Mtime *time.Time
}

// SetAttr changes ino's attributes; a size change is a truncation.
func (d *Disk) SetAttr(ino uint64, s SetAttrs) (Attr, syscall.Errno) {
	if errno := d.begin(true); errno != 0 {
		return Attr{}, errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return Attr{}, errno
	}
	now := time.Now()
	if s.Size != nil {
		if n.mode&syscall.S_IFMT != syscall.S_IFREG {
			if n.kids != nil {
				return Attr{}, syscall.EISDIR
			}
			return Attr{}, syscall.EINVAL
		}
		n.truncate(int64(*s.Size))
		n.mtime = now
	}
	if s.Mode != nil {
		n.mode = n.mode&syscall.S_IFMT | *s.Mode&0o7777
	}
	if s.Uid != nil {
		n.uid = *s.Uid
	}
	if s.Gid != nil {
		n.gid = *s.Gid
	}
	if s.Atime != nil {
		n.atime = *s.Atime
	}
	if s.Mtime != nil {
		n.mtime = *s.Mtime
	}
	n.ctime = now
	return d.attrOf(n), 0
}

// markDirty records that bytes [from, to) of n changed.
func (n *inode) markDirty(from, to int64) {
	if to <= from {
		return
	}
	if n.dirty == nil {
		n.dirty = map[int64]struct{}{}
	}
	for p := from / pageSize; p <= (to-1)/pageSize; p++ {
		n.dirty[p] = struct{}{}
	}
}

// own gives data an array of its own before it is changed.
func (n *inode) own() {
	if n.shared {
		n.data, n.shared = append([]byte(nil), n.data...), false
	}
}

func (n *inode) truncate(size int64) {
	n.own()
	old := int64(len(n.data))
	switch {
	case size < old:
		clear(n.data[size:]) // so that growing again reads zeros
		n.data = n.data[:size]
		n.markDirty(size, old)
	case size > old:
		n.data = grow(n.data, int(size))
		n.markDirty(old, size)
	}
}

// grow extends b to n bytes; the new bytes are zero (truncate clears what it cuts).
func grow(b []byte, n int) []byte {
	if n <= cap(b) {
		return b[:n]
	}
	c := make([]byte, n, max(n, 2*cap(b)))
	copy(c, b)
	return c
}

// newInode adds a node named name in directory p (which must not hold name).
func (d *Disk) newInode(p *inode, name string, mode uint32, uid, gid uint32) *inode {
	now := time.Now()
	n := &inode{ino: d.nextIno, mode: mode, uid: uid, gid: gid, atime: now, mtime: now, ctime: now, nlink: 1}
	d.nextIno++
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		n.kids, n.durKids = map[string]uint64{}, map[string]uint64{}
	}
	d.inodes[n.ino] = n
	p.kids[name] = n.ino
	p.mtime, p.ctime = now, now
	d.log = append(d.log, nsOp{to: p.ino, newName: name, ino: n.ino})
	return n
}

// Create makes a node of the given mode (a regular file, socket or fifo) in
// parent. An existing regular file is opened instead unless excl (and
// truncated if trunc).
func (d *Disk) Create(parent uint64, name string, mode uint32, uid, gid uint32, excl, trunc bool) (Attr, syscall.Errno) {
	if errno := d.begin(true); errno != 0 {
		return Attr{}, errno
	}
	defer d.mu.Unlock()
	p, errno := d.dir(parent)
	if errno != 0 {
		return Attr{}, errno
	}
	if ino, ok := p.kids[name]; ok {
		if excl {
			return Attr{}, syscall.EEXIST
		}
		n := d.inodes[ino]
		if n.kids != nil {
			return Attr{}, syscall.EISDIR
		}
		if trunc && n.mode&syscall.S_IFMT == syscall.S_IFREG {
			n.truncate(0)
		}
		return d.attrOf(n), 0
	}
	if len(name) > 255 {
		return Attr{}, syscall.ENAMETOOLONG
	}
	return d.attrOf(d.newInode(p, name, mode, uid, gid)), 0
}

// Mkdir makes a directory.
func (d *Disk) Mkdir(parent uint64, name string, perm uint32, uid, gid uint32) (Attr, syscall.Errno) {
	return d.makeEntry(parent, name, syscall.S_IFDIR|perm&0o7777, uid, gid, nil)
}

// Symlink makes a symbolic link to target.
func (d *Disk) Symlink(parent uint64, name, target string, uid, gid uint32) (Attr, syscall.Errno) {
	return d.makeEntry(parent, name, syscall.S_IFLNK|0o777, uid, gid, []byte(target))
}

// makeEntry makes a new directory or symlink named name in parent; a
// symlink's target (data) is written with its inode, durable with it.
func (d *Disk) makeEntry(parent uint64, name string, mode, uid, gid uint32, data []byte) (Attr, syscall.Errno) {
	if errno := d.begin(true); errno != 0 {
		return Attr{}, errno
	}
	defer d.mu.Unlock()
	p, errno := d.dir(parent)
	if errno != 0 {
		return Attr{}, errno
	}
	if _, ok := p.kids[name]; ok {
		return Attr{}, syscall.EEXIST
	}
	n := d.newInode(p, name, mode, uid, gid)
	if data != nil {
		n.data = data
		n.dur = slices.Clone(data)
	}
	return d.attrOf(n), 0
}

// Readlink returns a symlink's target.
func (d *Disk) Readlink(ino uint64) ([]byte, syscall.Errno) {
	if errno := d.begin(false); errno != 0 {
		return nil, errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return nil, errno
	}
	if n.mode&syscall.S_IFMT != syscall.S_IFLNK {
		return nil, syscall.EINVAL
	}
	return append([]byte(nil), n.data...), 0
}

// Unlink removes a non-directory name; Rmdir an empty directory.
func (d *Disk) Unlink(parent uint64, name string) syscall.Errno { return d.remove(parent, name, false) }

// Rmdir removes an empty directory.
func (d *Disk) Rmdir(parent uint64, name string) syscall.Errno { return d.remove(parent, name, true) }

func (d *Disk) remove(parent uint64, name string, isDir bool) syscall.Errno {
	if errno := d.begin(true); errno != 0 {
		return errno
	}
	defer d.mu.Unlock()
	p, errno := d.dir(parent)
	if errno != 0 {
		return errno
	}
	ino, ok := p.kids[name]
	if !ok {
		return syscall.ENOENT
	}
	n := d.inodes[ino]
	switch {
	case isDir && n.kids == nil:
		return syscall.ENOTDIR
	case !isDir && n.kids != nil:
		return syscall.EISDIR
	case isDir && len(n.kids) > 0:
		return syscall.ENOTEMPTY
	}
	delete(p.kids, name)
	n.nlink--
	now := time.Now()
	p.mtime, p.ctime, n.ctime = now, now, now
	d.log = append(d.log, nsOp{from: parent, oldName: name, ino: ino})
	return 0
}

// RenameNoReplace is renameat2's RENAME_NOREPLACE.
const RenameNoReplace = 1

// Rename moves (oldParent, oldName) to (newParent, newName), replacing what
// is there. flags may hold RenameNoReplace; any other flag is refused.
func (d *Disk) Rename(oldParent uint64, oldName string, newParent uint64, newName string, flags uint32) syscall.Errno {
	if flags&^RenameNoReplace != 0 {
		return syscall.EINVAL
	}
	if errno := d.begin(true); errno != 0 {
		return errno
	}
	defer d.mu.Unlock()
	op, errno := d.dir(oldParent)
	if errno != 0 {
		return errno
	}
	np, errno := d.dir(newParent)
	if errno != 0 {
		return errno
	}
	ino, ok := op.kids[oldName]
	if !ok {
		return syscall.ENOENT
	}
	n := d.inodes[ino]
	if victim, ok := np.kids[newName]; ok {
		if victim == ino {
			return 0
		}
		if flags&RenameNoReplace != 0 {
			return syscall.EEXIST
		}
		v := d.inodes[victim]
		switch {
		case v.kids != nil && n.kids == nil:
			return syscall.EISDIR
		case v.kids == nil && n.kids != nil:
			return syscall.ENOTDIR
		case v.kids != nil && len(v.kids) > 0:
			return syscall.ENOTEMPTY
		}
		v.nlink--
		d.stats.RenamesOver++
	}
	if n.kids != nil { // a directory may not move under itself
		for a := newParent; a != RootIno; {
			if a == ino {
				return syscall.EINVAL
			}
			a = d.parentOf(a)
			if a == 0 {
				break
			}
		}
	}
	delete(op.kids, oldName)
	np.kids[newName] = ino
	now := time.Now()
	op.mtime, op.ctime, np.mtime, np.ctime, n.ctime = now, now, now, now, now
	d.log = append(d.log, nsOp{from: oldParent, oldName: oldName, to: newParent, newName: newName, ino: ino})
	return 0
}

// parentOf finds the directory that names directory ino (0 if none).
func (d *Disk) parentOf(ino uint64) uint64 {
	for _, n := range d.inodes {
		if n.kids == nil {
			continue
		}
		for _, k := range n.kids {
			if k == ino {
				return n.ino
			}
		}
	}
	return 0
}

// Read returns up to size bytes of ino from off.
func (d *Disk) Read(ino uint64, off int64, size int) ([]byte, syscall.Errno) {
	if errno := d.begin(false); errno != 0 {
		return nil, errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return nil, errno
	}
	if n.kids != nil {
		return nil, syscall.EISDIR
	}
	if off >= int64(len(n.data)) {
		return nil, 0
	}
	end := min(off+int64(size), int64(len(n.data)))
	return append([]byte(nil), n.data[off:end]...), 0
}

// Write writes data to ino at off.
func (d *Disk) Write(ino uint64, off int64, data []byte) syscall.Errno {
	if errno := d.begin(true); errno != 0 {
		return errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return errno
	}
	if n.mode&syscall.S_IFMT != syscall.S_IFREG {
		return syscall.EINVAL
	}
	n.own()
	end := off + int64(len(data))
	if end > int64(len(n.data)) {
		n.data = grow(n.data, int(end))
	}
	copy(n.data[off:], data)
	n.markDirty(off, end)
	n.mtime = time.Now()
	return 0
}

// Sync is fsync (and fdatasync) of ino: a file's data and size, or a
// directory's entries, become durable.
func (d *Disk) Sync(ino uint64) syscall.Errno {
	if errno := d.begin(true); errno != 0 {
		return errno
	}
	defer d.mu.Unlock()
	n, errno := d.get(ino)
	if errno != 0 {
		return errno
	}
	if n.kids != nil {
		d.stats.DirSyncs++
		d.syncDirLocked(n)
		return 0
	}
	d.stats.FileSyncs++
	if n.mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	if len(n.dur) != len(n.data) {
		dur := make([]byte, len(n.data))
		copy(dur, n.dur)
		n.dur = dur
	}
	for p := range n.dirty {
		start := p * pageSize
		if start >= int64(len(n.data)) {
			continue
		}
		end := min(start+pageSize, int64(len(n.data)))
		copy(n.dur[start:end], n.data[start:end])
	}
	n.dirty = nil
	return 0
}

// syncDirLocked makes directory n's entries durable: its current entries,
// and the other side of every rename into or out of it not yet durable.
func (d *Disk) syncDirLocked(n *inode) {
	n.durKids = cloneKids(n.kids)
	durKidsOf := func(ino uint64) map[string]uint64 {
		if ino == n.ino {
			return nil // done above
		}
		if k := d.inodes[ino]; k != nil {
			return k.durKids
		}
		return nil
	}
	kept := d.log[:0:0]
	for _, op := range d.log {
		if !op.touches(n.ino) {
			kept = append(kept, op)
			continue
		}
		op.apply(durKidsOf)
	}
	d.log = kept
}

// DirEntry is one name in a directory listing.
type DirEntry struct {
	Name string
	Ino  uint64
	Mode uint32
}

// ReadDir lists directory ino, sorted by name.
func (d *Disk) ReadDir(ino uint64) ([]DirEntry, syscall.Errno) {
	if errno := d.begin(false); errno != 0 {
		return nil, errno
	}
	defer d.mu.Unlock()
	n, errno := d.dir(ino)
	if errno != 0 {
		return nil, errno
	}
	ents := make([]DirEntry, 0, len(n.kids))
	for name, k := range n.kids {
		ents = append(ents, DirEntry{Name: name, Ino: k, Mode: d.inodes[k].mode})
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	return ents, 0
}

// Check fails the request if the power is cut (for requests that touch no
// state, like open and flush).
func (d *Disk) Check(ino uint64) syscall.Errno {
	if errno := d.begin(false); errno != 0 {
		return errno
	}
	defer d.mu.Unlock()
	_, errno := d.get(ino)
	return errno
}
