package tiered

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// DefaultCacheSize bounds the bytes of fetched objects a tier keeps locally
// when Options.CacheSize is not set.
const DefaultCacheSize = 10 << 30

// Options configure New.
type Options struct {
	// CacheSize bounds the bytes of objects fetched from the remote that
	// are kept in the local backend (default DefaultCacheSize); the least
	// recently fetched go first.
	CacheSize int64
}

// Backend is a backend.Tier: a local backend in front of a remote one.
// Everything but Get (and Refetch) works on the local backend alone.
type Backend struct {
	local, remote backend.Backend

	mu      sync.Mutex
	fetched *list.List // of fetchedObj, front = most recent
	byName  map[backend.Handle]*list.Element
	used    int64
	budget  int64
	evict   func(ctx context.Context, hs []backend.Handle) // nil: delete from local
	stats   backend.TierStats
}

type fetchedObj struct {
	h    backend.Handle
	size int64
}

var _ backend.Tier = (*Backend)(nil)

// New returns a tier with local in front of remote. Close closes both.
func New(local, remote backend.Backend, opts Options) *Backend {
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	return &Backend{local: local, remote: remote, fetched: list.New(),
		byName: map[backend.Handle]*list.Element{}, budget: opts.CacheSize}
}

// Local is the backend in front.
func (b *Backend) Local() backend.Backend { return b.local }

// Remote is the backend behind.
func (b *Backend) Remote() backend.Backend { return b.remote }

// Location names the local backend: where the objects a caller writes go.
func (b *Backend) Location() string { return b.local.Location() }

// Properties are the local backend's.
func (b *Backend) Properties() backend.Properties { return b.local.Properties() }

// Put writes to the local backend.
func (b *Backend) Put(ctx context.Context, h backend.Handle, obj []byte, opts backend.PutOptions) error {
	return b.local.Put(ctx, h, obj, opts)
}

// Sync syncs the local backend.
func (b *Backend) Sync(ctx context.Context, hs []backend.Handle) error { return b.local.Sync(ctx, hs) }

// Stat asks the local backend only: an object is here or it is not (a
// writer deciding whether to write a chunk must not count the remote's).
func (b *Backend) Stat(ctx context.Context, h backend.Handle) (backend.Info, error) {
	return b.local.Stat(ctx, h)
}

// List lists the local backend.
func (b *Backend) List(ctx context.Context, k backend.Kind, fn func(backend.Info) error) error {
	return b.local.List(ctx, k, fn)
}

// IsPermanent asks both backends.
func (b *Backend) IsPermanent(err error) bool {
	return b.local.IsPermanent(err) || b.remote.IsPermanent(err)
}

// Delete deletes the local copy; the remote is never written through the tier.
func (b *Backend) Delete(ctx context.Context, h backend.Handle) error {
	b.mu.Lock()
	b.unnoteLocked(h)
	b.mu.Unlock()
	return b.local.Delete(ctx, h)
}

// Drop is Delete: the local copy of h goes, the remote's stays.
func (b *Backend) Drop(ctx context.Context, h backend.Handle) error { return b.Delete(ctx, h) }

// Close closes both backends.
func (b *Backend) Close() error { return errors.Join(b.local.Close(), b.remote.Close()) }

// Forget passes to the local backend when it holds resources until a Sync.
func (b *Backend) Forget(hs []backend.Handle) {
	if f, ok := b.local.(interface{ Forget([]backend.Handle) }); ok {
		f.Forget(hs)
	}
}

// RemoveStale passes to the local backend when it is a backend.Janitor.
func (b *Backend) RemoveStale(ctx context.Context, before time.Time) (int, error) {
	if j, ok := b.local.(backend.Janitor); ok {
		return j.RemoveStale(ctx, before)
	}
	return 0, nil
}

// OnEvict sets what deletes evicted copies (see backend.Tier).
func (b *Backend) OnEvict(fn func(ctx context.Context, hs []backend.Handle)) {
	b.mu.Lock()
	b.evict = fn
	b.mu.Unlock()
}

// TierStats returns the counters.
func (b *Backend) TierStats() backend.TierStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// SetPending records the raw bytes an upload round found not in the remote.
func (b *Backend) SetPending(n int64) {
	b.mu.Lock()
	b.stats.PendingBytes = n
	b.mu.Unlock()
}

// Settled records one chunk of an upload round in the remote: raw bytes
// fewer pending, and sent object bytes uploaded (0 for a dedup hit).
func (b *Backend) Settled(raw, sent int64) {
	b.mu.Lock()
	b.stats.PendingBytes -= raw
	b.stats.UploadedBytes += sent
	b.mu.Unlock()
}

