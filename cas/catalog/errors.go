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

// ErrTooManyLinks means a node has MaxLinks names already (EMLINK).
var ErrTooManyLinks = errors.New("too many links")

// MaxLinks is the most names a node may have: ext4's limit.
const MaxLinks = 65000
