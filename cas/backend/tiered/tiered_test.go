package tiered

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
)

// TestConformance: with an empty remote, a tier is its local backend.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(testing.TB) backend.Backend {
		return New(mem.New(backend.Properties{KeepsModTime: true}), mem.New(backend.Properties{}), Options{})
	})
}

func handle(name string) backend.Handle {
	return backend.Handle{Kind: backend.Chunk, Name: backendtest.Name(name)}
}

// TestFetchKeepEvict: a miss is fetched and kept, Stat sees only local
// objects, the copies stay within the budget (the newest always kept), and
// evictions go to OnEvict's function.
func TestFetchKeepEvict(t *testing.T) {
	ctx := context.Background()
	local, remote := mem.New(backend.Properties{}), mem.New(backend.Properties{})
	tier := New(local, remote, Options{CacheSize: 250})
	var evicted []backend.Handle
	tier.OnEvict(func(ctx context.Context, hs []backend.Handle) {
		evicted = append(evicted, hs...)
		for _, h := range hs {
			_ = tier.Delete(ctx, h)
		}
	})
	a, b, c := handle("a"), handle("b"), handle("c")
	for _, h := range []backend.Handle{a, b, c} {
		if err := remote.Put(ctx, h, bytes.Repeat([]byte(h.Name[:1]), 100), backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tier.Stat(ctx, a); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Stat of an object only the remote has: %v, want ErrNotExist", err)
	}
	for _, h := range []backend.Handle{a, b, c} {
		if obj, err := tier.Get(ctx, h, nil); err != nil || len(obj) != 100 {
			t.Fatalf("get %v: %d bytes, %v", h, len(obj), err)
		}
	}
	if len(evicted) != 1 || evicted[0] != a {
		t.Fatalf("evicted %v, want the least recently fetched (a)", evicted)
	}
	if _, err := local.Stat(ctx, c); err != nil {
		t.Fatalf("the newest copy is not kept: %v", err)
	}
	if st := tier.TierStats(); st.ReadBytes != 300 {
		t.Fatalf("read %d bytes from the remote, want 300", st.ReadBytes)
	}
	if _, err := tier.Get(ctx, handle("nowhere"), nil); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("get of an object nowhere: %v", err)
	}
}

// TestRefetchDrop: Refetch replaces a damaged local copy with the
// remote's; Drop removes the local copy and leaves the remote's.
func TestRefetchDrop(t *testing.T) {
	ctx := context.Background()
	local, remote := mem.New(backend.Properties{}), mem.New(backend.Properties{})
	tier := New(local, remote, Options{})
	h := handle("x")
	if err := remote.Put(ctx, h, []byte("good"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := local.Put(ctx, h, []byte("torn"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if obj, err := tier.Refetch(ctx, h, nil); err != nil || string(obj) != "good" {
		t.Fatalf("refetch: %q %v", obj, err)
	}
	if obj, err := local.Get(ctx, h, nil); err != nil || string(obj) != "good" {
		t.Fatalf("local copy after refetch: %q %v", obj, err)
	}
	if err := tier.Drop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Stat(ctx, h); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("local copy after Drop: %v", err)
	}
	if _, err := remote.Stat(ctx, h); err != nil {
		t.Fatalf("Drop touched the remote: %v", err)
	}
}
