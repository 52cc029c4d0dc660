package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Write-ahead log (issue #27). A writable catalog does not make each
// transaction durable with bbolt's own two fdatasyncs of scattered pages
// (a group of seven small files' commit wrote ~30 separate page runs);
// instead each committed transaction's row changes are appended to
// catalog.wal beside the catalog and that one contiguous append is
// fdatasync'd. bbolt commits with NoSync: its pages reach the disk at the
// next checkpoint, in runs.
//
// # Checkpoints
//
// A checkpoint fdatasyncs the bbolt file (every committed page durable),
// copies its two meta pages into the header of a new, empty log
// (written, fdatasync'd, renamed over catalog.wal, directory fsync'd), and
// holds a read transaction at that state (the pin) until the next one.
// The pin is what makes the copy a recovery point: bbolt never reuses a
// page an open reader can reach, so the pages of the checkpoint's tree stay
// on the disk as they were synced while later transactions, not synced,
// write elsewhere (the file grows by the pages written between two
// checkpoints; they are free again after the next). A checkpoint is taken
// at Open, whenever the log passes walCheckpointBytes, and at Close, which
// removes the log: a cleanly closed catalog has none and is an ordinary
// bbolt file.
//
// # Recovery
//
// Recover, before anything reads the file (Check included), finds a log
// left by a process that did not close: it writes the header's meta pages
// back over the file's (bbolt's newest meta may name pages that never
// reached the disk), opens the catalog, which is then the checkpoint's
// intact tree, applies the log's records in order up to the first that is
// incomplete or fails its CRC (a torn last append: never acknowledged,
// since a commit returns only after its append is durable), commits that
// in one synced transaction, and removes the log. A crash during recovery
// repeats it: the replay allocates only pages the checkpoint's tree does
// not use. Readers (fsck, stats on an unmounted store) recover first too,
// as ext4 replays its journal on a read-only mount; a store in use by
// another process is left to it.
//
// # Records
//
// The log records bucket-level changes (put, delete, create and delete
// bucket), so replay needs none of the typed code that made them: every
// write of a transaction goes through raw.b's bucket or raw's bucket
// methods, which record it (wal_test.go checks that a replayed copy equals
// the live catalog after every kind of row). A record is [u32 length][u32
// CRC-32C][u64 sequence][changes]; the sequence counts from 1 after the
// header, so bytes of another log can never be taken for a record.
//
// # Format while open
//
// An older ckptfs must not open a catalog that needs its log (it would
// serve, and then write on, a tree whose newest pages may be missing). So a
// writable Open puts the catalog at formatWAL, which older versions refuse,
// and keeps the store's own format at keyFormatAtRest (Tx.Format reads it;
// a store that moves to a new format moves that); a clean close puts it
// back in keyFormat, in a transaction of its own synced by bbolt, before
// it removes the log. Only a catalog left by a crash (until its next open)
// is refused by an older ckptfs.
//
// # Order and errors
//
// Write transactions run one at a time under DB.wmu, which also covers the
// append, so records are in commit order; the fdatasync of the append runs
// after wmu is released and is shared by the commits waiting for it, so the
// next transaction is built while the disk works. A commit returns after
// its record, and every record before it, is durable. A failed append or
// fdatasync leaves bbolt holding a transaction the log may not: the
// catalog then refuses every later write (ErrWALFailed) until it is opened
// again, which recovers what the log holds. A catalog too large for the
// pin's fixed mapping (a quarter of it: walMaxMap, less in a process
// limited in address space) commits with bbolt's own fdatasyncs, as
// before, and keeps no log.

const (
	walName = "catalog.wal"
	// walCheckpointBytes is the log size that triggers a checkpoint: it
	// bounds the replay after a crash and the file's growth between two
	// checkpoints (bbolt's pages written meanwhile).
	walCheckpointBytes = 4 << 20
	// walMaxMap is bbolt's initial mapping of a writable catalog with a
	// log: virtual address space only. A read transaction held open (the
	// pin) would deadlock a commit that has to remap; a catalog past a
	// quarter of its mapping keeps no log (see above).
	walMaxMap = min(1<<40, math.MaxInt>>1)
	walMagic  = "ckptfs-catalog-wal-1\n"
	// walDataName is the records file: written through walDataBytes once,
	// and written over from its start by each generation (see "Records").
	walDataName  = "catalog.wal.data"
	walDataBytes = walCheckpointBytes + 4<<20
)

// walMap returns bbolt's mapping for a writable catalog of size bytes with
// a log: walMaxMap, or in a process limited in address space (ulimit -v) a
// quarter of its limit, the rest left to the Go runtime; 0 (bbolt's own
// mapping, and no log) when that is not four times the catalog.
func walMap(size int64) int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_AS, &lim); err != nil {
		return walMaxMap
	}
	return walMapFor(lim.Cur, size)
}

