package catalog

import (
	"bytes"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Delta rows (cas's deltaplan.go has the rules that write them).
var (
	bucketDeltaPlans = []byte("deltaplans")
	bucketDeltas     = []byte("deltas")
	bucketBases      = []byte("bases")
	bucketDeltaWait  = []byte("deltawait")
)

// keyDeltaChunks counts the rows of "deltas", keyDeltaWaiting the rows of
// "deltawait" not released.
var (
	keyDeltaChunks  = []byte("delta_chunks")
	keyDeltaWaiting = []byte("delta_waiting")
)

// DeltaLink is a plan or delta row: the base chunk and the distance from it
// in versions (1 for the version right after the base).
type DeltaLink struct {
	Base ID
	Dist uint8
}

const DeltaLinkVersion = 1

func (l DeltaLink) marshal() []byte {
	b := make([]byte, 0, 2+IDSize)
	b = append(b, DeltaLinkVersion)
	b = append(b, l.Base[:]...)
	return append(b, l.Dist)
}

func unmarshalDeltaLink(b []byte) (DeltaLink, error) {
	if len(b) != 2+IDSize || b[0] != DeltaLinkVersion || b[1+IDSize] == 0 {
		return DeltaLink{}, errors.New("bad delta record")
	}
	var l DeltaLink
	copy(l.Base[:], b[1:])
	l.Dist = b[1+IDSize]
	return l, nil
}

// link reads chunk id's row in bucket name.
func (t *Tx) link(name []byte, id ID) (DeltaLink, bool, error) {
	return chunkRow(t, name, id, unmarshalDeltaLink)
}

// chunkRow reads chunk id's sealed row in bucket name, decoded (ok false:
// no row, or no such bucket).
func chunkRow[T any](t *Tx, name []byte, id ID, decode func([]byte) (T, error)) (v T, ok bool, err error) {
	b := t.b(name)
	if b == nil {
		return v, false, nil
	}
	raw := b.Get(id[:])
	if raw == nil {
		return v, false, nil
	}
	rec, err := t.openRecord(id[:], raw)
	if err != nil {
		return v, false, fmt.Errorf("chunk %v: %w", id, err)
	}
	if v, err = decode(rec); err != nil {
		return v, false, fmt.Errorf("chunk %v: %w", id, errDamaged(err))
	}
	return v, true, nil
}

// forEachChunkRow calls fn for every row of bucket name, keyed by chunk ID
// and decoded.
func forEachChunkRow[T any](t *Tx, name []byte, decode func([]byte) (T, error), fn func(ID, T) error) error {
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
		x, err := decode(rec)
		if err != nil {
			return fmt.Errorf("%s row %x: %w", name, k, errDamaged(err))
		}
		return fn(ID(k), x)
	})
}

// Delta returns chunk id's delta row: the base its object is coded against.
func (t *Tx) Delta(id ID) (base ID, dist int, ok bool, err error) {
	l, ok, err := t.link(bucketDeltas, id)
	return l.Base, int(l.Dist), ok, err
}

// DeltaPlan returns chunk id's plan row: the chunk its plan names (the
// chain's keyframe, or its suggestion when that was a plan itself; see
// Plan) and the distance.
func (t *Tx) DeltaPlan(id ID) (base ID, dist int, ok bool, err error) {
	l, ok, err := t.link(bucketDeltaPlans, id)
	return l.Base, int(l.Dist), ok, err
}

// DeltaWait is a deltawait row: a plan made to wait for a later version of
// its chunk (Deltas.Plan with wait), so that the newest version stays whole.
type DeltaWait struct {
	// Hint is what the chunk's put said it holds: the release queues the
	// chunk with it.
	Hint Hint
	// Released: a later version was committed (Deltas.Release), and the
	// plan is the re-encoder's to carry out; the row stays for Fallback.
	Released bool
	// Fallback is the keyframe the chain led to when the plan was made,
	// at the chunk's distance from it (Dist 0: none), tried after the
	// plan's own candidates: a waiting plan names the version before
	// (PlanCandidates walks on from it), and a collection that takes that
	// version before it is a delta would leave the plan no way to the
	// keyframe.
	Fallback DeltaLink
}

const deltaWaitVersion = 1

func (w DeltaWait) marshal() []byte {
	elem := w.Hint.ElemSize
	if elem < 0 || elem > 255 {
		elem = 0
	}
	var rel byte
	if w.Released {
		rel = 1
	}
	b := make([]byte, 0, 4+IDSize)
	b = append(b, deltaWaitVersion, rel, byte(elem), w.Fallback.Dist)
	return append(b, w.Fallback.Base[:]...)
}

