package catalog

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The dirorder bucket (issue #27) holds every directory entry a second time,
// keyed so that a directory's entries sort in natural order ("step-90"
// before "step-100"):
//
//	parent ino (u64 BE) ‖ NaturalKey(name) ‖ 0x00 ‖ name → sealed (child ino (u64 BE) ‖ name)
//
// so that PrevSibling, the entry right before a name in natural order, is
// one cursor seek whatever the directory's size: a commit's delta-base
// search (fusefs/bases.go) asks it at up to three levels, and a listing of
// the directory there made a run's commit grow with its step count.
//
// Link and Unlink keep it in the transaction that changes the dirents row;
// a writable Open builds it, in one transaction, for a catalog made before
// it existed (O(entries), once). An older ckptfs ignores the bucket: its
// Link and Unlink do not keep it. What it leaves behind costs delta hints,
// never bytes: PrevSibling checks each row against dirents and skips one
// that no longer names the same inode, and an entry an older ckptfs added
// is not found (no hint from it, as for a first step). The rows are never
// read as the namespace: Lookup and Children read dirents only.
var bucketDirOrder = []byte("dirorder")

// NaturalKey encodes name so that bytewise order of keys is natural order of
// names: a run of digits compares as a number ("9" < "10"; "007" and "7"
// are equal), the rest bytewise. A run becomes '0', the length of the
// number without its leading zeros (u16 BE) and those digits; any other byte
// stays. Since a run starts with '0' and no other byte of the name is a
// digit, a run and a byte compare as a digit and that byte do, and one key
// is a prefix of another only where the name's runs and bytes are.
func NaturalKey(name string) []byte {
	k := make([]byte, 0, len(name)+4)
	for i := 0; i < len(name); {
		if name[i] < '0' || name[i] > '9' {
			k = append(k, name[i])
			i++
			continue
		}
		j := i
		for j < len(name) && name[j] >= '0' && name[j] <= '9' {
			j++
		}
		num := name[i:j]
		for len(num) > 0 && num[0] == '0' {
			num = num[1:]
		}
		k = append(k, '0')
		k = binary.BigEndian.AppendUint16(k, uint16(len(num)))
		k = append(k, num...)
		i = j
	}
	return k
}

// dirOrderKey is the dirorder key of entry parent/name. Names hold no 0x00,
// so the separator sorts a key before those of longer natural keys it is a
// prefix of.
func dirOrderKey(parent uint64, name string) []byte {
	k := append(u64key(parent), NaturalKey(name)...)
	k = append(k, 0)
	return append(k, name...)
}

func dirOrderValue(ino uint64, name string) []byte {
	return append(u64key(ino), name...)
}

// linkOrder and unlinkOrder keep the dirorder row of parent/name (no-ops
// without the bucket: a read-only catalog never writes).
func (t *raw) linkOrder(parent uint64, name string, ino uint64) error {
	b := t.b(bucketDirOrder)
	if b == nil {
		return nil
	}
	key := dirOrderKey(parent, name)
	return b.Put(key, sealRecord(key, dirOrderValue(ino, name)))
}

func (t *raw) unlinkOrder(parent uint64, name string) error {
	b := t.b(bucketDirOrder)
	if b == nil {
		return nil
	}
	return b.Delete(dirOrderKey(parent, name))
}

// maxStaleOrder bounds the rows PrevSibling skips because dirents no longer
// has them (left by an older ckptfs): past it, no answer.
const maxStaleOrder = 64

// PrevSibling returns the entry of directory parent that comes right before
// name in natural order (NaturalKey; among names equal in natural order,
// the first bytewise), reading O(1) rows whatever the directory's size. ok
// is false when there is none, or when the catalog has no dirorder bucket
// (a read-only catalog made before it).
func (t *Tx) PrevSibling(parent uint64, name string) (sib string, ino uint64, ok bool, err error) {
	b := t.b(bucketDirOrder)
	if b == nil {
		return "", 0, false, nil
	}
	prefix := u64key(parent)
	seek := append(append(bytes.Clone(prefix), NaturalKey(name)...), 0)
	c := b.Cursor()
	k, v := c.Seek(seek)
	if k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	var want []byte // the natural key of the answer, once found
	stale := 0
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
		t.walked++
		rec, err := t.openRecord(k, v)
		if err != nil {
			return "", 0, false, fmt.Errorf("dirorder %d: %w", parent, err)
		}
		if len(rec) < 8 || !bytes.HasSuffix(k, rec[8:]) || len(k) < len(prefix)+len(rec)-8+1 {
			return "", 0, false, fmt.Errorf("dirorder %d/%x: %w: bad record", parent, k, ErrCatalogDamaged)
		}
		n, child := string(rec[8:]), binary.BigEndian.Uint64(rec)
		nat := k[len(prefix) : len(k)-len(n)-1]
		if want != nil && !bytes.Equal(nat, want) {
			break // past the names equal to the answer
		}
		if cur, ok := t.Lookup(parent, n); !ok || cur != child {
			if stale++; stale > maxStaleOrder {
				break
			}
			continue
		}
		want = nat
		sib, ino, ok = n, child, true
	}
	return sib, ino, ok, nil
}

// buildDirOrder fills a new dirorder bucket from dirents.
func buildDirOrder(tx *bolt.Tx) error {
	b, err := tx.CreateBucket(bucketDirOrder)
	if err != nil {
		return fmt.Errorf("create dirorder bucket: %w", err)
	}
	t := &raw{tx: tx}
	return tx.Bucket(bucketDirents).ForEach(func(k, v []byte) error {
		rec, err := t.openRecord(k, v)
		if err != nil {
			return fmt.Errorf("dirent %x: %w", k, err)
		}
		if len(rec) != 8 || len(k) < 8 {
			return fmt.Errorf("dirent %x: %w: bad record", k, ErrCatalogDamaged)
		}
		key := dirOrderKey(binary.BigEndian.Uint64(k), string(k[8:]))
		return b.Put(key, sealRecord(key, dirOrderValue(binary.BigEndian.Uint64(rec), string(k[8:]))))
	})
}
