package cas

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ckptfs/ckptfs/cas/catalog"
	"github.com/ckptfs/ckptfs/cas/internal/faults"
	"github.com/ckptfs/ckptfs/cas/internal/fsutil"
)

// The store's own directories and catalog are made durable when they are
// created, like the objects (Batch.Sync): a power loss must not take away the
// catalog.db or objects/ entry of a store whose commits it kept (a directory's
// new entry is durable only once the directory itself is fsync'd; ext4 often
// does more, other filesystems and ext4's fast commits need not).

// Names inside a store directory.
const (
	catalogName = "catalog.db"
	objectsName = "objects"
	spoolName   = "spool"
)

// catalogTemp is the name a new catalog is built under before it is renamed
// to catalogName, so that a store directory holds a whole catalog or none.
const catalogTemp = catalogName + ".new"

// creationLeftover reports whether e is what an interrupted creation of a
// store may leave in its directory: the catalog being built, or the file
// probeWritable creates and removes.
func creationLeftover(e fs.DirEntry) bool {
	return e.Type().IsRegular() && (e.Name() == catalogTemp || strings.HasPrefix(e.Name(), ".probe-"))
}

// createCatalog builds a new, initialised catalog in dir: under catalogTemp,
// committed (bbolt fdatasyncs it), then renamed into place and the directory
// fsync'd. A crash leaves no catalog (the next Open creates it again) or a
// whole one, never a torn new file that bbolt cannot open.
func createCatalog(dir string, chunkSize int) error {
	tmp, path := filepath.Join(dir, catalogTemp), filepath.Join(dir, catalogName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("create catalog %s: %w", path, err)
	}
	err := catalog.Create(tmp, chunkSize)
	if errors.Is(err, catalog.ErrLocked) {
		return fmt.Errorf("open store %s: %w", dir, ErrLocked)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncStoreDir(dir)
	}
	if err != nil {
		return fmt.Errorf("create catalog %s: %w", path, err)
	}
	return nil
}

// mkdirAllDurable is os.MkdirAll that fsyncs the parent of every directory it
// creates.
func mkdirAllDurable(dir string, perm fs.FileMode) error {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s: %w", dir, fs.ErrExist)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllDurable(parent, perm); err != nil {
			return err
		}
	}
	return mkdirDurable(dir, perm)
}

// mkdirDurable creates dir unless it exists, and then fsyncs its parent.
func mkdirDurable(dir string, perm fs.FileMode) error {
	err := os.Mkdir(dir, perm)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncStoreDir(filepath.Dir(dir))
}

// syncStoreDir fsyncs a directory of the store's own layout (not objects').
func syncStoreDir(dir string) error {
	if faults.Skip("storedir") { // test binaries only (internal/faults)
		return nil
	}
	return fsutil.SyncDir(context.Background(), dir)
}
