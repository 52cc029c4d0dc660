// Package remote is the write side of a store's remote tier: a second
// backend, a bucket, which a store's committed files are written back to
// in the background and which a store on another machine reads lazily. Its
// read side is not here: the store's objects are a cas/backend/tiered
// backend with the same bucket behind them, and cas fetches through it.
// This package works over cas's exported API only (Store.View/Update and
// the catalog's Tx, Store.StandaloneObject, Store.DecodeObject,
// Store.ReadOnly), never its internals.
//
// # What it does
//
//   - Tier.UploadRound: carries everything committed up to now to the
//     bucket (the chunks it lacks, a snapshot of the namespace, the head
//     naming it) and records the generation as uploaded. Run by the
//     daemon after commits and by ckptfs sync; Tier.Progress counts it.
//   - Tier.Snapshot (ReadSnapshot): the newest published snapshot, which a
//     reading mount imports.
//   - Tier.Collect: the bucket's garbage collection, by its writer's gc.
//   - TakeLock: the writer's lock on the bucket prefix.
//   - Tier.VerifyObject: fsck of a chunk in the bucket.
//
// # The protocol, as it is today
//
// Objects in a bucket prefix (names from cas/backend: chunks/…, manifests/…,
// locks/…):
//
//	chunks/<id>      one standalone chunk object, as cas encodes it
//	manifests/<h>    a Snapshot (JSON), named by the BLAKE3 of its bytes
//	locks/head       the newest snapshot's name, generation and time
//	locks/writer     the writer's lock record (holder, store ID, host, pid)
//
// One writer per prefix. TakeLock puts locks/writer if absent and
// rewrites it every HeartbeatInterval; a lock not rewritten for
// StaleLockAge (by the bucket's clock: its ModTime), or one naming the same
// store ID (its daemon died: the caller has the store open, so no other
// process has), is taken over. Readers take no lock.
//
// A round: read the catalog's commit generation and uploaded generation
// (tx.Uploads()); when nothing is pending it returns at once. Otherwise
// walk the namespace in one read transaction: every regular file's path,
// attributes and manifest go into the snapshot, and every chunk not in the
// catalog's remote_chunks rows is needed. Put the needed chunks (at most
// min(Connections, 32) at a time, put-if-absent: ErrExists is a dedup hit;
// a delta is re-encoded standalone first), recording them in remote_chunks
// 256 per transaction; then put the snapshot; then overwrite locks/head;
// then record the generation as uploaded.
//
// # Invariants
//
//   - Order: every chunk a snapshot names is in the bucket before the
//     snapshot, and the snapshot before the head, so a reader that sees a
//     head can read every byte it names.
//   - Write-back, not write-through: a commit stays local and bumps the
//     commit generation in its own transaction; the upload queue is that
//     generation against the uploaded one, so it is persistent for free:
//     after a crash the next mount finds generation > uploaded and uploads
//     again. A failed round uploaded some chunks (remembered) and nothing
//     else; the next round resumes.
//   - Rounds and collections are serialised (one mutex per Tier).
//   - The bucket holds standalone objects only: its collection marks from
//     snapshots and knows nothing of bases, and a reader elsewhere would
//     otherwise need two fetches.
//   - Collect deletes a chunk object only if neither the newest snapshot,
//     nor the store's catalog (committed, maybe not uploaded yet), nor a
//     file open in the daemon names it, and it is older than the grace
//     period; it forgets the chunk's remote_chunks row before deleting the
//     object, so a commit that needs the chunk again uploads it again.
//     Readers on an older snapshot are protected by the grace period only.
//
// # Limits, for later (issue #24 redesigns the protocol)
//
// A snapshot lists every file's whole manifest, so it grows with the
// store's chunks (about 100 bytes a chunk) and each round rewrites it;
// renames and deletions reach a reading mount only as the absence from the
// next snapshot, which it does not apply; the local cache of fetched
// objects is bounded within one process's life.
package remote
