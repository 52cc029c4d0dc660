package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
	"golang.org/x/sync/errgroup"
)

// readBlock is how much of a file the chunker is fed at a time.
const readBlock = 4 << 20

// putFunc stores (or only names) one chunk. dtype is the element type of the
// tensor data it holds ("" if none), a hint for compression; off is where
// the chunk starts in what is being ingested (cas.Batch.PutAt's order, so
// that a pack holds a file's chunks in file order).
type putFunc func(ctx context.Context, data []byte, dtype string, off int64) (cas.ChunkRef, error)

// source gives ingest a file's bytes in order: through ReadAt, once avail
// said they are there.
type source interface {
	io.ReaderAt
	// avail waits until min(want, what remains) bytes from off can be read
	// and returns that count; 0 means the file ends at off.
	avail(ctx context.Context, off, want int64) (int64, error)
}

// releaser is a source that lets bytes go once they are cut: ingest reads
// below the last cut no more, and reads what buildIndex needs through
// indexReader.
type releaser interface {
	release(off int64)
	indexReader(ctx context.Context, refs []cas.ChunkRef, starts []int64) io.ReaderAt
}

// borrower is a source that holds its bytes in blocks of readBlock and lends
// them instead of copying: borrow returns the block (one reference taken)
// holding exactly [off, off+n), which avail granted.
type borrower interface {
	borrow(off, n int64) (*block, []byte)
}

// fixedSource is a file whose size is known and whose bytes are all there.
type fixedSource struct {
	io.ReaderAt
	size int64
}

func (f fixedSource) avail(_ context.Context, off, want int64) (int64, error) {
	return max(min(want, f.size-off), 0), nil
}

// ingest cuts a file into chunks with ch (formats.NewChunker: chunks start
// at tensor starts, content-defined cuts elsewhere), passes each chunk to put on up to
// putWorkers goroutines, and returns the chunks in file order, the file's
// tensor index, and its size.
//
// Each byte is read from src once: a chunk that lies inside one block is put
// straight from that block (blocks are reference-counted and recycled, so a
// commit allocates a handful of them, not a buffer per chunk); only a chunk
// that straddles two blocks is read again into its own buffer.
func ingest(ctx context.Context, src source, ch *formats.Chunker, put putFunc) ([]cas.ChunkRef, *FileIndex, int64, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(putWorkers)
	var blocks blockPool // when src does not lend its own
	// One slot per chunk, filled by the worker that stores it.
	var slots []*cas.ChunkRef
	var starts []int64
	var prev int64
	submit := func(cuts []formats.Cut, blk *block) error { // blk: the bytes from blk.off just fed
		for _, cut := range cuts {
			slot, off, n, dtype := new(cas.ChunkRef), prev, cut.End-prev, cut.DType
			slots = append(slots, slot)
			starts = append(starts, off)
			prev = cut.End
			if blk != nil && off >= blk.off {
				blk.refs.Add(1)
				data := blk.buf[off-blk.off : off-blk.off+n]
				g.Go(func() error {
					defer blk.unref()
					ref, err := put(gctx, data, dtype, off)
					*slot = ref
					return err
				})
				continue
			}
			// Read now: the source may let these bytes go once they are cut.
			buf := make([]byte, n)
			if err := readFull(src, buf, off); err != nil {
				return err
			}
			g.Go(func() error {
				ref, err := put(gctx, buf, dtype, off)
				*slot = ref
				return err
			})
		}
		if r, ok := src.(releaser); ok {
			r.release(prev)
		}
		return nil
	}
	// collect returns the chunks stored so far, in file order (after g.Wait).
	collect := func() []cas.ChunkRef {
		refs := make([]cas.ChunkRef, len(slots))
		for i, s := range slots {
			refs[i] = *s
		}
		return refs
	}
	var size int64
	for gctx.Err() == nil {
		n, err := src.avail(gctx, size, readBlock)
		if err != nil {
			if werr := g.Wait(); werr != nil {
				return nil, nil, 0, werr
			}
			return collect(), nil, prev, err
		}
		if n == 0 {
			break
		}
		var blk *block
		var data []byte
		if b, ok := src.(borrower); ok {
			blk, data = b.borrow(size, n)
		} else {
			blk = blocks.block(size, n)
			data = blk.buf[:n]
			if err := readFull(src, data, size); err != nil {
				blk.unref()
				g.Wait()
				return nil, nil, 0, err
			}
		}
		err = submit(ch.WriteCuts(data), blk)
		blk.unref() // the chunker keeps no reference to what it was fed
		if err != nil {
			g.Wait()
			return nil, nil, 0, err
		}
		size += n
	}
	cuts, fix := ch.CloseCuts()
	if err := submit(cuts, nil); err != nil {
		g.Wait()
		return nil, nil, 0, err
	}
	if err := g.Wait(); err != nil {
		return nil, nil, 0, err
	}
	if prev != size {
		return nil, nil, 0, fmt.Errorf("chunker covered %d of %d bytes", prev, size)
	}
	refs := collect()
	var ixr io.ReaderAt = src
	if r, ok := src.(releaser); ok {
		ixr = r.indexReader(ctx, refs, starts)
	}
	ix, err := buildIndex(ixr, fix, refs, starts)
	if err != nil {
		return nil, nil, 0, err
	}
	return refs, ix, size, nil
}

