package catalog

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Packs (store format 6). A pack is one object holding the objects of many
// small chunks back to back (cas's doc has the design). The packs bucket
// has a row per committed pack:
//
//	pack ID → sealed(1 | size u64 | live chunks u32 | live bytes u64)
//
// size is the pack object's length; live chunks and live bytes count the
// index rows that name the pack and their StoredLen. Index.Add and
// Index.Delete keep them right in the transaction that adds or removes a
// packed row, and Index.Delete removes the pack's row with its last chunk:
// a pack without a row is garbage (cas deletes its object). The meta
// counters pack_bytes (Σ size) and packed_bytes (Σ live bytes) make the
// space held by dead chunks in live packs (their difference) O(1) to read.
var (
	bucketPacks    = []byte("packs")
	keyPackBytes   = []byte("pack_bytes")
	keyPackedBytes = []byte("packed_bytes")
	keyPacks       = []byte("packs")
)

// PackInfo is a pack's row.
type PackInfo struct {
	Size      int64 // bytes of the pack object
	Live      int   // index rows naming the pack
	LiveBytes int64 // their objects' bytes
}

func (p PackInfo) marshal() []byte {
	b := make([]byte, 0, 21)
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(p.Live))
	return binary.LittleEndian.AppendUint64(b, uint64(p.LiveBytes))
}

func unmarshalPackInfo(b []byte) (PackInfo, error) {
	if len(b) != 21 || b[0] != 1 {
		return PackInfo{}, errors.New("bad pack record")
	}
	return PackInfo{
		Size:      int64(binary.LittleEndian.Uint64(b[1:])),
		Live:      int(binary.LittleEndian.Uint32(b[9:])),
		LiveBytes: int64(binary.LittleEndian.Uint64(b[13:])),
	}, nil
}

// Pack returns pack id's row; ok is false when the pack has none.
func (t *Tx) Pack(id ID) (PackInfo, bool, error) {
	if t.b(bucketPacks) == nil { // an older store opened read-only
		return PackInfo{}, false, nil
	}
	v := t.get(bucketPacks, id[:])
	if v == nil {
		return PackInfo{}, false, nil
	}
	rec, err := t.openRecord(id[:], v)
	if err != nil {
		return PackInfo{}, false, fmt.Errorf("pack %v: %w", id, err)
	}
	p, err := unmarshalPackInfo(rec)
	if err != nil {
		return PackInfo{}, false, fmt.Errorf("pack %v: %w", id, errDamaged(err))
	}
	return p, true, nil
}

// ForEachPack calls fn for every pack row, in ID order.
func (t *Tx) ForEachPack(fn func(id ID, p PackInfo) error) error {
	b := t.b(bucketPacks)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		var id ID
		copy(id[:], k)
		rec, err := t.openRecord(k, v)
		if err != nil {
			return err
		}
		p, err := unmarshalPackInfo(rec)
		if err != nil || len(k) != IDSize {
			return fmt.Errorf("pack row %x: %w: bad record", k, ErrCatalogDamaged)
		}
		if err := fn(id, p); err != nil {
			return err
		}
	}
	return nil
}

// AddPack records pack id, size bytes long, with no live chunks yet (the
// Index.Add of its chunks, in the same transaction, counts them), and moves
// the store to format 6. A pack already recorded is an error: a pack is
// written and committed once.
func (x Index) AddPack(id ID, size int64) error {
	t := x.t
	if _, ok, err := t.Pack(id); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("pack %v is recorded already", id)
	}
	if err := t.putPack(id, PackInfo{Size: size}); err != nil {
		return err
	}
	if err := t.addCounter(keyPacks, 1); err != nil {
		return err
	}
	if err := t.addCounter(keyPackBytes, size); err != nil {
		return err
	}
	if f := t.Format(); f != 0 && f < formatPacks {
		return t.setFormat(formatPacks)
	}
	return nil
}

// DropPack removes pack id's row (a pack none of whose chunks the commit
// that wrote it indexed: each was indexed elsewhere first).
func (x Index) DropPack(id ID) error {
	t := x.t
	p, ok, err := t.Pack(id)
	if err != nil || !ok {
		return err
	}
	if p.Live != 0 {
		return fmt.Errorf("drop pack %v: %d chunks still in it", id, p.Live)
	}
	return t.dropPack(id, p)
}

func (t *Tx) dropPack(id ID, p PackInfo) error {
	if err := t.b(bucketPacks).Delete(id[:]); err != nil {
		return err
	}
	if err := t.addCounter(keyPacks, -1); err != nil {
		return err
	}
	return t.addCounter(keyPackBytes, -p.Size)
}

func (t *Tx) putPack(id ID, p PackInfo) error {
	return t.b(bucketPacks).Put(id[:], sealRecord(id[:], p.marshal()))
}

// packChunk counts a packed chunk's row in or out (n = 1 or -1) of its
// pack's row, removing the row when its last chunk goes.
func (t *Tx) packChunk(c ChunkInfo, n int) error {
	p, ok, err := t.Pack(c.Pack)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: chunk row names pack %v, which has no row", ErrCatalogDamaged, c.Pack)
	}
	if end := int64(c.Offset) + int64(c.StoredLen); end > p.Size {
		return fmt.Errorf("%w: chunk at %d+%d past the end of pack %v (%d bytes)", ErrCatalogDamaged, c.Offset, c.StoredLen, c.Pack, p.Size)
	}
	p.Live += n
	p.LiveBytes += int64(n) * int64(c.StoredLen)
	if err := t.addCounter(keyPackedBytes, int64(n)*int64(c.StoredLen)); err != nil {
		return err
	}
	if p.Live <= 0 {
		return t.dropPack(c.Pack, p)
	}
	return t.putPack(c.Pack, p)
}
