package cas

import (
	"container/list"
	"context"
	"sync"
)

// cache is a bounded LRU of decoded chunks with single-flight loading: concurrent
// readers of one missing chunk wait for one load.
//
// Buffers are recycled: decoding into fresh memory costs a page fault per 4 KiB
// (dearer than the decode itself on these VMs), so an evicted chunk's buffer
// is reused for the next load, but only once nobody holds it. Holders are
// counted: Acquire hands out a *Chunk that must be released; get (ReadChunk)
// hands out a plain slice and marks the entry shared, so its buffer is never
// reused and the garbage collector keeps it for whoever still has it.
type cache struct {
	mu      sync.Mutex
	budget  int64
	used    int64
	lru     *list.List // front = most recently used; values are *cacheEntry
	entries map[ID]*list.Element
	loading map[ID]*load

	free    [cacheClasses][][]byte // recycled buffers by class: cap bufSize>>class
	bufSize int
	spans   [][]byte // recycled span buffers (spanBuf), at most spanFreeKeep
	spent   int64    // bytes of spent entries (Chunk.Passed), at most budget/spentShare
	// newestSpent is the front-most spent entry's element: spent entries
	// are the LRU's tail, newest first, so that Back is the oldest spent.
	newestSpent *list.Element
}

type cacheEntry struct {
	id      ID
	data    []byte
	holders int  // Chunks not released yet
	shared  bool // handed out as a plain slice: never recycled
	evicted bool // no longer in the cache: recycle when the last holder goes
	// span is the buffer data lies in when the entry is a raw chunk
	// verified in place in a run's read (spanBuf); charge is then what the
	// budget counts for it, the entries of a span together its whole
	// buffer.
	span   *spanBuf
	charge int64
	// passed: a stream read past the chunk (Chunk.Passed); spent: so did
	// it past every entry of its span, and the entry is counted in
	// cache.spent, at the back of the LRU.
	passed, spent bool
}

// spanBuf is the buffer of one read of a run of packed chunks
// (AcquireChunks) whose raw chunks' entries keep their bytes where the read
// put them, verified in place: no copy into buffers of their own (16 % of
// the daemon's CPU in a cold read of incompressible bytes, issue #25). The
// budget counts the whole buffer, spread over its entries, so gaps and
// headers between them are counted too; evicting one of them evicts all
// (evictLocked), so the buffer is never kept alive by one small chunk beyond
// what the budget counts. The buffer is reused (spanBuffer) once every
// entry is gone and released and the run itself is done (live counts the
// run as one), unless an entry was handed out as a plain slice (get): then
// the garbage collector keeps it for whoever still has it.
type spanBuf struct {
	buf     []byte // the read's buffer, its whole capacity
	live    int    // entries not recycled yet, plus one while the run runs
	running bool   // the run is still adding entries (no pass spends them yet)
	reuse   bool   // buf is the cache's to reuse (not memory of a backend's)
	members []*cacheEntry
}

type load struct {
	done    chan struct{}
	entry   *cacheEntry
	waiters int // callers waiting for this load, each counted as a holder when it ends
	err     error
}

// Chunk is a decoded chunk held out of the cache. Data stays valid, and
// unchanged, until Release.
type Chunk struct {
	Data []byte
	c    *cache
	e    *cacheEntry
}

// Release gives the chunk back. Data must not be used after.
func (k *Chunk) Release() {
	if k == nil || k.e == nil {
		return
	}
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	k.e.holders--
	k.c.maybeRecycleLocked(k.e)
	k.e = nil
}

// Passed tells the cache that a reader has had all of k's bytes, which the
// kernel's page cache now holds: k's entry is spent, and joins the LRU's
// tail of spent entries, the first to be evicted, oldest first; they are
// kept up to a budget/spentShare of them, so that the other READ a stream
// has in flight, or a re-read soon after, still finds them. An entry in a
// span (spanBuf) is spent once its run has added every entry of the span
// and each has been passed, since evicting one evicts them all. A cold
// stream then recycles a few buffers (its prefetch window's and the spent
// share's) instead of filling the whole budget with fresh memory that
// holds what the page cache holds too (a cold read of 1 GiB left the
// daemon 290 MiB of RSS), and what lazy readers have cached stays. An entry
// acquired again is live again. k may be held or released after.
//
// What it costs: the chunk cache serves every file that holds a chunk,
// the page cache only the file read. A second file with the same content
// (a copy, or the next step's frozen tensors) read soon after finds in the
// chunk cache only what the spent share kept, and reads the rest from the
// store again (a cache larger than the file used to keep all of it).
func (k *Chunk) Passed() {
	if k == nil || k.e == nil {
		return
	}
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	k.c.passLocked(k.e)
}

