// Package remote is the write side of a store's remote tier: a second
// backend, a bucket, which a store's committed files are written back to
// in the background and which stores on other machines read lazily. Any
// number of writer mounts (different stores, different hosts) and readers
// share one prefix. Its read side is not here: the store's objects are a
// cas/backend/tiered backend with the same bucket behind them, and cas
// fetches through it. This package works over cas's exported API only.
//
// # What it does
//
//   - Join: starts a writer session (its lease, the store's upload
//     records checked against the bucket, a first round before the
//     namespace is served); Tier.Close ends whichever session is current.
//   - Tier.UploadRound: a writer's round: read what every session
//     published, publish this store's changes, apply the others'. The
//     daemon runs one after commits and every refresh interval; ckptfs sync
//     runs one (forced).
//   - Tier.ApplyPublished, Tier.Refresh: a reader's round (no writes to the
//     bucket).
//   - Tier.Collect: the bucket's garbage collection, by a writer's gc:
//     at once when no other writer is live, else in two phases (step 8).
//   - Tier.VerifyObject: fsck of a chunk in the bucket.
//
// # Objects
//
// In a bucket prefix (names from cas/backend: chunks/…, manifests/…,
// locks/…):
//
//	chunks/<id>               one chunk object, as the store holds it: standalone, or a
//	                          delta whose header names its base; put-if-absent (dedup
//	                          across writers)
//	manifests/<h>             a state (Snapshot, JSON): every path a session knows of, each with
//	                          its version's stamp and origin session, removed paths as tombstones;
//	                          named by the BLAKE3 of its bytes; a path per name, so a
//	                          file with several names (hard links) is that many entries
//	                          with the same manifest, and a store that applies it makes
//	                          them separate files (same bytes): a merge never changes a
//	                          node that has other names (the path gets a node of its own)
//	locks/session.<s>         session s's lease: host, pid, store, lease length; rewritten
//	                          (If-Match) every lease/6; deleted by s at close or by a fencer
//	locks/log.<s>.<seq>       session s's log, create-only (If-None-Match: *), seq 1, 2, …:
//	                          "state" (names a snapshot), "fence" (written by another session,
//	                          or by s itself on a lapsed lease: s publishes nothing more), "close"
//	locks/checkpoint          the logs compacted: a snapshot of their merged state and, per
//	                          session, the last entry it folds; replaced with If-Match only
//	locks/gc                  a collection runs (create-only)
//	locks/trash.<id>          a trash list (create-only, never changed): the chunk objects a
//	                          collection beside live writers found unnamed and older than
//	                          its grace cutoff, its session, host, pid and time; deleted
//	                          by the collection that purges it
//
// The first format (one writer: locks/writer, locks/head, locks/log.<seq>)
// is read as one more state, stamped zero, until a checkpoint replaces it.
//
// The prefix may be empty (s3://BUCKET: the bucket root). This package
// lists only chunks/ and locks/ and deletes only what it named itself from
// those listings (chunk objects, trash lists, log entries, leases,
// locks/gc), through the backend's handles, which are confined to the
// prefix's own key shapes (cas/backend/s3, "The bucket root"): another
// tool's keys at the root and the keys of ckptfs stores nested under any
// prefix (s3://BUCKET/other/) are never collected.
//
// # Which version wins
//
// Every path of a state carries a Stamp (hybrid logical clock: wall-clock
// nanoseconds and a counter) and the session that made the version. Merging
// states keeps, per path, the version with the later stamp, equal stamps
// ordered by session ID: a commutative, associative, idempotent merge, so
// every reader of the same entries sees the same namespace, whatever the
// order it read them in, and a version is always whole (a path's version is
// one manifest, never a mix). A change's stamp is its commit time (the
// local record's ctime, or when a rename gave the path or a directory
// above it its name, if later: catalog/linked.go; now for a removal;
// never the directory's ctime, which every entry added beside the path
// moves), but always after the stamp of
// the version the store had when it made the change: a change made after
// seeing a version beats it, whatever the clocks; of two concurrent changes
// the later commit wins (clocks of hosts skewed by d give the faster one d
// of advantage). A removal is a tombstone with a stamp, so an unlink or a
// rename (a tombstone and a new path) applies everywhere; a live path
// whose directory was removed concurrently brings the directory back (a
// committed file is never hidden by an rmdir); a path below something that
// is not a directory is hidden. Tombstones are kept (the checkpoint too).
//
// The loser of a concurrent change: its round published, then found a
// later version won one of its paths. The round finishes (the mount now
// shows the winner) and returns ErrSuperseded naming the paths and the
// winning session, so its ckptfs sync fails: the loser's version is never
// reported as the current one. A later sync returns 0.
//
// # The protocol
//
// The model is Delta Lake's and Iceberg's commit by a create-only put of
// the next log entry, one log per writer session (as Delta Lake's
// per-writer commit files do before a checkpoint), with SlateDB's fencing
// of a writer by an entry that takes its next seq.
//
//  1. Lease. A session has a random ID (a copied store, a second process,
//     a remount: each a new session). It puts locks/session.<id>
//     (create-only) and rewrites it every lease/6 with If-Match; only it
//     writes that object, so a changed tag is its own renewal whose answer
//     was lost. It may publish only until a quarter lease before (start of
//     its last successful renewal + lease). Invariant: a session that finds
//     its validity lapsed (a pause, a bucket out of reach) fences its own
//     log before anything else, and never renews again.
//  2. Join. Wait while locks/gc exists (until it is gone, or unchanged for
//     a lease by this host's clock: a collector bounds its deletes by its
//     lease). Then keep the store's records of uploaded chunks only for
//     chunks a listing of the bucket shows, adding records for those it
//     shows. Invariant: the session's first round re-uploads exactly what
//     the bucket lacks, including anything a collection deleted while the
//     store was away.
//  3. Read. List locks/; read the checkpoint and its snapshot; for every
//     session, its newest entries (cached: entries and snapshots never
//     change) back to its newest "state" entry after what the checkpoint
//     folds, and that snapshot. Merge them. Invariant: every state any
//     session published and that was not superseded by its own later state
//     is in the merge, so nothing published is hidden; the cost is one
//     listing, the checkpoint, and one snapshot per session that published
//     since (O(files) after a compaction, never O(history)).
//  4. Round (writer). Walk the namespace in one read transaction. A path
//     is this store's own change when its local version differs from the
//     state the store last agreed with (mine), from the merged state, and
//     from the local version a round could not replace (a file open here);
//     mine first takes the versions the merge holds that this store
//     published itself (a round whose entry was put but whose answer was
//     lost left them out of mine): this session's, and those of the
//     store's pending snapshot, which a round records in the catalog
//     before it puts an entry and clears once a round has merged the world
//     (so a session fenced, or a daemon killed, after a lost answer leaves
//     the next session of the store the record). Invariant: a change is
//     always stamped after the version the store had, and a removal after
//     a lost answer is seen as one.
//     next = merge(read, mine, own changes). If there are own changes: put
//     every chunk of their files not recorded as uploaded (put-if-absent;
//     a delta after its base, see below), then next as a snapshot, then a "state" entry naming it at the
//     session's next seq, create-only. An entry found there is this
//     session's own (a lost answer: step over it) or a fence (the session
//     is fenced for good; the round fails naming who and why). Then apply
//     next's namespace to the store (through fusefs.ApplyRemote when
//     served: each path changes only if its record is still the one walked
//     and no open or staged file is at or below it; the kernel is told to
//     forget the entries; an applied record's ctime is its version's stamp).
//     mine = next, and the store's base is next's snapshot (one that
//     applied changes and published nothing puts next as a snapshot object,
//     no entry), so a remount never takes what the store applied for a
//     change of its own. A round with no own change checks instead that
//     the session's next seq holds no fence (or publishes next, to
//     acknowledge a trash list: step 8, which also says which own files
//     a round holds back). Invariant: every
//     chunk a snapshot names is in the bucket before the snapshot, and the
//     snapshot before the entry naming it, so a reader that finds an entry
//     can read every byte it names; a round that returns nil (or
//     ErrSuperseded) leaves an entry from which a fresh reader sees this
//     store's namespace (but for paths others changed later).
//  5. Fence. A writer's round (and gc) remembers each other live session's
//     lease ModTime and when, by its own monotonic clock, it first saw it;
//     unchanged for the session's whole lease, it puts a "fence" entry at
//     that session's last seq + 1 (create-only; an entry appended there
//     meanwhile moves the fence on) and deletes its lease. Invariant: a
//     fenced session can never append again (its next seq is taken), with
//     no assumption about clocks or pauses; whatever it published before
//     the fence stays published. The fenced mount's next round fails once
//     with ErrFenced naming why; the round after rejoins as a new session
//     (steps 1 and 2), which publishes the store's changes again. A forced
//     round (sync) reports a fence that happened since the last sync even
//     when a background round rejoined meanwhile.
//  6. Checkpoint. A writer whose read merged more than four session states
//     or listed more than 64 entries puts the merged state as a snapshot and
//     replaces locks/checkpoint (If-Match the tag read; create-only if none)
//     with it and, per session, the entry it folds; then deletes the
//     folded entries but each session's last. Invariant: the checkpoint
//     only grows (If-Match on the one read, which folds no more than the
//     read), and a session's last entry stays, so a fence always lands
//     after it.
//  7. Readers take no lease and write nothing. At mount the store's
//     namespace becomes the merged one (new, overwritten, removed, renamed
//     paths); while mounted, the same every refresh interval.
//  8. Collection, by a valid session only, the model kopia's and restic's
//     two-phase maintenance: put locks/gc (create-only; it is the
//     collection's lease: each delete carries its deadline, the lock's put
//     + 3/4 lease; a lock that names the collector's own session, left by
//     an attempt whose put got no answer, is its own, and the session's
//     next round removes such a lock), read and fence as in steps 3 and 5. With no other
//     session that may still publish (its log ends with neither a fence
//     nor a close), delete at once as one writer always did: mark every
//     version of the checkpoint's and every session's newest state, mine,
//     the store's catalog and the open files; delete chunk objects outside
//     the mark and older than the grace period (the bases of the deltas
//     that stay, marked or young, are marked too); drop every trash list
//     (moot). Beside live sessions (which may name, in their next entry,
//     any chunk they found in the bucket) it runs in two phases:
//     (a) Purge, first: a trash list whose put is older than the grace
//     period is purged once every live session's last entry acknowledges
//     it (else ErrNotAcked, naming the sessions, and nothing is deleted:
//     a writer acknowledges within a round; a paused one is fenced after
//     a silent lease and no longer counts). Its candidates are deleted
//     unless a version of the checkpoint or of another live session's
//     newest state names them, or a winning version, mine, the catalog or
//     the open files, or an object that stays names them as its base
//     (every object but those deleted is read for its base); then the
//     list. (b) Trash: the chunk objects older than the grace cutoff that
//     no winning version names (nor mine, catalog, open files, a base of
//     what stays), and that no list holds, go into a new trash list. A
//     writer's round (step 4) that reads trash lists first forgets its
//     records of their chunks as uploaded, then never names one anew: an
//     own file that names one is held back (its path keeps its published
//     version in the state; the round returns ErrTrashed, so sync fails
//     naming the paths; the commit stays pending) and a delta whose base
//     is one goes up standalone; its state entry lists the lists it read
//     (trash_seen), and a round with no own change that reads a list its
//     last entry did not list publishes its merged state to acknowledge
//     it (so a live session's newest state is at most a round older than
//     the ack, and a removed file stops being pinned by it). Once the
//     list is purged the held files publish, their chunks uploaded again
//     (put-if-absent: absent if purged, present if kept). Invariant: a
//     session that acknowledged list X names no candidate of X that the
//     world did not already name (a version copied from the world; its
//     own files and new deltas' bases never), so the purge's read, after
//     every ack, sees every state that can name a candidate: a version
//     naming one that was not a winner at the trash's read can never win
//     again (stamps only grow), one that won since was published by a
//     session before its ack, so it is in the read. A joining session
//     waits for locks/gc (step 2), is live from its lease on (an ack
//     missing: the purge waits), and its first round reads the lists. The
//     collector's own session reads the lists inside the collection (its
//     rounds are serialised with it). Readers on an older state keep the
//     grace period: no object younger than the cutoff is a candidate, and
//     a list is purged only once it is older than the grace.
//     What it costs: a file saved between a trash and its purge with a
//     trashed chunk (the same bytes as a file removed before the grace,
//     or a commit whose publication failed for longer than the grace)
//     waits for the purge, a ckptfs gc after the grace; and its chunks
//     must still be in the store (a lazily fetched copy evicted from the
//     cache cannot be uploaded again).
//
// Write-back, not write-through: a commit stays local and bumps the commit
// generation in its own transaction; after a crash the next mount's first
// round publishes it. Rounds and collections of one Tier are serialised.
//
// # Deltas in the bucket
//
// The bucket stores a chunk as the local store does: a delta object goes
// up as it is, so stored ÷ logical in the bucket is the local store's.
// That needs deltas planned at once: a mount with a remote defaults to
// --delta-latest delta, since with cas.Options.DeltaLatestWhole every
// save would go up whole while it was the latest, and stay so.
// BenchmarkBucketDeltaWorkload measures both side by side on the 20 bf16
// saves of test/delta/workload.py --steps 400 --save-from 200, a round
// after each commit: local 0.337, bucket 0.337 (0.531 when the uploader
// re-encoded every delta standalone). Through a mount (the daemon's
// rounds, versitygw), the same saves: local 0.339, bucket 0.339 (main:
// 0.655, its deferred-encoded chunks uploaded raw). Where the
// base is recorded: in the delta object's own header (cas/object: version
// 2, the base's ID), the only record that cannot disagree with the bytes.
// The states name chunks, never bases: a state that recorded bases would
// be wrong for a chunk another writer put first as another encoding
// (put-if-absent keeps the first).
//
//   - Upload: a round comes right after a commit, before the background
//     re-encoder has carried out the commit's delta plans: it carries out
//     those of the chunks it uploads first (cas.Store.ReencodeQueued), or
//     they would go up standalone for good (the bucket's objects are never
//     rewritten). Before a delta is put, its base is in the bucket:
//     recorded as uploaded (records agree with the bucket, step 2, and a
//     collection forgets a record before it deletes the object), put this
//     round, or put now (put-if-absent), whether or not a file of the
//     round names it.
//     A delta whose base is itself a delta here (never written so) goes up
//     standalone, so every delta in the bucket has depth 1. Invariant:
//     every object a published state names is readable from the bucket
//     alone, its base included (the snapshot and its entry come after
//     every chunk, step 4).
//   - Read: nothing special. A store fetching chunk X (cas's read path
//     through cas/backend/tiered) decodes a delta by reading its base the
//     way it reads any chunk, which fetches the base from the bucket when
//     it is not here; the decoded bytes are hashed against X (BLAKE3), and
//     a delta that fails is decoded again against its base verified in
//     full (fetched again once when damaged): a damaged or missing base is
//     the read's error (cas.BaseError, EIO), never other bytes.
//   - Collection: after the mark, the header of every chunk object that
//     stays (marked, or younger than the grace period) is read, and the
//     bases the deltas among them name are marked. The cost: one ranged
//     read of cas.DeltaHeaderLen bytes per kept object per collection (S3:
//     a GET with a Range; a remote without ranges: the whole object).
//   - fsck (Tier.VerifyObject): a delta in the bucket decodes against the
//     nearest copy of its base, and its base must exist in the bucket.
//
// # Not yet (issue #24)
//
// A file held back by a trash list could be rescued before the purge (a
// rescue object the purge reads after marking the list as purging, a
// Dekker-style handshake) instead of waiting for it; dropping tombstones
// and snapshots no checkpoint or log names; a per-path stamp taken at
// commit for removals (now it is the round's).
package remote
