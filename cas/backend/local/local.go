package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/internal/faults"
	"github.com/ckptfs/ckptfs/cas/internal/fsutil"
)

// Options configure New.
type Options struct {
	// SyncHook, when set (tests), replaces every fdatasync of an object and
	// fsync of a directory that Sync would do; it gets the path.
	SyncHook func(path string) error
	// HeldFiles bounds the descriptors kept open from Put to Sync (default: a
	// quarter of the file limit, at most 8192; negative: none, every Put
	// syncs before its rename).
	HeldFiles int
}

// Backend is a directory of objects. Its methods are safe for concurrent use.
type Backend struct {
	root     string
	syncHook func(path string) error

	heldMu    sync.Mutex
	held      map[backend.Handle]*os.File // written, not yet synced
	heldSlots chan struct{}

	madeDirs sync.Map // directories known to exist
	// linked holds directories whose own entry in their parent a Sync of
	// this process has made durable (the parent fsynced while they
	// existed): a later Sync fsyncs only the directory of its objects.
	linked    sync.Map
	syncErrs  sync.Map        // Handle → error: failed fdatasyncs (sticky)
	syncLocks [256]sync.Mutex // by the name's first bytes: sync-then-record is one step
	noDirect  atomic.Bool     // the filesystem refuses O_DIRECT
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.Janitor     = (*Backend)(nil)
	_ backend.RangeGetter = (*Backend)(nil)
)

// syncWorkers is how many objects Sync fdatasyncs at once: enough for the
// filesystem to group them into few journal commits.
const syncWorkers = 16

// New returns the backend of the objects directory root. It creates nothing
// until the first Put (a read-only store has its directory already).
func New(root string, opts Options) *Backend {
	n := opts.HeldFiles
	if n == 0 {
		n = heldFileBudget()
	}
	b := &Backend{root: root, syncHook: opts.SyncHook, held: map[backend.Handle]*os.File{}}
	if n > 0 {
		b.heldSlots = make(chan struct{}, n)
	}
	return b
}

// Location implements backend.Backend: the directory.
func (b *Backend) Location() string { return b.root }

// Properties implements backend.Backend.
func (b *Backend) Properties() backend.Properties {
	return backend.Properties{Connections: syncWorkers, KeepsModTime: true}
}

// path is where h's object lives.
func (b *Backend) path(h backend.Handle) string {
	if h.Kind == backend.Chunk {
		return filepath.Join(b.root, h.Name[0:2], h.Name[2:4], h.Name[4:])
	}
	return filepath.Join(b.root, h.Kind.String(), h.Name)
}

// dirs are the directories whose entries must be durable for h's object to be.
func (b *Backend) dirs(h backend.Handle) []string {
	if h.Kind == backend.Chunk {
		ab := filepath.Join(b.root, h.Name[0:2])
		return []string{b.root, ab, filepath.Join(ab, h.Name[2:4])}
	}
	return []string{b.root, filepath.Join(b.root, h.Kind.String())}
}

func check(ctx context.Context, h backend.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return backend.CheckHandle(h)
}

// Put implements backend.Backend (see the package documentation for when it
// syncs before returning).
func (b *Backend) Put(ctx context.Context, h backend.Handle, obj []byte, opts backend.PutOptions) error {
	if err := check(ctx, h); err != nil {
		return err
	}
	path := b.path(h)
	if err := b.makeDirs(filepath.Dir(path)); err != nil {
		return err
	}
	_, exists := b.syncErrs.Load(h) // its bytes may not be on disk: replace durably
	if !exists && !opts.IfAbsent {
		if _, err := os.Lstat(path); err == nil {
			exists = true
		}
	}
	keep := !exists && b.holdSlot()
	f, err := publish(ctx, path, obj, keep, opts.IfAbsent)
	if err != nil {
		if keep {
			b.releaseSlot()
		}
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("put %v: %w", h, backend.ErrExists)
		}
		return fmt.Errorf("put %v: %w", h, err)
	}
	if !keep {
		b.syncErrs.Delete(h) // the new file is durable
	}
	b.heldMu.Lock()
	old := b.held[h]
	if f != nil {
		b.held[h] = f
	} else {
		delete(b.held, h)
	}
	b.heldMu.Unlock()
	if old != nil { // the same object written twice before a Sync
		old.Close()
		b.releaseSlot()
	}
	if !opts.ModTime.IsZero() {
		// After the rename: a temporary file that looks old is one
		// RemoveStale takes for a crash leftover.
		if err := os.Chtimes(path, opts.ModTime, opts.ModTime); err != nil {
			return fmt.Errorf("put %v: set mtime: %w", h, err)
		}
	}
	return nil
}