// walMapFor is walMap for an address space limit.
func walMapFor(limit uint64, size int64) int {
	if limit == unix.RLIM_INFINITY {
		return walMaxMap
	}
	m := int64(min(limit/4, uint64(walMaxMap)))
	if m < 4*size || m < 64<<20 {
		return 0
	}
	return int(m)
}

// ErrWALFailed means the catalog's write-ahead log could not be written or
// synced; writes are refused until the catalog is opened again.
var ErrWALFailed = errors.New("catalog write-ahead log failed")

// Changes of a record.
const (
	walPut byte = iota + 1
	walDelete
	walCreateBucket
	walDeleteBucket
)

// walRec collects one transaction's changes.
type walRec struct{ buf []byte }

func (r *walRec) add(op byte, fields ...[]byte) {
	if r == nil {
		return
	}
	r.buf = append(r.buf, op)
	for _, f := range fields {
		r.buf = binary.AppendUvarint(r.buf, uint64(len(f)))
		r.buf = append(r.buf, f...)
	}
}

// bucket is a bbolt bucket whose writes a write transaction records.
type bucket struct {
	*bolt.Bucket
	name []byte
	rec  *walRec
}

func (b *bucket) Put(k, v []byte) error {
	if err := b.Bucket.Put(k, v); err != nil {
		return err
	}
	b.rec.add(walPut, b.name, k, v)
	return nil
}

func (b *bucket) Delete(k []byte) error {
	if err := b.Bucket.Delete(k); err != nil {
		return err
	}
	b.rec.add(walDelete, b.name, k)
	return nil
}

// createBucketIfNotExists and deleteBucket are bbolt's, recorded.
func (t *raw) createBucketIfNotExists(name []byte) (*bucket, error) {
	b, err := t.tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	t.rec.add(walCreateBucket, name)
	return &bucket{Bucket: b, name: name, rec: t.rec}, nil
}

func (t *raw) deleteBucket(name []byte) error {
	if err := t.tx.DeleteBucket(name); err != nil {
		return err
	}
	t.rec.add(walDeleteBucket, name)
	return nil
}

// wal is an open log.
type wal struct {
	dir    *os.File // the store's directory, where the log lives
	noSync bool     // faults: the power-loss suite's missing sync

	// Under DB.wmu (f, gen, size and seq: and syncMu, to change them).
	f    *os.File      // the records file
	gen  uint64        // the last checkpoint's txid: its records carry it
	size int64         // bytes of this generation's records in f
	seq  uint64        // records of this generation
	lsn  atomic.Uint64 // records appended since Open, every generation

	syncMu sync.Mutex // one fdatasync at a time, shared by the waiting
	synced uint64     // lsn known durable (syncMu)

	errMu sync.Mutex
	err   error // the first failure: every later write is refused
}

// fail records err as the log's failure, unless one is recorded, and
// returns the recorded one.
func (w *wal) fail(err error) error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if w.err == nil {
		w.err = fmt.Errorf("%w: %v", ErrWALFailed, err)
	}
	return w.err
}

// failed returns the log's failure, nil if none.
func (w *wal) failed() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// walHeader is a log's first bytes: the magic, the page size, the
// checkpoint's txid and its two meta pages, CRC-32C.
func walHeader(pageSize int, txid uint64, metas []byte) []byte {
	h := []byte(walMagic)
	h = binary.BigEndian.AppendUint32(h, uint32(pageSize))
	h = binary.BigEndian.AppendUint64(h, txid)
	h = append(h, metas...)
	return binary.BigEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
}