// A block is up to readBlock bytes of the file at off, shared by the
// ingest and the workers putting the chunks inside it. refs counts them (and,
// for a stream's block, the stream); the last unref gives buf back to pool.
type block struct {
	buf  []byte
	off  int64
	refs atomic.Int32
	pool *blockPool
}

func (b *block) unref() {
	if b.refs.Add(-1) == 0 {
		b.pool.put(b.buf)
	}
}

// blockPool recycles buffers of readBlock bytes. Fresh memory costs a page
// fault per page, which on these VMs is dearer than the copy that fills it,
// so a few free buffers are kept.
type blockPool struct {
	mu   sync.Mutex
	free [][]byte
}

const blockPoolKeep = 16

// block returns a block of the file at off holding one reference, with room
// for n bytes: a whole readBlock, recycled, unless n is less and none is
// free (a spooled file of 4 KiB allocated and faulted in 4 MiB, some ms of
// CPU, for an ingest whose pool lives as long as the file's commit).
func (p *blockPool) block(off int64, n int64) *block {
	b := &block{buf: p.get(n), off: off, pool: p}
	b.refs.Store(1)
	return b
}

func (p *blockPool) get(n int64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free = p.free[:k-1]
		return b
	}
	if n < readBlock {
		return make([]byte, n)
	}
	return make([]byte, readBlock)
}

func (p *blockPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cap(b) >= readBlock && len(p.free) < blockPoolKeep {
		p.free = append(p.free, b[:readBlock])
	}
}

func readFull(r io.ReaderAt, buf []byte, off int64) error {
	k, err := r.ReadAt(buf, off)
	if k == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		clear(buf[k:]) // a hole at the end of a sparse spool reads as zeros
		return nil
	}
	return fmt.Errorf("read at %d: %w", off, err)
}

// putWorkers is how many chunks one commit hashes, encodes and writes at once:
// enough to keep both cores and the disk busy.
const putWorkers = 16

// putChunk stores one chunk of a commit, telling cas the element size of the
// tensor data it holds, so bf16/fp16/fp32 chunks get the byte-grouped codec.
func putChunk(ctx context.Context, b *cas.Batch, data []byte, dtype string, off int64) (cas.ChunkRef, error) {
	var h cas.Hint
	if bits := formats.DTypeBits(dtype); bits == 16 || bits == 32 {
		h.ElemSize = bits / 8
	}
	return b.PutAt(ctx, data, h, off)
}