func unmarshalDeltaWait(b []byte) (DeltaWait, error) {
	if len(b) != 4+IDSize || b[0] != deltaWaitVersion || b[1] > 1 {
		return DeltaWait{}, errors.New("bad delta wait record")
	}
	w := DeltaWait{Hint: Hint{ElemSize: int(b[2])}, Released: b[1] == 1, Fallback: DeltaLink{Dist: b[3]}}
	copy(w.Fallback.Base[:], b[4:])
	return w, nil
}

// DeltaWait returns chunk id's deltawait row (ok false: none). Only a row
// beside a plan row means anything.
func (t *Tx) DeltaWait(id ID) (w DeltaWait, ok bool, err error) {
	return chunkRow(t, bucketDeltaWait, id, unmarshalDeltaWait)
}

// DeltaWaits reports whether chunk id's plan waits for a later version of
// id before it is carried out: a deltawait row not yet released.
func (t *Tx) DeltaWaits(id ID) (bool, error) {
	w, ok, err := t.DeltaWait(id)
	return ok && !w.Released, err
}

// ForEachDeltaWait calls fn for every deltawait row.
func (t *Tx) ForEachDeltaWait(fn func(id ID, w DeltaWait) error) error {
	return forEachChunkRow(t, bucketDeltaWait, unmarshalDeltaWait, fn)
}

// PlanCandidates returns the bases chunk id's plan may be carried out
// against as of t, in the order the re-encoder tries them (ok false: no
// plan). The plan row names a chunk B at distance d (Plan); from B the
// walk follows plan rows, which name the chunk each was suggested against,
// until a chunk that is a delta or has no plan:
//
//   - First the chain's keyframe as if every plan on the way will be
//     carried out: the base of the delta the walk ended on (at its distance
//     plus the walk's), or the chunk it ended on, at d. For a row that
//     names a keyframe (every row before plans could name a plan) this is
//     the only candidate, and what was always tried.
//   - Then the chunks the walk passed, farthest first, each at the number
//     of versions between it and id: standalone now, they serve when the
//     plans that would have made them deltas do not pay (a suggestion from
//     an unrelated run: its first step's plan fails, and the steps after it
//     must not all be planned against that unrelated chunk). A chunk that
//     becomes a base is no delta's afterwards (Deltas.Put refuses it), so
//     depth 1 holds whichever is kept.
func (t *Tx) PlanCandidates(id ID) (cands []DeltaLink, ok bool, err error) {
	l, ok, err := t.link(bucketDeltaPlans, id)
	if err != nil || !ok {
		return nil, ok, err
	}
	var passed []DeltaLink // nearest first
	cur, hop := l.Base, 1
	far := DeltaLink{Base: cur, Dist: l.Dist}
	for {
		if d, isDelta, err := t.link(bucketDeltas, cur); err != nil {
			return nil, false, err
		} else if isDelta {
			far = DeltaLink{Base: d.Base, Dist: uint8(min(hop+int(d.Dist), 255))}
			break
		}
		p, planned, err := t.link(bucketDeltaPlans, cur)
		if err != nil {
			return nil, false, err
		}
		if !planned || p.Base == cur || p.Base == id || hop >= maxPlanWalk {
			far = DeltaLink{Base: cur, Dist: l.Dist}
			break
		}
		passed = append(passed, DeltaLink{Base: cur, Dist: uint8(min(hop, 255))})
		cur, hop = p.Base, hop+1
	}
	cands = append(cands, far)
	for i := len(passed) - 1; i >= 0; i-- {
		if passed[i].Base != far.Base {
			cands = append(cands, passed[i])
		}
	}
	return cands, true, nil
}

// maxPlanWalk bounds PlanCandidates' walk along plan rows: a chain has at
// most a keyframe's length of them (Options.DeltaKeyframe, at most 255);
// the bound holds against a damaged catalog's cycle.
const maxPlanWalk = 256

// ForEachDelta calls fn for every delta row.
func (t *Tx) ForEachDelta(fn func(id, base ID, dist int) error) error {
	return t.forEachLink(bucketDeltas, fn)
}

// ForEachDeltaPlan calls fn for every plan row.
func (t *Tx) ForEachDeltaPlan(fn func(id, base ID, dist int) error) error {
	return t.forEachLink(bucketDeltaPlans, fn)
}

