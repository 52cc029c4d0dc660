package cas

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestCacheRecyclesOnlyReleasedBuffers: an evicted chunk's buffer is reused
// for later loads only once every holder released it, and never when it was
// handed out as a plain slice; whole chunks' buffers and a smaller class's
// (a ~32 KiB chunk of FastCDC's in a cache of 1 MiB chunks) alike.
func TestCacheRecyclesOnlyReleasedBuffers(t *testing.T) {
	tests := []struct {
		name              string
		bufSize, size, in int // in: the cap of a chunk's buffer
	}{
		{"whole chunk", 64, 64, 64},
		{"small class", 1 << 20, 20 << 10, 32 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { testCacheRecycles(t, tt.bufSize, tt.size, tt.in) })
	}
}

func testCacheRecycles(t *testing.T, bufSize, size, in int) {
	c := newCache(int64(2*in), bufSize) // room for two chunks
	fill := func(b byte) func(context.Context, func(int) []byte) ([]byte, error) {
		return func(_ context.Context, alloc func(int) []byte) ([]byte, error) {
			buf := alloc(size)
			for i := range buf {
				buf[i] = b
			}
			return buf, nil
		}
	}
	id := testID

	held, err := c.acquire(context.Background(), id(1), fill(1))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := c.get(context.Background(), id(2), fill(2))
	if err != nil {
		t.Fatal(err)
	}
	// Load enough other chunks to evict 1 and 2 many times over.
	for i := 3; i < 20; i++ {
		e, err := c.acquire(context.Background(), id(i), fill(byte(i)))
		if err != nil {
			t.Fatal(err)
		}
		(&Chunk{Data: e.data, c: c, e: e}).Release()
	}
	if !bytes.Equal(held.data, bytes.Repeat([]byte{1}, size)) {
		t.Fatalf("a held chunk's buffer was reused: %v", held.data[:8])
	}
	if !bytes.Equal(shared, bytes.Repeat([]byte{2}, size)) {
		t.Fatalf("a shared chunk's buffer was reused: %v", shared[:8])
	}
	heldData := held.data
	(&Chunk{Data: held.data, c: c, e: held}).Release()
	if k, _ := c.class(size); len(c.free[k]) == 0 {
		t.Fatal("released evicted buffer was not kept for reuse")
	}
	e, err := c.acquire(context.Background(), id(100), fill(100))
	if err != nil {
		t.Fatal(err)
	}
	if &e.data[0] != &heldData[0] {
		t.Error("the next load did not reuse the released buffer")
	}
	if !bytes.Equal(shared, bytes.Repeat([]byte{2}, size)) {
		t.Fatal("a shared chunk's buffer was reused")
	}
}

// TestCacheConcurrentHolders: many readers acquiring and releasing chunks
// through a small cache never see another chunk's bytes (run with -race).
func TestCacheConcurrentHolders(t *testing.T) {
	const size = 256
	c := newCache(4*size, size)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				k := byte((i*7 + g) % 13)
				e, err := c.acquire(context.Background(), Sum([]byte{k}), func(_ context.Context, alloc func(int) []byte) ([]byte, error) {
					buf := alloc(size)
					for j := range buf {
						buf[j] = k
					}
					return buf, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				for _, b := range e.data {
					if b != k {
						t.Errorf("chunk %d holds a byte %d", k, b)
						return
					}
				}
				(&Chunk{Data: e.data, c: c, e: e}).Release()
			}
		}()
	}
	wg.Wait()
}