// Get reads h from the local backend and, when it is not there, from the
// remote, keeping a copy locally (not synced: a copy lost or torn by a
// crash fails its reader's checks like any object and is fetched again).
// A copy that cannot be kept costs a refetch later, not the read.
func (b *Backend) Get(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	obj, err := b.local.Get(ctx, h, buf)
	if !errors.Is(err, backend.ErrNotExist) || h.Kind == backend.Pack {
		return obj, err // packs are local only
	}
	return b.fetch(ctx, h, buf)
}

// GetRange reads part of a pack (backend.RangeGetter), which is local only:
// the remote holds the chunks of packs as chunk objects.
func (b *Backend) GetRange(ctx context.Context, h backend.Handle, off, n int64, buf []byte) ([]byte, error) {
	rg, ok := b.local.(backend.RangeGetter)
	if !ok {
		return nil, fmt.Errorf("get %v: the local backend reads no ranges", h)
	}
	return rg.GetRange(ctx, h, off, n, buf)
}

// Refetch replaces the local copy of h with one fetched from the remote.
func (b *Backend) Refetch(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	if err := b.Delete(ctx, h); err != nil && !errors.Is(err, backend.ErrNotExist) {
		return nil, fmt.Errorf("drop the damaged copy of %v: %w", h, err)
	}
	return b.fetch(ctx, h, buf)
}

func (b *Backend) fetch(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	obj, err := b.remote.Get(ctx, h, buf)
	if errors.Is(err, backend.ErrNotExist) {
		return nil, fmt.Errorf("%v: %w (neither here nor in %s)", h, backend.ErrNotExist, b.remote.Location())
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %v from %s: %w", h, b.remote.Location(), err)
	}
	b.mu.Lock()
	b.stats.ReadBytes += int64(len(obj))
	b.mu.Unlock()
	if err := b.local.Put(ctx, h, obj, backend.PutOptions{}); err != nil {
		return obj, nil
	}
	b.Forget([]backend.Handle{h}) // never synced: hand back what the backend holds for a Sync
	b.note(ctx, h, int64(len(obj)))
	return obj, nil
}

// note records a fetched copy and evicts the least recently fetched ones
// beyond the budget (the newest always stays).
func (b *Backend) note(ctx context.Context, h backend.Handle, size int64) {
	b.mu.Lock()
	if el, ok := b.byName[h]; ok {
		b.used += size - el.Value.(fetchedObj).size
		el.Value = fetchedObj{h, size}
		b.fetched.MoveToFront(el)
		b.mu.Unlock()
		return
	}
	b.byName[h] = b.fetched.PushFront(fetchedObj{h, size})
	b.used += size
	evict, fn := b.overBudgetLocked(), b.evict
	b.mu.Unlock()
	b.discard(ctx, fn, evict)
}

// Adopt counts in the budget the copies that earlier processes fetched,
// which are in the local backend but in no process's count: the caller
// finds them (cas's are the chunk objects its catalog does not index) and
// calls Adopt once, at start or while the tier serves (cmd/ckptfs walks
// the store in the background). They rank as less recently fetched than
// any copy this process fetched, the least recently modified last, and those beyond the budget are evicted at once (through
// OnEvict's function, as any eviction). A handle already counted keeps its
// place. So the budget bounds the fetched copies kept across restarts, not
// only those of one process.
func (b *Backend) Adopt(ctx context.Context, infos []backend.Info) {
	sorted := slices.Clone(infos)
	slices.SortStableFunc(sorted, func(x, y backend.Info) int { return y.ModTime.Compare(x.ModTime) })
	b.mu.Lock()
	for _, in := range sorted {
		if _, ok := b.byName[in.Handle]; ok {
			continue
		}
		b.byName[in.Handle] = b.fetched.PushBack(fetchedObj{in.Handle, in.Size})
		b.used += in.Size
	}
	evict, fn := b.overBudgetLocked(), b.evict
	b.mu.Unlock()
	b.discard(ctx, fn, evict)
}

// overBudgetLocked unnotes the least recently fetched copies beyond the
// budget (the newest always stays) and returns them, for discard.
func (b *Backend) overBudgetLocked() []backend.Handle {
	var evict []backend.Handle
	for b.used > b.budget && b.fetched.Len() > 1 {
		o := b.fetched.Back().Value.(fetchedObj)
		b.unnoteLocked(o.h)
		evict = append(evict, o.h)
	}
	return evict
}

// discard deletes evicted copies through fn (OnEvict's), or else locally.
func (b *Backend) discard(ctx context.Context, fn func(context.Context, []backend.Handle), evict []backend.Handle) {
	if len(evict) == 0 {
		return
	}
	if fn != nil {
		fn(ctx, evict)
		return
	}
	for _, h := range evict {
		_ = b.local.Delete(ctx, h) // best effort: a copy left over is only space
	}
}

func (b *Backend) unnoteLocked(h backend.Handle) {
	if el, ok := b.byName[h]; ok {
		b.used -= el.Value.(fetchedObj).size
		b.fetched.Remove(el)
		delete(b.byName, h)
	}
}
