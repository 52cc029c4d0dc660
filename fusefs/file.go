package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs/internal/lockorder"
	"github.com/ckptfs/ckptfs/fusefs/stage"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"
)

// fileNode is a regular file's inode: its committed manifest and, while it
// is being changed, its new content (staging, a stage.File). What belongs to
// one open of it is its handle's (handle.go); the counts of its handles are
// the inode's.
//
// A change to a committed file that other handles have open (readers, mmaps)
// is staged in a fork: a new node with a new inode number that takes the file's
// place at commit, while this node stays frozen at the old version for the
// handles that have it. The kernel's cached pages of the old inode therefore
// never mix versions, and a process that mmapped the old version keeps reading
// it even when the writer overwrites the file in place (torch.save's open with
// O_TRUNC).
type fileNode struct {
	nodeBase

	// Guarded by fsys.nsMu.
	persisted bool     // the catalog has this node's record and directory entry
	dir       *dirNode // where the file lives (for its commit's directory entry)
	name      string
	shadow    uint64 // committed node at dir/name this file replaces at its first commit

	unlinked atomic.Bool // no name any more; commits keep it out of the catalog
	// linkCtime is the ctime of the last link or unlink of one of the
	// file's names while it keeps one (nsMu held; attr needs mu, which
	// namespace changes do not take): fillAttr and record show the later
	// of it and attr's.
	linkCtime atomic.Int64

	commitMu lockorder.Mutex[lockorder.FileCommit] // one commit of this file at a time

	// releaseMu is held by the RELEASE of a handle that may write, from its
	// look at the writers ("am I the last?") to its own writer going from
	// the count: of the last two writers released at once, the second then
	// sees the first gone and commits what was written after both FLUSHes
	// (mmap writeback), instead of both skipping the commit.
	releaseMu lockorder.Mutex[lockorder.FileRelease]

	// attrMu is the last lock in the order, and guards attr too: attr is changed holding
	// both mu and attrMu, and read holding either. Getattr takes attrMu
	// only, so a stat or a listing never waits for a commit, which holds mu
	// while it stores the file's chunks.
	attrMu lockorder.Mutex[lockorder.FileAttr]

	// unflushed counts n's own handles that may write and that no FLUSH
	// has reached yet (Setattr). Atomic, not under mu: a FLUSH notes itself
	// before its commit, and must not wait for another's (a forked child's
	// close-on-exec FLUSH would hold its exec for the whole commit).
	unflushed atomic.Int32

	// Bytes of the content in holes, which st_blocks leaves out (guarded by
	// attrMu; changed holding mu too): from the catalog's holes row at the
	// first stat (loadHoles), then from each change (setHoles).
	holeBytes  int64
	holesKnown bool

	mu            lockorder.RWMutex[lockorder.FileContent] // guards what follows, and attr
	manifest      *cas.Manifest
	offsets       []int64 // offsets[i] = file offset of manifest.Chunks[i]
	committedSize int64
	staging       *stage.File  // content not committed yet, if any
	dirty         bool         // content or size changed since the last commit
	forked        bool         // an origin's fork field names n (pins n)
	writers       int          // open handles that may write (for a fork: its origin's)
	handles       int          // all open handles
	gen           uint64       // bumped by every content change
	cachedGen     uint64       // gen when a read handle last got the kernel's cached pages
	fork          *fileNode    // the new version being staged for n's writers
	asyncErr      error        // a background commit's failure, for the next close or fsync
	kept          []*cas.Batch // batches of commits that found n unlinked (cas.Batch.Keep)
	lost          error        // staged content was dropped (revert): writes fail until truncated or reopened
	spans         []tensorSpan // tensor byte ranges of the manifest, for prefetch

	reads readState // sequential-read detection, for prefetch

	// origin, for a fork not committed yet, is the node it replaces. Guarded
	// by fsys.nsMu, and changed holding mu too, so either lock reads it.
	origin *fileNode
}

var (
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
)

func isWrite(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY
}

// openHandle registers a new handle (it takes mu), reading the committed
// manifest first if n does not hold it (a closed file does not).
func (n *fileNode) openHandle(ctx context.Context, flags uint32) (*handle, uint32, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.openLocked(ctx, flags)
}

