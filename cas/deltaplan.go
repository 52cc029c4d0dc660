package cas

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Writing deltas (issue #15). Who decides what, and the rows that say so:
//
//   - The filesystem knows which chunk a new chunk is likely close to (the
//     same tensor range in the file's previous version, or in the same file
//     of the previous step directory) and says so with Batch.SuggestBase
//     before it commits. cas decides the rest.
//   - The commit that indexes a new chunk with a suggestion turns it into a
//     plan, in the same transaction: the bucket "deltaplans" (chunk → base,
//     distance), and a re-encode queue row. The base is the suggested
//     chunk's own base when that chunk is (or is planned to be) a delta, so
//     that every delta of a run points at one standalone keyframe, at a
//     distance one more than the suggestion's; at distance Options.
//     DeltaKeyframe the new chunk gets no plan and becomes the next
//     keyframe. Depth 1 therefore holds by construction, and is checked
//     again when the delta is written.
//   - The re-encoder (reencode.go) carries a plan out: it encodes the chunk
//     against its (verified) base and keeps the delta only when it is
//     smaller than the best standalone encoding by more than 1/32. Before
//     it renames the delta object into place it commits the delta's rows:
//     "deltas" (chunk → base, distance) and the reverse index "bases"
//     (base ‖ chunk), and moves the store to format 3 (an older ckptfs
//     refuses the store rather than sweep a base it does not know is used).
//     A crash after that transaction and before the rename leaves a delta
//     row over a standalone object: harmless (the base is kept a little
//     longer), the queue row is still there, and the next re-encode of the
//     chunk settles it either way.
//   - A base is never swept while any delta row names it (Sweep checks
//     "bases" in its transaction), so no delta loses its base whatever the
//     collector marked; a sweep that deletes a delta and its base deletes
//     the delta's rows and object first.
//   - A delta is written only against a base that has no delta row, and
//     only for a chunk that is no delta's base: both checked in the
//     transaction that writes the rows, and re-encodes are serialised.
var (
	bucketDeltaPlans = []byte("deltaplans")
	bucketDeltas     = []byte("deltas")
	bucketBases      = []byte("bases")
)

// keyDeltaChunks counts the rows of "deltas".
var keyDeltaChunks = []byte("delta_chunks")

// DefaultDeltaKeyframe is Options.DeltaKeyframe's default: a delta chain
// restarts with a standalone chunk every fifth version. Measured on
// test/delta/workload.py at the codec level (stored ÷ logical, bf16/fp32):
// keyframe 2: .475/.739, 3: .438/.721, 4: .419/.712, 5: .416/.711,
// 10: .436/.721, 20: .496/.750 — farther deltas code worse, nearer
// keyframes cost more standalone chunks; 5 is the minimum for both.
const DefaultDeltaKeyframe = 5

// deltaLink is a plan or delta row: the base chunk and the distance from it
// in versions (1 for the version right after the base).
type deltaLink struct {
	Base ID
	Dist uint8
}

const deltaLinkVersion = 1

func (l deltaLink) marshal() []byte {
	b := make([]byte, 0, 2+IDSize)
	b = append(b, deltaLinkVersion)
	b = append(b, l.Base[:]...)
	return append(b, l.Dist)
}

func unmarshalDeltaLink(b []byte) (deltaLink, error) {
	if len(b) != 2+IDSize || b[0] != deltaLinkVersion || b[1+IDSize] == 0 {
		return deltaLink{}, errors.New("bad delta record")
	}
	var l deltaLink
	copy(l.Base[:], b[1:])
	l.Dist = b[1+IDSize]
	return l, nil
}

// link reads chunk id's row in bucket name.
func (t *Tx) link(name []byte, id ID) (deltaLink, bool, error) {
	b := t.b(name)
	if b == nil {
		return deltaLink{}, false, nil
	}
	v := b.Get(id[:])
	if v == nil {
		return deltaLink{}, false, nil
	}
	rec, err := t.openRecord(id[:], v)
	if err != nil {
		return deltaLink{}, false, fmt.Errorf("chunk %v: %w", id, err)
	}
	l, err := unmarshalDeltaLink(rec)
	if err != nil {
		return l, false, fmt.Errorf("chunk %v: %w", id, errDamaged(err))
	}
	return l, true, nil
}

// Delta returns chunk id's delta row: the base its object is coded against.
func (t *Tx) Delta(id ID) (base ID, dist int, ok bool, err error) {
	l, ok, err := t.link(bucketDeltas, id)
	return l.Base, int(l.Dist), ok, err
}

// DeltaPlan returns chunk id's plan: the base the re-encoder will try.
func (t *Tx) DeltaPlan(id ID) (base ID, dist int, ok bool, err error) {
	l, ok, err := t.link(bucketDeltaPlans, id)
	return l.Base, int(l.Dist), ok, err
}

// ForEachDelta calls fn for every delta row.
func (t *Tx) ForEachDelta(fn func(id, base ID, dist int) error) error {
	return t.forEachLink(bucketDeltas, fn)
}

// ForEachDeltaPlan calls fn for every plan row.
func (t *Tx) ForEachDeltaPlan(fn func(id, base ID, dist int) error) error {
	return t.forEachLink(bucketDeltaPlans, fn)
}

func (t *Tx) forEachLink(name []byte, fn func(id, base ID, dist int) error) error {
	b := t.b(name)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if len(k) != IDSize {
			return fmt.Errorf("%s row %x: %w: bad key", name, k, ErrCatalogDamaged)
		}
		rec, err := t.openRecord(k, v)
		if err != nil {
			return err
		}
		l, err := unmarshalDeltaLink(rec)
		if err != nil {
			return fmt.Errorf("%s row %x: %w", name, k, errDamaged(err))
		}
		return fn(ID(k), l.Base, int(l.Dist))
	})
}

