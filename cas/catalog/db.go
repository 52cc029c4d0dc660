package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// lockTimeout is how long Open waits for another process's lock on the catalog.
const lockTimeout = 200 * time.Millisecond

// DB is an open catalog: one bbolt file. Its methods are safe for
// concurrent use; at most one Update runs at a time (bbolt's writer lock).
type DB struct {
	db        *bolt.DB
	format    uint32 // the format at Open, after any migration
	chunkSize int
	tail      tail // the file's written tail (prealloc.go); writable Open only

	// The write-ahead log (wal.go); nil: read-only, or a catalog that
	// commits with bbolt's fdatasyncs.
	wal *wal
	wmu sync.Mutex // write transactions and their appends, one at a time
	pin *bolt.Tx   // the read transaction at the last checkpoint (wmu)
	// checkpointBytes is walCheckpointBytes (tests: smaller); onCheckpoint,
	// if set, runs after each checkpoint (tests).
	checkpointBytes int64
	onCheckpoint    func()
	mapped          int64 // bbolt's fixed mapping of a catalog with a log
}

// Options are how Open opens a catalog.
type Options struct {
	// ReadOnly opens the catalog for reading only (bbolt's shared flock):
	// no bucket is created and a format-1 catalog is read as it is.
	ReadOnly bool
	// NoSync skips the fdatasync of each commit (the power-loss tests'
	// faults only).
	NoSync bool
	// ChunkSize is the chunk size recorded when a writable Open finds a
	// bbolt file with no config yet (as Create records it).
	ChunkSize int
}

// Open opens the catalog file at path, which must exist, checks its format
// (ErrNewerFormat, ErrNotStore), migrates a writable format-1 catalog to
// format 2, and creates the buckets a catalog made by an older ckptfs lacks.
// It fails with ErrLocked when another process holds the catalog's lock,
// and with ErrCatalogDamaged when bbolt panics on the file (Check the file
// first: some damage makes bbolt panic where it cannot be recovered).
func Open(path string, opts Options) (*DB, error) {
	if err := Recover(path); err != nil {
		return nil, err
	}
	var db *bolt.DB
	var err error
	mapped := 0 // bbolt's initial mapping: its default
	if opts.ReadOnly {
		db, err = openBolt(path, true, 0)
	} else {
		// A log's pin needs a mapping that never grows (wal.go).
		var size int64
		if st, serr := os.Stat(path); serr == nil {
			size = st.Size()
		}
		mapped = walMap(size)
		db, err = openBolt(path, false, mapped)
		if errors.Is(err, syscall.ENOMEM) && mapped > 0 { // refused all the same: no log
			mapped = 0
			db, err = openBolt(path, false, 0)
		}
	}
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, ErrLocked
	}
	if err != nil {
		return nil, fmt.Errorf("open catalog %s: %w", path, err)
	}
	d := &DB{db: db}
	if err := d.init(filepath.Dir(path), opts.ReadOnly, opts.ChunkSize); err != nil {
		db.Close()
		return nil, err
	}
	if !opts.ReadOnly {
		if err := d.createNewBuckets(); err != nil {
			db.Close()
			return nil, err
		}
	}
	if !opts.ReadOnly && !opts.NoSync {
		d.tail = openTail(path)
	}
	if !opts.ReadOnly && mapped > 0 {
		d.checkpointBytes, d.mapped = walCheckpointBytes, int64(mapped)
		dir, err := os.Open(filepath.Dir(path))
		if err == nil {
			d.wal = &wal{dir: dir, noSync: opts.NoSync}
			d.wmu.Lock()
			err = d.checkpoint()
			d.wmu.Unlock()
		}
		if err != nil {
			if d.wal != nil {
				d.closeLog() // failed: closes what it opened, keeps the log
			}
			d.tail.close()
			db.Close()
			return nil, fmt.Errorf("open catalog %s: %w", path, err)
		}
	}
	db.NoSync = opts.NoSync || d.wal != nil
	return d, nil
}

// Create builds a new, initialised catalog (format 2, chunk size chunkSize,
// the root directory owned by the calling user) in the file at path, which
// the caller then renames into place: bbolt fdatasyncs the file before
// Create returns. It fails with ErrLocked when another process holds a lock
// on path.
func Create(path string, chunkSize int) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, NoFreelistSync: true})
	if errors.Is(err, bolt.ErrTimeout) {
		return ErrLocked
	}
	if err != nil {
		return err
	}
	d := &DB{db: db}
	err = d.init(filepath.Dir(path), false, chunkSize)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// openBolt opens the catalog, turning a panic of bbolt's (on damage that
