package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
	"github.com/ckptfs/ckptfs/cas/object"
)

// castagnoli is the CRC-32C table of object payloads (object.Header.CRC).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TestDeltaBaseNotVerifiedAlone: a base read for a delta is not hashed on its
// own (loadBase); whatever is wrong with it, the read of the delta fails with
// ErrCorrupt naming the base, never gives wrong bytes, and such a base never
// enters the cache.
func TestDeltaBaseNotVerifiedAlone(t *testing.T) {
	ctx := context.Background()
	base, next := tensortest.SyntheticStep(11, 128<<10, 2, 0.01)
	_, other := tensortest.SyntheticStep(12, 128<<10, 2, 0.01)
	// sealed re-seals obj's CRC after a change: damage the CRC cannot see.
	sealed := func(obj []byte) []byte {
		binary.LittleEndian.PutUint32(obj[16:], crc32.Checksum(obj[object.HeaderSize:], castagnoli))
		return obj
	}
	cases := []struct {
		name   string
		damage func(s *Store, good []byte) []byte // the base's object; nil: remove it
		want   error
	}{
		{"bit flip", func(_ *Store, good []byte) []byte {
			o := bytes.Clone(good)
			o[len(o)-1] ^= 1
			return o
		}, ErrCorrupt},
		{"bit flip, CRC re-sealed", func(_ *Store, good []byte) []byte {
			o := bytes.Clone(good)
			o[len(o)-1] ^= 1
			return sealed(o)
		}, ErrCorrupt},
		{"another chunk's object", func(s *Store, _ []byte) []byte {
			o, _ := s.coder.Encode(other, Hint{ElemSize: 2})
			return o
		}, ErrCorrupt},
		{"a delta", func(s *Store, _ []byte) []byte {
			return s.coder.EncodeDelta(base, next, Sum(next), 2, new(object.DeltaScratch))
		}, ErrCorrupt},
		{"missing", nil, ErrMissing},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t, Options{})
			bref, nref := put(t, s, base), put(t, s, next)
			storeDelta(t, s, next, nref, base, bref.ID)
			s.cache.drop(bref.ID)
			got, err := s.ReadChunk(ctx, nref)
			if err != nil || !bytes.Equal(got, next) {
				t.Fatalf("sound read: %v", err)
			}
			if s.Cached(bref.ID) {
				t.Fatal("a base loaded for a delta entered the cache")
			}
			s.cache.drop(nref.ID)
			p := s.objectPath(bref.ID)
			good, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if tc.damage == nil {
				err = os.Remove(p)
			} else {
				err = os.WriteFile(p, tc.damage(s, good), 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err = s.ReadChunk(ctx, nref)
			if !errors.Is(err, tc.want) {
				t.Fatalf("read: %v (%d bytes), want %v", err, len(got), tc.want)
			}
			if !strings.Contains(err.Error(), bref.ID.String()) {
				t.Errorf("error %q does not name the base", err)
			}
			// The verifying read (fsck's) says the base is at fault.
			var be *BaseError
			if _, _, _, err := s.VerifyObjectBase(ctx, nref.ID); !errors.As(err, &be) || be.Chunk != nref.ID || be.Base != bref.ID || !errors.Is(err, tc.want) {
				t.Errorf("verify: %v, want a BaseError of %v against %v", err, nref.ID, bref.ID)
			}
			if s.Cached(bref.ID) || s.Cached(nref.ID) {
				t.Error("a failed read left a chunk in the cache")
			}
			// Repaired, the same store reads it again.
			if err := os.WriteFile(p, good, 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := s.ReadChunk(ctx, nref); err != nil || !bytes.Equal(got, next) {
				t.Fatalf("read after repair: %v", err)
			}
		})
	}
}