// parseHeader returns a header's txid and meta pages.
func parseHeader(b []byte) (txid uint64, metas []byte, err error) {
	if len(b) < len(walMagic)+12 || string(b[:len(walMagic)]) != walMagic {
		return 0, nil, errors.New("no log header")
	}
	p := len(walMagic)
	pageSize := int(binary.BigEndian.Uint32(b[p:]))
	txid = binary.BigEndian.Uint64(b[p+4:])
	if pageSize < 512 || pageSize > 1<<16 {
		return 0, nil, fmt.Errorf("log header: page size %d", pageSize)
	}
	n := p + 12 + 2*pageSize + 4
	if len(b) < n {
		return 0, nil, errors.New("log header cut short")
	}
	if crc32.Checksum(b[:n-4], castagnoli) != binary.BigEndian.Uint32(b[n-4:]) {
		return 0, nil, errors.New("log header fails its checksum")
	}
	return txid, b[p+12 : p+12+2*pageSize], nil
}

// append writes rec (not synced) and returns its lsn. DB.wmu held.
func (w *wal) append(rec []byte) (uint64, error) {
	if err := w.failed(); err != nil {
		return 0, err
	}
	w.seq++
	b := make([]byte, 24, 24+len(rec))
	binary.BigEndian.PutUint32(b, uint32(16+len(rec)))
	binary.BigEndian.PutUint64(b[8:], w.gen)
	binary.BigEndian.PutUint64(b[16:], w.seq)
	b = append(b, rec...)
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(b[8:], castagnoli))
	if _, err := w.f.WriteAt(b, w.size); err != nil {
		return 0, w.fail(fmt.Errorf("append to %s: %w", w.f.Name(), err))
	}
	w.size += int64(len(b))
	return w.lsn.Add(1), nil
}

// sync returns once record lsn is durable: one fdatasync covers every
// record appended before it, so commits waiting together share it. While
// syncMu is held no checkpoint can replace the log (it takes syncMu to), and
// a checkpoint that did so before made lsn durable.
func (w *wal) sync(lsn uint64) error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.synced >= lsn {
		return nil
	}
	if err := w.failed(); err != nil {
		return err
	}
	f := w.f
	if f == nil { // closed: the catalog was synced before
		return nil
	}
	upTo := w.lsn.Load() // appended, to f, before this fdatasync
	if !w.noSync {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return w.fail(fmt.Errorf("fdatasync %s: %w", f.Name(), err))
		}
	}
	w.synced = max(w.synced, upTo)
	return nil
}

// readMetas returns the catalog file's two meta pages (bbolt's pages 0
// and 1).
func readMetas(path string, pageSize int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read meta pages: %w", err)
	}
	defer f.Close()
	metas := make([]byte, 2*pageSize)
	if _, err := f.ReadAt(metas, 0); err != nil {
		return nil, fmt.Errorf("read meta pages: %w", err)
	}
	return metas, nil
}

// openAt opens name in directory dir (a descriptor: the store's directory
// as it was at Open, wherever it has been moved since, and never a store
// put in its place).
func openAt(dir *os.File, name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), nil
}

// writeHeader writes header to a new file in dir, synced, and renames it
// over walName; dir is fsync'd.
func writeHeader(dir *os.File, header []byte, noSync bool) error {
	tmp := walName + ".tmp"
	f, err := openAt(dir, tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(header, 0)
	if err == nil && !noSync {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), walName)
	}
	if err != nil {
		_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return err
	}
	return dir.Sync()
}

