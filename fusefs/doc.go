// Package fusefs serves a cas.Store as a FUSE filesystem: the go-fuse node tree,
// open handles, the versions and forks of a file, commit on close, and reads
// assembled from chunks. The bytes of a file being written are package
// stage's; fusefs decides when they are staged, committed or dropped.
//
// # Layout
//
// fs.go is the filesystem (FS: the store, the namespace locks, options);
// dir.go the directories and symlinks, and every namespace change; file.go a
// regular file's inode (fileNode: its committed manifest, its staged content
// as a stage.File, its attributes, its fork); handle.go an open file
// description (handle: which closes commit, and the per-open requests READ,
// WRITE, FLUSH, FSYNC, RELEASE, FALLOCATE and LSEEK, which go-fuse sends to
// the handle); commit.go the commit of a file's staged content; nodes.go the
// list of the nodes the kernel knows and the set of the files pinned in
// memory, which prune.go and pins.go keep; prefetch.go read ahead; bases.go
// delta hints; background.go re-encoding; ctl.go and manifests.go the .ckptfs
// directory; uncommitted.go the files not committed yet, for callers that
// read the namespace from the catalog (the CLI's run history); mount.go the
// mount; remote.go imports from a remote tier.
// internal/lockorder checks the lock order below.
//
// # Namespace
//
// The catalog is the namespace. A LOOKUP of a name the inode tree does not
// have reads the catalog's entry and makes a go-fuse inode for it (not
// persistent: go-fuse drops it when the kernel forgets it), with the
// catalog's inode number, so inode numbers are stable across forgetting and
// remounts; READDIR reads the catalog. The tree holds only the nodes the
// kernel knows, and files not committed yet: a new file's inode is
// persistent until its first commit puts its name in the catalog, and its
// node (in the tree) takes the place of the committed file it replaces. A
// namespace change finds the names it acts on in the tree, else in the
// catalog. mkdir, rmdir, unlink, rename, symlink, chmod, chown and utimens
// are durable when they return: each is one catalog transaction. The virtual
// directory .ckptfs (inode 2) holds stats.json (inode 3), regenerated on every
// open; nothing under it can be written (EROFS).
//
// Hard links (link.go): a file, symlink or special file may have several
// names, directory entries to one catalog node that counts them
// (cas.Node.Nlink; the catalog's AddLink and DropLink, in the transaction
// of the link, unlink or rename). In memory the count is nodeBase.nlink,
// changed holding nsMu; a link or unlink changes a file's ctime through
// fileNode.linkCtime, since namespace changes do not take file.mu (Link
// itself does, before nsMu: it must not race a fork). go-fuse keeps one
// inode per number, so every name of a node the kernel knows leads to one
// node. A file's dir and name are one of its names (nil once the name it
// knew is unlinked while others remain), for the first commit of a new
// file, a fork's commit and delta hints. A file with several names (or
// with a name it does not know) is never forked: a fork takes one name,
// so it is changed in place, as on ext4. Link of a file not committed yet
// commits it first (the catalog must hold the node the new name names), and
// of a file with a fork commits the fork, which takes the name, and links
// it. The last unlink detaches the node as before. O_TMPFILE files cannot
// be linked (ENOENT): they have no catalog record. A file with no name left
// (the last unlink while it is open, O_TMPFILE) commits nothing: its content
// stays staged for its handles, fsync answers at once, and the last handle's
// RELEASE drops it, so it leaves no chunks behind (commitLocked).
//
// FIFOs, UNIX sockets (bind) and character and block devices (mknod, mkfifo;
// special.go) are catalog records only: type, mode, rdev, owner and times.
// The kernel gives them their semantics and never sends their opens, reads
// or writes here; gc, fsck and the remote tier see no content in them.
// mknod of a regular file makes a committed empty file. A directory's link
// count is 2 plus its subdirectories (the root's counts .ckptfs): dirNode
// counts them in the catalog at its first getattr, holding nsMu so that no
// mkdir, rmdir or rename runs meanwhile, and those keep the count after.
//
// Memory: prune.go keeps what the kernel has looked up near a limit
// (WithNodeLimit, 8192 by default; `ckptfs mount` takes 8192 to 16384 from
// the memory budget; about 2 KiB of RSS each): past it, the
// daemon asks the kernel to forget the oldest nodes (FUSE_NOTIFY_PRUNE; the
// kernel keeps those in use), so the daemon's memory does not grow with the
// files a walk has seen. A file whose state is more than its catalog records is
// pinned (pinSet): open, staged or uncommitted content, a commit in flight,
// a fork. A lookup of its name finds that node, never a second one built from
// the catalog, even after go-fuse dropped it; a catalog read that may predate
// the last commit of a file unpinned meanwhile is read again. A file holds
// its manifest (chunk list) only while pinned: the next open reads it again.
//
// # Writes and commit
//
// A file's new content is staged until a commit makes it the committed
// content: its bytes are cut into chunks (formats.Chunker: tensor-aligned,
// content-defined elsewhere), new chunks are written and made durable, and the
// manifest (with the tensor index), the node record and the directory entry are
// put in one catalog transaction. Commits that arrive while another's
// transaction is being made durable share the next one
// (cas.Store.CommitGroup): each says it is coming once its stage is finished
// (cas.Batch.Committing); the first to find none in progress leads, waits up
// to 2 ms for the commits on their way, takes nsMu for the group, writes
// every queued commit's rows in one transaction, releases nsMu while the
// transaction is made durable (FS.flushing: see Locking), takes it again,
// then applies their in-memory changes (persisted, manifest, not dirty), then
// puts each committed fork in its origin's place (which may wait for a rename,
// releasing nsMu: so after every member's changes). A file's close returns
// once the transaction holding its rows has committed, as before; the rows of
// a file's first commit include its directory's record, whose mtime and ctime
// Create changed in memory only. A file written from empty in order (the way
// torch.save, safetensors, numpy and HF write) is staged in a stream
// (package stage): writes land in memory blocks that are chunked, hashed and stored
// as they fill, so the commit only finishes the tail and no byte is written
// twice. Any other change (a write elsewhere, a truncation below what was
// written, a read of the staged bytes, a change to a committed file that keeps
// some of its content) stages the content in a spool file (STORE/spool,
// unlinked at creation), ingested whole at commit; a stream turns into a spool
// when such a change reaches it. A stream whose chunks cannot be stored (the
// store is full) cannot be committed: the file reverts to its committed
// content, and the write, close or fsync reports the error.
//
// What commits: the close (FLUSH) of a descriptor by a process that changed the
// file through it, or that opened it if nothing was changed (handle.go: a forked
// child closing its inherited copies at exec must not commit a file its parent
// is half-way through); fsync; and the RELEASE of the last writer. Only then
// does close(2) return, and commit errors surface from close or fsync (the
// kernel ignores RELEASE's result). A truncate by path commits before it
// returns, unless a writer's close is to commit it: open(O_TRUNC)'s (no
// FLUSH has reached its OPEN's handle yet), or that of a writer with changes
// staged; a writer that has closed, but whose RELEASE has not come yet, does
// not hold it back (file.go, Setattr). With WithAsyncCommit, close returns first
// and fsync waits. RELEASE comes after close(2) has returned, so another
// writer may have opened the file since: a RELEASE commits only if, holding
// the file's lock, no other handle that may write has it open (else it
// would commit that writer's half-written content, and a failure of that
// commit could only be logged). A commit that fails once the staged bytes
// exist only in the store (a stream's) reverts the file to its committed
// content; until the file is truncated to nothing or its writers have all
// closed, every fsync and committing close of it reports that failure,
// whichever request's commit it was: one that finds nothing left to commit
// never reports success for bytes that were dropped. A crash before the commit leaves the previous version (or no
// file, if it was new): a file created or renamed into place before its first
// commit is kept out of the catalog, and a committed file it replaced by rename
// (the "shadow") stays in the catalog until the replacing file commits.
//
// Memory: a stream holds at most its window (about 24 MiB: the chunker's lag,
// formats.MaxLag, plus two blocks) and streams together at most the write
// memory budget (WithWriteMemory, 96 MiB by default); a file started while
// the budget is spent is staged in a spool instead, so parallel writers cost
// disk, not memory. Spooled commits ingest at most maxSpoolIngests at a time.
//
// Write handles use FOPEN_DIRECT_IO (no page-cache copy; 1 MiB requests), so the
// kernel does not clear setuid/setgid on their writes: Write does it, as ext4
// does, for a caller without CAP_FSETID (file.go, killPriv). Writing
// to a committed file first copies its committed content into a spool unless the
// first change is a truncation to zero (open with O_TRUNC), which is the common case,
// or a write at its end to a file of no known format (logs, CSVs, TensorBoard's
// event files, which reopen the file at each flush): that streams from the
// file's last chunk and keeps the chunks before it (stage.Pool.StageAppend), so
// an append costs that chunk and the new bytes, not the file (10 MB log, 50
// open-append-close rounds, each a durable commit: 26-32 ms each before, 1.4-1.5
// ms now).
//
// # Shared writable mappings
//
// The mount negotiates FUSE_DIRECT_IO_ALLOW_MMAP, so that write handles can
// be mapped MAP_SHARED (SQLite's WAL index, numpy's open_memmap and
// memmap(mode="r+")); without it the kernel refuses with ENODEV. Such a
// mapping goes through the kernel's page cache (its faults read the staged
// content through the handle), and its dirty pages come back as WRITEs
// flagged FUSE_WRITE_CACHE when the kernel writes them back: at msync(MS_SYNC),
// which then sends FSYNC; at munmap; at close(2), before its FLUSH; and
// whenever the kernel's flusher runs (dirty pages older than 30 s by
// default). They are staged like any write and commit only as other writes
// do: msync(MS_SYNC) commits (its FSYNC), and so does the close after
// munmap. A mapping that outlives its last descriptor (numpy closes its file
// object at once) is committed by the RELEASE that follows munmap, whose
// error can only be logged: a writer that must know calls msync first.
// Writeback alone never commits, so a crash before msync or close leaves the
// previous version, whatever stores reached the daemon.
//
// Which process made a mapping's stores is unknown (the kernel writes back
// for whoever triggers it), so mount.go's pageWrites gives these WRITEs
// caller pid 0 (the kernel already does), and they name no committer
// (handle.go): the close of the opener, or of a process that wrote with
// write(2), commits. They do not clear setuid/setgid (ext4 does not on a
// mapping's stores either). And they never start a fork (file.go,
// changeTarget): the kernel shows the stores, in the inode's pages, to every
// process that has it open or mapped, so they change the file in place, as
// on a local filesystem; a fork would show those readers the new bytes while
// cached and the old version wherever the kernel reads pages back.
//
// The writeback cache (FUSE_WRITEBACK_CACHE) stays off: mappings do not need
// it (their pages are written back in either mode), and for write(2) it would
// hold WRITEs back until writeback, reorder them and lose the direct-I/O
// write speed.
//
// # Holes and the largest file
//
// Extending a file (ftruncate, truncate by path, a write past its end,
// fallocate) stages nothing: a stream only records the new size, a spool is
// a sparse file. At commit, the never-written runs become holes in the
// manifest (cas.Hole: no chunk, no space; stage.MinHole says which), so
// extending costs nothing in proportion to the new size, and `truncate -s
// 1T` returns in milliseconds. A read of a hole answers from one zero buffer
// (FS.zeros) and reads no object; prefetch skips holes; st_blocks leaves
// holes out (the catalog's holes row gives a file's hole bytes at its first
// stat, without its manifest); SEEK_DATA and SEEK_HOLE name a committed
// file's holes (staged content is all data). A change that keeps some of a
// committed file copies only its chunks into the spool, leaving its holes
// holes: it costs the file's data, not its size. Zeros that were written
// are chunks like any bytes (they dedupe to one).
//
// The largest file is MaxFileSize, ext4's (16 TiB - 4 KiB): the spool of a
// file changed out of order is a sparse file on the store's filesystem. A
// truncate or fallocate past it fails with EFBIG and changes nothing; a
// write is cut short at it, and one that starts there fails with EFBIG.
//
// # Versions, inodes and the page cache
//
// Each kernel inode has one content at a time, as in any POSIX filesystem: a process
// that overwrites a file in place (open with O_TRUNC) truncates it for every reader
// of that inode. Writing a new version under a new name and renaming it over the old
// one (what safetensors, torch.distributed.checkpoint and most checkpoint writers
// do) gives the new version a new inode: readers of the old one, mmap included, keep
// reading the old bytes, which stay in memory (the manifest) and in the store (GC
// marks from manifests, and from LiveManifests for files the daemon has open)
// until they close. A process that changes a file through a shared mapping
// changes it for every process that has the inode open or mapped (see
// Shared writable mappings above).
// Read handles get FOPEN_KEEP_CACHE while the file's content is unchanged since the
// last open for reading; after a change the next open drops the kernel's cached
// pages. Reads are assembled from verified chunks through the store's cache,
// handed to the kernel without a copy (ReadResultVector); prefetch.go loads
// ahead inside a tensor once a reader is clearly in it (never on a header probe
// or the kernel's readahead past a tensor), and more ahead of a long
// sequential reader. Files report st_blksize 4 KiB and the mount's readahead is
// 256 KiB: the kernel's read-around is what a lazy mmap reader pays for
// (mount.go, fs.go).
//
// # What readers ask for
//
// Traced with `ckptfs mount --debug` (every READ's offset and size, and its
// reply, so the READs in flight at each arrival), cold, at the default 256
// KiB readahead, Linux 6.18, a 1 GiB bf16 safetensors file of 256 tensors of
// 4 MiB and the same state as torch.save (go-fuse negotiates max_pages 256,
// 1 MiB READs, and ASYNC_READ):
//
//   - dd bs=16M, read(2) of 4 MiB buffers, torch.load without mmap: READs of
//     256 KiB in file order, never more than two in flight (the readahead's
//     synchronous window and its async one). The two are answered in either
//     order, so in completion order half of them do not start where the
//     previous one ended (dd: 256 of 513; torch.load: 1,465 of 4,104).
//   - safetensors.numpy load_file (0.8): 4 MiB in 256 KiB READs, the header
//     and the first tensor; its arrays map the file and nothing else is read
//     until they are touched (then as mmap readers below).
//   - torch.load(mmap=True) of 8 scattered tensors: 258 READs of 8 KiB, one
//     per zip record (its local header, at each tensor's start, 4 MiB apart),
//     then per tensor touched a 512 KiB read-around and the async readahead
//     after it, up to four in flight: 41 MiB read for 32 MiB touched.
//   - safe_open and get_tensor of one tensor: the header (256 KiB) and a 512
//     KiB read-around; the rest as the caller touches its pages.
//
// So a stream never asks for more than 512 KiB ahead of where it is: the
// kernel does not read ahead far enough to keep the disk and more than a
// core busy, and a larger readahead would make every lazy fault fetch more.
// The daemon reads ahead instead (prefetch.go), once the reads form a dense
// run that holds two whole tensors; the run's test tolerates the two READs'
// reordering, which exact succession did not (the stream window never opened).
//
// # Prefetch batches
//
// A stream's queue is topped up a batch at a time: its window moves on by
// each READ's length (256 KiB at the default readahead), and queued as it
// came, idle workers took it a few chunks at a time, each such batch one
// short pread whose buffer was mostly empty, so its chunks were copied out
// into fresh memory (the daemon allocated 586-677 MiB in a cold read of
// 1 GiB of random bytes; 526-544 MiB once topped up by batches, 239-280
// MiB with the passed chunks below; Go's own count, two reads each). The
// chunks that a READ covered whole, and in a stream those that
// end before how far it has read (its other READ in flight may come later
// for a chunk's head), are marked so in the cache (cas.Chunk.Passed): the
// page cache holds them. Not through a handle whose READs skip the page
// cache (a writer's, FOPEN_DIRECT_IO, or one opened with O_DIRECT): a
// second read through it finds them cached (TestDirectIOReadsKeepChunks).
//
// A prefetch worker takes up to 1 MiB of chunks from the head of the queue
// at once and loads them with cas.Store.AcquireChunks: one catalog
// transaction locates them all, chunks near each other in a pack (a file of
// FastCDC's ~32 KiB chunks) are read with one pread, and each is verified
// (BLAKE3; a coded chunk's CRC too) and decoded on the worker, off the
// reader's path; a raw chunk (incompressible bytes) stays where the pread
// put it, verified there (cas's doc.go, "Raw chunks of a run"). A READ
// takes the chunks it finds cached without a goroutine each
// (Store.AcquireCached) and loads only the others. A batch of
// a tensor file's 1 MiB chunks is one chunk, loaded as before. The
// alternative, resolving each chunk's place once per manifest load and
// keeping it with the manifest, was not taken: with one transaction per
// batch the catalog's share of the daemon's CPU fell from 11 % to 5 %
// (what is left: the chunks a batch leaves to AcquireChunk), and a place
// kept in memory goes stale when the re-encoder rewrites a chunk's index row
// (its stored length and codec) while the file is open.
//
// Measured on the 2-core machine, shared (load average 17-24), a cold read
// of 1 GiB of random bytes (~29,200 chunks in packs), daemon restarted and
// page cache dropped, before and after alternating, three of each: the
// daemon's CPU 4.13, 3.55, 4.02 s -> 2.26, 2.24, 1.94 s (about 138 -> 77 µs
// a chunk). The profile before: catalog transaction, open and pread per
// chunk (34 %), a goroutine per load (7 %), fresh buffers (10 %); after:
// BLAKE3, CRC and the copy out of the span (44 %), the FUSE replies'
// writev (25 %), the packs' O_DIRECT reads (10 %), the catalog (5 %). A
// bf16 tensor file's 1 MiB chunks cost the same as before (2.2-2.4 ms of
// CPU each: decoding and BLAKE3).
//
// # Background re-encoding
//
// Commits encode new chunks only while the store has an inline encoder free
// (cas: deferred encoding); the rest are stored raw and queued, so a save is
// bounded by the FUSE path and hashing, not by the codec. New starts a
// goroutine (background.go) that drains the queue with cas.Store.ReencodeOne,
// one chunk at a time, once the filesystem has been idle for the
// WithReencodeIdle period (default 500 ms; <= 0 turns it off). Idle means no
// activity noted for that long and no long operation in progress:
// noteActivity (an atomic timestamp, cheap enough for every READ and WRITE)
// and beginActivity/end around commits. Idleness is re-checked between chunks,
// so a new save waits for at most one chunk's re-encode. Errors go to the FS
// logger and back the runner off (1 s doubling to 1 min); the queue is
// persistent, so a chunk left queued at unmount is re-encoded by a later
// mount, and reads never depend on whether a chunk was re-encoded yet. Close
// stops the goroutine; call it after CommitAll and before closing the store.
//
// # Locking
//
// FS.nsMu guards the namespace: directory children and attributes, and each file's
// location, shadow and persisted flag. It is held across a namespace change's
// catalog transaction (mkdir, unlink, rename, a commit's directory entry...),
// so those changes are serialized (a group of commits, one transaction, as
// one change), with one exception: while a group of commits' transaction is
// made durable (its rows written, bbolt's writes and fdatasyncs under way),
// the leader releases nsMu and sets FS.flushing, and every holder of nsMu
// but Create (and a commit's read of its own file's place) takes it through
// FS.lockNS, which waits until the leader has taken it again and applied
// its members. Create sees nothing a member's Apply changes (the tree has a
// new name's node from Create on, and its own changes are in memory until
// its file's commit), so the kernel's creates, serialized by the
// directory's lock, do not wait for the disk; before this, one create ran per
// transaction and 8 writers' groups stayed at 2-3 files. A group's leader
// reads and changes its members' file state
// holding nsMu while their own goroutines wait, holding the members' file.mu
// and commitMu: it takes no member's mutex. file.mu guards a file's content state
// (staged content, manifest, size, dirty) and its attributes; its commitMu
// makes one commit of the file at a time, and its releaseMu one RELEASE of a
// writer's handle at a time. A commit and a setattr of a file hold file.mu
// until their catalog write is done, so a setattr never writes back the size
// of a version a commit replaced; namespace operations never take a file's
// mutex, so they never wait for a commit's chunking. Catalog transactions
// are short and never span a call into the kernel.
//
// Reads of the namespace never wait for a change or a commit (an `ls` while a
// 1 GiB file in the directory commits): lookup, readdir and the getattr of
// directories, symlinks and special files take FS.viewMu (a read lock)
// instead of nsMu (a directory's first getattr takes nsMu, to count its
// subdirectories), and
// the getattr of a file takes file.attrMu instead of file.mu. Each is held
// for a few memory accesses: a field those readers see (a directory's or
// symlink's attr; a file's attr) is changed holding both its guards (nsMu and
// viewMu; file.mu and attrMu), and read holding either.
//
// A goroutine takes these locks in this order only (a lock may be taken
// while holding only locks to its left):
//
//	file.releaseMu → file.commitMu → file.mu → FS.nsMu → FS.viewMu → file.attrMu
//
// Two file.mu nest only as an origin's before its fork's (taken with
// LockNested: opening or releasing a writer of the origin counts it on the
// fork; a setattr of an origin takes its fork's mu before nsMu, so that a
// chmod racing the fork's commit lands on whichever node ends up with the
// name). Every other pair of locks of one kind is taken one after the other,
// never nested. internal/lockorder checks this order: built with the
// ckptfs_lockorder tag (make test-go runs fusefs's tests so, apart from the
// race run, whose detector the checker's own lock would blind to races
// between goroutines that take any checked lock), every Lock checks the locks
// its goroutine holds, an inversion is recorded when the lock is asked for
// (so even one that would deadlock is caught), and the test binary fails
// (TestMain); TestLockOrderChecked shows what it catches. The node list's,
// the pin set's and the open files' mutexes are leaves (nothing is taken
// while one is held), and package stage's locks are taken after all of
// these and take none of them; they are not checked.
//
// go-fuse moves a renamed inode in its tree only after our Rename returns. A
// fork's commit that finds its origin renamed but not yet moved waits on
// FS.renamed (a sync.Cond on nsMu, broadcast by the mount's renameTracker when
// a RENAME request has ended) instead of polling; the wait releases nsMu and
// keeps file.mu and commitMu, which Rename never takes. Once the fork has the
// name, the commit invalidates the kernel's entry for it (after releasing
// nsMu) and again wherever a rename has moved the fork meanwhile: a rename
// the kernel began on the old dentry moves that dentry, which still resolves
// to the origin, to the new name.
package fusefs