// TestDeltaDamagedItselfNamesTheDelta: with a sound base, a delta damaged
// past its CRC is blamed on itself.
func TestDeltaDamagedItselfNamesTheDelta(t *testing.T) {
	ctx := context.Background()
	s := testStore(t, Options{})
	base, next := tensortest.SyntheticStep(13, 128<<10, 2, 0.01)
	bref, nref := put(t, s, base), put(t, s, next)
	storeDelta(t, s, next, nref, base, bref.ID)
	p := s.objectPath(nref.ID)
	obj, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Damage the middle of the payload and re-seal the CRC: the decode or
	// the hash check fails.
	obj[len(obj)/2] ^= 0x10
	binary.LittleEndian.PutUint32(obj[16:], crc32.Checksum(obj[object.HeaderSize:], castagnoli))
	if err := os.WriteFile(p, obj, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.ReadChunk(ctx, nref)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read: %v, want ErrCorrupt", err)
	}
	if strings.Contains(err.Error(), "base:") {
		t.Errorf("error %q blames the base", err)
	}
	if _, _, _, err := s.VerifyObjectBase(ctx, nref.ID); !errors.Is(err, ErrCorrupt) || errors.As(err, new(*BaseError)) {
		t.Errorf("verify: %v, want ErrCorrupt of the delta itself", err)
	}
	if _, err := s.ReadChunk(ctx, bref); err != nil {
		t.Fatalf("base: %v", err)
	}
}

// TestDeltaBaseFromRemote: a delta's base missing locally is fetched from the
// remote tier, verified, and kept as a local copy; a damaged local copy is
// fetched again; a base the remote holds as a delta is refused.
func TestDeltaBaseFromRemote(t *testing.T) {
	ctx := context.Background()
	base, next := tensortest.SyntheticStep(21, 128<<10, 2, 0.01)
	bid, nid := Sum(base), Sum(next)
	nref := ChunkRef{ID: nid, Len: uint32(len(next))}
	cases := []struct {
		name        string
		deltaLocal  bool   // the delta is in the local objects too
		remoteBase  string // "standalone", "delta", "none"
		localBase   string // "", "torn", "wrong" (a CRC-sound copy of the wrong bytes)
		want        error
		fetchesBase bool
	}{
		{"both remote", false, "standalone", "", nil, true},
		{"delta local", true, "standalone", "", nil, true},
		{"torn local copy", true, "standalone", "torn", nil, true},
		{"wrong local copy", true, "standalone", "wrong", nil, true},
		{"base a delta in the remote", true, "delta", "", ErrCorrupt, false},
		{"base nowhere", true, "none", "", ErrMissing, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			remote := mem.New(backend.Properties{DurableOnPut: true})
			dir := filepath.Join(t.TempDir(), "store")
			tier := tiered.New(local.New(ObjectsDir(dir), local.Options{}), &keepOpen{remote}, tiered.Options{})
			s := testStore(t, Options{Objects: tier}, dir)
			dobj := s.coder.EncodeDelta(next, base, bid, 2, new(object.DeltaScratch))
			bobj, _ := s.coder.Encode(base, Hint{ElemSize: 2})
			putObj := func(be backend.Backend, id ID, obj []byte) {
				t.Helper()
				if err := be.Put(ctx, chunkHandle(id), obj, backend.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			putObj(remote, nid, dobj)
			if tc.deltaLocal {
				putObj(s.objects, nid, dobj)
			}
			switch tc.remoteBase {
			case "standalone":
				putObj(remote, bid, bobj)
			case "delta":
				putObj(remote, bid, s.coder.EncodeDelta(base, next, nid, 2, new(object.DeltaScratch)))
			}
			switch tc.localBase {
			case "torn":
				putObj(s.objects, bid, bobj[:len(bobj)/2])
			case "wrong":
				_, other := tensortest.SyntheticStep(22, 128<<10, 2, 0.01)
				o, _ := s.coder.Encode(other, Hint{ElemSize: 2})
				putObj(s.objects, bid, o)
			}
			got, err := s.ReadChunk(ctx, nref)
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("read: %v, want %v", err, tc.want)
				}
				return
			}
			if err != nil || !bytes.Equal(got, next) {
				t.Fatalf("read: %v", err)
			}
			if !tc.fetchesBase {
				return
			}
			local, err := s.objects.Get(ctx, chunkHandle(bid), nil)
			if err != nil || !bytes.Equal(local, bobj) {
				t.Errorf("no sound local copy of the fetched base (%v)", err)
			}
			if st, _ := s.Stats(); st.RemoteStats.ReadBytes < int64(len(bobj)) {
				t.Errorf("remote read %d bytes, the base alone is %d", st.RemoteStats.ReadBytes, len(bobj))
			}
		})
	}
}

// keepOpen is a backend that Close does not close: tests and benchmarks
// reopen stores on the same objects.
type keepOpen struct{ *mem.Backend }

func (keepOpen) Close() error { return nil }
