package mem

import (
	"context"
	"errors"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(testing.TB) backend.Backend { return New(backend.Properties{KeepsModTime: true}) })
}

func TestCrashDropsUnsynced(t *testing.T) {
	ctx := context.Background()
	b := New(backend.Properties{})
	synced := backend.Handle{Kind: backend.Chunk, Name: backendtest.Name("synced")}
	lost := backend.Handle{Kind: backend.Chunk, Name: backendtest.Name("lost")}
	for _, h := range []backend.Handle{synced, lost} {
		if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Sync(ctx, []backend.Handle{synced}); err != nil {
		t.Fatal(err)
	}
	b.Crash()
	if _, err := b.Stat(ctx, synced); err != nil {
		t.Fatalf("synced object lost in a crash: %v", err)
	}
	if _, err := b.Stat(ctx, lost); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("unsynced object survived a crash: %v", err)
	}
}

func TestSyncFailureSticky(t *testing.T) {
	ctx := context.Background()
	b := New(backend.Properties{})
	h := backend.Handle{Kind: backend.Chunk, Name: backendtest.Name("h")}
	if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("EIO")
	b.FailSync(h, bad)
	for i := range 2 {
		if err := b.Sync(ctx, []backend.Handle{h}); !errors.Is(err, bad) {
			t.Fatalf("Sync %d after a failed writeback: %v, want the failure", i, err)
		}
	}
	if _, err := b.Get(ctx, h, nil); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Get of an object whose sync failed: %v, want ErrNotExist", err)
	}
	if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx, []backend.Handle{h}); err != nil {
		t.Fatalf("Sync after a new Put: %v", err)
	}
}
