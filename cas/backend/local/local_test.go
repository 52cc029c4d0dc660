package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t testing.TB) backend.Backend {
		b := New(filepath.Join(t.TempDir(), "objects"), Options{})
		t.Cleanup(func() { b.Close() })
		return b
	})
}

func TestConformanceNoHeldFiles(t *testing.T) {
	backendtest.Run(t, func(t testing.TB) backend.Backend {
		return New(filepath.Join(t.TempDir(), "objects"), Options{HeldFiles: -1})
	})
}

// TestLayout: chunks keep the layout every existing store has.
func TestLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "objects")
	b := New(root, Options{})
	defer b.Close()
	name := backendtest.Name("x")
	if err := b.Put(context.Background(), backend.Handle{Kind: backend.Chunk, Name: name}, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, name[:2], name[2:4], name[4:])); err != nil {
		t.Fatalf("chunk not at objects/ab/cd/<rest>: %v", err)
	}
}

// TestSyncThroughHook: Sync syncs every object and its three directories, and
// a failed sync is sticky and makes the object absent until Put again.
func TestSyncStickyFailure(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "objects")
	var synced []string
	fail := errors.New("injected EIO")
	failing := ""
	b := New(root, Options{SyncHook: func(p string) error {
		synced = append(synced, p)
		if p == failing {
			return fail
		}
		return nil
	}})
	defer b.Close()
	h := backend.Handle{Kind: backend.Chunk, Name: backendtest.Name("x")}
	if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	failing = b.path(h)
	for i := range 2 {
		if err := b.Sync(ctx, []backend.Handle{h}); !errors.Is(err, fail) {
			t.Fatalf("Sync %d: %v, want the injected failure", i, err)
		}
		failing = ""
	}
	if _, err := b.Stat(ctx, h); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Stat after a failed sync: %v, want ErrNotExist", err)
	}
	if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	synced = nil
	if err := b.Sync(ctx, []backend.Handle{h}); err != nil {
		t.Fatalf("Sync after rewriting: %v", err)
	}
	want := map[string]bool{b.path(h): true, root: true, filepath.Dir(b.path(h)): true, filepath.Dir(filepath.Dir(b.path(h))): true}
	for _, p := range synced {
		delete(want, p)
	}
	if len(want) > 0 {
		t.Fatalf("Sync did not sync %v (synced %v)", want, synced)
	}
}

func TestRemoveStale(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "objects")
	b := New(root, Options{})
	defer b.Close()
	h := backend.Handle{Kind: backend.Chunk, Name: backendtest.Name("x")}
	if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(b.path(h))
	old, young := filepath.Join(dir, ".tmp-old"), filepath.Join(dir, ".tmp-young")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("debris"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	n, err := b.RemoveStale(ctx, time.Now().Add(-time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("RemoveStale = %d, %v; want 1", n, err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("old debris kept")
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatal("young temporary file removed")
	}
	if _, err := b.Stat(ctx, h); err != nil {
		t.Fatalf("RemoveStale removed an object: %v", err)
	}
}
