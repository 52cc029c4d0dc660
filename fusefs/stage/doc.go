// Package stage holds the new content of files being written, until a
// commit cuts it into chunks: it knows the store and the chunker, not FUSE
// or the namespace (fusefs does).
//
// # Model
//
// A File is one file's staged bytes. Its caller (fusefs) changes it with
// WriteAt and Truncate, reads it back with ReadAt, and ends it with Finish,
// which returns the content's chunks, stored in a cas.Batch, and its tensor
// index (FileIndex), or with Abort, which drops it. The bytes live in one of
// two places:
//
//   - a stream, for a file written from empty, in order (torch.save,
//     safetensors, numpy and HF write so, possibly after sizing the file
//     with ftruncate): writes land in memory blocks that a goroutine cuts,
//     hashes and stores as they fill, so Finish only cuts the tail and no
//     byte is written twice. A committed file cut by content alone (no known
//     format, no holes) that is appended to gets a stream too (StageAppend):
//     it keeps the committed chunks but the last, pinned in its batch, and
//     streams from the last one's start, fed that chunk's bytes first;
//   - a spool file (cas.Store.NewSpool: unlinked at creation, in the store's
//     directory), for anything else: a write elsewhere, a truncation below
//     what was written, a read, or content that starts as a copy of the
//     committed version. Finish ingests it whole.
//
// A stream turns into a spool (Spill) when a change other than an append,
// or a read, reaches it; never the other way.
//
// # Invariants
//
//   - A File's Size is its caller's file size: every successful change
//     sets both.
//   - The chunks of a File's content are cut as a commit of the same bytes
//     through a spool would cut them (formats.Chunker: chunks start at tensor
//     starts, content-defined elsewhere): streaming is invisible in the
//     catalog. For a stream from a committed file's last chunk this holds
//     because content-defined cuts depend only on the bytes after the cut
//     before (formats.NewContentChunker), provided the committed chunks were
//     cut by this chunker; chunks an older ckptfs cut otherwise are kept as
//     they are, which changes what later versions dedupe, never the bytes. IndexFile cuts a file outside any mount the same way.
//   - Holes: the MinHole-aligned blocks of a never-written run (a spool's
//     holes, as SEEK_DATA/SEEK_HOLE report them; a stream's end past its
//     last write), and the rest of one that reaches the end, are committed as
//     holes (Result.Holes, cas.Hole), never read or hashed: Finish costs the
//     data, whatever the size. A stream and a spool given the same writes
//     give the same holes (holeIn). Each data run between holes is cut on
//     its own; only the run at offset 0 gives a tensor index.
//   - A stream's stored chunks are pinned by its batch until Finish hands
//     the batch over or Abort releases it (deleting the chunks no one else
//     names). After a Finish of a stream, the File holds nothing: the bytes
//     exist only as the batch's chunks.
//   - An error that drops the content (the store is full while streaming, a
//     Spill that cannot read its chunks back) is a *LostError (IsLost): the
//     caller must Abort the File and show the committed content again.
//
// # Concurrency
//
// A File is used by one caller at a time (fusefs holds the file's mu), but
// for concurrent ReadAts of a File that does not stream. A stream's
// goroutine takes only the stream's own lock, never its caller's, so a
// caller holding a lock may wait for it (a writer further ahead than the
// stream's window waits for the chunker). Pool is safe for concurrent use.
//
// # Costs
//
// A stream holds at most its window (StreamWindow: the chunker's lag,
// formats.MaxLag, rounded up to 4 MiB blocks, plus three blocks; about 24
// MiB with 4 MiB chunks) and the streams of a Pool together at most its
// write memory (DefaultWriteMemory, 96 MiB): a file started when that is
// spent is spooled, so parallel writers cost disk, not memory. At most a
// quarter of the process's file limit in spools are open at once (a write
// that finds none free waits up to 20 s, then fails with EMFILE), and at
// most two spooled Finishes ingest at once, each putting 16 chunks in
// parallel.
package stage
