package object

import (
	"errors"
	"fmt"
)

// ErrCorrupt means a chunk object failed verification: a bad header, a
// payload checksum mismatch, a decode error, a wrong length, or a hash that
// is not its name.
var ErrCorrupt = errors.New("chunk object is corrupt")

// BaseError is the error of reading delta chunk Chunk when its base chunk Base
// could not be read or did not verify: the base is at fault. The delta's own
// object passed its header and payload checks (they come first). It wraps the
// base's error (ErrCorrupt, or whatever the caller's BaseFunc returned: a
// missing object, an I/O error), so errors.Is finds the kind.
type BaseError struct {
	Chunk, Base ID
	Err         error
}

func (e *BaseError) Error() string { return fmt.Sprintf("chunk %v: base: %v", e.Chunk, e.Err) }

func (e *BaseError) Unwrap() error { return e.Err }
