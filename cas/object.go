package cas

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Object header layout (see doc.go).
const (
	objectMagic      = "CKCH"
	objectVersion    = 1
	objectHeaderSize = 24
	// maxChunkSize bounds the raw length a header may claim, so a corrupt header
	// cannot make a reader allocate gigabytes.
	maxChunkSize = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type objectHeader struct {
	codec      Codec
	rawLen     uint32
	payloadLen uint32
	crc        uint32
}

func (h objectHeader) marshal() []byte {
	b := make([]byte, objectHeaderSize)
	copy(b[0:4], objectMagic)
	b[4] = objectVersion
	b[5] = byte(h.codec)
	binary.LittleEndian.PutUint32(b[8:], h.rawLen)
	binary.LittleEndian.PutUint32(b[12:], h.payloadLen)
	binary.LittleEndian.PutUint32(b[16:], h.crc)
	return b
}

func parseObjectHeader(b []byte) (objectHeader, error) {
	var h objectHeader
	if len(b) < objectHeaderSize {
		return h, fmt.Errorf("object is %d bytes, shorter than its header", len(b))
	}
	if string(b[0:4]) != objectMagic {
		return h, fmt.Errorf("bad object magic %q", b[0:4])
	}
	if b[4] != objectVersion {
		return h, fmt.Errorf("object format version %d not supported", b[4])
	}
	h.codec = Codec(b[5])
	h.rawLen = binary.LittleEndian.Uint32(b[8:])
	h.payloadLen = binary.LittleEndian.Uint32(b[12:])
	h.crc = binary.LittleEndian.Uint32(b[16:])
	if h.rawLen > maxChunkSize {
		return h, fmt.Errorf("object claims %d raw bytes, over the %d limit", h.rawLen, maxChunkSize)
	}
	return h, nil
}

// encodeObject returns the object file bytes for raw, and its codec.
func (c *codecs) encodeObject(raw []byte, h Hint) ([]byte, Codec) {
	obj := make([]byte, objectHeaderSize, objectHeaderSize+len(raw)+64)
	codec, obj := c.appendEncoded(obj, raw, h)
	return sealObject(obj, codec, len(raw)), codec
}

// rawObject returns the object file bytes for raw stored unencoded (CodecRaw):
// what a new chunk gets when no inline encoder is free (reencode.go).
func rawObject(raw []byte) []byte {
	obj := make([]byte, objectHeaderSize, objectHeaderSize+len(raw))
	return sealObject(append(obj, raw...), CodecRaw, len(raw))
}

// sealObject writes the header of obj, whose payload (codec, decoding to
// rawLen bytes) follows the header's room, and returns obj.
func sealObject(obj []byte, codec Codec, rawLen int) []byte {
	payload := obj[objectHeaderSize:]
	hdr := objectHeader{
		codec:      codec,
		rawLen:     uint32(rawLen),
		payloadLen: uint32(len(payload)),
		crc:        crc32.Checksum(payload, castagnoli),
	}
	copy(obj, hdr.marshal())
	return obj
}

// decodeObject verifies and decodes a whole object file and checks that its
// bytes hash to id. Every failure wraps ErrCorrupt.
func (c *codecs) decodeObject(id ID, obj []byte) ([]byte, error) {
	return c.decodeObjectInto(id, obj, nil)
}

// decodeObjectInto is decodeObject into a buffer from alloc (see decodeInto).
func (c *codecs) decodeObjectInto(id ID, obj []byte, alloc func(int) []byte) ([]byte, error) {
	h, err := parseObjectHeader(obj)
	if err != nil {
		return nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	payload := obj[objectHeaderSize:]
	if uint64(len(payload)) != uint64(h.payloadLen) {
		return nil, fmt.Errorf("chunk %v: %w: payload is %d bytes, header says %d", id, ErrCorrupt, len(payload), h.payloadLen)
	}
	if crc32.Checksum(payload, castagnoli) != h.crc {
		return nil, fmt.Errorf("chunk %v: %w: payload checksum mismatch", id, ErrCorrupt)
	}
	raw, err := c.decodeInto(h.codec, payload, int(h.rawLen), alloc)
	if err != nil {
		return nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	if Sum(raw) != id {
		return nil, fmt.Errorf("chunk %v: %w: content hash does not match its name", id, ErrCorrupt)
	}
	return raw, nil
}