func (c *cache) passLocked(e *cacheEntry) {
	if e.passed || e.evicted {
		return
	}
	e.passed = true
	if e.span != nil {
		c.spendSpanLocked(e.span)
		return
	}
	c.spendLocked([]*cacheEntry{e})
}

// spendSpanLocked spends sp's entries once its run has added them all and
// every one has been passed (evicting one evicts them all).
func (c *cache) spendSpanLocked(sp *spanBuf) {
	if sp.running {
		return
	}
	for _, m := range sp.members {
		if !m.passed && !m.evicted {
			return
		}
	}
	c.spendLocked(sp.members)
}

// spendLocked moves members to the LRU's spent tail, newest first, and
// evicts the oldest spent while they hold more than their share.
func (c *cache) spendLocked(members []*cacheEntry) {
	for _, m := range members {
		if el, ok := c.entries[m.id]; ok && !m.spent && !m.evicted && el.Value.(*cacheEntry) == m {
			if c.newestSpent != nil {
				c.lru.MoveBefore(el, c.newestSpent)
			} else {
				c.lru.MoveToBack(el)
			}
			c.newestSpent = el
			m.spent = true
			c.spent += held(m)
		}
	}
	for c.spent > c.budget/spentShare {
		el := c.lru.Back()
		if el == nil || !el.Value.(*cacheEntry).spent {
			break
		}
		c.evictLocked(el)
	}
}

// spentShare: spent entries (Chunk.Passed) are kept up to budget/spentShare.
const spentShare = 8

// touchLocked notes a new use of e, in the cache: it is neither passed nor
// spent any more until it is passed again. (A stream's READs come two at a
// time, in either order: the READ that reads a chunk's head after the one
// that read past its tail passes it again, fusefs passing every chunk up to
// the stream's frontier.)
func (c *cache) touchLocked(el *list.Element, e *cacheEntry) {
	c.unspendLocked(el, e)
	c.lru.MoveToFront(el)
	e.passed = false
}

// cacheFreeKeep bounds the recycled buffers kept of each class (beside the
// budget).
const cacheFreeKeep = 16

// cacheClasses is how many buffer sizes are recycled: bufSize, its half, and
// so on down to bufSize/32 (32 KiB for 1 MiB chunks, FastCDC's average).
const cacheClasses = 6

func newCache(budget int64, bufSize int) *cache {
	return &cache{budget: budget, lru: list.New(), entries: map[ID]*list.Element{}, loading: map[ID]*load{}, bufSize: bufSize}
}

// class returns the class of a buffer for n bytes: the smallest of bufSize,
// bufSize/2, ... bufSize/32 that holds n, if n fills more than half of it
// (so a buffer never holds twice what the budget counts it for, as a small
// chunk, a tensor's edge or a header, in a megabyte would); ok is false
// otherwise.
func (c *cache) class(n int) (k int, ok bool) {
	for k = 0; k < cacheClasses; k++ {
		size := c.bufSize >> k
		if n > size {
			return 0, false
		}
		if n > size/2 {
			return k, true
		}
	}
	return 0, false
}

// buffer returns a buffer of n bytes for a load, recycled when it can be.
// Recycled buffers are a class's size (class) and their pages are in
// memory: a cold read of ~32 KiB chunks spent 15 % of the daemon's time
// allocating and clearing fresh ones.
func (c *cache) buffer(n int) []byte {
	k, ok := c.class(n)
	if !ok {
		return make([]byte, n)
	}
	c.mu.Lock()
	if m := len(c.free[k]); m > 0 {
		b := c.free[k][m-1]
		c.free[k] = c.free[k][:m-1]
		c.mu.Unlock()
		return b[:n]
	}
	c.mu.Unlock()
	return make([]byte, n, c.bufSize>>k)
}

// held is the memory an entry's buffer holds, which the budget counts: its
// capacity, not its length (its charge, for an entry in a span).
func held(e *cacheEntry) int64 {
	if e.span != nil {
		return e.charge
	}
	return int64(cap(e.data))
}

// spanFreeKeep bounds how many span buffers are kept for reuse.
const spanFreeKeep = 16

// spanBuffer returns a buffer for a run's read of n bytes (the backend may
// need some more, to align a direct read): a recycled one when one is large
// enough and at most spanSlack larger (the budget counts its capacity),
// else a new one spanSlack larger than needed, so that it fits the runs
// that follow, of about the same length (a prefetcher's batches). A fresh
// buffer costs a page fault per 4 KiB in the read that fills it.
func (c *cache) spanBuffer(n int) []byte {
	want := n + 3*4096
	c.mu.Lock()
	for i, b := range c.spans {
		if cap(b) >= want && cap(b) <= want+spanSlack {
			c.spans = append(c.spans[:i], c.spans[i+1:]...)
			c.mu.Unlock()
			return b[:0]
		}
	}
	c.mu.Unlock()
	const step = 64 << 10
	return make([]byte, 0, (want+spanSlack/2+step-1)/step*step)
}

