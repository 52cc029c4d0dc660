//go:build linux

package cas

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
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
)

// BenchmarkDeltaStoreRead is issue #15's read target: the cold sequential
// read of a delta-coded file at most 1.3× the same file stored without
// deltas. It builds two stores holding version B of $CKPTFS_DELTA_READ_MB
// (default 1024) MiB of bf16 chunks:
//
//   - standalone: B as the store writes it (PutHinted, element size 2);
//   - delta: version A standalone, and each chunk of B as a delta object
//     against A's chunk at the same index (encodeDeltaObject, written over
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
// The data is syntheticStep pairs, or, with $CKPTFS_DELTA_DIR (a directory
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
		fa, err := cutFile(filepath.Join(steps[len(steps)-1-dist], "bf16/model.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		fb, err := cutFile(filepath.Join(steps[len(steps)-1], "bf16/model.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		var src []chunkPair
		for i := range min(len(fa), len(fb)) {
			if fa[i].elem == 2 && len(fa[i].data) >= 64<<10 && len(fa[i].data) == len(fb[i].data) && fa[i].seg == fb[i].seg {
				src = append(src, chunkPair{fa[i].data, fb[i].data})
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
				a, bb := syntheticStep(uint64(i), chunk/2, 2, 0.01)
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
		s, err := Open(dirs[k], opts)
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
					scratch := new(deltaScratch)
					for i := w; i < len(pairs); i += workers {
						obj := s.codecs.encodeDeltaObject(pairs[i].b, pairs[i].a, Sum(pairs[i].a), 2, scratch)
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

// BenchmarkDeltaClassPasses times the passes of a classed delta's decode
// that are not entropy decoding: deriving the classes from the base and
// undoing the grouped delta.
func BenchmarkDeltaClassPasses(b *testing.B) {
	for _, elem := range []int{2, 4} {
		base, next := syntheticStep(1, (1<<20)/elem, elem, 0.01)
		n := len(base) / elem
		perm, out := make([]byte, len(base)), make([]byte, len(base))
		for _, t := range []deltaTransform{deltaXOR, deltaSub} {
			cl := classesOf(base, elem, n)
			makeClassedDelta(t, elem, &cl, perm, next, base, n)
			b.Run(fmt.Sprintf("elem%d/%v/classesOf", elem, t), func(b *testing.B) {
				b.SetBytes(int64(len(base)))
				for b.Loop() {
					cl = classesOf(base, elem, n)
				}
			})
			b.Run(fmt.Sprintf("elem%d/%v/undo", elem, t), func(b *testing.B) {
				b.SetBytes(int64(len(base)))
				for b.Loop() {
					undoClassedDelta(t, elem, &cl, out, perm, base, n)
				}
				if !slices.Equal(out, next) {
					b.Fatal("undo differs")
				}
			})
		}
	}
}

// BenchmarkDeltaVariantDecode decodes the same chunks as each delta variant
// (forced) and standalone, against bases given in memory: the codec's share
// of a delta read, per variant. Chunks: bf16 (and fp32) pairs from
// $CKPTFS_DELTA_DIR saves one apart, or syntheticStep.
func BenchmarkDeltaVariantDecode(b *testing.B) {
	c, err := newCodecs()
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	for _, elem := range []int{2, 4} {
		var pairs []chunkPair
		if dir := os.Getenv("CKPTFS_DELTA_DIR"); dir != "" {
			kind := map[int]string{2: "bf16/model.safetensors", 4: "fp32/model.safetensors"}[elem]
			steps, _ := filepath.Glob(filepath.Join(dir, "step-*"))
			sort.Strings(steps)
			fa, err := cutFile(filepath.Join(steps[len(steps)-2], kind))
			if err != nil {
				b.Fatal(err)
			}
			fb, err := cutFile(filepath.Join(steps[len(steps)-1], kind))
			if err != nil {
				b.Fatal(err)
			}
			for i := range min(len(fa), len(fb)) {
				if fa[i].elem == elem && len(fa[i].data) == len(fb[i].data) && len(fa[i].data) >= 64<<10 {
					pairs = append(pairs, chunkPair{fa[i].data, fb[i].data})
				}
			}
		} else {
			for i := range 8 {
				a, bb := syntheticStep(uint64(i), (1<<20)/elem, elem, 0.01)
				pairs = append(pairs, chunkPair{a, bb})
			}
		}
		var total int64
		for _, p := range pairs {
			total += int64(len(p.b))
		}
		buf := make([]byte, 1<<20)
		alloc := func(n int) []byte { return buf[:n] }
		type coded struct {
			id, bid ID
			obj     []byte
			base    []byte
		}
		run := func(name string, objs []coded) {
			var stored int64
			for _, o := range objs {
				stored += int64(len(o.obj))
			}
			b.Run(fmt.Sprintf("elem%d/%s", elem, name), func(b *testing.B) {
				b.SetBytes(total)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				c0 := threadCPU()
				for b.Loop() {
					for _, o := range objs {
						var bf baseFunc
						if o.base != nil {
							bf = func(ID) ([]byte, func(), error) { return o.base, func() {}, nil }
						}
						if _, err := c.decodeObjectInto(o.id, o.obj, alloc, bf); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(stored)/float64(total), "ratio")
				// CPU time of this thread: what the machine's other
				// processes disturb least.
				b.ReportMetric(float64(total)*float64(b.N)/(threadCPU()-c0).Seconds()/1e6, "cpu-MB/s")
			})
		}
		var std []coded
		for _, p := range pairs {
			obj, _ := c.encodeObject(p.b, Hint{ElemSize: elem})
			std = append(std, coded{id: Sum(p.b), obj: obj})
		}
		run("standalone", std)
		for _, t := range deltaVariants {
			var objs []coded
			for _, p := range pairs {
				obj := encodeDeltaVariant(c, t, p.b, p.a, elem)
				objs = append(objs, coded{Sum(p.b), Sum(p.a), obj, p.a})
			}
			run(t.String(), objs)
		}
	}
}

// encodeDeltaVariant is encodeDeltaObject with the variant forced.
func encodeDeltaVariant(c *codecs, t deltaTransform, raw, base []byte, elem int) []byte {
	obj := make([]byte, objectHeaderSize+deltaExtSize)
	var codec Codec
	if t&deltaClassed != 0 {
		obj = c.appendClassed(obj, raw, base, make([]byte, len(raw)), t&^deltaClassed, elem)
	} else {
		d := make([]byte, len(raw))
		makeDelta(t, elem, d, raw, base)
		codec, obj = c.appendEncoded(obj, d, Hint{ElemSize: elem})
	}
	x := obj[objectHeaderSize:]
	bid := Sum(base)
	copy(x[:32], bid[:])
	x[32] = byte(t)
	x[33] = byte(elem)
	payload := obj[objectHeaderSize:]
	hdr := objectHeader{codec: codec, rawLen: uint32(len(raw)), payloadLen: uint32(len(payload)),
		crc: crc32.Checksum(payload, castagnoli), delta: true}
	copy(obj, hdr.marshal())
	return obj
}

// BenchmarkHuffmanSmallPlanes decodes Huffman planes of a bf16 sub delta's
// low byte (about 5 bits a symbol) and high byte (about 1), of the sizes a
// classed delta's classes have, with the multi-symbol table and with the
// single-symbol one only: where hufSingleMax should be.
func BenchmarkHuffmanSmallPlanes(b *testing.B) {
	base, next := syntheticStep(3, 256<<10, 2, 0.01)
	z := make([]byte, len(base))
	makeDelta(deltaSub, 2, z, next, base)
	for _, plane := range []int{0, 1} {
		p := make([]byte, len(z)/2)
		for i := range p {
			p[i] = z[2*i+plane]
		}
		for _, n := range []int{2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10} {
			var h hufEnc
			_, lo, hi, _ := h.histogram(p[:n])
			h.buildLengths()
			sec, _ := h.appendHuffman(nil, p[:n], lo, hi, false)
			dst := make([]byte, n)
			for _, multi := range []bool{false, true} {
				b.Run(fmt.Sprintf("plane%d/n%d/multi=%v", plane, n, multi), func(b *testing.B) {
					var d hufDec
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					c0 := threadCPU()
					for b.Loop() {
						if err := d.decode(dst, sec, multi); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64((threadCPU()-c0).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/symbol")
					b.ReportMetric(float64(len(sec))*8/float64(n), "bits/symbol")
				})
			}
		}
	}
}
