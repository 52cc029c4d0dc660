package catalog

import "github.com/ckptfs/ckptfs/cas/object"

// The chunk vocabulary the rows use is package object's.
type (
	// ID names a chunk (object.ID).
	ID = object.ID
	// Codec is how a chunk's object is encoded (object.Codec).
	Codec = object.Codec
	// Hint tells the encoder what a chunk holds (object.Hint).
	Hint = object.Hint
)

// IDSize is the length in bytes of a chunk ID.
const IDSize = object.IDSize
