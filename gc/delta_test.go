package gc

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

// stepChain returns n versions of a bf16 tensor of elems elements, each an
// optimizer-like step from the one before: close enough to code as deltas.
func stepChain(seed uint64, elems, n int) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 11))
	w := make([]float64, elems)
	for i := range w {
		w[i] = rng.NormFloat64() * 0.02
	}
	out := make([][]byte, n)
	for v := range out {
		b := make([]byte, 2*elems)
		for i := range w {
			if v > 0 {
				w[i] += rng.NormFloat64() * 0.02 * 0.01
			}
			binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(float32(w[i]))>>16))
		}
		out[v] = b
	}
	return out
}

// commitVersion commits data as the one chunk of a new file root/name,
// suggesting prev (when not nil) as its base, the way fusefs suggests the
// same tensor of the previous save.
func commitVersion(t *testing.T, s *cas.Store, name string, data []byte, prev *cas.ChunkRef) cas.ChunkRef {
	t.Helper()
	ctx := context.Background()
	ino, err := s.AllocIno()
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	ref, err := b.PutHinted(ctx, data, cas.Hint{ElemSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if prev != nil {
		b.SuggestBase(ref.ID, prev.ID)
	}
	m := &cas.Manifest{Chunks: []cas.ChunkRef{ref}}
	err = s.Commit(ctx, b, func(tx *cas.Tx) error {
		if err := tx.PutManifest(ino, m); err != nil {
			return err
		}
		if err := tx.PutNode(cas.Node{Ino: ino, Mode: 0o100644, Size: m.Size()}); err != nil {
			return err
		}
		return tx.Link(cas.RootIno, name, ino)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// deltaFiles is a store holding files v0..v3, one 256 KiB bf16 chunk each,
// v1..v3 stored as deltas against v0's chunk (re-encode queue drained).
func deltaFiles(t *testing.T) (*cas.Store, []cas.ChunkRef) {
	t.Helper()
	s := newRawStore(t)
	var refs []cas.ChunkRef
	for i, v := range stepChain(1, 128<<10, 4) {
		var prev *cas.ChunkRef
		if i > 0 {
			prev = &refs[i-1]
		}
		refs = append(refs, commitVersion(t, s, "v"+itoa(i), v, prev))
	}
	drainQueue(t, s)
	err := s.View(func(tx *cas.Tx) error {
		for _, r := range refs[1:] {
			base, _, ok, err := tx.Delta(r.ID)
			if err != nil {
				return err
			}
			if !ok || base != refs[0].ID {
				t.Fatalf("chunk %v: delta %v against %v, want a delta against %v", r.ID, ok, base, refs[0].ID)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, refs
}

// TestCollectKeepsBasesOfLiveDeltas: deleting the file of a base frees the
// base only with the last of its deltas; what a dry run says is what the
// collection frees; the bases kept are reported as such, and fsck counts
// them as referenced.
func TestCollectKeepsBasesOfLiveDeltas(t *testing.T) {
	for _, tc := range []struct {
		name       string
		remove     []string
		freed      []int // indexes of the chunks freed
		keptBases  int
		liveDeltas int
	}{
		{"the base's file", []string{"v0"}, nil, 1, 3},
		{"a delta's file", []string{"v2"}, []int{2}, 0, 0},
		{"the base's and a delta's", []string{"v0", "v1"}, []int{1}, 1, 2},
		{"the deltas' files", []string{"v1", "v2", "v3"}, []int{1, 2, 3}, 0, 0},
		{"all", []string{"v0", "v1", "v2", "v3"}, []int{0, 1, 2, 3}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, refs := deltaFiles(t)
			for _, f := range tc.remove {
				removeFile(t, s, f)
			}
			var raw, stored int64
			err := s.View(func(tx *cas.Tx) error {
				for _, i := range tc.freed {
					info, _, err := tx.Chunk(refs[i].ID)
					raw += int64(info.RawLen)
					stored += int64(info.StoredLen)
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			dry, err := Collect(ctx, s, Options{DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			res, err := Collect(ctx, s, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []Result{dry, res} {
				if r.Chunks != len(tc.freed) || r.FreedRawBytes != raw || r.FreedBytes != stored {
					t.Errorf("dry run %v: freed %d chunks, %d B (%d raw); want %d, %d B (%d raw)", r.DryRun, r.Chunks, r.FreedBytes, r.FreedRawBytes, len(tc.freed), stored, raw)
				}
				if r.BasesKept != tc.keptBases || r.LiveDeltas != tc.liveDeltas {
					t.Errorf("dry run %v: kept %d bases of %d live deltas, want %d of %d", r.DryRun, r.BasesKept, r.LiveDeltas, tc.keptBases, tc.liveDeltas)
				}
				if tc.keptBases > 0 && (r.BasesKeptRawBytes != int64(refs[0].Len) || r.BasesKeptBytes <= 0) {
					t.Errorf("dry run %v: kept bases' bytes %d (%d raw), want %d raw", r.DryRun, r.BasesKeptBytes, r.BasesKeptRawBytes, refs[0].Len)
				}
				if r.Unreferenced != len(tc.freed) {
					t.Errorf("dry run %v: %d unreferenced, want %d", r.DryRun, r.Unreferenced, len(tc.freed))
				}
			}
			f := fsck(t, s)
			if !f.OK() || f.Unreferenced != 0 || f.Bases != tc.keptBases {
				t.Errorf("fsck after gc: %d unreferenced, %d bases, problems %v; want 0 unreferenced, %d bases", f.Unreferenced, f.Bases, f.Problems, tc.keptBases)
			}
			// What stays reads back.
			for i, r := range refs {
				if slices.Contains(tc.freed, i) {
					continue
				}
				if _, err := s.ReadChunk(ctx, r); err != nil {
					t.Errorf("v%d: %v", i, err)
				}
			}
		})
	}
}

// TestFsckNamesADamagedBaseOnce: a base whose object is damaged or missing
// is one problem that counts its deltas and names their files, whether or
// not a file still names the base itself; the deltas (sound themselves) are
// not reported one by one.
func TestFsckNamesADamagedBaseOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		damage     func(t *testing.T, path string)
		kind, path string // of the one problem
		deleteBase bool   // delete the base's file v0 first
	}{
		{"corrupt, its file kept", corruptObject, "corrupt-chunk", "/v0", false},
		{"corrupt, its file deleted", corruptObject, "corrupt-chunk", "", true},
		{"missing, its file kept", removeObject, "missing-chunk", "/v0", false},
		{"missing, its file deleted", removeObject, "missing-chunk", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, refs := deltaFiles(t)
			if tc.deleteBase {
				removeFile(t, s, "v0")
			}
			base := refs[0].ID
			tc.damage(t, objectPath(s, base))
			res := fsck(t, s)
			if len(res.Problems) != 1 {
				t.Fatalf("%d problems, want 1: %v", len(res.Problems), res.Problems)
			}
			p := res.Problems[0]
			want := []string{"/v1", "/v2", "/v3"}
			if p.Kind != tc.kind || p.Chunk != base.String() || p.Path != tc.path || p.Deltas != 3 || !slices.Equal(p.DeltaFiles, want) {
				t.Errorf("problem %+v; want %s at %q of chunk %v, 3 deltas in %v", p, tc.kind, tc.path, base, want)
			}
			if s := p.String(); !strings.Contains(s, "base of 3 deltas") || !strings.Contains(s, "/v1, /v2, /v3") {
				t.Errorf("problem reads %q", s)
			}
		})
	}
}

func corruptObject(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func removeObject(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
