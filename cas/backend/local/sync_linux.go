package local

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data (and the metadata needed to read it back).
func fdatasync(f *os.File) error {
	return unix.Fdatasync(int(f.Fd()))
}

// startWriteback asks the kernel to start writing f's dirty pages without
// waiting for them, so that a later fdatasync finds the data written or on
// its way.
func startWriteback(f *os.File) error {
	return unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}

// heldFileBudget is how many object descriptors batches may keep open until
// their Sync: a quarter of the process's file limit (Go raises the soft limit
// to the hard one), at most 8192. Past it, objects are synced as they are
// written.
func heldFileBudget() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return int(min(lim.Cur/4, 8192))
}
