package cas

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/object"
)

// The remote tier: a store may have a second backend, a bucket
// (Options.Remote), which its committed files are written back to in the
// background and which a store on another machine reads lazily. The
// decisions, and why:
//
//   - Write-back, not write-through. A commit stays local (objects synced,
//     one transaction) and as fast as without a remote; every commit bumps
//     the catalog's commit generation in its own transaction. Upload rounds
//     (UploadRound, run by the daemon after commits and by ckptfs sync) carry
//     everything committed up to the generation they start at to the bucket,
//     and record that generation as uploaded, in the catalog. So the upload
//     queue is persistent for free: after a crash or SIGKILL the next mount
//     finds generation > uploaded generation and uploads again; nothing
//     committed is forgotten, and nothing needs a queue row per chunk.
//   - What is published is a snapshot of the namespace: every regular file's
//     path, attributes and manifest, as one immutable Manifest object named
//     by the BLAKE3 of its bytes, then the small mutable object locks/head
//     naming the newest snapshot. Order: every chunk a snapshot names is in
//     the bucket (put-if-absent: ErrExists is a dedup hit) before the
//     snapshot, and the snapshot before the head, so a reader that sees a
//     head can read every byte it names (xet's lost-data bug was a manifest
//     published before its chunks). A snapshot costs O(files); checkpoint
//     directories hold thousands of files, not millions.
//   - Chunks are uploaded as the objects they are stored as (encoded; the
//     reader verifies them like local ones), from the local store, with
//     bounded concurrency; the catalog bucket "remote_chunks" remembers which
//     are in the bucket so a new version uploads only its new chunks. Local
//     space stays bounded by what the local store keeps anyway: write-back
//     never copies objects into a staging area.
//   - One writer per bucket prefix: LockRemote takes locks/writer with a
//     put-if-absent and rewrites it every HeartbeatInterval; a lock not
//     rewritten for StaleLockAge is taken over. Readers take no lock.
//   - Lazy fetch: a chunk missing from the local objects is fetched from the
//     remote, verified like any object (CRC, decode, BLAKE3 = name: a damaged
//     object in the bucket is ErrCorrupt, never wrong bytes), and kept in the
//     local objects as a cache bounded by Options.LocalCacheSize (least
//     recently fetched first out). Fetched objects are not indexed: the local
//     catalog indexes only what this store committed.
//   - Garbage collection of the bucket (CollectRemote, run by the writer's
//     gc): a chunk object is deleted only if neither the newest snapshot,
//     nor this store's catalog (committed, maybe not uploaded yet), nor a
//     file open in the daemon names it, and it is older than the grace
//     period; it holds the upload lock, so it never races an upload round,
//     and it forgets a chunk's remote_chunks row before deleting the object,
//     so a commit that needs the chunk again uploads it again. Readers on an
//     older snapshot are protected by the grace period only.
//   - Limits, for later: a snapshot lists every file's whole manifest, so it
//     grows with the store's chunks (about 100 bytes a chunk) and each round
//     rewrites it (a log of per-commit records would not); renames and
//     deletions reach a reading mount only as the absence from the next
//     snapshot, which it does not apply (it adds new files; a changed file
//     shows its new version at the next mount); the local cache of fetched
//     objects is bounded within one process's life (objects fetched by an
//     earlier process are not counted).

// Names of the remote's mutable objects.
const (
	headName   = "head"
	writerName = "writer"
)

// remoteState is a Store's remote tier.
type remoteState struct {
	be backend.Backend

	upMu sync.Mutex // one upload round at a time

	fetchMu  sync.Mutex
	fetched  *list.List // of fetchedObj, front = most recent
	byID     map[ID]*list.Element
	used     int64
	budget   int64
	pending  int64 // bytes of chunks the last round found not uploaded (under fetchMu)
	uploaded int64
	read     int64
	up       UploadProgress // under fetchMu
}

type fetchedObj struct {
	id   ID
	size int64
}

// DefaultLocalCacheSize bounds the objects a store keeps after fetching them
// from its remote.
const DefaultLocalCacheSize = 10 << 30

func newRemoteState(be backend.Backend, budget int64) *remoteState {
	if budget <= 0 {
		budget = DefaultLocalCacheSize
	}
	return &remoteState{be: be, fetched: list.New(), byID: map[ID]*list.Element{}, budget: budget}
}

// Remote returns the store's remote backend, or nil.
func (s *Store) Remote() backend.Backend {
	if s.remote == nil {
		return nil
	}
	return s.remote.be
}

// HasRemote reports whether the store has a remote tier.
func (s *Store) HasRemote() bool { return s.remote != nil }

