package cas

import (
	"bytes"
	"context"
	"fmt"
	"sort"

	"github.com/ckptfs/ckptfs/cas/object"
)

const (
	// maxRunSpan bounds the bytes one read of AcquireChunks covers.
	maxRunSpan = 16 << 20
	// maxRunGap is the most bytes of other objects one read of
	// AcquireChunks reads between two of the chunks asked for. A commit
	// packs a file's chunks in file order (Batch.PutAt), so a run of them
	// is one range with no gap; packs written before that hold them in the
	// order the commit's workers finished them, near each other but seldom
	// back to back (runs of exactly adjacent chunks were one or two chunks
	// long in a cold read of random bytes), and are read across the gaps.
	maxRunGap = 256 << 10
)

// AcquireChunks is AcquireChunk for several chunks, usually consecutive
// chunks of a file (a prefetcher's batch), returned in the order of refs:
// the catalog rows of all are read in one transaction, and the objects of
// chunks that lie near each other in one pack (as a commit packs a file's
// small chunks, in file order) are read with one read of
// their span (gaps of up to maxRunGap included); each is then verified and
// decoded as AcquireChunk would, and enters the cache. Chunks cached (or
// loading) already, and chunks of their own, are acquired one by one. The
// caller releases every chunk returned; on an error none is held.
func (s *Store) AcquireChunks(ctx context.Context, refs []ChunkRef) ([]*Chunk, error) {
	if len(refs) == 1 { // no run: AcquireChunk locates it itself
		k, err := s.AcquireChunk(ctx, refs[0])
		if err != nil {
			return nil, err
		}
		return []*Chunk{k}, nil
	}
	locs := make([]packLoc, len(refs)) // zero pack: not packed, or cached
	var packed []int                   // indexes of refs with a pack location
	if err := s.View(func(tx *Tx) error {
		for i, ref := range refs {
			if s.cache.has(ref.ID) {
				continue
			}
			info, ok, err := tx.Chunk(ref.ID)
			if err != nil {
				return err
			}
			if ok && info.Packed() {
				locs[i] = packLoc{info.Pack, int64(info.Offset), int64(info.StoredLen)}
				packed = append(packed, i)
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("locate chunks: %w", err)
	}
	// Packed chunks by place: pack, then offset.
	sort.Slice(packed, func(a, b int) bool {
		la, lb := locs[packed[a]], locs[packed[b]]
		if c := bytes.Compare(la.pack[:], lb.pack[:]); c != 0 {
			return c < 0
		}
		return la.off < lb.off
	})
	out := make([]*Chunk, len(refs))
	fail := func(err error) ([]*Chunk, error) {
		for _, k := range out {
			k.Release()
		}
		return nil, err
	}
	for i := 0; i < len(packed); {
		j := runEnd(locs, packed, i)
		if j-i < 2 {
			i++
			continue // acquired below
		}
		run := packed[i:j]
		rrefs, rlocs := make([]ChunkRef, len(run)), make([]packLoc, len(run))
		for k, x := range run {
			rrefs[k], rlocs[k] = refs[x], locs[x]
		}
		ks, err := s.acquireRun(ctx, rrefs, rlocs)
		if err != nil {
			return fail(err)
		}
		for k, x := range run {
			out[x] = ks[k]
		}
		i = j
	}
	for i, ref := range refs {
		if out[i] != nil {
			continue
		}
		k, err := s.AcquireChunk(ctx, ref)
		if err != nil {
			return fail(err)
		}
		out[i] = k
	}
	return out, nil
}

// runEnd returns the end of the run of chunks from packed[i] on (packed:
// indexes of locs, sorted by place) that lie in one pack, each within
// maxRunGap of the one before, all within maxRunSpan. A chunk listed twice
// ends a run (a run holds each object once).
func runEnd(locs []packLoc, packed []int, i int) int {
	first := locs[packed[i]]
	end := first.off + first.n
	j := i + 1
	for ; j < len(packed); j++ {
		l := locs[packed[j]]
		if l.pack != first.pack || l.off < end || l.off-end > maxRunGap || l.off+l.n-first.off > maxRunSpan {
			break
		}
		end = l.off + l.n
	}
	return j
}

// acquireRun reads the span of a run of packed chunks (sorted by offset) at
// once and acquires each chunk from it. The chunks not cached are claimed
// first (cache.claim), so that a reader asking for one while the span is
// read waits for this load instead of reading the chunk again, and are
// loaded on this goroutine, one after another, before any chunk that
// another caller is loading is waited for. If the span cannot be read, each
// claimed chunk is loaded as AcquireChunk loads it (a missing pack may be
// found in a remote tier).
//
// Raw chunks (incompressible bytes) are verified where the read put them
// (object.RawInPlace: their BLAKE3, no CRC, no copy) and, when they fill at
// least half of the read's buffer, cached there (spanBuf): the buffer is
// then theirs until the cache lets them all go. Otherwise a verified raw
// chunk is copied into a buffer of its own, and any other chunk is decoded
// as AcquireChunk decodes it.
func (s *Store) acquireRun(ctx context.Context, refs []ChunkRef, locs []packLoc) ([]*Chunk, error) {
	ids := make([]ID, len(refs))
	for i, ref := range refs {
		ids[i] = ref.ID
	}
	claimed := s.cache.claim(ids)
	first, last := locs[0], locs[len(locs)-1]
	n := last.off + last.n - first.off
	buf := s.cache.spanBuffer(int(n))
	span, spanErr := s.packs.getRange(ctx, packLoc{first.pack, first.off, n}, buf)
	var sp *spanBuf
	var raws []inPlace
	if spanErr == nil {
		if sameArray(span, buf) {
			sp = s.cache.newSpan(buf, true)
		} else {
			sp = s.cache.newSpan(span, false)
		}
		defer s.cache.releaseSpan(sp)
		raws = s.verifyInPlace(claimed, refs, locs, span, sp)
	}
	out := make([]*Chunk, len(refs))
	var firstErr error
	keep := func(i int, e *cacheEntry, err error) {
		if err == nil && len(e.data) != int(refs[i].Len) {
			err = fmt.Errorf("chunk %v: %w: %d bytes, manifest says %d", refs[i].ID, ErrCorrupt, len(e.data), refs[i].Len)
		}
		if e != nil {
			out[i] = &Chunk{Data: e.data, c: s.cache, e: e}
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for i, l := range claimed { // every claim finished, whatever fails
		if l == nil {
			continue
		}
		id := refs[i].ID
		if raws != nil && (raws[i].charge > 0 || raws[i].err != nil) {
			e, err := s.cache.finishSpan(id, l, raws[i].raw, sp, raws[i].charge, raws[i].err)
			keep(i, e, err)
			continue
		}
		e, err := s.cache.finish(ctx, id, l, func(ctx context.Context, alloc func(int) []byte) ([]byte, error) {
			if spanErr != nil {
				return s.rd.loadChunk(ctx, id, alloc)
			}
			if raw := raws[i].raw; raw != nil { // verified in place: a copy of its own
				out := alloc(len(raw))
				copy(out, raw)
				return out, nil
			}
			obj := span[locs[i].off-first.off : locs[i].off-first.off+locs[i].n]
			raw, baseErr, err := s.rd.decodeChunk(ctx, id, obj, alloc)
			if baseErr != nil {
				return nil, baseErr
			}
			if err == nil {
				s.storeReadBytes.Add(int64(len(raw)))
			}
			return raw, err
		})
		keep(i, e, err)
	}
	for i, l := range claimed {
		if l == nil && firstErr == nil {
			k, err := s.AcquireChunk(ctx, refs[i])
			out[i] = k
			if err != nil {
				firstErr = err
			}
		}
	}
	if firstErr != nil {
		for _, k := range out {
			k.Release()
		}
		return nil, firstErr
	}
	return out, nil
}

// inPlace is a claimed chunk of a run that is a raw object in the run's
// read: its bytes there, verified (or err), and the share of the read's
// buffer the cache counts for it when it is cached in place (zero: copy it).
type inPlace struct {
	raw    []byte
	err    error
	charge int64
}

// verifyInPlace verifies the claimed chunks of a run that are raw objects
// where span (the run's read, in sp) holds them, and decides whether they
// are cached in place: when their bytes fill at least half of sp's buffer,
// each is charged its length, the last the rest of the buffer.
func (s *Store) verifyInPlace(claimed []*load, refs []ChunkRef, locs []packLoc, span []byte, sp *spanBuf) []inPlace {
	raws := make([]inPlace, len(refs))
	var total int64
	lastOK := -1
	for i, l := range claimed {
		if l == nil {
			continue
		}
		o := locs[i].off - locs[0].off
		raw, ok, err := object.RawInPlace(refs[i].ID, span[o:o+locs[i].n])
		if !ok {
			continue
		}
		raws[i] = inPlace{raw: raw, err: err}
		if err == nil {
			s.storeReadBytes.Add(int64(len(raw)))
			total += int64(len(raw))
			lastOK = i
		}
	}
	if lastOK < 0 || 2*total < int64(cap(sp.buf)) {
		return raws // copied: too little of the buffer would be used
	}
	for i := range raws {
		if raws[i].err == nil && raws[i].raw != nil {
			raws[i].charge = int64(len(raws[i].raw))
		}
	}
	raws[lastOK].charge += int64(cap(sp.buf)) - total
	return raws
}

// sameArray reports whether a and b are slices of one array (they end at
// the same last element of their capacity).
func sameArray(a, b []byte) bool {
	if cap(a) == 0 || cap(b) == 0 {
		return false
	}
	return &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}
