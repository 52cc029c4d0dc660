// Package backendtest is the conformance suite every backend.Backend must
// pass (restic's internal/backend/test, kopia's blobtesting). Each test gets
// a fresh, empty backend from the caller's constructor:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t testing.TB) backend.Backend { return newBackend(t) })
//	}
//
// The constructor must return an empty backend each time (a fresh directory,
// a fresh bucket prefix) and arrange its own cleanup (t.Cleanup); the suite
// closes nothing. What is not portable is not here: a crash's effect on
// unsynced objects and sticky sync failures need fault injection, and are
// tested beside each implementation.
package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, newBackend func(t testing.TB) backend.Backend) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, b backend.Backend)
	}{
		{"PutGet", testPutGet},
		{"GetBuffer", testGetBuffer},
		{"Missing", testMissing},
		{"Replace", testReplace},
		{"IfAbsent", testIfAbsent},
		{"IfAbsentRace", testIfAbsentRace},
		{"Delete", testDelete},
		{"List", testList},
		{"Sync", testSync},
		{"InvalidHandle", testInvalidHandle},
		{"Cancelled", testCancelled},
		{"ModTime", testModTime},
		{"Sizes", testSizes},
		{"Concurrent", testConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newBackend(t)) })
	}
}

// Name returns a valid Chunk/Manifest name derived from s.
func Name(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func chunk(s string) backend.Handle    { return backend.Handle{Kind: backend.Chunk, Name: Name(s)} }
func manifest(s string) backend.Handle { return backend.Handle{Kind: backend.Manifest, Name: Name(s)} }

func data(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

func put(t *testing.T, b backend.Backend, h backend.Handle, obj []byte) {
	t.Helper()
	if err := b.Put(context.Background(), h, obj, backend.PutOptions{}); err != nil {
		t.Fatalf("Put %v: %v", h, err)
	}
}

func get(t *testing.T, b backend.Backend, h backend.Handle) []byte {
	t.Helper()
	got, err := b.Get(context.Background(), h, nil)
	if err != nil {
		t.Fatalf("Get %v: %v", h, err)
	}
	return got
}

func testPutGet(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	for _, h := range []backend.Handle{chunk("a"), manifest("a"), {Kind: backend.Lock, Name: "writer"}} {
		obj := data(1000)
		want := bytes.Clone(obj)
		put(t, b, h, obj)
		obj[0] ^= 0xff // Put must not retain obj
		if got := get(t, b, h); !bytes.Equal(got, want) {
			t.Fatalf("Get %v returned other bytes than Put stored", h)
		}
		info, err := b.Stat(ctx, h)
		if err != nil {
			t.Fatalf("Stat %v: %v", h, err)
		}
		if info.Handle != h || info.Size != int64(len(want)) {
			t.Fatalf("Stat %v = %+v, want handle %v size %d", h, info, h, len(want))
		}
	}
	// The same name under two kinds is two objects.
	if bytes.Equal(get(t, b, chunk("a")), get(t, b, manifest("a"))) {
		t.Fatal("a chunk and a manifest of the same name share their bytes")
	}
}

func testGetBuffer(t *testing.T, b backend.Backend) {
	h := chunk("buf")
	want := data(4096)
	put(t, b, h, want)
	buf := make([]byte, 10, 8192)
	got, err := b.Get(context.Background(), h, buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("Get into a buffer returned other bytes")
	}
	// A buffer too small is not an error.
	got, err = b.Get(context.Background(), h, make([]byte, 0, 16))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Get into a small buffer: %v", err)
	}
	// The result aliases nothing the backend keeps.
	got[0] ^= 0xff
	if !bytes.Equal(get(t, b, h), want) {
		t.Fatal("modifying Get's result changed the stored object")
	}
}

func testMissing(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	h := chunk("missing")
	if _, err := b.Get(ctx, h, nil); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Get of a missing object: %v, want ErrNotExist", err)
	}
	if _, err := b.Stat(ctx, h); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Stat of a missing object: %v, want ErrNotExist", err)
	}
	_, err := b.Get(ctx, h, nil)
	if !b.IsPermanent(err) {
		t.Fatalf("IsPermanent(%v) = false for a missing object", err)
	}
}

