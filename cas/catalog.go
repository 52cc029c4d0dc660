package cas

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Catalog schema: one bbolt database with these buckets.
//
//	meta       config and counters: "format", "chunk_size", "next_ino", and the stats counters
//	nodes      ino (u64 BE) → node record
//	dirents    parent ino (u64 BE) ‖ name → child ino (u64 BE)
//	manifests  ino (u64 BE) → manifest of the file's committed content
//	chunks     chunk ID → chunk record (raw length, stored length, codec)
//	reencode   chunk ID → re-encode queue record (hint, raw length); see reencode.go
//	deltaplans chunk ID → base to try and distance from it; see deltaplan.go
//	deltas     chunk ID → base its object is a delta against, and distance
//	bases      base ID ‖ delta ID → (empty): the reverse of deltas
var (
	bucketMeta      = []byte("meta")
	bucketNodes     = []byte("nodes")
	bucketDirents   = []byte("dirents")
	bucketManifests = []byte("manifests")
	bucketChunks    = []byte("chunks")
	bucketReencode  = []byte("reencode")
)

var allBuckets = [][]byte{bucketMeta, bucketNodes, bucketDirents, bucketManifests, bucketChunks, bucketReencode,
	bucketDeltaPlans, bucketDeltas, bucketBases}

// Meta keys.
var (
	keyFormat    = []byte("format")
	keyChunkSize = []byte("chunk_size")
	keyNextIno   = []byte("next_ino")
	keyFiles     = []byte("files")
	keyDirs      = []byte("dirs")
	keyLogical   = []byte("logical_bytes")
	keyChunks    = []byte("chunks")
	keyUnique    = []byte("unique_bytes")
	keyStored    = []byte("stored_bytes")
	// Rows of the re-encode queue and the raw bytes of their chunks.
	keyReencodeChunks = []byte("reencode_chunks")
	keyReencodeBytes  = []byte("reencode_bytes")
)

// Catalog formats. A store with a larger number than FormatVersion is
// refused (ErrNewerFormat).
//
// Format 2 seals every record with a checksum (record.go); Open migrates a
// format-1 store. Format 3 is format 2 holding delta objects (deltaplan.go):
// a store moves to it in the transaction that records its first delta, so
// that an older ckptfs, which would sweep a base without knowing a delta
// needs it, refuses the store. A store that never held a delta stays at 2
// and opens with older binaries.
const (
	formatSealed  = 2
	formatDeltas  = 3
	FormatVersion = formatDeltas // the newest format this code reads and writes
)

// Reserved inode numbers. Numbers below FirstIno are never allocated, so the
// caller may use them for virtual nodes.
const (
	RootIno  uint64 = 1
	FirstIno uint64 = 16
)

// Node is the catalog record of one namespace entry: a directory, a regular file
// (whose content is the manifest stored under the same Ino) or a symlink.
type Node struct {
	Ino    uint64
	Mode   uint32 // type and permission bits, as in stat(2)
	UID    uint32
	GID    uint32
	Size   int64 // regular files: committed size; symlinks: len(Target)
	Atime  int64 // nanoseconds since the epoch
	Mtime  int64
	Ctime  int64
	Target string // symlink target
}

const nodeRecordVersion = 1

func (n *Node) marshal() []byte {
	b := make([]byte, 0, 61+len(n.Target))
	b = append(b, nodeRecordVersion)
	b = binary.LittleEndian.AppendUint32(b, n.Mode)
	b = binary.LittleEndian.AppendUint32(b, n.UID)
	b = binary.LittleEndian.AppendUint32(b, n.GID)
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Size))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Atime))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Mtime))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Ctime))
	b = append(b, n.Target...)
	return b
}

func unmarshalNode(ino uint64, b []byte) (Node, error) {
	const fixed = 1 + 4*3 + 8*4
	if len(b) < fixed || b[0] != nodeRecordVersion {
		return Node{}, fmt.Errorf("node %d: bad record (%d bytes)", ino, len(b))
	}
	n := Node{Ino: ino}
	n.Mode = binary.LittleEndian.Uint32(b[1:])
	n.UID = binary.LittleEndian.Uint32(b[5:])
	n.GID = binary.LittleEndian.Uint32(b[9:])
	n.Size = int64(binary.LittleEndian.Uint64(b[13:]))
	n.Atime = int64(binary.LittleEndian.Uint64(b[21:]))
	n.Mtime = int64(binary.LittleEndian.Uint64(b[29:]))
	n.Ctime = int64(binary.LittleEndian.Uint64(b[37:]))
	n.Target = string(b[fixed:])
	return n, nil
}

