package cas

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Packs of small chunks (doc.go, "Packs", has the decisions). A batch
// appends the objects of its small new chunks to a pack buffer, written as
// one pack object when it holds PackTarget bytes and at Sync; the commit
// records the pack and indexes each chunk at its offset in it.

const (
	// DefaultPackMaxChunk is the largest raw chunk stored in a pack unless
	// Options.PackMaxChunk says otherwise; larger ones get an object of
	// their own.
	DefaultPackMaxChunk = 256 << 10
	// PackTarget is the size at which a batch writes its pack buffer out.
	PackTarget = 8 << 20
)

// packHandle names pack id's object in the backend.
func packHandle(id ID) backend.Handle {
	return backend.Handle{Kind: backend.Pack, Name: id.String()}
}

// packLoc is where an object lives in a pack.
type packLoc struct {
	pack   ID
	off, n int64
}

// packWriter is one pack of a batch: its buffer until written, then its name.
type packWriter struct {
	mu      sync.Mutex // guards buf, ents' offsets, id, written against readers (packs.read)
	buf     []byte
	ents    []packEnt // the objects in buf, in the order they were appended
	id      ID
	size    int64 // once written
	written bool
}

// packEnt is an object in a pack: its chunk, where it lies, and its rank.
// A pack holds its objects sorted by rank (sortLocked, when it is written
// out), so that a file's chunks lie in file order whatever order the
// commit's workers finished them in.
type packEnt struct {
	id     ID
	order  int64
	off, n int64
	codec  Codec
}

// packSlot is a chunk's object in a batch's pack: w.ents[i].
type packSlot struct {
	w *packWriter
	i int
}

// loc returns where slot's object is: its pack (zero until written) and its
// range and codec there.
func (sl packSlot) loc() (pack ID, e packEnt) {
	sl.w.mu.Lock()
	defer sl.w.mu.Unlock()
	return sl.w.id, sl.w.ents[sl.i]
}

// sortLocked puts w's objects in rank order (ties in the order appended)
// and records their new offsets. The sorted objects go into a spare buffer
// of b's when one is large enough, and the buffer they leave becomes one.
// b.packMu and w.mu held, w not written yet.
func (w *packWriter) sortLocked(b *Batch) {
	if slices.IsSortedFunc(w.ents, func(x, y packEnt) int { return cmp.Compare(x.order, y.order) }) {
		return // appended in order (a stable sort would move nothing)
	}
	idx := make([]int, len(w.ents))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(w.ents[x].order, w.ents[y].order) })
	buf := b.takeSpare(len(w.buf))
	if buf == nil {
		// As large as w.buf's: the two take turns for the batch's packs.
		buf = make([]byte, 0, cap(w.buf))
	}
	for _, i := range idx {
		e := &w.ents[i]
		buf = append(buf, w.buf[e.off:e.off+e.n]...)
		e.off = int64(len(buf)) - e.n
	}
	b.keepSpare(w.buf) // readers copy from w.buf under w.mu: none holds it now
	w.buf = buf
}

// maxSpares is how many unused pack buffers a batch keeps: one for its next
// pack and one for the next sort, so that a batch writing many packs
// allocates two buffers, not one or two per pack.
const maxSpares = 2

// takeSpare returns an empty spare buffer of b's that holds at least n
// bytes, or nil. b.packMu held.
func (b *Batch) takeSpare(n int) []byte {
	for i, buf := range b.spares {
		if cap(buf) >= n {
			b.spares = slices.Delete(b.spares, i, i+1)
			return buf[:0]
		}
	}
	return nil
}

// keepSpare keeps buf, which nothing reads any more, as a spare of b's, if
// it has room for one. b.packMu held.
func (b *Batch) keepSpare(buf []byte) {
	if cap(buf) > 0 && len(b.spares) < maxSpares {
		b.spares = append(b.spares, buf[:0])
	}
}

