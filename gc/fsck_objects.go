package gc

// The object half of fsck: every indexed object present, of its recorded
// size and, with ReadData, decoding to its name; a damaged delta base
// reported once, with its deltas.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/cas"
)

// checkBatch is how many index rows checkObjects reads per transaction (it
// reads objects, slow with ReadData, between transactions).
const checkBatch = 1024

// checkObjects checks the objects against the index: presence and size,
// and with ReadData, content; and the chunks manifests name that the index
// does not have.
func (c *fscker) checkObjects(ctx context.Context) error {
	var objects []object
	if err := c.s.WalkObjects(ctx, func(o cas.ObjectInfo) error {
		objects = append(objects, object{o.ID, o.Size})
		if !c.named.has(o.ID) && !c.bases.has(o.ID) {
			c.res.Unreferenced++
		}
		return nil
	}); err != nil {
		return fmt.Errorf("scan objects: %w", err)
	}
	slices.SortFunc(objects, func(a, b object) int { return compareIDs(a.id, b.id) })
	find := func(id cas.ID) (int64, bool) {
		i, ok := slices.BinarySearchFunc(objects, id, func(o object, id cas.ID) int { return compareIDs(o.id, id) })
		if !ok {
			return 0, false
		}
		return objects[i].size, true
	}

	// The index, a batch of rows at a time, in ID order.
	type row struct {
		id   cas.ID
		info cas.ChunkInfo
	}
	var total int64 // raw bytes, for ReadData's progress
	if err := c.s.View(func(tx *cas.Tx) error { total = tx.Counts().UniqueBytes; return nil }); err != nil {
		return fmt.Errorf("read index: %w", err)
	}
	var start cas.ID
	var done, doneBytes int64
	for more := true; more; {
		var rows []row
		err := c.s.View(func(tx *cas.Tx) error {
			return tx.ForEachChunkFrom(start, func(id cas.ID, info cas.ChunkInfo) error {
				if len(rows) == checkBatch {
					return errBatchFull
				}
				rows = append(rows, row{id, info})
				return nil
			})
		})
		if err != nil && !errors.Is(err, errBatchFull) {
			return fmt.Errorf("read index: %w", err)
		}
		more = errors.Is(err, errBatchFull)
		if more {
			var overflow bool
			start, overflow = nextID(rows[len(rows)-1].id)
			more = !overflow
		}
		for i, r := range rows {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := c.checkIndexed(ctx, r.id, r.info, find); err != nil {
				return err
			}
			done++
			doneBytes += int64(r.info.RawLen)
			if c.opts.ReadData && c.opts.Progress != nil && (done%16 == 0 || !more && i == len(rows)-1) {
				c.opts.Progress(Progress{Phase: "read", Done: doneBytes, Total: max(total, doneBytes), Bytes: true})
			}
		}
	}

	// Chunks named by manifests but absent from the index were reported by
	// checkFile; check they at least have objects, so the message says
	// whether data is gone. A store with a remote indexes only what it
	// committed itself: the rest (files another mount published) is fetched
	// on read, so it is checked in the remote, read and verified (a fetched
	// copy here only with ReadData).
	for i := 0; i < c.named.len(); i += checkBatch {
		var unindexed []cas.ID
		err := c.s.View(func(tx *cas.Tx) error {
			for k := i; k < min(i+checkBatch, c.named.len()); k++ {
				id := c.named.get(k)
				if _, indexed, err := tx.Chunk(id); err != nil {
					return err
				} else if !indexed {
					unindexed = append(unindexed, id)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read index: %w", err)
		}
		for _, id := range unindexed {
			_, local := find(id)
			switch {
			case local && c.opts.Remote != nil && c.opts.ReadData:
				c.res.ObjectsRead++
				if _, err := c.s.VerifyObject(ctx, id); err != nil && !c.baseFailed(id, err) {
					c.chunkProblem("corrupt-chunk", id, "%v", unwrapCorrupt(err))
				}
			case local:
			case c.opts.Remote != nil:
				c.res.ObjectsRead++
				if err := c.opts.Remote.VerifyObject(ctx, id); errors.Is(err, cas.ErrMissing) {
					c.chunkProblem("missing-chunk", id, "named by a manifest, in neither the local store nor the remote")
				} else if err != nil {
					c.chunkProblem("corrupt-chunk", id, "in the remote: %v", unwrapCorrupt(err))
				}
			default:
				c.chunkProblem("missing-chunk", id, "named by a manifest, with no object file")
			}
		}
	}
	c.reportBaseFaults()
	return nil
}

// baseFailed reports whether err, from reading chunk id, is its base's
// fault (cas.BaseError); if so it is noted against the base, to be
// reported once for all its deltas (reportBaseFaults).
func (c *fscker) baseFailed(id cas.ID, err error) bool {
	var be *cas.BaseError
	if !errors.As(err, &be) {
		return false
	}
	if c.baseFaults == nil {
		c.baseFaults = map[cas.ID]*baseFault{}
	}
	f := c.baseFaults[be.Base]
	if f == nil {
		f = &baseFault{err: be.Err}
		c.baseFaults[be.Base] = f
	}
	f.deltas = append(f.deltas, id)
	return true
}

// reportBaseFaults makes one problem of each base that failed its deltas'
// reads: the base's own (its object is missing or damaged: checkIndexed
// found it when the base is indexed), or a new one with the error its
// deltas met, counting the deltas.
func (c *fscker) reportBaseFaults() {
	bases := make([]cas.ID, 0, len(c.baseFaults))
	for b := range c.baseFaults {
		bases = append(bases, b)
	}
	slices.SortFunc(bases, compareIDs)
	for _, b := range bases {
		f := c.baseFaults[b]
		idx := -1
		for _, i := range c.chunkProblems[b] {
			if dataLoss[c.res.Problems[i].Kind] {
				idx = i
				break
			}
		}
		if idx < 0 {
			kind := "corrupt-chunk"
			if errors.Is(f.err, cas.ErrMissing) {
				kind = "missing-chunk"
			}
			c.chunkProblem(kind, b, "%v", unwrapCorrupt(f.err))
			idx = len(c.res.Problems) - 1
		}
		c.res.Problems[idx].Deltas = len(f.deltas)
		if c.baseProblem == nil {
			c.baseProblem, c.deltaBase = map[cas.ID]int{}, map[cas.ID]cas.ID{}
		}
		c.baseProblem[b] = idx
		for _, d := range f.deltas {
			c.deltaBase[d] = b
		}
	}
}

// errBatchFull ends a batch of index rows.
var errBatchFull = errors.New("batch full")

// nextID returns the ID after id, and whether id was the last one.
func nextID(id cas.ID) (cas.ID, bool) {
	for i := len(id) - 1; i >= 0; i-- {
		id[i]++
		if id[i] != 0 {
			return id, false
		}
	}
	return id, true
}

// checkIndexed checks one index row against its object.
//
// An index row may disagree with its object only while the chunk is queued
// for re-encoding: the re-encoder renames the encoded object into place
// and then commits the row (cas: deferred encoding), so on a live mount a
// re-encode in progress shows it for a moment, and after a crash in that
// window it stays until the next re-encode. Either way it is counted
// (FsckResult.ReencodeInFlight), not reported chunk by chunk. The listing,
// the row and the queue were read at different times, so a disagreement is
// looked at again (row and queue, then the object) before it is judged.
func (c *fscker) checkIndexed(ctx context.Context, id cas.ID, info cas.ChunkInfo, find func(cas.ID) (int64, bool)) error {
	if info.Packed() {
		return c.checkPacked(ctx, id, info)
	}
	if info.Inline {
		return c.checkInline(ctx, id, info)
	}
	pending := c.queued.has(id)
	size, ok := find(id)
	if !ok || size != int64(info.StoredLen) {
		// Not there when the objects were listed (a commit since then may
		// have stored it: the index is read after the listing), or not as
		// the row says (a re-encode since then may have changed either).
		now, indexed, queued, err := c.rowNow(id)
		if err != nil {
			return err
		}
		if !indexed {
			return nil // swept since the batch was read
		}
		o, there, err := c.s.StatObject(ctx, id)
		if err != nil {
			return err
		}
		info, size, ok, pending = now, o.Size, there, pending || queued
	}
	lagging := false
	switch {
	case !ok:
		c.chunkProblem("missing-chunk", id, "the index names it but there is no object file")
		if c.opts.ReadData {
			c.unread.add(id)
		}
		return nil
	case size != int64(info.StoredLen) && pending:
		lagging = true
		c.reencodeInFlight(id)
	case size != int64(info.StoredLen):
		c.chunkProblem("object-size", id, "object file is %d bytes, index says %d", size, info.StoredLen)
	}
	if !c.opts.ReadData {
		return nil
	}
	c.res.ObjectsRead++
	got, base, isDelta, err := c.s.VerifyObjectBase(ctx, id)
	switch {
	case err != nil:
		c.unread.add(id)
	case isDelta:
		c.deltaObjects = append(c.deltaObjects, deltaObject{id, base})
	}
	if err == nil && got.Codec != info.Codec && !pending {
		// The object was read after the row: look at the row again.
		now, indexed, queued, rerr := c.rowNow(id)
		if rerr != nil {
			return rerr
		}
		if !indexed {
			return nil
		}
		info, pending = now, queued
	}
	switch {
	case err != nil && c.baseFailed(id, err):
		// Reported once, as its base's problem.
	case err != nil:
		c.chunkProblem("corrupt-chunk", id, "%v", unwrapCorrupt(err))
	case got.Codec != info.Codec && pending:
		if !lagging {
			c.reencodeInFlight(id)
		}
	case got.Codec != info.Codec:
		c.chunkProblem("object-codec", id, "object is %v, index says %v", got.Codec, info.Codec)
	}
	return nil
}

// rowNow reads chunk id's index row and whether it is queued for
// re-encoding, in a transaction of its own.
func (c *fscker) rowNow(id cas.ID) (info cas.ChunkInfo, indexed, queued bool, err error) {
	err = c.s.View(func(tx *cas.Tx) error {
		var err error
		if info, indexed, err = tx.Chunk(id); err != nil {
			return err
		}
		_, queued, err = tx.PendingReencode(id)
		return err
	})
	if err != nil {
		return info, false, false, fmt.Errorf("read index: %w", err)
	}
	return info, indexed, queued, nil
}

// reencodeInFlight counts chunk id among those a re-encode has begun and not
// finished (FsckResult.ReencodeInFlight).
func (c *fscker) reencodeInFlight(id cas.ID) {
	if c.inFlight == nil {
		c.inFlight = map[cas.ID]bool{}
	}
	if !c.inFlight[id] {
		c.inFlight[id] = true
		c.res.ReencodeInFlight++
	}
}

// unwrapCorrupt keeps the part of a verification error after the chunk name,
// which the problem already carries.
func unwrapCorrupt(err error) string {
	msg := err.Error()
	for _, sentinel := range []error{cas.ErrCorrupt, cas.ErrMissing} {
		if errors.Is(err, sentinel) {
			if i := strings.Index(msg, sentinel.Error()); i >= 0 {
				return msg[i:]
			}
		}
	}
	return msg
}

// dataLoss are the kinds of problem that make reads of a chunk fail.

// checkPacked checks the index row of a chunk in a pack: the pack's object
// is there and holds the chunk's range, and with ReadData the chunk read
// from the pack decodes to its name. Packed chunks are never queued for
// re-encoding nor deltas, so the row and the object must agree.
func (c *fscker) checkPacked(ctx context.Context, id cas.ID, info cas.ChunkInfo) error {
	size, ok := c.packSizes[info.Pack]
	if !ok {
		st, there, err := c.s.StatPack(ctx, info.Pack)
		if err != nil {
			return err
		}
		size = -1
		if there {
			size = st
		}
		if c.packSizes == nil {
			c.packSizes = map[cas.ID]int64{}
		}
		c.packSizes[info.Pack] = size
	}
	if c.packRefs == nil {
		c.packRefs = map[cas.ID]int{}
	}
	n := c.packRefs[info.Pack] // an entry for every pack a row names, referenced or not
	if c.named.has(id) || c.bases.has(id) {
		n++
	}
	c.packRefs[info.Pack] = n
	switch {
	case size < 0:
		c.chunkProblem("missing-chunk", id, "the index names it in pack %v, which has no object file", info.Pack)
		if c.opts.ReadData {
			c.unread.add(id)
		}
		return nil
	case int64(info.Offset)+int64(info.StoredLen) > size:
		c.chunkProblem("object-size", id, "pack %v is %d bytes, the index says the chunk ends at %d",
			info.Pack, size, int64(info.Offset)+int64(info.StoredLen))
	}
	if !c.opts.ReadData {
		return nil
	}
	c.res.ObjectsRead++
	got, err := c.s.VerifyObject(ctx, id)
	switch {
	case err != nil:
		c.unread.add(id)
		c.chunkProblem("corrupt-chunk", id, "in pack %v: %v", info.Pack, unwrapCorrupt(err))
	case got.Codec != info.Codec:
		c.chunkProblem("object-codec", id, "object in pack %v is %v, index says %v", info.Pack, got.Codec, info.Codec)
	}
	return nil
}

// checkInline checks the index row of a chunk stored inline in the catalog:
// its object is read from the catalog and verified (header, CRC, BLAKE3
// against the chunk's name) whether or not ReadData asks for it, since it
// costs no file read. Inline chunks are never queued nor deltas, so the
// row and the object must agree.
func (c *fscker) checkInline(ctx context.Context, id cas.ID, info cas.ChunkInfo) error {
	c.res.ObjectsRead++
	got, err := c.s.VerifyObject(ctx, id)
	switch {
	case errors.Is(err, cas.ErrMissing):
		c.unread.add(id)
		c.chunkProblem("missing-chunk", id, "the index names it inline, and the catalog holds no object for it")
	case err != nil:
		c.unread.add(id)
		c.chunkProblem("corrupt-chunk", id, "inline: %v", unwrapCorrupt(err))
	case got.StoredLen != info.StoredLen:
		c.chunkProblem("object-size", id, "inline object is %d bytes, index says %d", got.StoredLen, info.StoredLen)
	case got.Codec != info.Codec:
		c.chunkProblem("object-codec", id, "inline object is %v, index says %v", got.Codec, info.Codec)
	}
	return nil
}

// checkInlineObjects checks the catalog's inline objects against the index,
// the other way from checkInline: an inline object whose chunk has no index
// row, or a row that says the chunk is stored elsewhere, is damage (the two
// are written and deleted in one transaction, and a sweep frees an inline
// object only through its row, so such an object would stay forever); and
// the inline counters against what they count; and counts the inline
// objects no file names among the unreferenced. One read transaction: the
// rows, the objects and the counters agree in it on a live mount too.
func (c *fscker) checkInlineObjects(ctx context.Context) error {
	return c.s.View(func(tx *cas.Tx) error {
		var n, bytes int64
		err := tx.ForEachInline(func(id cas.ID, size int) error {
			n++
			bytes += int64(size)
			info, indexed, err := tx.Chunk(id)
			switch {
			case err != nil:
				return err
			case !indexed:
				c.chunkProblem("inline-orphan", id, "the catalog holds an inline object (%d bytes) for a chunk with no index row", size)
			case !info.Inline:
				c.chunkProblem("inline-orphan", id, "the catalog holds an inline object (%d bytes) for a chunk whose index row says it is stored elsewhere", size)
			case !c.named.has(id) && !c.bases.has(id):
				c.res.Unreferenced++ // gc frees it, as an object file (checkObjects)
			}
			if n%4096 == 0 {
				return ctx.Err()
			}
			return nil
		})
		if err != nil {
			return err
		}
		got := tx.Counts()
		if got.InlineChunks != n {
			c.problem("counter", "", "", "inline_chunks counter is %d, the catalog holds %d", got.InlineChunks, n)
		}
		if got.InlineBytes != bytes {
			c.problem("counter", "", "", "inline_bytes counter is %d, the catalog holds %d", got.InlineBytes, bytes)
		}
		return nil
	})
}