func testReplace(t *testing.T, b backend.Backend) {
	h := chunk("replace")
	put(t, b, h, []byte("first version"))
	second := data(3000)
	put(t, b, h, second)
	if got := get(t, b, h); !bytes.Equal(got, second) {
		t.Fatalf("after a replacing Put, Get returned %d bytes, not the new object", len(got))
	}
	n := 0
	if err := b.List(context.Background(), backend.Chunk, func(backend.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("after a replacing Put, List reports %d objects, want 1", n)
	}
}

func testIfAbsent(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	for _, h := range []backend.Handle{chunk("ifabsent"), {Kind: backend.Lock, Name: "writer"}} {
		first := data(100)
		if err := b.Put(ctx, h, first, backend.PutOptions{IfAbsent: true}); err != nil {
			t.Fatalf("IfAbsent Put of a new %v: %v", h, err)
		}
		err := b.Put(ctx, h, data(200), backend.PutOptions{IfAbsent: true})
		if !errors.Is(err, backend.ErrExists) {
			t.Fatalf("IfAbsent Put over an existing %v: %v, want ErrExists", h, err)
		}
		if !b.IsPermanent(err) {
			t.Fatalf("IsPermanent(%v) = false", err)
		}
		if got := get(t, b, h); !bytes.Equal(got, first) {
			t.Fatalf("a refused IfAbsent Put changed %v", h)
		}
		// After a Delete the name is free again.
		if err := b.Delete(ctx, h); err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, h, first, backend.PutOptions{IfAbsent: true}); err != nil {
			t.Fatalf("IfAbsent Put after Delete: %v", err)
		}
	}
}

func testIfAbsentRace(t *testing.T, b backend.Backend) {
	const n = 8
	h := backend.Handle{Kind: backend.Lock, Name: "race"}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = b.Put(context.Background(), h, []byte(fmt.Sprintf("holder %d", i)), backend.PutOptions{IfAbsent: true})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("two IfAbsent Puts of one handle both succeeded (%d and %d)", winner, i)
			}
			winner = i
		case !errors.Is(err, backend.ErrExists):
			t.Fatalf("racing IfAbsent Put %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no racing IfAbsent Put succeeded")
	}
	if got := string(get(t, b, h)); got != fmt.Sprintf("holder %d", winner) {
		t.Fatalf("the lock holds %q, but holder %d won", got, winner)
	}
}

func testDelete(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	h := chunk("delete")
	put(t, b, h, data(10))
	if err := b.Delete(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, h, nil); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Get after Delete: %v, want ErrNotExist", err)
	}
	if err := b.Delete(ctx, h); err != nil {
		t.Fatalf("Delete of a missing object: %v, want nil", err)
	}
}

