package stage

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// appendStore opens a store in a temporary directory, with a pool.
func appendStore(t *testing.T) (*cas.Store, *Pool) {
	t.Helper()
	dir := t.TempDir()
	s, err := cas.Open(dir, cas.Options{Objects: local.New(cas.ObjectsDir(dir), local.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, NewPool(s, 96<<20)
}

// commitContent stages data from empty, finishes and commits it, and
// returns its manifest.
func commitContent(t *testing.T, s *cas.Store, p *Pool, data []byte) *cas.Manifest {
	t.Helper()
	ctx := context.Background()
	f, err := p.Stage(ctx, 1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	res, err := f.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, res.Batch, func(*cas.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return &cas.Manifest{Chunks: res.Chunks, Holes: res.Holes}
}

// contentOf reads a finished content back from its chunks, holes as zeros.
func contentOf(t *testing.T, s *cas.Store, res Result, size int64) []byte {
	t.Helper()
	m := cas.Manifest{Chunks: res.Chunks, Holes: res.Holes}
	out := make([]byte, size)
	for i, off := range m.Offsets() {
		data, err := s.ReadChunk(context.Background(), m.Chunks[i])
		if err != nil {
			t.Fatal(err)
		}
		copy(out[off:], data)
	}
	return out
}

// appendOp is one change to a staged file: a write of n fresh bytes at off
// (-1: where the last write or truncation below it ended), or a truncation
// to size when n is 0.
type appendOp struct {
	off  int64
	n    int
	size int64
}

// TestStageAppendCommitsAsASpool: a file cut by content alone, staged for an
// append (StageAppend), streams from its last chunk and keeps the chunks
// before it; whatever the changes that follow (appends, a pre-sizing
// truncation, a write into the old bytes, a truncation back, a read), Finish
// gives the chunks, holes and bytes that the same changes staged in a spool
// give (Stage), which cuts the whole content again.
func TestStageAppendCommitsAsASpool(t *testing.T) {
	s, p := appendStore(t)
	ctx := context.Background()
	old := append([]byte("step,loss\n"), randBytes(21, 3<<20)...)
	base := commitContent(t, s, p, old)
	if len(base.Chunks) < 20 {
		t.Fatalf("%d chunks: want a file of many content-defined chunks", len(base.Chunks))
	}
	L := int64(len(old))
	cases := []struct {
		name   string
		ops    []appendOp
		stream bool // still streaming after the ops (no spill)
	}{
		{"nothing", nil, true},
		{"one line", []appendOp{{-1, 9, 0}}, true},
		{"many appends", []appendOp{{-1, 100, 0}, {-1, 70 << 10, 0}, {-1, 1 << 20, 0}, {-1, 3, 0}}, true},
		{"sized then filled", []appendOp{{0, 0, L + 9<<20}, {-1, 2 << 20, 0}}, true},
		{"sized, never filled", []appendOp{{-1, 5000, 0}, {0, 0, L + 5000 + 3<<20}}, true},
		{"write into old bytes", []appendOp{{-1, 5000, 0}, {100, 10, 0}}, false},
		{"write into the last chunk", []appendOp{{-1, 5000, 0}, {L - 10, 4, 0}}, false},
		{"truncate below the append", []appendOp{{-1, 50000, 0}, {0, 0, L + 100}}, false},
		{"truncate into old bytes", []appendOp{{-1, 50000, 0}, {0, 0, L / 2}}, false},
		{"truncate to nothing", []appendOp{{-1, 50000, 0}, {0, 0, 0}, {-1, 7, 0}}, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fa, err := p.StageAppend(ctx, 1, base)
			if err != nil {
				t.Fatal(err)
			}
			if !fa.Streaming() || len(fa.prefix) != len(base.Chunks)-1 {
				t.Fatalf("StageAppend: streaming %v with %d chunks kept, want a stream after %d", fa.Streaming(), len(fa.prefix), len(base.Chunks)-1)
			}
			fs, err := p.Stage(ctx, 1, base, L)
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(old)
			filled := L // where the written bytes end (a pre-sizing truncation leaves a hole after)
			for j, op := range tc.ops {
				if op.n == 0 {
					for _, f := range []*File{fa, fs} {
						if err := f.Truncate(ctx, op.size); err != nil {
							t.Fatal(err)
						}
					}
					want = append(want[:min(op.size, int64(len(want)))], make([]byte, max(0, op.size-int64(len(want))))...)
					filled = min(filled, op.size)
					continue
				}
				off := op.off
				if off < 0 {
					off = filled
				}
				data := randBytes(uint64(100*i+j), op.n)
				for _, f := range []*File{fa, fs} {
					if k, err := f.WriteAt(ctx, data, off); err != nil || k != len(data) {
						t.Fatalf("write %d at %d: %d, %v", len(data), off, k, err)
					}
				}
				if end := off + int64(len(data)); end > int64(len(want)) {
					want = append(want, make([]byte, end-int64(len(want)))...)
				}
				copy(want[off:], data)
				filled = max(filled, off+int64(len(data)))
			}
			if fa.Streaming() != tc.stream {
				t.Errorf("streaming %v after the changes, want %v", fa.Streaming(), tc.stream)
			}
			if fa.Size() != int64(len(want)) || fs.Size() != fa.Size() {
				t.Fatalf("sizes %d and %d, want %d", fa.Size(), fs.Size(), len(want))
			}
			if got := fa.HoleBytes(); tc.stream && got != int64(len(want))-filled {
				t.Errorf("hole bytes %d, want %d", got, int64(len(want))-filled)
			}
			ra, err := fa.Finish(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer ra.Batch.Release()
			rs, err := fs.Finish(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Batch.Release()
			fs.Abort()
			if !reflect.DeepEqual(ra.Chunks, rs.Chunks) || !reflect.DeepEqual(ra.Holes, rs.Holes) {
				t.Fatalf("%d chunks, holes %v; the spool's commit: %d chunks, holes %v", len(ra.Chunks), ra.Holes, len(rs.Chunks), rs.Holes)
			}
			if got := contentOf(t, s, ra, int64(len(want))); !bytes.Equal(got, want) {
				t.Fatalf("the committed content differs from what was written")
			}
			if ra.Index != nil && ra.Index.Format != "" {
				t.Errorf("index format %q, want none", ra.Index.Format)
			}
		})
	}
}

// TestStageAppendReadsSpill: a read of a file staged for an append spills it
// into a spool holding the committed bytes and the appended ones.
func TestStageAppendReadsSpill(t *testing.T) {
	s, p := appendStore(t)
	ctx := context.Background()
	old := append([]byte("# metrics\n"), randBytes(22, 1<<20)...)
	base := commitContent(t, s, p, old)
	f, err := p.StageAppend(ctx, 1, base)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	more := randBytes(23, 200<<10)
	if _, err := f.WriteAt(ctx, more, int64(len(old))); err != nil {
		t.Fatal(err)
	}
	if err := f.Spill(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(old)+len(more))
	if n, err := f.ReadAt(got, 0); err != nil || n != len(got) {
		t.Fatalf("read %d, %v", n, err)
	}
	if !bytes.Equal(got, append(bytes.Clone(old), more...)) {
		t.Fatal("the spilled content differs from the committed bytes and the appended ones")
	}
}

// TestStageAppendOnlyForContentCuts: a file in a known format, or of one
// chunk, or with holes, is staged in a spool as before.
func TestStageAppendOnlyForContentCuts(t *testing.T) {
	s, p := appendStore(t)
	ctx := context.Background()
	header := []byte(`{"a":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]}}`)
	st := append(append(fmt.Appendf(nil, "%c%c%c%c%c%c%c%c", len(header), 0, 0, 0, 0, 0, 0, 0), header...), randBytes(24, 1<<20)...)
	tiny := []byte("step,loss\n1,0.5\n")
	for name, m := range map[string]*cas.Manifest{
		"safetensors": commitContent(t, s, p, st),
		"one chunk":   commitContent(t, s, p, tiny),
		"holes": {Chunks: commitContent(t, s, p, append([]byte("step,loss\n"), randBytes(25, 1<<20)...)).Chunks,
			Holes: []cas.Hole{{Before: 3, Len: 1 << 20}}},
	} {
		f, err := p.StageAppend(ctx, 1, m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.Streaming() {
			t.Errorf("%s: staged in a stream", name)
		}
		f.Abort()
	}
}
