package cas

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/internal/faults"
	"github.com/ckptfs/ckptfs/cas/internal/fsutil"
	"github.com/ckptfs/ckptfs/cas/object"
)

// DefaultChunkSize is the largest chunk a new store cuts files into.
const DefaultChunkSize = 1 << 20

// DefaultCacheSize is the default budget of the decoded-chunk cache.
const DefaultCacheSize = 256 << 20

// inoBlock is how many inode numbers are reserved in the catalog at a time, so
// creating a file needs no transaction of its own.
const inoBlock = 1024

// Options configure Open.
type Options struct {
	// CacheSize bounds the bytes of decoded chunks kept in memory (default 256 MiB).
	CacheSize int64
	// ChunkSize is the largest chunk of a store being created (default 1 MiB).
	// An existing store keeps the chunk size it was created with.
	ChunkSize int
	// ReadOnly opens the catalog without the exclusive lock and without touching
	// the spool; writes fail.
	ReadOnly bool
	// KeepSpool leaves the spool as it is (for fsck, which reports leftovers).
	KeepSpool bool
	// HashWorkers bounds how many chunks Put hashes at once (default: one
	// fewer than the CPUs, at least one). Hashing is CPU-bound; running more
	// hashers than cores only delays the FUSE requests that bring the data,
	// and on two cores a write is bounded by that path (one 1 MiB request at
	// a time per writer), not by hashing at ~2.7 GB/s per core.
	HashWorkers int
	// InlineEncoders is how many new chunks may be encoded at once on the
	// commit path (default max(1, NumCPU/2)). A new chunk that finds every
	// slot taken is stored raw and queued for ReencodeOne; negative means
	// never encode inline (tests). See reencode.go.
	InlineEncoders int
	// MaxReencodeBacklog bounds the raw bytes waiting in the re-encode
	// queue (default DefaultMaxReencodeBacklog): past it, a new chunk
	// waits for an inline encoder instead of being stored raw, so a store
	// that is never idle still converges to its encoded size.
	MaxReencodeBacklog int64
	// DeltaKeyframe bounds delta chains (deltaplan.go): a chunk is stored as
	// a delta against a base at most DeltaKeyframe-1 versions before it, and
	// the next version starts a new chain with a standalone chunk. 0 means
	// DefaultDeltaKeyframe; 1 or less (negative) means no deltas are
	// planned (deltas already stored still read).
	DeltaKeyframe int
	// DeltaLatestWhole keeps the newest version of a chunk whole: its delta
	// plan waits until a later version of it is committed (deltaplan.go),
	// so that the latest save reads as fast as one stored without deltas,
	// at the cost of one whole version a chain until the next save. Plans
	// that wait are released by later versions whatever the options say
	// then.
	DeltaLatestWhole bool
	// Objects is where chunk objects live, and must be set: the store's own
	// objects/ directory is local.New(ObjectsDir(dir), ...) (package
	// cas/backend/local), tests may give a mem backend. A backend.Tier
	// (cas/backend/tiered: a remote behind the local objects) is the remote
	// tier's read side: chunks missing locally are fetched from it. The
	// Store closes it; when Open fails it is the caller's to close.
	Objects backend.Backend
	// PackMaxChunk is the largest raw chunk a commit stores in a pack with
	// its neighbours rather than in an object of its own (pack.go; default
	// DefaultPackMaxChunk). Negative: no packs (every chunk its own object,
	// as before packs; existing packs are still read).
	PackMaxChunk int
	// InlineMaxChunk is how many raw bytes of new chunks a commit (a
	// batch) stores inline in the catalog rather than in packs or object
	// files (inline.go; default DefaultInlineMaxChunk). Negative: nothing
	// inline (existing inline chunks are still read).
	InlineMaxChunk int
	// Observer, if set, is told how long each chunk fetch (an object read
	// and decoded on a cache miss) and each background re-encode took, for
	// metrics.
	Observer Observer
}

