package catalog

import (
	"encoding/binary"
	"fmt"
)

// The linked bucket holds, for a directory entry a rename made, when the
// entry got its name:
//
//	parent ino (u64 BE) ‖ name → sealed (child ino (u64 BE) ‖ time (i64 BE, ns))
//
// The remote tier stamps each path's version with the time it changed
// (cas/remote: merge.go): the later of its record's ctime and when it got
// its name, and a rename changes neither record of the moved node. The
// directory's ctime had stood for that, but every entry added to or removed
// from the directory moves it, so a file written in a directory and not
// yet published took the time of any later file beside it, and could win
// over another writer's later version of its path.
//
// SetLinked writes a row (fusefs: Rename); Unlink drops the entry's row.
// Linked reads it only while it names the entry's inode: a row an older
// ckptfs left behind (its Unlink does not drop it) and a later entry of the
// same name with another inode do not match. An entry without a row (made
// by a create, a link, an older ckptfs's rename, a remote version applied
// here) has its record's ctime as the time it got its name. An older
// ckptfs ignores the bucket.
var bucketLinked = []byte("linked")

// SetLinked records that the entry name of directory parent, naming ino,
// got its name at time t (ns).
func (t *Tx) SetLinked(parent uint64, name string, ino uint64, at int64) error {
	b := t.b(bucketLinked)
	if b == nil {
		return nil // a catalog opened read-only before the bucket existed: nothing to keep
	}
	key := direntKey(parent, name)
	v := binary.BigEndian.AppendUint64(u64key(ino), uint64(at))
	return b.Put(key, sealRecord(key, v))
}

// Linked returns when the entry name of directory parent got its name, if
// a rename recorded it and the row still names ino (0 otherwise).
func (t *Tx) Linked(parent uint64, name string, ino uint64) (int64, error) {
	b := t.b(bucketLinked)
	if b == nil {
		return 0, nil
	}
	key := direntKey(parent, name)
	v := b.Get(key)
	if v == nil {
		return 0, nil
	}
	rec, err := t.openRecord(key, v)
	if err != nil {
		return 0, fmt.Errorf("linked %d/%q: %w", parent, name, err)
	}
	if len(rec) != 16 {
		return 0, fmt.Errorf("linked %d/%q: %w: bad record", parent, name, ErrCatalogDamaged)
	}
	if binary.BigEndian.Uint64(rec) != ino {
		return 0, nil
	}
	return int64(binary.BigEndian.Uint64(rec[8:])), nil
}

// dropLinked removes the linked row of the entry name of parent, if any.
func (t *Tx) dropLinked(parent uint64, name string) error {
	if b := t.b(bucketLinked); b != nil {
		return b.Delete(direntKey(parent, name))
	}
	return nil
}