// openLocked is openHandle with mu held, or for a new node that no other
// goroutine can reach yet (Create, under nsMu, which comes after mu).
func (n *fileNode) openLocked(ctx context.Context, flags uint32) (*handle, uint32, error) {
	h := newHandle(ctx, isWrite(flags), &n.fsys.tgids)
	h.n = n
	h.appending = h.write && flags&syscall.O_APPEND != 0
	h.pageCached = !h.write && flags&syscall.O_DIRECT == 0
	if err := n.loadManifestLocked(); err != nil {
		return nil, 0, err
	}
	n.handles++
	n.fsys.trackOpen(n, 1)
	n.fsys.pin(n)
	if h.write {
		n.writers++
		n.unflushed.Add(1)
		if n.fork != nil {
			n.fork.mu.LockNested() // origin's mu → fork's
			n.fork.writers++
			n.fork.mu.Unlock()
		}
		// No page-cache copy of written bytes, and requests of MaxWrite.
		return h, fuse.FOPEN_DIRECT_IO, nil
	}
	if !n.staged() && n.cachedGen == n.gen {
		return h, fuse.FOPEN_KEEP_CACHE, nil
	}
	n.cachedGen = n.gen
	return h, 0, nil
}

// tookName reports whether fork n has taken its origin's name (its first
// commit cleared origin; so does the drop of one with no name to take).
// origin is changed holding nsMu with n.mu held too, so mu suffices here.
func (n *fileNode) tookName() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.origin == nil
}

// dataNode returns the node that holds the content seen through h: the fork
// for handles that may write (and for changes by path, h == nil), n otherwise.
func (n *fileNode) dataNode(h fs.FileHandle) *fileNode {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if hh, ok := h.(*handle); n.fork != nil && (h == nil || ok && hh.write) {
		return n.fork
	}
	return n
}

// changeTarget returns the node a change through h must go to, starting a fork
// when n is a committed file that handles other than writers have open.
//
// Appends fork too (handle.Write puts them at the fork's end). Not forking
// them would let readers see a log grow (`tail -f`), but once an appender
// had staged n in place, another writer's truncation or overwrite would
// change the bytes those readers hold, and a reader's READ would spill the
// appender's stream into a copy of the whole file.
//
// A change that comes from the page cache (cached: a shared mapping's dirty
// pages) never starts a fork: the kernel already shows it, in the pages of
// n's inode, to every process that has the inode open or mapped, so a fork
// would leave those readers a mix of the two versions (the cached pages new,
// the pages the kernel reads back through their handles old). It changes n in
// place, as on a local filesystem.
func (n *fileNode) changeTarget(h fs.FileHandle, cached bool) *fileNode {
	if t := n.dataNode(h); t != n {
		return t
	}
	if hh, ok := h.(*handle); ok && !hh.write {
		return n // the kernel does not send writes through read handles
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fork != nil {
		return n.fork
	}
	if cached || n.staged() || n.handles <= n.writers || n.unlinked.Load() {
		return n
	}
	ino, err := n.fsys.store.AllocIno()
	if err != nil {
		n.fsys.log.Printf("fork %q: %v; changing it in place", n.name, err)
		return n
	}
	n.fsys.lockNS()
	defer n.fsys.nsMu.Unlock()
	if !n.persisted || n.links() > 1 || n.dir == nil {
		// A file with several names (or one of whose names n does not
		// know, dir nil) changes in place: a fork takes one name only.
		return n
	}
	// The fork is not tracked as open on its own: n is, and n's commit and
	// LiveManifests reach the fork through n.fork. It is pinned: once it
	// has the name, a lookup must find it, not a node built from the catalog.
	// Its inode is made now, once, for that lookup (and replaceOrigin).
	f := &fileNode{nodeBase: nodeBase{fsys: n.fsys, attr: n.attr}, origin: n, writers: n.writers, forked: true}
	f.attr.Ino = ino
	f.setManifest(n.manifest)
	n.NewInode(context.Background(), f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino})
	n.fork = f
	n.fsys.pin(f)
	return f
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h, fuseFlags, err := n.openHandle(ctx, flags)
	if err != nil {
		return nil, 0, n.fsys.toErrno("open", err)
	}
	return h, fuseFlags, 0
}

