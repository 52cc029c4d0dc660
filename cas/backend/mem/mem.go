// Package mem is a backend.Backend in memory, for tests: objects in a map,
// durability modelled so the callers' Put-then-Sync protocol can be tested
// without a disk. Crash drops every object Put but not synced since, the way
// pebble's crashable in-memory filesystem drops unsynced writes; FailSync makes
// the next Sync of a handle fail, stickily, as a failed writeback does on a
// disk.
package mem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Backend is an in-memory backend.Backend. The zero value is not usable; call New.
type Backend struct {
	props backend.Properties

	mu       sync.Mutex
	objs     map[backend.Handle]*object
	durable  map[backend.Handle]*object // what survives a Crash
	failNext map[backend.Handle]error   // Sync of the handle fails with it, once recorded
	sticky   map[backend.Handle]error   // failed syncs, until the next Put
	puts     int64
	gets     int64
	getBytes int64
}

type object struct {
	data    []byte
	modTime time.Time
}

var _ backend.Backend = (*Backend)(nil)

// New returns an empty backend. props.Connections defaults to 16; the rest
// is reported as given (DurableOnPut makes every Put survive Crash).
func New(props backend.Properties) *Backend {
	if props.Connections <= 0 {
		props.Connections = 16
	}
	return &Backend{props: props, objs: map[backend.Handle]*object{}, durable: map[backend.Handle]*object{},
		failNext: map[backend.Handle]error{}, sticky: map[backend.Handle]error{}}
}

// Location implements backend.Backend.
func (b *Backend) Location() string { return fmt.Sprintf("mem:%p", b) }

// Properties implements backend.Backend.
func (b *Backend) Properties() backend.Properties { return b.props }

// Put implements backend.Backend.
func (b *Backend) Put(ctx context.Context, h backend.Handle, obj []byte, opts backend.PutOptions) error {
	if err := check(ctx, h); err != nil {
		return err
	}
	o := &object{data: append([]byte(nil), obj...), modTime: time.Now()}
	if !opts.ModTime.IsZero() && b.props.KeepsModTime {
		o.modTime = opts.ModTime
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.objs[h]; ok && opts.IfAbsent {
		return fmt.Errorf("put %v: %w", h, backend.ErrExists)
	}
	b.objs[h] = o
	delete(b.sticky, h)
	if b.props.DurableOnPut {
		b.durable[h] = o
	}
	b.puts++
	return nil
}

// Sync implements backend.Backend.
func (b *Backend) Sync(ctx context.Context, hs []backend.Handle) error {
	for _, h := range hs {
		if err := check(ctx, h); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, h := range hs {
		if err, ok := b.failNext[h]; ok {
			delete(b.failNext, h)
			b.sticky[h] = err
		}
		if err, ok := b.sticky[h]; ok {
			errs = append(errs, fmt.Errorf("sync %v: %w", h, err))
			continue
		}
		o, ok := b.objs[h]
		if !ok {
			errs = append(errs, fmt.Errorf("sync %v: %w", h, backend.ErrNotExist))
			continue
		}
		b.durable[h] = o
	}
	return errors.Join(errs...)
}

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, h backend.Handle, buf []byte) ([]byte, error) {
	if err := check(ctx, h); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, err := b.lookupLocked(h)
	if err != nil {
		return nil, fmt.Errorf("get %v: %w", h, err)
	}
	b.gets++
	b.getBytes += int64(len(o.data))
	return append(buf[:0], o.data...), nil
}

// GetRange implements backend.RangeGetter.
func (b *Backend) GetRange(ctx context.Context, h backend.Handle, off, n int64, buf []byte) ([]byte, error) {
	if err := check(ctx, h); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, err := b.lookupLocked(h)
	if err != nil {
		return nil, fmt.Errorf("get %v: %w", h, err)
	}
	if off < 0 || n < 0 || off+n > int64(len(o.data)) {
		return nil, fmt.Errorf("get %v [%d, +%d): %w", h, off, n, io.ErrUnexpectedEOF)
	}
	b.gets++
	b.getBytes += n
	return append(buf[:0], o.data[off:off+n]...), nil
}

func (b *Backend) lookupLocked(h backend.Handle) (*object, error) {
	if _, failed := b.sticky[h]; failed {
		return nil, backend.ErrNotExist
	}
	o, ok := b.objs[h]
	if !ok {
		return nil, backend.ErrNotExist
	}
	return o, nil
}

// Stat implements backend.Backend.
func (b *Backend) Stat(ctx context.Context, h backend.Handle) (backend.Info, error) {
	if err := check(ctx, h); err != nil {
		return backend.Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, err := b.lookupLocked(h)
	if err != nil {
		return backend.Info{}, fmt.Errorf("stat %v: %w", h, err)
	}
	return backend.Info{Handle: h, Size: int64(len(o.data)), ModTime: o.modTime}, nil
}

// Delete implements backend.Backend. A deletion is durable at once.
func (b *Backend) Delete(ctx context.Context, h backend.Handle) error {
	if err := check(ctx, h); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.objs, h)
	delete(b.durable, h)
	delete(b.sticky, h)
	return nil
}

// List implements backend.Backend. It lists a snapshot taken at the call.
func (b *Backend) List(ctx context.Context, k backend.Kind, fn func(backend.Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	var infos []backend.Info
	for h, o := range b.objs {
		if h.Kind == k {
			infos = append(infos, backend.Info{Handle: h, Size: int64(len(o.data)), ModTime: o.modTime})
		}
	}
	b.mu.Unlock()
	for _, in := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(in); err != nil {
			return err
		}
	}
	return nil
}

// IsPermanent implements backend.Backend: everything but an injected fault is.
func (b *Backend) IsPermanent(err error) bool {
	return errors.Is(err, backend.ErrNotExist) || errors.Is(err, backend.ErrExists) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Close implements backend.Backend.
func (b *Backend) Close() error { return nil }

// Crash forgets every object Put since its last Sync (and brings back nothing
// deleted: deletions are durable at once), as a power loss would.
func (b *Backend) Crash() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.objs = maps.Clone(b.durable)
	b.sticky = map[backend.Handle]error{}
	b.failNext = map[backend.Handle]error{}
}

// FailSync makes the next Sync naming h fail with err; the failure is sticky
// (see backend) until h is Put again.
func (b *Backend) FailSync(h backend.Handle, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failNext[h] = err
}

// Counts reports how many Puts and Gets succeeded and the bytes Get returned.
func (b *Backend) Counts() (puts, gets, getBytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.puts, b.gets, b.getBytes
}

func check(ctx context.Context, h backend.Handle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return backend.CheckHandle(h)
}
