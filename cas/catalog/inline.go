package catalog

import (
	"fmt"
)

// Inline chunks (store format 7). A small chunk may be stored in the
// catalog itself instead of in an object file or a pack, so that the commit
// of a small file writes no file and waits for no fdatasync but the
// transaction's own (cas's doc, "Inline chunks", has the decisions). Its
// index row is record version 3 (the 10 bytes of version 1: raw length,
// stored length, codec) and the inline bucket holds its object:
//
//	chunk ID → sealed(object)
//
// the same bytes an object file would hold (header, payload, CRC), checked
// like any object when read. Index.AddInline writes both, Index.Delete
// removes both, in one transaction: an inline row without its object, or
// an object without its row, is damage (fsck names it). The meta counters
// inline_chunks and inline_bytes (Σ object bytes) say how much of the
// catalog they take.
var (
	bucketInline    = []byte("inline")
	keyInlineChunks = []byte("inline_chunks")
	keyInlineBytes  = []byte("inline_bytes")
)

// inlineRecVersion is the chunk record version of an inline chunk.
const inlineRecVersion = 3

// AddInline is Add for a chunk stored inline: c.Inline must be set and obj
// is its object (c.StoredLen bytes). It moves the store to format 7. A
// chunk already indexed (in any form) is left as it is and reported not
// added: its bytes are not stored twice.
func (x Index) AddInline(id ID, c ChunkInfo, obj []byte) (bool, error) {
	t := x.t
	if !c.Inline || c.Packed() || int(c.StoredLen) != len(obj) {
		return false, fmt.Errorf("inline chunk %v: bad record (%d stored bytes, object of %d)", id, c.StoredLen, len(obj))
	}
	b := t.b(bucketInline)
	if b == nil {
		return false, fmt.Errorf("inline chunk %v: the catalog has no inline bucket", id)
	}
	added, err := x.Add(id, c)
	if err != nil || !added {
		return false, err
	}
	if err := b.Put(id[:], sealRecord(id[:], obj)); err != nil {
		return false, err
	}
	if err := t.addCounter(keyInlineChunks, 1); err != nil {
		return false, err
	}
	if err := t.addCounter(keyInlineBytes, int64(len(obj))); err != nil {
		return false, err
	}
	if f := t.Format(); f != 0 && f < formatInline {
		return true, t.setFormat(formatInline)
	}
	return true, nil
}

// dropInline removes inline chunk id's object (Index.Delete).
func (t *Tx) dropInline(id ID, c ChunkInfo) error {
	b := t.b(bucketInline)
	if b == nil || b.Get(id[:]) == nil {
		return fmt.Errorf("%w: inline chunk %v has no object in the catalog", ErrCatalogDamaged, id)
	}
	if err := b.Delete(id[:]); err != nil {
		return err
	}
	if err := t.addCounter(keyInlineChunks, -1); err != nil {
		return err
	}
	return t.addCounter(keyInlineBytes, -int64(c.StoredLen))
}

// InlineObject appends inline chunk id's object to buf[:0] and returns it;
// ok is false when the catalog holds no object for id. The bytes are a copy
// (bbolt's are valid only inside the transaction), not verified beyond the
// record's checksum: the caller decodes and hashes them like any object.
func (t *Tx) InlineObject(id ID, buf []byte) (obj []byte, ok bool, err error) {
	b := t.b(bucketInline)
	if b == nil {
		return nil, false, nil
	}
	v := b.Get(id[:])
	if v == nil {
		return nil, false, nil
	}
	rec, err := t.openRecord(id[:], v)
	if err != nil {
		return nil, false, fmt.Errorf("inline chunk %v: %w", id, err)
	}
	return append(buf[:0], rec...), true, nil
}

// ForEachInline calls fn for the ID of every object of the inline bucket
// (fsck: an object without its index row is damage), in ID order.
func (t *Tx) ForEachInline(fn func(id ID, size int) error) error {
	b := t.b(bucketInline)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != IDSize {
			return fmt.Errorf("inline row %x: %w: bad key", k, ErrCatalogDamaged)
		}
		var id ID
		copy(id[:], k)
		if err := fn(id, max(0, len(v)-5)); err != nil {
			return err
		}
	}
	return nil
}