// loadManifest reads the committed manifest from the catalog if it is not in
// memory.
func (n *fileNode) loadManifest() error {
	n.mu.RLock()
	have := n.manifest != nil
	n.mu.RUnlock()
	if have {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.loadManifestLocked()
}

// loadManifestLocked is loadManifest with mu held. A node holds its manifest
// while it is open or changed; unpinIfSettled drops it when it closes.
func (n *fileNode) loadManifestLocked() error {
	if n.manifest != nil {
		return nil
	}
	var m *cas.Manifest
	err := n.fsys.store.View(func(tx *cas.Tx) error {
		var ok bool
		var err error
		m, ok, err = tx.Manifest(n.attr.Ino)
		if err == nil && !ok {
			m = &cas.Manifest{}
		}
		return err
	})
	if err != nil {
		return err
	}
	if m.Size() == 0 && n.committedSize != 0 && n.unlinked.Load() {
		// A refresh removed or replaced the file (ApplyRemote) after the
		// kernel's last lookup: ESTALE makes it look the name up again.
		return fmt.Errorf("file %d: removed from the catalog by a refresh: %w", n.attr.Ino, syscall.ESTALE)
	}
	// Nothing is staged without a manifest: committedSize is the node
	// record's, or that of the manifest last dropped. A mismatch is refused
	// every time (the manifest is not installed), never served cut or padded
	// to the record's size: a damaged or missing row must not serve a 2 MB
	// file as 0 bytes.
	if n.committedSize != m.Size() {
		return fmt.Errorf("file %d: %w: manifest holds %d bytes, node record says %d", n.attr.Ino, cas.ErrCatalogDamaged, m.Size(), n.committedSize)
	}
	n.setManifest(m)
	return nil
}

// setManifest installs m as the committed content (mu held).
func (n *fileNode) setManifest(m *cas.Manifest) {
	n.manifest = m
	n.spans = tensorSpans(m)
	n.offsets = m.Offsets()
	n.committedSize = m.Size()
	n.setHoles(m.HoleBytes())
}

// hasHoles reports whether the content has holes, as far as is known.
func (n *fileNode) hasHoles() bool {
	n.attrMu.Lock()
	defer n.attrMu.Unlock()
	return n.holeBytes > 0
}

// setHoles records the content's hole bytes (mu held).
func (n *fileNode) setHoles(v int64) {
	n.attrMu.Lock()
	n.holeBytes, n.holesKnown = v, true
	n.attrMu.Unlock()
}

// loadHoles reads the committed content's hole bytes from the catalog, once
// (attrMu not held: a catalog read may wait for a commit, which takes
// attrMu). A change recorded meanwhile wins over what it read.
func (n *fileNode) loadHoles() {
	n.attrMu.Lock()
	known, ino := n.holesKnown, n.attr.Ino
	n.attrMu.Unlock()
	if known {
		return
	}
	var v int64
	err := n.fsys.store.View(func(tx *cas.Tx) error {
		var err error
		v, err = tx.HoleBytes(ino)
		return err
	})
	if err != nil {
		n.fsys.log.Printf("file %d: %v", ino, err)
		return // counted as data until known
	}
	n.attrMu.Lock()
	if !n.holesKnown {
		n.holeBytes, n.holesKnown = v, true
	}
	n.attrMu.Unlock()
}

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.loadHoles()
	n.attrMu.Lock()
	defer n.attrMu.Unlock()
	n.fillAttr(&out.Attr)
	return 0
}

// setAttr changes n.attr (mu held).
func (n *fileNode) setAttr(change func(a *cas.Node)) {
	n.attrMu.Lock()
	change(&n.attr)
	n.attrMu.Unlock()
}

func (n *fileNode) fillAttr(out *fuse.Attr) {
	nlink := n.links()
	if n.unlinked.Load() {
		nlink = 0
	}
	fillAttr(out, &n.attr, nlink)
	if c := n.linkCtime.Load(); c > n.attr.Ctime {
		out.Ctime, out.Ctimensec = uint64(c/1e9), uint32(c%1e9)
	}
	// Holes take no space: st_blocks counts the rest, as ext4's does.
	out.Blocks = (uint64(max(n.attr.Size-n.holeBytes, 0)) + 511) / 512
}

// record returns n's node record for the catalog from attr (mu held): a
// link or unlink of one of its names since attr's ctime was set counts.
func (n *fileNode) record() cas.Node {
	rec := n.attr
	if c := n.linkCtime.Load(); c > rec.Ctime {
		rec.Ctime = c
	}
	return rec
}

