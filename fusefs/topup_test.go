package fusefs

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// TestStreamTopUpKeepsAhead: in a stream of 256 KiB READs (two in flight:
// READ k+1 is already on its way when READ k's prefetch runs), every READ
// finds its range queued when the READ two before it was answered, whatever
// the cache's size (window = cache/4): topping up by batches must not wait
// for the reader to catch up with a window of a batch or two.
func TestStreamTopUpKeepsAhead(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	for _, cacheMiB := range []int64{2, 4, 6, 8, 16} {
		store := filepath.Join(t.TempDir(), "store")
		s, err := cas.Open(store, cas.Options{CacheSize: cacheMiB * M, Objects: local.New(cas.ObjectsDir(store), local.Options{})})
		if err != nil {
			t.Fatal(err)
		}
		const size, chunk = 64 * M, 32 * K
		m := &cas.Manifest{}
		var offsets []int64
		for off := int64(0); off < size; off += chunk {
			var id cas.ID
			binary.LittleEndian.PutUint64(id[:], uint64(off)+1)
			m.Chunks = append(m.Chunks, cas.ChunkRef{ID: id, Len: chunk})
			offsets = append(offsets, off)
		}
		var rs readState
		var queuedAfter []int64
		for off := int64(0); off < size; off += 256 * K {
			rs.prefetchAfter(s, m, offsets, nil, off, off+256*K)
			rs.mu.Lock()
			queuedAfter = append(queuedAfter, rs.queued)
			rs.mu.Unlock()
		}
		var uncovered, streamReads int
		for k := 2; k < len(queuedAfter); k++ {
			off := int64(k) * 256 * K
			if off < 8*M || off+256*K > size-2*M { // in the stream, not at its ends
				continue
			}
			streamReads++
			if queuedAfter[k-2] < off+256*K {
				uncovered++
			}
		}
		if uncovered > 0 {
			t.Errorf("cache %d MiB (window %d KiB): %d of %d READs not queued when the READ two before them was answered", cacheMiB, cacheMiB*M/4/K, uncovered, streamReads)
		}
		s.Close()
	}
}
