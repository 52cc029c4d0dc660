package fusefs

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/ckptfs/ckptfs/cas"
)

// ImportFile is a committed file published by another mount (the remote
// tier's snapshot): its path below the root, its attributes and its content.
type ImportFile struct {
	Path     string // slash-separated, relative to the root
	Node     cas.Node
	Manifest *cas.Manifest
}

// ImportFiles adds files to the namespace (catalog and live tree), creating
// their directories as needed, and returns how many it added. A path that
// already names something is left alone: a reading mount sees a file as it
// was first imported until it is mounted again (renames, deletions and new
// versions are not applied to a live mount yet). A path that is not a clean
// relative path, or that enters .ckptfs, is skipped and reported in the
// error after the others are imported.
func (f *FS) ImportFiles(ctx context.Context, files []ImportFile) (int, error) {
	added := 0
	var bad []string
	var notify []func()
	f.nsMu.Lock()
	for _, file := range files {
		parts, ok := splitImportPath(file.Path)
		if !ok {
			bad = append(bad, file.Path)
			continue
		}
		done, err := f.importOne(ctx, parts, file)
		if err != nil {
			f.nsMu.Unlock()
			return added, fmt.Errorf("import %s: %w", file.Path, err)
		}
		if done {
			added++
			notify = append(notify, f.forgetLoaded(parts))
		}
	}
	f.nsMu.Unlock()
	for _, n := range notify { // no lock of ours held: the kernel may call back
		n()
	}
	if len(bad) > 0 {
		return added, fmt.Errorf("skipped %d files with unusable paths: %q", len(bad), bad)
	}
	return added, nil
}

func splitImportPath(p string) ([]string, bool) {
	parts := strings.Split(p, "/")
	for _, s := range parts {
		if s == "" || s == "." || s == ".." || len(s) > maxNameLen || strings.ContainsRune(s, 0) {
			return nil, false
		}
	}
	return parts, len(parts) > 0 && parts[0] != ctlName
}

// importOne adds one file unless its path exists (nsMu held).
func (f *FS) importOne(ctx context.Context, parts []string, file ImportFile) (bool, error) {
	// Which components exist, and where the new ones start.
	dir := cas.RootIno
	have := 0
	var exists bool
	err := f.store.View(func(tx *cas.Tx) error {
		for i, name := range parts {
			ino, ok := tx.Lookup(dir, name)
			if !ok {
				return nil
			}
			if i == len(parts)-1 {
				exists = true
				return nil
			}
			n, ok, err := tx.Node(ino)
			if err != nil {
				return err
			}
			if !ok || !n.IsDir() {
				exists = true // a file where a directory should be: leave it
				return nil
			}
			dir, have = ino, i+1
		}
		return nil
	})
	if err != nil || exists {
		return false, err
	}
	// Numbers first: AllocIno may run a transaction of its own.
	inos := make([]uint64, len(parts)-have)
	for i := range inos {
		if inos[i], err = f.store.AllocIno(); err != nil {
			return false, err
		}
	}
	now := time.Now().UnixNano()
	err = f.store.Update(func(tx *cas.Tx) error {
		parent := dir
		for i, name := range parts[have:] {
			ino := inos[i]
			rec := cas.Node{Ino: ino, Mode: syscall.S_IFDIR | 0o755, Atime: now, Mtime: now, Ctime: now}
			if i == len(inos)-1 {
				rec = file.Node
				rec.Ino = ino
				rec.Mode = syscall.S_IFREG | file.Node.Mode&0o7777
				rec.Size = file.Manifest.Size()
				rec.Target = ""
				if err := tx.PutManifest(ino, file.Manifest); err != nil {
					return err
				}
			}
			if err := tx.PutNode(rec); err != nil {
				return err
			}
			if err := tx.Link(parent, name, ino); err != nil {
				return err
			}
			parent = ino
		}
		return nil
	})
	return err == nil, err
}

// forgetLoaded returns a function that makes the kernel drop a cached
// negative entry for the first name along parts that the tree does not have
// (nsMu held; call the function without it). Lookups of names the tree does
// not have read the catalog, which has the new entries.
func (f *FS) forgetLoaded(parts []string) func() {
	var node *fs.Inode = f.root.EmbeddedInode()
	for i, name := range parts {
		if _, ok := node.Operations().(*dirNode); !ok {
			break
		}
		child := node.GetChild(name)
		if child == nil {
			parent := node
			return func() {
				if errno := parent.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
					f.log.Printf("invalidate entry %q: %v", strings.Join(parts[:i+1], "/"), errno)
				}
			}
		}
		node = child
	}
	return func() {}
}