// spanSlack is how much larger than a run's read a recycled buffer may be.
const spanSlack = 512 << 10

// newSpan wraps buf, the buffer of a run's read, for entries whose data
// lie in it; reuse says whether buf may be reused once they are gone. The
// caller ends its own use with releaseSpan.
func (c *cache) newSpan(buf []byte, reuse bool) *spanBuf {
	return &spanBuf{buf: buf[:0:cap(buf)], live: 1, reuse: reuse, running: true}
}

// releaseSpan drops one use of sp (an entry recycled, or the run done);
// the last one gives its buffer back for reuse (mu held).
func (c *cache) releaseSpanLocked(sp *spanBuf) {
	if sp.live--; sp.live > 0 {
		return
	}
	// Kept: at most spanFreeKeep buffers, of at most an eighth of the
	// budget in all (memory beside the budget); the larger ones, since a
	// short run's buffer fits few others.
	var kept int
	small := -1
	for i, b := range c.spans {
		kept += cap(b)
		if small < 0 || cap(b) < cap(c.spans[small]) {
			small = i
		}
	}
	switch room := int(c.budget/8) - kept; {
	case !sp.reuse:
	case len(c.spans) < spanFreeKeep && cap(sp.buf) <= room:
		c.spans = append(c.spans, sp.buf)
	case small >= 0 && cap(sp.buf) > cap(c.spans[small]) && cap(sp.buf)-cap(c.spans[small]) <= room:
		c.spans[small] = sp.buf
	}
	sp.buf, sp.members = nil, nil
}

// releaseSpan is releaseSpanLocked for the run that read sp.
func (c *cache) releaseSpan(sp *spanBuf) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sp.running = false
	// A reader may have passed every entry while the run was still adding
	// some: the span is spent now if so.
	c.spendSpanLocked(sp)
	c.releaseSpanLocked(sp)
}

// get returns chunk id as a shared slice (never recycled).
func (c *cache) get(ctx context.Context, id ID, fill func(ctx context.Context, buf func(int) []byte) ([]byte, error)) ([]byte, error) {
	e, err := c.acquire(ctx, id, fill)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	e.shared = true
	e.holders--
	c.mu.Unlock()
	return e.data, nil
}

// acquire returns chunk id's entry with one holder counted for the caller,
// from the cache or from fill (once for all concurrent callers). fill decodes
// into a buffer it gets from its argument.
//
// The load runs on its own goroutine, under ctx without its cancellation, so
// that one caller giving up (its ctx done: an interrupted read of a slow
// remote) neither fails the others waiting for the same chunk nor wastes the
// work; every caller, the first included, waits for it or for its own ctx.
// Under a ctx that is never done the first caller cannot give up, so the
// load runs on its goroutine instead.
func (c *cache) acquire(ctx context.Context, id ID, fill func(ctx context.Context, buf func(int) []byte) ([]byte, error)) (*cacheEntry, error) {
	c.mu.Lock()
	if el, ok := c.entries[id]; ok {
		e := el.Value.(*cacheEntry)
		c.touchLocked(el, e)
		e.holders++
		c.mu.Unlock()
		return e, nil
	}
	l, ok := c.loading[id]
	if !ok {
		l = &load{done: make(chan struct{})}
		c.loading[id] = l
		if ctx.Done() == nil {
			// Nobody can give up on a load under a context that is never
			// done (a prefetch worker's): it runs on this goroutine. A
			// goroutine per load cost a fresh stack grown to the depth of
			// a decode, 7 % of a cold read of ~32 KiB chunks (copystack).
			l.waiters++
			c.mu.Unlock()
			c.fill(ctx, id, l, fill)
			return l.entry, l.err
		}
		go c.fill(context.WithoutCancel(ctx), id, l, fill)
	}
	l.waiters++
	c.mu.Unlock()
	select {
	case <-l.done:
		return l.entry, l.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-l.done: // finished meanwhile: give back the holder it counted for us
		if l.entry != nil {
			l.entry.holders--
			c.maybeRecycleLocked(l.entry)
		}
	default:
		l.waiters--
	}
	return nil, ctx.Err()
}

// fill runs one load and hands its entry to the waiters counted by then.
func (c *cache) fill(ctx context.Context, id ID, l *load, fill func(ctx context.Context, buf func(int) []byte) ([]byte, error)) {
	data, err := fill(ctx, c.buffer)

	c.mu.Lock()
	delete(c.loading, id)
	l.err = err
	if err == nil {
		l.entry = &cacheEntry{id: id, data: data, holders: l.waiters, evicted: true}
		c.insertLocked(l.entry)
		c.maybeRecycleLocked(l.entry) // everyone gave up and the cache could not keep it
	}
	close(l.done)
	c.mu.Unlock()
}