// publish writes obj to path atomically: a temporary file in path's
// directory, renamed (or, with ifAbsent, linked) into place. Without keep the
// file is fdatasync'd first and closed (f nil); with keep its writeback is
// only started and the open file returned for Sync.
func publish(ctx context.Context, path string, obj []byte, keep, ifAbsent bool) (*os.File, error) {
	f, err := OpenRetry(ctx, func() (*os.File, error) { return os.CreateTemp(filepath.Dir(path), ".tmp-*") })
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	fail := func(err error) (*os.File, error) {
		_ = f.Close()      // the write already failed; this error adds nothing
		_ = os.Remove(tmp) // best effort: RemoveStale takes what is left
		return nil, err
	}
	if _, err := f.Write(obj); err != nil {
		return fail(err)
	}
	if keep {
		err = startWriteback(f)
	} else {
		err = fdatasync(f)
	}
	if err != nil {
		return fail(err)
	}
	if ifAbsent {
		if err := os.Link(tmp, path); err != nil {
			return fail(err)
		}
		if err := os.Remove(tmp); err != nil {
			return fail(err)
		}
	} else if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if keep {
		return f, nil
	}
	return nil, f.Close()
}

// makeDirs creates dir and its parents up to root as needed, root included
// but not root's parent: a store directory removed under a running mount
// must make writes fail, not be silently recreated. Making the new entries
// durable is Sync's job.
func (b *Backend) makeDirs(dir string) error {
	if _, ok := b.madeDirs.Load(dir); ok {
		return nil
	}
	rel, err := filepath.Rel(b.root, dir)
	if err != nil {
		return err
	}
	d := b.root
	for _, part := range append([]string{"."}, strings.Split(rel, string(filepath.Separator))...) {
		d = filepath.Join(d, part)
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create object directory: %w", err)
		}
	}
	b.madeDirs.Store(dir, struct{}{})
	return nil
}

func (b *Backend) holdSlot() bool {
	select {
	case b.heldSlots <- struct{}{}: // a nil channel (no budget) is never ready
		return true
	default:
		return false
	}
}

func (b *Backend) releaseSlot() { <-b.heldSlots }

// take removes and returns h's held descriptor, if any.
func (b *Backend) take(h backend.Handle) *os.File {
	b.heldMu.Lock()
	defer b.heldMu.Unlock()
	f := b.held[h]
	delete(b.held, h)
	return f
}

