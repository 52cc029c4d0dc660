package catalog

import "encoding/binary"

// Uploads writes and reads the rows of the remote tier (cas/remote):
// the commit generation (counted by every commit), the generation uploaded
// last, and the set of chunks known to be in the remote (bucket
// remote_chunks, chunk ID → empty). An older ckptfs ignores them.
type Uploads struct{ t *Tx }

// Uploads returns the remote tier's rows in t.
func (t *Tx) Uploads() Uploads { return Uploads{t} }

// CountCommit counts a commit: the remote tier uploads up to it.
func (u Uploads) CountCommit() error {
	meta := u.t.b(bucketMeta)
	return meta.Put(keyCommitGen, u64key(u.metaU64(keyCommitGen)+1))
}

// Gens returns the commit generation and the generation uploaded last.
func (u Uploads) Gens() (commit, uploaded uint64) {
	return u.metaU64(keyCommitGen), u.metaU64(keyUploadedGen)
}

// SetUploaded records that generation gen is uploaded, unless a later one
// is recorded already.
func (u Uploads) SetUploaded(gen uint64) error {
	if u.metaU64(keyUploadedGen) >= gen {
		return nil
	}
	return u.t.b(bucketMeta).Put(keyUploadedGen, u64key(gen))
}

func (u Uploads) metaU64(key []byte) uint64 {
	if v := u.t.b(bucketMeta).Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Has reports whether chunk id is recorded as uploaded.
func (u Uploads) Has(id ID) bool {
	b := u.t.b(bucketRemoteChunk)
	return b != nil && b.Get(id[:]) != nil
}

// Add records chunks ids as uploaded.
func (u Uploads) Add(ids []ID) error {
	b, err := u.t.tx.CreateBucketIfNotExists(bucketRemoteChunk)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := b.Put(id[:], nil); err != nil {
			return err
		}
	}
	return nil
}

// Forget removes ids from the chunks recorded as uploaded.
func (u Uploads) Forget(ids []ID) error {
	b := u.t.b(bucketRemoteChunk)
	if b == nil {
		return nil
	}
	for _, id := range ids {
		if err := b.Delete(id[:]); err != nil {
			return err
		}
	}
	return nil
}

// Base returns the name of the remote snapshot the namespace last agreed
// with (published or applied by cas/remote), "" when none: the common
// ancestor of a merge with the bucket's newest state.
func (u Uploads) Base() string { return string(u.t.b(bucketMeta).Get(keyRemoteBase)) }

// SetBase records name as the remote snapshot the namespace agrees with.
func (u Uploads) SetBase(name string) error {
	return u.t.b(bucketMeta).Put(keyRemoteBase, []byte(name))
}