// openData opens the records file, written through at least walDataBytes
// (zeros past its end, synced): appends inside it change no metadata, so
// their fdatasync writes their blocks and nothing else.
func openData(dir *os.File, noSync bool) (*os.File, error) {
	f, err := openAt(dir, walDataName, os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Size() < walDataBytes {
		zeros := make([]byte, walDataBytes-st.Size())
		_, err = f.WriteAt(zeros, st.Size())
		if err == nil && !noSync {
			err = unix.Fdatasync(int(f.Fd()))
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Recover brings the catalog at path up to date from a log left by a
// process that did not close it (see "Recovery"). It does nothing when
// there is no log, or when another process holds the catalog (its log is
// its own). It fails with ErrCatalogDamaged when the log's header is
// unreadable, and with the I/O error when the catalog cannot be written
// (a store on a read-only filesystem must be recovered where it is
// writable).
func Recover(path string) error {
	logPath := filepath.Join(filepath.Dir(path), walName)
	data, err := os.ReadFile(logPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read catalog log: %w", err)
	}
	gen, metas, err := parseHeader(data)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCatalogDamaged, logPath, err)
	}
	body, err := os.ReadFile(filepath.Join(filepath.Dir(path), walDataName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read catalog log: %w", err)
	}
	recs := walRecords(body, gen)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("recover catalog: %w", err)
	}
	// bbolt's lock, so that no process opens the file half restored.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil
		}
		return fmt.Errorf("recover catalog: lock: %w", err)
	}
	_, err = f.WriteAt(metas, 0)
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	f.Close() // unlocks
	if err != nil {
		return fmt.Errorf("recover catalog: restore the checkpoint's meta pages: %w", err)
	}
	if err := Check(path); err != nil {
		return fmt.Errorf("recover catalog: the checkpoint: %w", err)
	}
	db, err := openBolt(path, false, 0)
	if err != nil {
		return fmt.Errorf("recover catalog: %w", err)
	}
	err = replay(db, recs)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recover catalog %s: %w", path, err)
	}
	if err := os.Remove(logPath); err != nil {
		return fmt.Errorf("recover catalog: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

// walRecords returns the records of a log's body up to the first that is
// incomplete or damaged.
func walRecords(b []byte, gen uint64) [][]byte {
	var recs [][]byte
	for seq := uint64(1); len(b) >= 24; seq++ {
		n := int(binary.BigEndian.Uint32(b))
		if n < 16 || len(b) < 8+n {
			break
		}
		body := b[8 : 8+n]
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[4:]) ||
			binary.BigEndian.Uint64(body) != gen || binary.BigEndian.Uint64(body[8:]) != seq {
			break
		}
		recs = append(recs, body[16:])
		b = b[8+n:]
	}
	return recs
}

// replay applies recs to db in one synced transaction.
// The catalog is then at rest: its own format is put back (see "Format
// while open").
func replay(db *bolt.DB, recs [][]byte) (err error) {
	defer recoverDamage(&err)
	return db.Update(func(tx *bolt.Tx) error {
		for i, r := range recs {
			if err := applyRecord(tx, r); err != nil {
				return fmt.Errorf("log record %d: %w", i+1, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: no meta bucket", ErrNotStore)
		}
		if v := meta.Get(keyFormatAtRest); len(v) == 4 {
			if err := meta.Put(keyFormat, bytes.Clone(v)); err != nil {
				return err
			}
			return meta.Delete(keyFormatAtRest)
		}
		return nil
	})
}

func applyRecord(tx *bolt.Tx, r []byte) error {
	field := func() ([]byte, error) {
		n, k := binary.Uvarint(r)
		if k <= 0 || uint64(len(r)-k) < n {
			return nil, errors.New("cut short")
		}
		f := r[k : k+int(n)]
		r = r[k+int(n):]
		return f, nil
	}
	for len(r) > 0 {
		op := r[0]
		r = r[1:]
		name, err := field()
		if err != nil {
			return err
		}
		switch op {
		case walPut, walDelete:
			key, err := field()
			if err != nil {
				return err
			}
			b := tx.Bucket(name)
			if b == nil {
				return fmt.Errorf("no bucket %q", name)
			}
			if op == walDelete {
				err = b.Delete(key)
				break
			}
			v, ferr := field()
			if ferr != nil {
				return ferr
			}
			err = b.Put(key, bytes.Clone(v))
		case walCreateBucket:
			_, err = tx.CreateBucketIfNotExists(name)
		case walDeleteBucket:
			err = tx.DeleteBucket(name)
		default:
			return fmt.Errorf("unknown change %d", op)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// update runs fn in a write transaction (see Update and UpdateAround).
func (d *DB) update(fn func(*Tx) error, around func() (after func())) (err error) {
	defer recoverDamage(&err)
	d.wmu.Lock()
	locked := true
	var after func()
	defer func() {
		// after takes the caller's lock again: never with wmu held, which
		// the caller's lock comes before.
		if locked {
			d.wmu.Unlock()
		}
		if after != nil {
			after()
		}
	}()
	if d.wal != nil && d.wal.size >= d.checkpointBytes {
		if err := d.checkpoint(); err != nil {
			return err
		}
	}
	w := d.wal // nil: read-only, or too large for a log (bbolt syncs)
	if w != nil {
		if err := w.failed(); err != nil {
			return err
		}
	}
	tx, err := d.db.Begin(true)
	if err != nil {
		return err
	}
	// After a Commit it returns ErrTxClosed, harmless; before, on an error
	// or a panic of fn, it rolls back.
	defer func() { _ = tx.Rollback() }()
	if around == nil {
		d.tail.extend(tx)
	}
	t := d.tx(tx)
	if w != nil {
		t.rec = &walRec{}
	}
	if err := fn(t); err != nil {
		return err
	}
	if around != nil {
		after = around()
		// With the caller's lock released: its holders do not wait for the
		// zeros. Past the mark as it is now, pages fn allocated included.
		d.tail.extend(tx)
	}
	if err := tx.Commit(); err != nil || w == nil || len(t.rec.buf) == 0 {
		return err
	}
	lsn, err := w.append(t.rec.buf)
	if err != nil {
		return err
	}
	d.wmu.Unlock()
	locked = false
	return w.sync(lsn)
}

// checkpoint makes the catalog file durable and starts a new log at it (see
// "Checkpoints"). d.wmu held, no write transaction open. A catalog past a
// quarter of its mapping drops its log instead: d.wal is nil after, and
// bbolt syncs its commits.
func (d *DB) checkpoint() error {
	w := d.wal
	if err := d.db.Sync(); err != nil {
		return w.fail(fmt.Errorf("checkpoint: sync catalog: %w", err))
	}
	pageSize := d.db.Info().PageSize
	var size int64
	var txid uint64
	if err := d.db.View(func(tx *bolt.Tx) error {
		size, txid = tx.Size(), uint64(tx.ID())
		return nil
	}); err != nil {
		return err
	}
	if size > d.mapped/4 {
		if err := d.closeLog(); err != nil {
			return err
		}
		d.db.NoSync = false
		return nil
	}
	metas, err := readMetas(d.db.Path(), pageSize)
	if err != nil {
		return w.fail(err)
	}
	if w.f == nil {
		f, err := openData(w.dir, w.noSync)
		if err != nil {
			return w.fail(fmt.Errorf("checkpoint: %w", err))
		}
		w.syncMu.Lock()
		w.f = f
		w.syncMu.Unlock()
	}
	// The records of the last generation are no longer needed once the
	// header names this one: the next are written over them.
	if err := writeHeader(w.dir, walHeader(pageSize, txid, metas), w.noSync); err != nil {
		return w.fail(fmt.Errorf("checkpoint: new log header: %w", err))
	}
	// The new pin before the old one goes: no page of the new checkpoint's
	// tree is free at any moment.
	pin, err := d.db.Begin(false)
	if err != nil {
		return w.fail(fmt.Errorf("checkpoint: %w", err))
	}
	if d.pin != nil {
		_ = d.pin.Rollback()
	}
	d.pin = pin
	w.syncMu.Lock()
	w.gen, w.size, w.seq = txid, 0, 0
	w.synced = w.lsn.Load() // the checkpoint made every record durable
	w.syncMu.Unlock()
	if d.onCheckpoint != nil {
		d.onCheckpoint()
	}
	return nil
}

// closeLog makes the catalog file durable and removes the log: the file is
// then an ordinary bbolt catalog. d.wmu held.
func (d *DB) closeLog() error {
	w := d.wal
	if w == nil {
		return nil
	}
	var err error
	if w.failed() == nil { // after a failure the log is the truth: keep it
		// The format at rest back, in a transaction bbolt syncs itself (the
		// pin still keeps the checkpoint whole until the log is gone).
		d.db.NoSync = w.noSync
		err = d.db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			v := meta.Get(keyFormatAtRest)
			if len(v) != 4 {
				return nil
			}
			if err := meta.Put(keyFormat, bytes.Clone(v)); err != nil {
				return err
			}
			return meta.Delete(keyFormatAtRest)
		})
		if err == nil {
			err = d.db.Sync()
		}
		if err == nil {
			// In the directory the log was made in: a store moved keeps
			// none, a store put in its place keeps its own.
			if err = unix.Unlinkat(int(w.dir.Fd()), walName, 0); err == nil || errors.Is(err, unix.ENOENT) {
				err = w.dir.Sync()
			}
		}
	}
	w.syncMu.Lock()
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	w.syncMu.Unlock()
	w.dir.Close()
	if d.pin != nil {
		_ = d.pin.Rollback()
		d.pin = nil
	}
	d.wal = nil
	if err != nil {
		return fmt.Errorf("close catalog log: %w", err)
	}
	return nil
}
