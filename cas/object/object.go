package object

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Object header layout (see doc.go).
const (
	objectMagic      = "CKCH"
	objectVersion    = 1 // a standalone chunk
	objectVersionDel = 2 // a delta against a base chunk (delta.go)
	HeaderSize       = 24
	// deltaExtSize is the delta extension after a version-2 header:
	// base ID [32] | transform u8 | element size u8 | reserved u16 (zero).
	DeltaExtSize = 36
	// maxChunkSize bounds the raw length a header may claim, so a corrupt header
	// cannot make a reader allocate gigabytes.
	MaxChunkSize = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the parsed header of an object (and its delta extension).
type Header struct {
	Codec      Codec
	RawLen     uint32
	PayloadLen uint32 // bytes after the 24-byte header (the delta extension included)
	CRC        uint32 // CRC-32C of those bytes

	// Version-2 (delta) objects only.
	Delta     bool
	Base      ID             // the chunk this object is a delta against
	Elem      int            // element size of the delta transform
	transform deltaTransform // how the delta was taken (delta.go)
}

func (h Header) marshal() []byte {
	b := make([]byte, HeaderSize)
	copy(b[0:4], objectMagic)
	b[4] = objectVersion
	if h.Delta {
		b[4] = objectVersionDel
	}
	b[5] = byte(h.Codec)
	binary.LittleEndian.PutUint32(b[8:], h.RawLen)
	binary.LittleEndian.PutUint32(b[12:], h.PayloadLen)
	binary.LittleEndian.PutUint32(b[16:], h.CRC)
	return b
}

func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
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
		if len(b) < HeaderSize+DeltaExtSize {
			return h, fmt.Errorf("delta object is %d bytes, shorter than its header", len(b))
		}
		x := b[HeaderSize:]
		h.Delta = true
		copy(h.Base[:], x[:32])
		h.transform = deltaTransform(x[32])
		h.Elem = int(x[33])
		if binary.LittleEndian.Uint16(x[34:]) != 0 {
			return h, fmt.Errorf("delta object has non-zero reserved bytes")
		}
		op := h.transform &^ deltaClassed
		wide := h.Elem == 2 || h.Elem == 4
		switch {
		case op == deltaXOR && (wide || h.transform&deltaClassed == 0):
		case op == deltaSub && wide:
		default:
			return h, fmt.Errorf("delta object has transform %v with element size %d", h.transform, h.Elem)
		}
	default:
		return h, fmt.Errorf("object format version %d not supported", b[4])
	}
	h.Codec = Codec(b[5])
	h.RawLen = binary.LittleEndian.Uint32(b[8:])
	h.PayloadLen = binary.LittleEndian.Uint32(b[12:])
	h.CRC = binary.LittleEndian.Uint32(b[16:])
	if h.RawLen > MaxChunkSize {
		return h, fmt.Errorf("object claims %d raw bytes, over the %d limit", h.RawLen, MaxChunkSize)
	}
	return h, nil
}

// EncodeDelta returns the object file bytes (version 2) of raw coded
// as a delta against base (same length, ID baseID, which must be a standalone
// chunk); elem is the element size hint (0 when unknown). scratch holds at
// least len(raw) bytes. The caller compares the size with the standalone
// encoding and keeps the smaller.
func (c *Coder) EncodeDelta(raw, base []byte, baseID ID, elem int, scratch *DeltaScratch) []byte {
	obj := make([]byte, HeaderSize+DeltaExtSize, HeaderSize+DeltaExtSize+len(raw)/2)
	codec, t, obj := c.appendDeltaPayload(obj, raw, base, elem, scratch)
	x := obj[HeaderSize:]
	copy(x[:32], baseID[:])
	x[32] = byte(t)
	x[33] = byte(elem)
	payload := obj[HeaderSize:]
	hdr := Header{
		Codec:      codec,
		RawLen:     uint32(len(raw)),
		PayloadLen: uint32(len(payload)),
		CRC:        crc32.Checksum(payload, castagnoli),
		Delta:      true,
	}
	copy(obj, hdr.marshal())
	return obj
}

// BaseFunc returns the verified raw bytes of standalone chunk id and a
// function to call when done with them.
type BaseFunc func(id ID) (data []byte, release func(), err error)

