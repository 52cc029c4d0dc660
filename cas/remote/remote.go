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
	// lockUnsure: a collection's put or delete of locks/gc got no answer,
	// so the lock may be there, naming this session (releaseLostLock).
	lockUnsure bool
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
	entries map[string]*logEntry  // log entries read (immutable)
	snaps   map[string]state      // snapshots the last world read used
	trashes map[string]*trashList // trash lists read (immutable), those the last listing showed

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
		entries: map[string]*logEntry{}, snaps: map[string]state{}, trashes: map[string]*trashList{}, applier: catalogApplier}
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
// time (at most 32), and records the ones that got there. A delta goes up
// as it is, after its base (doc.go, "Deltas in the bucket").
func (r *Tier) uploadChunks(ctx context.Context, need map[cas.ID]uint32, trashed map[cas.ID]string) error {
	u := &uploader{r: r, need: need, trashed: trashed, there: map[cas.ID]bool{}}
	// A round comes right after a commit, before the background re-encoder
	// has written the commit's planned deltas: write them first, or they
	// go up standalone for good.
	all := make([]cas.ID, 0, len(need))
	for id := range need {
		all = append(all, id)
	}
	if err := r.store.ReencodeQueued(ctx, all, reencodeGroup); err != nil {
		if ctx.Err() != nil {
			return err
		}
		// Not the round's failure: each object goes up as it is, and the
		// background re-encoder retries the row and reports.
		r.logf("re-encode chunks before their upload: %v", err)
	}
	ids := make(chan cas.ID)
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
				var err error
				if buf, err = u.upload(gctx, id, buf); err != nil {
					return err
				}
				if err := u.record(false); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return errors.Join(err, u.record(true))
}

// reencodeGroup is how many chunks uploadChunks re-encodes at once.
const reencodeGroup = 64

// logf logs through the writer session's logger, if any.
func (r *Tier) logf(format string, args ...any) {
	r.mu.Lock()
	sess := r.sess
	r.mu.Unlock()
	if sess != nil && sess.opts.Logf != nil {
		sess.opts.Logf(format, args...)
	}
}

// uploader is one round's uploadChunks, shared by its workers.
type uploader struct {
	r    *Tier
	need map[cas.ID]uint32 // chunk → raw length
	// trashed: the chunks of the trash lists the round read; never a
	// delta's base (doc.go, step 8)
	trashed map[cas.ID]string

	mu    sync.Mutex
	done  []cas.ID        // in the bucket, not recorded yet
	there map[cas.ID]bool // in the bucket: settled this round
}

// record writes the chunks done to the catalog as uploaded, in batches
// (all of them when force).
func (u *uploader) record(force bool) error {
	u.mu.Lock()
	if len(u.done) == 0 || (!force && len(u.done) < uploadRecordBatch) {
		u.mu.Unlock()
		return nil
	}
	batch := u.done
	u.done = nil
	u.mu.Unlock()
	return u.r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().Add(batch) })
}

// settle notes chunk id in the bucket.
func (u *uploader) settle(id cas.ID) {
	u.mu.Lock()
	u.there[id] = true
	u.done = append(u.done, id)
	u.mu.Unlock()
}

// inBucket reports whether chunk id is known to be in the bucket: settled
// this round or recorded as uploaded (records agree with the bucket: doc.go
// step 2, and a collection forgets a record before it deletes the object).
func (u *uploader) inBucket(id cas.ID) bool {
	u.mu.Lock()
	ok := u.there[id]
	u.mu.Unlock()
	if ok {
		return true
	}
	_ = u.r.store.View(func(tx *cas.Tx) error { ok = tx.Uploads().Has(id); return nil })
	return ok
}