func (t *Tx) forEachLink(name []byte, fn func(id, base ID, dist int) error) error {
	return forEachChunkRow(t, name, unmarshalDeltaLink, func(id ID, l DeltaLink) error {
		return fn(id, l.Base, int(l.Dist))
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

// Deltas writes the delta rows: plans (deltaplans) and their waits
// (deltawait), delta rows (deltas) and their reverse index (bases). Only
// the store's own bookkeeping writes them; Tx.Delta, Tx.DeltaPlan,
// Tx.DeltaWait, Tx.IsBase and the ForEach methods read them.
type Deltas struct{ t *Tx }

// Deltas returns the delta rows' writes in t.
func (t *Tx) Deltas() Deltas { return Deltas{t} }

// Plan turns a suggestion (new chunk id, of rawLen bytes, is likely
// close to chunk prev) into a plan, when that can give a delta of depth 1
// within keyframe versions. Called by a batch's commit for chunks its
// transaction indexes.
//
// Without wait the plan is carried out now: id joins the re-encode queue.
// With wait it waits for a later version of id (a deltawait row), so that
// the newest version stays whole, until a Release of id.
func (x Deltas) Plan(id, prev ID, h Hint, rawLen uint32, keyframe int, wait bool) error {
	t := x.t
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
	l := DeltaLink{Base: prev, Dist: 1}
	var fallback DeltaLink
	if d, ok, err := t.link(bucketDeltas, prev); err != nil {
		return err
	} else if ok {
		l = DeltaLink{Base: d.Base, Dist: d.Dist + 1}
	} else if p, ok, err := t.link(bucketDeltaPlans, prev); err != nil {
		return err
	} else if ok {
		// prev's own plan is not carried out yet, and may not pay (a
		// suggestion from an unrelated run): name prev, and let the
		// re-encoder choose between the keyframe prev's plan leads to and
		// prev itself when it carries this plan out (PlanCandidates). A
		// plan naming prev's keyframe directly left every later step of a
		// new run planned against an unrelated chunk, and without deltas.
		l = DeltaLink{Base: prev, Dist: p.Dist + 1}
		if wait {
			// That keyframe, for when prev is gone before it is a delta.
			if c, ok, err := t.PlanCandidates(prev); err != nil {
				return err
			} else if ok && len(c) > 0 && c[0].Base != id && c[0].Base != prev {
				fallback = DeltaLink{Base: c[0].Base, Dist: uint8(min(int(c[0].Dist)+1, 255))}
			}
		}
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
	// Any wait row before this plan's is gone: one an older ckptfs left
	// when it carried a plan out, or a released one.
	if err := x.dropWait(id); err != nil {
		return err
	}
	if w := t.b(bucketDeltaWait); wait && w != nil {
		if err := t.addCounter(keyDeltaWaiting, 1); err != nil {
			return err
		}
		return w.Put(id[:], sealRecord(id[:], DeltaWait{Hint: h, Fallback: fallback}.marshal()))
	}
	return t.Queue().Add(id, h, rawLen)
}

// Release ends the wait of chunk id's plan, if it waits for a later version
// of id (Plan with wait): a later version was committed. The plan joins the
// re-encode queue; its row is marked released and kept for its fallback
// (DropPlan removes it with the plan). Called by a batch's commit for every
// chunk its files suggest a later version of, whether or not deltas are
// planned now.
func (x Deltas) Release(id ID) error {
	t := x.t
	w, ok, err := t.DeltaWait(id)
	if err != nil || !ok || w.Released {
		return err
	}
	info, indexed, err := t.Chunk(id)
	if err != nil {
		return err
	}
	if _, planned, err := t.link(bucketDeltaPlans, id); err != nil {
		return err
	} else if !planned || !indexed {
		return x.DropPlan(id)
	}
	w.Released = true
	if err := t.b(bucketDeltaWait).Put(id[:], sealRecord(id[:], w.marshal())); err != nil {
		return err
	}
	if err := t.addCounter(keyDeltaWaiting, -1); err != nil {
		return err
	}
	return t.Queue().Add(id, w.Hint, info.RawLen)
}

// Settle goes over every deltawait row: a row whose chunk or plan is gone
// (what an older ckptfs's collections and re-encodes leave, which it counts
// in delta_waiting for good) is dropped, and with release every waiting
// plan is released (Release) into the re-encode queue, for a mount that
// codes each save at once. It returns how many rows it dropped and
// released.
func (x Deltas) Settle(release bool) (dropped, released int, err error) {
	t := x.t
	type row struct {
		id ID
		w  DeltaWait
	}
	var rows []row // the rows first: the bucket changes below (each row only by its own turn)
	if err := t.ForEachDeltaWait(func(id ID, w DeltaWait) error {
		rows = append(rows, row{id, w})
		return nil
	}); err != nil {
		return 0, 0, err
	}
	for _, r := range rows {
		id, w := r.id, r.w
		_, indexed, err := t.Chunk(id)
		if err != nil {
			return dropped, released, err
		}
		_, planned, err := t.link(bucketDeltaPlans, id)
		if err != nil {
			return dropped, released, err
		}
		switch {
		case !indexed || !planned:
			if err := x.DropPlan(id); err != nil {
				return dropped, released, err
			}
			dropped++
		case release && !w.Released:
			if err := x.Release(id); err != nil {
				return dropped, released, err
			}
			released++
		}
	}
	return dropped, released, nil
}

// Waiting reports whether any plan waits (delta_waiting above 0). Forget
// and ReleaseIn read nothing when none does, and their callers may skip the
// reads that find them their manifests.
func (x Deltas) Waiting() bool { return x.t.counter(keyDeltaWaiting) > 0 }

// Forget drops the waiting plans of content that no file is to hold: m,
// the manifest of a file whose last name this transaction removes, or
// whose content it replaces. Each chunk of m whose plan waits (not
// released) and that keep does not name (the content that takes m's place:
// the file's new version, or the file renamed over it; nil for none) loses
// its plan and wait row (DropPlan), so that delta_waiting counts it out at
// the deletion rather than at the collection that sweeps it, and no
// re-encode codes a chunk that is garbage. Released plans are the
// re-encoder's already, and left so. It reads a row per chunk of m (none
// when no plan waits), and keep's chunks once one is to go.
//
// No reference table says whether another file still names such a chunk
// (a copy of the file, the same bytes saved elsewhere): it then stays
// whole, without a plan, and its next version is coded against it as
// against a keyframe (cas's doc.go has the reasons).
func (x Deltas) Forget(m, keep *Manifest) error {
	if m == nil || !x.Waiting() {
		return nil
	}
	var kept map[ID]bool
	for _, c := range m.Chunks {
		if waits, err := x.t.DeltaWaits(c.ID); err != nil {
			return err
		} else if !waits {
			continue
		}
		if kept == nil {
			kept = map[ID]bool{}
			if keep != nil {
				for _, k := range keep.Chunks {
					kept[k.ID] = true
				}
			}
		}
		if kept[c.ID] {
			continue
		}
		if err := x.DropPlan(c.ID); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseIn releases (Release) the waiting plans of m's chunks: the file
// that holds m left the place where its next version would be saved
// (fusefs decides where that is), so no save will release them. It reads
// a row per chunk of m, none when no plan waits.
func (x Deltas) ReleaseIn(m *Manifest) error {
	if m == nil || !x.Waiting() {
		return nil
	}
	for _, c := range m.Chunks {
		if err := x.Release(c.ID); err != nil {
			return err
		}
	}
	return nil
}

// dropWait removes chunk id's wait row, if any, and counts it out of
// delta_waiting unless it was released.
func (x Deltas) dropWait(id ID) error {
	t := x.t
	w, ok, err := t.DeltaWait(id)
	if err != nil || !ok {
		return err
	}
	if err := t.b(bucketDeltaWait).Delete(id[:]); err != nil {
		return err
	}
	if w.Released {
		return nil
	}
	return t.addCounter(keyDeltaWaiting, -1)
}

// DropPlan removes chunk id's plan row and its wait row, if any.
func (x Deltas) DropPlan(id ID) error {
	t := x.t
	if err := x.dropWait(id); err != nil {
		return err
	}
	if b := t.b(bucketDeltaPlans); b != nil {
		return b.Delete(id[:])
	}
	return nil
}

// Put records that chunk id's object is (about to be) a delta against
// l.Base: its delta row, the reverse row, the counter, and format 3. It
// refuses (ErrDeltaRefused) a base that is itself a delta, a base that is
// not indexed, and a chunk that is a base.
func (x Deltas) Put(id ID, l DeltaLink) error {
	t := x.t
	if _, ok, err := t.link(bucketDeltas, l.Base); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("chunk %v: base %v is a delta itself: %w", id, l.Base, ErrDeltaRefused)
	}
	if t.IsBase(id) {
		return fmt.Errorf("chunk %v is the base of other deltas: %w", id, ErrDeltaRefused)
	}
	if _, ok, err := t.Chunk(l.Base); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("chunk %v: base %v is not indexed: %w", id, l.Base, ErrDeltaRefused)
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
		if err := x.Drop(id); err != nil {
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
	if f := t.Format(); f != 0 && f < formatDeltas {
		return t.setFormat(formatDeltas)
	}
	return nil
}

// Drop removes chunk id's delta row and its reverse row, if any.
func (x Deltas) Drop(id ID) error {
	t := x.t
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

// ErrDeltaRefused is the error of Deltas.Put when a delta's rows cannot be
// written (its base changed).
var ErrDeltaRefused = errors.New("delta refused")

// createDeltaBuckets creates the delta buckets in a catalog made before
// they existed (an older ckptfs ignores them).
func createDeltaBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketDeltaPlans, bucketDeltas, bucketBases, bucketDeltaWait} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}
