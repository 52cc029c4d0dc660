package catalog

import "fmt"

// Index writes the chunk index: a batch's commit adds rows, a sweep deletes
// them, a re-encode changes how a chunk is stored. Each write keeps the
// counters (chunks, unique and stored bytes) right in the same transaction.
// Only the store's own bookkeeping writes these rows; Tx.Chunk and
// Tx.ForEachChunk read them.
type Index struct{ t *Tx }

// Index returns the chunk index's writes in t.
func (t *Tx) Index() Index { return Index{t} }

// Add adds chunk id to the index unless it is there already, and reports
// whether it added it.
func (x Index) Add(id ID, c ChunkInfo) (bool, error) {
	t := x.t
	b := t.b(bucketChunks)
	if b.Get(id[:]) != nil {
		return false, nil
	}
	if c.Packed() {
		if err := t.packChunk(c, 1); err != nil {
			return false, err
		}
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

// Delete removes chunk id's index row (whose record is c) and its share of
// the counters. A packed chunk's pack row loses it, and goes with its last
// chunk (the caller deletes the pack object after the transaction); an
// inline chunk's object goes with its row.
func (x Index) Delete(id ID, c ChunkInfo) error {
	t := x.t
	if c.Packed() {
		if err := t.packChunk(c, -1); err != nil {
			return err
		}
	}
	if c.Inline {
		if err := t.dropInline(id, c); err != nil {
			return err
		}
	}
	if err := t.b(bucketChunks).Delete(id[:]); err != nil {
		return err
	}
	if err := t.addCounter(keyChunks, -1); err != nil {
		return err
	}
	if err := t.addCounter(keyUnique, -int64(c.RawLen)); err != nil {
		return err
	}
	return t.addCounter(keyStored, -int64(c.StoredLen))
}

// SetStored records that chunk id's object is now storedLen bytes under
// codec, keeping the stored-bytes counter right. A chunk not in the index
// is left out.
func (x Index) SetStored(id ID, storedLen uint32, codec Codec) error {
	t := x.t
	cur, ok, err := t.Chunk(id)
	if err != nil || !ok {
		return err
	}
	if cur.Packed() {
		return fmt.Errorf("chunk %v is in pack %v: its stored form does not change", id, cur.Pack)
	}
	if cur.Inline {
		return fmt.Errorf("chunk %v is inline: its stored form does not change", id)
	}
	next := ChunkInfo{RawLen: cur.RawLen, StoredLen: storedLen, Codec: codec}
	if err := t.b(bucketChunks).Put(id[:], sealRecord(id[:], next.marshal())); err != nil {
		return err
	}
	return t.addCounter(keyStored, int64(next.StoredLen)-int64(cur.StoredLen))
}
