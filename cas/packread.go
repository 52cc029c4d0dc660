package cas

import (
	"context"
	"fmt"
)

// maxRunSpan bounds the bytes one read of AcquireChunks covers.
const maxRunSpan = 16 << 20

// AcquireChunks is AcquireChunk for several chunks, usually consecutive
// chunks of a file (a prefetcher's run): the objects of chunks that lie
// back to back in one pack, as a commit packs a file's small chunks, are
// read with one read of their span; each is then verified and decoded as
// AcquireChunk would, and enters the cache. Chunks cached already, and
// chunks of their own, are acquired one by one. The caller releases every
// chunk returned; on an error none is held.
func (s *Store) AcquireChunks(ctx context.Context, refs []ChunkRef) ([]*Chunk, error) {
	locs := make([]packLoc, len(refs)) // zero pack: not packed, or cached
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
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("locate chunks: %w", err)
	}
	out := make([]*Chunk, 0, len(refs))
	fail := func(err error) ([]*Chunk, error) {
		for _, k := range out {
			k.Release()
		}
		return nil, err
	}
	for i := 0; i < len(refs); {
		j := runEnd(locs, i)
		if j-i < 2 {
			k, err := s.AcquireChunk(ctx, refs[i])
			if err != nil {
				return fail(err)
			}
			out = append(out, k)
			i++
			continue
		}
		ks, err := s.acquireRun(ctx, refs[i:j], locs[i:j])
		out = append(out, ks...)
		if err != nil {
			return fail(err)
		}
		i = j
	}
	return out, nil
}

// runEnd returns the end of the run of chunks from i on that lie back to
// back in one pack, within maxRunSpan.
func runEnd(locs []packLoc, i int) int {
	if locs[i].pack == (ID{}) {
		return i + 1
	}
	j := i + 1
	for j < len(locs) && locs[j].pack == locs[i].pack &&
		locs[j].off == locs[j-1].off+locs[j-1].n &&
		locs[j].off+locs[j].n-locs[i].off <= maxRunSpan {
		j++
	}
	return j
}

// acquireRun reads the span of a run of packed chunks at once and acquires
// each chunk from it.
func (s *Store) acquireRun(ctx context.Context, refs []ChunkRef, locs []packLoc) ([]*Chunk, error) {
	first, last := locs[0], locs[len(locs)-1]
	span, err := s.packs.getRange(ctx, packLoc{first.pack, first.off, last.off + last.n - first.off}, nil)
	if err != nil {
		return nil, fmt.Errorf("chunk %v: %w", refs[0].ID, err)
	}
	out := make([]*Chunk, 0, len(refs))
	for i, ref := range refs {
		obj := span[locs[i].off-first.off : locs[i].off-first.off+locs[i].n]
		e, err := s.cache.acquire(ctx, ref.ID, func(ctx context.Context, alloc func(int) []byte) ([]byte, error) {
			raw, baseErr, err := s.rd.decodeChunk(ctx, ref.ID, obj, alloc)
			if baseErr != nil {
				return nil, baseErr
			}
			if err == nil {
				s.storeReadBytes.Add(int64(len(raw)))
			}
			return raw, err
		})
		if err != nil {
			return out, err
		}
		k := &Chunk{Data: e.data, c: s.cache, e: e}
		out = append(out, k)
		if len(e.data) != int(ref.Len) {
			return out, fmt.Errorf("chunk %v: %w: %d bytes, manifest says %d", ref.ID, ErrCorrupt, len(e.data), ref.Len)
		}
	}
	return out, nil
}
