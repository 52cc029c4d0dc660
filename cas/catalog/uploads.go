package catalog

import (
	"encoding/binary"
	"strings"
)

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
	b, err := u.t.createBucketIfNotExists(bucketRemoteChunk)
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
// ancestor of a merge with the bucket's newest state. mirror says the
// namespace was a reading mount's copy of it (no changes of its own since).
func (u Uploads) Base() (name string, mirror bool) {
	v := u.t.b(bucketMeta).Get(keyRemoteBase)
	if len(v) == 0 {
		return "", false
	}
	return string(v[1:]), v[0] == 'm'
}

// SetBase records name as the remote snapshot the namespace agrees with,
// as a reading mount's mirror or not.
func (u Uploads) SetBase(name string, mirror bool) error {
	flag := byte('w')
	if mirror {
		flag = 'm'
	}
	return u.t.b(bucketMeta).Put(keyRemoteBase, append([]byte{flag}, name...))
}

// Pending returns the snapshot a round is publishing, or published without
// learning so (its log entry's answer lost), and the session publishing it:
// "" when every round that put an entry also confirmed it (SetBase).
func (u Uploads) Pending() (snapshot, session string) {
	v := u.t.b(bucketMeta).Get(keyRemotePending)
	snapshot, session, _ = strings.Cut(string(v), "\x00")
	return snapshot, session
}

// SetPending records that session is about to publish snapshot (before the
// log entry naming it is put); an empty snapshot clears the record.
func (u Uploads) SetPending(snapshot, session string) error {
	if snapshot == "" {
		return u.t.b(bucketMeta).Delete(keyRemotePending)
	}
	return u.t.b(bucketMeta).Put(keyRemotePending, []byte(snapshot+"\x00"+session))
}
