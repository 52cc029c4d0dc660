package fusefs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// TestReadRuns checks the sequential-read detector against READ orders
// traced from real readers (doc.go, Reads): the kernel's two READs in
// flight arrive in either order and must keep one run; torch.load's zip
// header probes and seeks must not.
func TestReadRuns(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	type read struct{ off, size int64 }
	// pairs of 256 KiB READs, each pair answered second first (dd bs=16M,
	// torch.load, read(2) of a 4 MiB buffer at the default readahead).
	var swapped []read
	for off := int64(0); off < 16*M; off += 512 * K {
		swapped = append(swapped, read{off + 256*K, 256 * K}, read{off, 256 * K})
	}
	// torch.load(mmap=True) reading the header of each record, 8 KiB per
	// tensor of 64 KiB.
	var probes []read
	for off := int64(4 * K); off < 16*M; off += 72 * K {
		probes = append(probes, read{off, 8 * K})
	}
	// 1 MiB READs at a readahead of 4 MiB, each window's arriving last
	// first, the first up to 3 MiB behind the furthest.
	var wide []read
	for off := int64(0); off < 64*M; off += 4 * M {
		wide = append(wide, read{off + 3*M, M}, read{off + M, M}, read{off + 2*M, M}, read{off, M})
	}
	tests := []struct {
		name     string
		reads    []read
		scale    int64 // readScale of the mount's readahead (0: 1)
		wantRead int64 // bytes the last run read
	}{
		{"in order", []read{{0, 256 * K}, {256 * K, 256 * K}, {512 * K, 256 * K}}, 0, 768 * K},
		{"two in flight, either order", swapped, 0, 16 * M},
		{"a read behind the frontier", []read{{0, M}, {M, M}, {512 * K, 256 * K}, {2 * M, M}}, 0, 3 * M},
		{"header probes", probes, 0, 8 * K},
		{"a seek ahead", []read{{0, M}, {M, M}, {64 * M, 256 * K}}, 0, 256 * K},
		{"a seek back", []read{{32 * M, M}, {33 * M, M}, {0, 256 * K}}, 0, 256 * K},
		{"4 MiB readahead", wide, readScale(4 * M), 64 * M},
		{"4 MiB readahead, slack of the default", wide, 1, M},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rs readState
			for _, r := range tt.reads {
				rs.note(r.off, r.off+r.size, seqSlack*max(tt.scale, 1))
			}
			if rs.read != tt.wantRead {
				t.Errorf("run read %d bytes [%d, %d), want %d", rs.read, rs.start, rs.frontier, tt.wantRead)
			}
		})
	}
}