// Check let through) into an error.
// mmap is bbolt's initial mapping (0: its default).
//
// The free list stays bbolt's default, the sorted array, though every
// commit that releases pages merges them into a new copy of it (the log's
// checkpoint pin makes every commit release some: 8 writers of 3·10⁴ small
// files allocated 626 MB in Pgids.Merge, a fifth of all the daemon
// allocated). The hash map, tried against it (back to back, 8 writers of
// 10⁵ and 5·10⁴ files), allocated less but cost more: 3,091, 2,869 and
// 3,404 files/s against 3,310 and 3,784, 275–295 µs of daemon CPU a file
// against 232–260, because it hands out pages in no order and bbolt writes
// each page with a pwrite of its own (pwrite 21 % of the daemon's CPU
// against 9 %); the array gives the lowest free pages, in runs.
func openBolt(path string, readOnly bool, mmap int) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: %s: %v", ErrCatalogDamaged, path, r)
		}
	}()
	return bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         lockTimeout,
		ReadOnly:        readOnly,
		NoFreelistSync:  true,
		InitialMmapSize: mmap,
	})
}

// Locked reports whether another process holds the catalog's lock at path
// (bbolt's flock: exclusive for a writer, shared for a reader).
func Locked(path string, readOnly bool) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	how := syscall.LOCK_EX
	if readOnly {
		how = syscall.LOCK_SH
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN) // closing the file unlocks it too
	return false
}

// init creates the buckets, config and root of a writable catalog that has
// no config yet, or checks an existing one's version; a writable format-1
// catalog is migrated. dir names the store in errors.
func (d *DB) init(dir string, readOnly bool, chunkSize int) error {
	check := func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("catalog %s: %w: no meta bucket", dir, ErrNotStore)
		}
		v := meta.Get(keyFormat)
		if len(v) != 4 {
			return fmt.Errorf("catalog %s: %w: no format version", dir, ErrNotStore)
		}
		f := binary.BigEndian.Uint32(v)
		if f > FormatVersion {
			return fmt.Errorf("store %s has format %d, this ckptfs reads up to %d: %w", dir, f, FormatVersion, ErrNewerFormat)
		}
		if v := meta.Get(keyFormatAtRest); len(v) == 4 { // in use, or not closed (wal.go)
			f = binary.BigEndian.Uint32(v)
		}
		d.format = f
		cs := meta.Get(keyChunkSize)
		if len(cs) != 4 {
			return fmt.Errorf("catalog %s: %w: no chunk size", dir, ErrNotStore)
		}
		d.chunkSize = int(binary.BigEndian.Uint32(cs))
		return nil
	}
	if readOnly {
		return d.db.View(check)
	}
	return d.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil {
			if err := create(tx, chunkSize); err != nil {
				return err
			}
		}
		if err := check(tx); err != nil {
			return err
		}
		if d.format < formatSealed {
			if err := d.migrate(tx); err != nil {
				return err
			}
		}
		// Before the first log: see "Format while open" in wal.go.
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyFormatAtRest, binary.BigEndian.AppendUint32(nil, d.format)); err != nil {
			return err
		}
		return meta.Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatWAL))
	})
}

// create makes every bucket, the config and the root directory of a new
// catalog.
func create(tx *bolt.Tx, chunkSize int) error {
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatSealed)); err != nil {
		return err
	}
	if err := meta.Put(keyChunkSize, binary.BigEndian.AppendUint32(nil, uint32(chunkSize))); err != nil {
		return err
	}
	if err := meta.Put(keyNextIno, u64key(FirstIno)); err != nil {
		return err
	}
	now := time.Now().UnixNano()
	t := &Tx{raw{tx: tx}}
	// The root belongs to whoever creates the store, so an
	// ordinary user's store is writable by its owner once mounted.
	root := Node{Ino: RootIno, Mode: syscall.S_IFDIR | 0o755, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Atime: now, Mtime: now, Ctime: now}
	return t.PutNode(root)
}

// migrate brings a format-1 catalog to format 2: it seals every record
// (record.go). One transaction: a crash leaves format 1, migrated again at
// the next Open.
func (d *DB) migrate(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketNodes, bucketDirents, bucketManifests, bucketChunks, bucketReencode} {
		b := tx.Bucket(name)
		if b == nil {
			continue
		}
		var keys, vals [][]byte
		if err := b.ForEach(func(k, v []byte) error {
			if len(v) >= 5 && v[0] == recordVersion {
				return fmt.Errorf("%w: bucket %s of a format-1 catalog holds a sealed record %x", ErrCatalogDamaged, name, k)
			}
			keys = append(keys, bytes.Clone(k))
			vals = append(vals, sealRecord(k, v))
			return nil
		}); err != nil {
			return err
		}
		for i, k := range keys {
			if err := b.Put(k, vals[i]); err != nil {
				return err
			}
		}
	}
	if err := tx.Bucket(bucketMeta).Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatSealed)); err != nil {
		return err
	}
	d.format = formatSealed
	return nil
}

