package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall"
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

	mu   sync.Mutex
	up   UploadProgress // under mu; PendingBytes is the tier's
	sess *Session       // under mu: the writer session (Join), nil for a reader
}

func (r *Tier) setSession(s *Session) {
	r.mu.Lock()
	r.sess = s
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

// Snapshot is what the remote tier publishes: the committed namespace
// (directories, regular files, symlinks; the first format had regular
// files only).
type Snapshot struct {
	Version int            `json:"version"`
	Gen     uint64         `json:"gen"`  // the writer's commit generation
	Time    time.Time      `json:"time"` // when it was made
	Files   []SnapshotFile `json:"files"`
}

// SnapshotFile is one entry of a Snapshot.
type SnapshotFile struct {
	Path     string        `json:"path"` // slash-separated, relative to the mount's root
	Node     cas.Node      `json:"node"` // attributes (no Ino, Atime, Ctime)
	Manifest *cas.Manifest `json:"-"`
	Raw      []byte        `json:"manifest,omitempty"` // regular files: Manifest, marshalled
}

// head is locks/head: a hint to the log's tail, the entry Seq (0 in the
// first format, which had no log) and what it names.
type head struct {
	Seq      uint64    `json:"seq,omitempty"`
	Gen      uint64    `json:"gen"`
	Snapshot string    `json:"snapshot"`
	Time     time.Time `json:"time"`
}

const snapshotVersion = 2

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

// UploadRound publishes everything committed up to now: the chunks the
// bucket lacks, a snapshot of the namespace, and a log entry naming it
// (create-only, after the session's last: the fence); then it records the
// generation as uploaded and the snapshot as the namespace's base. Without
// force it returns nil at once when no commit is pending; with force (sync)
// it also publishes namespace changes that are not commits (rename,
// unlink, chmod, …), and in any case checks that nobody appended to the
// log after this session, so that nil means a fresh reader sees this
// namespace. Rounds are serialised. A failed round uploaded some chunks
// (remembered) and published nothing; the next round resumes.
func (r *Tier) UploadRound(ctx context.Context, force bool) error {
	s := r.store
	if s.ReadOnly() {
		return errors.New("store is open read-only")
	}
	sess, err := r.session()
	if err != nil {
		return err
	}
	if err := sess.usable(ctx); err != nil {
		return err
	}
	r.upMu.Lock()
	defer r.upMu.Unlock()

	var gen, done uint64
	snap := Snapshot{Version: snapshotVersion, Time: time.Now().UTC()}
	need := map[cas.ID]uint32{}
	digest := sha256.New() // of the namespace, to tell a forced round with nothing new
	err = s.View(func(tx *cas.Tx) error {
		up := tx.Uploads()
		gen, done = up.Gens()
		if gen <= done && !force {
			return nil
		}
		return walkNamespace(tx, func(p string, e nsEntry) error {
			fmt.Fprintf(digest, "%q %d %d %d %d %d %q %d\n", p, e.Node.Mode, e.Node.UID, e.Node.GID, e.Node.Size, e.Node.Mtime, e.Node.Target, len(e.Raw))
			digest.Write(e.Raw)
			if e.m != nil {
				for _, c := range e.m.Chunks {
					if !up.Has(c.ID) {
						need[c.ID] = c.Len
					}
				}
			}
			snap.Files = append(snap.Files, SnapshotFile{Path: p, Node: e.Node, Raw: e.Raw})
			return nil
		})
	})
	if err != nil || (gen <= done && !force) {
		return err
	}
	snap.Gen = gen
	sum := hex.EncodeToString(digest.Sum(nil))
	sess.mu.Lock()
	unchanged := sess.published == sum
	sess.mu.Unlock()
	if unchanged {
		if err := sess.confirm(ctx); err != nil {
			return err
		}
		return s.Update(func(tx *cas.Tx) error { return tx.Uploads().SetUploaded(gen) })
	}
	var pending int64
	for _, n := range need {
		pending += int64(n)
	}
	r.tier.SetPending(pending)
	if err := r.uploadChunks(ctx, need); err != nil {
		return err
	}
	return r.publish(ctx, sess, &snap, sum)
}

// publish puts snap and appends the log entry naming it.
func (r *Tier) publish(ctx context.Context, sess *Session, snap *Snapshot, digest string) error {
	body, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	name := cas.Sum(body).String()
	err = r.be.Put(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, body, backend.PutOptions{IfAbsent: true})
	if err != nil && !errors.Is(err, backend.ErrExists) {
		return fmt.Errorf("upload snapshot: %w", err)
	}
	if err := sess.appendEntry(ctx, logEntry{Kind: "commit", Snapshot: name, Gen: snap.Gen}); err != nil {
		return fmt.Errorf("publish snapshot: %w", err)
	}
	sess.mu.Lock()
	sess.published = digest
	sess.mu.Unlock()
	return r.store.Update(func(tx *cas.Tx) error {
		if err := tx.Uploads().SetUploaded(snap.Gen); err != nil {
			return err
		}
		return tx.Uploads().SetBase(name, false)
	})
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

// Snapshot returns the newest snapshot published in the remote, or nil
// when none is, and the name of the head it came from (to tell a new one).
func (r *Tier) Snapshot(ctx context.Context, known string) (snap *Snapshot, name string, err error) {
	return ReadSnapshot(ctx, r.be, known)
}

// ReadSnapshot is Snapshot from remote be: the snapshot named by the
// log's last entry.
func ReadSnapshot(ctx context.Context, be backend.Backend, known string) (snap *Snapshot, name string, err error) {
	tail, err := readTail(ctx, be)
	if err != nil || tail == nil || tail.Snapshot == "" {
		return nil, "", err
	}
	if tail.Snapshot == known {
		return nil, known, nil
	}
	snap, err = readSnapshotObject(ctx, be, tail.Snapshot)
	if err != nil {
		return nil, "", err
	}
	return snap, tail.Snapshot, nil
}

// readSnapshotObject reads and checks snapshot name.
func readSnapshotObject(ctx context.Context, be backend.Backend, name string) (*Snapshot, error) {
	body, err := be.Get(ctx, backend.Handle{Kind: backend.Manifest, Name: name}, nil)
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", name, err)
	}
	if cas.Sum(body).String() != name {
		return nil, fmt.Errorf("snapshot %s in %s: %w: its hash differs from its name", name, be.Location(), cas.ErrCorrupt)
	}
	snap := &Snapshot{}
	if err := json.Unmarshal(body, snap); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", name, err)
	}
	if snap.Version < 1 || snap.Version > snapshotVersion {
		return nil, fmt.Errorf("snapshot %s has version %d, this ckptfs reads up to %d: %w", name, snap.Version, snapshotVersion, cas.ErrNewerFormat)
	}
	for i := range snap.Files {
		f := &snap.Files[i]
		if f.Node.IsRegular() || snap.Version == 1 {
			if f.Manifest, err = catalog.ParseManifest(f.Raw); err != nil {
				return nil, fmt.Errorf("snapshot %s, %s: %w", name, f.Path, err)
			}
			if snap.Version == 1 {
				f.Node.Mode = syscall.S_IFREG | f.Node.Mode&0o7777
			}
		}
		f.Raw = nil
	}
	return snap, nil
}

// ApplyPublished makes a reading mount's store namespace the newest
// published one (new files, overwrites, removals, renames), before the
// namespace is served; it refuses a store whose own commits are not
// uploaded. It returns the snapshot's name ("" when nothing is published
// yet) and how many paths changed.
func (r *Tier) ApplyPublished(ctx context.Context) (string, int, error) {
	// A store with commits not uploaded (a writer's, unsynced) would lose
	// them to the bucket's namespace: refuse.
	if pending, err := r.UploadPending(); err != nil || pending {
		if err == nil {
			err = errors.New("this store has commits not uploaded yet: mount it as the writer (without --read-only) and sync first")
		}
		return "", 0, err
	}
	tail, err := readTail(ctx, r.be)
	if err != nil {
		return "", 0, err
	}
	name := ""
	if tail != nil {
		name = tail.Snapshot
	}
	n, err := r.apply(ctx, name, false, func(string, ...any) {})
	return name, n, err
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