// Encode returns the object file bytes for raw, and its codec.
func (c *Coder) Encode(raw []byte, h Hint) ([]byte, Codec) {
	obj := make([]byte, HeaderSize, HeaderSize+len(raw)+64)
	codec, obj := c.appendEncoded(obj, raw, h)
	return sealObject(obj, codec, len(raw)), codec
}

// EncodeRaw returns the object file bytes for raw stored unencoded (CodecRaw):
// what a new chunk gets when no inline encoder is free (cas's reencode.go).
func EncodeRaw(raw []byte) []byte {
	obj := make([]byte, HeaderSize, HeaderSize+len(raw))
	return sealObject(append(obj, raw...), CodecRaw, len(raw))
}

// sealObject writes the header of obj, whose payload (codec, decoding to
// rawLen bytes) follows the header's room, and returns obj.
func sealObject(obj []byte, codec Codec, rawLen int) []byte {
	payload := obj[HeaderSize:]
	hdr := Header{
		Codec:      codec,
		RawLen:     uint32(rawLen),
		PayloadLen: uint32(len(payload)),
		CRC:        crc32.Checksum(payload, castagnoli),
	}
	copy(obj, hdr.marshal())
	return obj
}

// Decode verifies and decodes a whole standalone object file and checks
// that its bytes hash to id. Every failure wraps ErrCorrupt; a delta object is
// one.
func (c *Coder) Decode(id ID, obj []byte) ([]byte, error) {
	return c.DecodeInto(id, obj, nil, nil)
}

