package cas

import (
	"errors"
	"fmt"
)

// Errors returned when opening a store.
var (
	// ErrLocked means another process has the store open (it is mounted elsewhere).
	ErrLocked = errors.New("store is in use by another process (already mounted?)")
	// ErrNewerFormat means the store was written by a newer ckptfs.
	ErrNewerFormat = errors.New("store was written by a newer ckptfs format version")
	// ErrNotStore means the directory exists but does not hold a ckptfs store.
	ErrNotStore = errors.New("not a ckptfs store")
)

// Errors returned when reading chunks.
var (
	// ErrCorrupt means a chunk object failed verification: a bad header, a payload
	// checksum mismatch, a decode error, a wrong length, or a hash that is not its name.
	ErrCorrupt = errors.New("chunk object is corrupt")
	// ErrMissing means a chunk the catalog names has no object file.
	ErrMissing = errors.New("chunk object is missing")
)

// BaseError is the error of reading delta chunk Chunk when its base chunk Base
// could not be read or did not verify: the base is at fault. The delta's own
// object passed its header and payload checks (they come first). It wraps the
// base's error (ErrCorrupt, ErrMissing, or an I/O error), so errors.Is finds
// the kind.
type BaseError struct {
	Chunk, Base ID
	Err         error
}

func (e *BaseError) Error() string { return fmt.Sprintf("chunk %v: base: %v", e.Chunk, e.Err) }

func (e *BaseError) Unwrap() error { return e.Err }