// IsDir, IsRegular and IsSymlink report the node's type.
func (n *Node) IsDir() bool     { return n.Mode&0o170000 == 0o040000 }
func (n *Node) IsRegular() bool { return n.Mode&0o170000 == 0o100000 }
func (n *Node) IsSymlink() bool { return n.Mode&0o170000 == 0o120000 }

// ChunkRef is one entry of a manifest: Len raw bytes of chunk ID.
type ChunkRef struct {
	ID  ID
	Len uint32
}

// Manifest is a file's committed content: its chunks in file order. Extra holds
// format-specific data (a tensor index) that cas stores but does not interpret.
type Manifest struct {
	Chunks []ChunkRef
	Extra  []byte
}

// Size is the file size the manifest describes.
func (m *Manifest) Size() int64 {
	var s int64
	for _, c := range m.Chunks {
		s += int64(c.Len)
	}
	return s
}

const manifestVersion = 1

func (m *Manifest) marshal() []byte {
	b := make([]byte, 0, 1+10+len(m.Chunks)*(IDSize+5)+10+len(m.Extra))
	b = append(b, manifestVersion)
	b = binary.AppendUvarint(b, uint64(len(m.Chunks)))
	for _, c := range m.Chunks {
		b = binary.AppendUvarint(b, uint64(c.Len))
		b = append(b, c.ID[:]...)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Extra)))
	b = append(b, m.Extra...)
	return b
}

func unmarshalManifest(b []byte) (*Manifest, error) {
	if len(b) < 1 || b[0] != manifestVersion {
		return nil, errors.New("bad manifest version")
	}
	r := bytes.NewReader(b[1:])
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("manifest chunk count: %w", err)
	}
	if n > uint64(len(b))/(IDSize+1) {
		return nil, fmt.Errorf("manifest claims %d chunks in %d bytes", n, len(b))
	}
	m := &Manifest{Chunks: make([]ChunkRef, n)}
	for i := range m.Chunks {
		l, err := binary.ReadUvarint(r)
		if err != nil || l > maxChunkSize {
			return nil, fmt.Errorf("manifest chunk %d: bad length", i)
		}
		m.Chunks[i].Len = uint32(l)
		if _, err := r.Read(m.Chunks[i].ID[:]); err != nil {
			return nil, fmt.Errorf("manifest chunk %d: %w", i, err)
		}
	}
	el, err := binary.ReadUvarint(r)
	if err != nil || el > uint64(r.Len()) {
		return nil, errors.New("manifest extra: bad length")
	}
	if el > 0 {
		m.Extra = make([]byte, el)
		_, _ = r.Read(m.Extra) // length checked above
	}
	return m, nil
}

// ChunkInfo is the chunk index record of one stored chunk.
type ChunkInfo struct {
	RawLen    uint32
	StoredLen uint32 // size of the object file, header included
	Codec     Codec
}

func (c ChunkInfo) marshal() []byte {
	b := make([]byte, 0, 10)
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint32(b, c.RawLen)
	b = binary.LittleEndian.AppendUint32(b, c.StoredLen)
	return append(b, byte(c.Codec))
}

func unmarshalChunkInfo(b []byte) (ChunkInfo, error) {
	if len(b) != 10 || b[0] != 1 {
		return ChunkInfo{}, errors.New("bad chunk record")
	}
	return ChunkInfo{
		RawLen:    binary.LittleEndian.Uint32(b[1:]),
		StoredLen: binary.LittleEndian.Uint32(b[5:]),
		Codec:     Codec(b[9]),
	}, nil
}