// checkObject parses obj's header and checks its payload's length and
// CRC-32C. It returns the header and the payload after any delta extension.
//
// With hashed set (the caller hashes the decoded bytes against id) the CRC
// of a standalone raw payload is not computed: the payload is the raw bytes,
// all of them covered by the hash, so the CRC would only repeat the check
// (9 % of the daemon's CPU in a cold read of incompressible bytes). It stays
// wherever it covers something the hash does not: a delta's extension (its
// base) and payload, a coded payload before its decoder sees it, and every
// object decoded unhashed (DecodeBase).
func checkObject(id ID, obj []byte, hashed bool) (Header, []byte, error) {
	h, err := ParseHeader(obj)
	if err != nil {
		return h, nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	payload := obj[HeaderSize:]
	if uint64(len(payload)) != uint64(h.PayloadLen) {
		return h, nil, fmt.Errorf("chunk %v: %w: payload is %d bytes, header says %d", id, ErrCorrupt, len(payload), h.PayloadLen)
	}
	if hashed && !h.Delta && h.Codec == CodecRaw {
		return h, payload, nil
	}
	if crc32.Checksum(payload, castagnoli) != h.CRC {
		return h, nil, fmt.Errorf("chunk %v: %w: payload checksum mismatch", id, ErrCorrupt)
	}
	if h.Delta {
		payload = payload[DeltaExtSize:]
	}
	return h, payload, nil
}

// CheckCRC checks obj's header and the CRC-32C of its payload, which
// Decode and DecodeInto skip for a standalone raw object (checkObject): a
// checker of the store (fsck) calls it to find damage that no read would
// notice, such as a flipped bit in the CRC field itself.
func CheckCRC(id ID, obj []byte) error {
	_, _, err := checkObject(id, obj, false)
	return err
}

// RawInPlace returns the raw bytes of obj when it is a standalone object
// stored raw, verified against id, as a slice of obj itself (no copy: the
// caller keeps obj unchanged for as long as it uses them). ok is false
// when obj is anything else (coded, a delta, or a header that does not
// parse): decode it with DecodeInto, which reports its damage. With ok,
// err wraps ErrCorrupt when the bytes do not hash to id or their lengths
// disagree.
func RawInPlace(id ID, obj []byte) (raw []byte, ok bool, err error) {
	h, err := ParseHeader(obj)
	if err != nil || h.Delta || h.Codec != CodecRaw {
		return nil, false, nil
	}
	raw = obj[HeaderSize:len(obj):len(obj)]
	if uint64(len(raw)) != uint64(h.PayloadLen) || h.RawLen != h.PayloadLen {
		return nil, true, fmt.Errorf("chunk %v: %w: raw payload is %d bytes, header says %d and %d", id, ErrCorrupt, len(raw), h.PayloadLen, h.RawLen)
	}
	if Sum(raw) != id {
		return nil, true, fmt.Errorf("chunk %v: %w: content hash does not match its name", id, ErrCorrupt)
	}
	return raw, true, nil
}

// DecodeInto is Decode into a buffer from alloc (see decodeInto).
// A delta object (version 2) decodes only with base, which must give its base
// chunk; with base nil it is ErrCorrupt (a base must be standalone, so the
// loader of a base passes nil: that bounds a read to two objects and makes a
// cycle of bases impossible). Errors from base are returned wrapped as they
// are (ErrMissing, ErrCorrupt). A wrong base can only fail the decode or the
// hash check, with an error that errors.As finds as a *deltaFailed.
func (c *Coder) DecodeInto(id ID, obj []byte, alloc func(int) []byte, base BaseFunc) ([]byte, error) {
	h, payload, err := checkObject(id, obj, true)
	if err != nil {
		return nil, err
	}
	if h.Delta {
		if base == nil {
			return nil, fmt.Errorf("chunk %v: %w: a delta object (against %v) where a standalone chunk is required", id, ErrCorrupt, h.Base)
		}
		if h.Base == id {
			return nil, fmt.Errorf("chunk %v: %w: a delta against itself", id, ErrCorrupt)
		}
		return c.decodeDelta(id, h, payload, alloc, base)
	}
	raw, err := c.decodeInto(h.Codec, payload, int(h.RawLen), alloc)
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
// wrong chunk: a base loaded for a delta is not verified on its own, cas's doc.go;
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

// FailedDelta reports whether err is the error of a delta object that did
// not decode against its base, or whose result did not hash to its name
// (the delta or its base is damaged), and if so the base it was read
// against. A caller that read the base unverified (DecodeBase) can read it
// again, verified, to tell which of the two is at fault.
func FailedDelta(err error) (base ID, ok bool) {
	var e *deltaFailed
	if errors.As(err, &e) {
		return e.base, true
	}
	return ID{}, false
}

// DecodeBase checks and decodes standalone object obj of chunk id, the
// base of a delta being read, into a buffer from alloc, without hashing the
// result: the header, the CRC-32C of the payload and the decode are checked
// as for any object, and the delta's own result is hashed against the
// delta's name, so a base that is not chunk id can only fail that read
// (cas's doc.go, "Delta objects"). The bytes must never be given to anything else:
// not to the cache, not to a reader.
func (c *Coder) DecodeBase(id ID, obj []byte, alloc func(int) []byte) ([]byte, error) {
	h, payload, err := checkObject(id, obj, false)
	if err != nil {
		return nil, err
	}
	if h.Delta {
		return nil, fmt.Errorf("chunk %v: %w: a delta object (against %v) where a standalone chunk is required", id, ErrCorrupt, h.Base)
	}
	raw, err := c.decodeInto(h.Codec, payload, int(h.RawLen), alloc)
	if err != nil {
		return nil, fmt.Errorf("chunk %v: %w: %v", id, ErrCorrupt, err)
	}
	return raw, nil
}

// decodeDelta decodes the payload of delta object id (after the extension),
// undoes the delta against the base from base, and checks the result's hash.
func (c *Coder) decodeDelta(id ID, h Header, payload []byte, alloc func(int) []byte, base BaseFunc) ([]byte, error) {
	bd, release, err := base(h.Base)
	if err != nil {
		return nil, &BaseError{Chunk: id, Base: h.Base, Err: err}
	}
	defer release()
	if len(bd) != int(h.RawLen) {
		return nil, &deltaFailed{id, h.Base, fmt.Sprintf("the base is %d bytes, the delta %d", len(bd), h.RawLen)}
	}
	op := h.transform &^ deltaClassed
	var raw []byte
	if h.transform&deltaClassed == 0 {
		raw, err = c.decodeInto(h.Codec, payload, int(h.RawLen), alloc)
		if err == nil {
			undoDelta(op, h.Elem, raw, bd)
		}
	} else {
		if alloc == nil {
			raw = make([]byte, h.RawLen)
		} else {
			raw = alloc(int(h.RawLen))
		}
		perm, _ := c.permBufs.Get().(*[]byte)
		if perm == nil {
			perm = new([]byte)
		}
		*perm = growBuf(*perm, len(raw))
		err = c.decodeClassed(raw, payload, bd, op, h.Elem, *perm)
		c.permBufs.Put(perm)
	}
	if err != nil {
		return nil, &deltaFailed{id, h.Base, err.Error()}
	}
	if Sum(raw) != id {
		return nil, &deltaFailed{id, h.Base, "content hash does not match its name"}
	}
	return raw, nil
}
