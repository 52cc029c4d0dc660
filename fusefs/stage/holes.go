package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
	"golang.org/x/sys/unix"
)

// MinHole is the granule of holes. A commit keeps as holes (cas.Hole: no
// chunk, no space, no store read) the whole MinHole-aligned blocks of each
// never-written run of the file, and the rest of a run that reaches the
// file's end; when that is less than MinHole, the run is cut into chunks with
// the bytes around it, as zeros. Never-written runs are a spool's holes
// (SEEK_DATA/SEEK_HOLE: what the filesystem under the store never had
// written; its blocks divide MinHole, so aligning hides their size) and a
// stream's end past its last write (ftruncate beyond what was written): both
// give the same holes for the same writes, so streaming stays invisible in
// the catalog. Zeros that were written stay chunks.
const MinHole = 1 << 20

// holeIn returns the hole a commit keeps in the never-written run [a, b) of
// a file of size bytes (MinHole), and false when it keeps none.
func holeIn(a, b, size int64) (lo, hi int64, ok bool) {
	lo = (a + MinHole - 1) / MinHole * MinHole
	hi = b / MinHole * MinHole
	if b == size {
		hi = size
	}
	return lo, hi, hi-lo >= MinHole
}

// region is a run [off, end) of a spool that holds data.
type region struct{ off, end int64 }

// dataRegions returns the runs of spool (of size bytes) that a commit cuts
// into chunks, in order: [0, size) less the holes holeIn keeps in the
// spool's holes. A filesystem that cannot tell holes (SEEK_DATA fails with
// EINVAL) gives one run, the whole file.
func dataRegions(spool *os.File, size int64) ([]region, error) {
	fd := int(spool.Fd())
	var runs []region
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break // only a hole from off on
		}
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) {
			return []region{{0, size}}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("seek data in spool: %w", err)
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole in spool: %w", err)
		}
		runs = append(runs, region{d, min(h, size)})
		off = h
	}
	return cutHoles(runs, size), nil
}

// cutHoles turns the data runs of a file of size bytes (in order, apart)
// into the runs a commit cuts: [0, size) less the holes holeIn keeps in
// the gaps between them.
func cutHoles(data []region, size int64) []region {
	var out []region
	var start, end int64 // the run being built starts at start; data seen up to end
	for _, r := range append(data, region{size, size}) {
		if lo, hi, ok := holeIn(end, r.off, size); ok {
			if lo > start {
				out = append(out, region{start, lo})
			}
			start = hi
		}
		end = r.end
	}
	if size > start {
		out = append(out, region{start, size})
	}
	return out
}

// ingestSpool cuts the data runs of spool (dataRegions) into chunks, each
// run on its own as ingest cuts a file, and returns the chunks in file
// order, the holes between them, and the tensor index of the run at offset
// 0 (a file's format shows in its first bytes; a run further on is cut by
// content and indexed by nothing).
func ingestSpool(ctx context.Context, spool *os.File, size int64, maxChunk int, put putFunc) ([]cas.ChunkRef, []cas.Hole, *FileIndex, error) {
	runs, err := dataRegions(spool, size)
	if err != nil {
		return nil, nil, nil, err
	}
	m := &cas.Manifest{}
	var ix *FileIndex
	var end int64
	for _, r := range runs {
		m.AddHole(r.off - end)
		at := func(ctx context.Context, data []byte, dtype string, off int64) (cas.ChunkRef, error) {
			return put(ctx, data, dtype, r.off+off) // off is in the run; the pack's order, in the file
		}
		refs, rix, n, err := ingest(ctx, fixedSource{io.NewSectionReader(spool, r.off, r.end-r.off), r.end - r.off}, formats.NewChunker(maxChunk), at)
		if err != nil {
			return nil, nil, nil, err
		}
		if n != r.end-r.off {
			return nil, nil, nil, fmt.Errorf("spool run at %d: cut %d of %d bytes", r.off, n, r.end-r.off)
		}
		if r.off == 0 {
			ix = rix
		}
		m.Chunks = append(m.Chunks, refs...)
		end = r.end
	}
	m.AddHole(size - end)
	return m.Chunks, m.Holes, ix, nil
}

// HoleBytes is how many of the staged bytes were never written (what
// st_blocks leaves out): for a stream, those past its last write; for a
// spool, what its filesystem did not allocate.
func (f *File) HoleBytes() int64 {
	if s := f.stream; s != nil {
		return max(f.size-s.origin-s.written(), 0)
	}
	if f.spool == nil {
		return 0
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.spool.Fd()), &st); err != nil {
		return 0 // count it all as data
	}
	return max(f.size-st.Blocks*512, 0)
}

// SeekRegion answers lseek's SEEK_DATA (data true) and SEEK_HOLE from off, which
// is below the size, on the staged content, as the filesystem would on the
// file written so far: in a spool, its own data and holes; in a stream,
// the bytes written in order, then a hole to the size. A SEEK_DATA that
// finds only a hole from off on is ENXIO. The holes are the filesystem's
// blocks, finer than the MinHole-aligned ones a commit keeps: either is a
// correct answer (a hole may always be reported as data).
func (f *File) SeekRegion(off int64, data bool) (int64, error) {
	if s := f.stream; s != nil {
		s.mu.Lock()
		written := min(s.origin+s.appended, f.size)
		s.mu.Unlock()
		switch {
		case off < written && data:
			return off, nil
		case data:
			return 0, syscall.ENXIO
		case off < written:
			return written, nil
		}
		return off, nil
	}
	whence := unix.SEEK_HOLE
	if data {
		whence = unix.SEEK_DATA
	}
	got, err := unix.Seek(int(f.spool.Fd()), off, whence)
	switch {
	case err == nil && data && got >= f.size:
		return 0, syscall.ENXIO
	case err == nil:
		return min(got, f.size), nil
	case errors.Is(err, syscall.ENXIO) && data:
		return 0, syscall.ENXIO
	case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EOPNOTSUPP):
		// Past the spool's end (a hole to the size), or a filesystem
		// that cannot tell holes: all data.
		if data {
			return off, nil
		}
		if errors.Is(err, syscall.ENXIO) {
			return off, nil
		}
		return f.size, nil
	}
	return 0, fmt.Errorf("seek in spool: %w", err)
}
