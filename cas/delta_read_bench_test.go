//go:build linux

package cas

import (
	"context"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
	"github.com/ckptfs/ckptfs/cas/object"
)

// BenchmarkDeltaStoreRead is issue #15's read target: the cold sequential
// read of a delta-coded file at most 1.3× the same file stored without
// deltas. It builds two stores holding version B of $CKPTFS_DELTA_READ_MB
// (default 1024) MiB of bf16 chunks:
//
//   - standalone: B as the store writes it (PutHinted, element size 2);
//   - delta: version A standalone, and each chunk of B as a delta object
//     against A's chunk at the same index (object.Coder.EncodeDelta, written over
//     B's object; the catalog's delta rows, which reads do not consult, are
//     not written).
//
// Each round opens both stores afresh (empty decoded cache), evicts their
// object files from the page cache (the local backend reads with O_DIRECT
// anyway), and reads B in order through AcquireChunk the way the mount
// streams a file: one reader copying each chunk out (the reply to the
// kernel), benchPrefetchLoads loaders running up to benchPrefetchChunks
// chunks ahead of it (fusefs/prefetch.go: 8 loads, 32 MiB). Rounds alternate
// the order of the two stores; the figures are medians over the rounds (run
// with -benchtime 3x for the median of 3): wall time, and this process's CPU
// time, which the other processes of a shared machine disturb less. Also
// reported: the object bytes each read fetches (read-bytes-ratio, the floor
// of the wall ratio when the disk is the bottleneck) and stored ÷ logical.
//
// The data is tensortest.SyntheticStep pairs, or, with $CKPTFS_DELTA_DIR (a directory
// written by test/delta/workload.py), the bf16 weights of two saves
// $CKPTFS_DELTA_READ_DIST saves apart (default 1), repeated to the size with
// one element per copy changed so that the copies do not deduplicate.
//
// Sub-benchmarks: disk (a store directory under $CKPTFS_DELTA_READ_TMP or the
// test's temporary directory) and mem (objects in a mem backend: the CPU
// cost alone, without the disk's bandwidth).
//
//	go test ./cas -run '^$' -bench 'DeltaStoreRead' -benchtime 3x -timeout 1h
func BenchmarkDeltaStoreRead(b *testing.B) {
	mb := 1024
	if v, err := strconv.Atoi(os.Getenv("CKPTFS_DELTA_READ_MB")); err == nil && v > 0 {
		mb = v
	}
	pairs := deltaReadPairs(b, mb)
	for _, where := range []string{"disk", "mem"} {
		b.Run(where, func(b *testing.B) {
			benchDeltaStoreRead(b, where, pairs)
		})
	}
}

// chunkPair is one chunk of version A and the same place in version B.
type chunkPair struct{ a, b []byte }

