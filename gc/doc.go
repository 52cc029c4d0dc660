// Package gc owns garbage collection and consistency checking of a cas.Store.
//
// Collect is mark-and-sweep: it marks every chunk a committed manifest (or a
// live one handed in by the serving daemon: open files that were unlinked or
// replaced) names, then sweeps object files that are unmarked and older than
// the grace period, and index rows that no object backs. It never deletes a
// chunk that a concurrent commit has just deduplicated against: it starts a
// collection in cas (Store.BeginCollect) before reading any manifest, and the
// sweep spares chunks pinned by batches in flight or released since then (see
// cas/sweep.go). That coordination, not age, is what protects writers, so
// the grace period applies only to objects no commit ever named (no index
// row: what a crashed or abandoned writer left, kept a day for forensics);
// a chunk that was committed and is no longer referenced (its files were
// deleted or replaced) is deleted by the next collection whatever its age,
// so deleting checkpoints frees space without a flag.
// Objects of a write that failed or was abandoned (a full disk) do not wait
// for the grace either: the batch's release deletes them at once under the
// same coordination (cas.Batch.Release), so the grace only holds back what a
// crash left.
//
// Temporary object files (".tmp-*", left by a crash mid-write) are removed once
// they are an hour old, whatever the grace: a live writer renames its
// temporary file within seconds.
//
// Memory: neither Collect nor Fsck holds the catalog. They read it a record
// at a time and keep sets: the chunks marked or named (sorted IDs, 32 bytes
// a chunk: 32 MiB at 10⁶ chunks; grown in blocks and merged in place, so at
// most 1.25 times that and little garbage: sets.go), the objects seen, and
// for Fsck the inode numbers reached (a bitmap) and each object's ID and
// size. Fsck makes paths as it walks and holds only the current directory's;
// the files of a damaged chunk are found by a second walk, made only when
// there is one.
//
// Chunks stored raw and queued for re-encoding (cas: deferred encoding) need
// nothing from Collect: Sweep drops a chunk's queue row with its index row, and
// the re-encoder pins the chunk it works on, so a collection spares it.
//
// Fsck reads the catalog and the objects and reports every problem it finds in
// one run (a catalog whose pages or records do not check is reported as
// cas.ErrCatalogDamaged, naming the page or record, never a panic): dangling
// directory entries, unreachable nodes, manifests without nodes or with the
// wrong size, chunks that are not indexed or have no object, index rows whose
// object is missing or of another size (or, with ReadData, codec), inline
// objects (chunks kept in the catalog itself) without an inline index row
// ("inline-orphan": a sweep frees an inline object only through its row, so
// nothing else would), counters that disagree with what they count (the
// inline ones included), and, with ReadData, objects that do not
// decode and hash to their name. A delta whose read fails because its base's
// object is damaged or missing (cas.BaseError) is not a fault of its own: the
// base is reported once, with the number of its deltas and the files that use
// them (each of those reads EIO too). Spool leftovers are reported as notes
// (the next mount empties the spool), and so is a queue row whose chunk is
// not indexed (only an older ckptfs, which sweeps without knowing the queue,
// leaves one; this one drops the queue row in the sweep's transaction).
//
// Packs (cas: packs of small chunks) are freed whole or not at all: a pack
// goes with its last chunk's index row, and a pack no row names (a crash
// between a batch writing it and the commit that records it) goes once
// older than the grace period (cas.Store.SweepPacks), unless a live batch
// holds it. Collect's dry run predicts both from the same rows and the same
// listing (cas.Store.OrphanPacks, which SweepPacks uses), so it reports the figures
// the collection then reports (Result.FreedPacks, OrphanPacks, YoungPacks,
// PackDeadBytes); YoungPacks counts only packs no row names, never a young
// committed one. Fsck counts the packs gc frees whole as reclaimable space,
// not faults, the way it counts unreferenced objects
// (FsckResult.UnreferencedPacks: packs no row names, each also a
// "pack-orphan" note naming it, and committed packs none of whose chunks a
// file or a delta references).
//
// A re-encode renames the encoded object (after writing a delta's rows) and
// then commits the index row and drops the queue row, so an index row may
// lag its object, or a delta row stand over a standalone object, while the
// chunk is queued: on a live mount for every re-encode under way, and after
// a crash in that window until the next re-encode of the chunk. That state
// is counted (FsckResult.ReencodeInFlight: one summary line, not a note per
// chunk); without a queue row the same disagreement is a problem. Fsck reads
// the listing, the rows and the objects at different times, so before it
// calls a disagreement a problem it reads the row, the queue row and the
// object again: a re-encode that finished meanwhile is no fault.
//
// Deltas (cas: deltaplan.go): the base of a delta that a file uses is live
// though no manifest names it. Collect marks it (and reports the bases it
// kept only for deltas: Result.BasesKept), Fsck counts it as referenced
// (FsckResult.Bases, not Unreferenced), and a base is freed with the last
// of its deltas, in the same collection (deltas are swept first).
package gc
