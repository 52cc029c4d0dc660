package cas

import "github.com/ckptfs/ckptfs/cas/object"

// The chunk vocabulary of cas's API is package object's: these names keep
// cas's importers (fusefs, gc, cmd, test) independent of where it lives.

// IDSize is the length in bytes of a chunk ID.
const IDSize = object.IDSize

// ID names a chunk: the BLAKE3-256 hash of its raw bytes.
type ID = object.ID

// Sum returns the ID of data.
func Sum(data []byte) ID { return object.Sum(data) }

// ParseID parses the hex form of an ID.
func ParseID(s string) (ID, error) { return object.ParseID(s) }

// Codec identifies how a chunk's payload is encoded (object.Codec).
type Codec = object.Codec

// Codecs (object.CodecRaw and the others).
const (
	CodecRaw       = object.CodecRaw
	CodecZstd      = object.CodecZstd
	CodecByteGroup = object.CodecByteGroup
)

// Hint tells the encoder what a chunk holds (object.Hint).
type Hint = object.Hint

// maxChunkSize is the largest raw chunk an object may hold.
const maxChunkSize = object.MaxChunkSize