// deltaReadPairs returns mb MiB worth of chunk pairs: 1 MiB synthetic ones,
// or the workload's bf16 data chunks of at least 64 KiB (a tiny model's
// tensors are mostly smaller than a chunk).
func deltaReadPairs(b *testing.B, mb int) []chunkPair {
	const chunk = 1 << 20
	if dir := os.Getenv("CKPTFS_DELTA_DIR"); dir != "" {
		dist := 1
		if v, err := strconv.Atoi(os.Getenv("CKPTFS_DELTA_READ_DIST")); err == nil && v > 0 {
			dist = v
		}
		steps, _ := filepath.Glob(filepath.Join(dir, "step-*"))
		sort.Strings(steps)
		if len(steps) <= dist {
			b.Fatalf("%s: %d step directories, want more than %d", dir, len(steps), dist)
		}
		// The last two saves dist apart: the end of the run.
		fa, err := tensortest.CutFile(filepath.Join(steps[len(steps)-1-dist], "bf16/model.safetensors"), 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		fb, err := tensortest.CutFile(filepath.Join(steps[len(steps)-1], "bf16/model.safetensors"), 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		var src []chunkPair
		for i := range min(len(fa), len(fb)) {
			if fa[i].Elem == 2 && len(fa[i].Data) >= 64<<10 && len(fa[i].Data) == len(fb[i].Data) && fa[i].Seg == fb[i].Seg {
				src = append(src, chunkPair{fa[i].Data, fb[i].Data})
			}
		}
		if len(src) == 0 {
			b.Fatalf("%s: no bf16 chunks of 64 KiB or more", dir)
		}
		var out []chunkPair
		for size := 0; size < mb<<20; {
			i := len(out)
			p := src[i%len(src)]
			copyNo := uint16(i / len(src))
			a, bb := slices.Clone(p.a), slices.Clone(p.b)
			if copyNo > 0 {
				// One element per copy, the same in both versions.
				binary.LittleEndian.PutUint16(a, copyNo)
				binary.LittleEndian.PutUint16(bb, copyNo)
			}
			out = append(out, chunkPair{a, bb})
			size += len(bb)
		}
		b.Logf("data: %s and %s, %d distinct chunk pairs, %d MiB", filepath.Base(steps[len(steps)-1-dist]), filepath.Base(steps[len(steps)-1]), len(src), mb)
		return out
	}
	out := make([]chunkPair, mb)
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < mb; i += workers {
				a, bb := tensortest.SyntheticStep(uint64(i), chunk/2, 2, 0.01)
				out[i] = chunkPair{a, bb}
			}
		})
	}
	wg.Wait()
	return out
}

// Prefetch as the mount does it (fusefs/prefetch.go).
const (
	benchPrefetchLoads  = 8
	benchPrefetchChunks = 32
)

