package cas

import (
	"fmt"

	"github.com/ckptfs/ckptfs/cas/object"
)

// Inline chunks (doc.go, "Inline chunks", has the decisions): a new chunk
// of at most Options.InlineMaxChunk raw bytes is kept by its batch in
// memory as the object an object file would hold, and its commit's
// transaction stores that object in the catalog beside the chunk's index
// row (catalog/inline.go), so the commit writes no file and syncs nothing
// but the transaction.

// DefaultInlineMaxChunk is the largest raw chunk stored inline unless
// Options.InlineMaxChunk says otherwise.
const DefaultInlineMaxChunk = 16 << 10

// inlines reports whether the store puts a new chunk n bytes long inline.
func (s *Store) inlines(n int) bool {
	return !s.readOnly && s.inlineMax > 0 && n <= s.inlineMax
}

// reserveInline reports whether b may put n more raw bytes inline: a batch
// (one file's commit) inlines at most Options.InlineMaxChunk bytes in all,
// so a small file goes into the catalog whole, and a large one, whatever
// its chunk size, adds at most that much to it (its first small chunks).
func (b *Batch) reserveInline(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inlined+n > b.s.inlineMax {
		return false
	}
	b.inlined += n
	return true
}

// putInline keeps chunk id (data, not indexed) for its commit's
// transaction, encoded as any object (zstd when that saves at least
// 1/32, else raw) when one of Options.InlineEncoders is free, as a new
// object is; raw otherwise (no slot free, or none at all: InlineEncoders
// -1). It is never re-encoded, so this is its form for good; the cost is
// bounded by the batch's inline budget (Options.InlineMaxChunk raw
// bytes). The chunk is
// readable at once through the registry of live batches' chunks (packs:
// as if in a pack already written out by no one), until the batch is
// released; from its commit on, through its index row.
func (b *Batch) putInline(id ID, data []byte, h Hint) {
	obj, codec, ok := b.s.encodeIfFree(data, Hint{})
	if !ok {
		obj, codec = object.EncodeRaw(data), CodecRaw
	}
	b.packMu.Lock()
	defer b.packMu.Unlock()
	b.mu.Lock()
	if _, dup := b.inline[id]; dup {
		b.mu.Unlock()
		return
	}
	b.inline[id] = obj
	b.added[id] = ChunkInfo{RawLen: uint32(len(data)), StoredLen: uint32(len(obj)), Codec: codec, Inline: true}
	b.hints[id] = h
	// Nothing to sync: the object becomes durable with the transaction
	// that indexes it.
	b.synced[id] = struct{}{}
	b.mu.Unlock()
	w := &packWriter{buf: obj, ents: []packEnt{{id: id, n: int64(len(obj)), codec: codec}}}
	b.s.packs.add(id, b, packSlot{w, 0})
}

// inlineObject returns inline chunk id's object from the catalog.
func (s *Store) inlineObject(id ID, buf []byte) ([]byte, error) {
	var obj []byte
	var ok bool
	if err := s.View(func(tx *Tx) error {
		var err error
		obj, ok, err = tx.InlineObject(id, buf)
		return err
	}); err != nil {
		return nil, fmt.Errorf("chunk %v: %w", id, err)
	}
	if !ok {
		return nil, fmt.Errorf("chunk %v: inline, but the catalog holds no object for it: %w", id, ErrMissing)
	}
	return obj, nil
}
