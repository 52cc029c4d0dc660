// Package cas owns ckptfs's content-addressed chunk store: chunk objects on disk,
// their codecs, the bbolt catalog that names everything, and the cache of decoded
// chunks that serves reads.
//
// # Layout
//
//	STORE/
//	  catalog.db            bbolt: namespace, manifests, chunk index, config, counters
//	  objects/ab/cd/<rest>  one chunk per file, named by the BLAKE3-256 hex of its raw bytes
//	  spool/                bytes of files being written (owned by the caller; emptied at Open)
//
// A chunk object is a 24-byte header followed by the encoded payload:
//
//	magic "CKCH" | version u8 | codec u8 | flags u16 | raw length u32 |
//	payload length u32 | CRC-32C of the payload u32 | reserved u32
//
// all little-endian. The chunk ID is the BLAKE3-256 of the raw (decoded) bytes, so
// the same bytes stored under two codecs are still one chunk.
//
// # Invariants
//
//   - A published object file never changes: objects are written under a temporary
//     name, fdatasync'd, renamed into place, and their directory fsync'd (Batch.Sync)
//     before any catalog row may name them.
//   - The catalog is only changed in one bbolt transaction per operation
//     (Store.Update); a file commit puts its new chunk index rows, its manifest and its
//     namespace change in the same transaction, after Batch.Sync returned.
//   - Reads never return wrong bytes: ReadChunk checks the payload CRC, decodes into
//     a buffer of exactly the recorded raw length, and checks that the BLAKE3 of the
//     result is the chunk's ID. Any mismatch is ErrCorrupt.
//   - There is no per-chunk reference count (it dominated save latency in the seed
//     project); garbage collection marks from manifests.
//   - The store is opened by one process at a time: bbolt's exclusive flock on
//     catalog.db is the store lock (ErrLocked when another process holds it).
//
// Counters for statistics (files, logical bytes, chunks, unique and stored bytes) live
// in the catalog and are updated in the same transactions that change what they count,
// so Stats is O(1) whatever the store's size.
package cas
