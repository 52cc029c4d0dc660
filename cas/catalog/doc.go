// Package catalog is the store's catalog: one bbolt file (STORE/catalog.db)
// that names everything the store holds. It is the only package of ckptfs
// that imports bbolt; everything else sees typed rows through a Tx.
//
//	DB       Open, Create, View, Update, ReserveInos (db.go)
//	Tx       the namespace (nodes, directory entries), manifests, the chunk
//	         index, delta rows and the re-encode queue, read and written as
//	         typed rows (tx.go, deltas.go, queue.go)
//	Tx.Index, Tx.Queue, Tx.Deltas, Tx.Uploads
//	         the rows only the store's own bookkeeping writes: index rows of
//	         committed batches, queue rows, delta plans and rows, the remote
//	         tier's generations and uploaded chunks (index.go, queue.go,
//	         deltas.go, uploads.go)
//	Check    the walk of the file's pages before bbolt opens it (check.go)
//	log      a writable catalog's write-ahead log: a commit is one append
//	         and one fdatasync, bbolt's pages are synced at checkpoints,
//	         and Recover replays the log after a crash (wal.go)
//	tail     zeros written ahead of bbolt's high-water mark, so that commits
//	         do not allocate blocks at their fdatasync (prealloc.go)
//
// schema.go lists the buckets and keys. The catalog knows nothing of
// objects, backends or codecs: cas keeps objects and rows in step (an index
// row names only a synced object; see cas's doc).
//
// # Invariants
//
//   - Every change is one bbolt transaction (DB.Update), committed and
//     durable before Update returns (its record in the log fdatasync'd,
//     or bbolt's own fdatasyncs without a log), or rolled back whole. The
//     counters (files, directories, logical, unique and stored bytes,
//     chunks, queue rows and bytes, delta rows) are updated by the same
//     transaction that changes what they count, so reading them is O(1).
//   - Every value of the nodes, dirents, manifests, chunks, reencode,
//     deltaplans, deltas, bases and packs buckets is sealed with a CRC-32C over its
//     key and value (record.go), and decoders check lengths strictly: a
//     damaged record is an error wrapping ErrCatalogDamaged when it is read,
//     never a different record. The meta bucket is not sealed: a damaged
//     counter misstates statistics, never content.
//   - bbolt trusts its pages and panics on damaged ones, sometimes where it
//     cannot be recovered (a goroutine of its own at Open). Callers run
//     Check on the file before Open; View and Update also turn a panic
//     inside bbolt into an error wrapping ErrCatalogDamaged.
//   - One process has the catalog open for writing: bbolt's flock on the
//     file is the store's lock (ErrLocked; Locked tells a held lock from
//     damage).
//   - Formats: 2 seals records; 3 is 2 holding delta rows, entered by the
//     transaction that writes the first delta row, so an older ckptfs (which
//     would sweep a base it does not know is used) refuses the store; 4 is
//     a store holding a node with several names (hard links), entered by
//     the transaction of the first Tx.AddLink (schema.go); 5 may hold what
//     the formats below it do, and manifests with holes (holes.go: runs of
//     zeros with no chunk, record version 2), entered by the transaction
//     that puts the first manifest with a hole, so that an older ckptfs
//     (which would read the chunks end to end and serve wrong bytes)
//     refuses the store; a manifest without holes keeps the record older
//     binaries read; 6 holds packs (packs.go: pack rows, and chunk rows of
//     record version 2 naming a pack and an offset), entered by the
//     transaction that records the first pack. A
//     writable Open migrates format 1 in one transaction; a read-only Open
//     reads it as it is. A newer format than FormatVersion is refused
//     (ErrNewerFormat). Buckets added without a format bump (reencode,
//     deltaplans, deltawait, deltas, bases, remote_chunks, holes, packs, dirorder) are created by a writable
//     Open, and a missing one reads as empty.
//   - dirorder holds every directory entry again, in natural order of names
//     (dirorder.go): Link and Unlink change both rows in their transaction,
//     so Tx.PrevSibling is one seek whatever the directory's size (a
//     commit's delta-base search, issue #27). A writable Open builds it
//     from dirents when it is missing. It is a hint, never the namespace:
//     a row is checked against dirents before it is returned, so a row an
//     older ckptfs left stale is skipped, and an entry it added unindexed
//     is only not found.
//   - A node that is not a directory counts the directory entries that name
//     it (Node.Nlink; record version 2 when more than one): only AddLink
//     and DropLink change the count (PutNode keeps it), DropLink deletes
//     the node and its manifest with its last name, and the file and byte
//     counters count the node once, however many names it has.
//   - A Tx is valid only inside the function given to View or Update;
//     values it returns are copies the caller owns. Keep transactions
//     short: no network or FUSE I/O inside one.
package catalog