func (n *fileNode) read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, _ := f.(*handle)
	return n.readThrough(ctx, f, dest, off, h == nil || h.pageCached)
}

// readThrough is read; pageCached says whether what the READ returns goes
// to the kernel's page cache (not through a handle with FOPEN_DIRECT_IO: a
// writer's, or one opened with O_DIRECT).
func (n *fileNode) readThrough(ctx context.Context, f fs.FileHandle, dest []byte, off int64, pageCached bool) (fuse.ReadResult, syscall.Errno) {
	n.fsys.noteActivity()
	if t := n.dataNode(f); t != n {
		return t.readThrough(ctx, nil, dest, off, pageCached)
	}
	n.mu.RLock()
	if n.staging != nil && n.staging.Streaming() {
		// Reading what is being streamed: give it a spool first.
		n.mu.RUnlock()
		n.mu.Lock()
		var err error
		if st := n.staging; st != nil && st.Streaming() {
			switch err = st.Spill(ctx); {
			case err != nil && !st.Holds():
				// The stream's bytes went with it: as after a failed
				// write, the file shows its committed content and its
				// writers are told, instead of a commit of nothing.
				n.revert(err)
			case !st.Holds():
				n.staging = nil
			}
		}
		n.mu.Unlock()
		if err != nil {
			return nil, n.fsys.toErrno("read staged", err)
		}
		n.mu.RLock()
	}
	if n.staging != nil {
		defer n.mu.RUnlock()
		k, err := n.staging.ReadAt(dest, off)
		if err != nil {
			return nil, n.fsys.toErrno("read staged", err)
		}
		return fuse.ReadResultData(dest[:k]), 0
	}
	m, offsets, spans := n.manifest, n.offsets, n.spans
	n.mu.RUnlock()
	if m == nil {
		return nil, syscall.EIO // Open loads it
	}
	res, err := n.readChunks(ctx, m, offsets, off, len(dest))
	if err != nil {
		return nil, n.fsys.toErrno("read", err)
	}
	end := min(off+int64(len(dest)), manifestSize(m, offsets))
	stream, front := n.reads.prefetchAfter(n.fsys.store, m, offsets, spans, off, end, readScale(n.fsys.readAhead.Load()))
	if pageCached {
		res.passed(offsets, off, end, stream, front)
	}
	return res, 0
}

// chunkResult answers a read with slices of cached chunks, written to the
// kernel with writev (no copy); Done releases the chunks once they are sent.
type chunkResult struct {
	vecs   [][]byte
	chunks []*cas.Chunk
	first  int // the manifest's index of chunks[0]
}

// passed marks the chunks whose bytes the kernel's page cache now holds
// (cas.Chunk.Passed), which the chunk cache then lets go first: those this
// READ of [off, end) covered whole (a small file read, the short chunks of
// a readahead window) and, in a stream, those that end before front, how
// far the stream has read (the READ that reads a chunk's head may come
// after the one that read past its tail). offsets: where each of the
// manifest's chunks starts. A lazy reader's READs cover parts of a tensor
// file's 1 MiB chunks: they stay.
func (r *chunkResult) passed(offsets []int64, off, end int64, stream bool, front int64) {
	for i, c := range r.chunks {
		start := offsets[r.first+i]
		stop := start + int64(len(c.Data))
		if stop <= end && start >= off || stream && stop <= front {
			c.Passed()
		}
	}
}

func (r *chunkResult) Size() int {
	n := 0
	for _, v := range r.vecs {
		n += len(v)
	}
	return n
}

func (r *chunkResult) Bytes(buf []byte) ([]byte, fuse.Status) {
	out := buf[:0]
	for _, v := range r.vecs {
		out = append(out, v...)
	}
	return out, fuse.OK
}

// maxReplyVecs bounds the slices of one READ's reply. The kernel's writev
// takes at most 1,024 (UIO_MAXIOV), go-fuse's header among them, and go-fuse
// answers nothing when /dev/fuse refuses a reply: the reader hung in D
// state, unkillable with O_DIRECT, and the mount could not be unmounted.
// A READ spans that many chunks only where a file was cut into chunks of
// about 1 KiB or less (a run of tiny zstd frames, pickle frames, or a store
// made with a tiny chunk size).
const maxReplyVecs = 256

