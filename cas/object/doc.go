// Package object is the pure half of the chunk store: it turns a chunk's raw
// bytes into the bytes of its object file and back, and does nothing else.
// It performs no I/O and keeps no state beyond its codecs' scratch: where an
// object is kept, which chunks exist and which chunk a delta is taken
// against are cas's business (and cas/catalog's, cas/backend's).
//
//	Encode(raw, hint)          → a standalone object (the best codec for raw)
//	EncodeRaw(raw)             → a standalone object stored unencoded
//	EncodeDelta(raw, base, …)  → a delta object against base
//	Decode(id, obj)            → raw, verified against id
//	DecodeInto(id, obj, alloc, base) → raw of a standalone or delta object
//
// # Identity
//
// A chunk ID is the BLAKE3-256 of the chunk's raw (decoded) bytes, so the same
// bytes stored under two codecs, or as a delta, are one chunk.
//
// # Object layout
//
// An object is a 24-byte header followed by the encoded payload:
//
//	magic "CKCH" | version u8 | codec u8 | flags u16 | raw length u32 |
//	payload length u32 | CRC-32C of the payload u32 | reserved u32
//
// all little-endian. Version 1 is a standalone chunk. Version 2 is a delta
// against a base chunk: the header (flags and reserved zero), then a 36-byte
// extension
//
//	base ID [32] | transform u8 | element size u8 | reserved u16 (zero)
//
// then the payload; the header's payload length and CRC-32C cover extension
// and payload. The transform is XOR or the ULP difference, optionally with
// exponent classes (delta.go); the payload is the transformed bytes under a
// codec.
//
// Codecs (codec.go): 0 raw, 1 zstd, 2 byte grouping (bytegroup.go, with its
// own Huffman coder, bytegroup_huff.go). The hot loops of byte grouping and
// of undoing a delta have SSE2 versions on amd64 (*_amd64.s); the purego
// build tag, or another architecture, selects the Go versions (*_noasm.go),
// which the tests compare with the assembly.
//
// # Invariants
//
//   - A Codec value, an object version and a delta transform never change
//     meaning once written: old objects stay decodable forever.
//   - Decoding never returns wrong bytes: the payload's CRC-32C is checked
//     first (except for a standalone raw object decoded with its hash
//     checked: its payload is the raw bytes, every one covered by the hash,
//     so the CRC repeated the check at 9 % of a cold read's CPU; CheckCRC
//     checks it for fsck), the decode writes into a buffer of exactly the header's raw
//     length (at most MaxChunkSize, so a corrupt header cannot make a reader
//     allocate gigabytes), and the result is hashed against the chunk's ID.
//     Every failure wraps ErrCorrupt. The one exception is DecodeBase, which
//     does not hash: its bytes may only serve as the base of a delta whose
//     own result is hashed (cas's read path), never be returned to a reader.
//   - A base must be standalone: DecodeInto with base nil refuses a delta
//     object, and a BaseFunc is expected to give standalone chunks, so a read
//     touches at most two objects and a cycle of bases cannot loop.
//   - A wrong or damaged base can only fail a delta's decode: the error is a
//     *BaseError when the BaseFunc failed, and FailedDelta finds the base
//     when the delta did not decode or hash against it.
//   - A Coder is safe for concurrent use; a DeltaScratch is used by one
//     goroutine at a time.
package object
