package main

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/object"
)

// openCached opens the store in dir with its objects in front of bucket,
// keeping budget bytes of fetched copies, as a mount does.
func openCached(t testing.TB, dir string, bucket backend.Backend, budget int64) (*cas.Store, *tiered.Backend) {
	t.Helper()
	objects := tiered.New(local.New(cas.ObjectsDir(dir), local.Options{}), bucket, tiered.Options{CacheSize: budget})
	s, err := cas.Open(dir, cas.Options{Objects: objects})
	if err != nil {
		t.Fatal(err)
	}
	return s, objects
}

// objectBytes is the bytes of the chunk object files in the store in dir.
func objectBytes(t testing.TB, dir string) (n int64) {
	t.Helper()
	err := filepath.WalkDir(cas.ObjectsDir(dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		n += info.Size()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLocalCacheBoundAcrossRestarts: --local-cache-size bounds the copies
// fetched from the bucket that the store keeps, counting those an earlier
// daemon fetched (it used to count only its own: two daemons in turn kept
// twice the budget), and evicts the earlier daemon's first.
func TestLocalCacheBoundAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	bucket := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
	const budget, size = 1 << 20, 200 << 10
	var refs []cas.ChunkRef
	for i := range 12 {
		raw := make([]byte, size)
		rng := rand.NewChaCha8([32]byte{byte(i)})
		rng.Read(raw)
		ref := cas.ChunkRef{ID: cas.Sum(raw), Len: size}
		if err := bucket.Put(ctx, backend.Handle{Kind: backend.Chunk, Name: ref.ID.String()}, object.EncodeRaw(raw), backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	dir := filepath.Join(t.TempDir(), "store")
	for run, part := range [][]cas.ChunkRef{refs[:6], refs[6:]} {
		s, objects := openCached(t, dir, bucket, budget)
		if _, _, err := adoptFetched(ctx, s, objects, nil); err != nil { // as the mount does, in the background
			t.Fatal(err)
		}
		for _, ref := range part {
			if _, err := s.ReadChunk(ctx, ref); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if n := objectBytes(t, dir); n > budget {
			t.Fatalf("after daemon %d: %d bytes of fetched copies in the store, budget %d", run+1, n, budget)
		}
	}
	// The newest copies are the ones kept.
	last := refs[len(refs)-1].ID.String()
	if _, err := os.Stat(filepath.Join(cas.ObjectsDir(dir), last[:2], last[2:4], last[4:])); err != nil {
		t.Fatalf("the copy fetched last is gone: %v", err)
	}
}

// BenchmarkAdoptFetched: what a mount pays at start to count the copies in
// a store of n fetched chunk objects (one walk of objects/, a catalog read
// per object), warm page cache.
func BenchmarkAdoptFetched(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			s, _ := openCached(b, dir, mem.New(backend.Properties{}), 1<<40)
			s.Close()
			rng := rand.NewChaCha8([32]byte{})
			obj := make([]byte, 100)
			for range n {
				var id cas.ID
				rng.Read(id[:])
				name := id.String()
				p := filepath.Join(cas.ObjectsDir(dir), name[:2], name[2:4])
				if err := os.MkdirAll(p, 0o700); err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p, name[4:]), obj, 0o600); err != nil {
					b.Fatal(err)
				}
			}
			s, objects := openCached(b, dir, mem.New(backend.Properties{}), 1<<40)
			defer s.Close()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				got, _, err := adoptFetched(context.Background(), s, objects, nil)
				if err != nil || got != n {
					b.Fatalf("adopted %d of %d: %v", got, n, err)
				}
			}
			b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/start")
		})
	}
}