// createNewBuckets creates the re-encode queue, the delta buckets, the
// packs bucket, the inline bucket, the linked bucket and the dirorder index (built from the
// directory entries: dirorder.go) in a catalog made before they existed
// (an older ckptfs ignores them; the packs bucket holds rows only from
// format 6 on, the inline bucket from format 7 on).
func (d *DB) createNewBuckets() error {
	var ok bool
	if err := d.db.View(func(tx *bolt.Tx) error {
		ok = tx.Bucket(bucketReencode) != nil && tx.Bucket(bucketDeltaPlans) != nil && tx.Bucket(bucketHoles) != nil &&
			tx.Bucket(bucketPacks) != nil && tx.Bucket(bucketInline) != nil && tx.Bucket(bucketDirOrder) != nil &&
			tx.Bucket(bucketDeltaWait) != nil && tx.Bucket(bucketLinked) != nil
		return nil
	}); err != nil {
		return err
	}
	if ok {
		return nil
	}
	return d.db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketReencode); err != nil {
			return fmt.Errorf("create re-encode queue: %w", err)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketHoles); err != nil {
			return fmt.Errorf("create holes bucket: %w", err)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketPacks); err != nil {
			return fmt.Errorf("create packs bucket: %w", err)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketInline); err != nil {
			return fmt.Errorf("create inline bucket: %w", err)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketLinked); err != nil {
			return fmt.Errorf("create linked bucket: %w", err)
		}
		if tx.Bucket(bucketDirOrder) == nil {
			if err := buildDirOrder(tx); err != nil {
				return err
			}
		}
		return createDeltaBuckets(tx)
	})
}

// Close closes the catalog. Transactions must have ended.
func (d *DB) Close() error {
	var err error
	if d.wal != nil {
		d.wmu.Lock()
		err = d.closeLog()
		d.wmu.Unlock()
	}
	return errors.Join(err, d.db.Close(), d.tail.close())
}

// Format is the catalog's format at Open (after any migration); Tx.Format
// says what it is now (a first delta moves it to 3).
func (d *DB) Format() uint32 { return d.format }

// ChunkSize is the chunk size the catalog was created with.
func (d *DB) ChunkSize() int { return d.chunkSize }

// View runs fn in a read-only transaction.
//
// A panic inside bbolt (a damaged page that Check could not see) is
// returned as an error wrapping ErrCatalogDamaged; the transaction is
// rolled back first.
func (d *DB) View(fn func(*Tx) error) (err error) {
	defer recoverDamage(&err)
	return d.db.View(func(tx *bolt.Tx) error { return fn(d.tx(tx)) })
}

// Update runs fn in a read-write transaction, committed (and durable) when
// fn returns nil and rolled back otherwise. Do no slow I/O inside fn. A
// panic inside bbolt is returned as View's is.
func (d *DB) Update(fn func(*Tx) error) (err error) {
	return d.update(fn, nil)
}

// UpdateAround is Update for a caller that holds a lock its fn needs but
// the commit does not: once fn has written the transaction's changes,
// around is called, and the function it returns is called when the commit
// (bbolt's writes and fdatasyncs) has ended, whether or not it succeeded.
// The caller may release its lock in between, so that others wait only for
// fn, not for the disk. Writers still run one at a time (bbolt's lock, held
// until the commit ends); readers see the transaction only once it has
// committed, as with Update.
func (d *DB) UpdateAround(fn func(*Tx) error, around func() (after func())) (err error) {
	return d.update(fn, around)
}

func (d *DB) tx(tx *bolt.Tx) *Tx {
	return &Tx{raw{tx: tx, legacy: d.format < formatSealed}}
}

// recoverDamage turns a panic of bbolt's into an error.
func recoverDamage(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrCatalogDamaged, r)
	}
}

// ReserveInos reserves the next n inode numbers, never handed out before in
// this catalog, and returns the first.
func (d *DB) ReserveInos(n uint64) (first uint64, err error) {
	err = d.Update(func(tx *Tx) error {
		meta := tx.b(bucketMeta)
		first = FirstIno
		if v := meta.Get(keyNextIno); len(v) == 8 {
			first = binary.BigEndian.Uint64(v)
		}
		return meta.Put(keyNextIno, u64key(first+n))
	})
	return first, err
}