// Observer receives the timings of the store's slow operations. Its methods
// are called outside the store's locks and must not block (a Prometheus
// counter or histogram update).
type Observer interface {
	// Fetch is one chunk loaded from its object: decoded bytes, error.
	Fetch(d time.Duration, rawBytes int, err error)
	// Reencode is one queued chunk's re-encode attempt.
	Reencode(d time.Duration, err error)
}

// Store is an open chunk store. Its methods are safe for concurrent use.
type Store struct {
	dir       string
	db        *catalog.DB
	catalogID fileID // the catalog file opened (checkInPlace)
	coder     *object.Coder
	cache     *cache
	chunkSize int
	format    uint32 // the catalog's format version at Open (cas/catalog)
	readOnly  bool

	inoMu    sync.Mutex
	nextIno  uint64 // next number to hand out
	inoLimit uint64 // first number not reserved in the catalog

	objects backend.Backend // where chunk objects live (Options.Objects)

	flightMu sync.Mutex
	flights  map[ID]*flight // objects being written right now

	packs   *packs // packs of live batches (pack.go)
	packMax int    // Options.PackMaxChunk: 0 for no packs
	// inlineMax is Options.InlineMaxChunk: 0 for nothing inline.
	inlineMax int

	re *reencoder // re-encoding (reencode.go)
	// deltaKeyframe is Options.DeltaKeyframe, deltaWait
	// Options.DeltaLatestWhole.
	deltaKeyframe int
	deltaWait     bool
	rd            *reader // the read path (read.go)

	// Coordination with garbage collection (see sweep.go): chunks named by
	// batches not committed yet are pinned; chunks being swept are deleting.
	gc *collector

	storeReadBytes atomic.Int64
	obs            Observer // Options.Observer, or nil

	hashSlots chan struct{} // see Options.HashWorkers

	group grouper // commits sharing a transaction (group.go)
}

// collector holds the three sets and the steps on them; Store reaches it as
// s.gc.
type collector struct {
	s         *Store
	mu        sync.Mutex // guards pins, watch, deleting
	pins      map[ID]int
	watch     map[ID]struct{}      // while a collection runs: chunks of batches released since it began
	deleting  map[ID]chan struct{} // closed when the step deleting the chunk ends
	collectMu sync.Mutex           // one collection at a time
}

