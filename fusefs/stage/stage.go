package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
)

// DefaultWriteMemory is the memory all streams together may hold (NewPool).
const DefaultWriteMemory = 96 << 20

// maxSpoolIngests is how many Finishes ingest spooled content at once.
const maxSpoolIngests = 2

// Pool is what the files staged in one store share: the store their chunks
// go to, the write memory budget their streams take windows from, the spool
// files they may hold open, and the buffers of their streams. It is safe
// for concurrent use.
type Pool struct {
	store  *cas.Store
	blocks blockPool // memory of streams

	// Streams take their window from writeMemory; a file started when none
	// is left is spooled instead. ingestSem bounds the spooled Finishes
	// that ingest at once; spoolSlots holds one token per open spool.
	memMu       sync.Mutex
	streamUsed  int64
	writeMemory int64
	ingestSem   chan struct{}
	spoolSlots  chan struct{}
}

// NewPool returns the staging pool of store, whose streams together hold at
// most writeMemory bytes (the first stream always gets its window).
func NewPool(store *cas.Store, writeMemory int64) *Pool {
	return &Pool{store: store, writeMemory: writeMemory,
		ingestSem: make(chan struct{}, maxSpoolIngests), spoolSlots: make(chan struct{}, spoolBudget())}
}

// StreamMemory is the memory the streams of p have reserved now.
func (p *Pool) StreamMemory() int64 {
	p.memMu.Lock()
	defer p.memMu.Unlock()
	return p.streamUsed
}

// reserveStream takes a stream's first block from the write memory
// budget. The first stream always gets one.
func (p *Pool) reserveStream(n int64) bool { return p.growStream(0, n) }

// growStream takes extra more for a stream that holds have (0: a new one),
// unless the budget has no room for it and other streams hold some of it:
// a stream alone gets what it asks whatever the budget.
func (p *Pool) growStream(have, extra int64) bool {
	p.memMu.Lock()
	defer p.memMu.Unlock()
	if p.streamUsed > have && p.streamUsed+extra > p.writeMemory {
		return false
	}
	p.streamUsed += extra
	return true
}

func (p *Pool) unreserveStream(window int64) {
	p.memMu.Lock()
	defer p.memMu.Unlock()
	p.streamUsed -= window
}

// StreamWindow is the memory one stream holds at most for chunks of at most
// maxChunk bytes (see streamWindow).
func StreamWindow(maxChunk int) int64 { return streamWindow(maxChunk) }

// StreamBlock is the part of its window a stream takes at first.
const StreamBlock int64 = streamBlock

// A File is the new content of one file while it is written: in a stream
// (written from empty, in order: chunked and stored as it fills) or in a
// spool file (anything else; ingested whole by Finish). A stream turns into a
// spool when a change other than an append reaches it (Spill).
//
// A File is not safe for concurrent use: its caller serializes every call
// (fusefs holds the file's mu), except that ReadAt may run beside other
// ReadAts while the File does not stream. Its size is the caller's file
// size: every change below keeps the two equal.
type File struct {
	pool   *Pool
	ino    uint64 // names the spool file
	size   int64
	spool  *os.File // the content, unless stream holds it
	stream *stream
	// prefix is the committed content before the stream's origin, as its
	// chunks (StageAppend): the stream holds the bytes from there on. Nil
	// for a stream from 0 and for a spool.
	prefix []cas.ChunkRef
}

// Stage starts staging the content of file ino: the first keep bytes of
// manifest base copied into a spool (its holes left holes there), or, when
// keep is 0, empty content in a stream if the write memory budget has room
// for one, else in a spool.
func (p *Pool) Stage(ctx context.Context, ino uint64, base *cas.Manifest, keep int64) (*File, error) {
	f := &File{pool: p, ino: ino}
	if keep == 0 {
		if err := f.startEmpty(ctx); err != nil {
			return nil, err
		}
		return f, nil
	}
	sp, err := p.newSpool(ctx, ino)
	if err != nil {
		return nil, err
	}
	if err := sp.Truncate(keep); err != nil {
		p.closeSpool(sp)
		return nil, fmt.Errorf("size spool: %w", err)
	}
	if _, err := p.spoolChunks(ctx, sp, base, keep); err != nil {
		p.closeSpool(sp)
		return nil, fmt.Errorf("copy committed content to spool: %w", err)
	}
	f.spool, f.size = sp, keep
	return f, nil
}

