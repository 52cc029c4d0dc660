package cas

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/ckptfs/ckptfs/cas/catalog"
)

// The catalog's rows are cas's API: these names keep cas's importers (fusefs,
// gc, cmd, test) independent of the catalog's package. cas/catalog has the
// schema and its invariants.

// Tx is a catalog transaction (catalog.Tx). It is valid only inside the
// function passed to Store.View or Store.Update; values it returns are copies
// the caller owns.
type Tx = catalog.Tx

// Node is the catalog record of one namespace entry (catalog.Node).
type Node = catalog.Node

// ChunkRef is one entry of a manifest: Len raw bytes of chunk ID.
type ChunkRef = catalog.ChunkRef

// Manifest is a file's committed content (catalog.Manifest).
type Manifest = catalog.Manifest

// Hole is a run of zeros in a file that names no chunk (catalog.Hole).
type Hole = catalog.Hole

// ChunkInfo is the chunk index record of one stored chunk (catalog.ChunkInfo).
type ChunkInfo = catalog.ChunkInfo

// PackInfo is a pack's catalog row: its size, and its live chunks and their
// bytes (see Packs in the package doc).
type PackInfo = catalog.PackInfo

// Counts are the catalog's counters (catalog.Counts).
type Counts = catalog.Counts

// PendingReencode is one row of the re-encode queue (catalog.PendingReencode).
type PendingReencode = catalog.PendingReencode

// DeltaWait is a delta plan's wait for a later version of its chunk
// (deltaplan.go).
type DeltaWait = catalog.DeltaWait

// Reserved inode numbers. Numbers below FirstIno are never allocated, so the
// caller may use them for virtual nodes.
const (
	RootIno  = catalog.RootIno
	FirstIno = catalog.FirstIno
)

// FormatVersion is the newest catalog format this code reads and writes; a
// store with a larger number is refused (ErrNewerFormat).
const FormatVersion = catalog.FormatVersion

// FormatDeltas, FormatLinks and FormatHoles are the least formats of a
// store holding deltas, of one holding a node with several names (hard
// links), and of one whose manifests have holes: an older ckptfs refuses
// such a store.
const (
	FormatDeltas = catalog.FormatDeltas
	FormatLinks  = catalog.FormatLinks
	FormatHoles  = catalog.FormatHoles
)

// ErrTooManyLinks means a node has MaxLinks names already (EMLINK).
var ErrTooManyLinks = catalog.ErrTooManyLinks

// ErrCatalogDamaged is wrapped by errors about a catalog whose pages or
// records do not check: Open refuses such a store, reads of a damaged record
// fail, and fsck names the damage.
var ErrCatalogDamaged = catalog.ErrCatalogDamaged

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