// Slices makes go-fuse write the slices with writev, or, past
// maxReplyVecs, their bytes copied into one.
func (r *chunkResult) Slices() ([][]byte, fuse.Status) {
	if len(r.vecs) <= maxReplyVecs {
		return r.vecs, fuse.OK
	}
	b, st := r.Bytes(make([]byte, 0, r.Size()))
	return [][]byte{b}, st
}

func (r *chunkResult) Done() {
	for _, c := range r.chunks {
		c.Release()
	}
	r.chunks, r.vecs = nil, nil
}

// readChunks returns the bytes [off, off+size) of manifest m (clipped at its
// end) as slices of cached chunks, held until the result's Done, and of a
// zero buffer where m has holes (which read nothing from the store). Chunks
// not cached are loaded in parallel.
func (n *fileNode) readChunks(ctx context.Context, m *cas.Manifest, offsets []int64, off int64, size int) (*chunkResult, error) {
	total := manifestSize(m, offsets)
	end := min(off+int64(size), total)
	if off >= end {
		return &chunkResult{}, nil
	}
	// The chunks that overlap [off, end): those from first to last.
	first := sort.Search(len(offsets), func(i int) bool { return offsets[i]+int64(m.Chunks[i].Len) > off })
	last := sort.Search(len(offsets), func(i int) bool { return offsets[i] >= end }) - 1
	res := &chunkResult{chunks: make([]*cas.Chunk, max(last-first+1, 0)), first: first}
	load := func(i int) error {
		c, err := n.fsys.store.AcquireChunk(ctx, m.Chunks[first+i])
		res.chunks[i] = c
		return err
	}
	// Cached chunks (a prefetched stream's: all of them) are taken here;
	// only the others are loaded, in parallel when there are several (a
	// goroutine per chunk of every READ cost a stream of ~32 KiB chunks 5 %
	// of the daemon's CPU).
	var missing []int
	for i := range res.chunks {
		if c, ok := n.fsys.store.AcquireCached(m.Chunks[first+i]); ok {
			res.chunks[i] = c
		} else {
			missing = append(missing, i)
		}
	}
	if len(missing) == 1 {
		if err := load(missing[0]); err != nil {
			res.Done()
			return nil, err
		}
	} else if len(missing) > 1 {
		var g errgroup.Group
		for _, i := range missing {
			g.Go(func() error { return load(i) })
		}
		if err := g.Wait(); err != nil {
			res.Done()
			return nil, err
		}
	}
	res.vecs = make([][]byte, 0, 2*len(res.chunks)+1)
	at := off // how far the vectors reach
	zeros := func(to int64) {
		for at < to {
			z := n.fsys.zeros[:min(to-at, int64(len(n.fsys.zeros)))]
			res.vecs = append(res.vecs, z)
			at += int64(len(z))
		}
	}
	for i, c := range res.chunks {
		start := offsets[first+i]
		zeros(start) // a hole before the chunk
		lo := max(off-start, 0)
		hi := min(end-start, int64(len(c.Data)))
		res.vecs = append(res.vecs, c.Data[lo:hi])
		at = start + hi
	}
	zeros(end)
	return res, nil
}

// manifestSize is the size of manifest m, whose chunks start at offsets: in
// constant time (m.Size adds up every chunk, and a read of a file of ~32 KiB
// chunks asked for it thrice per READ: 5.5 % of the daemon's time in a cold
// read of a GiB).
func manifestSize(m *cas.Manifest, offsets []int64) int64 {
	var end int64
	if n := len(offsets); n > 0 {
		end = offsets[n-1] + int64(m.Chunks[n-1].Len)
	}
	// A file's trailing hole (there is at most one: holes are sorted by
	// place, one per place) lies past its last chunk.
	if h := len(m.Holes); h > 0 && m.Holes[h-1].Before == len(m.Chunks) {
		end += m.Holes[h-1].Len
	}
	return end
}

// staged reports whether n has content not committed yet (mu held).
func (n *fileNode) staged() bool { return n.staging != nil }

