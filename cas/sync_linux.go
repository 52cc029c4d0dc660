package cas

import (
	"os"

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