func u64key(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func direntKey(parent uint64, name string) []byte {
	return append(u64key(parent), name...)
}

// Tx is a catalog transaction. It is valid only inside the function passed to
// Store.View or Store.Update; values it returns are copies the caller owns.
type Tx struct {
	tx     *bolt.Tx
	legacy bool // a format-1 store: records may be unsealed (record.go)

	// Each bucket is opened once, and a read transaction looks keys up
	// with one cursor per bucket: bbolt allocates a bucket and a cursor on
	// every Tx.Bucket and Get otherwise, and fsck and lookups make millions.
	buckets [cachedBuckets]*bolt.Bucket
	cursors [cachedBuckets]*bolt.Cursor
}

// cachedBuckets is how many of allBuckets a Tx keeps open.
const cachedBuckets = 6

// bucketIndex returns name's index in allBuckets if a Tx keeps it open, or -1.
func bucketIndex(name []byte) int {
	for i, b := range allBuckets[:min(cachedBuckets, len(allBuckets))] {
		if bytes.Equal(b, name) {
			return i
		}
	}
	return -1
}

func (t *Tx) b(name []byte) *bolt.Bucket {
	i := bucketIndex(name)
	if i < 0 {
		return t.tx.Bucket(name)
	}
	if t.buckets[i] == nil {
		t.buckets[i] = t.tx.Bucket(name)
	}
	return t.buckets[i]
}

// get returns the value of key in bucket name, as Bucket.Get does (nil for
// a missing key or a nested bucket).
func (t *Tx) get(name, key []byte) []byte {
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

func (t *Tx) counter(key []byte) int64 {
	v := t.b(bucketMeta).Get(key)
	if len(v) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

func (t *Tx) addCounter(key []byte, delta int64) error {
	if delta == 0 {
		return nil
	}
	return t.b(bucketMeta).Put(key, u64key(uint64(t.counter(key)+delta)))
}

// Node returns the node record of ino.
func (t *Tx) Node(ino uint64) (Node, bool, error) {
	key := u64key(ino)
	v := t.get(bucketNodes, key)
	if v == nil {
		return Node{}, false, nil
	}
	rec, err := t.openRecord(key, v)
	if err != nil {
		return Node{}, false, err
	}
	n, err := unmarshalNode(ino, rec)
	return n, err == nil, errDamaged(err)
}

// PutNode writes n, keeping the file and directory counters right.
func (t *Tx) PutNode(n Node) error {
	old, had, err := t.Node(n.Ino)
	if err != nil {
		return err
	}
	if err := t.countNode(old, had, -1); err != nil {
		return err
	}
	if err := t.countNode(n, true, +1); err != nil {
		return err
	}
	key := u64key(n.Ino)
	return t.b(bucketNodes).Put(key, sealRecord(key, n.marshal()))
}

func (t *Tx) countNode(n Node, exists bool, sign int64) error {
	switch {
	case !exists:
		return nil
	case n.IsRegular():
		if err := t.addCounter(keyFiles, sign); err != nil {
			return err
		}
		return t.addCounter(keyLogical, sign*n.Size)
	case n.IsDir():
		return t.addCounter(keyDirs, sign)
	}
	return nil
}

// DeleteNode removes ino's node record and manifest (not its directory entry).
func (t *Tx) DeleteNode(ino uint64) error {
	old, had, err := t.Node(ino)
	if err != nil || !had {
		return err
	}
	if err := t.countNode(old, true, -1); err != nil {
		return err
	}
	if err := t.b(bucketManifests).Delete(u64key(ino)); err != nil {
		return err
	}
	return t.b(bucketNodes).Delete(u64key(ino))
}

// Lookup returns the child ino named name in directory parent.
func (t *Tx) Lookup(parent uint64, name string) (uint64, bool) {
	key := direntKey(parent, name)
	rec, err := t.openRecord(key, t.get(bucketDirents, key))
	if len(rec) != 8 || err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint64(rec), true
}

// Link sets the directory entry parent/name to ino, replacing any previous one.
func (t *Tx) Link(parent uint64, name string, ino uint64) error {
	key := direntKey(parent, name)
	return t.b(bucketDirents).Put(key, sealRecord(key, u64key(ino)))
}

// Unlink removes the directory entry parent/name.
func (t *Tx) Unlink(parent uint64, name string) error {
	return t.b(bucketDirents).Delete(direntKey(parent, name))
}

// Children calls fn for each entry of directory parent, in name order.
func (t *Tx) Children(parent uint64, fn func(name string, ino uint64) error) error {
	prefix := u64key(parent)
	c := t.b(bucketDirents).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		rec, err := t.openRecord(k, v)
		if err != nil {
			return fmt.Errorf("dirent %d/%q: %w", parent, k[8:], err)
		}
		if len(rec) != 8 {
			return fmt.Errorf("dirent %d/%q: %w: bad record", parent, k[8:], ErrCatalogDamaged)
		}
		if err := fn(string(k[8:]), binary.BigEndian.Uint64(rec)); err != nil {
			return err
		}
	}
	return nil
}

// Manifest returns the committed manifest of file ino.
func (t *Tx) Manifest(ino uint64) (*Manifest, bool, error) {
	key := u64key(ino)
	v := t.get(bucketManifests, key)
	if v == nil {
		return nil, false, nil
	}
	rec, err := t.openRecord(key, v)
	if err != nil {
		return nil, false, fmt.Errorf("manifest of %d: %w", ino, err)
	}
	m, err := unmarshalManifest(rec)
	if err != nil {
		return nil, false, fmt.Errorf("manifest of %d: %w", ino, errDamaged(err))
	}
	return m, true, nil
}

// PutManifest stores m as the content of file ino. Every chunk it names must be
// in the chunk index or in a Batch committed by the same transaction.
func (t *Tx) PutManifest(ino uint64, m *Manifest) error {
	key := u64key(ino)
	return t.b(bucketManifests).Put(key, sealRecord(key, m.marshal()))
}

// ForEachManifest calls fn for every manifest in the catalog.
func (t *Tx) ForEachManifest(fn func(ino uint64, m *Manifest) error) error {
	return t.b(bucketManifests).ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("manifest key %x: %w", k, ErrCatalogDamaged)
		}
		rec, err := t.openRecord(k, v)
		if err != nil {
			return fmt.Errorf("manifest of %d: %w", binary.BigEndian.Uint64(k), err)
		}
		m, err := unmarshalManifest(rec)
		if err != nil {
			return fmt.Errorf("manifest of %d: %w", binary.BigEndian.Uint64(k), errDamaged(err))
		}
		return fn(binary.BigEndian.Uint64(k), m)
	})
}

