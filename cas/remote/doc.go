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
//   - Join: starts a writer session (lease, join entry, merge, re-check of
//     what the bucket holds); Session.Close ends it.
//   - Tier.UploadRound: publishes everything committed (and, forced, every
//     namespace change) to the bucket. Run by the daemon after commits and
//     every few seconds, and by ckptfs sync; Tier.Progress counts it.
//   - Tier.Snapshot (ReadSnapshot), Tier.ApplyPublished: the newest
//     published namespace, which a reading mount imports or applies.
//   - Tier.Collect: the bucket's garbage collection, by a writer's gc.
//   - Tier.VerifyObject: fsck of a chunk in the bucket.
//
// # Objects
//
// In a bucket prefix (names from cas/backend: chunks/…, manifests/…,
// locks/…):
//
//	chunks/<id>       one standalone chunk object, as cas encodes it; put-if-absent
//	manifests/<h>     a Snapshot (JSON: every directory, regular file with its
//	                  manifest, and symlink), named by the BLAKE3 of its bytes;
//	                  a path per name, so a file with several names (hard
//	                  links) is that many entries with the same manifest, and
//	                  a store that applies it makes them separate files (same
//	                  bytes); a merge never changes a node that has other
//	                  names under them (the path gets a node of its own)
//	locks/log.<seq>   the log: create-only entries (If-None-Match: *), seq 1, 2, …;
//	                  each names the session that wrote it and the snapshot that
//	                  is the namespace as of it ("join" entries repeat the last)
//	locks/head        a hint for readers: the seq of an entry that exists
//	locks/writer      the lease: session nonce, store ID, store directory
//	                  (host, device, inode), host, pid, lease length
//
// # The protocol: one writer session at a time per prefix
//
// The model is Delta Lake's and Iceberg's commit by a conditional put of
// the next log entry, with SlateDB's fencing of an older writer by a newer
// one's claim: the log is the only state whose order matters, and a put
// that names the next seq can succeed for one session only.
//
//  1. Lease. A mount's writer session has a random nonce (a copied store is
//     a new session). It puts locks/writer if absent. A held lease is taken
//     over only (a) when it names this store ID and this store directory on
//     this host (its daemon died: we hold the store's flock, so no live
//     process has it), or (b) when its bucket ModTime is older than the
//     holder's lease and its tag then stays unchanged for a whole further
//     lease by our own monotonic clock; the takeover is a conditional
//     replace (If-Match on the tag read). Invariant: of two sessions racing
//     for a lease, at most one replaces it. The holder rewrites it every
//     lease/6 with If-Match; a refused rewrite fences the session.
//  2. Validity. A session may publish or collect only until a quarter lease
//     before (start of its last successful lease write + lease): whoever
//     takes over waits a whole lease after reading that write, which it read
//     after the write started. Invariant (given clock rates that differ by
//     less than a quarter and requests that land within their deadlines):
//     a session's deletes all land before another session's join.
//  3. Join. Read the tail (from the head hint, read forward until an entry
//     is absent); put a "join" entry at tail+1, create-only. Invariant:
//     after the join entry exists, no session before it can append (its next
//     seq is taken), so nothing it publishes can hide what this session
//     publishes. Then merge the tail's snapshot into the store (three-way,
//     against the snapshot the store last agreed with: the bucket's change
//     wins where the store did not change a path, the store's otherwise;
//     both changed: the store's, logged; a store last mounted read-only has
//     no changes of its own and takes the bucket's namespace whole), and
//     keep the store's records of uploaded chunks only for chunks a listing of the bucket shows, adding
//     records for those it shows: the first round re-uploads exactly what
//     the bucket lacks. All of this happens before the namespace is served.
//  4. Round. Walk the namespace in one read transaction into a snapshot;
//     put every chunk it names that is not recorded as uploaded (put-if-
//     absent; a chunk never fetched here is looked up in the bucket); put
//     the snapshot; append a "commit" entry naming it at the session's
//     last seq + 1, create-only. An entry there from another session fences
//     this one for good ("remount to rejoin"), and the round fails naming
//     that session. Then rewrite the head hint, and record the generation
//     as uploaded and the snapshot as the store's base. Invariant: every
//     chunk a snapshot names is in the bucket before the snapshot, and the
//     snapshot before the entry naming it, so a reader that finds an entry
//     can read every byte it names. A forced round (sync) whose namespace
//     equals the last published one reads the entry after the session's
//     last: absent means a fresh reader sees this namespace.
//  5. Readers take no lease. They read the tail's snapshot: O(files), never
//     O(history), since every entry names a whole snapshot (the log is its
//     own checkpoint; the head hint bounds the read-forward to entries
//     written since the hint). At mount the store's namespace becomes the
//     snapshot (new, overwritten, removed, renamed paths); while mounted,
//     new regular files are imported every few seconds.
//  6. Collection, by a valid session only: confirm that the log has no
//     entry after the session's, mark every chunk named by the tail's
//     snapshot, the store's catalog and the open files, and delete chunk
//     objects outside the mark and older than the grace period, checking the
//     session before each delete and giving each delete the session's
//     deadline. Safe with one writer at a time: the only state that names
//     chunks is the tail's snapshot and the writer's own catalog (a former
//     session's catalog is re-checked against a listing at its join, after
//     every delete of ours has landed by step 2); readers on an older
//     snapshot are protected by the grace period only.
//
// Write-back, not write-through: a commit stays local and bumps the commit
// generation in its own transaction; after a crash the next mount finds
// generation > uploaded and uploads again. Rounds and collections are
// serialised (one mutex per Tier).
//
// The bucket holds standalone objects only: its collection marks from
// snapshots and knows nothing of bases, and a reader elsewhere would
// otherwise need two fetches.
//
// # Not yet (issue #24)
//
// Several writer sessions on one prefix at once: the log already lets any
// number of sessions append (a loser of a seq re-reads, merges and tries the
// next, as in Delta Lake), but this step fences a session on any foreign
// entry; per-session logs with namespace operations instead of whole
// snapshots, compacted into checkpoints, come with it. Collection by
// mark → trash → purge after grace, under its own lease, instead of the
// timing argument of step 2. A fenced session rejoining without a remount;
// a reading mount applying removals and overwrites while mounted. Log
// entries and snapshots are never deleted (an entry is ~250 bytes; a
// snapshot ~100 bytes a chunk).
package remote
