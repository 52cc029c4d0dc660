package cas

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/mem"
)

// gatedBackend holds every Get until gate is closed: a slow remote.
type gatedBackend struct {
	*mem.Backend
	gate chan struct{}
}

func (g *gatedBackend) Get(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	<-g.gate // a backend that ignores ctx: the cache must not wait on it for a cancelled reader
	return g.Backend.Get(ctx, h, buf)
}

// TestLoadHonoursContext: a reader of a slow object gives up when its context
// is done, and another reader of the same chunk still gets it once it loads.
func TestLoadHonoursContext(t *testing.T) {
	g := &gatedBackend{Backend: mem.New(backend.Properties{}), gate: make(chan struct{})}
	close(g.gate)
	s := testStore(t, Options{Objects: g, CacheSize: 1})
	data := pseudoRandom(1<<16, 5)
	ref := put(t, s, data)
	g.gate = make(chan struct{}) // CacheSize 1 kept nothing: the next read loads

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	other := make(chan error, 1)
	go func() {
		got, err := s.ReadChunk(context.Background(), ref)
		if err == nil && !bytes.Equal(got, data) {
			err = errors.New("other bytes")
		}
		other <- err
	}()
	start := time.Now()
	if _, err := s.ReadChunk(ctx, ref); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with a context that expired during a slow load: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the cancelled read returned after %v", d)
	}
	select {
	case err := <-other:
		t.Fatalf("the other reader returned before the load finished: %v", err)
	default:
	}
	close(g.gate)
	if err := <-other; err != nil {
		t.Fatalf("the other reader of the same chunk: %v", err)
	}
}

// TestCommitReleasesOnFailure: a commit whose transaction fails still unpins
// its chunks (a collection may free them) and indexes nothing; a commit whose
// Sync fails never runs the transaction.
func TestCommitReleasesOnFailure(t *testing.T) {
	m := mem.New(backend.Properties{})
	s := testStore(t, Options{Objects: m})
	ctx := context.Background()
	b := s.NewBatch()
	ref, err := b.Put(ctx, pseudoRandom(1000, 1))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.Commit(ctx, b, func(*Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Commit: %v, want boom", err)
	}
	// Nothing named the chunk: the failed commit's release deleted its
	// object at once (Batch.Release), and a sweep finds nothing pinned.
	if _, err := m.Stat(ctx, chunkHandle(ref.ID)); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("the object of a failed commit: %v, want it deleted", err)
	}
	end := s.BeginCollect()
	res, err := s.Sweep(ctx, []ID{ref.ID})
	end()
	if err != nil || res.Skipped != 0 {
		t.Fatalf("sweep after a failed commit: %+v %v; the chunk should be free", res, err)
	}

	b = s.NewBatch()
	ref, err = b.Put(ctx, pseudoRandom(1000, 2))
	if err != nil {
		t.Fatal(err)
	}
	m.FailSync(chunkHandle(ref.ID), boom)
	ran := false
	if err := s.Commit(ctx, b, func(*Tx) error { ran = true; return nil }); !errors.Is(err, boom) {
		t.Fatalf("Commit with a failing sync: %v", err)
	}
	if ran {
		t.Fatal("the transaction ran after the sync failed")
	}
	if err := s.View(func(tx *Tx) error {
		if _, ok, _ := tx.Chunk(ref.ID); ok {
			return errors.New("indexed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Misuse: a second transaction for one batch is refused.
	b = s.NewBatch()
	err = s.CommitWith(ctx, b, func(update func(func(*Tx) error) error) error {
		if err := update(func(*Tx) error { return nil }); err != nil {
			return err
		}
		return update(func(*Tx) error { return nil })
	})
	if err == nil {
		t.Fatal("a batch committed in two transactions")
	}
}

// TestStoreOnMemBackend: a store works whole on another backend: write,
// crash of unsynced objects, read back.
func TestStoreOnMemBackend(t *testing.T) {
	m := mem.New(backend.Properties{})
	dir := filepath.Join(t.TempDir(), "store")
	s := testStore(t, Options{Objects: m}, dir)
	data := bytes.Repeat([]byte("checkpoint "), 10000)
	ref := put(t, s, data)
	b := s.NewBatch()
	lost, err := b.Put(context.Background(), pseudoRandom(5000, 9)) // never committed
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	m.Crash()
	got, err := s.ReadChunk(context.Background(), ref)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("committed chunk after a crash: %v", err)
	}
	if _, err := s.VerifyObject(context.Background(), lost.ID); !errors.Is(err, ErrMissing) {
		t.Fatalf("an object no Sync covered survived the crash: %v", err)
	}
}