// stage makes sure n's content is staged: from empty (in a stream if the
// write memory budget has room) when keep is 0, else in a spool holding a
// copy of the committed content's first keep bytes, or, for a write at its
// end (appending), in a stream that keeps the committed chunks but the last
// where the file is cut by content alone (stage.Pool.StageAppend). mu held.
func (n *fileNode) stage(ctx context.Context, keep int64, appending bool) error {
	if n.staged() {
		return nil
	}
	keep = min(keep, n.committedSize)
	var base *cas.Manifest
	if keep == 0 {
		n.setAttr(func(a *cas.Node) { a.Size = 0 })
	} else if err := n.loadManifestLocked(); err != nil { // a truncate by path of a closed file
		return err
	} else {
		base = n.manifest
	}
	var st *stage.File
	var err error
	if appending && base != nil && keep == base.Size() {
		st, err = n.fsys.stage.StageAppend(ctx, n.attr.Ino, base)
	} else {
		st, err = n.fsys.stage.Stage(ctx, n.attr.Ino, base, keep)
	}
	if err != nil {
		return err
	}
	n.staging = st
	n.setAttr(func(a *cas.Node) { a.Size = keep })
	n.setHoles(st.HoleBytes())
	return nil
}

// writeStaged stages data at off (appendAtEnd: where the content ends) in n
// itself (the node changeTarget chose).
func (n *fileNode) writeStaged(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lost != nil {
		return 0, n.fsys.toErrno("write", n.lost)
	}
	if off == appendAtEnd {
		off = n.attr.Size
	}
	if off >= MaxFileSize {
		return 0, syscall.EFBIG
	}
	data = data[:min(int64(len(data)), MaxFileSize-off)] // a short write up to the limit, as ext4's
	if err := n.stage(ctx, n.attr.Size, off == n.attr.Size); err != nil {
		return 0, n.fsys.toErrno("write", err)
	}
	oldSize := n.attr.Size
	k, err := n.staging.WriteAt(ctx, data, off)
	if stage.IsLost(err) {
		n.revert(err)
		return 0, n.fsys.toErrno("write", err)
	}
	if size := n.staging.Size(); size != n.attr.Size {
		n.setAttr(func(a *cas.Node) { a.Size = size })
	}
	if off > oldSize || n.hasHoles() {
		n.setHoles(n.staging.HoleBytes()) // a sparse file: fstat its spool
	}
	if k > 0 {
		n.changed()
	}
	if err != nil {
		return uint32(k), n.fsys.toErrno("write", err)
	}
	return uint32(k), 0
}

// fromPageCache reports whether a WRITE writes back dirty pages of the
// kernel's page cache (a shared mapping's stores) rather than a write(2):
// mount.go's pageWrites gives those caller pid 0, as the kernel does. The
// process that made the stores is unknown (the flusher, or whichever process
// calls msync, munmap or close writes them back), so they name no changer
// (handle.tgidLocked) either.
func fromPageCache(ctx context.Context) bool {
	c, ok := ctx.(*fuse.Context)
	return ok && c.Pid == 0
}

// killPriv clears the setuid bit, and the setgid bit of a group-executable
// file, when a caller without CAP_FSETID writes, as the kernel does for ext4
// (file_remove_privs). The kernel leaves this to us: write handles are
// FOPEN_DIRECT_IO, whose writes skip it, and go-fuse's node API does not pass
// the FUSE_WRITE_KILL_SUIDGID flag that CAP_HANDLE_KILLPRIV_V2 would give.
// The new mode is committed with the content (a fork takes its origin's
// mode, cleared here); the kernel's cached attributes are dropped so that a
// stat after the write sees it.
func (n *fileNode) killPriv(ctx context.Context) {
	n.attrMu.Lock()
	mode := n.attr.Mode
	n.attrMu.Unlock()
	kill := killPrivBits(mode)
	if kill == 0 || callerMaySetID(ctx) {
		return
	}
	n.mu.Lock()
	n.setAttr(func(a *cas.Node) {
		a.Mode &^= killPrivBits(a.Mode)
		a.Ctime = time.Now().UnixNano()
	})
	n.mu.Unlock()
	if errno := n.NotifyContent(-1, 0); errno != 0 && errno != syscall.ENOSYS {
		n.fsys.log.Printf("invalidate attributes of file %d: %v", n.attr.Ino, errno)
	}
}

