package catalog

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Tx is a catalog transaction. It is valid only inside the function passed to
// DB.View or DB.Update (Store.View, Store.Update); values it returns are
// copies the caller owns.
//
// Its methods are the typed rows: the namespace (nodes, directory entries),
// manifests, the chunk index, delta rows and the re-encode queue. The rows
// that only the store's own bookkeeping writes are reached through Index,
// Queue, Deltas and Uploads.
type Tx struct {
	raw
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

// PutNode writes n, keeping the file and directory counters right. The
// link count is the record's own: n.Nlink is ignored, and a new node has
// one name (AddLink and DropLink change it).
func (t *Tx) PutNode(n Node) error {
	old, had, err := t.Node(n.Ino)
	if err != nil {
		return err
	}
	n.Nlink = 1
	if had && !n.IsDir() {
		n.Nlink = old.Nlink
	}
	return t.putNode(old, had, n)
}

func (t *Tx) putNode(old Node, had bool, n Node) error {
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

// AddLink counts one more name of node ino (the caller adds the directory
// entry), sets its ctime to now, and moves the store to formatLinks. It
// returns the new count. Directories have no links.
func (t *Tx) AddLink(ino uint64, now int64) (uint32, error) {
	n, ok, err := t.Node(ino)
	if err != nil {
		return 0, err
	}
	if !ok || n.IsDir() {
		return 0, fmt.Errorf("link node %d: not a linkable node", ino)
	}
	if n.Nlink >= MaxLinks {
		return 0, fmt.Errorf("link node %d: %w", ino, ErrTooManyLinks)
	}
	n.Nlink++
	n.Ctime = max(n.Ctime, now)
	if f := t.Format(); f != 0 && f < formatLinks {
		if err := t.setFormat(formatLinks); err != nil {
			return 0, err
		}
	}
	return n.Nlink, t.putNode(n, true, n)
}

// DropLink counts one name less of node ino (the caller removes the
// directory entry): at the last, the node and its manifest are deleted; else
// its ctime is set to now. It returns the names left. A directory, or a node
// that does not exist, has none left.
func (t *Tx) DropLink(ino uint64, now int64) (uint32, error) {
	n, ok, err := t.Node(ino)
	if err != nil || !ok {
		return 0, err
	}
	if n.IsDir() || n.Nlink <= 1 {
		return 0, t.DeleteNode(ino)
	}
	n.Nlink--
	n.Ctime = max(n.Ctime, now)
	return n.Nlink, t.putNode(n, true, n)
}

// DeleteNode removes ino's node record and manifest (not its directory
// entries), whatever its link count.
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
	if err := t.putHoleBytes(ino, 0); err != nil {
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
	if err := t.b(bucketDirents).Put(key, sealRecord(key, u64key(ino))); err != nil {
		return err
	}
	return t.linkOrder(parent, name, ino)
}

// Unlink removes the directory entry parent/name.
func (t *Tx) Unlink(parent uint64, name string) error {
	if err := t.b(bucketDirents).Delete(direntKey(parent, name)); err != nil {
		return err
	}
	if err := t.dropLinked(parent, name); err != nil {
		return err
	}
	return t.unlinkOrder(parent, name)
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
		t.walked++
		if err := fn(string(k[8:]), binary.BigEndian.Uint64(rec)); err != nil {
			return err
		}
	}
	return nil
}

// Walked is how many directory rows Children and PrevSibling have read in
// this transaction: what its listings cost (a commit's search for a delta
// base reads a few, whatever the directory's size: issue #27).
func (t *Tx) Walked() int { return t.walked }

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
	m, err := ParseManifest(rec)
	if err != nil {
		return nil, false, fmt.Errorf("manifest of %d: %w", ino, errDamaged(err))
	}
	return m, true, nil
}

