package cas

import (
	"errors"

	"github.com/ckptfs/ckptfs/cas/object"
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
	ErrCorrupt = object.ErrCorrupt
	// ErrMissing means a chunk the catalog names has no object file.
	ErrMissing = errors.New("chunk object is missing")
)

// BaseError is the error of reading delta chunk Chunk when its base chunk Base
// could not be read or did not verify (object.BaseError).
type BaseError = object.BaseError
