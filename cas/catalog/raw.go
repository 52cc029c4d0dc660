package catalog

import (
	"bytes"
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// raw is the untyped layer under Tx: the bbolt transaction, its buckets
// opened once, the counters of the meta bucket, and sealed records
// (record.go).
type raw struct {
	tx     *bolt.Tx
	legacy bool // a format-1 store: records may be unsealed (record.go)

	// Each bucket is opened once, and a read transaction looks keys up
	// with one cursor per bucket: bbolt allocates a bucket and a cursor on
	// every Tx.Bucket and Get otherwise, and fsck and lookups make millions.
	buckets [cachedBuckets]bucket
	cursors [cachedBuckets]*bolt.Cursor

	// rec records a write transaction's changes for the catalog's log
	// (wal.go); nil in a read transaction or without a log.
	rec *walRec

	walked int // rows Children and PrevSibling have read (Tx.Walked)
}

// cachedBuckets is how many of allBuckets a raw keeps open.
const cachedBuckets = 6

// bucketIndex returns name's index in allBuckets if a raw keeps it open, or -1.
func bucketIndex(name []byte) int {
	for i, b := range allBuckets[:min(cachedBuckets, len(allBuckets))] {
		if bytes.Equal(b, name) {
			return i
		}
	}
	return -1
}

// b returns bucket name (nil when the catalog has no such bucket). Its
// Put and Delete are recorded in the transaction's log record.
func (t *raw) b(name []byte) *bucket {
	i := bucketIndex(name)
	if i < 0 {
		b := t.tx.Bucket(name)
		if b == nil {
			return nil
		}
		return &bucket{Bucket: b, name: name, rec: t.rec}
	}
	wb := &t.buckets[i]
	if wb.Bucket == nil {
		b := t.tx.Bucket(name)
		if b == nil {
			return nil
		}
		*wb = bucket{Bucket: b, name: name, rec: t.rec}
	}
	return wb
}

// get returns the value of key in bucket name, as Bucket.Get does (nil for
// a missing key or a nested bucket).
func (t *raw) get(name, key []byte) []byte {
	i := bucketIndex(name)
	if i < 0 || t.tx.Writable() {
		return t.b(name).Get(key)
	}
	c := t.cursors[i]
	if c == nil {
		c = t.b(name).Cursor()
		t.cursors[i] = c
	}
	k, v := c.Seek(key)
	if !bytes.Equal(k, key) {
		return nil
	}
	return v
}

// counter returns the meta counter key (0 when unset).
func (t *raw) counter(key []byte) int64 {
	v := t.b(bucketMeta).Get(key)
	if len(v) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

// addCounter adds delta to the meta counter key.
func (t *raw) addCounter(key []byte, delta int64) error {
	if delta == 0 {
		return nil
	}
	return t.b(bucketMeta).Put(key, u64key(uint64(t.counter(key)+delta)))
}