// Open opens the store in dir, creating it (and dir) when dir holds no store.
// It fails with ErrLocked when another process has the store open, with
// ErrNewerFormat when a newer ckptfs wrote it, and with ErrNotStore when dir is a
// non-empty directory that holds no catalog.
func Open(dir string, opts Options) (*Store, error) {
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if opts.MaxReencodeBacklog <= 0 {
		opts.MaxReencodeBacklog = DefaultMaxReencodeBacklog
	}
	if opts.DeltaKeyframe == 0 {
		opts.DeltaKeyframe = DefaultDeltaKeyframe
	}
	if opts.HashWorkers <= 0 {
		opts.HashWorkers = max(1, runtime.NumCPU()-1)
	}
	if opts.ChunkSize > maxChunkSize {
		return nil, fmt.Errorf("chunk size %d is over the %d limit", opts.ChunkSize, maxChunkSize)
	}
	if opts.Objects == nil {
		return nil, fmt.Errorf("open store %s: Options.Objects is not set (the store's own directory is local.New(cas.ObjectsDir(dir), ...))", dir)
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	catPath := filepath.Join(dir, catalogName)
	_, statErr := os.Stat(catPath)
	exists := statErr == nil
	if opts.ReadOnly && !exists {
		return nil, fmt.Errorf("open store %s: %w (no %s)", dir, ErrNotStore, catalogName)
	}
	if !opts.ReadOnly {
		if !exists {
			if err := checkEmptyOrMissing(dir); err != nil {
				return nil, err
			}
			// Private: the catalog names every file and tensor.
			if err := mkdirAllDurable(dir, 0o700); err != nil {
				return nil, fmt.Errorf("create store %s: %w", dir, err)
			}
		}
		if err := probeWritable(dir); err != nil {
			return nil, err
		}
		if !exists {
			if err := createCatalog(dir, opts.ChunkSize); err != nil {
				return nil, err
			}
		}
	}
	if exists {
		// A log left by a daemon that did not stop: the file is whole only
		// once it is applied (catalog/wal.go), readers included.
		if err := catalog.Recover(catPath); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
		if err := catalog.Check(catPath); err != nil {
			if catalog.Locked(catPath, opts.ReadOnly) {
				// Being written by the process that holds it: not damage.
				return nil, fmt.Errorf("open store %s: %w", dir, ErrLocked)
			}
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
	}
	db, err := catalog.Open(catPath, catalog.Options{
		ReadOnly:  opts.ReadOnly,
		NoSync:    faults.Skip("catalog"), // test binaries only (internal/faults)
		ChunkSize: opts.ChunkSize,
	})
	if errors.Is(err, catalog.ErrLocked) {
		return nil, fmt.Errorf("open store %s: %w", dir, ErrLocked)
	}
	if err != nil {
		return nil, err
	}
	objects := opts.Objects
	s := &Store{dir: dir, db: db, readOnly: opts.ReadOnly, flights: map[ID]*flight{}, objects: objects,
		hashSlots: make(chan struct{}, opts.HashWorkers),
		obs:       opts.Observer, deltaKeyframe: opts.DeltaKeyframe, deltaWait: opts.DeltaLatestWhole}
	if t, ok := objects.(backend.Tier); ok {
		t.OnEvict(discardFetched(s))
	}
	s.format, s.chunkSize = db.Format(), db.ChunkSize()
	s.catalogID, _ = statID(catPath)
	s.re = newReencoder(s, opts.InlineEncoders, opts.MaxReencodeBacklog)
	s.rd = &reader{s: s}
	s.packs = newPacks(s)
	switch {
	case opts.PackMaxChunk == 0:
		s.packMax = DefaultPackMaxChunk
	case opts.PackMaxChunk > 0:
		s.packMax = min(opts.PackMaxChunk, DefaultPackMaxChunk*4)
	}
	switch {
	case opts.InlineMaxChunk == 0:
		s.inlineMax = DefaultInlineMaxChunk
	case opts.InlineMaxChunk > 0:
		// Bounded: an inline object is one bbolt value, written by every
		// transaction that indexes it and mapped with the catalog.
		s.inlineMax = min(opts.InlineMaxChunk, 4*DefaultInlineMaxChunk)
	}
	s.gc = &collector{s: s, pins: map[ID]int{}, deleting: map[ID]chan struct{}{}}
	if s.coder, err = object.NewCoder(); err != nil {
		db.Close()
		return nil, err
	}
	s.cache = newCache(opts.CacheSize, s.chunkSize)
	if !opts.ReadOnly && !opts.KeepSpool {
		if err := s.resetSpool(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// checkEmptyOrMissing refuses a directory that holds anything but what an
// interrupted creation of a store leaves (creationLeftover), which it removes.
func checkEmptyOrMissing(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store %s: %w", dir, err)
	}
	for _, e := range ents {
		if !creationLeftover(e) {
			return fmt.Errorf("store %s: %w: the directory is not empty and has no %s", dir, ErrNotStore, catalogName)
		}
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("store %s: remove what an interrupted creation left: %w", dir, err)
		}
	}
	return nil
}

// probeWritable creates and removes a file in dir. Permission bits do not stop
// root, so asking access(2) would not tell; a read-only filesystem would.
func probeWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("store directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("store directory %s is not writable: %w", dir, err)
	}
	return nil
}

func (s *Store) resetSpool() error {
	spool := s.SpoolDir()
	if err := os.RemoveAll(spool); err != nil {
		return fmt.Errorf("empty spool %s: %w", spool, err)
	}
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return fmt.Errorf("create spool %s: %w", spool, err)
	}
	// objects/ may be new, or made by an earlier mount that did not sync it.
	if err := os.MkdirAll(filepath.Join(s.dir, objectsName), 0o700); err != nil {
		return fmt.Errorf("create objects directory: %w", err)
	}
	return syncStoreDir(s.dir)
}

// Close releases the store. Reads and writes in flight must have finished.
func (s *Store) Close() error {
	if s.coder != nil {
		s.coder.Close()
	}
	return errors.Join(s.objects.Close(), s.db.Close())
}

// Format is the store's catalog format version, as the catalog says now.
func (s *Store) Format() int {
	f := 0
	_ = s.View(func(tx *Tx) error {
		f = tx.Format()
		return nil
	})
	return f
}

// ObjectsDir is the directory in store directory dir where a store keeps
// its chunk objects when they live with it (the root to give
// cas/backend/local's New), made absolute as Open makes dir.
func ObjectsDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return filepath.Join(dir, objectsName)
}