// killPrivBits returns the mode bits a write by an unprivileged caller clears:
// setuid, and setgid when group execute is set (setgid alone marks mandatory
// locking, which the kernel keeps).
func killPrivBits(mode uint32) uint32 {
	kill := mode & syscall.S_ISUID
	if mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		kill |= syscall.S_ISGID
	}
	return kill
}

// callerMaySetID reports whether the thread that made the request has
// CAP_FSETID in its effective set (read from /proc; a root thread that moved
// its fsuid away from 0 has lost it), falling back to "uid 0" when /proc
// cannot say. It is only asked for files with setuid or setgid bits.
func callerMaySetID(ctx context.Context) bool {
	c, ok := ctx.(*fuse.Context)
	if !ok {
		return true // not a kernel request
	}
	const capFsetid = 4
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if hexCaps, ok := strings.CutPrefix(line, "CapEff:"); ok {
				if caps, err := strconv.ParseUint(strings.TrimSpace(hexCaps), 16, 64); err == nil {
					return caps&(1<<capFsetid) != 0
				}
			}
		}
	}
	return c.Uid == 0
}

// changed records a content change (mu held).
func (n *fileNode) changed() {
	if !n.dirty {
		n.fsys.pin(n) // until it is committed, even with no handle open
	}
	n.dirty = true
	n.gen++
	now := time.Now().UnixNano()
	n.setAttr(func(a *cas.Node) { a.Mtime, a.Ctime = now, now })
}

// resize sets the staged size (mu held).
func (n *fileNode) resize(ctx context.Context, size int64) error {
	if size < 0 {
		return syscall.EINVAL
	}
	if size > MaxFileSize {
		return syscall.EFBIG
	}
	if err := n.stage(ctx, size, false); err != nil {
		return err
	}
	if size == 0 {
		n.lost = nil // a new save starts here
	}
	if err := n.staging.Truncate(ctx, size); err != nil {
		if stage.IsLost(err) {
			n.revert(err)
		}
		return err
	}
	n.setAttr(func(a *cas.Node) { a.Size = size })
	n.setHoles(n.staging.HoleBytes())
	n.changed()
	return nil
}

func (n *fileNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if err := n.loadManifest(); err != nil {
		return n.fsys.toErrno("setattr", err)
	}
	size, resize := in.GetSize()
	if resize && size > MaxFileSize {
		return syscall.EFBIG // before a fork could start for a change that cannot happen
	}
	if h, ok := f.(*handle); ok && resize {
		h.noteChange(ctx)
	}
	if resize {
		unflushed := n.unflushed.Load()
		t := n.changeTarget(f, false)
		t.mu.Lock()
		clean := !t.dirty
		err := t.resize(ctx, int64(size))
		writers := t.writers
		t.mu.Unlock()
		if err != nil {
			return n.fsys.toErrno("truncate", err)
		}
		// truncate(2) by path: no close will follow, so this is the commit,
		// unless a writer's close is to commit it. open(O_TRUNC) also arrives
		// without a handle, but after the OPEN, whose handle no FLUSH has
		// reached: its writer commits at close, and until then the catalog
		// keeps the previous version. A writer with changes staged commits
		// them at its close, never half-written. But a writer whose
		// descriptors are all closed counts among the writers until its
		// RELEASE, which the kernel sends after close(2) has returned: a
		// truncate right after a close must not leave its commit to that
		// RELEASE (it returned before the commit, and when the RELEASE had
		// already looked for changes, nothing committed it until unmount).
		// So once every writer's FLUSH has come and nothing is staged, the
		// truncate commits.
		if f == nil && (writers == 0 || clean && unflushed == 0) {
			if err := t.commit(ctx); err != nil {
				return n.fsys.toErrno("truncate", err)
			}
		}
	}
	if err := n.setattrLocked(in, resize); err != nil {
		return n.fsys.toErrno("setattr", err)
	}
	return n.Getattr(ctx, f, out)
}