// IsBase reports whether some delta row names chunk id as its base.
func (t *Tx) IsBase(id ID) bool {
	b := t.b(bucketBases)
	if b == nil {
		return false
	}
	k, _ := b.Cursor().Seek(id[:])
	return k != nil && bytes.HasPrefix(k, id[:])
}

// ForEachDeltaOf calls fn for every delta whose row names chunk base as its
// base (a prefix scan of the reverse index).
func (t *Tx) ForEachDeltaOf(base ID, fn func(delta ID) error) error {
	b := t.b(bucketBases)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.Seek(base[:]); k != nil && bytes.HasPrefix(k, base[:]); k, v = c.Next() {
		if len(k) != 2*IDSize {
			return fmt.Errorf("bases row %x: %w: bad key", k, ErrCatalogDamaged)
		}
		if _, err := t.openRecord(k, v); err != nil {
			return err
		}
		if err := fn(ID(k[IDSize:])); err != nil {
			return err
		}
	}
	return nil
}

// ForEachBaseRow calls fn for every row of the reverse index.
func (t *Tx) ForEachBaseRow(fn func(base, delta ID) error) error {
	b := t.b(bucketBases)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if len(k) != 2*IDSize {
			return fmt.Errorf("bases row %x: %w: bad key", k, ErrCatalogDamaged)
		}
		if _, err := t.openRecord(k, v); err != nil {
			return err
		}
		return fn(ID(k[:IDSize]), ID(k[IDSize:]))
	})
}

// HasBaseRow reports whether the reverse index holds base ‖ delta.
func (t *Tx) HasBaseRow(base, delta ID) bool {
	b := t.b(bucketBases)
	return b != nil && b.Get(append(bytes.Clone(base[:]), delta[:]...)) != nil
}