// TestCachePassedChunks: chunks a stream has read past (Chunk.Passed) go
// first, and at most an eighth of the budget of them stays; one acquired
// again counts as used again; a chunk in a span is spent only once all of
// its span has been passed (evicting one evicts them all).
func TestCachePassedChunks(t *testing.T) {
	const size = 64
	c := newCache(64*size, size) // room for 64 chunks; spent ones: 8
	id := testID
	acquire := func(i int) *Chunk { return acquireFilled(t, c, i, size, nil) }
	cached := func(from, to int) (n int) {
		for i := from; i < to; i++ {
			if c.has(id(i)) {
				n++
			}
		}
		return n
	}
	for i := range 40 {
		acquire(i).Release()
	}
	again := acquire(0) // read again before it is passed: stays
	for i := range 20 {
		k := acquire(i)
		k.Passed()
		k.Release()
	}
	again.Release()
	if n := cached(0, 20); n != 8 {
		t.Errorf("%d of 20 passed chunks cached, want 8 (an eighth of the budget)", n)
	}
	if n := cached(20, 40); n != 20 {
		t.Errorf("%d of 20 chunks not passed cached, want all", n)
	}
	if c.spent != 8*size {
		t.Errorf("spent %d bytes, want %d", c.spent, 8*size)
	}
	// A spent chunk acquired again is in use again: not evicted before
	// the others.
	var kept int
	for i := range 20 {
		if c.has(id(i)) {
			kept = i
			acquire(i).Release()
			break
		}
	}
	if c.spent != 7*size {
		t.Errorf("spent %d bytes after a spent chunk was read again, want %d", c.spent, 7*size)
	}
	// 28 chunks cached: 43 more overfill the cache by 7, which are the 7
	// spent ones.
	for i := 40; i < 83; i++ {
		acquire(i).Release()
	}
	if n := cached(0, 20); n != 1 || !c.has(id(kept)) {
		t.Errorf("%d of the passed chunks cached (%d read again), want that one only", n, kept)
	}
	if n := cached(20, 40); n != 20 {
		t.Errorf("%d of the 20 older chunks not passed cached, want all: the spent ones go first", n)
	}

	// A span of three chunks: spent once all three are passed.
	c = newCache(64*size, size)
	sp := c.newSpan(make([]byte, 0, 3*size), true)
	ids := []ID{id(100), id(101), id(102)}
	ls := c.claim(ids)
	var ks []*Chunk
	for i, l := range ls {
		e, err := c.finishSpan(ids[i], l, sp.buf[i*size:(i+1)*size:(i+1)*size], sp, size, nil)
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, &Chunk{Data: e.data, c: c, e: e})
	}
	c.releaseSpan(sp)
	ks[0].Passed()
	ks[1].Passed()
	if c.spent != 0 {
		t.Errorf("two of a span's three chunks passed: spent %d bytes, want none", c.spent)
	}
	ks[2].Passed()
	if c.spent != 3*size {
		t.Errorf("a span's three chunks passed: spent %d bytes, want %d", c.spent, 3*size)
	}
	for _, k := range ks {
		k.Release()
	}
	if e := c.lru.Back(); e == nil || !e.Value.(*cacheEntry).spent {
		t.Fatalf("the back of the LRU is not the passed span")
	}
	c.mu.Lock()
	c.evictLocked(c.lru.Back()) // evicts all three
	c.mu.Unlock()
	if c.spent != 0 || cached(100, 103) != 0 || c.used != 0 {
		t.Errorf("after the span's eviction: spent %d, %d of its chunks cached, %d bytes used", c.spent, cached(100, 103), c.used)
	}
}

// testID is the ID of the cache tests' chunk i.
func testID(i int) ID { return Sum([]byte(fmt.Sprint(i))) }

// acquireFilled acquires chunk testID(i) from c; a load fills size bytes
// and counts itself in loads (when not nil).
func acquireFilled(t *testing.T, c *cache, i, size int, loads map[ID]int) *Chunk {
	t.Helper()
	e, err := c.acquire(context.Background(), testID(i), func(_ context.Context, alloc func(int) []byte) ([]byte, error) {
		if loads != nil {
			loads[testID(i)]++
		}
		return alloc(size), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Chunk{Data: e.data, c: c, e: e}
}
