package fusefs

import (
	"context"
	"sort"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/ckptfs/ckptfs/cas"
)

// ApplyRemote applies a remote tier's refresh (cas/remote's Applier) to
// the live namespace. With nsMu held it calls change, which changes the
// catalog path by path; busy tells change which paths to leave alone: a
// file open, staged or not committed yet at the path or below it (its
// commit is a newer version of this mount's own, published by the next
// round). Then the tree drops its nodes of the paths change reports
// changed, and the kernel is told to forget their entries (its entry and
// attribute timeouts are long), so the next lookup reads the catalog. An
// open file that a refresh replaced or removed keeps reading the version it
// opened, as after a local rename over it. An OPEN that reaches a node
// the refresh detached before the kernel forgot its entry gets ESTALE
// (loadManifestLocked), on which the kernel looks the name up again.
func (f *FS) ApplyRemote(ctx context.Context, paths []string, change func(busy func(path string) bool) ([]string, error)) error {
	var notes []func()
	defer func() {
		for _, n := range notes { // no lock of ours held: the kernel may call back
			n()
		}
	}()
	f.lockNS()
	defer f.nsMu.Unlock()
	busy, err := f.busyPaths(paths)
	if err != nil {
		return err
	}
	changed, err := change(func(p string) bool { return busy[p] })
	sort.Slice(changed, func(i, j int) bool { // children first
		return strings.Count(changed[i], "/") > strings.Count(changed[j], "/")
	})
	for _, p := range changed {
		notes = append(notes, f.forgetPath(p))
	}
	return err
}

// busyPaths returns the paths that name, or are directories above, a file
// whose state is more than its catalog record (nsMu held).
func (f *FS) busyPaths(paths []string) (map[string]bool, error) {
	pinned := map[uint64]bool{}
	for _, n := range f.pinnedFiles() {
		n.attrMu.Lock()
		pinned[n.attr.Ino] = true
		n.attrMu.Unlock()
	}
	busy := map[string]bool{}
	err := f.store.View(func(tx *cas.Tx) error {
		for _, p := range paths {
			if ino, ok := lookupPath(tx, p); ok && pinned[ino] {
				busy[p] = true
				continue
			}
			if n := f.treeNode(p); n != nil && treeBusy(n, pinned) {
				busy[p] = true
			}
		}
		return nil
	})
	return busy, err
}

// lookupPath returns the catalog's inode at p.
func lookupPath(tx *cas.Tx, p string) (uint64, bool) {
	ino := uint64(cas.RootIno)
	for _, name := range strings.Split(p, "/") {
		next, ok := tx.Lookup(ino, name)
		if !ok {
			return 0, false
		}
		ino = next
	}
	return ino, true
}

// treeNode returns the tree's inode at p, or nil.
func (f *FS) treeNode(p string) *fs.Inode {
	node := f.root.EmbeddedInode()
	for _, name := range strings.Split(p, "/") {
		if node = node.GetChild(name); node == nil {
			return nil
		}
	}
	return node
}

// treeBusy reports whether n or a node below it in the tree is a file
// with state beyond the catalog (nsMu held).
func treeBusy(n *fs.Inode, pinned map[uint64]bool) bool {
	switch op := n.Operations().(type) {
	case *fileNode:
		if !op.persisted {
			return true
		}
		op.attrMu.Lock()
		ino := op.attr.Ino
		op.attrMu.Unlock()
		return pinned[ino]
	case *dirNode:
		for _, ch := range n.Children() {
			if treeBusy(ch, pinned) {
				return true
			}
		}
	}
	return false
}

// forgetPath makes the tree drop its node at p, which a refresh changed in
// the catalog, and returns what tells the kernel (nsMu held; call it
// without). A directory that stays one keeps its node, with the catalog's
// new attributes.
func (f *FS) forgetPath(p string) func() {
	parts := strings.Split(p, "/")
	parent := f.root.EmbeddedInode()
	for i, name := range parts {
		if _, ok := parent.Operations().(*dirNode); !ok {
			return func() {}
		}
		child := parent.GetChild(name)
		if child == nil {
			if i == len(parts)-1 && f.isDir(p) {
				parent.Operations().(*dirNode).addSubdirs(+1)
			}
			return f.notifyEntry(parent, name, p)
		}
		if i < len(parts)-1 {
			parent = child
			continue
		}
		pd := parent.Operations().(*dirNode)
		if d, ok := child.Operations().(*dirNode); ok {
			var rec cas.Node
			var found bool
			_ = f.store.View(func(tx *cas.Tx) error {
				if ino, ok := lookupPath(tx, p); ok && ino == d.attr.Ino {
					rec, found, _ = tx.Node(ino)
				}
				return nil
			})
			if found && rec.IsDir() {
				f.setView(func() { d.attr = rec })
				return func() { child.NotifyContent(0, 0) }
			}
			pd.addSubdirs(-1)
		}
		if fn, ok := child.Operations().(*fileNode); ok && fn.persisted {
			var rec cas.Node
			var kept bool
			_ = f.store.View(func(tx *cas.Tx) error {
				rec, kept, _ = tx.Node(fn.attr.Ino)
				return nil
			})
			if kept && rec.IsRegular() {
				// A file with other names (hard links) loses this one only
				// (cas/remote drops the link; a replaced path gets a node
				// of its own): it keeps its node, which writes through the
				// other names commit to.
				fn.nlink.Store(rec.Nlink)
				fn.linkCtime.Store(max(fn.linkCtime.Load(), rec.Ctime))
				if fn.dir == pd && fn.name == name {
					fn.dir = nil // as dropName: it knows none of its names now
				}
				parent.RmChild(name)
				entry := f.notifyEntry(parent, name, p)
				return func() {
					entry()
					child.NotifyContent(-1, 0) // its link count and ctime: attributes only
				}
			}
		}
		detach(child.Operations())
		parent.RmChild(name)
		return f.notifyEntry(parent, name, p)
	}
	return func() {}
}

// isDir reports whether the catalog has a directory at p.
func (f *FS) isDir(p string) bool {
	dir := false
	_ = f.store.View(func(tx *cas.Tx) error {
		if ino, ok := lookupPath(tx, p); ok {
			n, ok, _ := tx.Node(ino)
			dir = ok && n.IsDir()
		}
		return nil
	})
	return dir
}

func (f *FS) notifyEntry(parent *fs.Inode, name, p string) func() {
	return func() {
		if errno := parent.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
			f.log.Printf("invalidate entry %q: %v", p, errno)
		}
	}
}
