package fusefs

import (
	"context"
	"errors"
	"os"
	"sort"
	"sync"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
)

// A stream ingests a file while it is being written (DESIGN.md, write path):
// a goroutine follows the contiguous prefix of written bytes, cuts, hashes and
// stores its chunks, so that close only finishes the tail and commits.
//
// It starts when staging starts from an empty file (a new file, or one
// truncated by open(O_TRUNC)). Bytes count as there once a write has put them
// in the spool; a hole (from ftruncate to the full size before writing, as
// safetensors does) is not there until written, or until the commit says the
// file is final. The streamer claims a range (advances its cursor) before
// reading it, so a write or a truncation below the cursor means its result no
// longer matches the spool: the stream is broken, and the commit discards it
// and ingests the spool from scratch. Chunks a broken stream stored are
// harmless orphans for gc.
//
// Locking: the file's mu is taken before s.mu (Write, resize); the streamer
// goroutine takes only s.mu, never the file's mu, so a commit that holds the
// file's mu can wait for it.
type stream struct {
	spool *os.File
	batch *cas.Batch

	mu       sync.Mutex
	cond     *sync.Cond
	there    int64  // [0, there) is written
	extents  []span // written ranges beyond there, sorted, disjoint
	consumed int64  // the streamer's cursor
	final    bool
	size     int64 // with final: the file's size
	broken   bool
	cancel   context.CancelFunc

	done  chan struct{}
	refs  []cas.ChunkRef
	index *FileIndex
	err   error
}

type span struct{ off, end int64 }

// startStream begins ingesting spool as it is written (file mu held).
func (n *fileNode) startStream() {
	ctx, cancel := context.WithCancel(context.Background())
	s := &stream{spool: n.spool, batch: n.fsys.store.NewBatch(), cancel: cancel, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	n.stream = s
	go func() {
		defer close(s.done)
		put := func(ctx context.Context, data []byte, dtype string) (cas.ChunkRef, error) {
			return putChunk(ctx, s.batch, data, dtype)
		}
		var size int64
		s.refs, s.index, size, s.err = ingest(ctx, s, n.fsys.store.ChunkSize(), put)
		if s.err == nil && size != s.size {
			s.err = errors.New("stream ended before the file's end")
		}
	}()
}

// ReadAt reads the spool (ingest's reads stay below what avail granted).
func (s *stream) ReadAt(p []byte, off int64) (int, error) { return s.spool.ReadAt(p, off) }

// avail waits for bytes from off, claiming what it grants.
func (s *stream) avail(ctx context.Context, off, want int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.broken {
			return 0, errStreamBroken
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		limit := s.there
		if s.final {
			limit = s.size
		}
		if n := min(want, limit-off); n > 0 && (n == want || s.final) {
			s.consumed = off + n
			return n, nil
		}
		if s.final {
			return 0, nil // off == size
		}
		s.cond.Wait()
	}
}

var errStreamBroken = errors.New("stream broken by a write below its cursor")

// wrote records that [off, end) is in the spool (file mu held).
func (s *stream) wrote(off, end int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off < s.consumed {
		s.broken = true
		s.cond.Broadcast()
		return
	}
	if off > s.there {
		s.addExtent(span{off, end})
		return
	}
	s.there = max(s.there, end)
	// Absorb extents the write made contiguous.
	for len(s.extents) > 0 && s.extents[0].off <= s.there {
		s.there = max(s.there, s.extents[0].end)
		s.extents = s.extents[1:]
	}
	s.cond.Broadcast()
}

func (s *stream) addExtent(e span) {
	i := sort.Search(len(s.extents), func(i int) bool { return s.extents[i].off > e.off })
	s.extents = append(s.extents, span{})
	copy(s.extents[i+1:], s.extents[i:])
	s.extents[i] = e
	// Merge overlapping neighbours.
	out := s.extents[:0]
	for _, x := range s.extents {
		if len(out) > 0 && x.off <= out[len(out)-1].end {
			out[len(out)-1].end = max(out[len(out)-1].end, x.end)
			continue
		}
		out = append(out, x)
	}
	s.extents = out
}

// resized records a truncation to size (file mu held).
func (s *stream) resized(size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if size < s.consumed {
		s.broken = true
		s.cond.Broadcast()
		return
	}
	s.there = min(s.there, size)
	out := s.extents[:0]
	for _, x := range s.extents {
		if x.off < size {
			out = append(out, span{x.off, min(x.end, size)})
		}
	}
	s.extents = out
}

// finish declares the file final at size and waits for the streamer. It
// returns ok=false when the stream cannot be used (broken, failed).
func (s *stream) finish(size int64) (refs []cas.ChunkRef, ix *FileIndex, ok bool) {
	s.mu.Lock()
	s.final, s.size = true, size
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.done
	s.mu.Lock()
	broken := s.broken
	s.mu.Unlock()
	if broken || s.err != nil {
		return nil, nil, false
	}
	return s.refs, s.index, true
}

// abandon stops the streamer and drops its pins.
func (s *stream) abandon() {
	s.mu.Lock()
	s.broken = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.cancel()
	<-s.done
	s.batch.Release()
}

// putChunk stores one chunk of a commit, telling cas the element size of the
// tensor data it holds, so bf16/fp16/fp32 chunks get the byte-grouped codec.
func putChunk(ctx context.Context, b *cas.Batch, data []byte, dtype string) (cas.ChunkRef, error) {
	var h cas.Hint
	if bits := formats.DTypeBits(dtype); bits == 16 || bits == 32 {
		h.ElemSize = bits / 8
	}
	return b.PutHinted(ctx, data, h)
}
