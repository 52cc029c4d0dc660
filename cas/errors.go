package cas

import (
	"errors"

	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/object"
)

// Errors returned when opening a store.
var (
	// ErrLocked means another process has the store open (it is mounted elsewhere).
	ErrLocked = catalog.ErrLocked
	// ErrNewerFormat means the store was written by a newer ckptfs.
	ErrNewerFormat = catalog.ErrNewerFormat
	// ErrNotStore means the directory exists but does not hold a ckptfs store.
	ErrNotStore = catalog.ErrNotStore
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
