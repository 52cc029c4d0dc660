package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/tiered"
	"github.com/ckptfs/ckptfs/cas/catalog"
)

// Names of the remote's mutable objects.
const (
	headName   = "head"
	writerName = "writer"
)

// Tier is a store's remote tier, write side: upload rounds, the published
// snapshot, the bucket's collection. Its read side is the store's objects,
// a tiered.Backend with the same remote behind them.
type Tier struct {
	store *cas.Store
	tier  *tiered.Backend
	be    backend.Backend // tier.Remote()

	upMu sync.Mutex // one upload round (or collection) at a time

	mu sync.Mutex
	up UploadProgress // under mu; PendingBytes is the tier's
}

// New returns the remote tier of store, whose objects are t.
func New(store *cas.Store, t *tiered.Backend) *Tier {
	return &Tier{store: store, tier: t, be: t.Remote()}
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

// Snapshot is what the remote tier publishes: every committed regular file.
type Snapshot struct {
	Version int            `json:"version"`
	Gen     uint64         `json:"gen"`  // the writer's commit generation
	Time    time.Time      `json:"time"` // when it was made
	Files   []SnapshotFile `json:"files"`
}

// SnapshotFile is one committed file of a Snapshot.
type SnapshotFile struct {
	Path     string        `json:"path"` // slash-separated, relative to the mount's root
	Node     cas.Node      `json:"node"` // attributes (Ino is the writer's)
	Manifest *cas.Manifest `json:"-"`
	Raw      []byte        `json:"manifest"` // Manifest, marshalled
}

// head is locks/head: the newest snapshot.
type head struct {
	Gen      uint64    `json:"gen"`
	Snapshot string    `json:"snapshot"`
	Time     time.Time `json:"time"`
}

const snapshotVersion = 1

// UploadPending reports whether commits are waiting for an upload round.
func (r *Tier) UploadPending() (bool, error) {
	var pending bool
	err := r.store.View(func(tx *cas.Tx) error {
		gen, done := tx.Uploads().Gens()
		pending = gen > done
		return nil
	})
	return pending, err
}

// UploadRound uploads to the remote everything committed up to now: the
// chunks it lacks, then a snapshot of the namespace, then the head naming
// it; then it records the generation as uploaded. It returns nil at once
// when nothing is pending. Rounds are serialised. A failed round uploaded
// some chunks (remembered) and nothing else; the next round resumes.
func (r *Tier) UploadRound(ctx context.Context) error {
	s := r.store
	if s.ReadOnly() {
		return errors.New("store is open read-only")
	}
	r.upMu.Lock()
	defer r.upMu.Unlock()

	var gen, done uint64
	snap := Snapshot{Version: snapshotVersion, Time: time.Now().UTC()}
	need := map[cas.ID]uint32{}
	err := s.View(func(tx *cas.Tx) error {
		up := tx.Uploads()
		gen, done = up.Gens()
		if gen <= done {
			return nil
		}
		var walk func(dir uint64, prefix string) error
		walk = func(dir uint64, prefix string) error {
			return tx.Children(dir, func(name string, ino uint64) error {
				n, ok, err := tx.Node(ino)
				if err != nil || !ok {
					return err
				}
				p := path.Join(prefix, name)
				switch {
				case n.IsDir():
					return walk(ino, p)
				case n.IsRegular():
					m, ok, err := tx.Manifest(ino)
					if err != nil || !ok {
						return err
					}
					for _, c := range m.Chunks {
						if !up.Has(c.ID) {
							need[c.ID] = c.Len
						}
					}
					snap.Files = append(snap.Files, SnapshotFile{Path: p, Node: n, Raw: m.Marshal()})
				}
				return nil
			})
		}
		return walk(cas.RootIno, "")
	})
	if err != nil || gen <= done {
		return err
	}
	snap.Gen = gen
	var pending int64
	for _, n := range need {
		pending += int64(n)
	}
	r.tier.SetPending(pending)

	if err := r.uploadChunks(ctx, need); err != nil {
		return err
	}
	body, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	name := cas.Sum(body).String()
	err = r.be.Put(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, body, backend.PutOptions{IfAbsent: true})
	if err != nil && !errors.Is(err, backend.ErrExists) {
		return fmt.Errorf("upload snapshot: %w", err)
	}
	hb, err := json.Marshal(head{Gen: gen, Snapshot: name, Time: snap.Time})
	if err != nil {
		return err
	}
	if err := r.be.Put(ctx, backend.Handle{Kind: backend.Lock, Name: headName}, hb, backend.PutOptions{}); err != nil {
		return fmt.Errorf("publish snapshot: %w", err)
	}
	return s.Update(func(tx *cas.Tx) error { return tx.Uploads().SetUploaded(gen) })
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
				obj, err := r.tier.Local().Get(gctx, h, buf)
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

// Snapshot returns the newest snapshot published in the remote, or nil
// when none is, and the name of the head it came from (to tell a new one).
func (r *Tier) Snapshot(ctx context.Context, known string) (snap *Snapshot, name string, err error) {
	return ReadSnapshot(ctx, r.be, known)
}

// ReadSnapshot is Snapshot from remote be.
func ReadSnapshot(ctx context.Context, be backend.Backend, known string) (snap *Snapshot, name string, err error) {
	hb, err := be.Get(ctx, backend.Handle{Kind: backend.Lock, Name: headName}, nil)
	if errors.Is(err, backend.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the head of %s: %w", be.Location(), err)
	}
	var hd head
	if err := json.Unmarshal(hb, &hd); err != nil {
		return nil, "", fmt.Errorf("the head of %s is damaged: %w", be.Location(), err)
	}
	if hd.Snapshot == known {
		return nil, known, nil
	}
	body, err := be.Get(ctx, backend.Handle{Kind: backend.Manifest, Name: hd.Snapshot}, nil)
	if err != nil {
		return nil, "", fmt.Errorf("read snapshot %s: %w", hd.Snapshot, err)
	}
	if cas.Sum(body).String() != hd.Snapshot {
		return nil, "", fmt.Errorf("snapshot %s in %s: %w: its hash differs from its name", hd.Snapshot, be.Location(), cas.ErrCorrupt)
	}
	snap = &Snapshot{}
	if err := json.Unmarshal(body, snap); err != nil {
		return nil, "", fmt.Errorf("snapshot %s: %w", hd.Snapshot, err)
	}
	if snap.Version != snapshotVersion {
		return nil, "", fmt.Errorf("snapshot %s has version %d, this ckptfs reads %d: %w", hd.Snapshot, snap.Version, snapshotVersion, cas.ErrNewerFormat)
	}
	for i := range snap.Files {
		f := &snap.Files[i]
		if f.Manifest, err = catalog.ParseManifest(f.Raw); err != nil {
			return nil, "", fmt.Errorf("snapshot %s, %s: %w", hd.Snapshot, f.Path, err)
		}
		f.Raw = nil
	}
	return snap, hd.Snapshot, nil
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