// pendingChunk is a chunk in a pack of a batch not committed yet.
type pendingChunk struct {
	b *Batch
	packSlot
}

// packs is the store's registry of packs that live batches are writing: the
// read path finds their chunks here before the commit indexes them (a
// streaming writer reads back what it cut), and the sweep of unnamed packs
// leaves their objects alone.
type packs struct {
	s       *Store
	mu      sync.Mutex
	pending map[ID][]pendingChunk
	live    map[ID]int // written packs of live batches (or kept ones)
}

func newPacks(s *Store) *packs {
	return &packs{s: s, pending: map[ID][]pendingChunk{}, live: map[ID]int{}}
}

// packs reports whether the store puts a new chunk n bytes long in a pack:
// a writable store whose backend reads ranges, for a chunk no larger than
// Options.PackMaxChunk, when inline encoders exist (a packed chunk is
// encoded before it is packed; with every encode deferred, InlineEncoders
// negative, chunks keep objects of their own and the re-encoder's queue).
func (p *packs) packs(n int) bool {
	_, ok := p.s.objects.(backend.RangeGetter)
	return ok && !p.s.readOnly && p.s.packMax > 0 && n <= p.s.packMax && p.s.re.slots != nil
}

// add records chunk id in b's pack at sl.
func (p *packs) add(id ID, b *Batch, sl packSlot) {
	p.mu.Lock()
	p.pending[id] = append(p.pending[id], pendingChunk{b, sl})
	p.mu.Unlock()
}

// read returns chunk id's object from a pack of a live batch; ok is false
// when no live batch holds it.
func (p *packs) read(ctx context.Context, id ID, buf []byte) (obj []byte, ok bool, err error) {
	p.mu.Lock()
	cs := p.pending[id]
	var c pendingChunk
	if len(cs) > 0 {
		c = cs[len(cs)-1]
	}
	p.mu.Unlock()
	if c.w == nil {
		return nil, false, nil
	}
	c.w.mu.Lock()
	e := c.w.ents[c.i]
	if !c.w.written {
		obj = append(buf[:0], c.w.buf[e.off:e.off+e.n]...)
		c.w.mu.Unlock()
		return obj, true, nil
	}
	pack := c.w.id
	c.w.mu.Unlock()
	obj, err = p.getRange(ctx, packLoc{pack, e.off, e.n}, buf)
	return obj, true, err
}

// getRange reads loc's bytes.
func (p *packs) getRange(ctx context.Context, loc packLoc, buf []byte) ([]byte, error) {
	rg, ok := p.s.objects.(backend.RangeGetter)
	if !ok {
		return nil, fmt.Errorf("pack %v: the store's backend reads no ranges", loc.pack)
	}
	obj, err := rg.GetRange(ctx, packHandle(loc.pack), loc.off, loc.n, buf)
	if errors.Is(err, backend.ErrNotExist) {
		return nil, fmt.Errorf("pack %v: %w", loc.pack, ErrMissing)
	}
	if err != nil {
		// A pack shorter than its rows say is damage, like a short object.
		return nil, fmt.Errorf("pack %v: %w: %w", loc.pack, ErrCorrupt, err)
	}
	return obj, nil
}

// forget drops b's pending chunks and its packs' live counts.
func (p *packs) forget(b *Batch, ids []ID, written []*packWriter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		cs := p.pending[id][:0]
		for _, c := range p.pending[id] {
			if c.b != b {
				cs = append(cs, c)
			}
		}
		if len(cs) == 0 {
			delete(p.pending, id)
		} else {
			p.pending[id] = cs
		}
	}
	for _, w := range written {
		if p.live[w.id]--; p.live[w.id] <= 0 {
			delete(p.live, w.id)
		}
	}
}

// newPackID names a new pack: random, so that no two batches ever write the
// same pack, and a batch that gives up may delete its packs unasked.
func newPackID() (ID, error) {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		return ID{}, fmt.Errorf("name a pack: %w", err)
	}
	return id, nil
}

