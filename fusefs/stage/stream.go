package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
)

// A stream stages a file that is written from empty, in order, without a
// spool (DESIGN.md, write path): writes append to memory blocks, and a
// goroutine cuts, hashes and stores chunks from them as they fill, so that
// close only finishes the tail and commits. Memory holds only the bytes the
// chunker has not cut yet, at most its window (streamWindow): a writer that gets
// further ahead waits. Bytes already cut live in the store (as the objects of
// the stream's batch, pinned until its commit).
//
// Anything but appending — a write elsewhere, a truncation below what was
// written, a read of the staged bytes — first spills the stream (File.Spill): the
// streamer stops, the chunks it stored and the bytes still in memory are
// copied into a spool file, and the file continues as a spooled one, ingested
// whole at commit. Common writers (torch.save, safetensors, numpy, HF) only
// append, possibly after sizing the file with ftruncate.
//
// A pre-sizing truncation makes [appended, size) a hole: it reads as zeros unless
// written (in order) before the commit, and is committed as a hole (no chunk)
// when it is at least MinHole long.
//
// Locking: the File's caller serializes write, extend, finish and halt
// (fusefs holds the file's mu); the streamer goroutine takes only s.mu,
// never a lock of the caller's, so a writer holding one may wait for it.
type stream struct {
	pool  *Pool
	batch *cas.Batch

	// origin is the file offset of the stream's offset 0: 0 for a file
	// written from empty; a cut of the committed content for one that grows
	// by appends (Pool.StageAppend), whose stream holds only what follows it.
	// The stream's offsets are its own; origin only aligns its end's hole
	// as the file's (finish).
	origin int64

	mu       sync.Mutex
	cond     *sync.Cond
	base     int64    // file offset of blocks[0], a multiple of streamBlock
	blocks   []*block // memory holding [base, appended); each holds a reference for the stream
	appended int64    // [0, appended) is written
	sized    bool     // finish fixed the file's size: it ends at size
	size     int64
	stop     bool // Spill wants the streamer to stop
	cancel   context.CancelFunc

	window   int64 // the most memory it holds now: a writer further ahead waits
	full     int64 // streamWindow: what window grows to (see startStream)
	reserved int64 // what it took from FS.streamMem, until freeMemory

	done    chan struct{}
	refs    []cas.ChunkRef // when done: the chunks of [0, chunked)
	chunked int64
	index   *FileIndex
	err     error
}

const streamBlock = readBlock

// streamWindow is the memory one stream may hold: a writer ahead of the
// streamer by that much waits for it. The streamer takes a whole block past
// what it fed the chunker, and frees a block only once the chunker cut past
// its end, so the window must hold the chunker's lag (formats.MaxLag) rounded
// up to blocks, plus those two blocks; one more lets the writer run ahead.
// Less, and a writer waits for a cut that never comes.
func streamWindow(maxChunk int) int64 {
	lag := (formats.MaxLag(maxChunk) + streamBlock - 1) / streamBlock * streamBlock
	return lag + 3*streamBlock
}

// startStream starts a stream, or returns nil when the write memory budget
// has no room for another one: the caller spools instead.
//
// A stream takes one block of the budget at first, and its whole window
// only when its file outgrows that block (write): most files that many
// writers write at once are small (a rank's shard of a tiny model, a
// config, metrics), and with whole windows taken up front four of them
// spent the default budget, so that the fifth writer on went through a
// spool file (created, written, read back and unlinked for 4 KiB). A
// stream that cannot grow spills, as a file started with the budget spent
// is spooled.
//
// A stream at origin > 0 continues a file cut by content alone from one of
// its cuts (formats.NewContentChunker); batch, when not nil, is the batch
// that pins the chunks before origin (cas.Batch.Reuse), which the stream's
// chunks join.
func (p *Pool) startStream(origin int64, batch *cas.Batch) *stream {
	full := streamWindow(p.store.ChunkSize())
	window := min(full, streamBlock)
	if !p.reserveStream(window) {
		return nil
	}
	if batch == nil {
		batch = p.store.NewBatch()
	}
	ch := formats.NewChunker(p.store.ChunkSize())
	if origin > 0 {
		ch = formats.NewContentChunker(p.store.ChunkSize())
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &stream{pool: p, batch: batch, origin: origin, cancel: cancel, done: make(chan struct{}),
		window: window, full: full, reserved: window}
	s.cond = sync.NewCond(&s.mu)
	go func() {
		defer close(s.done)
		put := func(ctx context.Context, data []byte, dtype string, off int64) (cas.ChunkRef, error) {
			return putChunk(ctx, s.batch, data, dtype, off)
		}
		refs, ix, chunked, err := ingest(ctx, s, ch, put)
		s.mu.Lock()
		s.refs, s.index, s.chunked, s.err = refs, ix, chunked, err
		if err == nil && chunked != s.size {
			s.err = errors.New("stream ended before the file's end")
		}
		s.cond.Broadcast() // a writer waiting for room
		s.mu.Unlock()
	}()
	return s
}

var errStreamStopped = errors.New("stream stopped")

// avail waits for bytes from off, claiming what it grants.
func (s *stream) avail(ctx context.Context, off, want int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.stop {
			return 0, errStreamStopped
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		limit := s.appended
		if s.sized {
			limit = s.size
		}
		if n := min(want, limit-off); n > 0 && (n == want || s.sized) {
			return n, nil
		}
		if s.sized {
			return 0, nil // off == size
		}
		s.cond.Wait()
	}
}

// ReadAt copies staged bytes that avail granted and release has not dropped;
// the hole past what was written reads as zeros.
func (s *stream) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	if off < s.base {
		s.mu.Unlock()
		return 0, fmt.Errorf("stream: read at %d below its memory at %d", off, s.base)
	}
	// Bytes below appended never change while the streamer runs (changing them
	// stops it first), so they are copied without the lock.
	base, appended, blocks := s.base, s.appended, s.blocks
	s.mu.Unlock()
	k := 0
	for k < len(p) && off < appended {
		rel := off - base
		b := blocks[rel/streamBlock].buf[rel%streamBlock:]
		c := copy(p[k:], b[:min(int64(len(b)), appended-off)])
		k += c
		off += int64(c)
	}
	clear(p[k:])
	return len(p), nil
}

