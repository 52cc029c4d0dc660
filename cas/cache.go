package cas

import (
	"container/list"
	"sync"
)

// cache is a bounded LRU of decoded chunks with single-flight loading: concurrent
// readers of one missing chunk wait for one load. Cached slices are never
// modified or reused, so callers may hand them to the kernel without copying
// even if they are evicted meanwhile (the garbage collector keeps them alive).
type cache struct {
	mu      sync.Mutex
	budget  int64
	used    int64
	lru     *list.List // front = most recently used; values are *cacheEntry
	entries map[ID]*list.Element
	loading map[ID]*load
}

type cacheEntry struct {
	id   ID
	data []byte
}

type load struct {
	done chan struct{}
	data []byte
	err  error
}

func newCache(budget int64) *cache {
	return &cache{budget: budget, lru: list.New(), entries: map[ID]*list.Element{}, loading: map[ID]*load{}}
}

// get returns chunk id from the cache, or calls fill (once for all concurrent
// callers) and caches its result.
func (c *cache) get(id ID, fill func() ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if el, ok := c.entries[id]; ok {
		c.lru.MoveToFront(el)
		data := el.Value.(*cacheEntry).data
		c.mu.Unlock()
		return data, nil
	}
	if l, ok := c.loading[id]; ok {
		c.mu.Unlock()
		<-l.done
		return l.data, l.err
	}
	l := &load{done: make(chan struct{})}
	c.loading[id] = l
	c.mu.Unlock()

	l.data, l.err = fill()

	c.mu.Lock()
	delete(c.loading, id)
	if l.err == nil {
		c.insertLocked(id, l.data)
	}
	c.mu.Unlock()
	close(l.done)
	return l.data, l.err
}

func (c *cache) insertLocked(id ID, data []byte) {
	size := int64(len(data))
	if size > c.budget {
		return
	}
	for c.used+size > c.budget {
		el := c.lru.Back()
		e := el.Value.(*cacheEntry)
		c.lru.Remove(el)
		delete(c.entries, e.id)
		c.used -= int64(len(e.data))
	}
	c.entries[id] = c.lru.PushFront(&cacheEntry{id: id, data: data})
	c.used += size
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
		c.lru.Remove(el)
		delete(c.entries, id)
		c.used -= int64(len(el.Value.(*cacheEntry).data))
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