// PutManifest stores m as the content of file ino. Every chunk it names must be
// in the chunk index or in a Batch committed by the same transaction. The
// first manifest with holes moves the store to formatHoles.
func (t *Tx) PutManifest(ino uint64, m *Manifest) error {
	key := u64key(ino)
	if err := t.b(bucketManifests).Put(key, sealRecord(key, m.Marshal())); err != nil {
		return err
	}
	if err := t.putHoleBytes(ino, m.HoleBytes()); err != nil {
		return err
	}
	if f := t.Format(); len(m.Holes) > 0 && f != 0 && f < formatHoles {
		return t.setFormat(formatHoles)
	}
	return nil
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
		m, err := ParseManifest(rec)
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

// Counts are the catalog's counters.
type Counts struct {
	Files        int64 `json:"files"`
	Dirs         int64 `json:"dirs"`
	LogicalBytes int64 `json:"logical_bytes"`
	UniqueBytes  int64 `json:"unique_bytes"`
	StoredBytes  int64 `json:"stored_bytes"`
	Chunks       int64 `json:"chunks"`
	// ReencodePending counts chunks stored raw that wait for a background
	// re-encode (queue.go); ReencodePendingBytes is their raw size.
	ReencodePending      int64 `json:"reencode_pending"`
	ReencodePendingBytes int64 `json:"reencode_pending_bytes"`
	// DeltaChunks counts chunks stored as a delta against a base chunk
	// (deltas.go).
	DeltaChunks int64 `json:"delta_chunks"`
	// DeltaWaiting counts chunks whose delta plan waits for a later
	// version (the latest save's changed chunks: deltas.go, DeltaWait).
	DeltaWaiting int64 `json:"delta_waiting"`
	// Packs counts committed packs (packs.go); PackBytes is their size, and
	// PackedBytes the part of it live chunks hold (the rest is dead chunks
	// a collection cannot free until the whole pack is dead).
	Packs       int64 `json:"packs"`
	PackBytes   int64 `json:"pack_bytes"`
	PackedBytes int64 `json:"packed_bytes"`
	// InlineChunks counts chunks stored inline in the catalog (inline.go),
	// InlineBytes their objects' bytes.
	InlineChunks int64 `json:"inline_chunks"`
	InlineBytes  int64 `json:"inline_bytes"`
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
		DeltaWaiting:         t.counter(keyDeltaWaiting),
		Packs:                t.counter(keyPacks),
		PackBytes:            t.counter(keyPackBytes),
		PackedBytes:          t.counter(keyPackedBytes),
		InlineChunks:         t.counter(keyInlineChunks),
		InlineBytes:          t.counter(keyInlineBytes),
	}
}

// Format is the catalog's format version as this transaction sees it (0
// when unreadable).
func (t *Tx) Format() int {
	meta := t.b(bucketMeta)
	v := meta.Get(keyFormatAtRest)
	if v == nil {
		v = meta.Get(keyFormat)
	}
	if len(v) == 4 {
		return int(binary.BigEndian.Uint32(v))
	}
	return 0
}

// setFormat moves the store to format f: the format at rest while a log
// may exist (wal.go), the catalog's format otherwise.
func (t *Tx) setFormat(f int) error {
	meta := t.b(bucketMeta)
	key := keyFormat
	if meta.Get(keyFormatAtRest) != nil {
		key = keyFormatAtRest
	}
	return meta.Put(key, binary.BigEndian.AppendUint32(nil, uint32(f)))
}

// OnCommit runs fn after the transaction commits, and never if it does not.
func (t *Tx) OnCommit(fn func()) { t.tx.OnCommit(fn) }

// StoreID returns the store's identity, "" when it has none yet.
func (t *Tx) StoreID() string { return string(t.b(bucketMeta).Get(keyStoreID)) }

// SetStoreID gives the store identity id unless it has one already, and
// returns the identity it has.
func (t *Tx) SetStoreID(id string) (string, error) {
	if v := t.b(bucketMeta).Get(keyStoreID); v != nil {
		return string(v), nil
	}
	return id, t.b(bucketMeta).Put(keyStoreID, []byte(id))
}