// putPacked stores chunk id (data, not indexed) in b's pack, encoded inline:
// it waits for an encoder when none is free (never queued, since a
// re-encode would move it out of its pack). order is its rank in the pack
// (PutAt).
func (b *Batch) putPacked(ctx context.Context, id ID, data []byte, h Hint, order int64) error {
	b.packMu.Lock()
	_, dup := b.inPack[id]
	b.packMu.Unlock()
	if dup {
		return nil
	}
	s := b.s
	release, ok := s.re.tryEncodeSlot(len(data))
	if !ok {
		select {
		case s.re.slots <- struct{}{}:
			release = func() { <-s.re.slots }
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	obj, codec := s.coder.Encode(data, h)
	release()
	b.packMu.Lock()
	defer b.packMu.Unlock()
	if _, dup := b.inPack[id]; dup {
		return nil
	}
	if b.cur == nil {
		// A spare of the batch's (a buffer of a pack it wrote), else one
		// grown as it fills: a batch of one small file holds little.
		buf := b.takeSpare(len(obj))
		if buf == nil {
			buf = make([]byte, 0, max(64<<10, 2*len(obj)))
		}
		b.cur = &packWriter{buf: buf}
	}
	w := b.cur
	off, n := int64(len(w.buf)), int64(len(obj))
	w.mu.Lock()
	if need := len(w.buf) + len(obj); need > cap(w.buf) {
		// Doubled, but to no more than a pack's size: append's growth
		// took it past, up to 10 MiB.
		grown := make([]byte, len(w.buf), max(need, min(2*cap(w.buf), PackTarget+len(obj))))
		copy(grown, w.buf)
		w.buf = grown
	}
	w.buf = append(w.buf, obj...)
	w.ents = append(w.ents, packEnt{id: id, order: order, off: off, n: n, codec: codec})
	sl := packSlot{w, len(w.ents) - 1}
	w.mu.Unlock()
	b.mu.Lock()
	b.inPack[id] = sl
	b.mu.Unlock()
	s.packs.add(id, b, sl)
	// Where in the pack is the commit's to read (packSlot.loc): writing the
	// pack out sorts it.
	b.note(id, ChunkInfo{RawLen: uint32(len(data)), StoredLen: uint32(n), Codec: codec}, false, h)
	if len(w.buf) >= PackTarget {
		return b.flushPackLocked(ctx)
	}
	return nil
}

// flushPackLocked writes b's current pack out under a new name. b.packMu
// held.
func (b *Batch) flushPackLocked(ctx context.Context) error {
	w := b.cur
	if w == nil || len(w.buf) == 0 {
		return nil
	}
	id, err := newPackID()
	if err != nil {
		return err
	}
	s := b.s
	s.packs.mu.Lock()
	s.packs.live[id]++ // before the object exists: the sweep of unnamed packs skips it
	s.packs.mu.Unlock()
	w.mu.Lock()
	w.sortLocked(b)
	w.id, w.size = id, int64(len(w.buf))
	w.mu.Unlock()
	b.mu.Lock()
	b.packs = append(b.packs, w) // Release counts it out of live, and deletes it uncommitted
	b.mu.Unlock()
	if err := s.objects.Put(ctx, packHandle(id), w.buf, backend.PutOptions{}); err != nil {
		return fmt.Errorf("write pack %v: %w", id, err)
	}
	w.mu.Lock()
	buf := w.buf
	w.written, w.buf = true, nil
	w.mu.Unlock()
	b.keepSpare(buf) // Put retains nothing, and readers read the pack now
	b.cur = nil
	return nil
}

// commitPacks records b's packs. commitBatch calls it (b.mu held) before
// it indexes the chunks.
func commitPacks(t *Tx, b *Batch) error {
	for _, w := range b.packs {
		if err := t.Index().AddPack(w.id, w.size); err != nil {
			return fmt.Errorf("record pack %v: %w", w.id, err)
		}
	}
	return nil
}

// dropDeadPacks removes the rows of b's packs that hold no chunk the commit
// indexed (another commit indexed each first): the release deletes them.
func dropDeadPacks(t *Tx, b *Batch) error {
	for _, w := range b.packs {
		p, ok, err := t.Pack(w.id)
		if err != nil {
			return err
		}
		if ok && p.Live == 0 {
			if err := t.Index().DropPack(w.id); err != nil {
				return err
			}
		}
	}
	return nil
}

// deletePacks deletes pack objects no row names, unless a live batch
// holds them: the packs of a batch released without a commit, of a commit
// whose chunks were all indexed elsewhere, the packs a sweep emptied, and
// (SweepPacks) those a crash left. The check and the delete are one step
// under packs.mu, so a pack a batch is still writing or has just committed
// is never deleted. It returns how many packs and bytes it deleted.
func (p *packs) deletePacks(ctx context.Context, ids []ID, sizes []int64) (int, int64, error) {
	n, freed := 0, int64(0)
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return n, freed, err
		}
		p.mu.Lock()
		err := p.deleteLocked(ctx, id)
		p.mu.Unlock()
		if errors.Is(err, errPackInUse) {
			continue
		}
		if err != nil {
			return n, freed, err
		}
		n++
		if sizes != nil {
			freed += sizes[i]
		}
	}
	return n, freed, nil
}

