package cas

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
)

// checkCacheInvariants: used and spent are the sums of held() over the
// cached entries and the spent ones; spent entries are cached, not evicted,
// and form a suffix of the LRU.
func checkCacheInvariants(t *testing.T, c *cache, step int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var used, spent int64
	seenSpent := false
	for el := c.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*cacheEntry)
		if e.evicted {
			t.Fatalf("step %d: evicted entry in LRU", step)
		}
		if c.entries[e.id] != el {
			t.Fatalf("step %d: LRU element not in entries", step)
		}
		used += held(e)
		if e.spent {
			if !seenSpent && c.newestSpent != el {
				t.Fatalf("step %d: newestSpent is not the front-most spent entry", step)
			}
			spent += held(e)
			seenSpent = true
		} else if seenSpent {
			t.Fatalf("step %d: a live entry behind a spent one", step)
		}
	}
	if !seenSpent && c.newestSpent != nil {
		t.Fatalf("step %d: newestSpent set with no spent entry", step)
	}
	if len(c.entries) != c.lru.Len() {
		t.Fatalf("step %d: %d entries, %d in LRU", step, len(c.entries), c.lru.Len())
	}
	if used != c.used || spent != c.spent {
		t.Fatalf("step %d: used %d (counted %d), spent %d (counted %d)", step, c.used, used, c.spent, spent)
	}
	if c.spent < 0 || c.used > c.budget {
		t.Fatalf("step %d: spent %d used %d budget %d", step, c.spent, c.used, c.budget)
	}
}

// TestCacheSpentInvariants: random acquires, peeks, runs of spans (with
// failed members and passes while the run goes on), passes, releases and
// drops keep the cache's counts and its spent tail right after every step.
func TestCacheSpentInvariants(t *testing.T) {
	const size = 64
	for seed := int64(0); seed < 20; seed++ {
		r := rand.New(rand.NewSource(seed))
		c := newCache(int64(16+r.Intn(48))*size, size)
		id := testID
		var held []*Chunk
		fill := func(_ context.Context, alloc func(int) []byte) ([]byte, error) {
			return alloc(size/2 + r.Intn(size/2) + 1), nil
		}
		for step := 0; step < 3000; step++ {
			switch op := r.Intn(10); {
			case op < 3: // acquire one
				e, err := c.acquire(context.Background(), id(r.Intn(100)), fill)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, &Chunk{Data: e.data, c: c, e: e})
			case op < 5: // a span of 1-5 chunks, some failing, finished one by one, passes interleaved
				n := 1 + r.Intn(5)
				ids := make([]ID, n)
				for i := range ids {
					ids[i] = id(100 + r.Intn(200))
				}
				// dedup ids (a run holds each object once)
				seen := map[ID]bool{}
				var uids []ID
				for _, x := range ids {
					if !seen[x] {
						seen[x] = true
						uids = append(uids, x)
					}
				}
				ls := c.claim(uids)
				sp := c.newSpan(make([]byte, 0, len(uids)*size), true)
				for i, l := range ls {
					if l == nil {
						continue
					}
					var err error
					if r.Intn(8) == 0 {
						err = fmt.Errorf("bad")
					}
					e, err := c.finishSpan(uids[i], l, sp.buf[i*size:(i+1)*size:(i+1)*size], sp, size, err)
					if err == nil {
						k := &Chunk{Data: e.data, c: c, e: e}
						if r.Intn(2) == 0 {
							k.Passed()
						}
						if r.Intn(2) == 0 {
							held = append(held, k)
						} else {
							k.Release()
						}
					}
				}
				c.releaseSpan(sp)
			case op < 7: // pass a held chunk
				if len(held) > 0 {
					held[r.Intn(len(held))].Passed()
				}
			case op < 9: // release one
				if len(held) > 0 {
					i := r.Intn(len(held))
					held[i].Release()
					held = append(held[:i], held[i+1:]...)
				}
			default:
				if r.Intn(2) == 0 {
					c.drop(id(r.Intn(300)))
				} else if e, ok := c.peek(id(100 + r.Intn(200))); ok {
					held = append(held, &Chunk{Data: e.data, c: c, e: e})
				}
			}
			checkCacheInvariants(t, c, step)
		}
		for _, k := range held {
			k.Release()
		}
		checkCacheInvariants(t, c, -1)
	}
}

// TestCacheJustPassedChunkStays: once the spent share is full, the chunk
// just passed is not the one evicted (the oldest spent go first): the other
// READ a stream has in flight, which reads the chunk's head after the one
// that read past its tail, still finds it.
func TestCacheJustPassedChunkStays(t *testing.T) {
	const size = 64
	c := newCache(64*size, size) // spent share: 8 chunks
	id := testID
	loads := map[ID]int{}
	acquire := func(i int) *Chunk { return acquireFilled(t, c, i, size, loads) }
	for i := range 20 { // a stream passes chunks 0..19: the share is full
		k := acquire(i)
		k.Passed()
		k.Release()
	}
	b := acquire(20) // chunk 20 straddles READs A and B; B, its tail, first
	b.Passed()
	b.Release()
	a := acquire(20) // READ A, the chunk's head, a moment later
	a.Release()
	if loads[id(20)] != 1 {
		t.Errorf("chunk 20 loaded %d times: the READ of its head, after the one that read its tail, loaded it again", loads[id(20)])
	}
	for i := range 12 { // the oldest spent went: 12 of 20, and 8 stayed
		if c.has(id(i)) {
			t.Errorf("chunk %d, among the oldest passed, still cached", i)
		}
	}
}
