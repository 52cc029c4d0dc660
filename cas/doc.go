// Package cas owns ckptfs's content-addressed chunk store: chunk objects on disk,
// their codecs, the bbolt catalog that names everything, and the cache of decoded
// chunks that serves reads.
//
// # Packages
//
//	cas                 Store: the one entry for writes, reads and maintenance
//	cas/object          pure: raw bytes ⇄ object bytes (IDs, header, codecs,
//	                    byte grouping, delta kernels); no I/O
//	cas/catalog         the bbolt catalog (its only importer): Tx and every
//	                    row, the format and its migration, the page check
//	cas/backend         where objects live: Backend, and local, mem, s3;
//	                    tiered: local first, remote on a miss (a decorator)
//	cas/remote          the remote tier's write side, over cas's public API:
//	                    upload rounds, published snapshots, the bucket's
//	                    collection, the writer's lock
//	cas/internal/fsutil directory fsync and descriptor wait, shared with local
//	cas/internal/faults fault injection points for the power-loss tests
//	cas/internal/tensortest  synthetic tensors for the tests of cas and object
//
// # Layout
//
//	STORE/
//	  catalog.db            bbolt: namespace, manifests, chunk index, config, counters
//	  objects/ab/cd/<rest>  one chunk per file, named by the BLAKE3-256 hex of its raw bytes
//	  objects/packs/<hex>   packs: the objects of many small chunks back to back (below)
//	  spool/                bytes of files being written (owned by the caller; emptied at Open)
//
// # Where objects live
//
// Chunk objects are kept by a backend.Backend (package cas/backend) that
// the caller gives in Options.Objects: the store's objects/ directory
// (cas/backend/local, the layout above: local.New(ObjectsDir(dir), ...)),
// or a mem backend in tests. cas imports no concrete backend. That was a
// decision between three ways to drop the old default (nil meaning
// objects/): a registry that local fills in its init (mutable package
// state, and a store that fails at run time in a binary that forgot the
// import), an interface cas would call to make the default (someone must
// still pass it), or the caller choosing. The caller chooses: the command
// line does it once (cmd/ckptfs's openStore), and composes the remote
// tier's tiered backend there too. The two file-system helpers cas shared with local (a directory
// fsync, and waiting for a file descriptor when the process has none) live
// in cas/internal/fsutil, used by both.
//
// cas is the only package that names objects: fusefs and gc see chunk
// IDs, WalkObjects, VerifyObject, Sweep and RemoveStale, never paths. The
// backend owns the file-level half of durability (temporary names, renames,
// grouped fdatasyncs through the writing descriptors, directory fsyncs,
// sticky sync failures); cas owns the catalog half. The two meet in
// Store.Commit, the one way to commit a batch: Sync the batch's objects,
// then one transaction that indexes them and runs the caller's changes, then
// release the batch's pins, in that order whatever fails. Store.CommitGroup
// does the same for commits that share one transaction with the concurrent
// commits of the store (group.go: one catalog flush for all the
// commits that queued while the previous transaction was being flushed, or
// that said they were coming; the caller's lock may be released during the
// flush: FlushUnlocker).
//
// A store may also have a remote tier (an S3-compatible bucket). cas knows
// only its read side, and only as a backend: Options.Objects is then a
// backend.Tier (cas/backend/tiered), whose Get fetches a chunk missing
// locally from the bucket and keeps a copy. cas verifies every object it
// reads, fetched or not (decode checks the BLAKE3 of the raw bytes); a
// damaged object that the index does not name (so a copy the tier fetched,
// never one this store committed) is fetched again through Tier.Refetch,
// and dropped (Tier.Drop) when the fresh copy is damaged too: the read
// fails with ErrCorrupt naming the bucket, never with wrong bytes. The
// tier's evictions go through the store (discardFetched), which leaves
// alone copies that a commit in flight pinned. The write side (upload
// rounds, snapshots, collection, the writer's lock) is cas/remote, which
// uses only this package's exported API; its doc states the protocol.
//
// Loads honour their context: a chunk load runs once for all its concurrent
// readers, detached from any one reader's cancellation, and each reader
// waits for it or for its own context, so an interrupted FUSE read of a slow
// object returns at once without failing the others.
//
// A chunk object is a 24-byte header followed by the encoded payload
// (cas/object's doc has the layout). The chunk ID is the BLAKE3-256 of the
// raw (decoded) bytes, so the same bytes stored under two codecs are still
// one chunk.
//
// # Invariants
//
//   - A published object file is never modified in place: objects are written
//     under a temporary name and renamed into place; Store.Commit's Sync
//     fdatasyncs them and fsyncs their directories before any catalog row may
//     name them (many at once, so that the filesystem groups them into few
//     journal commits; cas/backend/local has the rules). An object on disk that no row names may
//     therefore be unsynced, or damaged by a crash: it is verified before it
//     is reused, and collected after the grace period otherwise. Objects of
//     a batch released without a commit (a write that failed on a full disk,
//     or was abandoned) do not wait for that: Release deletes those no row
//     names and no other batch pins (sweep.go, discardUnnamed), so a failed
//     save does not keep the disk full. The
//     one replacement is a re-encode (below): a file holding the same raw
//     bytes under another codec, fdatasync'd before its rename over the old
//     name, so a reader gets one whole, verifiable version or the other.
//   - The store's own layout is durable before anything depends on it
//     (durable.go): a new catalog is built under catalog.db.new, committed,
//     renamed into place and the store directory fsync'd (the store
//     directory's parent too, when Open created it), and every Open fsyncs
//     the store directory after making sure objects/ exists. A power loss
//     therefore never takes away the catalog.db or objects/ entry of a store
//     whose commits it kept, and one during creation leaves no catalog (the
//     next Open creates it, clearing what the creation left) or a whole one.
//     The power-loss suite (test/powerloss_test.go) checks these rules.
//   - The catalog is only changed in one bbolt transaction per operation
//     (Store.Update); a file commit puts its new chunk index rows, its manifest and its
//     namespace change in the same transaction (Store.Commit), after the
//     batch's Sync returned.
//   - Reads never return wrong bytes: ReadChunk checks the payload CRC, decodes into
//     a buffer of exactly the recorded raw length, and checks that the BLAKE3 of the
//     result is the chunk's ID. Any mismatch is ErrCorrupt.
//   - There is no per-chunk reference count (it dominated save latency in the seed
//     project); garbage collection marks from manifests.
//   - The store is opened by one process at a time: bbolt's exclusive flock on
//     catalog.db is the store lock (ErrLocked when another process holds it).
//   - An object is read by name and decoded from what its own header says; the
//     index row's stored length and codec are statistics, and may lag the
//     object while a re-encode is pending (below). Never size or decode a read
//     from the index row. The one exception is a chunk in a pack (below):
//     its row says where its object lies in the pack (offset and length),
//     and the object read there is checked like any (header, CRC, BLAKE3).
//
// # Deferred encoding
//
// A save must be bounded by the FUSE path and hashing, not by the codec. The
// commit path encodes a new chunk inline only while one of
// Options.InlineEncoders slots is free (default max(1, NumCPU/2); a
// non-blocking try, so a commit does not wait for an encoder while the queue
// holds less than Options.MaxReencodeBacklog raw bytes, 1 GiB by default;
// past it, it waits, so a store written without pause keeps at most that
// much raw). A chunk that finds none is written raw (codec 0: an ordinary
// object, header and CRC included, readable at once) and queued in the
// catalog bucket "reencode" (chunk ID → hint and raw length) by the
// transaction that indexes it. The daemon drains the queue while idle, and
// while busy at a duty cycle once it holds half the bound, with
// Store.Reencode, which replaces raw objects by their encoded form (or a
// delta) when that is smaller: a group of chunks is published like any
// objects (temporary names, one grouped fdatasync and directory fsync,
// renames), then one transaction updates their index rows, the stored-bytes
// counter and the queue.
// Invariants (reencode.go has the details):
//
//   - A chunk is queued iff the row that indexed it was written for a raw
//     object stored this way; a sweep drops the queue row with the index row.
//   - ReencodeOne pins the chunk like a batch does, so a concurrent collection
//     neither deletes it underneath nor races the index update.
//   - After a crash between the rename and the transaction the object is
//     encoded while its index row still describes the raw object. That is the
//     only allowed disagreement between an index row and its object, and only
//     while the chunk is queued; the next ReencodeOne of the chunk repairs
//     the row from the object header, and fsck counts it (a re-encode under
//     way on a live mount is in the same state for a moment).
//   - The queue was added without a format bump: Open creates the bucket in an
//     older store, and an older ckptfs ignores it (raw objects are ordinary to
//     it). The one trace an older binary can leave is a queue row whose chunk it
//     swept; ReencodeOne drops such rows.
//
// # Delta objects (issue #15)
//
// Consecutive checkpoints of a run differ little, so a chunk may be stored as
// the difference from a base chunk: the same tensor range one save earlier.
// A delta object is object version 2: the header, then a 36-byte extension
// naming the base chunk and the transform, then the payload (cas/object's
// doc has the layout). The ID stays the BLAKE3 of the raw bytes, so dedup is
// unchanged and a delta is verified like any chunk. The transform is XOR or
// the ULP difference (integer difference of monotone-mapped floats,
// zigzagged), optionally with exponent classes (elements regrouped by the
// base's exponent, each class coded on its own); object/delta.go has the details and
// the reasons. The encoder tries each and keeps the smallest.
//
// Who writes them (deltaplan.go has the rules and the crash argument):
// fusefs suggests, at commit, the chunk each new chunk is likely close to
// (the same tensor range in the file's previous version, or in the same file
// of the previous step directory); the commit turns a suggestion into a plan
// against the suggestion's keyframe (catalog bucket deltaplans), and the
// deferred re-encoder carries plans out, keeping a delta only when it beats
// the best standalone encoding by more than 1/32. Rows: deltas (chunk →
// base, distance) and bases (base ‖ chunk, the reverse index).
//
// Decisions:
//
//   - Depth 1: a base is always a standalone (version-1) object. The reader
//     refuses a delta where a base is required (ErrCorrupt), so a read touches
//     at most two objects and a cycle of bases cannot loop. The writer plans
//     against the suggestion's own base at distance+1 (or against the
//     suggestion while its own plan is pending: deltaplan.go), and starts a
//     new chain (a standalone keyframe) every Options.DeltaKeyframe versions
//     (default 5, chosen from measurements: DefaultDeltaKeyframe).
//   - A wrong, damaged or missing base can only fail a read (ErrCorrupt or
//     ErrMissing, EIO through the mount), never give wrong bytes: the result
//     is hashed against the ID.
//   - So a base read for a delta is not hashed on its own (its header, CRC
//     and decode are checked as for any object): it would cost a quarter
//     of a standalone chunk's read again. The unverified bytes live in a
//     pooled buffer for the one decode and never enter the decoded-chunk
//     cache or reach a reader; only verified chunks are cached. A delta
//     that fails (decode or hash) is decoded once more against its base
//     verified in full, so the error names the damaged object and a
//     damaged fetched copy of the base is fetched again (Store.decodeChunk).
//     A base that fails is the error's cause: a *BaseError (delta, base, the
//     base's error), so fsck reports the base once for all its deltas.
//   - Reading a delta costs its base's decode on top of its own, so the
//     cold read of a delta-coded file cannot be as cheap as the same file
//     standalone. Where the CPU is the bottleneck (2 cores) the ratio is
//     1 + (base decode + delta decode) ÷ (standalone read): in CPU ms per
//     MiB of bf16 through a mount, about 1 + (0.9 + 2.9) ÷ 3.1 (in cas
//     alone, without FUSE's work, the standalone read is 1.4-1.9 and the
//     ratio higher); a delta decode as cheap as the base's would still
//     give ~1.6 through the mount.
//     Where the disk is the bottleneck the floor is the object bytes read,
//     delta + base ÷ standalone (1.32 on the workload at distance 1).
//     Measured (CPU time, medians of 3: cas.BenchmarkDeltaStoreRead, and
//     test/delta/cold_read.py through a mount): 2.0-2.9 and 2.2, from
//     4.3-6.3 and 3.5 before the read path was worked on.
//   - The latest version stays whole (Options.DeltaLatestWhole, the
//     mount's default without a remote): what a resumed run reads is the
//     newest save, and it pays no base decode. A plan waits (a deltawait
//     row) until the next version is committed, which releases it into the
//     re-encode queue; the chains, bases and distances are those of eager
//     planning, one version late. Chosen over reverse deltas (older
//     versions coded against newer ones, rdiff-backup's way), which keep
//     the newest whole too but must re-code every older version whose base
//     becomes a delta, or give up depth 1. Cost: one whole version of each
//     chain until the next save (test/delta/workload.py, 20 saves: see
//     README), and a file overwritten in place releases its old version's
//     plan, re-encoding a chunk no file names any more, which the next
//     collection takes.
//     "The next version" is the next save that finds the file as its
//     previous version (fusefs: bases.go), so a waiting plan ends in one of
//     three ways, each in the transaction of the change and at the cost of
//     the file's own chunks (no scan of the catalog, no reference table):
//     (1) that save commits (Deltas.Release); (2) a rename takes the file
//     out of its run, where the run's next save would find the version
//     before it instead (`mv runs/r/0300 archive/`; fusefs's dir.go has the
//     rule): the plans are released now (Deltas.ReleaseIn), as no save
//     ever would; (3) the file's content goes (its last name removed, or
//     content committed over it): the plans of its chunks that the content
//     taking its place does not name are dropped (Deltas.Forget), so that
//     delta_waiting counts only live files' chunks and no re-encode codes
//     garbage. Dropped, not released: without a reference table the chunk
//     may still be another file's (a copy), which then keeps it whole, a
//     keyframe to its next versions, at no cost in reads. What still
//     waits is the last save of each run, finished runs included; a plan
//     an older ckptfs left waiting for a file it deleted or moved stays so
//     (Settle cannot tell which file a row belongs to), until a collection
//     sweeps its chunk or a save finds the file.
//   - A base missing locally is fetched from the remote tier like any chunk
//     and kept as a local copy; it is read unhashed like a local base, and a
//     delta that fails against it makes the base be verified in full (and a
//     damaged fetched copy fetched again).
//   - The delta's rows commit before its object is renamed into place, and
//     Sweep never deletes a chunk that a delta row names as its base, so no
//     crash or collection leaves a delta without its base; gc sweeps deltas
//     before bases. An unindexed delta object found on disk is never reused
//     by a Put (nothing would keep its base): it is rewritten standalone.
//   - Format 3: the transaction that records the first delta moves the store
//     from format 2 to 3, so an older ckptfs (which would sweep bases it
//     does not know are used) refuses it; a store that never held a delta
//     stays at 2.
//   - The remote tier holds standalone objects only: an upload re-encodes a
//     delta (the bucket's collection marks from snapshots and knows nothing
//     of bases).
//   - Measured on test/delta/workload.py through a mount (tiny GPT-2, AdamW,
//     20 saves 10 steps apart in the second half of a 400-step run;
//     test/e2e/test_delta_workload.py): stored ÷ logical bf16 0.66 → 0.34,
//     fp32 0.83 → 0.71. Depth 1 costs a third of the gain of unbounded
//     chains at the codec level; it was kept for bounded reads and simple GC.
//
// # Packs of small chunks (issue #25)
//
// A file without a tensor layout is cut by content into chunks of ~32 KiB
// (formats' Chunker). One object file each made a GiB ~32,000 opens,
// O_DIRECT reads, fdatasyncs and directory entries: a cold read ran at a tenth
// of a plain file's speed, a write at a seventh. Dedup stays at that
// granularity (chunk IDs and one index row per chunk are unchanged); only
// where the bytes live changes, as in restic's pack files and xet's xorbs.
// pack.go and packread.go have the code. Decisions:
//
//   - Which chunks: a new chunk of at most Options.PackMaxChunk raw bytes
//     (DefaultPackMaxChunk, 256 KiB: every content-defined chunk) put
//     without a hint (Hint{}: no float element size, so not the bf16, fp16
//     or fp32 tensor data that the byte-grouped codec, the background
//     re-encoder and deltas work on) is appended, as the same object an
//     object file would hold (header, payload, CRC), to its batch's pack
//     buffer. Tensor chunks stay objects of their own whatever their size
//     (whole 1 MiB chunks are large enough to be read efficiently alone;
//     small tensors keep their deltas). Negative: no packs. Each object in a
//     pack is still verified on every read: CRC, decode, BLAKE3 against the
//     chunk's name.
//   - Pack size: a batch writes its buffer out as a pack at PackTarget
//     (8 MiB) and at every Sync, so a pack holds consecutive small chunks of
//     one commit (one file, or a streaming writer's part of it).
//   - Order in a pack: file order. A commit puts a file's chunks from up to
//     16 workers at once (fusefs/stage), which finish them in no fixed order;
//     appended as they finished, a 1 GiB file's next chunk lay right after
//     the one before in 78% of cases, and 22% of steps jumped, by 220 KiB
//     on average, forward or back: a stream's 1 MiB batch read several
//     ranges, or one with gaps, and its span buffer (packread.go) fit no
//     other run. Batch.PutAt gives each chunk its offset in the file, and the
//     buffer is sorted by it as it is written out (packWriter.sortLocked: one
//     copy of 8 MiB), so that the same file's chunks follow each other in
//     98.7% of steps; the rest are pack boundaries, where a chunk that
//     finished after its neighbours' pack was written leads the next pack.
//     Where a chunk lies is the pack's to say until it is written: the
//     registry of pending chunks and the commit read it from the writer
//     (packSlot.loc), never from an offset taken at the append. Put's chunks
//     (no offset) follow, in the order put. 8 MiB: large I/O (the kernel's readahead runs through a
//     pack as through a file) while a pack that is partly dead wastes little,
//     and a batch's buffer stays small with many files written at once. The
//     buffer grows as it fills (a batch of one small file holds little), to
//     PackTarget and one object more (append's growth took it past, up to
//     10 MiB). A batch that wrote a pack keeps two buffers, one for its next
//     pack and one for the sort below, and lets them go at Release: two per
//     batch being written, outside the write memory budget of fusefs/stage,
//     so 16 layout-less files written at once hold up to 270 MiB of them.
//     Writing 1 GiB of random bytes took the daemon 3.6-3.9 CPU-seconds,
//     against 4.4-5.3 with a fresh buffer for each pack and no sort.
//   - Names: a pack is named by 32 random bytes, not by its content, so no
//     two batches ever write the same pack and a batch that gives up may
//     delete its packs without asking anyone (two concurrent commits of the
//     same new chunk each pack a copy; the index keeps the first, the other
//     is dead space in its pack).
//   - Location: the chunk's index row records the pack and the offset of its
//     object (catalog record version 2, written only for packed chunks;
//     version-1 rows read as before). A packs bucket has a row per committed
//     pack: its size, live chunks and their bytes, kept by the transactions
//     that add and delete chunk rows. The transaction that records the first
//     pack moves the store to format 6, so an older ckptfs (which would call
//     the new rows damaged and sweep packs it does not know) refuses it; a
//     store that never packed keeps its format, and older rows need no
//     migration. A read looks the chunk's row up (one bbolt read) before it
//     reads the object: by pack and offset (one pread through the page cache,
//     not O_DIRECT), else by name. A chunk of a batch not committed yet
//     (a streaming writer reading back what it cut) is found in the store's
//     registry of live batches' packs, in the buffer or the written pack.
//   - Durability: Batch.Sync writes the current pack out and fdatasyncs every
//     pack of the batch with its directory, in the same backend Sync as the
//     batch's other objects, before the commit's transaction records the
//     packs and the rows naming them. A committed file never names a pack
//     that a power loss can take away.
//   - Crash safety: a pack written by a commit that never happened is named by
//     no row. A batch released without a commit deletes its packs at once;
//     after a crash, gc's SweepPacks deletes packs without a row that are past
//     the grace period and that no live batch is writing (the check and the
//     delete are one step under the registry's lock, and a batch registers a
//     pack before its object exists, so a pack being committed is never taken).
//   - GC: a packed chunk's row goes like any other (pins and the watch set
//     protect it the same way); its pack's row counts it out, and goes with
//     its last chunk, in the same transaction, after which the sweep deletes
//     the pack's object (a crash in between leaves it to SweepPacks). Packs
//     are not rewritten: the bytes of dead chunks in a pack with live ones
//     stay until the whole pack is dead. That cost is reported, not hidden:
//     the counters pack_bytes and packed_bytes (Stats; their difference is
//     the dead space) and gc's pack_dead_bytes. A checkpoint's small chunks
//     share packs only with chunks of the same commit, so deleting whole
//     checkpoints frees whole packs; repacking is future work.
//   - fsck: a packed row is checked against its pack (the pack's object
//     there, the chunk's range inside it), and with ReadData the chunk is
//     read from its pack and verified; a flipped byte is a corrupt-chunk
//     problem naming that chunk, and its read fails with ErrCorrupt (EIO),
//     never other bytes.
//   - Re-encoding and deltas: a packed chunk is encoded before it is
//     packed, waiting for one of the Options.InlineEncoders when none is
//     free, and is never queued for the background re-encoder nor planned as
//     a delta: either would move it out of its pack (or rewrite the pack)
//     for little gain on the layout-less bytes packs hold (zstd is their
//     only codec). The cost: a save of layout-less bytes is bounded by that
//     many zstd encoders (at its fastest level, which gives up quickly on
//     incompressible bytes); tensor data, the bulk of a checkpoint, keeps
//     deferred encoding. With InlineEncoders negative (every encode
//     deferred) nothing is packed: small chunks are objects of their own,
//     stored raw and queued, as before packs. A packed chunk may be a
//     delta's base: bases are read through the same lookup.
//   - Remote tier: packs stay local. An upload reads a packed chunk's object
//     from its pack (Store.PackedObject) and uploads it as a chunk object of
//     its own (a delta as it is, its base first), so the bucket's
//     layout and its readers know nothing of packs. A read of a packed chunk
//     whose pack is missing falls back to the chunk's object by name, which
//     a tiered backend fetches from the bucket.
//   - Reads of a range: AcquireChunks reads the objects of chunks that lie
//     near each other in one pack (gaps of other objects up to 256 KiB) with
//     one read of their span (up to 16 MiB), then verifies and caches each,
//     for a prefetcher's batches. Near, not back to back: a commit packs a
//     file's chunks in the order its writers put them, several at once, so
//     consecutive chunks of a file seldom touch in a pack (runs of adjacent
//     chunks in a cold read of 1 GiB of random bytes: 3,085 of one chunk,
//     624 of two, a handful of 20 or more). A run's loads are claimed in
//     the cache before its read (a reader that wants one meanwhile waits for
//     it rather than reading it again), and run on the loading goroutine;
//     every claim is finished before any other load is waited for, so two
//     runs holding the same chunk cannot wait on each other.
//   - Raw chunks of a run, verified in place (issue #25): a chunk stored
//     raw (incompressible bytes: every chunk of a random file) is verified
//     where the run's read put it, its BLAKE3 against its name and nothing
//     else (object.RawInPlace: no CRC, which the hash covers, no decoder, no
//     copy), and cached there: the read's buffer becomes a span (cache.go,
//     spanBuf) that its raw chunks' entries share. The copy into a buffer of
//     each chunk's own was 16 % of the daemon's CPU in a cold read of 1 GiB
//     of random bytes, the CRC 9 %. Memory stays bounded by the budget: the
//     span's entries are charged its whole buffer between them (gaps and
//     headers too), evicting one evicts all, and the buffer is reused only
//     once every entry is gone and released (one handed out as a plain
//     slice, ReadChunk, leaves the buffer to the garbage collector). Only
//     when the raw chunks fill at least half of the buffer (a sparse run
//     would charge the budget for other chunks' bytes): otherwise, and for
//     coded chunks, each is copied or decoded into a buffer of its own, as
//     before. Every byte a reader gets from a span was hashed there, after
//     the read and before the entry existed; the buffer is not written
//     again while an entry or the run holds it. Measured on the 2-core
//     machine, shared (load average 15-22, so noisy), before and after
//     alternating: BenchmarkReadSmallChunks/packs-run, the process's CPU
//     for 21 cold reads of 1024 raw chunks of 32 KiB, 1.49, 1.56, 1.53 s
//     -> 1.05, 1.66, 1.04 s (medians about 71 -> 49 µs a chunk); the
//     daemon's CPU in bench.py's step 3b (1 GiB of random bytes, cold),
//     2.13, 2.68, 2.42, 2.89 s -> 2.15, 2.01, 2.60 s, its profile's copy
//     (memmove) 350 -> 70 ms and CRC 240 -> 0 ms. What is left: the FUSE
//     replies' writev and the packs' O_DIRECT preads (together about half),
//     BLAKE3, the catalog's look-ups (one transaction a batch, 5-8 %).
//   - Measured on the 2-core machine, shared (load average 17-22), so the
//     figures are noisy: BenchmarkReadSmallChunks, medians of 3, 1024
//     chunks of 32 KiB from a store opened afresh: objects of their own 534
//     µs a chunk, packs 102, packs read as one run 80. Through a mount, 1 GiB
//     of random bytes (28,774 chunks; 128 packs), daemon restarted and page
//     cache dropped, before and after in one run, medians of 3: write 55.6
//     → 17.7 s; cold read 9.26 → 8.01 s (plain 2.81 and 2.52: ratio 3.30 →
//     3.17); the daemon's CPU per chunk 220 → 149 µs. An earlier run, more
//     loaded: write 79 → 13 s, cold read 29.9 → 15.8 s. What is left of the
//     read's cost is the daemon's CPU per chunk (FUSE requests, verification,
//     copies) and how far it reads ahead, not the store's I/O.
//   - Chunks a stream has read past, or a READ covered whole (a small file
//     read; Chunk.Passed, cache.go, called by fusefs): the kernel's
//     page cache holds them, so the chunk cache lets them go first and
//     keeps at most an eighth of its budget of them; a span's entries go
//     once the stream has read past all of them. Before, a cold read of
//     1 GiB filled the whole budget (256 MiB) with fresh memory holding
//     bytes the page cache held too: the daemon ended it at 295 MiB of
//     RssAnon, having allocated 586-677 MiB; now 159-196 MiB and 239-280
//     MiB (the Go heap's garbage between collections is the rest). A lazy
//     reader's chunks (parts of 1 MiB chunks) stay cached; of a file read
//     whole, the spent share (a second read of it is the page cache's).
//     Reading 1,500 files of 16 KiB left 23 MiB
//     cached, now 8 (TestWholeFileReadsLeaveCacheRoom): a walk that reads
//     every small file of a big store no longer fills the budget (issue
//     #27's RssAnon after its reads). What it costs: a chunk passed but
//     not in the page cache any more (evicted under memory pressure, or
//     read with O_DIRECT) is read from the store again if the cache
//     needed its room meanwhile.
//
// # Inline chunks (issue #27)
//
// A file of a few KiB (a rank's shard metadata, a config, a metrics file)
// cost, besides its catalog transaction, a pack of its own: written,
// fdatasync'd with its directory before the transaction (strace of 8
// writers creating 4 KiB files: 2.2 fdatasyncs and an fsync per file).
// inline.go and catalog/inline.go have the code. Decisions:
//
//   - Which chunks: new chunks of no known element type (as packs: a
//     tensor's chunk is a delta base and a delta, which only objects can
//     be, and a file of tensors writes objects anyway), while the batch (one
//     file's commit) has put at most Options.InlineMaxChunk raw bytes
//     inline (DefaultInlineMaxChunk, 16 KiB: four bbolt pages; a larger
//     value costs every transaction that writes it, and the catalog's
//     mapped size). So a small file goes into the catalog whole, and a
//     large one adds at most 16 KiB to it (its first small chunks),
//     whatever its chunk size: a batch puts chunks before it knows its
//     file's size, so the budget is the batch's. A store with 16 KiB
//     chunks would otherwise put all its bytes in the catalog (the first
//     cut of this rule, per chunk, did: a test's catalog of 3.9 MiB of
//     chunks grew from ~100 pages to ~1,000). Negative: none.
//   - Form: the object an object file would hold (header, payload, CRC),
//     encoded at once as a new object is when one of Options.InlineEncoders
//     is free (zstd at its fastest level when that saves 1/32, else raw),
//     raw when none is, never through the re-encode queue. It was raw
//     at first ("a few KiB gain little from a codec"): wrong for the small
//     files of a checkpoint (JSON, configs, pickled metadata), and costly
//     in bbolt, where a raw 4 KiB object is larger than a page: its leaf
//     holds two to four such objects and is rewritten whole, overflow
//     pages included, by every insert next to it, and the freed multi-page
//     runs fragment the freelist, so the file grew past its free pages.
//     bench-scale's 4 KiB files (compressible) at 10⁵: catalog 624 MB raw
//     (6.2 KB a file, 5,253 free pages stranded) against 74 MB encoded; the
//     daemon's CPU per create 0.711 against 0.726 ms. Its cost shows on
//     real text: zstd of a few KiB takes 35–90 µs here, and 8 writers
//     copying 7,033 small files of a Python environment took 5.4 s (median)
//     against 5.0 s raw, for a catalog of 25.6 MB against 57 MB. Incompressible
//     bytes stay raw and cost what they did. It is never queued for re-encoding, nor planned
//     as a delta (either would move it out of the catalog), but may be a
//     delta's base. Its index row is record version 3 and its object is
//     in the catalog's inline bucket (catalog/inline.go), both written by
//     the transaction that indexes it, both deleted by the one that
//     removes the row (Index.Delete): no file, no fsync, no orphan.
//   - Verification: read through the same path as every object (one branch
//     in getObject), so header, CRC and the BLAKE3 of the raw bytes are
//     checked on every load; a mismatch is ErrCorrupt (EIO), never bytes.
//     The bbolt record is sealed as well (catalog: record.go).
//   - Dedup: a chunk is inlined only if the index does not have it, so a
//     chunk that is an object (or packed) already is not inlined again;
//     two batches inlining the same new chunk both keep it until commit,
//     and the first transaction to index it stores it (Index.AddInline
//     stores nothing for a chunk already indexed). Before its commit it
//     reads from its batch, through the registry of live batches' packs.
//   - Accounting: counters inline_chunks and inline_bytes (Stats); a sweep
//     counts an inline chunk's object among the chunks and bytes it freed;
//     gc marks and sweeps inline chunks like packed ones (by index row);
//     fsck reads and verifies each (no file read to spare).
//   - Remote tier: PackedObject returns an inline chunk's object, which the
//     uploader puts in the bucket as an object of its own.
//   - Format 7: the transaction that stores the first inline chunk moves
//     the store to 7 (raise to at least 7), so an older ckptfs, which would
//     look for the object file and report the chunk lost, refuses it.
//     Older stores read as before and take inline chunks from then on.
//   - Durability: an inline chunk is durable with the transaction that
//     indexes it, the one that commits its file: a close that returned
//     still means the file survives a power loss.
//
// # What bounds a small file's commit (issue #27, measured)
//
// With close = durable, a small file's commit is one member of a group
// transaction (group.go). Until the catalog kept a write-ahead log
// (catalog/wal.go), the transaction was paid by its page writes: bbolt
// writes each dirty node where its freelist finds room and fdatasyncs
// twice, and on this project's machines (a virtio disk, 2 cores) fdatasync
// costs about one request per separate run of pages (a 150 MB file, p50:
// 1 page 174 µs, 10 scattered pages 371 µs, 35 scattered 1.1 ms, 64
// scattered 1.33 ms, 64 contiguous 0.23 ms). A group of 8 writers' 4 KiB
// files (5.5 files a transaction on average) wrote 59 pages in 31.5
// separate runs (strace of 6,000 files): each inline object rewrites a leaf
// of up to four of them (12-20 KiB: the keys are random), plus the buckets
// every commit touches. Two fdatasyncs of that, ~0.9 ms each under load.
// Tried and measured before the log, not enough: no wait for returning
// writers, 16 KiB bbolt pages, encoded inline objects, and a read
// transaction held open so that bbolt would append instead of reusing
// scattered free pages (its free list was already fragmented: 29 runs a
// transaction instead of 31).
//
// With the log, a transaction's pages go to the page cache only (contiguous
// now: the checkpoint's pin keeps bbolt from reusing pages, so it appends),
// and the commit is one append of its rows (~19 KB for 5.5 files) inside a
// file written through in advance, and one fdatasync of it: p50 0.45 ms,
// p90 0.57 ms (strace, 1,167 of them for 6,000 files); the checkpoints'
// syncs of the catalog file, every 4 MiB of log, ≤ 8 ms each. 8 writers,
// 10⁴–2·10⁴ files, the same minute: 1,739–2,128 files/s before, 2,226–2,913
// after (+20–50 %, plain's own rate moving between 2,500 and 10,000 files/s
// on this host from one hour to the next). What is left is CPU: ~480–650 µs
// of daemon CPU a file (bbolt's commit 22 %, of it pwrite 16 %; FUSE I/O
// 17 %; allocation and GC ~15 %), on 2 cores shared with the writers and
// the kernel, against ~76 µs for FUSE's own noop floor.
//
// Measured again on 2026-11-28 (10⁵ files of 4 KiB, 8 writers, side by
// side in one run): plain 10,204 files/s, FUSE with nothing behind it
// 13,675, go-fuse's loopback fsyncing each file 5,478, ckptfs 3,288; daemon
// CPU 230–295 µs a file. The flush itself is the largest single part left:
// a test binary with the log's fdatasync left out (ckptfs_faults,
// CKPTFS_SKIP_SYNC=catalog; not durable, an upper bound) reached 5,126 and
// 4,509 files/s against 2,911 and 3,691 for the same binary with it,
// alternating, and vmstat showed the CPU 20–35 % idle during the real
// creates. Groups do not overlap: a leader holds the group (grouper.busy)
// from its first prepare through the flush to its members' Apply. Letting
// the next leader start once a group's rows were appended (a throwaway
// build: FS.flushing a count, the lead handed over in UnlockForFlush) gave
// nothing, 4,028 and 4,070 files/s against 4,045 and 4,088, alternating:
// the next group waits for the writers of the last cycle (see "Expected
// members"), and they are the ones whose flush is running. The flush is on
// every writer's path from its close to its next file, so what is left is
// its latency (0.45 ms p50 here) and the FUSE round trips around it.
//
// # Catalog damage
//
// A damaged catalog must give errors, never a panic or wrong bytes. Two
// layers (decided for #18; the store format went from 1 to 2 for the second):
//
//   - Pages: Open walks the bbolt file's B+tree (catalog/check.go) before
//     bbolt opens it, bounds-checking every page header, element and key
//     order, and refuses a damaged file with ErrCatalogDamaged naming the
//     page. bbolt trusts its pages and panics (once in a goroutine of its
//     own, while rebuilding the freelist at Open: unrecoverable) or faults
//     on them. View and Update also recover a bbolt panic into the same error.
//     The walk holds a bit a page, reads the file through in order first and
//     then walks its mapping under MADV_RANDOM (read-around on its faults
//     thrashed a 128 MiB cgroup): a mount still reads the whole catalog, and
//     bbolt's freelist rebuild walks it again (NoFreelistSync), so at 10⁶
//     small files (several GB of inline chunks) a cold mount takes minutes.
//   - Records: every value of the nodes, dirents, manifests, chunks and
//     reencode buckets is sealed with a CRC-32C over its key and value
//     (catalog/record.go), and decoders check lengths strictly, so a flipped byte is
//     an error wrapping ErrCatalogDamaged when the record is read: EIO for a
//     read through the mount, a problem fsck names. Open migrates a writable
//     format-1 store in one transaction; a read-only Open reads one as it is.
//     An older ckptfs refuses a format-2 store (ErrNewerFormat).
//
// A file's node record and its manifest are cross-checked too (fusefs: the
// manifest's size must be the node's), so a missing manifest cannot read as
// an empty file. The two meta pages are bbolt's own: a damaged newest one
// makes bbolt fall back to the other, losing the last transaction.
// Format 2 is this; the first delta written (above) moves the store to
// format 3.
//
// Counters for statistics (files, logical bytes, chunks, unique and stored bytes,
// re-encodes pending and their raw bytes) live in the catalog and are updated in
// the same transactions that change what they count, so Stats is O(1) whatever
// the store's size.
package cas
