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
//	deltawait  chunk ID → its plan's wait for a later version of the chunk (hint, released,
//	           fallback base and distance); see deltas.go
//	remote_chunks chunk ID → (empty): chunks known to be in the remote tier
//	holes      ino (u64 BE) → bytes in the holes of its manifest (uvarint), only when
//	           not 0: what stat's st_blocks leaves out, without reading the manifest
//	packs      pack ID → pack record (size, live chunks, their bytes); see packs.go
//	inline     chunk ID → the object of a chunk stored inline; see inline.go
//	dirorder   parent ino (u64 BE) ‖ NaturalKey(name) ‖ 0x00 ‖ name → child ino ‖ name: the
//	           directory entries again, in natural order, for PrevSibling; see dirorder.go
//	linked     parent ino (u64 BE) ‖ name → child ino ‖ time: when a rename gave the entry
//	           its name, for the remote tier's stamps; see linked.go
var (
	bucketMeta      = []byte("meta")
	bucketNodes     = []byte("nodes")
	bucketDirents   = []byte("dirents")
	bucketManifests = []byte("manifests")
	bucketChunks    = []byte("chunks")
	bucketReencode  = []byte("reencode")
	bucketHoles     = []byte("holes")
)

var allBuckets = [][]byte{bucketMeta, bucketNodes, bucketDirents, bucketManifests, bucketChunks, bucketReencode,
	bucketDeltaPlans, bucketDeltas, bucketBases, bucketPacks, bucketHoles, bucketInline, bucketDirOrder, bucketDeltaWait, bucketLinked}

// Meta keys.
var (
	keyFormat = []byte("format")
	// keyFormatAtRest is the store's format while a writable Open has
	// format at formatWAL (wal.go, "Format while open").
	keyFormatAtRest = []byte("format-at-rest")
	keyChunkSize    = []byte("chunk_size")
	keyNextIno      = []byte("next_ino")
	keyFiles        = []byte("files")
	keyDirs         = []byte("dirs")
	keyLogical      = []byte("logical_bytes")
	keyChunks       = []byte("chunks")
	keyUnique       = []byte("unique_bytes")
	keyStored       = []byte("stored_bytes")
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
// and opens with older binaries.
//
// Format 4 is format 3 holding a node with several names (a hard link;
// rows.go's record version 2): a store moves to it in the transaction that
// gives a node its second name (Tx.AddLink), because an older ckptfs would
// misread the record as damage, and its unlink of one name would delete the
// node the other names still need. Nothing else changes, so a store that
// never had a link needs no migration and stays readable by older binaries;
// a store at format 2 that gets a link goes to 4 as well (4 reads what 2 and
// 3 wrote).
//
// Format 5 is a format whose manifests may have holes (holes.go): a store
// moves to it in the transaction that puts the first manifest with a hole,
// so that an older ckptfs, which would read the file's chunks end to end and
// serve wrong bytes, refuses the store. A store at 5 may hold what any lower
// format holds, or not; one that never held a hole stays where it was. Each
// feature raises the format to at least its own number, never lowers it.
//
// Format 6 is a format holding packed chunks (packs.go): index rows naming
// a pack, which an older ckptfs would call damaged, and pack objects it
// would not know to keep. A store moves to it in the transaction that
// records its first pack.
//
// Format 7 is a format holding inline chunks (inline.go): index rows of
// record version 3, whose objects an older ckptfs would look for as files,
// find missing, and report as lost. A store moves to it in the transaction
// that indexes its first inline chunk.
//
// Format 8 is a catalog that may have a write-ahead log beside it (wal.go):
// after a crash, the bbolt file alone may name pages that never reached
// the disk, and only the log's recovery makes it whole, which an older
// ckptfs would not do. A catalog is at 8 only while open for writing (or
// left so by a crash); its own format is then kept at keyFormatAtRest, and
// a clean close puts it back.
const (
	formatSealed  = 2
	formatDeltas  = 3
	formatLinks   = 4
	formatHoles   = 5
	formatPacks   = 6
	formatInline  = 7
	formatWAL     = 8
	FormatVersion = formatWAL // the newest format this code reads and writes

	// FormatDeltas, FormatLinks and FormatHoles are the formats a store
	// holding deltas, a node with several names, or a manifest with holes
	// is at, at least.
	FormatDeltas = formatDeltas
	FormatLinks  = formatLinks
	FormatHoles  = formatHoles
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
	keyRemotePending  = []byte("remote_pending")
	bucketRemoteChunk = []byte("remote_chunks")
)
