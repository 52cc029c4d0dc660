package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
)

// TestRandomWritersConverge: seeded random writes, removals, renames and
// rounds by three writer sessions, with a reader refreshing; once every
// session has run two more rounds, every store shows the same namespace,
// which a fresh reader sees too, every file is a whole version some
// writer wrote, and its bytes read back from the bucket.
func TestRandomWritersConverge(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomWriters(t, seed) })
	}
}

func randomWriters(t *testing.T, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 24))
	remote := mem.New(backend.Properties{DurableOnPut: true})
	var stores []*cas.Store
	var tiers []*Tier
	for range 3 {
		s, r := testStore(t, remote)
		join(t, s, r)
		stores, tiers = append(stores, s), append(tiers, r)
	}
	reader, rr := testStore(t, remote)
	names := []string{"a", "b", "c", "d", "e"}
	written := map[string]bool{} // manifests written, marshalled
	var ops, rounds, superseded int
	for step := 0; step < 150; step++ {
		i := rng.IntN(3)
		s := stores[i]
		p, q := names[rng.IntN(len(names))], names[rng.IntN(len(names))]
		ino, exists := lookupRoot(t, s, p)
		switch k := rng.IntN(10); {
		case k < 4:
			data := pseudoRandom(100+rng.IntN(3000), byte(rng.IntN(256)))
			commitAt(t, s, p, data, time.Now().UnixNano())
			_, m := lookupManifest(t, s, p)
			written[string(m.Marshal())] = true
			ops++
		case k < 5 && exists:
			mustUpdate(t, s, func(tx *cas.Tx) error {
				if err := tx.Unlink(cas.RootIno, p); err != nil {
					return err
				}
				return tx.DeleteNode(ino)
			})
			ops++
		case k < 6 && exists && p != q:
			mustUpdate(t, s, func(tx *cas.Tx) error {
				if old, ok := tx.Lookup(cas.RootIno, q); ok {
					if err := tx.Unlink(cas.RootIno, q); err != nil {
						return err
					}
					if err := tx.DeleteNode(old); err != nil {
						return err
					}
				}
				if err := tx.Unlink(cas.RootIno, p); err != nil {
					return err
				}
				return tx.Link(cas.RootIno, q, ino)
			})
			ops++
		case k < 9:
			err := tiers[i].UploadRound(ctx, true)
			if errors.Is(err, ErrSuperseded) {
				superseded++
			} else if err != nil {
				t.Fatal(err)
			}
			rounds++
		default:
			if _, _, err := rr.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 {
		for _, r := range tiers {
			if err := r.UploadRound(ctx, true); err != nil && !errors.Is(err, ErrSuperseded) {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := rr.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	want := manifests(t, stores[0])
	for i, s := range append(stores[1:], reader) {
		if got := manifests(t, s); !sameManifests(got, want) {
			t.Errorf("store %d differs from store 0 after quiescing: %d vs %d paths", i+1, len(got), len(want))
		}
	}
	fresh, _ := testStore(t, remote)
	pub := readPublished(t, remote)
	if len(pub) != len(want) {
		t.Errorf("a fresh reader sees %d paths, the stores %d", len(pub), len(want))
	}
	for p, e := range pub {
		if !written[string(e.Raw)] {
			t.Errorf("%s is no version any writer wrote", p)
		}
		for _, ref := range e.m.Chunks {
			if _, err := fresh.ReadChunk(ctx, ref); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
	}
	t.Logf("seed %d: %d ops, %d rounds (%d superseded), %d paths at the end", seed, ops, rounds, superseded, len(pub))
}

func lookupRoot(t *testing.T, s *cas.Store, name string) (uint64, bool) {
	var ino uint64
	var ok bool
	if err := s.View(func(tx *cas.Tx) error { ino, ok = tx.Lookup(cas.RootIno, name); return nil }); err != nil {
		t.Fatal(err)
	}
	return ino, ok
}

func lookupManifest(t *testing.T, s *cas.Store, name string) (uint64, *cas.Manifest) {
	var ino uint64
	var m *cas.Manifest
	if err := s.View(func(tx *cas.Tx) error {
		ino, _ = tx.Lookup(cas.RootIno, name)
		var err error
		m, _, err = tx.Manifest(ino)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ino, m
}

func mustUpdate(t *testing.T, s *cas.Store, fn func(tx *cas.Tx) error) {
	t.Helper()
	if err := s.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// manifests returns every root file's manifest, marshalled.
func manifests(t *testing.T, s *cas.Store) map[string][]byte {
	out := map[string][]byte{}
	if err := s.View(func(tx *cas.Tx) error {
		return tx.Children(cas.RootIno, func(name string, ino uint64) error {
			m, ok, err := tx.Manifest(ino)
			if ok {
				out[name] = m.Marshal()
			}
			return err
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameManifests(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