func (c *cache) insertLocked(e *cacheEntry) {
	size := held(e)
	if size > c.budget {
		return // stays evicted: recycled when its holders are done
	}
	for c.used+size > c.budget {
		c.evictLocked(c.lru.Back())
	}
	e.evicted = false
	c.entries[e.id] = c.lru.PushFront(e)
	c.used += size
}

// unspendLocked takes e, el's entry, out of the spent tail (touched again,
// or evicted): out of cache.spent, and newestSpent moves past it.
func (c *cache) unspendLocked(el *list.Element, e *cacheEntry) {
	if !e.spent {
		return
	}
	e.spent = false
	c.spent -= held(e)
	if el == c.newestSpent {
		c.newestSpent = nil
		if n := el.Next(); n != nil && n.Value.(*cacheEntry).spent {
			c.newestSpent = n
		}
	}
}

func (c *cache) evictLocked(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.unspendLocked(el, e)
	c.lru.Remove(el)
	delete(c.entries, e.id)
	c.used -= held(e)
	e.evicted = true
	if sp := e.span; sp != nil {
		// The span's other entries go with it (spanBuf).
		for _, m := range sp.members {
			if mel, ok := c.entries[m.id]; ok && !m.evicted && mel.Value.(*cacheEntry) == m {
				c.evictLocked(mel)
			}
		}
	}
	c.maybeRecycleLocked(e)
}

// maybeRecycleLocked keeps an evicted entry's buffer for reuse once nobody
// holds it (mu held).
func (c *cache) maybeRecycleLocked(e *cacheEntry) {
	if !e.evicted || e.holders > 0 || e.shared || e.data == nil {
		return
	}
	if e.span != nil {
		e.data = nil
		c.releaseSpanLocked(e.span)
		return
	}
	if k, ok := c.class(cap(e.data)); ok && cap(e.data) == c.bufSize>>k && len(c.free[k]) < cacheFreeKeep {
		c.free[k] = append(c.free[k], e.data[:0])
	}
	e.data = nil
}

func (c *cache) bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// drop forgets chunk id (its object was deleted).
func (c *cache) drop(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[id]; ok {
		c.evictLocked(el)
	}
}

// peek returns chunk id's entry with one holder counted for the caller when
// it is cached; it never waits for a load in flight.
func (c *cache) peek(id ID) (*cacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[id]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	c.touchLocked(el, e)
	e.holders++
	return e, true
}

// has reports whether chunk id is cached or being loaded.
func (c *cache) has(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, cached := c.entries[id]
	_, loading := c.loading[id]
	return cached || loading
}

// claim registers a load of each chunk of ids that is neither cached nor
// loading, for the caller to run with finish, and returns those loads by
// index (nil where it claimed none). Other callers of acquire wait for a
// claimed load instead of loading the chunk a second time: a run's chunks
// are claimed before its read, so that a reader that asks for one of them
// meanwhile waits for it rather than reading it again on its own.
//
// The caller must finish every load it claimed, failed or not, before it
// waits for any other load (acquire): two callers, each waiting for a chunk
// the other claimed, would deadlock (a file holds the same chunk twice).
func (c *cache) claim(ids []ID) []*load {
	ls := make([]*load, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		if _, ok := c.entries[id]; ok {
			continue
		}
		if _, ok := c.loading[id]; ok {
			continue
		}
		ls[i] = &load{done: make(chan struct{}), waiters: 1}
		c.loading[id] = ls[i]
	}
	return ls
}

// finishSpan ends claimed load l of chunk id with data, bytes that lie in
// span sp and were verified there (the budget counts charge for them), or
// with err, and returns its entry with one holder counted for the caller.
func (c *cache) finishSpan(id ID, l *load, data []byte, sp *spanBuf, charge int64, err error) (*cacheEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.loading, id)
	l.err = err
	if err == nil {
		l.entry = &cacheEntry{id: id, data: data, holders: l.waiters, evicted: true, span: sp, charge: charge}
		sp.live++
		sp.members = append(sp.members, l.entry)
		c.insertLocked(l.entry)
		c.maybeRecycleLocked(l.entry)
	}
	close(l.done)
	return l.entry, l.err
}

// finish runs claimed load l of chunk id on this goroutine and returns its
// entry with one holder counted for the caller.
func (c *cache) finish(ctx context.Context, id ID, l *load, fill func(ctx context.Context, buf func(int) []byte) ([]byte, error)) (*cacheEntry, error) {
	c.fill(context.WithoutCancel(ctx), id, l, fill)
	return l.entry, l.err
}