// ReadOnly reports whether the store was opened read-only (writes fail).
func (s *Store) ReadOnly() bool { return s.readOnly }

// Dir returns the store directory.
func (s *Store) Dir() string { return s.dir }

// SpoolDir is where the caller stages files being written. It is emptied by Open.
func (s *Store) SpoolDir() string { return filepath.Join(s.dir, spoolName) }

// NewSpool creates a file in SpoolDir for staging a file being written, named
// after pattern as os.CreateTemp names it, and unlinks it at once: it is
// private to the caller, and a crash leaves nothing. When the process is out
// of file descriptors it waits for one (fsutil.OpenRetry) rather than fail a
// write.
func (s *Store) NewSpool(ctx context.Context, pattern string) (*os.File, error) {
	sp, err := fsutil.OpenRetry(ctx, func() (*os.File, error) { return os.CreateTemp(s.SpoolDir(), pattern) })
	if err != nil {
		return nil, fmt.Errorf("create spool file: %w", err)
	}
	if err := os.Remove(sp.Name()); err != nil {
		sp.Close()
		return nil, fmt.Errorf("create spool file: %w", err)
	}
	return sp, nil
}

// ChunkSize is the largest chunk this store cuts files into.
func (s *Store) ChunkSize() int { return s.chunkSize }

// View runs fn in a read-only catalog transaction (catalog.DB.View: a
// panic inside bbolt is returned as an error wrapping ErrCatalogDamaged).
func (s *Store) View(fn func(*Tx) error) error { return s.db.View(fn) }

// Update runs fn in a read-write catalog transaction, committed (and durable)
// when fn returns nil and rolled back otherwise. Do no slow I/O inside fn.
// A panic inside bbolt is returned as View's is.
func (s *Store) Update(fn func(*Tx) error) error { return s.db.Update(fn) }

// AllocIno returns an inode number never handed out before in this store.
func (s *Store) AllocIno() (uint64, error) {
	s.inoMu.Lock()
	defer s.inoMu.Unlock()
	if s.nextIno == s.inoLimit {
		next, err := s.db.ReserveInos(inoBlock)
		if err != nil {
			return 0, fmt.Errorf("reserve inode numbers: %w", err)
		}
		s.nextIno, s.inoLimit = next, next+inoBlock
	}
	ino := s.nextIno
	s.nextIno++
	return ino, nil
}

// Stats are the store's statistics.
type Stats struct {
	Counts
	RemoteStats
	StoreReadBytes int64 `json:"store_read_bytes"`
	ChunkSize      int   `json:"chunk_size"`
	FormatVersion  int   `json:"format_version"`
	CacheBytes     int64 `json:"cache_bytes"`
}

// RemoteStats are the remote tier's counters (backend.TierStats), in a
// store whose objects are a backend.Tier.
type RemoteStats struct {
	PendingBytes  int64 `json:"remote_pending_bytes"`  // raw bytes of committed chunks not in the bucket yet (as of the last round)
	UploadedBytes int64 `json:"remote_uploaded_bytes"` // object bytes this process uploaded
	ReadBytes     int64 `json:"remote_read_bytes"`     // object bytes this process fetched
}

