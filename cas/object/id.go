package object

import (
	"encoding/hex"
	"fmt"

	"github.com/zeebo/blake3"
)

// IDSize is the length in bytes of a chunk ID.
const IDSize = 32

// ID names a chunk: the BLAKE3-256 hash of its raw bytes.
type ID [IDSize]byte

// Sum returns the ID of data.
func Sum(data []byte) ID {
	return ID(blake3.Sum256(data))
}

// String returns the lower-case hex form of id.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// ParseID parses the hex form of an ID.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, fmt.Errorf("parse chunk id %q: want %d hex digits", s, 2*IDSize)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("parse chunk id %q: %w", s, err)
	}
	return id, nil
}