// RemoteStats are the remote tier's counters.
type RemoteStats struct {
	PendingBytes  int64 `json:"remote_pending_bytes"`  // raw bytes of committed chunks not in the bucket yet (as of the last round)
	UploadedBytes int64 `json:"remote_uploaded_bytes"` // object bytes this process uploaded
	ReadBytes     int64 `json:"remote_read_bytes"`     // object bytes this process fetched
}

// UploadProgress counts what upload rounds have done since the store was
// opened, whoever started them (the daemon's uploader or ckptfs sync): the
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

// UploadProgress returns the upload counters; the zero value for a store
// without a remote.
func (s *Store) UploadProgress() UploadProgress {
	if s.remote == nil {
		return UploadProgress{}
	}
	r := s.remote
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	p := r.up
	p.PendingBytes = r.pending
	return p
}

func (s *Store) remoteStats() RemoteStats {
	if s.remote == nil {
		return RemoteStats{}
	}
	r := s.remote
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	return RemoteStats{PendingBytes: r.pending, UploadedBytes: r.uploaded, ReadBytes: r.read}
}

// fetchRemote loads chunk id's object from the remote, verifies it, keeps a
// copy in the local objects and returns its raw bytes and the object. With
// standalone set the chunk must be a standalone one (it is a delta's base).
func (s *Store) fetchRemote(ctx context.Context, id ID, buf []byte, alloc func(int) []byte, standalone bool) (raw, obj []byte, err error) {
	r := s.remote
	h := chunkHandle(id)
	obj, err = r.be.Get(ctx, h, buf)
	if errors.Is(err, backend.ErrNotExist) {
		return nil, nil, fmt.Errorf("chunk %v: %w (neither here nor in %s)", id, ErrMissing, r.be.Location())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fetch chunk %v from %s: %w", id, r.be.Location(), err)
	}
	r.fetchMu.Lock()
	r.read += int64(len(obj))
	r.fetchMu.Unlock()
	if standalone {
		raw, err = s.coder.DecodeInto(id, obj, alloc, nil)
	} else {
		var baseErr error
		if raw, baseErr, err = s.decodeChunk(ctx, id, obj, alloc); baseErr != nil {
			return nil, obj, baseErr // the object fetched may be sound
		}
	}
	if err != nil {
		return nil, obj, fmt.Errorf("in %s: %w", r.be.Location(), err)
	}
	if s.readOnly {
		return raw, obj, nil
	}
	// Keep a copy. Not synced: a copy lost or torn by a crash is verified on
	// read like any object and fetched again.
	if err := s.objects.Put(ctx, h, obj, backend.PutOptions{}); err != nil {
		return raw, obj, nil // a cache that cannot keep the copy costs a refetch, not the read
	}
	if f, ok := s.objects.(forgetter); ok {
		f.Forget([]backend.Handle{h}) // never synced: hand back what the backend holds for a Sync
	}
	s.noteFetched(ctx, id, int64(len(obj)))
	return raw, obj, nil
}

// noteFetched records a fetched copy and evicts the least recently fetched
// ones beyond the local cache's budget.
func (s *Store) noteFetched(ctx context.Context, id ID, size int64) {
	r := s.remote
	r.fetchMu.Lock()
	if el, ok := r.byID[id]; ok {
		r.fetched.MoveToFront(el)
		r.fetchMu.Unlock()
		return
	}
	r.byID[id] = r.fetched.PushFront(fetchedObj{id, size})
	r.used += size
	var evict []ID
	for r.used > r.budget && r.fetched.Len() > 1 {
		el := r.fetched.Back()
		o := el.Value.(fetchedObj)
		r.fetched.Remove(el)
		delete(r.byID, o.id)
		r.used -= o.size
		evict = append(evict, o.id)
	}
	r.fetchMu.Unlock()
	// Through discardUnnamed, as a released batch's chunks: a copy that a
	// batch in flight found and pinned (it is about to commit it) or that a
	// sweep is deleting is left alone, and so is one the index names. Best
	// effort: a copy left over is only space.
	_, _ = s.discardUnnamed(ctx, evict)
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
	Path     string    `json:"path"` // slash-separated, relative to the mount's root
	Node     Node      `json:"node"` // attributes (Ino is the writer's)
	Manifest *Manifest `json:"-"`
	Raw      []byte    `json:"manifest"` // Manifest, marshalled
}

// head is locks/head: the newest snapshot.
type head struct {
	Gen      uint64    `json:"gen"`
	Snapshot string    `json:"snapshot"`
	Time     time.Time `json:"time"`
}

const snapshotVersion = 1