func benchDeltaStoreRead(b *testing.B, where string, pairs []chunkPair) {
	ctx := context.Background()
	root := os.Getenv("CKPTFS_DELTA_READ_TMP")
	if root == "" {
		root = b.TempDir()
	} else {
		var err error
		if root, err = os.MkdirTemp(root, "deltaread"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(root) })
	}
	names := [2]string{"standalone", "delta"}
	var dirs [2]string
	var mems [2]*mem.Backend
	open := func(k int) *Store {
		opts := Options{InlineEncoders: runtime.GOMAXPROCS(0)}
		if where == "mem" {
			opts.Objects = &keepOpen{mems[k]}
		}
		s, err := openLocal(dirs[k], opts)
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	refs := make([]ChunkRef, len(pairs))
	var objBytes [2]int64 // B's objects in each store
	var baseBytes int64   // A's objects in the delta store
	for k := range names {
		dirs[k] = filepath.Join(root, names[k])
		if where == "mem" {
			mems[k] = mem.New(backend.Properties{Connections: 16})
		}
		s := open(k)
		// A, then B: standalone, as the store writes them.
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() {
				bt := s.NewBatch()
				for i := w; i < len(pairs); i += workers {
					if k == 1 {
						if _, err := bt.PutHinted(ctx, pairs[i].a, Hint{ElemSize: 2}); err != nil {
							errs[w] = err
							return
						}
					}
					ref, err := bt.PutHinted(ctx, pairs[i].b, Hint{ElemSize: 2})
					if err != nil {
						errs[w] = err
						return
					}
					refs[i] = ref
				}
				errs[w] = s.Commit(ctx, bt, func(*Tx) error { return nil })
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		if st, err := s.Stats(); err != nil || st.ReencodePending != 0 {
			b.Fatalf("stats %+v, %v: every chunk must be encoded", st, err)
		}
		if k == 1 {
			// B's objects replaced by deltas against A.
			for w := range workers {
				wg.Go(func() {
					scratch := new(object.DeltaScratch)
					for i := w; i < len(pairs); i += workers {
						obj := s.coder.EncodeDelta(pairs[i].b, pairs[i].a, Sum(pairs[i].a), 2, scratch)
						if err := s.objects.Put(ctx, chunkHandle(refs[i].ID), obj, backend.PutOptions{}); err != nil {
							errs[w] = err
							return
						}
					}
					errs[w] = nil
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		// The bytes a read of B fetches: B's objects, and A's for deltas.
		for i, r := range refs {
			info, err := s.objects.Stat(ctx, chunkHandle(r.ID))
			if err != nil {
				b.Fatal(err)
			}
			objBytes[k] += info.Size
			if k == 1 {
				ai, err := s.objects.Stat(ctx, chunkHandle(Sum(pairs[i].a)))
				if err != nil {
					b.Fatal(err)
				}
				baseBytes += ai.Size
			}
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	var logical int64
	for _, p := range pairs {
		logical += int64(len(p.b))
	}
	var took, cpu [2][]time.Duration
	round := 0
	for b.Loop() {
		for j := range 2 {
			k := (j + round) % 2
			if where == "disk" {
				dropPageCache(b, filepath.Join(dirs[k], objectsName))
			}
			s := open(k)
			c0, t0 := processCPU(), time.Now()
			if err := streamChunks(ctx, s, refs); err != nil {
				b.Fatal(err)
			}
			took[k] = append(took[k], time.Since(t0))
			cpu[k] = append(cpu[k], processCPU()-c0)
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
		}
		round++
	}
	med := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	ms, md := med(took[0]), med(took[1])
	b.ReportMetric(float64(logical)/ms.Seconds()/1e6, "standalone-MB/s")
	b.ReportMetric(float64(logical)/md.Seconds()/1e6, "delta-MB/s")
	b.ReportMetric(md.Seconds()/ms.Seconds(), "delta/standalone")
	// CPU time (this process's, all threads), which other processes on
	// the machine disturb less than wall time.
	cs, cd := med(cpu[0]), med(cpu[1])
	b.ReportMetric(cd.Seconds()/cs.Seconds(), "cpu-delta/standalone")
	mib := float64(logical) / (1 << 20)
	b.ReportMetric(float64(cs.Microseconds())/mib/1e3, "standalone-cpu-ms/MiB")
	b.ReportMetric(float64(cd.Microseconds())/mib/1e3, "delta-cpu-ms/MiB")
	// The object bytes a read fetches, delta store ÷ standalone store
	// (B's deltas and A's objects ÷ B's objects), and what B's objects
	// store of its logical bytes, standalone and as deltas.
	b.ReportMetric(float64(objBytes[1]+baseBytes)/float64(objBytes[0]), "read-bytes-ratio")
	b.ReportMetric(float64(objBytes[0])/float64(logical), "standalone-stored")
	b.ReportMetric(float64(objBytes[1])/float64(logical), "delta-stored")
	b.Logf("%s: %.0f MiB, rounds %d: standalone %v, delta %v (medians); all: %v / %v; cpu %v / %v", where, mib, round, ms, md, took[0], took[1], cpu[0], cpu[1])
}

// streamChunks reads refs in order the way the mount streams a file: a reader
// takes each chunk and copies it out while prefetch loaders keep up to
// benchPrefetchChunks chunks ahead of it loading, benchPrefetchLoads at once.
func streamChunks(ctx context.Context, s *Store, refs []ChunkRef) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tokens := make(chan struct{}, benchPrefetchChunks)
	for range benchPrefetchChunks {
		tokens <- struct{}{}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchPrefetchLoads {
		wg.Go(func() {
			for {
				select {
				case <-tokens:
				case <-ctx.Done():
					return
				}
				i := int(next.Add(1) - 1)
				if i >= len(refs) {
					return
				}
				k, err := s.AcquireChunk(ctx, refs[i])
				if err != nil {
					return // the reader sees it
				}
				k.Release()
			}
		})
	}
	out := make([]byte, 1<<20)
	var err error
	for _, r := range refs {
		var k *Chunk
		if k, err = s.AcquireChunk(ctx, r); err != nil {
			break
		}
		copy(out, k.Data)
		k.Release()
		select {
		case tokens <- struct{}{}:
		default:
		}
	}
	cancel()
	wg.Wait()
	return err
}

// dropPageCache evicts the files under dir from the page cache.
func dropPageCache(b *testing.B, dir string) {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// processCPU returns the CPU time this process has used.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