// Sync implements backend.Backend: every object through its writing
// descriptor (or a fresh one), syncWorkers at a time, then each directory
// once.
func (b *Backend) Sync(ctx context.Context, hs []backend.Handle) error {
	for _, h := range hs {
		if err := backend.CheckHandle(h); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dirs := map[string]struct{}{}
	var g errgroup.Group
	g.SetLimit(syncWorkers)
	for _, h := range hs {
		// The object's directory always (its new name); each ancestor
		// until a directory whose own entry is known durable.
		ds := b.dirs(h)
		dirs[ds[len(ds)-1]] = struct{}{}
		for i := len(ds) - 1; i > 0; i-- {
			if _, ok := b.linked.Load(ds[i]); ok {
				break
			}
			dirs[ds[i-1]] = struct{}{}
		}
		g.Go(func() error { return b.syncObject(ctx, h) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for d := range dirs {
		if err := b.syncDir(ctx, d); err != nil {
			return err
		}
	}
	for _, h := range hs {
		ds := b.dirs(h)
		for _, d := range ds[1:] {
			b.linked.Store(d, struct{}{}) // its parent was fsynced above, or it was linked already
		}
	}
	return nil
}

// syncObject makes h's object durable (see the package documentation).
func (b *Backend) syncObject(ctx context.Context, h backend.Handle) error {
	mu := &b.syncLocks[h.Name[0]]
	mu.Lock()
	defer mu.Unlock()
	path := b.path(h)
	f := b.take(h)
	var err error
	switch {
	case b.syncHook != nil:
		err = b.syncHook(path)
	case faults.Skip("object"): // test binaries only (cas/internal/faults)
	case f != nil:
		err = fdatasync(f)
	default:
		var g *os.File
		if g, err = OpenRetry(ctx, func() (*os.File, error) { return os.Open(path) }); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				err = backend.ErrNotExist
			}
			return fmt.Errorf("sync %v: %w", h, err) // says nothing of its bytes: not recorded
		}
		err = fdatasync(g)
		_ = g.Close() // read-only descriptor: nothing to report
	}
	if f != nil {
		_ = f.Close() // fdatasync above reported what mattered
		b.releaseSlot()
	}
	if err != nil {
		err = fmt.Errorf("sync %v: %w", h, err)
		b.syncErrs.Store(h, err)
		return err
	}
	if err, ok := b.syncErrs.Load(h); ok {
		return err.(error)
	}
	return nil
}

func (b *Backend) syncDir(ctx context.Context, dir string) error {
	if b.syncHook != nil {
		return b.syncHook(dir)
	}
	if faults.Skip("objdir") { // test binaries only (cas/internal/faults)
		return nil
	}
	return fsutil.SyncDir(ctx, dir)
}

// SyncDir fsyncs directory dir, making its entries (creates, renames,
// removals) durable.
func SyncDir(dir string) error { return fsutil.SyncDir(context.Background(), dir) }

// Forget closes the descriptors held for hs without syncing them: their
// Putter gave up (an abandoned commit). The objects stay; a later Sync
// naming them opens them afresh.
func (b *Backend) Forget(hs []backend.Handle) {
	for _, h := range hs {
		if f := b.take(h); f != nil {
			_ = f.Close() // not synced: nothing to learn from the close
			b.releaseSlot()
		}
	}
}

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	if err := check(ctx, h); err != nil {
		return nil, err
	}
	if _, failed := b.syncErrs.Load(h); failed {
		return nil, fmt.Errorf("get %v: %w (its sync failed)", h, backend.ErrNotExist)
	}
	obj, err := readFileInto(ctx, b.path(h), buf, &b.noDirect)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %v: %w", h, backend.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("get %v: %w", h, err)
	}
	return obj, nil
}

// GetRange implements backend.RangeGetter: one pread of the range. A range
// shorter than DirectRangeMin goes through the page cache (unlike Get: a
// pack read one chunk at a time, in order, gains from the kernel's
// readahead); a longer one, a run of a pack's chunks read at once, uses
// O_DIRECT where the filesystem allows, as Get does.
func (b *Backend) GetRange(ctx context.Context, h backend.Handle, off, n int64, buf []byte) ([]byte, error) {
	if err := check(ctx, h); err != nil {
		return nil, err
	}
	if _, failed := b.syncErrs.Load(h); failed {
		return nil, fmt.Errorf("get %v: %w (its sync failed)", h, backend.ErrNotExist)
	}
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("get %v [%d, +%d): bad range", h, off, n)
	}
	obj, err := readRangeInto(ctx, b.path(h), off, n, buf, n >= DirectRangeMin, &b.noDirect)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %v: %w", h, backend.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("get %v [%d, +%d): %w", h, off, n, err)
	}
	return obj, nil
}

// DirectRangeMin is the shortest range GetRange reads with O_DIRECT.
const DirectRangeMin = 256 << 10