// borrow lends the block holding [off, off+n), and those bytes: avail
// granted them, so off is the start of a block and nothing changes them any
// more. Past the written bytes (a hole) they are zeros.
func (s *stream) borrow(off, n int64) (*block, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rel := off - s.base
	if rel < 0 || rel%streamBlock != 0 {
		panic(fmt.Sprintf("stream: borrow at %d, memory at %d", off, s.base))
	}
	var b *block
	if i := int(rel / streamBlock); i < len(s.blocks) {
		b = s.blocks[i]
		b.refs.Add(1)
	} else {
		b = s.pool.blocks.block(off, streamBlock)
	}
	if written := max(s.appended-off, 0); written < n {
		clear(b.buf[written:n])
	}
	return b, b.buf[:n]
}

// release lets the memory below off go: the chunker has cut up to off.
func (s *stream) release(off int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	freed := false
	for len(s.blocks) > 0 && s.base+streamBlock <= off && s.base+streamBlock <= s.appended {
		s.blocks[0].unref()
		s.blocks[0] = nil
		s.blocks = s.blocks[1:]
		s.base += streamBlock
		freed = true
	}
	if freed {
		s.cond.Broadcast()
	}
}

// write appends data at off. ok is false when off is not where the stream
// ends, or when its file outgrows the stream's first block and the budget
// has no room for its whole window: the caller spills. err is the
// streamer's failure.
func (s *stream) write(data []byte, off int64) (ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off != s.appended {
		return false, nil
	}
	if s.window < s.full && s.appended+int64(len(data))-s.base > s.window {
		if !s.pool.growStream(s.reserved, s.full-s.window) {
			return false, nil // spilled, as a file started with no room is spooled
		}
		s.reserved += s.full - s.window
		s.window = s.full
	}
	for len(data) > 0 {
		for s.appended-s.base >= s.window && !s.ended() {
			s.cond.Wait()
		}
		if s.ended() {
			if s.err != nil {
				return true, s.err
			}
			return true, errors.New("stream ended early")
		}
		rel := s.appended - s.base
		i := int(rel / streamBlock)
		if i == len(s.blocks) {
			s.blocks = append(s.blocks, s.pool.blocks.block(s.base+rel, streamBlock))
		}
		c := copy(s.blocks[i].buf[rel%streamBlock:], data)
		data = data[c:]
		s.appended += int64(c)
	}
	s.cond.Broadcast()
	return true, nil
}

// ended reports whether the streamer goroutine has finished (s.mu held).
func (s *stream) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// extend records a truncation to size ≥ appended: a hole.
func (s *stream) extend(size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.size = size
}

// written is the end of the appended bytes.
func (s *stream) written() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appended
}

// finish fixes the file's size and waits for the streamer. When the file
// ends well past the last write (a pre-sizing ftruncate whose bytes never
// came), the streamer stops where holeIn's hole starts and finish returns
// the rest as hole, which then costs nothing whatever its length.
func (s *stream) finish(size int64) ([]cas.ChunkRef, int64, *FileIndex, error) {
	s.mu.Lock()
	var hole int64
	if lo, _, ok := holeIn(s.origin+s.appended, s.origin+size, s.origin+size); ok {
		hole = s.origin + size - lo
	}
	s.sized, s.size = true, size-hole
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.done
	s.freeMemory()
	if s.err != nil {
		return nil, 0, nil, s.err
	}
	return s.refs, hole, s.index, nil
}

// halt stops the streamer and waits for it. The chunks of [0, s.chunked) are
// then in s.refs and the bytes from s.chunked to s.appended in memory, unless s.err.
func (s *stream) halt() {
	s.mu.Lock()
	s.stop = true
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.done
}

// abandon stops the streamer and drops its memory and pins.
func (s *stream) abandon() {
	s.halt()
	s.cancel()
	s.freeMemory()
	s.batch.Release()
}

// freeMemory drops the stream's blocks and gives its window back to the
// budget (after the streamer ended, so no put holds a block).
func (s *stream) freeMemory() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.blocks {
		b.unref()
	}
	s.blocks = nil
	if s.reserved > 0 {
		s.pool.unreserveStream(s.reserved)
		s.reserved = 0
	}
}

func (s *stream) indexReader(ctx context.Context, refs []cas.ChunkRef, starts []int64) io.ReaderAt {
	return chunkReader{ctx, s.pool.store, refs, starts}
}

// chunkReader reads a file from its chunks in the store (after a stream's
// memory is gone: tensor hashes of views that do not start a chunk).
type chunkReader struct {
	ctx    context.Context
	store  *cas.Store
	refs   []cas.ChunkRef
	starts []int64
}

func (r chunkReader) ReadAt(p []byte, off int64) (int, error) {
	k := 0
	for k < len(p) {
		i := searchStarts(r.starts, off)
		if i < 0 || i >= len(r.refs) || off >= r.starts[i]+int64(r.refs[i].Len) {
			return k, io.EOF
		}
		data, err := r.store.ReadChunk(r.ctx, r.refs[i])
		if err != nil {
			return k, err
		}
		c := copy(p[k:], data[off-r.starts[i]:])
		k += c
		off += int64(c)
	}
	return k, nil
}