// StageAppend starts staging the content of file ino, committed as base
// and kept whole, for a write at its end. A file cut by content alone
// (formats.CutsByContent: logs, CSV, TensorBoard's event files) with no
// holes keeps its chunks but the last, pinned in the stream's batch: a
// stream starts at the last chunk, fed that chunk's bytes, and continues
// with the appends. Its cuts are those a commit of the whole content would
// make (formats.NewContentChunker), so an append costs the last chunk and
// the new bytes, where copying the file into a spool and ingesting it whole
// cost the whole file at every open, write and close (TensorBoard reopens
// its event file at each flush). Any other file is staged as Stage does,
// and so is one whose stream cannot start (no write memory, a chunk gone).
func (p *Pool) StageAppend(ctx context.Context, ino uint64, base *cas.Manifest) (*File, error) {
	if f := p.stageAppend(ctx, ino, base); f != nil {
		return f, nil
	}
	return p.Stage(ctx, ino, base, base.Size())
}

// stageAppend is StageAppend's stream, or nil where it does not apply.
func (p *Pool) stageAppend(ctx context.Context, ino uint64, base *cas.Manifest) *File {
	last := len(base.Chunks) - 1
	if last < 1 || len(base.Holes) > 0 {
		return nil
	}
	head, err := p.store.AcquireChunk(ctx, base.Chunks[0])
	if err != nil {
		return nil // the copy into a spool reports it
	}
	byContent := formats.CutsByContent(head.Data[:min(len(head.Data), 16)])
	head.Release()
	if !byContent {
		return nil
	}
	tail, err := p.store.AcquireChunk(ctx, base.Chunks[last])
	if err != nil {
		return nil
	}
	defer tail.Release()
	batch := p.store.NewBatch()
	if err := batch.Reuse(ctx, base.Chunks[:last]); err != nil {
		batch.Release()
		return nil
	}
	origin := base.Size() - int64(len(tail.Data))
	s := p.startStream(origin, batch)
	if s == nil {
		batch.Release()
		return nil
	}
	if ok, err := s.write(tail.Data, 0); !ok || err != nil {
		s.abandon()
		return nil
	}
	return &File{pool: p, ino: ino, size: base.Size(), stream: s, prefix: base.Chunks[:last]}
}

// startEmpty stages empty content: in a stream if the write memory budget
// has room for one, else in an empty spool.
func (f *File) startEmpty(ctx context.Context) error {
	f.size, f.prefix = 0, nil
	if s := f.pool.startStream(0, nil); s != nil {
		f.stream = s
		return nil
	}
	sp, err := f.pool.newSpool(ctx, f.ino)
	if err != nil {
		return err
	}
	f.spool = sp
	return nil
}

// LostError is the error of a change that dropped the staged content (a
// stream whose chunks could not be stored, or whose bytes could not be moved
// to a spool): the File holds nothing any more, and its caller must Abort it
// and show the committed content again. Its text is its cause's.
type LostError struct{ Err error }

func (e *LostError) Error() string { return e.Err.Error() }
func (e *LostError) Unwrap() error { return e.Err }

// IsLost reports whether err says the staged content was dropped.
func IsLost(err error) bool {
	var l *LostError
	return errors.As(err, &l)
}

// Size is the size of the staged content.
func (f *File) Size() int64 { return f.size }

// Streaming reports whether the content is in a stream: ReadAt then needs
// Spill first.
func (f *File) Streaming() bool { return f.stream != nil }

// Holds reports whether f still holds content (Finish of a stream, or a
// failed Spill, leaves it holding none).
func (f *File) Holds() bool { return f.stream != nil || f.spool != nil }

// WriteAt stages p at off: appended to the stream if off is where it ends,
// else in the spool (spilling the stream first). An error that dropped the
// content is a *LostError, and then nothing was written.
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if s := f.stream; s != nil {
		ok, err := false, error(nil)
		if off >= s.origin {
			ok, err = s.write(p, off-s.origin)
		}
		if ok && err != nil {
			// The streamer failed (the store is full?): what it took is lost.
			return 0, &LostError{err}
		}
		if ok {
			f.size = max(f.size, off+int64(len(p)))
			return len(p), nil
		}
		if err := f.Spill(ctx); err != nil {
			return 0, &LostError{err}
		}
	}
	k, err := f.spool.WriteAt(p, off)
	if end := off + int64(k); end > f.size {
		f.size = end
	}
	return k, err
}

// Truncate sets the size. Truncated to nothing, a stream starts over; grown
// past what was written, it records a hole; cut below it, it spills. An
// error that dropped the content is a *LostError.
func (f *File) Truncate(ctx context.Context, size int64) error {
	if s := f.stream; s != nil {
		switch {
		case size == 0:
			// Truncated to nothing again (open with O_TRUNC): start over.
			s.abandon()
			f.stream = nil
			if err := f.startEmpty(ctx); err != nil {
				return &LostError{err}
			}
		case size >= s.origin+s.written():
			s.extend(size - s.origin)
		default:
			if err := f.Spill(ctx); err != nil {
				return &LostError{err}
			}
		}
	}
	if f.spool != nil {
		if err := f.spool.Truncate(size); err != nil {
			return fmt.Errorf("truncate spool: %w", err)
		}
	}
	f.size = size
	return nil
}

