package remote

import (
	"bytes"
	"context"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// nsEntry is one path of a namespace as the remote tier compares them.
type nsEntry struct {
	Node  cas.Node
	Raw   []byte // regular files: the manifest, marshalled
	m     *cas.Manifest
	ctime int64 // the local record's ctime (local namespaces only): when it changed
}

func (e nsEntry) kind() uint32 { return e.Node.Mode & syscall.S_IFMT }

// same reports whether two entries (present or not) are one version:
// same type and permissions, owner, and for files the content and mtime,
// for symlinks the target. Inode numbers and atimes are each store's own;
// a directory's mtime moves with every entry in it.
func same(a nsEntry, aok bool, b nsEntry, bok bool) bool {
	if !aok || !bok {
		return aok == bok
	}
	an, bn := a.Node, b.Node
	if an.Mode != bn.Mode || an.UID != bn.UID || an.GID != bn.GID {
		return false
	}
	switch a.kind() {
	case syscall.S_IFREG:
		return an.Mtime == bn.Mtime && bytes.Equal(a.Raw, b.Raw)
	case syscall.S_IFLNK:
		return an.Target == bn.Target
	}
	return true
}

// published is n as a snapshot carries it: no inode, atime or ctime, and
// no directory mtime, so that a namespace nobody changed digests the same.
func published(n cas.Node) cas.Node {
	n.Ino, n.Atime, n.Ctime = 0, 0, 0
	if n.IsDir() {
		n.Mtime, n.Size = 0, 0
	}
	return n
}

// walkNamespace calls fn for every directory, regular file and symlink
// below the root, parents before children.
//
// An entry's ctime is when its path got what it holds: the later of its
// record's ctime and when the path got its name, which a rename of the
// entry or of a directory above it sets and neither record says (catalog:
// Tx.Linked). Not its directory's ctime: every entry added to the
// directory moves that, and an unpublished file would take the time of a
// later file beside it and win over another writer's later version of its
// path.
func walkNamespace(tx *cas.Tx, fn func(p string, e nsEntry) error) error {
	var walk func(dir uint64, prefix string, named int64) error
	walk = func(dir uint64, prefix string, named int64) error {
		return tx.Children(dir, func(name string, ino uint64) error {
			n, ok, err := tx.Node(ino)
			if err != nil || !ok {
				return err
			}
			p := path.Join(prefix, name)
			at, err := tx.Linked(dir, name, ino)
			if err != nil {
				return err
			}
			at = max(at, named)
			e := nsEntry{Node: published(n), ctime: max(n.Ctime, at)}
			switch {
			case n.IsDir():
				if err := fn(p, e); err != nil {
					return err
				}
				return walk(ino, p, at)
			case n.IsRegular():
				m, ok, err := tx.Manifest(ino)
				if err != nil || !ok {
					return err
				}
				e.Raw, e.m = m.Marshal(), m
			case n.Mode&syscall.S_IFMT != syscall.S_IFLNK:
				return nil // devices, fifos: not published
			}
			return fn(p, e)
		})
	}
	return walk(cas.RootIno, "", 0)
}

// Change is one path a refresh changes in a local namespace: from Have
// (nil: absent) to Want (nil: removed).
type change struct {
	Path string
	Have *nsEntry
	Want *nsEntry
}

// Applier applies a refresh to a served namespace (fusefs.FS.ApplyRemote):
// with the namespace's lock held it calls change, passing busy, which says
// which paths change must leave alone (a file open or being written, and
// the directories above one), and it makes the mount forget what change
// reports it changed. Before a namespace is served the catalog alone is
// changed (busy: nothing).
type Applier func(ctx context.Context, paths []string, change func(busy func(path string) bool) ([]string, error)) error

// catalogApplier applies to a namespace nobody serves.
func catalogApplier(ctx context.Context, _ []string, change func(func(string) bool) ([]string, error)) error {
	_, err := change(func(string) bool { return false })
	return err
}

// reconcile changes the catalog path by path, in one transaction, from
// each change's Have to its Want, skipping a path that busy names, one
// whose record is no longer Have (a commit or a namespace change here got
// there first), and a directory that still holds something. It returns the
// paths it changed.
func (r *Tier) reconcile(changes []change, busy func(string) bool) ([]string, error) {
	var remove, put []change
	for _, c := range changes {
		if busy(c.Path) {
			continue
		}
		if c.Have != nil && (c.Want == nil || c.Want.kind() != c.Have.kind() || c.Want.kind() != syscall.S_IFDIR) {
			remove = append(remove, c)
		}
		if c.Want != nil {
			put = append(put, c)
		}
	}
	sort.Slice(remove, func(i, j int) bool { return depth(remove[i].Path) > depth(remove[j].Path) }) // children first
	sort.Slice(put, func(i, j int) bool { return depth(put[i].Path) < depth(put[j].Path) })          // parents first
	inos := make([]uint64, len(put))
	for i := range put { // numbers first: AllocIno may run a transaction of its own
		ino, err := r.store.AllocIno()
		if err != nil {
			return nil, err
		}
		inos[i] = ino
	}
	var changed []string
	err := r.store.Update(func(tx *cas.Tx) error {
		changed = changed[:0]
		done := map[string]bool{}
		failed := map[string]bool{}
		for _, c := range remove {
			ok, err := removePath(tx, c)
			if err != nil {
				return err
			}
			if !ok {
				failed[c.Path] = true
				continue
			}
			done[c.Path] = true
		}
		for i, c := range put {
			if failed[c.Path] {
				continue
			}
			ok, err := putPath(tx, c, inos[i], c.Have != nil && !done[c.Path])
			if err != nil {
				return err
			}
			if ok {
				done[c.Path] = true
			}
		}
		for p := range done {
			changed = append(changed, p)
		}
		return nil
	})
	return changed, err
}

// resolve finds p in the catalog: its directory's and its own inode.
func resolve(tx *cas.Tx, p string) (parent, ino uint64, ok bool) {
	parent = cas.RootIno
	parts := strings.Split(p, "/")
	for i, name := range parts {
		next, found := tx.Lookup(parent, name)
		if !found {
			return 0, 0, false
		}
		if i == len(parts)-1 {
			return parent, next, true
		}
		parent = next
	}
	return 0, 0, false
}

// current reads the catalog's entry at p, as walkNamespace would.
func current(tx *cas.Tx, p string) (nsEntry, uint64, bool, error) {
	_, ino, ok := resolve(tx, p)
	if !ok {
		return nsEntry{}, 0, false, nil
	}
	n, ok, err := tx.Node(ino)
	if err != nil || !ok {
		return nsEntry{}, 0, false, err
	}
	e := nsEntry{Node: published(n)}
	if n.IsRegular() {
		m, ok, err := tx.Manifest(ino)
		if err != nil || !ok {
			return nsEntry{}, 0, false, err
		}
		e.Raw, e.m = m.Marshal(), m
	}
	return e, ino, true, nil
}

// removePath removes c.Path if it is still c.Have and holds nothing.
func removePath(tx *cas.Tx, c change) (bool, error) {
	cur, ino, ok, err := current(tx, c.Path)
	if err != nil || !ok || !same(cur, true, *c.Have, true) {
		return false, err
	}
	if cur.kind() == syscall.S_IFDIR {
		empty := true
		if err := tx.Children(ino, func(string, uint64) error { empty = false; return nil }); err != nil {
			return false, err
		}
		if !empty {
			return false, nil
		}
	}
	parent, _, _ := resolve(tx, c.Path)
	if err := tx.Unlink(parent, path.Base(c.Path)); err != nil {
		return false, err
	}
	// A node with other names (hard links here; states carry a path per
	// name, never a link) keeps them: only this name goes. A path that is
	// replaced gets a node of its own (putPath), so a version applied at
	// one name never changes what the other names read.
	_, err = tx.DropLink(ino, time.Now().UnixNano())
	return true, err
}

// putPath makes c.Path c.Want: a new record at ino, or (inPlace: a
// directory that stays one) the same record with new attributes.
func putPath(tx *cas.Tx, c change, ino uint64, inPlace bool) (bool, error) {
	cur, curIno, exists, err := current(tx, c.Path)
	if err != nil {
		return false, err
	}
	w := c.Want
	n := w.Node
	// The record's ctime is its version's stamp: a store that applied it
	// and changed nothing, remounted after another writer changed the
	// path again, stamps it no later than that version (step 4).
	now := time.Now().UnixNano()
	if w.ctime > 0 {
		now = w.ctime
	}
	switch {
	case inPlace:
		if !exists || !same(cur, true, *c.Have, true) {
			return false, nil
		}
		old, _, err := tx.Node(curIno)
		if err != nil {
			return false, err
		}
		n.Ino, n.Mtime, n.Atime, n.Ctime, n.Size = curIno, old.Mtime, old.Atime, now, old.Size
		return true, tx.PutNode(n)
	case exists:
		return false, nil // something is there that should not be
	}
	parent := uint64(cas.RootIno)
	if d := path.Dir(c.Path); d != "." {
		var ok bool
		if _, parent, ok = resolve(tx, d); !ok {
			return false, nil // its directory could not be made
		}
	}
	if err := tx.Link(parent, path.Base(c.Path), ino); err != nil {
		return false, err
	}
	n.Ino = ino
	if n.Mtime == 0 && w.kind() == syscall.S_IFDIR { // a file keeps its version's, even 0
		n.Mtime = now
	}
	n.Ctime = now
	if w.kind() == syscall.S_IFREG {
		n.Size = w.m.Size()
		if err := tx.PutManifest(ino, w.m); err != nil {
			return false, err
		}
	}
	return true, tx.PutNode(n)
}