// readRangeInto reads n bytes at off of the file at path into buf, or a new
// buffer if buf is too small, with O_DIRECT if tryDirect and the filesystem
// allows (noDirect as readFileInto's): the range is widened to whole pages and the slice returned
// starts inside buf's backing array, where the range's first byte landed.
//
// A pack's range read through the page cache cost the daemon a copy and the
// page cache's bookkeeping for every byte, on top of the same for the FUSE
// file's pages: a quarter of its CPU in a cold read of ~32 KiB chunks.
func readRangeInto(ctx context.Context, path string, off, n int64, buf []byte, tryDirect bool, noDirect *atomic.Bool) ([]byte, error) {
	f, direct, err := openForRead(ctx, path, tryDirect, noDirect)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if !direct {
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := f.ReadAt(buf, off); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		return buf, nil
	}
	start := off &^ (directAlign - 1)
	end := (off + n + directAlign - 1) &^ (directAlign - 1)
	buf = alignedBuf(buf, int(end-start))[:end-start]
	k, err := f.ReadAt(buf, start)
	if errors.Is(err, io.EOF) && int64(k) >= off+n-start {
		err = nil // the range ends in the file's last page
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf[off-start : off-start+n], nil
}

// Stat implements backend.Backend.
func (b *Backend) Stat(ctx context.Context, h backend.Handle) (backend.Info, error) {
	if err := check(ctx, h); err != nil {
		return backend.Info{}, err
	}
	if _, failed := b.syncErrs.Load(h); failed {
		return backend.Info{}, fmt.Errorf("stat %v: %w (its sync failed)", h, backend.ErrNotExist)
	}
	st, err := os.Stat(b.path(h))
	if errors.Is(err, fs.ErrNotExist) {
		return backend.Info{}, fmt.Errorf("stat %v: %w", h, backend.ErrNotExist)
	}
	if err != nil {
		return backend.Info{}, fmt.Errorf("stat %v: %w", h, err)
	}
	return backend.Info{Handle: h, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Delete implements backend.Backend.
func (b *Backend) Delete(ctx context.Context, h backend.Handle) error {
	if err := check(ctx, h); err != nil {
		return err
	}
	b.Forget([]backend.Handle{h})
	if err := os.Remove(b.path(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %v: %w", h, err)
	}
	b.syncErrs.Delete(h)
	return nil
}

// List implements backend.Backend.
func (b *Backend) List(ctx context.Context, k backend.Kind, fn func(backend.Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if k != backend.Chunk {
		return b.listFlat(ctx, k, fn)
	}
	return b.walkChunks(ctx, func(path string, d fs.DirEntry, name string) error {
		if name == "" {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		return fn(backend.Info{Handle: backend.Handle{Kind: k, Name: name}, Size: info.Size(), ModTime: info.ModTime()})
	})
}

// walkChunks calls fn for every file below the chunk directories (ROOT/ab/cd),
// with the chunk name it holds, or "" for anything else (debris).
func (b *Backend) walkChunks(ctx context.Context, fn func(path string, d fs.DirEntry, name string) error) error {
	tops, err := os.ReadDir(b.root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", b.root, err)
	}
	for _, top := range tops {
		if !top.IsDir() || !isHex2(top.Name()) {
			continue
		}
		err := filepath.WalkDir(filepath.Join(b.root, top.Name()), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				return ctx.Err()
			}
			rel, _ := filepath.Rel(b.root, path)
			name := strings.ReplaceAll(rel, string(filepath.Separator), "")
			h := backend.Handle{Kind: backend.Chunk, Name: name}
			if !h.Valid() || b.path(h) != path {
				name = ""
			}
			return fn(path, d, name)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func isHex2(s string) bool {
	return len(s) == 2 && strings.Trim(s, "0123456789abcdef") == ""
}

func (b *Backend) listFlat(ctx context.Context, k backend.Kind, fn func(backend.Info) error) error {
	dir := filepath.Join(b.root, k.String())
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		h := backend.Handle{Kind: k, Name: e.Name()}
		if !h.Valid() || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := fn(backend.Info{Handle: h, Size: info.Size(), ModTime: info.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

// RemoveStale implements backend.Janitor: temporary files (".tmp-*") last
// modified before before, left by Puts a crash interrupted.
func (b *Backend) RemoveStale(ctx context.Context, before time.Time) (int, error) {
	removed := 0
	rm := func(path string, d fs.DirEntry) error {
		if !strings.HasPrefix(d.Name(), ".tmp-") {
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.ModTime().Before(before) {
			return nil // gone meanwhile, or young: a Put may be writing it
		}
		if err := os.Remove(path); err == nil {
			removed++
		}
		return nil
	}
	err := b.walkChunks(ctx, func(path string, d fs.DirEntry, name string) error {
		if name != "" {
			return nil
		}
		return rm(path, d)
	})
	if err != nil {
		return removed, err
	}
	for _, k := range []backend.Kind{backend.Manifest, backend.Lock, backend.Pack} {
		dir := filepath.Join(b.root, k.String())
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // none there
		}
		for _, e := range ents {
			if err := rm(filepath.Join(dir, e.Name()), e); err != nil {
				return removed, err
			}
		}
	}
	return removed, nil
}

// IsPermanent implements backend.Backend.
func (b *Backend) IsPermanent(err error) bool {
	return errors.Is(err, backend.ErrNotExist) || errors.Is(err, backend.ErrExists) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EROFS)
}

// Close implements backend.Backend: held descriptors are closed (their
// objects stay, unsynced).
func (b *Backend) Close() error {
	b.heldMu.Lock()
	held := b.held
	b.held = map[backend.Handle]*os.File{}
	b.heldMu.Unlock()
	for _, f := range held {
		_ = f.Close() // never synced: nothing to report
		b.releaseSlot()
	}
	return nil
}

// readFileInto reads the file at path into buf, or a new buffer if buf is too
// small for it, with O_DIRECT where the filesystem allows. The returned slice
// starts at a page boundary inside buf's backing array.
//
// noDirect remembers that the filesystem refused O_DIRECT (tmpfs and others
// answer EINVAL), so later reads do not try it again.
func readFileInto(ctx context.Context, path string, buf []byte, noDirect *atomic.Bool) ([]byte, error) {
	f, direct, err := openForRead(ctx, path, true, noDirect)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// One byte more than the size (rounded up to whole pages for O_DIRECT): a
	// file that grew is read whole, and caught by the caller's length checks.
	want := int(st.Size()) + 1
	if direct {
		want = (want + directAlign - 1) &^ (directAlign - 1)
	}
	buf = alignedBuf(buf, want)
	n := 0
	for n < want {
		k, err := f.Read(buf[n:want])
		n += k
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if k == 0 {
			break
		}
		if direct && n%directAlign != 0 {
			break // a short direct read ends at the end of the file
		}
	}
	return buf[:n], nil
}

const directAlign = 4096

// alignedBuf returns a slice of at least n bytes starting at a multiple of
// directAlign, reusing buf's array when it can.
func alignedBuf(buf []byte, n int) []byte {
	buf = buf[:cap(buf)]
	if len(buf) < n+directAlign {
		const step = 256 << 10 // room to spare, so the next object likely fits
		buf = make([]byte, (n+directAlign+step)/step*step+step)
	}
	off := int(uintptr(unsafe.Pointer(&buf[0])) & (directAlign - 1))
	if off != 0 {
		off = directAlign - off
	}
	return buf[off:]
}

// openForRead opens path for reading, with O_DIRECT when tryDirect and the
// filesystem has not refused it before (noDirect); direct says which. A
// refusal (EINVAL on a regular file: tmpfs and others) is remembered in
// noDirect, and the file opened without it.
func openForRead(ctx context.Context, path string, tryDirect bool, noDirect *atomic.Bool) (f *os.File, direct bool, err error) {
	direct = tryDirect && !noDirect.Load()
	if direct {
		f, err = OpenRetry(ctx, func() (*os.File, error) { return os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0) })
		if errors.Is(err, syscall.EINVAL) {
			if st, serr := os.Stat(path); serr == nil && st.Mode().IsRegular() {
				noDirect.Store(true) // a regular file: the filesystem's refusal
			}
			direct = false
		}
	}
	if !direct {
		f, err = OpenRetry(ctx, func() (*os.File, error) { return os.Open(path) })
	}
	return f, direct, err
}
