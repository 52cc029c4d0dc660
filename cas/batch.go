package cas

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Batch collects the chunks of one commit. Put writes each chunk's object unless
// the store already has it; Sync makes the objects and their directory entries
// durable; Tx.CommitBatch then adds their index rows in the commit's
// transaction.
//
// Durability is batched: Put writes a new object, starts its writeback
// (sync_file_range), renames it into place and keeps its descriptor open;
// Sync then fdatasyncs every object the batch names that is not indexed yet,
// many at once, so the filesystem commits their metadata in a few journal
// commits instead of one per chunk, and the disk writes overlap the rest of
// the stream. The rules that keep "a row names only durable objects":
//
//   - Only Sync's caller commits rows, after Sync; CommitBatch refuses a batch
//     with objects or directories Sync has not made durable.
//   - A batch that finds an object it did not write (in flight in another
//     batch, or on disk and unindexed) syncs it, and the directories holding
//     it, before naming it.
//   - The writer syncs through the descriptor it wrote with, so a failed
//     writeback is reported to it even if the inode was evicted meanwhile (a
//     fresh open would not see it). The kernel reports such a failure to one
//     fdatasync only: Store.syncObject remembers it, under a per-chunk lock,
//     so that every batch naming the object fails, and the next Put writes
//     the object anew.
//   - Replacing a file already at the object's path (damaged, or its sync
//     failed), or when the store has no descriptor budget left, Put
//     fdatasyncs before the rename, as before batching: another batch may
//     have found the old file and commit it by name.
//
// After a crash, an unsynced object is unindexed: it is verified before it is
// reused (and rewritten if damaged), and the collector deletes it after the
// grace period if no manifest names it.
//
// Put may be called from many goroutines at once.
type Batch struct {
	s *Store

	mu     sync.Mutex
	added  map[ID]ChunkInfo    // chunks to index at commit
	synced map[ID]struct{}     // of those, the ones Sync made durable
	files  map[ID]*os.File     // objects this batch wrote, open until Sync syncs them
	queue  map[ID]Hint         // of those, the ones stored raw, to re-encode later
	dirs   map[string]struct{} // directories whose entries changed
	pinned []ID                // chunks this batch keeps from the sweeper
}

// flight is an object being written by some batch; other batches putting the
// same chunk wait for it instead of writing it twice.
type flight struct {
	done    chan struct{}
	info    ChunkInfo
	pending bool // stored raw, to be queued for re-encoding with hint
	hint    Hint
	err     error
}

// NewBatch starts a batch.
func (s *Store) NewBatch() *Batch {
	return &Batch{s: s, added: map[ID]ChunkInfo{}, synced: map[ID]struct{}{}, files: map[ID]*os.File{},
		queue: map[ID]Hint{}, dirs: map[string]struct{}{}}
}

// Put stores data as a chunk and returns its reference. When the chunk is
// already indexed nothing is written. data is not retained. It is
// PutHinted(ctx, data, Hint{}).
func (b *Batch) Put(ctx context.Context, data []byte) (ChunkRef, error) {
	return b.PutHinted(ctx, data, Hint{})
}

// PutHinted is Put with a hint of what data holds (see Hint), used to pick its
// codec when the chunk is new. The chunk ID is the hash of data whatever the
// hint, so hinted and unhinted puts of the same bytes dedupe.
func (b *Batch) PutHinted(ctx context.Context, data []byte, h Hint) (ChunkRef, error) {
	if b.s.readOnly {
		return ChunkRef{}, errors.New("store is open read-only")
	}
	if len(data) > maxChunkSize {
		return ChunkRef{}, fmt.Errorf("chunk of %d bytes is over the %d limit", len(data), maxChunkSize)
	}
	id, err := b.s.sum(ctx, data)
	if err != nil {
		return ChunkRef{}, err
	}
	ref := ChunkRef{ID: id, Len: uint32(len(data))}
	// Pin before looking at the index: from here until Release, a sweep will
	// not delete this chunk, and a sweep already deleting it finishes first.
	if err := b.s.pin(ctx, id); err != nil {
		return ref, err
	}
	b.mu.Lock()
	b.pinned = append(b.pinned, id)
	b.mu.Unlock()

	var indexed bool
	if err := b.s.View(func(tx *Tx) error {
		_, ok, err := tx.Chunk(id)
		indexed = ok
		return err
	}); err != nil {
		return ref, err
	}
	if indexed {
		return ref, nil
	}

	s := b.s
	s.flightMu.Lock()
	if f, ok := s.flights[id]; ok {
		s.flightMu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return ref, ctx.Err()
		}
		if f.err != nil {
			return ref, f.err
		}
		b.note(id, f.info, f.pending, f.hint)
		return ref, nil
	}
	f := &flight{done: make(chan struct{}), hint: h}
	s.flights[id] = f
	s.flightMu.Unlock()

	var file *os.File
	f.info, file, f.pending, f.err = s.writeObject(id, data, h)

	s.flightMu.Lock()
	delete(s.flights, id)
	s.flightMu.Unlock()
	close(f.done)

	if f.err != nil {
		return ref, f.err
	}
	if file != nil {
		b.mu.Lock()
		if old := b.files[id]; old != nil { // the same chunk written twice (rewritten after a failed sync)
			old.Close()
			s.releaseFile()
		}
		b.files[id] = file
		b.mu.Unlock()
	}
	b.note(id, f.info, f.pending, h)
	return ref, nil
}