// planDelta turns a suggestion (new chunk id, of rawLen bytes, is likely
// close to chunk prev) into a plan, when that can give a delta of depth 1
// within keyframe versions. Called by commitBatch for chunks its
// transaction indexes.
func (t *Tx) planDelta(id, prev ID, h Hint, rawLen uint32, keyframe int) error {
	if keyframe < 2 || id == prev || rawLen == 0 {
		return nil
	}
	plans := t.b(bucketDeltaPlans)
	if plans == nil {
		return nil // a catalog opened before the bucket existed: no plans
	}
	pinfo, ok, err := t.Chunk(prev)
	if err != nil || !ok || pinfo.RawLen != rawLen {
		return err
	}
	l := deltaLink{Base: prev, Dist: 1}
	if d, ok, err := t.link(bucketDeltas, prev); err != nil {
		return err
	} else if ok {
		l = deltaLink{Base: d.Base, Dist: d.Dist + 1}
	} else if p, ok, err := t.link(bucketDeltaPlans, prev); err != nil {
		return err
	} else if ok {
		l = deltaLink{Base: p.Base, Dist: p.Dist + 1}
	}
	if int(l.Dist) >= keyframe || l.Base == id {
		return nil // id starts a new chain
	}
	if l.Base != prev {
		if _, ok, err := t.Chunk(l.Base); err != nil || !ok {
			return err
		}
	}
	if err := plans.Put(id[:], sealRecord(id[:], l.marshal())); err != nil {
		return err
	}
	return t.queueReencode(id, h, rawLen)
}

// dropPlan removes chunk id's plan row, if any.
func (t *Tx) dropPlan(id ID) error {
	if b := t.b(bucketDeltaPlans); b != nil {
		return b.Delete(id[:])
	}
	return nil
}

// putDelta records that chunk id's object is (about to be) a delta against
// base: its delta row, the reverse row, the counter, and format 3. It
// refuses a base that is itself a delta, and a chunk that is a base.
func (t *Tx) putDelta(id ID, l deltaLink) error {
	if _, ok, err := t.link(bucketDeltas, l.Base); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("chunk %v: base %v is a delta itself: %w", id, l.Base, errDeltaRefused)
	}
	if t.IsBase(id) {
		return fmt.Errorf("chunk %v is the base of other deltas: %w", id, errDeltaRefused)
	}
	if _, ok, err := t.Chunk(l.Base); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("chunk %v: base %v is not indexed: %w", id, l.Base, errDeltaRefused)
	}
	deltas, bases := t.b(bucketDeltas), t.b(bucketBases)
	if deltas == nil || bases == nil {
		return errors.New("catalog has no delta buckets")
	}
	if old, ok, err := t.link(bucketDeltas, id); err != nil {
		return err
	} else if ok {
		if old == l {
			return nil
		}
		if err := t.dropDelta(id); err != nil {
			return err
		}
	}
	if err := deltas.Put(id[:], sealRecord(id[:], l.marshal())); err != nil {
		return err
	}
	k := append(bytes.Clone(l.Base[:]), id[:]...)
	if err := bases.Put(k, sealRecord(k, nil)); err != nil {
		return err
	}
	if err := t.addCounter(keyDeltaChunks, 1); err != nil {
		return err
	}
	if f := t.format(); f != 0 && f < formatDeltas {
		return t.b(bucketMeta).Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatDeltas))
	}
	return nil
}

// dropDelta removes chunk id's delta row and its reverse row, if any.
func (t *Tx) dropDelta(id ID) error {
	l, ok, err := t.link(bucketDeltas, id)
	if err != nil || !ok {
		return err
	}
	if err := t.b(bucketDeltas).Delete(id[:]); err != nil {
		return err
	}
	if err := t.b(bucketBases).Delete(append(bytes.Clone(l.Base[:]), id[:]...)); err != nil {
		return err
	}
	return t.addCounter(keyDeltaChunks, -1)
}

// createDeltaBuckets creates the delta buckets in a catalog made before
// they existed (an older ckptfs ignores them).
func createDeltaBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketDeltaPlans, bucketDeltas, bucketBases} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}
