package fusefs

import (
	"context"
	"sort"
	"sync/atomic"

	"github.com/ckptfs/ckptfs/cas"
)

// Prefetch: after a read of committed content, the daemon loads into its chunk
// cache what the reader will probably ask for next, on other goroutines, so
// that disk reads, decoding and verification overlap the kernel's requests:
//
//   - more of the tensor the read landed in, once the reader has read
//     restAfter bytes of it in sequence, a quarter of what it read so far
//     ahead of it (a reader of some rows of a large tensor, np.load(mmap_mode)
//     of one array or safetensors' get_slice, pays at most a quarter more
//     than it reads; a lazy reader of one tensor fetches
//     nothing it will not read; neither a read-around request nor the kernel's
//     async readahead running past the end of the tensor being read, nor a
//     header probe (torch.load reads each zip record's local header, a page
//     or two that straddle the previous tensor's end and this one's start)
//     pulls a neighbouring tensor in), and
//   - once a reader has read sequentially for streakBytes, across two whole
//     tensors if the file has a tensor index, the next prefetchAhead bytes
//     whatever the tensors (a full load or a copy). A lazy reader that reads
//     all of one tensor, plus the kernel's read-around on both sides, does not
//     pull in the tensors after it.
//
// The window never exceeds a quarter of the cache, so prefetching cannot evict
// what is being read. At most prefetchLoads chunks load at once per file.
//
// A cold sequential read is CPU-bound on two cores (decode, verify, the kernel's
// copies); with 16 MiB and 4 loads the daemon still left a core idle at times.
// 32 MiB and 8 loads took a cold 1 GiB read from 1.32 to 1.22 s (medians of
// 3, alternating). Lazy readers never reach this window (streakBytes).
const (
	prefetchAhead = 32 << 20
	// streakBytes must exceed one mmap read-around batch (twice the kernel
	// readahead under POSIX_FADV_SEQUENTIAL, 2 MiB by default), whose READs
	// look sequential: a lazy reader's single fault must not start a stream.
	streakBytes   = 4 << 20
	prefetchLoads = 8
	// restAfter must exceed how far the kernel reads past a lazy reader's
	// last byte: three windows of twice the readahead (POSIX_FADV_SEQUENTIAL)
	// at DefaultReadAheadKB, 768 KiB, on Linux 6.18. At 1 MiB the kernel's
	// readahead into the next tensor started its prefetch: 3 MiB more per
	// tensor read (issue #13).
	restAfter = 1 << 20
)

// readState is a file's sequential-read detector.
type readState struct {
	lastEnd atomic.Int64 // end of the previous read
	streak  atomic.Int64 // bytes read sequentially up to lastEnd
	running atomic.Int32 // prefetch goroutines of this file, reserved before they start
}

// tensorSpan is a tensor's byte range, for prefetch.
type tensorSpan struct{ off, end int64 }

// tensorSpans returns the sorted byte ranges of the tensors in m's index.
func tensorSpans(m *cas.Manifest) []tensorSpan {
	ix, err := ParseFileIndex(m.Extra)
	if err != nil || len(ix.Tensors) == 0 {
		return nil
	}
	spans := make([]tensorSpan, 0, len(ix.Tensors))
	for _, t := range ix.Tensors {
		if t.Length > 0 {
			spans = append(spans, tensorSpan{t.Offset, t.Offset + t.Length})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	return spans
}

// streamsTensors reports whether a sequential streak [start, end) looks like
// a reader going through the file rather than one lazy reader taking one
// tensor: it holds two whole tensors (or the file has no tensor index). A lazy
// reader's streak holds one: its tensor, plus the kernel's read-around and
// readahead on either side.
func streamsTensors(spans []tensorSpan, start, end int64) bool {
	if len(spans) == 0 {
		return true
	}
	j := sort.Search(len(spans), func(i int) bool { return spans[i].off >= start })
	return j+1 < len(spans) && spans[j+1].end <= end
}

// prefetchAfter starts loading from store what probably follows a read of
// [off, end) of manifest m (chunk offsets, tensor spans), a file whose
// reads rs follows.
func (rs *readState) prefetchAfter(store *cas.Store, m *cas.Manifest, offsets []int64, spans []tensorSpan, off, end int64) {
	prev := rs.lastEnd.Swap(end)
	sequential := prev == off
	if sequential {
		rs.streak.Add(end - off)
	} else {
		rs.streak.Store(end - off)
	}
	limit := end
	// More of the tensor holding the read, once the reader has gone
	// restAfter bytes into it in sequence.
	i := sort.Search(len(spans), func(i int) bool { return spans[i].off > end-1 }) - 1
	if i >= 0 && spans[i].end > end {
		if in := min(rs.streak.Load(), end-spans[i].off); in >= restAfter {
			limit = min(spans[i].end, end+in/4)
		}
	}
	if streak := rs.streak.Load(); streak >= streakBytes && streamsTensors(spans, end-streak, end) {
		limit = max(limit, end+prefetchAhead)
	}
	window := min(int64(prefetchAhead), store.CacheSize()/4)
	limit = min(limit, end+window, m.Size())
	if limit <= end {
		return
	}
	// Chunks that start before limit and are not cached or loading yet.
	first := sort.Search(len(offsets), func(i int) bool { return offsets[i] >= end })
	var todo []cas.ChunkRef
	for j := first; j < len(offsets) && offsets[j] < limit; j++ {
		if !store.Cached(m.Chunks[j].ID) {
			todo = append(todo, m.Chunks[j])
		}
	}
	if len(todo) == 0 {
		return
	}
	// Reserve loaders before starting them, so that concurrent reads of the
	// file cannot together exceed prefetchLoads (each load holds a decode and
	// an object buffer outside the cache's budget).
	var per int // chunks per loader
	for {
		r := rs.running.Load()
		free := int(prefetchLoads - r)
		if free <= 0 {
			return
		}
		per = (len(todo) + free - 1) / free
		parts := (len(todo) + per - 1) / per // ≤ free
		if rs.running.CompareAndSwap(r, r+int32(parts)) {
			break
		}
	}
	for start := 0; start < len(todo); start += per {
		part := todo[start:min(start+per, len(todo))]
		go func() {
			defer rs.running.Add(-1)
			for _, c := range part {
				// A failure (a corrupt chunk) shows when the reader gets there.
				k, err := store.AcquireChunk(context.Background(), c)
				if err != nil {
					return
				}
				k.Release()
			}
		}()
	}
}
