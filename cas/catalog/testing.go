package catalog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// Hooks for tests that damage, age or rewrite a catalog below the typed rows
// (here, so that no other package imports bbolt). Buckets are named as in
// schema.go ("nodes", "dirents", "manifests", "chunks", "reencode", "meta", …).

// NodeKey and DirentKey are the keys of node ino's record and of directory
// entry parent/name.
func NodeKey(ino uint64) []byte                   { return u64key(ino) }
func DirentKey(parent uint64, name string) []byte { return direntKey(parent, name) }

// RawGet returns a copy of the stored value of key in bucket (nil if none).
func RawGet(tx *Tx, bucket string, key []byte) []byte {
	return bytes.Clone(tx.b([]byte(bucket)).Get(key))
}

// RawPut stores v as the value of key in bucket, as it is.
func RawPut(tx *Tx, bucket string, key, v []byte) error {
	return tx.b([]byte(bucket)).Put(key, v)
}

// RawDelete deletes key from bucket, and nothing else.
func RawDelete(tx *Tx, bucket string, key []byte) error {
	return tx.b([]byte(bucket)).Delete(key)
}

// RawForEach calls fn with every key and stored value of bucket.
func RawForEach(tx *Tx, bucket string, fn func(k, v []byte) error) error {
	return tx.b([]byte(bucket)).ForEach(fn)
}

// DeleteBucket deletes bucket, as a catalog made before it existed lacks it.
func DeleteBucket(tx *Tx, bucket string) error { return tx.deleteBucket([]byte(bucket)) }

// IsSealed reports whether v is a sealed record (record.go).
func IsSealed(v []byte) bool { return len(v) >= 5 && v[0] == recordVersion }

// SetFormat writes format version f into the catalog file at path, which no
// process may have open.
func SetFormat(tb testing.TB, path string, f uint32) {
	tb.Helper()
	rewrite(tb, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyFormat, binary.BigEndian.AppendUint32(nil, f))
	})
}

// Unseal rewrites the catalog file at path, which no process may have open,
// as a format-1 catalog: every record unsealed, format 1.
func Unseal(tb testing.TB, path string) {
	tb.Helper()
	rewrite(tb, path, func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketNodes, bucketDirents, bucketManifests, bucketChunks, bucketReencode} {
			bk := tx.Bucket(name)
			var keys, vals [][]byte
			bk.ForEach(func(k, v []byte) error {
				keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(v[1:len(v)-4]))
				return nil
			})
			for i := range keys {
				if err := bk.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
		}
		return tx.Bucket(bucketMeta).Put(keyFormat, binary.BigEndian.AppendUint32(nil, 1))
	})
}

func rewrite(tb testing.TB, path string, fn func(tx *bolt.Tx) error) {
	tb.Helper()
	db, err := bolt.Open(path, 0o644, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		tb.Fatal(err)
	}
}

// DirOrderMismatch returns an error naming the first directory entry whose
// dirorder row (dirorder.go) is missing or names another inode, or the
// first row no entry has; nil when the index and the entries agree.
func DirOrderMismatch(tx *Tx) error {
	rows := map[string]uint64{}
	if err := tx.b(bucketDirOrder).ForEach(func(k, v []byte) error {
		rec, err := tx.openRecord(k, v)
		if err != nil || len(rec) < 8 {
			return fmt.Errorf("dirorder row %x: %v", k, err)
		}
		rows[string(k)] = binary.BigEndian.Uint64(rec)
		return nil
	}); err != nil {
		return err
	}
	if err := tx.b(bucketDirents).ForEach(func(k, v []byte) error {
		parent, name := binary.BigEndian.Uint64(k), string(k[8:])
		ino, ok := tx.Lookup(parent, name)
		if !ok {
			return fmt.Errorf("dirent %d/%q unreadable", parent, name)
		}
		key := string(dirOrderKey(parent, name))
		if got, ok := rows[key]; !ok || got != ino {
			return fmt.Errorf("dirent %d/%q → %d: dirorder row %v → %d", parent, name, ino, ok, got)
		}
		delete(rows, key)
		return nil
	}); err != nil {
		return err
	}
	for k, ino := range rows {
		return fmt.Errorf("dirorder row %x → %d names no entry", k, ino)
	}
	return nil
}
