package catalog

import "encoding/binary"

// Catalog schema: one bbolt database with these buckets.
//
//	meta       config and counters: "format", "chunk_size", "next_ino", and the stats counters
//	nodes      ino (u64 BE) → node record
//	dirents    parent ino (u64 BE) ‖ name → child ino (u64 BE)
//	manifests  ino (u64 BE) → manifest of the file's committed content
//	chunks     chunk ID → chunk record (raw length, stored length, codec)
//	reencode   chunk ID → re-encode queue record (hint, raw length); see queue.go
//	deltaplans chunk ID → base to try and distance from it; see deltas.go
//	deltas     chunk ID → base its object is a delta against, and distance
//	bases      base ID ‖ delta ID → (empty): the reverse of deltas
//	remote_chunks chunk ID → (empty): chunks known to be in the remote tier
//	packs      pack ID → pack record (size, live chunks, their bytes); see packs.go
var (
	bucketMeta      = []byte("meta")
	bucketNodes     = []byte("nodes")
	bucketDirents   = []byte("dirents")
	bucketManifests = []byte("manifests")
	bucketChunks    = []byte("chunks")
	bucketReencode  = []byte("reencode")
)

var allBuckets = [][]byte{bucketMeta, bucketNodes, bucketDirents, bucketManifests, bucketChunks, bucketReencode,
	bucketDeltaPlans, bucketDeltas, bucketBases, bucketPacks}

// Meta keys.
var (
	keyFormat    = []byte("format")
	keyChunkSize = []byte("chunk_size")
	keyNextIno   = []byte("next_ino")
	keyFiles     = []byte("files")
	keyDirs      = []byte("dirs")
	keyLogical   = []byte("logical_bytes")
	keyChunks    = []byte("chunks")
	keyUnique    = []byte("unique_bytes")
	keyStored    = []byte("stored_bytes")
	// Rows of the re-encode queue and the raw bytes of their chunks.
	keyReencodeChunks = []byte("reencode_chunks")
	keyReencodeBytes  = []byte("reencode_bytes")
)

// Catalog formats. A store with a larger number than FormatVersion is
// refused (ErrNewerFormat).
//
// Format 2 seals every record with a checksum (record.go); Open migrates a
// format-1 store. Format 3 is format 2 holding delta objects (deltas.go):
// a store moves to it in the transaction that records its first delta, so
// that an older ckptfs, which would sweep a base without knowing a delta
// needs it, refuses the store. A store that never held a delta stays at 2
// and opens with older binaries. Format 4 is format 2 or 3 holding packed
// chunks (packs.go): index rows naming a pack, which an older ckptfs would
// call damaged, and pack objects it would not know to keep. A store moves to
// it in the transaction that records its first pack.
const (
	formatSealed  = 2
	formatDeltas  = 3
	formatPacks   = 4
	FormatVersion = formatPacks // the newest format this code reads and writes

	// FormatDeltas is the first format that may hold delta rows.
	FormatDeltas = formatDeltas
)

// Reserved inode numbers. Numbers below FirstIno are never allocated, so the
// caller may use them for virtual nodes.
const (
	RootIno  uint64 = 1
	FirstIno uint64 = 16
)

func u64key(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func direntKey(parent uint64, name string) []byte {
	return append(u64key(parent), name...)
}

// Keys and bucket of the remote tier (uploads.go) and the store's identity.
// An older ckptfs ignores them.
var (
	keyStoreID        = []byte("store_id")
	keyCommitGen      = []byte("commit_gen")
	keyUploadedGen    = []byte("remote_uploaded_gen")
	keyRemoteBase     = []byte("remote_base")
	bucketRemoteChunk = []byte("remote_chunks")
)