// ForEachNode calls fn for every node record.
func (t *Tx) ForEachNode(fn func(n Node) error) error {
	return t.b(bucketNodes).ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("node key %x: %w", k, ErrCatalogDamaged)
		}
		rec, err := t.openRecord(k, v)
		if err != nil {
			return err
		}
		n, err := unmarshalNode(binary.BigEndian.Uint64(k), rec)
		if err != nil {
			return errDamaged(err)
		}
		return fn(n)
	})
}

// ForEachChunk calls fn for every chunk index row, in ID order.
func (t *Tx) ForEachChunk(fn func(id ID, c ChunkInfo) error) error {
	return t.ForEachChunkFrom(ID{}, fn)
}

// ForEachChunkFrom calls fn for every chunk index row from ID start on, in
// ID order, so that a long walk can be taken a transaction at a time.
func (t *Tx) ForEachChunkFrom(start ID, fn func(id ID, c ChunkInfo) error) error {
	c := t.b(bucketChunks).Cursor()
	for k, v := c.Seek(start[:]); k != nil; k, v = c.Next() {
		var id ID
		copy(id[:], k)
		rec, err := t.openRecord(k, v)
		if err != nil {
			return err
		}
		info, err := unmarshalChunkInfo(rec)
		if err != nil || len(k) != IDSize {
			return fmt.Errorf("chunk row %x: %w: bad record", k, ErrCatalogDamaged)
		}
		if err := fn(id, info); err != nil {
			return err
		}
	}
	return nil
}

// Chunk returns the index record of chunk id.
func (t *Tx) Chunk(id ID) (ChunkInfo, bool, error) {
	v := t.get(bucketChunks, id[:])
	if v == nil {
		return ChunkInfo{}, false, nil
	}
	rec, err := t.openRecord(id[:], v)
	if err != nil {
		return ChunkInfo{}, false, fmt.Errorf("chunk %v: %w", id, err)
	}
	c, err := unmarshalChunkInfo(rec)
	if err != nil {
		return c, false, fmt.Errorf("chunk %v: %w", id, errDamaged(err))
	}
	return c, true, nil
}

// putChunk adds chunk id to the index unless it is there already, and reports
// whether it added it.
func (t *Tx) putChunk(id ID, c ChunkInfo) (bool, error) {
	b := t.b(bucketChunks)
	if b.Get(id[:]) != nil {
		return false, nil
	}
	if err := b.Put(id[:], sealRecord(id[:], c.marshal())); err != nil {
		return false, err
	}
	if err := t.addCounter(keyChunks, 1); err != nil {
		return false, err
	}
	if err := t.addCounter(keyUnique, int64(c.RawLen)); err != nil {
		return false, err
	}
	return true, t.addCounter(keyStored, int64(c.StoredLen))
}

// Counts are the catalog's counters.
type Counts struct {
	Files        int64 `json:"files"`
	Dirs         int64 `json:"dirs"`
	LogicalBytes int64 `json:"logical_bytes"`
	UniqueBytes  int64 `json:"unique_bytes"`
	StoredBytes  int64 `json:"stored_bytes"`
	Chunks       int64 `json:"chunks"`
	// ReencodePending counts chunks stored raw that wait for a background
	// re-encode (reencode.go); ReencodePendingBytes is their raw size.
	ReencodePending      int64 `json:"reencode_pending"`
	ReencodePendingBytes int64 `json:"reencode_pending_bytes"`
	// DeltaChunks counts chunks stored as a delta against a base chunk
	// (deltaplan.go).
	DeltaChunks int64 `json:"delta_chunks"`
}

// Counts returns the catalog's counters.
func (t *Tx) Counts() Counts {
	return Counts{
		Files:        t.counter(keyFiles),
		Dirs:         t.counter(keyDirs),
		LogicalBytes: t.counter(keyLogical),
		UniqueBytes:  t.counter(keyUnique),
		StoredBytes:  t.counter(keyStored),
		Chunks:       t.counter(keyChunks),

		ReencodePending:      t.counter(keyReencodeChunks),
		ReencodePendingBytes: t.counter(keyReencodeBytes),
		DeltaChunks:          t.counter(keyDeltaChunks),
	}
}
