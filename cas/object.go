package cas

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Object header layout (see doc.go).
const (
	objectMagic      = "CKCH"
	objectVersion    = 1 // a standalone chunk
	objectVersionDel = 2 // a delta against a base chunk (delta.go)
	objectHeaderSize = 24
	// deltaExtSize is the delta extension after a version-2 header:
	// base ID [32] | transform u8 | element size u8 | reserved u16 (zero).
	deltaExtSize = 36
	// maxChunkSize bounds the raw length a header may claim, so a corrupt header
	// cannot make a reader allocate gigabytes.
	maxChunkSize = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type objectHeader struct {
	codec      Codec
	rawLen     uint32
	payloadLen uint32 // bytes after the 24-byte header (the delta extension included)
	crc        uint32 // CRC-32C of those bytes

	// Version-2 (delta) objects only.
	delta     bool
	base      ID
	transform deltaTransform
	elem      int
}

func (h objectHeader) marshal() []byte {
	b := make([]byte, objectHeaderSize)
	copy(b[0:4], objectMagic)
	b[4] = objectVersion
	if h.delta {
		b[4] = objectVersionDel
	}
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
	switch b[4] {
	case objectVersion:
	case objectVersionDel:
		// Version 2 checks what version 1 ignored: no flags, zero reserved.
		if binary.LittleEndian.Uint16(b[6:]) != 0 || binary.LittleEndian.Uint32(b[20:]) != 0 {
			return h, fmt.Errorf("delta object has unknown flags")
		}
		if len(b) < objectHeaderSize+deltaExtSize {
			return h, fmt.Errorf("delta object is %d bytes, shorter than its header", len(b))
		}
		x := b[objectHeaderSize:]
		h.delta = true
		copy(h.base[:], x[:32])
		h.transform = deltaTransform(x[32])
		h.elem = int(x[33])
		if binary.LittleEndian.Uint16(x[34:]) != 0 {
			return h, fmt.Errorf("delta object has non-zero reserved bytes")
		}
		op := h.transform &^ deltaClassed
		wide := h.elem == 2 || h.elem == 4
		switch {
		case op == deltaXOR && (wide || h.transform&deltaClassed == 0):
		case op == deltaSub && wide:
		default:
			return h, fmt.Errorf("delta object has transform %v with element size %d", h.transform, h.elem)
		}
	default:
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

// encodeDeltaObject returns the object file bytes (version 2) of raw coded
// as a delta against base (same length, ID baseID, which must be a standalone
// chunk); elem is the element size hint (0 when unknown). scratch holds at
// least len(raw) bytes. The caller compares the size with the standalone
// encoding and keeps the smaller.
func (c *codecs) encodeDeltaObject(raw, base []byte, baseID ID, elem int, scratch *deltaScratch) []byte {
	obj := make([]byte, objectHeaderSize+deltaExtSize, objectHeaderSize+deltaExtSize+len(raw)/2)
	codec, t, obj := c.appendDeltaPayload(obj, raw, base, elem, scratch)
	x := obj[objectHeaderSize:]
	copy(x[:32], baseID[:])
	x[32] = byte(t)
	x[33] = byte(elem)
	payload := obj[objectHeaderSize:]
	hdr := objectHeader{
		codec:      codec,
		rawLen:     uint32(len(raw)),
		payloadLen: uint32(len(payload)),
		crc:        crc32.Checksum(payload, castagnoli),
		delta:      true,
	}
	copy(obj, hdr.marshal())
	return obj
}

// baseFunc returns the verified raw bytes of standalone chunk id and a
// function to call when done with them.
type baseFunc func(id ID) (data []byte, release func(), err error)

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

// decodeObject verifies and decodes a whole standalone object file and checks
// that its bytes hash to id. Every failure wraps ErrCorrupt; a delta object is
// one.
func (c *codecs) decodeObject(id ID, obj []byte) ([]byte, error) {
	return c.decodeObjectInto(id, obj, nil, nil)
}

// checkObject parses obj's header and checks its payload's length and
// CRC-32C. It returns the header and the payload after any delta extension.
func checkObject(id ID, obj []byte) (objectHeader, []byte, error) {
	h, err := parseObjectHeader(obj)
	if err != nil {
		return h, nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	payload := obj[objectHeaderSize:]
	if uint64(len(payload)) != uint64(h.payloadLen) {
		return h, nil, fmt.Errorf("chunk %v: %w: payload is %d bytes, header says %d", id, ErrCorrupt, len(payload), h.payloadLen)
	}
	if crc32.Checksum(payload, castagnoli) != h.crc {
		return h, nil, fmt.Errorf("chunk %v: %w: payload checksum mismatch", id, ErrCorrupt)
	}
	if h.delta {
		payload = payload[deltaExtSize:]
	}
	return h, payload, nil
}

// decodeObjectInto is decodeObject into a buffer from alloc (see decodeInto).
// A delta object (version 2) decodes only with base, which must give its base
// chunk; with base nil it is ErrCorrupt (a base must be standalone, so the
// loader of a base passes nil: that bounds a read to two objects and makes a
// cycle of bases impossible). Errors from base are returned wrapped as they
// are (ErrMissing, ErrCorrupt). A wrong base can only fail the decode or the
// hash check, with an error that errors.As finds as a *deltaFailed.
func (c *codecs) decodeObjectInto(id ID, obj []byte, alloc func(int) []byte, base baseFunc) ([]byte, error) {
	h, payload, err := checkObject(id, obj)
	if err != nil {
		return nil, err
	}
	if h.delta {
		if base == nil {
			return nil, fmt.Errorf("chunk %v: %w: a delta object (against %v) where a standalone chunk is required", id, ErrCorrupt, h.base)
		}
		if h.base == id {
			return nil, fmt.Errorf("chunk %v: %w: a delta against itself", id, ErrCorrupt)
		}
		return c.decodeDelta(id, h, payload, alloc, base)
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

// deltaFailed is the error of a delta object, sound as far as its header
// and CRC tell, that did not decode against its base, or whose result does
// not hash to its name: the delta or the base is damaged (or the base is the
// wrong chunk: a base loaded for a delta is not verified on its own, doc.go;
// and a classed delta's layout depends on the base). It is ErrCorrupt for
// errors.Is.
type deltaFailed struct {
	id, base ID
	msg      string
}

func (e *deltaFailed) Error() string {
	return fmt.Sprintf("chunk %v: %v: %s (a delta against %v)", e.id, ErrCorrupt, e.msg, e.base)
}

func (e *deltaFailed) Unwrap() error { return ErrCorrupt }

// decodeBaseInto checks and decodes standalone object obj of chunk id, the
// base of a delta being read, into a buffer from alloc, without hashing the
// result: the header, the CRC-32C of the payload and the decode are checked
// as for any object, and the delta's own result is hashed against the
// delta's name, so a base that is not chunk id can only fail that read
// (doc.go, "Delta objects"). The bytes must never be given to anything else:
// not to the cache, not to a reader.
func (c *codecs) decodeBaseInto(id ID, obj []byte, alloc func(int) []byte) ([]byte, error) {
	h, payload, err := checkObject(id, obj)
	if err != nil {
		return nil, err
	}
	if h.delta {
		return nil, fmt.Errorf("chunk %v: %w: a delta object (against %v) where a standalone chunk is required", id, ErrCorrupt, h.base)
	}
	raw, err := c.decodeInto(h.codec, payload, int(h.rawLen), alloc)
	if err != nil {
		return nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	return raw, nil
}

// decodeDelta decodes the payload of delta object id (after the extension),
// undoes the delta against the base from base, and checks the result's hash.
func (c *codecs) decodeDelta(id ID, h objectHeader, payload []byte, alloc func(int) []byte, base baseFunc) ([]byte, error) {
	bd, release, err := base(h.base)
	if err != nil {
		return nil, &BaseError{Chunk: id, Base: h.base, Err: err}
	}
	defer release()
	if len(bd) != int(h.rawLen) {
		return nil, &deltaFailed{id, h.base, fmt.Sprintf("the base is %d bytes, the delta %d", len(bd), h.rawLen)}
	}
	op := h.transform &^ deltaClassed
	var raw []byte
	if h.transform&deltaClassed == 0 {
		raw, err = c.decodeInto(h.codec, payload, int(h.rawLen), alloc)
		if err == nil {
			undoDelta(op, h.elem, raw, bd)
		}
	} else {
		if alloc == nil {
			raw = make([]byte, h.rawLen)
		} else {
			raw = alloc(int(h.rawLen))
		}
		perm, _ := c.permBufs.Get().(*[]byte)
		if perm == nil {
			perm = new([]byte)
		}
		*perm = growBuf(*perm, len(raw))
		err = c.decodeClassed(raw, payload, bd, op, h.elem, *perm)
		c.permBufs.Put(perm)
	}
	if err != nil {
		return nil, &deltaFailed{id, h.base, err.Error()}
	}
	if Sum(raw) != id {
		return nil, &deltaFailed{id, h.base, "content hash does not match its name"}
	}
	return raw, nil
}
