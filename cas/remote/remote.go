package remote

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
)

// Tier is a store's remote tier: rounds that publish the store's
// namespace and apply everyone else's, the bucket's collection. Its read
// side is the store's objects, a tiered.Backend with the same remote
// behind them.
type Tier struct {
	store *cas.Store
	tier  *tiered.Backend
	be    backend.Backend // tier.Remote()

	upMu sync.Mutex // one round (or collection) at a time; guards what follows
	// mine is the state the store's namespace last agreed with: what the
	// last round published or applied, with the stamps of each version.
	mine state
	// adopt: the next round takes the bucket's namespace whole (a store
	// that never wrote to it, or a former reader's).
	adopt bool
	// stale holds, per path a round could not apply (a file open here), the
	// local version it left: not a change of this store's own.
	stale map[string]localVersion
	// silent tracks other sessions' leases, to fence one silent too long.
	silent map[string]silence
	leases map[string]time.Duration // other sessions' lease lengths (read once)

	cacheMu sync.Mutex
	entries map[string]*logEntry // log entries read (immutable)
	snaps   map[string]state     // snapshots the last world read used

	mu      sync.Mutex
	up      UploadProgress // under mu; PendingBytes is the tier's
	sess    *Session       // under mu: the writer session (Join), nil for a reader
	storeID string         // under mu: for a rejoin
	opts    SessionOptions // under mu: for a rejoin
	applier Applier        // under mu
	// fenceNote is why a session was fenced, until a forced round (sync)
	// reports it (under mu).
	fenceNote error
}

// silence is what a writer last saw of another session's lease, and since
// when (its own monotonic clock).
type silence struct {
	mod   time.Time
	since time.Time
}

func (r *Tier) setSession(s, old *Session) {
	r.mu.Lock()
	if r.sess == old {
		r.sess = s
	}
	r.mu.Unlock()
}

// session returns the writer session, or an error naming its absence.
func (r *Tier) session() (*Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess == nil {
		return nil, errors.New("no writer session on the remote (remote.Join)")
	}
	return r.sess, nil
}

// New returns the remote tier of store, whose objects are t.
func New(store *cas.Store, t *tiered.Backend) *Tier {
	return &Tier{store: store, tier: t, be: t.Remote(), stale: map[string]localVersion{}, leases: map[string]time.Duration{}, silent: map[string]silence{},
		entries: map[string]*logEntry{}, snaps: map[string]state{}, applier: catalogApplier}
}

// SetApplier makes rounds apply what others published through a (the
// served namespace), instead of to the catalog alone.
func (r *Tier) SetApplier(a Applier) {
	r.mu.Lock()
	r.applier = a
	r.mu.Unlock()
}

// Location names the remote, for messages.
func (r *Tier) Location() string { return r.be.Location() }

// UploadProgress counts what upload rounds have done since the Tier was
// made, whoever started them (the daemon's uploader or ckptfs sync): the
// difference of two readings is what went up between them. A round's
// chunks are settled once each is in the bucket, put by the round or found
// there already (a dedup hit).
type UploadProgress struct {
	PendingBytes int64 // raw bytes of the current (or last, if it failed) round's chunks not settled yet
	SettledBytes int64 // raw bytes of chunks settled
	Chunks       int64 // chunks put into the bucket
	RawBytes     int64 // their raw bytes
	SentBytes    int64 // their object bytes (what went over the wire)
	Present      int64 // chunks found in the bucket already
}

// Progress returns the upload counters.
func (r *Tier) Progress() UploadProgress {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.up
	p.PendingBytes = r.tier.TierStats().PendingBytes
	return p
}

// uploadRecordBatch is how many uploaded chunks one catalog transaction records.
const uploadRecordBatch = 256

// uploadChunks puts every chunk of need into the remote, Connections at a
// time (at most 32), and records the ones that got there.
func (r *Tier) uploadChunks(ctx context.Context, need map[cas.ID]uint32) error {
	s := r.store
	ids := make(chan cas.ID)
	var mu sync.Mutex
	var done []cas.ID
	record := func(force bool) error {
		mu.Lock()
		if len(done) == 0 || (!force && len(done) < uploadRecordBatch) {
			mu.Unlock()
			return nil
		}
		batch := done
		done = nil
		mu.Unlock()
		return s.Update(func(tx *cas.Tx) error { return tx.Uploads().Add(batch) })
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(ids)
		for id := range need {
			select {
			case ids <- id:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	workers := min(max(1, r.be.Properties().Connections), 32)
	for range workers {
		g.Go(func() error {
			var buf []byte
			for id := range ids {
				h := chunkHandle(id)
				// A chunk in a pack is uploaded as an object of its own.
				obj, packed, err := s.PackedObject(gctx, id, buf)
				if !packed && err == nil {
					obj, err = r.tier.Local().Get(gctx, h, buf)
				}
				if errors.Is(err, backend.ErrNotExist) {
					// Never fetched here (a former reader's store): the
					// bucket has it if anyone does.
					if _, serr := r.be.Stat(gctx, h); serr == nil {
						err = nil
						obj = nil
					}
				}
				if err == nil && obj == nil {
					mu.Lock()
					done = append(done, id)
					mu.Unlock()
					continue
				}
				if err != nil {
					return fmt.Errorf("upload chunk %v: read the local object: %w", id, err)
				}
				buf = obj
				// The bucket holds standalone objects only: its collection
				// marks from snapshots and knows nothing of bases, and a
				// reader elsewhere would need two fetches.
				if obj, err = s.StandaloneObject(gctx, id, obj); err != nil {
					return fmt.Errorf("upload chunk %v: %w", id, err)
				}
				err = r.be.Put(gctx, h, obj, backend.PutOptions{IfAbsent: true})
				exists := errors.Is(err, backend.ErrExists) // a dedup hit
				if err != nil && !exists {
					return fmt.Errorf("upload chunk %v: %w", id, err)
				}
				r.mu.Lock()
				r.up.SettledBytes += int64(need[id])
				if exists {
					r.up.Present++
					r.tier.Settled(int64(need[id]), 0)
				} else {
					r.tier.Settled(int64(need[id]), int64(len(obj)))
					r.up.Chunks++
					r.up.RawBytes += int64(need[id])
					r.up.SentBytes += int64(len(obj))
				}
				r.mu.Unlock()
				mu.Lock()
				done = append(done, id)
				mu.Unlock()
				if err := record(false); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return errors.Join(err, record(true))
}

// VerifyObject fetches chunk id's object from the remote and verifies it,
// bypassing the local objects (fsck).
func (r *Tier) VerifyObject(ctx context.Context, id cas.ID) error {
	obj, err := r.be.Get(ctx, chunkHandle(id), nil)
	if errors.Is(err, backend.ErrNotExist) {
		return fmt.Errorf("chunk %v: %w in %s", id, cas.ErrMissing, r.be.Location())
	}
	if err != nil {
		return err
	}
	_, err = r.store.DecodeObject(ctx, id, obj)
	return err
}

// chunkHandle names chunk id's object (as cas names it).
func chunkHandle(id cas.ID) backend.Handle {
	return backend.Handle{Kind: backend.Chunk, Name: id.String()}
}

// isModified reports a conditional write refused: the tag changed.
func isModified(err error) bool { return errors.Is(err, s3.ErrModified) }

// localVersion is a path's version in the local namespace (ok: present).
type localVersion struct {
	e  nsEntry
	ok bool
}
