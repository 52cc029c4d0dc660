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
	id := func(i int) ID { return Sum([]byte(fmt.Sprint(i))) }

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