// TestBatchLen: a prefetch worker's batch is at least one chunk and at most
// prefetchBatch bytes of chunks from the queue's head.
func TestBatchLen(t *testing.T) {
	q := func(lens ...uint32) []cas.ChunkRef {
		out := make([]cas.ChunkRef, len(lens))
		for i, n := range lens {
			out[i].Len = n
		}
		return out
	}
	const K = 1 << 10
	tests := []struct {
		name  string
		queue []cas.ChunkRef
		want  int
	}{
		{"one chunk", q(32 * K), 1},
		{"small chunks up to a MiB", q(256*K, 256*K, 256*K, 256*K, 1), 4},
		{"a whole-MiB chunk alone", q(prefetchBatch, 32*K), 1},
		{"a chunk over the batch", q(2*prefetchBatch, 32*K), 1},
		{"short queue", q(32*K, 32*K, 32*K), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := batchLen(tt.queue); got != tt.want {
				t.Errorf("batchLen = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestColdStreamOfSmallChunks: a cold sequential read of a file of
// content-defined chunks (in packs), long enough for the prefetcher's
// batches, returns the file's bytes; with a damaged chunk in the middle, the
// reads before it return the right bytes, the damaged range EIO, and the
// reads well past it the right bytes again: a batch that holds the damaged
// chunk fails no other chunk.
func TestColdStreamOfSmallChunks(t *testing.T) {
	m := newMount(t)
	const size = 24 << 20
	data, victimData := randBytes(21, size), randBytes(22, size)
	mustWrite(t, m.path("runs/whole"), data)
	mustWrite(t, m.path("runs/victim"), victimData)
	refs, _, err := IndexFile(context.Background(), bytes.NewReader(victimData), size, cas.DefaultChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	var start int64
	var victim cas.ChunkRef
	for _, r := range refs {
		if start+int64(r.Len) > size/2 {
			victim = r
			break
		}
		start += int64(r.Len)
	}
	end := start + int64(victim.Len)
	m.unmount()
	if !flipChunkByte(t, m.store, victim.ID) {
		t.Fatal("the victim chunk is not in a pack")
	}
	m.mount()
	mustEqualFile(t, m.path("runs/whole"), data)

	f, err := os.Open(m.path("runs/victim"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	off := int64(0)
	for ; off+int64(len(buf)) <= start; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, victimData[off:off+int64(len(buf))]) {
			t.Fatalf("read at %d, before the damaged chunk at %d: %v", off, start, err)
		}
	}
	if _, err := f.ReadAt(buf[:1], start+1); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of the damaged chunk: %v, want EIO", err)
	}
	// Page-aligned, a readahead window past the damaged chunk.
	for off = (end + 1<<20) &^ 4095; off+int64(len(buf)) <= size; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, victimData[off:off+int64(len(buf))]) {
			t.Fatalf("read at %d, after the damaged chunk at [%d, %d): %v", off, start, end, err)
		}
	}
}

// fakeStream opens an empty store with a cache of cacheSize bytes and makes
// the manifest of a file of size bytes in 32 KiB chunks (and their offsets)
// that the store lacks: prefetch workers' loads of them fail at once, and
// the queue is what a test looks at.
func fakeStream(t *testing.T, cacheSize, size int64) (*cas.Store, *cas.Manifest, []int64) {
	t.Helper()
	store := filepath.Join(t.TempDir(), "store")
	s, err := cas.Open(store, cas.Options{CacheSize: cacheSize, Objects: local.New(cas.ObjectsDir(store), local.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const chunk = 32 << 10
	m := &cas.Manifest{}
	var offsets []int64
	for off := int64(0); off < size; off += chunk {
		var id cas.ID
		binary.LittleEndian.PutUint64(id[:], uint64(off)+1)
		m.Chunks = append(m.Chunks, cas.ChunkRef{ID: id, Len: chunk})
		offsets = append(offsets, off)
	}
	return s, m, offsets
}

// TestStreamTopsUpByBatches: once a stream's window is queued, a READ that
// moves it on by less than a batch queues nothing; the queue grows a whole
// batch at a time (a batch is one read of a pack, whose buffer the cache
// keeps its chunks in), until the window reaches the end of the file.
func TestStreamTopsUpByBatches(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	const size = 96 * M
	s, m, offsets := fakeStream(t, 256*M, size)
	var rs readState
	queued := int64(0)
	var topUps []int64
	for off := int64(0); off < size; off += 256 * K {
		rs.prefetchAfter(s, m, offsets, nil, off, off+256*K, 1)
		rs.mu.Lock()
		q := rs.queued
		rs.mu.Unlock()
		if q != queued && queued > off { // a top-up while chunks were queued ahead of the reader
			topUps = append(topUps, q-queued)
			if q-queued < prefetchBatch && q < size {
				t.Fatalf("read at %d MiB: the queue grew by %d KiB to %d MiB, less than a batch", off/M, (q-queued)/K, q/M)
			}
		}
		queued = q
	}
	if queued != size || len(topUps) < 10 {
		t.Fatalf("queued up to %d of %d bytes in %d top-ups, want all of it in many", queued, size, len(topUps))
	}
}

// TestStreamTopUpKeepsAhead: in a stream of 256 KiB READs (two in flight:
// READ k+1 is already on its way when READ k's prefetch runs), every READ
// finds its range queued when the READ two before it was answered, whatever
// the cache's size (window = cache/4): topping up by batches must not wait
// for the reader to catch up with a window of a batch or two.
func TestStreamTopUpKeepsAhead(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	for _, cacheMiB := range []int64{2, 4, 6, 8, 16} {
		const size = 64 * M
		s, m, offsets := fakeStream(t, cacheMiB*M, size)
		var rs readState
		var queuedAfter []int64
		for off := int64(0); off < size; off += 256 * K {
			rs.prefetchAfter(s, m, offsets, nil, off, off+256*K, 1)
			rs.mu.Lock()
			queuedAfter = append(queuedAfter, rs.queued)
			rs.mu.Unlock()
		}
		var uncovered, streamReads int
		for k := 2; k < len(queuedAfter); k++ {
			off := int64(k) * 256 * K
			if off < 8*M || off+256*K > size-2*M { // in the stream, not at its ends
				continue
			}
			streamReads++
			if queuedAfter[k-2] < off+256*K {
				uncovered++
			}
		}
		if uncovered > 0 {
			t.Errorf("cache %d MiB (window %d KiB): %d of %d READs not queued when the READ two before them was answered", cacheMiB, cacheMiB*M/4/K, uncovered, streamReads)
		}
	}
}