var errPackInUse = errors.New("pack in use")

func (p *packs) deleteLocked(ctx context.Context, id ID) error {
	if p.live[id] > 0 {
		return errPackInUse
	}
	var named bool
	if err := p.s.View(func(tx *Tx) error {
		_, ok, err := tx.Pack(id)
		named = ok
		return err
	}); err != nil {
		return err
	}
	if named {
		return errPackInUse
	}
	if err := p.s.objects.Delete(ctx, packHandle(id)); err != nil {
		return fmt.Errorf("delete pack %v: %w", id, err)
	}
	return nil
}

// PackSweep is what SweepPacks found and removed.
type PackSweep struct {
	Packs        int   // pack objects found
	YoungOrphans int   // unnamed packs younger than the cutoff, kept
	Deleted      int   // unnamed packs deleted
	Bytes        int64 // their bytes
}

// SweepPacks deletes the pack objects that no catalog row names, last
// modified before before, that no live batch is writing (OrphanPacks): a
// pack written by a commit that a crash interrupted (or whose release could
// not delete it). The collector calls it after its sweep. Each delete
// checks the live batches and the pack row again (deletePacks). Open does
// not sweep: a candidate costs a walk of the chunk index (and a young pack
// is kept, whatever its story, as objects no commit named are).
func (s *Store) SweepPacks(ctx context.Context, before time.Time) (PackSweep, error) {
	var res PackSweep
	if s.readOnly {
		return res, errors.New("store is open read-only")
	}
	pc, err := s.OrphanPacks(ctx, nil)
	res.Packs = pc.Packs
	if err != nil {
		return res, fmt.Errorf("sweep packs: %w", err)
	}
	var ids []ID
	var sizes []int64
	for _, o := range pc.Orphans {
		if !o.ModTime.Before(before) {
			res.YoungOrphans++
			continue
		}
		ids, sizes = append(ids, o.ID), append(sizes, o.Size)
	}
	res.Deleted, res.Bytes, err = s.packs.deletePacks(ctx, ids, sizes)
	return res, err
}

// StatPack returns the size of pack id's object; ok is false when there is
// none.
func (s *Store) StatPack(ctx context.Context, id ID) (size int64, ok bool, err error) {
	in, err := s.objects.Stat(ctx, packHandle(id))
	if errors.Is(err, backend.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("stat pack %v: %w", id, err)
	}
	return in.Size, true, nil
}
