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
}

type cacheEntry struct {
	id      ID
	data    []byte
	holders int  // Chunks not released yet
	shared  bool // handed out as a plain slice: never recycled
	evicted bool // no longer in the cache: recycle when the last holder goes
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
// capacity, not its length.
func held(e *cacheEntry) int64 { return int64(cap(e.data)) }

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
		c.lru.MoveToFront(el)
		e := el.Value.(*cacheEntry)
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

func (c *cache) evictLocked(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.lru.Remove(el)
	delete(c.entries, e.id)
	c.used -= held(e)
	e.evicted = true
	c.maybeRecycleLocked(e)
}

// maybeRecycleLocked keeps an evicted entry's buffer for reuse once nobody
// holds it (mu held).
func (c *cache) maybeRecycleLocked(e *cacheEntry) {
	if !e.evicted || e.holders > 0 || e.shared || e.data == nil {
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
	c.lru.MoveToFront(el)
	e := el.Value.(*cacheEntry)
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

// finish runs claimed load l of chunk id on this goroutine and returns its
// entry with one holder counted for the caller.
func (c *cache) finish(ctx context.Context, id ID, l *load, fill func(ctx context.Context, buf func(int) []byte) ([]byte, error)) (*cacheEntry, error) {
	c.fill(context.WithoutCancel(ctx), id, l, fill)
	return l.entry, l.err
}
