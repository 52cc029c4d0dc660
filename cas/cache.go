package cas

import (
	"container/list"
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

	free    [][]byte // recycled buffers of cap bufSize
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
	waiters int // callers waiting for this load, each counted as a holder
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

// cacheFreeKeep bounds the recycled buffers kept (beside the budget).
const cacheFreeKeep = 16

func newCache(budget int64, bufSize int) *cache {
	return &cache{budget: budget, lru: list.New(), entries: map[ID]*list.Element{}, loading: map[ID]*load{}, bufSize: bufSize}
}

// buffer returns a buffer of n bytes for a load, recycled when it can be.
func (c *cache) buffer(n int) []byte {
	if n <= c.bufSize {
		c.mu.Lock()
		if k := len(c.free); k > 0 {
			b := c.free[k-1]
			c.free = c.free[:k-1]
			c.mu.Unlock()
			return b[:n]
		}
		c.mu.Unlock()
		return make([]byte, n, c.bufSize)
	}
	return make([]byte, n)
}

// get returns chunk id as a shared slice (never recycled).
func (c *cache) get(id ID, fill func(buf func(int) []byte) ([]byte, error)) ([]byte, error) {
	e, err := c.acquire(id, fill)
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
func (c *cache) acquire(id ID, fill func(buf func(int) []byte) ([]byte, error)) (*cacheEntry, error) {
	c.mu.Lock()
	if el, ok := c.entries[id]; ok {
		c.lru.MoveToFront(el)
		e := el.Value.(*cacheEntry)
		e.holders++
		c.mu.Unlock()
		return e, nil
	}
	if l, ok := c.loading[id]; ok {
		l.waiters++
		c.mu.Unlock()
		<-l.done
		return l.entry, l.err
	}
	l := &load{done: make(chan struct{})}
	c.loading[id] = l
	c.mu.Unlock()

	data, err := fill(c.buffer)

	c.mu.Lock()
	delete(c.loading, id)
	l.err = err
	if err == nil {
		l.entry = &cacheEntry{id: id, data: data, holders: 1 + l.waiters, evicted: true}
		c.insertLocked(l.entry)
	}
	c.mu.Unlock()
	close(l.done)
	return l.entry, l.err
}

func (c *cache) insertLocked(e *cacheEntry) {
	size := int64(len(e.data))
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
	c.used -= int64(len(e.data))
	e.evicted = true
	c.maybeRecycleLocked(e)
}

// maybeRecycleLocked keeps an evicted entry's buffer for reuse once nobody
// holds it (mu held).
func (c *cache) maybeRecycleLocked(e *cacheEntry) {
	if !e.evicted || e.holders > 0 || e.shared || e.data == nil {
		return
	}
	if cap(e.data) == c.bufSize && len(c.free) < cacheFreeKeep {
		c.free = append(c.free, e.data[:0])
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

// has reports whether chunk id is cached or being loaded.
func (c *cache) has(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, cached := c.entries[id]
	_, loading := c.loading[id]
	return cached || loading
}