func testList(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	want := map[backend.Kind][]string{}
	for i := range 20 {
		h := chunk(fmt.Sprint(i))
		put(t, b, h, data(i))
		want[backend.Chunk] = append(want[backend.Chunk], h.Name)
	}
	for i := range 3 {
		h := manifest(fmt.Sprint(i))
		put(t, b, h, data(10+i))
		want[backend.Manifest] = append(want[backend.Manifest], h.Name)
	}
	put(t, b, backend.Handle{Kind: backend.Lock, Name: "writer"}, []byte("x"))
	want[backend.Lock] = []string{"writer"}
	for _, k := range backend.Kinds {
		var got []string
		err := b.List(ctx, k, func(in backend.Info) error {
			if in.Handle.Kind != k {
				t.Errorf("List(%v) reported %v", k, in.Handle)
			}
			if in.ModTime.IsZero() {
				t.Errorf("List(%v): %v has no ModTime", k, in.Handle)
			}
			got = append(got, in.Handle.Name)
			return nil
		})
		if err != nil {
			t.Fatalf("List(%v): %v", k, err)
		}
		sort.Strings(got)
		sort.Strings(want[k])
		if fmt.Sprint(got) != fmt.Sprint(want[k]) {
			t.Fatalf("List(%v) = %v, want %v", k, got, want[k])
		}
	}
	// Sizes are reported.
	err := b.List(ctx, backend.Manifest, func(in backend.Info) error {
		if in.Size < 10 || in.Size > 12 {
			return fmt.Errorf("List reported size %d for %v", in.Size, in.Handle)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An error from fn stops the listing and comes back.
	stop := errors.New("stop")
	calls := 0
	if err := b.List(ctx, backend.Chunk, func(backend.Info) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List with a failing callback: %v after %d calls, want stop after 1", err, calls)
	}
}

func testSync(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	var hs []backend.Handle
	for i := range 5 {
		h := chunk(fmt.Sprint("sync", i))
		put(t, b, h, data(100))
		hs = append(hs, h)
	}
	if err := b.Sync(ctx, hs); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := b.Sync(ctx, hs[:2]); err != nil {
		t.Fatalf("Sync again: %v", err)
	}
	if err := b.Sync(ctx, nil); err != nil {
		t.Fatalf("Sync of nothing: %v", err)
	}
	err := b.Sync(ctx, append(hs, chunk("never put")))
	if !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("Sync naming a missing object: %v, want ErrNotExist", err)
	}
}

func testInvalidHandle(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	for _, h := range []backend.Handle{
		{Kind: backend.Chunk, Name: "short"},
		{Kind: backend.Chunk, Name: Name("x")[:63] + "G"},
		{Kind: backend.Chunk, Name: "../../../../etc/passwd" + Name("x")[22:]},
		{Kind: backend.Lock, Name: ""},
		{Kind: backend.Lock, Name: ".tmp"},
		{Kind: backend.Lock, Name: "a/b"},
		{Kind: 0, Name: Name("x")},
	} {
		if h.Valid() {
			t.Fatalf("%q is Valid", h.Name)
		}
		if err := b.Put(ctx, h, []byte("x"), backend.PutOptions{}); err == nil {
			t.Fatalf("Put accepted invalid handle %d/%q", h.Kind, h.Name)
		}
		if _, err := b.Get(ctx, h, nil); err == nil {
			t.Fatalf("Get accepted invalid handle %d/%q", h.Kind, h.Name)
		}
	}
	for _, k := range backend.Kinds {
		if err := b.List(ctx, k, func(in backend.Info) error { return fmt.Errorf("found %v", in.Handle) }); err != nil {
			t.Fatalf("after refused Puts: %v", err)
		}
	}
}

func testCancelled(t *testing.T, b backend.Backend) {
	h := chunk("cancel")
	put(t, b, h, data(10))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Get(ctx, h, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context: %v, want context.Canceled", err)
	}
	if err := b.Put(ctx, chunk("cancel2"), data(10), backend.PutOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := b.Stat(context.Background(), chunk("cancel2")); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("a Put with a cancelled context stored its object (Stat: %v)", err)
	}
	if err := b.List(ctx, backend.Chunk, func(backend.Info) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("List with a cancelled context: %v, want context.Canceled", err)
	}
	if !b.IsPermanent(context.Canceled) {
		t.Fatal("IsPermanent(context.Canceled) = false")
	}
}

func testModTime(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	h := chunk("mtime")
	before := time.Now().Add(-time.Hour) // generous: a server's clock may differ
	put(t, b, h, data(10))
	info, err := b.Stat(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if info.ModTime.Before(before) || info.ModTime.After(time.Now().Add(time.Hour)) {
		t.Fatalf("ModTime %v of a fresh object is not about now", info.ModTime)
	}
	if !b.Properties().KeepsModTime {
		return
	}
	old := time.Now().Add(-72 * time.Hour).Truncate(time.Second)
	if err := b.Put(ctx, h, data(20), backend.PutOptions{ModTime: old}); err != nil {
		t.Fatal(err)
	}
	info, err = b.Stat(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if !info.ModTime.Equal(old) {
		t.Fatalf("KeepsModTime, but Put with ModTime %v gave %v", old, info.ModTime)
	}
}

func testSizes(t *testing.T, b backend.Backend) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 1 << 20, 5<<20 + 3} {
		h := chunk(fmt.Sprint("size", n))
		want := data(n)
		put(t, b, h, want)
		if got := get(t, b, h); !bytes.Equal(got, want) {
			t.Fatalf("object of %d bytes read back as %d other bytes", n, len(got))
		}
	}
}

func testConcurrent(t *testing.T, b backend.Backend) {
	// Puts of one handle with the same bytes, and Gets meanwhile, as cas does
	// when two writers store one chunk.
	h := chunk("concurrent")
	want := data(64 << 10)
	put(t, b, h, want)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 8 {
		wg.Go(func() {
			if err := b.Put(context.Background(), h, want, backend.PutOptions{}); err != nil {
				errs <- err
			}
		})
		wg.Go(func() {
			got, err := b.Get(context.Background(), h, nil)
			if err != nil {
				errs <- err
			} else if !bytes.Equal(got, want) {
				errs <- errors.New("a Get during Puts returned other bytes")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