// localObject reads chunk id's object here (from its pack, or as an object
// of its own); nil and no error when it is not here but the bucket has it
// (a former reader's store never fetched it).
func (u *uploader) localObject(ctx context.Context, id cas.ID, buf []byte) ([]byte, error) {
	r := u.r
	obj, packed, err := r.store.PackedObject(ctx, id, buf)
	if !packed && err == nil {
		obj, err = r.tier.Local().Get(ctx, chunkHandle(id), buf)
	}
	if errors.Is(err, backend.ErrNotExist) {
		if _, serr := r.be.Stat(ctx, chunkHandle(id)); serr == nil {
			return nil, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the local object: %w", err)
	}
	return obj, nil
}

// upload puts chunk id into the bucket, its base first when its object is
// a delta, and settles it; buf is scratch, returned for the next call.
func (u *uploader) upload(ctx context.Context, id cas.ID, buf []byte) ([]byte, error) {
	r := u.r
	u.mu.Lock()
	ahead := u.there[id] // put this round as a delta's base
	u.mu.Unlock()
	if ahead {
		r.settled(int64(u.need[id]), 0)
		return buf, nil
	}
	obj, err := u.localObject(ctx, id, buf)
	if err != nil {
		return buf, fmt.Errorf("upload chunk %v: %w", id, err)
	}
	if obj == nil {
		u.settle(id)
		return buf, nil
	}
	buf = obj
	if base, delta := cas.DeltaBase(obj); delta {
		if ok, err := u.uploadBase(ctx, base); err != nil {
			return buf, fmt.Errorf("upload chunk %v: its base %v: %w", id, base, err)
		} else if !ok {
			// The base is a delta itself (never written so, but the
			// bucket's deltas stay depth 1 whatever the store holds).
			if obj, err = r.store.StandaloneObject(ctx, id, obj); err != nil {
				return buf, fmt.Errorf("upload chunk %v: %w", id, err)
			}
		}
	}
	if err := u.put(ctx, id, obj, int64(u.need[id]), true); err != nil {
		return buf, fmt.Errorf("upload chunk %v: %w", id, err)
	}
	return buf, nil
}

// uploadBase makes sure chunk base, a delta's base, is in the bucket before
// the delta: false when its object here is a delta itself, or it is in the
// trash (not uploaded).
func (u *uploader) uploadBase(ctx context.Context, base cas.ID) (bool, error) {
	if _, ok := u.trashed[base]; ok {
		return false, nil // a purge may delete it: the delta goes up standalone
	}
	if u.inBucket(base) {
		return true, nil
	}
	obj, err := u.localObject(ctx, base, nil)
	if err != nil {
		return false, err
	}
	if obj == nil {
		u.settle(base)
		return true, nil
	}
	if _, delta := cas.DeltaBase(obj); delta {
		return false, nil
	}
	// Its pending bytes, if a file of the round names it, settle in its
	// own turn.
	if err := u.put(ctx, base, obj, int64(u.need[base]), false); err != nil {
		return false, err
	}
	return true, nil
}

// put puts obj as chunk id's object (put-if-absent: a dedup hit is no
// error) of raw bytes, counts it, settles its pending bytes when pending,
// and settles it.
func (u *uploader) put(ctx context.Context, id cas.ID, obj []byte, raw int64, pending bool) error {
	r := u.r
	err := r.be.Put(ctx, chunkHandle(id), obj, backend.PutOptions{IfAbsent: true})
	exists := errors.Is(err, backend.ErrExists) // a dedup hit
	if err != nil && !exists {
		return err
	}
	r.mu.Lock()
	if exists {
		r.up.Present++
	} else {
		r.up.Chunks++
		r.up.RawBytes += raw
		r.up.SentBytes += int64(len(obj))
	}
	r.mu.Unlock()
	sent := int64(len(obj))
	if exists {
		sent = 0
	}
	if !pending {
		raw = 0
	}
	r.settled(raw, sent)
	u.settle(id)
	return nil
}

// settled counts raw pending bytes settled and sent object bytes uploaded.
func (r *Tier) settled(raw, sent int64) {
	r.mu.Lock()
	r.up.SettledBytes += raw
	r.mu.Unlock()
	r.tier.Settled(raw, sent)
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
	if _, err = r.store.DecodeObject(ctx, id, obj); err != nil {
		return err
	}
	// A delta decodes against whichever copy of its base is nearest; the
	// bucket alone must hold it too.
	if base, delta := cas.DeltaBase(obj); delta {
		if _, err := r.be.Stat(ctx, chunkHandle(base)); err != nil {
			return fmt.Errorf("chunk %v: a delta whose base %v is not readable in %s: %w", id, base, r.be.Location(), err)
		}
	}
	return nil
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
