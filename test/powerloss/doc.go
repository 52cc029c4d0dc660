// Package powerloss is a test-only FUSE filesystem that forgets, at a
// simulated power loss, every write that was not made durable. ckptfs's
// power-loss suite (test/powerloss_test.go) puts a store on it, runs the
// daemon, cuts the power at a random request, and remounts on what survived.
//
// # Why a filesystem of our own
//
// SIGKILL of the daemon (test/crash_test.go) never loses the page cache, so it
// cannot tell a missing fsync. This kernel has no device-mapper (no dm-flakey,
// no dm-log-writes); outagefs (crates.io) records block writes under a loop
// device and replays crash states, which tests what ext4 does on this kernel
// but needs a Rust build, an ext4 image, a loop device per state, and root
// for each of them, and it explores a few hundred states of one recorded
// workload in minutes. A file-level model runs the real daemon binary
// unmodified, crashes at any request of any workload (mounts, commits,
// renames, collections, re-encodes, and the recovery of a mount after an
// earlier crash), costs a remount per crash, and needs nothing but go-fuse.
// The price is that the model, not ext4, defines durability: it follows
// POSIX and what Linux filesystems promise, and is deliberately weaker than
// ext4 where ext4 gives more than it promises (below).
//
// # The durability model
//
// Every inode has a current state (what processes see) and a durable state
// (what a power loss leaves):
//
//   - File data and size: write and truncate change the current state only.
//     fsync or fdatasync of the file (any descriptor of it) makes its data and
//     size durable. sync_file_range, close and rename make nothing durable.
//   - Directory entries: create, mkdir, mknod, symlink, unlink, rmdir and
//     rename change the current tree only. fsync of a directory makes that
//     directory's entries durable, and nothing else: a file fsync'd in a new
//     directory is lost unless the new directory's own entry in its parent is
//     made durable too. A rename is atomic: when a directory fsync makes one
//     side of a cross-directory rename durable, the other side is durable too.
//   - A symlink's target and a node's type and mode are durable with the entry
//     that names it (they live in the inode, written with its creation).
//
// The model is weaker than ext4 in data=ordered mode, on purpose: ext4
// commits every metadata change up to an fsync in one journal transaction, so
// there an fsync of a file also makes other files' creations and renames
// durable, and auto_da_alloc flushes data on rename-over and close-after-
// truncate. Code that is only correct because of those is not correct on
// other filesystems (or with ext4 fast commits), so the model does not give
// them.
//
// # What a crash keeps
//
// A crash freezes the disk at a request (CrashAfter counts requests that
// change anything, syncs included, so the power is cut between two of them)
// and answers every later request with EIO, as a dead disk would. What
// survives is the durable state plus, depending on the Mode:
//
//   - DropAll: nothing else.
//   - Partial: each unsynced page (4 KiB) of each file survives or not,
//     independently, with probability 1/2, so later writes may survive
//     without earlier ones; the file's size is the durable one, the current
//     one, or a page boundary in between (unwritten parts read as zeros, as
//     with delayed allocation); and each namespace change not yet durable
//     survives or not, with probability 1/2, applied in order (a rename is
//     one change, whole or not at all).
//
// After the crash, nodes no durable entry reaches are gone (the filesystem
// check of a real disk frees them), and After returns the disk as found at
// the next boot.
//
// # Scope
//
// Everything ckptfs does on a store works: regular files (read, write,
// O_DIRECT, shared read-only mmap, which bbolt uses), directories, symlinks,
// unix sockets (the daemon's control socket), renames with RENAME_NOREPLACE,
// flock (kept by the kernel), statfs. Hard links, xattrs, fallocate and
// RENAME_EXCHANGE are refused. Ownership and permissions are recorded and
// reported, not enforced (the tests run as root).
package powerloss
