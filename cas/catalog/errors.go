package catalog

import "errors"

// Errors of opening a catalog.
var (
	// ErrLocked means another process has the catalog open.
	ErrLocked = errors.New("store is in use by another process (already mounted?)")
	// ErrNewerFormat means the catalog was written by a newer ckptfs.
	ErrNewerFormat = errors.New("store was written by a newer ckptfs format version")
	// ErrNotStore means the file is not a ckptfs catalog.
	ErrNotStore = errors.New("not a ckptfs store")
)