// UploadPending reports whether commits are waiting for an upload round.
func (s *Store) UploadPending() (bool, error) {
	var pending bool
	err := s.View(func(tx *Tx) error {
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
func (s *Store) UploadRound(ctx context.Context) error {
	if s.remote == nil {
		return errors.New("store has no remote")
	}
	if s.readOnly {
		return errors.New("store is open read-only")
	}
	r := s.remote
	r.upMu.Lock()
	defer r.upMu.Unlock()

	var gen, done uint64
	snap := Snapshot{Version: snapshotVersion, Time: time.Now().UTC()}
	need := map[ID]uint32{}
	err := s.View(func(tx *Tx) error {
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
		return walk(RootIno, "")
	})
	if err != nil || gen <= done {
		return err
	}
	snap.Gen = gen
	var pending int64
	for _, n := range need {
		pending += int64(n)
	}
	r.fetchMu.Lock()
	r.pending = pending
	r.fetchMu.Unlock()

	if err := s.uploadChunks(ctx, need); err != nil {
		return err
	}
	body, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	name := Sum(body).String()
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
	return s.Update(func(tx *Tx) error { return tx.Uploads().SetUploaded(gen) })
}

// uploadRecordBatch is how many uploaded chunks one catalog transaction records.
const uploadRecordBatch = 256

// uploadChunks puts every chunk of need into the remote, Connections at a
// time (at most 32), and records the ones that got there.
func (s *Store) uploadChunks(ctx context.Context, need map[ID]uint32) error {
	r := s.remote
	ids := make(chan ID)
	var mu sync.Mutex
	var done []ID
	record := func(force bool) error {
		mu.Lock()
		if len(done) == 0 || (!force && len(done) < uploadRecordBatch) {
			mu.Unlock()
			return nil
		}
		batch := done
		done = nil
		mu.Unlock()
		return s.Update(func(tx *Tx) error { return tx.Uploads().Add(batch) })
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
				obj, err := s.objects.Get(gctx, h, buf)
				if err != nil {
					return fmt.Errorf("upload chunk %v: read the local object: %w", id, err)
				}
				buf = obj
				if obj, err = s.standaloneObject(gctx, id, obj); err != nil {
					return fmt.Errorf("upload chunk %v: %w", id, err)
				}
				err = r.be.Put(gctx, h, obj, backend.PutOptions{IfAbsent: true})
				exists := errors.Is(err, backend.ErrExists) // a dedup hit
				if err != nil && !exists {
					return fmt.Errorf("upload chunk %v: %w", id, err)
				}
				r.fetchMu.Lock()
				r.pending -= int64(need[id])
				r.up.SettledBytes += int64(need[id])
				if exists {
					r.up.Present++
				} else {
					r.uploaded += int64(len(obj))
					r.up.Chunks++
					r.up.RawBytes += int64(need[id])
					r.up.SentBytes += int64(len(obj))
				}
				r.fetchMu.Unlock()
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

// standaloneObject returns obj, chunk id's local object, when it is
// standalone, and otherwise (a delta) the chunk's standalone encoding. The
// bucket holds standalone objects only: its collection marks from
// snapshots and knows nothing of bases, and a reader elsewhere would need
// two fetches. (Deltas in the bucket are left for later.)
func (s *Store) standaloneObject(ctx context.Context, id ID, obj []byte) ([]byte, error) {
	h, err := object.ParseHeader(obj)
	if err != nil || !h.Delta {
		return obj, nil // a damaged object fails the reader's checks, as before
	}
	raw, err := s.ReadChunk(ctx, ChunkRef{ID: id, Len: h.RawLen})
	if err != nil {
		return nil, err
	}
	enc, _ := s.coder.Encode(raw, Hint{ElemSize: h.Elem})
	return enc, nil
}

// RemoteSnapshot returns the newest snapshot published in the remote, or
// nil when none is, and the name of the head it came from (to tell a new one).
func (s *Store) RemoteSnapshot(ctx context.Context, known string) (snap *Snapshot, name string, err error) {
	if s.remote == nil {
		return nil, "", errors.New("store has no remote")
	}
	be := s.remote.be
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
	if Sum(body).String() != hd.Snapshot {
		return nil, "", fmt.Errorf("snapshot %s in %s: %w: its hash differs from its name", hd.Snapshot, be.Location(), ErrCorrupt)
	}
	snap = &Snapshot{}
	if err := json.Unmarshal(body, snap); err != nil {
		return nil, "", fmt.Errorf("snapshot %s: %w", hd.Snapshot, err)
	}
	if snap.Version != snapshotVersion {
		return nil, "", fmt.Errorf("snapshot %s has version %d, this ckptfs reads %d: %w", hd.Snapshot, snap.Version, snapshotVersion, ErrNewerFormat)
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

// VerifyRemoteObject fetches chunk id's object from the remote and verifies
// it, bypassing the local objects (fsck).
func (s *Store) VerifyRemoteObject(ctx context.Context, id ID) error {
	if s.remote == nil {
		return errors.New("store has no remote")
	}
	obj, err := s.remote.be.Get(ctx, chunkHandle(id), nil)
	if errors.Is(err, backend.ErrNotExist) {
		return fmt.Errorf("chunk %v: %w in %s", id, ErrMissing, s.remote.be.Location())
	}
	if err != nil {
		return err
	}
	_, err = s.coder.DecodeInto(id, obj, nil, s.bases(ctx))
	return err
}

// fetchedCopy reports whether chunk id's local object is a copy fetched
// from the remote (not indexed here), which may be fetched again.
func (s *Store) fetchedCopy(id ID) bool {
	var indexed bool
	if err := s.View(func(tx *Tx) error { _, indexed, _ = tx.Chunk(id); return nil }); err != nil {
		return false
	}
	return !indexed
}

// ID returns the store's random identity, made when it is first asked for
// (the remote writer lock names it: a store reopened after its daemon died
// may take its own lock back at once, since the catalog's flock proves the
// old holder gone). A read-only store that never had one returns "".
func (s *Store) ID() (string, error) {
	var id string
	err := s.View(func(tx *Tx) error {
		id = tx.StoreID()
		return nil
	})
	if err != nil || id != "" || s.readOnly {
		return id, err
	}
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", err
	}
	err = s.Update(func(tx *Tx) error {
		var err error
		id, err = tx.SetStoreID(hex.EncodeToString(rnd[:]))
		return err
	})
	return id, err
}

// RemoteCollectResult is what CollectRemote found and removed.
type RemoteCollectResult struct {
	Objects    int   `json:"remote_objects"`     // chunk objects in the remote
	Young      int   `json:"remote_young"`       // unreferenced but younger than the cutoff: kept
	Freed      int   `json:"remote_freed"`       // deleted (or, dry run, would be)
	FreedBytes int64 `json:"remote_freed_bytes"` // their bytes
}

// CollectRemote deletes from the remote every chunk object that no file
// names, neither in the newest published snapshot nor in this store's
// catalog (files committed and not uploaded yet) nor in live (files open or
// staged), and that was last modified before before (the grace period:
// reading mounts may still be on an older snapshot). It holds the upload
// lock throughout, so no upload round runs meanwhile; a chunk's
// remote_chunks row is removed before its object, so a later round uploads
// it again if a commit comes to need it. Only the writer (the holder of the
// remote's lock) may call it. With dryRun it deletes nothing.
func (s *Store) CollectRemote(ctx context.Context, before time.Time, live []*Manifest, dryRun bool) (RemoteCollectResult, error) {
	var res RemoteCollectResult
	if s.remote == nil {
		return res, errors.New("store has no remote")
	}
	if s.readOnly {
		return res, errors.New("store is open read-only")
	}
	r := s.remote
	r.upMu.Lock()
	defer r.upMu.Unlock()

	marked := map[ID]struct{}{}
	mark := func(m *Manifest) {
		for _, c := range m.Chunks {
			marked[c.ID] = struct{}{}
		}
	}
	snap, _, err := s.RemoteSnapshot(ctx, "")
	if err != nil {
		return res, fmt.Errorf("read the published files: %w", err) // never sweep on a partial mark
	}
	if snap != nil {
		for _, f := range snap.Files {
			mark(f.Manifest)
		}
	}
	if err := s.View(func(tx *Tx) error {
		return tx.ForEachManifest(func(_ uint64, m *Manifest) error { mark(m); return nil })
	}); err != nil {
		return res, err
	}
	for _, m := range live {
		mark(m)
	}
	type doomed struct {
		id   ID
		size int64
	}
	var victims []doomed
	err = r.be.List(ctx, backend.Chunk, func(in backend.Info) error {
		id, ok := handleID(in.Handle)
		if !ok {
			return nil
		}
		res.Objects++
		if _, ok := marked[id]; ok {
			return nil
		}
		if !in.ModTime.Before(before) {
			res.Young++
			return nil
		}
		victims = append(victims, doomed{id, in.Size})
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("list the remote's chunks: %w", err)
	}
	for _, v := range victims {
		res.Freed++
		res.FreedBytes += v.size
	}
	if dryRun || len(victims) == 0 {
		return res, nil
	}
	ids := make([]ID, len(victims))
	for i, v := range victims {
		ids[i] = v.id
	}
	err = s.Update(func(tx *Tx) error { return tx.Uploads().Forget(ids) })
	if err != nil {
		return RemoteCollectResult{Objects: res.Objects, Young: res.Young}, err
	}
	res.Freed, res.FreedBytes = 0, 0
	for _, v := range victims {
		if err := r.be.Delete(ctx, chunkHandle(v.id)); err != nil {
			return res, fmt.Errorf("delete chunk %v from the remote: %w", v.id, err)
		}
		res.Freed++
		res.FreedBytes += v.size
	}
	return res, nil
}
