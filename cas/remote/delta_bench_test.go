package remote

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
)

// BenchmarkBucketDeltaWorkload: stored ÷ logical in the bucket against the
// local store, side by side in one run, after the bf16 saves of
// test/delta/workload.py (the step-NNNNN/ directories of
// $CKPTFS_DELTA_DIR). Each save's bf16/model.safetensors is committed into
// a store cut as the commit path cuts it, each tensor chunk suggested
// against the chunk at the same place of the previous save (as the
// filesystem suggests), and uploaded to a memory bucket by a round after
// each commit, as the daemon runs them:
//
//	python test/delta/workload.py /tmp/wl --steps 400 --save-from 200 --dtypes bf16
//	CKPTFS_DELTA_DIR=/tmp/wl go test ./cas/remote -run '^$' -bench BucketDeltaWorkload -benchtime 1x
func BenchmarkBucketDeltaWorkload(b *testing.B) {
	dir := os.Getenv("CKPTFS_DELTA_DIR")
	if dir == "" {
		b.Skip("set CKPTFS_DELTA_DIR to a directory written by test/delta/workload.py")
	}
	steps, _ := filepath.Glob(filepath.Join(dir, "step-*", "bf16", "model.safetensors"))
	sort.Strings(steps)
	if len(steps) < 2 {
		b.Fatalf("%s: fewer than two bf16 saves", dir)
	}
	for range b.N {
		ctx := context.Background()
		remote := mem.New(backend.Properties{DurableOnPut: true, AtomicPut: true})
		s, r := testStore(b, remote)
		joinB(b, s, r)
		type key struct{ seg, ord int }
		var prev map[key]cas.ID
		for i, path := range steps {
			cut, err := tensortest.CutFile(path, int64(s.ChunkSize()))
			if err != nil {
				b.Fatal(err)
			}
			next := map[key]cas.ID{}
			batch := s.NewBatch()
			m := &cas.Manifest{}
			for _, c := range cut {
				ref, err := batch.PutHinted(ctx, c.Data, cas.Hint{ElemSize: c.Elem})
				if err != nil {
					b.Fatal(err)
				}
				if c.Seg >= 0 {
					k := key{c.Seg, c.Ord}
					next[k] = ref.ID
					if p, ok := prev[k]; ok && p != ref.ID {
						batch.SuggestBase(ref.ID, p)
					}
				}
				m.Chunks = append(m.Chunks, ref)
			}
			prev = next
			commitManifest(b, s, batch, fmt.Sprintf("save%03d", i), m)
			// A round after each commit, as the daemon runs them.
			if err := r.UploadRound(ctx, true); err != nil {
				b.Fatal(err)
			}
		}
		// The background re-encoder drains the rest when the mount is idle.
		for more := true; more; {
			var err error
			if more, err = s.Reencode(ctx, 64); err != nil {
				b.Fatal(err)
			}
		}
		st, err := s.Stats()
		if err != nil {
			b.Fatal(err)
		}
		var stored int64
		deltas := 0
		if err := remote.List(ctx, backend.Chunk, func(in backend.Info) error {
			stored += in.Size
			obj, err := remote.Get(ctx, in.Handle, nil)
			if _, d := cas.DeltaBase(obj); d {
				deltas++
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		logical := float64(st.LogicalBytes)
		fmt.Printf("BUCKET bf16 saves %d logical %d local %.3f bucket %.3f (deltas in the bucket %d)\n",
			len(steps), st.LogicalBytes, float64(st.StoredBytes)/logical, float64(stored)/logical, deltas)
		b.ReportMetric(float64(stored)/float64(st.StoredBytes), "bucket/local")
	}
}

// joinB starts a writer session of s for a benchmark.
func joinB(b *testing.B, s *cas.Store, r *Tier) {
	b.Helper()
	sess, err := joinOpts(s, r, SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sess.Close(context.Background()) })
}

// commitManifest commits m, whose chunks batch put, as file name.
func commitManifest(tb testing.TB, s *cas.Store, batch *cas.Batch, name string, m *cas.Manifest) {
	tb.Helper()
	ino, err := s.AllocIno()
	if err != nil {
		tb.Fatal(err)
	}
	err = s.Commit(context.Background(), batch, func(tx *cas.Tx) error {
		if err := tx.PutManifest(ino, m); err != nil {
			return err
		}
		if err := tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: m.Size()}); err != nil {
			return err
		}
		if err := tx.Link(cas.RootIno, name, ino); err != nil {
			return err
		}
		return tx.Uploads().CountCommit()
	})
	if err != nil {
		tb.Fatal(err)
	}
}