// Stats returns the catalog counters and this process's read counters.
func (s *Store) Stats() (Stats, error) {
	st := Stats{
		StoreReadBytes: s.storeReadBytes.Load(),
		ChunkSize:      s.chunkSize,
		CacheBytes:     s.cache.bytes(),
	}
	if t, ok := s.objects.(backend.Tier); ok {
		st.RemoteStats = RemoteStats(t.TierStats())
	}
	err := s.View(func(tx *Tx) error {
		st.Counts = tx.Counts()
		st.FormatVersion = tx.Format()
		return nil
	})
	return st, err
}

// chunkHandle names chunk id's object in the backend.
func chunkHandle(id ID) backend.Handle {
	return backend.Handle{Kind: backend.Chunk, Name: id.String()}
}

// handleID is chunkHandle's inverse.
func handleID(h backend.Handle) (ID, bool) {
	if h.Kind != backend.Chunk {
		return ID{}, false
	}
	id, err := ParseID(h.Name)
	return id, err == nil
}

// IOConcurrency is how many object reads or writes are worth issuing at once.
func (s *Store) IOConcurrency() int { return s.objects.Properties().Connections }

// ObjectsLocation names where the store's chunk objects live, for messages.
func (s *Store) ObjectsLocation() string { return s.objects.Location() }

// StandaloneObject returns obj, chunk id's object, when it is standalone,
// and otherwise (a delta) the chunk's standalone encoding. A damaged obj is
// returned as it is: its reader's checks fail on it.
func (s *Store) StandaloneObject(ctx context.Context, id ID, obj []byte) ([]byte, error) {
	h, err := object.ParseHeader(obj)
	if err != nil || !h.Delta {
		return obj, nil
	}
	raw, err := s.ReadChunk(ctx, ChunkRef{ID: id, Len: h.RawLen})
	if err != nil {
		return nil, err
	}
	enc, _ := s.coder.Encode(raw, Hint{ElemSize: h.Elem})
	return enc, nil
}

// DeltaHeaderLen is how many bytes at the start of an object DeltaBase
// needs to name a delta's base.
const DeltaHeaderLen = object.HeaderSize + object.DeltaExtSize

// DeltaBase reports whether obj (an object, or its first DeltaHeaderLen
// bytes) is a delta, and the chunk it names as its base. A header that does
// not parse is no delta: its reader's checks fail on it.
func DeltaBase(obj []byte) (base ID, delta bool) {
	h, err := object.ParseHeader(obj)
	if err != nil || !h.Delta {
		return ID{}, false
	}
	return h.Base, true
}

// discardFetched deletes the copies a backend.Tier evicted from its local
// cache, through discardUnnamed as a released batch's chunks: a copy that a
// batch in flight found and pinned (it is about to commit it) or that a
// sweep is deleting is left alone, and so is one the index names. Best
// effort: a copy left over is only space.
func discardFetched(s *Store) func(ctx context.Context, hs []backend.Handle) {
	return func(ctx context.Context, hs []backend.Handle) {
		ids := make([]ID, 0, len(hs))
		for _, h := range hs {
			if id, ok := handleID(h); ok {
				ids = append(ids, id)
			}
		}
		_, _ = s.gc.discardUnnamed(ctx, ids)
	}
}

// fileID is a file's identity: device and inode.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// ErrStoreGone means the store's directory was removed or replaced while it
// was open: nothing committed now would survive the close of the catalog.
var ErrStoreGone = errors.New("the store was removed or replaced while open")

// checkInPlace reports ErrStoreGone when the catalog file at the store's
// path is no longer the one opened. A commit checks it before its
// transaction: chunks inline in the catalog need no file of their own, so
// nothing else would fail when the directory was removed (rm -rf of the
// store under a mount), and the close would return 0 for a file kept only
// in an unlinked catalog.
func (s *Store) checkInPlace() error {
	if s.catalogID == (fileID{}) {
		return nil
	}
	path := filepath.Join(s.dir, catalogName)
	id, err := statID(path)
	if err != nil || id != s.catalogID {
		return fmt.Errorf("store %s: %w (catalog %s: %v)", s.dir, ErrStoreGone, path, err)
	}
	return nil
}
