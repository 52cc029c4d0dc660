package fusefs

import (
	"context"
	"runtime"
	"sort"
	"sync"

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
// what is being read. "In sequence" is a run of reads (readState), not exact
// succession, which the kernel's reordered READs broke at every other one.
//
// The chunks to prefetch go into the file's queue, in file order, and
// prefetchWorkers goroutines (one per core, at least four) take them from its
// head: the chunk the reader needs next loads first, on every core at once.
// (Before, the window was cut into one contiguous part per loader: the
// reader waited on the first part, loaded at a fraction of the machine.) A
// seek drops what is queued; loads already started finish into the cache.
//
// A cold sequential read is CPU-bound on two cores (decode, verify, the
// kernel's copies): the queue cannot make it cheaper there, only keep the
// cores busy; on many cores it is what lets a stream use them.
const (
	prefetchAhead = 32 << 20
	// streakBytes must exceed one mmap read-around batch (twice the kernel
	// readahead under POSIX_FADV_SEQUENTIAL, 2 MiB by default), whose READs
	// look sequential: a lazy reader's single fault must not start a stream.
	streakBytes = 4 << 20
	// seqSlack is how far a read may start from the end of the run it
	// continues: more than the READs the kernel has in flight for one
	// stream (two of the readahead, 256 KiB each by default, or of
	// max_pages, 1 MiB, under a larger readahead), less than the 4 MiB
	// between two of bench's lazily read tensors.
	seqSlack = 2 << 20
	// restAfter must exceed how far the kernel reads past a lazy reader's
	// last byte: three windows of twice the readahead (POSIX_FADV_SEQUENTIAL)
	// at DefaultReadAheadKB, 768 KiB, on Linux 6.18. At 1 MiB the kernel's
	// readahead into the next tensor started its prefetch: 3 MiB more per
	// tensor read (issue #13).
	restAfter = 1 << 20
)

// readScale is what a mount's kernel readahead of ra bytes multiplies
// streakBytes, seqSlack and restAfter by: each is set for
// DefaultReadAheadKB and grows with the kernel's windows. At a readahead of
// 4 MiB the kernel has several 1 MiB READs of a stream in flight, up to
// 3 MiB behind the furthest: with the slack of 256 KiB's windows a cold
// read of 1 GiB restarted its run (and dropped its prefetch) 148 times.
func readScale(ra int64) int64 { return max(1, ra/(DefaultReadAheadKB<<10)) }

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

// readState is a file's sequential-read detector and its prefetch queue.
//
// A run is a stretch of reads that continue one another: a read that starts
// within seqSlack of the furthest end the run reached (before or after it)
// continues the run, as long as the run stays dense (it read at least half
// of the span it covers). Exact succession is no test: the kernel keeps two
// READs of a stream in flight (its readahead's synchronous and async
// windows), and they reach here in either order; tested for exact
// succession, a cold dd broke its run at every other READ and never
// prefetched (traced, doc.go). Density keeps probes out: torch.load reads
// every record's zip header, a few KiB per tensor, and headers of small
// tensors lie within seqSlack of each other. Any other read is a seek: it
// starts a new run and drops the chunks queued for the old one.
type readState struct {
	mu       sync.Mutex
	start    int64          // where the current run began
	frontier int64          // the furthest end a read of the run reached
	read     int64          // bytes of [start, frontier) the run's reads covered (about)
	queued   int64          // the run's prefetch is queued up to here
	queue    []cas.ChunkRef // chunks to load, in file order
	workers  int            // goroutines loading the queue
}

// prefetchAfter notes a read of [off, end) of manifest m (chunk offsets,
// tensor spans) and queues for loading from store what probably follows;
// stream reports whether the read is part of a stream (a full load or a
// copy, not a lazy reader's tensor), and front how far the stream has read
// (its READs before it may still be in flight).
func (rs *readState) prefetchAfter(store *cas.Store, m *cas.Manifest, offsets []int64, spans []tensorSpan, off, end, scale int64) (stream bool, front int64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.note(off, end, seqSlack*scale)
	front, streak := rs.frontier, rs.read
	limit := front
	// More of the tensor holding the read, once the reader has gone
	// restAfter bytes into it in sequence.
	i := sort.Search(len(spans), func(i int) bool { return spans[i].off > front-1 }) - 1
	if i >= 0 && spans[i].end > front {
		if in := min(streak, front-spans[i].off); in >= restAfter*scale {
			limit = min(spans[i].end, front+in/4)
		}
	}
	if stream = streak >= streakBytes*scale && streamsTensors(spans, rs.start, front); stream {
		limit = max(limit, front+prefetchAhead)
	}
	window := min(int64(prefetchAhead), store.CacheSize()/4)
	size := manifestSize(m, offsets)
	limit = min(limit, front+window, size)
	from := max(rs.queued, front)
	if limit <= from {
		return stream, front
	}
	// A stream's window moves on by each READ's length (256 KiB at the
	// default readahead): queued as it comes, it makes batches of a few
	// chunks, which idle workers take at once. It is topped up a batch at
	// a time instead, while what is queued ahead of the reader lasts:
	// whole batches are one read of a MiB each, whose buffer the cache
	// keeps the chunks in and reuses for the next (cas: a short run's
	// chunks are copied out of a buffer mostly empty). Only while half the
	// window is still queued ahead: a window of a batch or two (a cache of
	// a few MiB) would otherwise be topped up only once the reader had
	// caught up with it.
	if limit == front+window && limit < size && rs.queued-front >= window/2 && limit-from < min(prefetchBatch, window/2) {
		return stream, front
	}
	rs.queued = limit
	// Chunks that start in [from, limit) and are not cached or loading yet.
	for j := sort.Search(len(offsets), func(i int) bool { return offsets[i] >= from }); j < len(offsets) && offsets[j] < limit; j++ {
		if !store.Cached(m.Chunks[j].ID) {
			rs.queue = append(rs.queue, m.Chunks[j])
		}
	}
	for rs.workers < prefetchWorkers() && rs.workers < len(rs.queue) {
		rs.workers++
		go rs.load(store)
	}
	return stream, front
}

// note adds a read of [off, end) to the current run, if it starts within
// slack of how far the run has read, or starts a new run there (mu held).
func (rs *readState) note(off, end, slack int64) {
	near := off >= rs.frontier-slack && off <= rs.frontier+slack
	if near {
		// A read behind the frontier counts (its READ arrived after the
		// one beyond it), one behind the run's start too (the start
		// moves back to it: the run began with a READ that overtook
		// it); one read twice counts twice, up to the span.
		rs.start = min(rs.start, off)
		rs.frontier = max(rs.frontier, end)
		rs.read = min(rs.read+end-off, rs.frontier-rs.start)
	}
	if !near || rs.read < (rs.frontier-rs.start)/2 {
		rs.start, rs.frontier, rs.read, rs.queued = off, end, end-off, end
		rs.queue = nil
	}
}

// load loads the queued chunks into store's cache, first queued first, until
// the queue is empty. A worker takes a batch at a time from the queue's head:
// up to prefetchBatch bytes of chunks, which AcquireChunks locates in one
// catalog transaction and, where they lie back to back in a pack (a file of
// small chunks), reads with one read (see doc.go, "Prefetch batches").
func (rs *readState) load(store *cas.Store) {
	var batch []cas.ChunkRef
	for {
		rs.mu.Lock()
		if len(rs.queue) == 0 {
			rs.queue = nil
			rs.workers--
			rs.mu.Unlock()
			return
		}
		batch = append(batch[:0], rs.queue[:batchLen(rs.queue)]...)
		rs.queue = rs.queue[len(batch):]
		rs.mu.Unlock()
		// A failure (a corrupt chunk) shows when the reader gets there:
		// the chunks of the batch after it are then not loaded here.
		// context.Background, never done: the loads run on this goroutine.
		if ks, err := store.AcquireChunks(context.Background(), batch); err == nil {
			for _, k := range ks {
				k.Release()
			}
		}
	}
}

// prefetchBatch bounds the bytes of chunks one prefetch worker takes from
// the queue at once: a MiB is 32 of FastCDC's ~32 KiB chunks (one read and
// one catalog transaction instead of 32 of each), one chunk of a tensor
// file's (1 MiB), and small beside the window, so that the workers still
// share a stream's chunks.
const prefetchBatch = 1 << 20

// batchLen is how many chunks at q's head make one batch: at least one, up
// to prefetchBatch bytes.
func batchLen(q []cas.ChunkRef) int {
	n, size := 1, int64(q[0].Len)
	for n < len(q) && size+int64(q[n].Len) <= prefetchBatch {
		size += int64(q[n].Len)
		n++
	}
	return n
}

// prefetchWorkers is how many chunks of one file load at once: one per core
// the daemon may use, and at least four, so that a remote tier's fetches
// overlap on a small machine. Each load holds an object buffer and a decode
// outside the cache's budget.
func prefetchWorkers() int { return max(4, runtime.GOMAXPROCS(0)) }
