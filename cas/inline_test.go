package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

// inlineStore opens a store in dir with chunks up to the default size
// inline (and packs for larger small chunks, as a mount has them).
func inlineStore(t *testing.T, dir string, inline int) *Store {
	t.Helper()
	s, err := openLocal(dir, Options{InlineMaxChunk: inline, PackMaxChunk: DefaultPackMaxChunk})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// chunkRow returns chunk id's index row, failing t when it has none.
func chunkRow(t *testing.T, s *Store, id ID) ChunkInfo {
	t.Helper()
	var info ChunkInfo
	var ok bool
	if err := s.View(func(tx *Tx) error {
		var err error
		info, ok, err = tx.Chunk(id)
		return err
	}); err != nil || !ok {
		t.Fatalf("chunk %v: indexed %v, %v", id, ok, err)
	}
	return info
}

// TestInlineChunks: chunks up to InlineMaxChunk are committed into the
// catalog (no object file, no pack), read back verified, counted, kept
// across a reopen, and move the store to format 7; larger ones are not.
func TestInlineChunks(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	s := inlineStore(t, dir, DefaultInlineMaxChunk)
	cases := []struct {
		name   string
		data   []byte
		inline bool
	}{
		{"empty", nil, true},
		{"4 KiB", pseudoRandom(4<<10, 1), true},
		{"at the threshold", pseudoRandom(DefaultInlineMaxChunk, 2), true},
		{"one byte over", pseudoRandom(DefaultInlineMaxChunk+1, 3), false},
	}
	refs := make([]ChunkRef, len(cases))
	for i, c := range cases {
		refs[i] = put(t, s, c.data)
		info := chunkRow(t, s, refs[i].ID)
		if info.Inline != c.inline {
			t.Fatalf("%s: row %+v, want inline %v", c.name, info, c.inline)
		}
		_, statErr := os.Stat(s.objectPath(refs[i].ID))
		if c.inline && (!errors.Is(statErr, os.ErrNotExist) || info.Packed()) {
			t.Fatalf("%s: inline chunk has an object file (%v) or a pack (%v)", c.name, statErr, info.Pack)
		}
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.InlineChunks != 3 || st.FormatVersion != 7 {
		t.Fatalf("stats: %d inline chunks, format %d; want 3 and 7", st.InlineChunks, st.FormatVersion)
	}
	s.Close()
	s = inlineStore(t, dir, -1) // reopened with inlining off: still read
	defer s.Close()
	for i, c := range cases {
		got, err := s.ReadChunk(ctx, refs[i])
		if err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("%s after a reopen: %v (equal %v)", c.name, err, bytes.Equal(got, c.data))
		}
		if _, err := s.VerifyObject(ctx, refs[i].ID); err != nil {
			t.Fatalf("%s: verify: %v", c.name, err)
		}
	}
}

// TestInlineEncoded: an inline chunk is stored encoded when that saves
// (the text of a small checkpoint file: JSON, a config), raw otherwise, and
// reads back as its bytes either way, after a reopen too; an encoded one
// that is damaged reads as ErrCorrupt. (Raw inline objects larger than a
// bbolt page made the catalog 6 KB a 4 KiB file: cas's doc, "Inline
// chunks".)
func TestInlineEncoded(t *testing.T) {
	ctx := context.Background()
	var state bytes.Buffer
	state.WriteString(`{"best_metric": null, "epoch": 3.0, "global_step": 1200, "log_history": [`)
	for i := range 40 {
		fmt.Fprintf(&state, `{"epoch": %d.25, "learning_rate": 4.9e-05, "loss": 2.%03d, "step": %d},`, i/4, 997-i, 30*i)
	}
	state.WriteString("]}")
	cases := []struct {
		name    string
		data    []byte
		encoded bool
	}{
		{"trainer state JSON", state.Bytes(), true},
		{"zeros", make([]byte, 4<<10), true},
		{"random bytes", pseudoRandom(4<<10, 21), false},
	}
	dir := filepath.Join(t.TempDir(), "store")
	s := inlineStore(t, dir, DefaultInlineMaxChunk)
	refs := make([]ChunkRef, len(cases))
	for i, c := range cases {
		if len(c.data) > DefaultInlineMaxChunk {
			t.Fatalf("%s: %d bytes, over the inline budget", c.name, len(c.data))
		}
		refs[i] = put(t, s, c.data)
		info := chunkRow(t, s, refs[i].ID)
		if !info.Inline {
			t.Fatalf("%s: not inline: %+v", c.name, info)
		}
		if got := info.Codec != CodecRaw; got != c.encoded {
			t.Errorf("%s: codec %v, want encoded %v", c.name, info.Codec, c.encoded)
		}
		if c.encoded && int(info.StoredLen) > len(c.data)/2 {
			t.Errorf("%s: %d raw bytes stored in %d", c.name, len(c.data), info.StoredLen)
		}
	}
	s.Close()
	s = inlineStore(t, dir, DefaultInlineMaxChunk)
	defer s.Close()
	for i, c := range cases {
		got, err := s.ReadChunk(ctx, refs[i])
		if err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("%s after a reopen: %v (equal %v)", c.name, err, bytes.Equal(got, c.data))
		}
	}

	b := s.NewBatch()
	text := bytes.Repeat([]byte("learning_rate: 3e-4\n"), 100)
	ref, err := b.Put(ctx, text)
	if err != nil {
		t.Fatal(err)
	}
	obj := b.inline[ref.ID]
	if h, err := object.ParseHeader(obj); err != nil || h.Codec == CodecRaw {
		t.Fatalf("the batch holds %v (%v), want an encoded object", h, err)
	}
	obj[len(obj)-10] ^= 1 // a byte of the encoded payload
	if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadChunk(ctx, ref); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a damaged encoded inline chunk: %v, want ErrCorrupt", err)
	}

	// No encoder on the commit path (--inline-encoders -1): raw, as a new
	// object would be.
	noenc, err := openLocal(filepath.Join(t.TempDir(), "store"), Options{InlineMaxChunk: DefaultInlineMaxChunk, InlineEncoders: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer noenc.Close()
	r := put(t, noenc, state.Bytes())
	if info := chunkRow(t, noenc, r.ID); !info.Inline || info.Codec != CodecRaw {
		t.Fatalf("with no inline encoder: %+v, want inline and raw", info)
	}
	if got, err := noenc.ReadChunk(ctx, r); err != nil || !bytes.Equal(got, state.Bytes()) {
		t.Fatalf("read: %v", err)
	}
}

// TestInlineDedup: an inline chunk is stored once however many batches put
// it, concurrently or later, and a chunk that has an object already is not
// inlined again.
func TestInlineDedup(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	s := inlineStore(t, dir, -1)
	asObject := pseudoRandom(2<<10, 9)
	objRef := put(t, s, asObject)
	s.Close()

	s = inlineStore(t, dir, DefaultInlineMaxChunk)
	defer s.Close()
	if info := put(t, s, asObject); chunkRow(t, s, info.ID).Inline {
		t.Fatal("a chunk stored as an object was inlined again")
	}
	data := pseudoRandom(4<<10, 10)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := s.NewBatch()
			if _, err := b.Put(ctx, data); err != nil {
				b.Release()
				errs <- err
				return
			}
			errs <- s.Commit(ctx, b, func(*Tx) error { return nil })
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ref := put(t, s, data) // and once more, after
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.InlineChunks != 1 || st.InlineBytes != int64(len(object.EncodeRaw(data))) || st.Chunks != 2 {
		t.Fatalf("stats %+v: want 1 inline chunk of %d bytes, 2 chunks", st.Counts, len(object.EncodeRaw(data)))
	}
	for _, r := range []ChunkRef{ref, objRef} {
		if _, err := s.ReadChunk(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInlineDamaged: an inline object that does not verify (damaged before
// it reached the catalog, so its record's checksum holds) reads as
// ErrCorrupt, never as other bytes.
func TestInlineDamaged(t *testing.T) {
	ctx := context.Background()
	s := inlineStore(t, filepath.Join(t.TempDir(), "store"), DefaultInlineMaxChunk)
	defer s.Close()
	b := s.NewBatch()
	ref, err := b.Put(ctx, pseudoRandom(4<<10, 11))
	if err != nil {
		t.Fatal(err)
	}
	b.inline[ref.ID][100] ^= 1 // a payload byte
	if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadChunk(ctx, ref); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a damaged inline chunk: %v, want ErrCorrupt", err)
	}
	if _, err := s.VerifyObject(ctx, ref.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("verify of a damaged inline chunk: %v, want ErrCorrupt", err)
	}
}

// TestInlineBeforeCommitAndSweep: an inline chunk of a batch not committed
// yet reads from the batch; its object reaches the remote tier's uploader
// through PackedObject; a sweep frees it with its row; a batch released
// without a commit leaves nothing.
func TestInlineBeforeCommitAndSweep(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    []byte
		encoded bool
	}{
		{"raw", pseudoRandom(3<<10, 12), false},
		{"encoded", bytes.Repeat([]byte(`{"lr": 0.0003, "step": 7}`), 120), true},
	} {
		t.Run(tc.name, func(t *testing.T) { inlineBeforeCommitAndSweep(t, tc.data, tc.encoded) })
	}
}

func inlineBeforeCommitAndSweep(t *testing.T, data []byte, encoded bool) {
	ctx := context.Background()
	s := inlineStore(t, filepath.Join(t.TempDir(), "store"), DefaultInlineMaxChunk)
	defer s.Close()
	b := s.NewBatch()
	ref, err := b.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadChunk(ctx, ref); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read before the commit: %v", err)
	}
	if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if info := chunkRow(t, s, ref.ID); (info.Codec != CodecRaw) != encoded {
		t.Fatalf("stored as %v, want encoded %v", info.Codec, encoded)
	}
	obj, packed, err := s.PackedObject(ctx, ref.ID, nil)
	if err != nil || !packed {
		t.Fatalf("PackedObject of an inline chunk: packed %v, %v", packed, err)
	}
	if raw, err := s.DecodeObject(ctx, ref.ID, obj); err != nil || !bytes.Equal(raw, data) {
		t.Fatalf("the uploader's copy does not decode: %v", err)
	}
	res, err := s.Sweep(ctx, []ID{ref.ID})
	if err != nil || res.Chunks != 1 || res.StoredBytes != int64(len(obj)) {
		t.Fatalf("sweep: %+v, %v; want 1 chunk of %d bytes", res, err, len(obj))
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.InlineChunks != 0 || st.InlineBytes != 0 || st.Chunks != 0 {
		t.Fatalf("after the sweep: %+v", st.Counts)
	}
	if _, err := s.ReadChunk(ctx, ref); err == nil {
		t.Fatal("a swept inline chunk still reads")
	}

	b = s.NewBatch()
	if _, err := b.Put(ctx, data); err != nil {
		t.Fatal(err)
	}
	b.Release()
	if _, err := s.ReadChunk(ctx, ref); err == nil {
		t.Fatal("the chunk of a batch released without a commit still reads")
	}
}

// TestInlineBudgetPerBatch: a batch puts at most InlineMaxChunk raw bytes
// inline in all, so a large file's chunks go to packs or objects however
// small they are.
func TestInlineBudgetPerBatch(t *testing.T) {
	ctx := context.Background()
	s := inlineStore(t, filepath.Join(t.TempDir(), "store"), DefaultInlineMaxChunk)
	defer s.Close()
	b := s.NewBatch()
	var refs []ChunkRef
	for i := range 4 {
		ref, err := b.Put(ctx, pseudoRandom(6<<10, byte(20+i)))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	if err := s.Commit(ctx, b, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, false, false} { // 6 + 6 ≤ 16 < 18
		if got := chunkRow(t, s, refs[i].ID).Inline; got != want {
			t.Fatalf("chunk %d of 6 KiB: inline %v, want %v", i, got, want)
		}
		if _, err := s.ReadChunk(ctx, refs[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeltaCandidate: a batch says which of its chunks a suggested base
// would make a delta, and its commit agrees: an inline chunk, a packed one,
// one the store held already and one never put are not candidates; a chunk
// of an object of its own is, and gets a delta plan from its suggestion.
func TestDeltaCandidate(t *testing.T) {
	ctx := context.Background()
	s := inlineStore(t, filepath.Join(t.TempDir(), "store"), DefaultInlineMaxChunk)
	defer s.Close()
	held := pseudoRandom(1<<20, 40)
	put(t, s, held)
	put(t, s, pseudoRandom(64<<10, 44))
	cases := []struct {
		name string
		data []byte // nil: never put
		want bool
		hint bool // HintWanted: also a chunk held already too large to be inline or packed
	}{
		{"inline", pseudoRandom(4<<10, 41), false, false},
		{"packed", pseudoRandom(64<<10, 42), false, false},
		{"own object", pseudoRandom(1<<20, 43), true, true},
		{"held already", held, false, true},
		{"held already, small", pseudoRandom(64<<10, 44), false, false},
		{"never put", nil, false, false},
	}
	b := s.NewBatch()
	ids := make([]ID, len(cases))
	for i, c := range cases {
		if c.data == nil {
			ids[i] = Sum([]byte("never put"))
			continue
		}
		// A base of the same length, committed: what a previous step left.
		base := put(t, s, pseudoRandom(len(c.data), byte(60+i)))
		ref, err := b.Put(ctx, c.data)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = ref.ID
		b.SuggestBase(ref.ID, base.ID)
	}
	for i, c := range cases {
		if got := b.DeltaCandidate(ids[i]); got != c.want {
			t.Errorf("%s: DeltaCandidate %v, want %v", c.name, got, c.want)
		}
		if got := b.HintWanted(ids[i], len(c.data)); got != c.hint {
			t.Errorf("%s: HintWanted %v, want %v", c.name, got, c.hint)
		}
	}
	mustCommit(t, s, b)
	if err := s.View(func(tx *Tx) error {
		for i, c := range cases {
			_, _, planned, err := tx.DeltaPlan(ids[i])
			if err != nil {
				return err
			}
			if !planned { // or planned and already re-encoded as a delta
				if _, _, planned, err = tx.Delta(ids[i]); err != nil {
					return err
				}
			}
			if planned != c.want {
				t.Errorf("%s: delta planned %v at commit, DeltaCandidate said %v", c.name, planned, c.want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