// sum hashes data in one of the store's hash slots.
func (s *Store) sum(ctx context.Context, data []byte) (ID, error) {
	select {
	case s.hashSlots <- struct{}{}:
	case <-ctx.Done():
		return ID{}, ctx.Err()
	}
	defer func() { <-s.hashSlots }()
	return Sum(data), nil
}

// note records chunk id's object for the commit: its index row, its queue
// row if it was stored raw, and its directories, whose entries Sync makes
// durable whoever created them (an object this batch found written by another
// batch may have its name on disk but not yet durable).
func (b *Batch) note(id ID, info ChunkInfo, pending bool, h Hint) {
	dir := filepath.Dir(b.s.objectPath(id))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.added[id] = info
	if pending {
		b.queue[id] = h
	}
	for _, d := range []string{filepath.Dir(filepath.Dir(dir)), filepath.Dir(dir), dir} {
		b.dirs[d] = struct{}{}
	}
}

// syncWorkers is how many objects Sync fdatasyncs at once: enough for the
// filesystem to group them into few journal commits.
const syncWorkers = 16

// Sync makes durable every object the batch names (its own and those it found
// written by others but not indexed), then the directories whose entries they
// changed. Objects already synced by an earlier Sync of this batch are skipped.
func (b *Batch) Sync() error {
	b.mu.Lock()
	ids := make([]ID, 0, len(b.added))
	files := make(map[ID]*os.File, len(b.files))
	for id := range b.added {
		if _, ok := b.synced[id]; !ok {
			ids = append(ids, id)
			if f := b.files[id]; f != nil {
				files[id] = f
				delete(b.files, id)
			}
		}
	}
	dirs := make([]string, 0, len(b.dirs))
	for d := range b.dirs {
		dirs = append(dirs, d)
	}
	b.mu.Unlock()

	var g errgroup.Group
	g.SetLimit(syncWorkers)
	for _, id := range ids {
		g.Go(func() error {
			f := files[id]
			err := b.s.syncObject(id, f)
			if f != nil {
				f.Close()
				b.s.releaseFile()
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, d := range dirs {
		if err := b.s.syncDirectory(d); err != nil {
			return err
		}
	}
	b.mu.Lock()
	for _, id := range ids {
		b.synced[id] = struct{}{}
	}
	for _, d := range dirs {
		delete(b.dirs, d)
	}
	b.mu.Unlock()
	return nil
}

// syncObject makes chunk id's object durable: through f, the descriptor it
// was written with, when the caller wrote it, else by opening it. A failed
// fdatasync is remembered (see Batch), and an earlier one makes this call fail
// too; the per-chunk lock makes "sync, then record or check" one step, so a
// batch cannot sync after another's failure was reported but before it was
// recorded.
func (s *Store) syncObject(id ID, f *os.File) error {
	mu := &s.syncLocks[id[0]]
	mu.Lock()
	defer mu.Unlock()
	path := s.objectPath(id)
	var err error
	switch {
	case s.syncHook != nil:
		err = s.syncHook(path)
	case f != nil:
		err = fdatasync(f)
	default:
		var g *os.File
		if g, err = os.Open(path); err != nil {
			return fmt.Errorf("sync chunk %v: %w", id, err) // says nothing of its bytes: not recorded
		}
		err = fdatasync(g)
		g.Close()
	}
	if err != nil {
		err = fmt.Errorf("sync chunk %v: %w", id, err)
		s.syncErrs.Store(id, err)
		return err
	}
	if err, ok := s.syncErrs.Load(id); ok {
		return err.(error)
	}
	return nil
}

// holdFile takes one of the store's budget of object descriptors a batch may
// keep open until its Sync, without waiting; releaseFile gives it back.
func (s *Store) holdFile() bool {
	select {
	case s.heldFiles <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Store) releaseFile() { <-s.heldFiles }

// syncDirectory makes a directory's entries durable; a test may watch the
// calls through syncHook instead.
func (s *Store) syncDirectory(path string) error {
	if s.syncHook != nil {
		return s.syncHook(path)
	}
	return syncDir(path)
}

// Release unpins the batch's chunks. Call it once the transaction that commits
// the batch has ended (committed or not); the batch must not be used after.
func (b *Batch) Release() {
	b.mu.Lock()
	pinned := b.pinned
	b.pinned = nil
	files := b.files
	b.files = map[ID]*os.File{}
	b.mu.Unlock()
	for _, f := range files { // never synced: the batch was abandoned
		f.Close()
		b.s.releaseFile()
	}
	b.s.unpin(pinned)
}

// CommitBatch adds the index rows of b's chunks, and the re-encode queue rows
// of those stored raw because no inline encoder was free. A chunk that is
// already indexed (another commit got there first) keeps its row and gets no
// queue row, so a chunk is queued only if the row that indexes it was written
// for a raw-pending object. Call it after b.Sync, inside the transaction that
// commits the manifests naming the chunks.
func (t *Tx) CommitBatch(b *Batch) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dirs) > 0 {
		return errors.New("commit of a batch that Sync has not made durable: directories pending")
	}
	for id := range b.added {
		if _, ok := b.synced[id]; !ok {
			return fmt.Errorf("commit of a batch that Sync has not made durable: chunk %v", id)
		}
	}
	for id, info := range b.added {
		added, err := t.putChunk(id, info)
		if err != nil {
			return fmt.Errorf("index chunk %v: %w", id, err)
		}
		if h, pending := b.queue[id]; pending && added {
			if err := t.queueReencode(id, h, info.RawLen); err != nil {
				return fmt.Errorf("queue chunk %v for re-encoding: %w", id, err)
			}
		}
	}
	return nil
}

// writeObject publishes data as chunk id's object file: written under a
// temporary name and renamed into place, either left to Batch.Sync to make
// durable (returning the open file for it) or, when it replaces a file at the
// path or no descriptor can be kept, fdatasync'd before the rename (f nil).
//
// The payload is encoded inline when an encode slot is free (see
// Options.InlineEncoders); otherwise it is stored raw and pending reports that
// the chunk should be queued for a background re-encode. An object that already
// exists is kept if it verifies (pending if it is raw: it may be an earlier
// raw-pending write whose commit never happened), and replaced otherwise.
func (s *Store) writeObject(id ID, data []byte, h Hint) (info ChunkInfo, f *os.File, pending bool, err error) {
	path := s.objectPath(id)
	_, exists := s.syncErrs.Load(id) // its bytes may not be on disk: rewrite it
	if !exists {
		if _, err := os.Stat(path); err == nil {
			exists = true
			if info, err := s.VerifyObject(id); err == nil {
				return info, nil, info.Codec == CodecRaw && info.RawLen > 0, nil
			}
		}
	}
	if err := s.makeObjectDir(filepath.Dir(path)); err != nil {
		return ChunkInfo{}, nil, false, err
	}
	var obj []byte
	codec := CodecRaw
	if release, ok := s.tryEncodeSlot(len(data)); ok {
		obj, codec = s.codecs.encodeObject(data, h)
		release()
	} else {
		obj, pending = rawObject(data), true
	}
	// Replacing a file (see Batch), or out of descriptors: durable now.
	keep := !exists && s.holdFile()
	f, err = publishObject(path, obj, keep)
	if err != nil {
		if keep {
			s.releaseFile()
		}
		return ChunkInfo{}, nil, false, fmt.Errorf("write chunk %v: %w", id, err)
	}
	if !keep {
		s.syncErrs.Delete(id) // the new file is durable
	}
	return ChunkInfo{RawLen: uint32(len(data)), StoredLen: uint32(len(obj)), Codec: codec}, f, pending, nil
}

// publishObject writes obj to path atomically: a temporary file in path's
// directory, renamed over path. Without keep, the file is fdatasync'd before
// the rename and closed (f is nil); with keep, its writeback is only started,
// and the open file is returned for the caller to fdatasync (Batch.Sync)
// before the catalog names it. The caller fsyncs the directory.
func publishObject(path string, obj []byte, keep bool) (*os.File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	if _, err := f.Write(obj); err != nil {
		return fail(err)
	}
	if keep {
		err = startWriteback(f)
	} else {
		err = fdatasync(f)
	}
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if keep {
		return f, nil
	}
	return nil, f.Close()
}

// makeObjectDir creates objects/ab/cd as needed. Making the new entries
// durable is Batch.Sync's job (note records the directories).
func (s *Store) makeObjectDir(dir string) error {
	if _, ok := s.madeDirs.Load(dir); ok {
		return nil
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create object directory: %w", err)
		}
	}
	s.madeDirs.Store(dir, struct{}{})
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