// ReadAt reads staged bytes into p, clipped at the size, and returns how
// many; a hole reads as zeros. The content must not be streaming (Spill).
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), f.size)
	if off >= end {
		return 0, nil
	}
	k, err := f.spool.ReadAt(p[:end-off], off)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	// A sparse spool reads short at a hole past its end: the rest is zeros.
	clear(p[k : end-off])
	return int(end - off), nil
}

// Spill turns a stream into a spool holding the same bytes: the committed
// chunks before its origin and the chunks the stream stored, read back from
// the store, then what is still in memory, then the hole up to the size. On
// failure f holds nothing (Holds).
func (f *File) Spill(ctx context.Context) error {
	s := f.stream
	if s == nil {
		return nil
	}
	// A spill given up half way loses the staged content: it runs to its
	// end whoever's request started it (a READ interrupted by a signal).
	ctx = context.WithoutCancel(ctx)
	s.halt()
	defer func() {
		s.cancel()
		s.freeMemory()
		s.batch.Release()
		f.stream, f.prefix = nil, nil
	}()
	if s.err != nil && !errors.Is(s.err, errStreamStopped) {
		return fmt.Errorf("staged content lost: %w", s.err)
	}
	sp, err := f.pool.newSpool(ctx, f.ino)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		f.pool.closeSpool(sp)
		return fmt.Errorf("materialize stream: %w", err)
	}
	end, err := f.pool.spoolChunks(ctx, sp, &cas.Manifest{Chunks: slices.Concat(f.prefix, s.refs)}, s.origin+s.chunked)
	if err != nil {
		return fail(err)
	}
	if end != s.origin+s.chunked {
		return fail(fmt.Errorf("chunks cover %d bytes, the stream cut %d from %d", end, s.chunked, s.origin))
	}
	off := s.chunked // the stream's own offsets from here
	rest := make([]byte, min(s.appended-off, streamBlock))
	for off < s.appended {
		k := min(int64(len(rest)), s.appended-off)
		s.ReadAt(rest[:k], off)
		if _, err := sp.WriteAt(rest[:k], s.origin+off); err != nil {
			return fail(err)
		}
		off += k
	}
	if err := sp.Truncate(f.size); err != nil {
		return fail(err)
	}
	f.spool = sp
	return nil
}

// Result is the content a Finish cut: its chunks in file order, stored in
// Batch (pinned until the caller releases it), the holes between them
// (cas.Manifest's), and the tensor index.
type Result struct {
	Batch  *cas.Batch
	Chunks []cas.ChunkRef
	Holes  []cas.Hole
	Index  *FileIndex
}

// Finish cuts the staged content into chunks stored in a new batch, which
// the caller commits and releases. A stream only finishes its tail, and
// then f holds nothing: the bytes exist only as the batch's chunks. A spool
// is ingested whole (at most maxSpoolIngests at once) and stays, for the
// writers that go on. On error no batch is returned; a stream's failure
// means its content is lost (the caller Aborts f).
func (f *File) Finish(ctx context.Context) (Result, error) {
	if s := f.stream; s != nil {
		refs, hole, ix, err := s.finish(f.size - s.origin)
		if err != nil {
			return Result{}, err
		}
		if len(f.prefix) > 0 {
			refs = slices.Concat(f.prefix, refs)
		}
		f.stream, f.prefix = nil, nil
		m := cas.Manifest{Chunks: refs}
		m.AddHole(hole)
		return Result{Batch: s.batch, Chunks: refs, Holes: m.Holes, Index: ix}, nil
	}
	batch := f.pool.store.NewBatch()
	if f.spool == nil || f.size == 0 {
		return Result{Batch: batch}, nil
	}
	put := func(ctx context.Context, data []byte, dtype string, off int64) (cas.ChunkRef, error) {
		return putChunk(ctx, batch, data, dtype, off)
	}
	// A spool ingest holds a few blocks and putWorkers chunks: bound how
	// many run at once (the write memory budget).
	select {
	case f.pool.ingestSem <- struct{}{}:
	case <-ctx.Done():
		batch.Release()
		return Result{}, ctx.Err()
	}
	refs, holes, ix, err := ingestSpool(ctx, f.spool, f.size, f.pool.store.ChunkSize(), put)
	<-f.pool.ingestSem
	if err != nil {
		batch.Release()
		return Result{}, err
	}
	return Result{Batch: batch, Chunks: refs, Holes: holes, Index: ix}, nil
}

// Abort drops the staged content: it stops a stream, frees its memory and
// deletes the chunks it stored, and closes the spool.
func (f *File) Abort() {
	if s := f.stream; s != nil {
		s.abandon()
		f.stream, f.prefix = nil, nil
	}
	if f.spool != nil {
		f.pool.closeSpool(f.spool)
		f.spool = nil
	}
}
