package catalog

import (
	"errors"
	"os"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Written tail. bbolt grows its file with ftruncate, which leaves the new
// tail a hole: a commit whose pages land there (most of them, as the catalog
// grows: new manifests, inline chunks) makes ext4 allocate blocks at its
// first fdatasync, so that fdatasync also commits the journal. Measured on
// the project's machines (4 pages and two fdatasyncs per transaction, as
// bbolt does): 1.4–2.0 ms per transaction into a hole, 0.8–1.2 ms into
// blocks already written.
//
// So a writable catalog keeps the file written with zeros ahead of bbolt's
// high-water mark: in a write transaction before its commit (bbolt's
// writer lock held; Update at its start, UpdateAround once the caller's
// lock is released), when fewer than half a step past the mark (which
// counts the pages the transaction has allocated so far) are written, it writes zeros from the first
// hole past the mark to a whole multiple of the step (an eighth of the
// mark, 1 to 16 MiB) and fdatasyncs them, once per step. Only bytes past
// the mark are written: no committed page lives there (bbolt and Check
// read only pages below it), and the transaction's own pages are written
// over the zeros by its commit, later, from the same goroutine. bbolt then
// finds the file long enough and no longer truncates it. A failure to write
// the zeros is not the transaction's: it commits as before (bbolt
// allocates as it did), and the tail is tried again a step later.
const (
	tailStepMin = 1 << 20
	tailStepMax = 16 << 20
)

// tail is a writable catalog's written tail (see "Written tail"). Its
// fields are used inside write transactions only (bbolt's writer lock).
type tail struct {
	f    *os.File // the catalog file, for writing; nil: no tail kept
	upTo int64    // bytes of the file known written (zeros or pages)
}

func openTail(path string) tail {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return tail{} // kept as bbolt keeps it
	}
	return tail{f: f}
}

func (t *tail) close() error {
	if t.f == nil {
		return nil
	}
	return t.f.Close()
}

// extend writes zeros past tx's high-water mark as "Written tail" says.
// tx is a write transaction that has not committed.
func (t *tail) extend(tx *bolt.Tx) {
	if t.f == nil {
		return
	}
	mark := tx.Size()
	step := min(max(mark/8, tailStepMin), tailStepMax)
	if t.upTo >= mark+step/2 {
		return
	}
	fd := int(t.f.Fd())
	from, err := unix.Seek(fd, mark, unix.SEEK_HOLE)
	if err != nil {
		from = mark // ENXIO: the mark is at or past the end
	}
	from = max(from, mark)
	if from >= mark+step/2 {
		t.upTo = from
		return
	}
	to := (from/step + 1) * step
	if err := writeZeros(t.f, from, to); err != nil {
		t.upTo = mark + step // try again a step later
		return
	}
	t.upTo = to
}

// writeZeros writes zeros to [from, to) of f and fdatasyncs them.
func writeZeros(f *os.File, from, to int64) error {
	zeros := make([]byte, min(to-from, 1<<20))
	for off := from; off < to; {
		n, err := f.WriteAt(zeros[:min(int64(len(zeros)), to-off)], off)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("short write")
		}
		off += int64(n)
	}
	return unix.Fdatasync(int(f.Fd()))
}
