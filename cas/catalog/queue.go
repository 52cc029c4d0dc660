package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// PendingReencode is one row of the re-encode queue.
type PendingReencode struct {
	Hint   Hint   // what the chunk holds, as the Put that stored it said
	RawLen uint32 // the chunk's raw length, counted in Counts.ReencodePendingBytes
}

const pendingRecordVersion = 1

func (p PendingReencode) marshal() []byte {
	elem := p.Hint.ElemSize
	if elem < 0 || elem > 255 {
		elem = 0 // no such element width: store as "unknown", which a hint may always be
	}
	b := make([]byte, 0, 6)
	b = append(b, pendingRecordVersion, byte(elem))
	return binary.LittleEndian.AppendUint32(b, p.RawLen)
}

func unmarshalPending(b []byte) (PendingReencode, error) {
	if len(b) != 6 || b[0] != pendingRecordVersion {
		return PendingReencode{}, errors.New("bad re-encode queue record")
	}
	return PendingReencode{Hint: Hint{ElemSize: int(b[1])}, RawLen: binary.LittleEndian.Uint32(b[2:])}, nil
}

// pending decodes the sealed queue row v of key.
func (t *raw) pending(key, v []byte) (PendingReencode, error) {
	rec, err := t.openRecord(key, v)
	if err != nil {
		return PendingReencode{}, err
	}
	p, err := unmarshalPending(rec)
	return p, errDamaged(err)
}

// Queue writes the re-encode queue: chunk ID → hint and raw length of a
// chunk stored raw that waits for its encoding (cas's reencode.go has the
// rules). Each write keeps the queue's counters right. Only the store's own
// bookkeeping writes these rows; Tx.PendingReencode and
// Tx.ForEachPendingReencode read them.
type Queue struct{ t *Tx }

// Queue returns the re-encode queue's writes in t.
func (t *Tx) Queue() Queue { return Queue{t} }

// Add adds chunk id to the re-encode queue.
func (q Queue) Add(id ID, h Hint, rawLen uint32) error {
	t := q.t
	b := t.b(bucketReencode)
	if b == nil {
		return errors.New("catalog has no re-encode queue")
	}
	if b.Get(id[:]) == nil {
		if err := t.addCounter(keyReencodeChunks, 1); err != nil {
			return err
		}
		if err := t.addCounter(keyReencodeBytes, int64(rawLen)); err != nil {
			return err
		}
	}
	return b.Put(id[:], sealRecord(id[:], PendingReencode{Hint: h, RawLen: rawLen}.marshal()))
}

// Remove removes chunk id's queue row, if it has one.
func (q Queue) Remove(id ID) error {
	t := q.t
	b := t.b(bucketReencode)
	if b == nil {
		return nil
	}
	v := b.Get(id[:])
	if v == nil {
		return nil
	}
	p, err := t.pending(id[:], v)
	if err != nil {
		return fmt.Errorf("chunk %v: %w", id, err)
	}
	if err := t.addCounter(keyReencodeChunks, -1); err != nil {
		return err
	}
	if err := t.addCounter(keyReencodeBytes, -int64(p.RawLen)); err != nil {
		return err
	}
	return b.Delete(id[:])
}

// PendingReencode returns chunk id's re-encode queue row.
func (t *Tx) PendingReencode(id ID) (PendingReencode, bool, error) {
	b := t.b(bucketReencode)
	if b == nil {
		return PendingReencode{}, false, nil
	}
	v := b.Get(id[:])
	if v == nil {
		return PendingReencode{}, false, nil
	}
	p, err := t.pending(id[:], v)
	if err != nil {
		return p, false, fmt.Errorf("chunk %v: %w", id, err)
	}
	return p, true, nil
}

// ForEachPendingReencode calls fn for every row of the re-encode queue.
func (t *Tx) ForEachPendingReencode(fn func(id ID, p PendingReencode) error) error {
	b := t.b(bucketReencode)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		p, err := t.pending(k, v)
		if err != nil || len(k) != IDSize {
			return fmt.Errorf("re-encode row %x: bad record", k)
		}
		return fn(ID(k), p)
	})
}

// Next returns up to n queued chunks after key after (nil: from the
// start), wrapping around once, and whether rows remain beyond them.
func (q Queue) Next(after []byte, n int) (ids []ID, more bool, err error) {
	t := q.t
	b := t.b(bucketReencode)
	if b == nil {
		return nil, false, nil
	}
	c := b.Cursor()
	k, _ := c.Seek(after)
	if k != nil && after != nil && bytes.Equal(k, after) {
		k, _ = c.Next()
	}
	wrapped := false
	for len(ids) < n {
		if k == nil {
			if wrapped {
				break
			}
			wrapped = true
			k, _ = c.First()
			continue
		}
		if len(k) != IDSize {
			return nil, false, fmt.Errorf("re-encode row %x: bad key", k)
		}
		if len(ids) > 0 && ID(k) == ids[0] {
			break // came round to the first
		}
		ids = append(ids, ID(k))
		k, _ = c.Next()
	}
	return ids, t.counter(keyReencodeChunks) > int64(len(ids)), nil
}