// setattrLocked applies in's attributes (not the size) and writes the node
// record. n.mu is held until the record is written: a commit holds it from
// its first look at the content to its catalog write, so the record written
// here carries the size of the manifest the catalog holds at that moment,
// never that of a version a commit replaced meanwhile (the size would not
// match the manifest after a remount, and the file would open with EIO).
func (n *fileNode) setattrLocked(in *fuse.SetAttrIn, resize bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := n.attr
	applySetattr(&rec, in, time.Now().UnixNano())
	n.setAttr(func(a *cas.Node) {
		a.Mode, a.UID, a.GID = rec.Mode, rec.UID, rec.GID
		a.Atime, a.Mtime, a.Ctime = rec.Atime, rec.Mtime, rec.Ctime
	})
	rec.Size = n.committedSize
	if h := n.fsys.setattrHook; h != nil {
		h()
	}
	if resize && in.Valid&^fuse.FATTR_SIZE&^fuse.FATTR_FH&^fuse.FATTR_LOCKOWNER == 0 {
		return nil // a plain truncate: its commit writes the record
	}
	// A fork of n may take n's name while this runs: its commit holds the
	// fork's mu until its catalog write is done (origin's mu → fork's, as in
	// Open), so once we hold it, the fork either has not read n's mode yet
	// (and reads the one set above) or has the name, and then the change is
	// the fork's too: it is the file the name shows.
	fork := n.fork
	if fork != nil {
		fork.mu.LockNested()
		defer fork.mu.Unlock()
	}
	n.fsys.lockNS() // file.mu → nsMu, as in commit
	defer n.fsys.nsMu.Unlock()
	if n.persisted {
		return n.fsys.store.Update(func(tx *cas.Tx) error { return tx.PutNode(rec) })
	}
	if fork == nil || !fork.persisted || fork.origin != nil || fork.unlinked.Load() {
		return nil
	}
	fork.setAttr(func(a *cas.Node) { a.Mode, a.UID, a.GID = rec.Mode, rec.UID, rec.GID })
	frec := fork.record()
	frec.Size = fork.committedSize
	return n.fsys.store.Update(func(tx *cas.Tx) error { return tx.PutNode(frec) })
}

// nameNow returns n's name (nsMu not held).
func (n *fileNode) nameNow() string {
	n.fsys.lockNS()
	defer n.fsys.nsMu.Unlock()
	return n.name
}

func (n *fileNode) takeAsyncErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.asyncErr
	n.asyncErr = nil
	return err
}

// releaseWriter forgets a redirected writer of fork n (its origin's mu held).
func (n *fileNode) releaseWriter() {
	n.mu.LockNested()
	n.writers--
	if n.writers == 0 {
		n.lost = nil
	}
	n.dropSpoolLocked()
	n.fsys.unpinIfSettled(n)
	n.mu.Unlock()
}

// errStagedLost is what n.lost wraps: a file's staged content was dropped
// (revert), and the file shows its committed version again.
var errStagedLost = errors.New("the file's staged content was lost")

// revert drops staged content that cannot be committed (its stream failed):
// n shows its committed content again, as after a crash before the commit
// (mu held). The writers that had it staged must not go on as if it were
// still there: a writer that retries the rest of a short write would
// otherwise commit its later bytes after a hole of zeros (now that a failed
// write's chunks are freed at once, a retry on a full disk often succeeds).
// So writes fail with that error until the file is truncated to nothing (open
// with O_TRUNC: a new save) or every writer has closed.
func (n *fileNode) revert(cause error) {
	n.lost = fmt.Errorf("%w (%w): write it again from the start", errStagedLost, cause)
	if n.staging != nil {
		n.staging.Abort()
		n.staging = nil
	}
	n.setAttr(func(a *cas.Node) { a.Size = n.committedSize })
	if n.manifest != nil {
		n.setHoles(n.manifest.HoleBytes())
	}
	n.dirty = false
	n.gen++
}

// dropUnlinkedLocked drops what a file with no name left holds once its
// last handle is gone: its staged content, which commitLocked does not
// store (a file created and unlinked unwritten is dirty with nothing
// staged), and what commits that found it unlinked kept (n.kept). mu held.
func (n *fileNode) dropUnlinkedLocked() {
	if n.staging != nil {
		n.staging.Abort()
		n.staging = nil
	}
	n.dirty = false
	for _, b := range n.kept {
		b.Drop() // the chunks only n's in-memory manifest named
	}
	n.kept = nil
	n.fsys.letGo.Add(1)
}

// dropSpoolLocked frees the spool once nothing can change or needs it (mu held).
func (n *fileNode) dropSpoolLocked() {
	if n.writers == 0 && !n.dirty && n.staging != nil && !n.staging.Streaming() {
		n.staging.Abort()
		n.staging = nil
	}
}
