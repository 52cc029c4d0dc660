package cas

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data (and the metadata needed to read it back).
func fdatasync(f *os.File) error {
	return unix.Fdatasync(int(f.Fd()))
}
