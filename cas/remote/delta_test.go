package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// bf16Steps returns n versions of files files of chunks chunks of elems
// bf16 elements each, every version an Adam-like step (each weight moved
// by ~rel of the typical magnitude) from the one before: synthetic
// training saves.
func bf16Steps(seed uint64, files, chunks, elems, n int, rel float64) [][][]byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	w := make([]float64, files*chunks*elems)
	for i := range w {
		w[i] = rng.NormFloat64() * 0.02
	}
	out := make([][][]byte, n)
	for v := range out {
		out[v] = make([][]byte, files)
		for f := range files {
			b := make([]byte, 2*chunks*elems)
			for i := range chunks * elems {
				k := f*chunks*elems + i
				if v > 0 && f == 0 {
					w[k] += rng.NormFloat64() * 0.02 * rel
				}
				binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(float32(w[k]))>>16))
			}
			out[v][f] = b
		}
	}
	return out
}

// commitStep commits data as file name, cut in chunks of chunk bytes (bf16
// hinted), each suggested as a delta of the same range of prev (nil: none).
func commitStep(t *testing.T, s *cas.Store, name string, data []byte, chunk int, prev *cas.Manifest) *cas.Manifest {
	t.Helper()
	ctx := context.Background()
	b := s.NewBatch()
	m := &cas.Manifest{}
	for off := 0; off < len(data); off += chunk {
		ref, err := b.PutHinted(ctx, data[off:min(off+chunk, len(data))], cas.Hint{ElemSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		if prev != nil {
			b.SuggestBase(ref.ID, prev.Chunks[len(m.Chunks)].ID)
		}
		m.Chunks = append(m.Chunks, ref)
	}
	commitManifest(t, s, b, name, m)
	return m
}

// saveSteps commits steps (versions of files) as step<v>.f<f>, each file
// suggested against the same file one step earlier, and re-encodes: the
// store's deltas are written. It returns the manifests and the raw bytes.
func saveSteps(t *testing.T, s *cas.Store, steps [][][]byte, chunk int) (ms map[string]*cas.Manifest, logical int64) {
	t.Helper()
	ms = map[string]*cas.Manifest{}
	for v, files := range steps {
		for f, data := range files {
			var prev *cas.Manifest
			if v > 0 {
				prev = ms[fmt.Sprintf("step%d.f%d", v-1, f)]
			}
			ms[fmt.Sprintf("step%d.f%d", v, f)] = commitStep(t, s, fmt.Sprintf("step%d.f%d", v, f), data, chunk, prev)
			logical += int64(len(data))
		}
	}
	for {
		more, err := s.Reencode(context.Background(), 64)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			return ms, logical
		}
	}
}

// bucketChunks returns the bucket's chunk objects: their bytes in all, and
// per delta its base.
func bucketChunks(t *testing.T, be backend.Backend) (stored int64, bases map[cas.ID]cas.ID) {
	t.Helper()
	ctx := context.Background()
	bases = map[cas.ID]cas.ID{}
	if err := be.List(ctx, backend.Chunk, func(in backend.Info) error {
		stored += in.Size
		obj, err := be.Get(ctx, in.Handle, nil)
		if err != nil {
			return err
		}
		if b, ok := cas.DeltaBase(obj); ok {
			id, err := cas.ParseID(in.Handle.Name)
			if err != nil {
				return err
			}
			bases[id] = b
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return stored, bases
}

// localStored is the bytes of the store's chunk objects (packs included).
func localStored(t *testing.T, s *cas.Store) int64 {
	t.Helper()
	var n int64
	if err := s.WalkObjects(context.Background(), func(o cas.ObjectInfo) error { n += o.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// readAll reads every file of ms through s and compares it with want.
func readAll(t *testing.T, s *cas.Store, ms map[string]*cas.Manifest, want map[string][]byte) {
	t.Helper()
	for name, m := range ms {
		var got []byte
		for _, ref := range m.Chunks {
			data, err := s.ReadChunk(context.Background(), ref)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got = append(got, data...)
		}
		if !bytes.Equal(got, want[name]) {
			t.Fatalf("%s read back wrong", name)
		}
	}
}

// TestBucketDeltas: a store's deltas go to the bucket as they are, each
// after its base; a fresh store reads them from the bucket alone; the
// bucket stores what the local store stores; its collection keeps a base
// that a live delta names (and frees it with the last of them); a damaged
// base in the bucket fails the delta's read (ErrCorrupt), never wrong bytes.
// It runs on a memory bucket and on versitygw (the S3 backend: its
// collection reads headers with ranged GETs).
func TestBucketDeltas(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		bucketDeltas(t, mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true}))
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		bucketDeltas(t, s3test.Open(t, srv.Endpoint, "deltas", s3.Options{}))
	})
}

func bucketDeltas(t *testing.T, remote backend.Backend) {
	ctx := context.Background()
	a, ra := testStore(t, remote)
	join(t, a, ra)
	const chunk = 512 << 10
	steps := bf16Steps(1, 2, 2, chunk/2, 4, 0.01)
	ms, logical := saveSteps(t, a, steps, chunk)
	want := map[string][]byte{}
	for v, files := range steps {
		for f, data := range files {
			want[fmt.Sprintf("step%d.f%d", v, f)] = data
		}
	}
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	stored, bases := bucketChunks(t, remote)
	local := localStored(t, a)
	t.Logf("stored ÷ logical: bucket %.3f, local store %.3f (%d deltas in the bucket)",
		float64(stored)/float64(logical), float64(local)/float64(logical), len(bases))
	// f0 changes every step: 3 steps of 2 chunks are deltas; f1 is the
	// same bytes every step (deduplicated).
	if len(bases) != 6 {
		t.Fatalf("%d deltas in the bucket, want 6 (the store's)", len(bases))
	}
	if float64(stored) > float64(local)*1.05 {
		t.Fatalf("the bucket stores %d bytes, the local store %d", stored, local)
	}
	for d, b := range bases {
		if _, err := remote.Stat(ctx, chunkHandle(b)); err != nil {
			t.Fatalf("delta %v's base %v is not in the bucket: %v", d, b, err)
		}
	}

	t.Run("a fresh store reads deltas from the bucket", func(t *testing.T) {
		b, _ := testStore(t, remote)
		readAll(t, b, ms, want)
		if st, _ := b.Stats(); st.RemoteStats.ReadBytes == 0 {
			t.Fatal("nothing fetched from the bucket")
		}
	})

	t.Run("collection keeps a base of a live delta", func(t *testing.T) {
		// step0's files go: their chunks are the keyframes the deltas name.
		for f := range 2 {
			name := fmt.Sprintf("step0.f%d", f)
			unlinkNamed(t, a, name)
			delete(ms, name)
		}
		if err := ra.UploadRound(ctx, true); err != nil {
			t.Fatal(err)
		}
		res, err := ra.Collect(ctx, time.Now().Add(time.Second), nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Freed != 0 {
			t.Fatalf("collection freed %d objects that deltas name as bases: %+v", res.Freed, res)
		}
		if _, after := bucketChunks(t, remote); len(after) != len(bases) {
			t.Fatalf("%d deltas left in the bucket, want %d", len(after), len(bases))
		}
		readAll(t, mustFresh(t, remote), ms, want)

		// The deltas' files go too: now nothing names the bases.
		for name := range ms {
			if name[len(name)-1] == '0' {
				unlinkNamed(t, a, name)
				delete(ms, name)
			}
		}
		if err := ra.UploadRound(ctx, true); err != nil {
			t.Fatal(err)
		}
		res, err = ra.Collect(ctx, time.Now().Add(time.Second), nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, after := bucketChunks(t, remote); len(after) != 0 || res.Freed != 8 {
			t.Fatalf("with no file of f0 left: %d deltas left, %d objects freed (%+v), want 0 and 8 (2 bases, 6 deltas)", len(after), res.Freed, res)
		}
		readAll(t, mustFresh(t, remote), ms, want)
	})
}

// TestBucketDeltaDamagedBase: a delta whose base in the bucket is damaged
// reads as ErrCorrupt from a fresh store, never wrong bytes.
func TestBucketDeltaDamagedBase(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
	a, ra := testStore(t, remote)
	join(t, a, ra)
	const chunk = 512 << 10
	steps := bf16Steps(2, 1, 1, chunk/2, 2, 0.01)
	ms, _ := saveSteps(t, a, steps, chunk)
	if err := ra.UploadRound(ctx, true); err != nil {
		t.Fatal(err)
	}
	_, bases := bucketChunks(t, remote)
	if len(bases) != 1 {
		t.Fatalf("%d deltas in the bucket, want 1", len(bases))
	}
	for d, b := range bases {
		h := chunkHandle(b)
		obj, err := remote.Get(ctx, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		obj[len(obj)-1] ^= 1
		if err := remote.Put(ctx, h, obj, backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		ref := ms["step1.f0"].Chunks[0]
		if ref.ID != d {
			t.Fatalf("the delta is %v, not step1's chunk %v", d, ref.ID)
		}
		fresh := mustFresh(t, remote)
		if _, err := fresh.ReadChunk(ctx, ref); !errors.Is(err, cas.ErrCorrupt) {
			t.Fatalf("read of a delta with a damaged base in the bucket: %v, want ErrCorrupt", err)
		}
		if _, err := fresh.ReadChunk(ctx, ms["step0.f0"].Chunks[0]); !errors.Is(err, cas.ErrCorrupt) {
			t.Fatalf("read of the damaged base: %v, want ErrCorrupt", err)
		}
	}
}

// mustFresh is a fresh store on remote.
func mustFresh(t *testing.T, remote backend.Backend) *cas.Store {
	t.Helper()
	s, _ := testStore(t, remote)
	return s
}

// unlinkNamed removes file name from the root directory, as a commit.
func unlinkNamed(t *testing.T, s *cas.Store, name string) {
	t.Helper()
	if err := s.Update(func(tx *cas.Tx) error {
		ino, _ := tx.Lookup(cas.RootIno, name)
		if err := tx.Unlink(cas.RootIno, name); err != nil {
			return err
		}
		if err := tx.DeleteNode(ino); err != nil {
			return err
		}
		return tx.Uploads().CountCommit()
	}); err != nil {
		t.Fatal(err)
	}
}

// TestBucketDeltaBeforeReencoder: a round right after each commit (as the
// daemon runs them), before the background re-encoder has written the
// commit's planned deltas, still uploads deltas: the round writes them
// first.
func TestBucketDeltaBeforeReencoder(t *testing.T) {
	ctx := context.Background()
	remote := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
	a, ra := testStore(t, remote)
	join(t, a, ra)
	const chunk = 512 << 10
	steps := bf16Steps(3, 1, 2, chunk/2, 3, 0.01)
	var prev *cas.Manifest
	want := map[string][]byte{}
	ms := map[string]*cas.Manifest{}
	for v, files := range steps {
		name := fmt.Sprintf("step%d", v)
		prev = commitStep(t, a, name, files[0], chunk, prev)
		ms[name], want[name] = prev, files[0]
		if err := ra.UploadRound(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.ReencodeBacklog(); n != 0 {
		t.Fatalf("%d bytes left to re-encode after the rounds", n)
	}
	_, bases := bucketChunks(t, remote)
	if len(bases) != 4 {
		t.Fatalf("%d deltas in the bucket, want 4 (steps 1 and 2, 2 chunks each)", len(bases))
	}
	readAll(t, mustFresh(t, remote), ms, want)
}
