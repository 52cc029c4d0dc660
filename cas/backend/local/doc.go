// Package local is the backend.Backend of a store's own directory: the one
// every store has, and the only one before the remote tier. Chunks keep the
// layout stores have always had, so no store needs migrating:
//
//	ROOT/ab/cd/<60 hex>    a chunk (ROOT is STORE/objects)
//	ROOT/manifests/<64 hex>
//	ROOT/locks/<name>
//	.../.tmp-*             a Put in progress, or debris of one a crash interrupted
//
// # Durability (the rules that used to live in cas/batch.go)
//
// Put writes an object under a temporary name, starts its writeback
// (sync_file_range), renames it into place and keeps its descriptor open;
// Sync then fdatasyncs many objects at once, each through the descriptor that
// wrote it, and fsyncs the directories holding them (ROOT/ab/cd, and ROOT/ab
// and ROOT until this process has once made their entries durable), so the
// filesystem groups them into a few journal commits instead of one per
// object. The rules that keep "a synced object survives a crash":
//
//   - A directory's entry in its parent is durable once the parent was
//     fsynced while the directory existed. The backend remembers, for this
//     process only, the directories a Sync made so (an existing directory
//     found at start may be a crashed process's unsynced mkdir: its parent
//     is fsynced once), and fsyncs only the object's own directory for the
//     rest. No directory is ever removed while the backend is open. A
//     small file's commit went from three directory fsyncs to one.
//   - Sync covers objects whoever Put them: one found on disk (an earlier
//     process, an in-flight Put of another caller) is opened and fdatasynced,
//     and its directories fsynced, like one this process wrote.
//   - A sync goes through the writing descriptor when the backend still holds
//     it, so a failed writeback is reported even if the inode was evicted
//     meanwhile (a fresh open would not see it). The kernel reports such a
//     failure to one fdatasync only: the backend remembers it, under a
//     per-object lock (sync, then record or check, is one step), so every
//     later Sync naming the object fails, and Stat and Get report the object
//     as absent until a Put writes it anew.
//   - A Put that replaces a file already at the name (a damaged leftover, an
//     object whose sync failed, a re-encode), or finds the descriptor budget
//     spent, fdatasyncs before its rename, as before batching: someone may
//     have found the old file and be about to name it.
//   - IfAbsent Puts publish with link(2), which fails if the name exists, so
//     of racing IfAbsent Puts one wins.
//
// After a crash an object no Sync covered may be missing, empty or torn: its
// reader verifies it (cas does, before reusing an unindexed object), and the
// collector removes it after the grace period if nothing names it.
// RemoveStale (backend.Janitor) removes old temporary files.
//
// Descriptors held until Sync are bounded (a quarter of the file limit, at
// most 8192); a caller that abandons its Puts gives them back with Forget.
// An open that finds the process out of descriptors (EMFILE, ENFILE) waits
// for one, up to MaxFDWait (OpenRetry), instead of failing a read or a
// commit: descriptors come back as requests finish.
//
// Reads use O_DIRECT where the filesystem allows: objects are read once into
// cas's decoded-chunk cache, so a page-cache copy would cost a copy, page
// allocations and memory the cache could use.
package local
