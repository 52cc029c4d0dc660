package remote

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// nsEntry is one path of a namespace as the remote tier compares them.
type nsEntry struct {
	Node cas.Node
	Raw  []byte // regular files: the manifest, marshalled
	m    *cas.Manifest
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
func walkNamespace(tx *cas.Tx, fn func(p string, e nsEntry) error) error {
	var walk func(dir uint64, prefix string) error
	walk = func(dir uint64, prefix string) error {
		return tx.Children(dir, func(name string, ino uint64) error {
			n, ok, err := tx.Node(ino)
			if err != nil || !ok {
				return err
			}
			p := path.Join(prefix, name)
			e := nsEntry{Node: published(n)}
			switch {
			case n.IsDir():
				if err := fn(p, e); err != nil {
					return err
				}
				return walk(ino, p)
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
	return walk(cas.RootIno, "")
}

func snapshotEntries(snap *Snapshot) map[string]nsEntry {
	out := map[string]nsEntry{}
	if snap == nil {
		return out
	}
	for _, f := range snap.Files {
		e := nsEntry{Node: published(f.Node), m: f.Manifest}
		if f.Manifest != nil {
			e.Raw = f.Manifest.Marshal()
		}
		out[f.Path] = e
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) { // the first format lists no directories
			if _, ok := out[d]; !ok {
				out[d] = nsEntry{Node: cas.Node{Mode: syscall.S_IFDIR | 0o755}}
			}
		}
	}
	return out
}

// apply makes the store's namespace the snapshot named name (none: ""),
// and records name as the namespace's base. With merge (a writer joining),
// it is a three-way merge against the base recorded before: a path the
// bucket changed since the base and the store did not takes the bucket's
// version (new, overwritten, removed); a path the store changed keeps the
// store's; a path both changed keeps the store's and is logged. Without
// merge (a reader) the bucket's namespace replaces the store's. It returns
// how many paths it changed. Call it before the namespace is served.
func (r *Tier) apply(ctx context.Context, name string, merge bool, logf func(string, ...any)) (int, error) {
	theirs, err := r.snapshotByName(ctx, name)
	if err != nil {
		return 0, err
	}
	var baseName string
	var mirror bool
	ours := map[string]nsEntry{}
	err = r.store.View(func(tx *cas.Tx) error {
		baseName, mirror = tx.Uploads().Base()
		return walkNamespace(tx, func(p string, e nsEntry) error { ours[p] = e; return nil })
	})
	if err != nil {
		return 0, err
	}
	writer := merge
	if mirror && merge {
		// A former reader's store: its namespace is the bucket's as of some
		// refresh (files imported while mounted, overwrites and removals
		// not yet), with no change of its own to keep.
		merge = false
	}
	var base *Snapshot
	if merge && baseName != "" && baseName != name {
		if base, err = r.snapshotByName(ctx, baseName); err != nil {
			logf("the last snapshot this store agreed with (%s) is unreadable, merging without it: %v", baseName, err)
			base = nil
		}
	} else if merge && baseName == name {
		base = theirs
	}
	t, b := snapshotEntries(theirs), snapshotEntries(base)
	want := map[string]nsEntry{}
	union := map[string]struct{}{}
	for _, m := range []map[string]nsEntry{t, b, ours} {
		for p := range m {
			union[p] = struct{}{}
		}
	}
	for p := range union {
		te, tok := t[p]
		be, bok := b[p]
		oe, ook := ours[p]
		pick, pok := te, tok
		if merge {
			switch {
			case same(te, tok, be, bok), same(oe, ook, te, tok):
				pick, pok = oe, ook
			case !same(oe, ook, be, bok):
				logf("remote merge: %s changed here and in the bucket since the last sync: keeping this store's version", p)
				pick, pok = oe, ook
			}
		}
		if pok {
			want[p] = pick
		}
	}
	n, err := r.reconcile(ours, want)
	if err != nil {
		return n, err
	}
	return n, r.store.Update(func(tx *cas.Tx) error { return tx.Uploads().SetBase(name, !writer) })
}

// snapshotByName reads snapshot name from the bucket (nil for "").
func (r *Tier) snapshotByName(ctx context.Context, name string) (*Snapshot, error) {
	if name == "" {
		return nil, nil
	}
	return readSnapshotObject(ctx, r.be, name)
}

func depth(p string) int { return strings.Count(p, "/") }

// reconcile changes the catalog from namespace have to want.
func (r *Tier) reconcile(have, want map[string]nsEntry) (int, error) {
	var remove, put []string
	for p, h := range have {
		if w, ok := want[p]; !ok || w.kind() != h.kind() {
			remove = append(remove, p)
		}
	}
	for p, w := range want {
		if h, ok := have[p]; !ok || h.kind() != w.kind() || !same(h, true, w, true) {
			put = append(put, p)
		}
	}
	if len(remove)+len(put) == 0 {
		return 0, nil
	}
	sort.Slice(remove, func(i, j int) bool { return depth(remove[i]) > depth(remove[j]) }) // children first
	sort.Slice(put, func(i, j int) bool { return depth(put[i]) < depth(put[j]) })          // parents first
	inos := make([]uint64, 0, len(put))
	for range put { // numbers first: AllocIno may run a transaction of its own
		ino, err := r.store.AllocIno()
		if err != nil {
			return 0, err
		}
		inos = append(inos, ino)
	}
	now := time.Now().UnixNano()
	err := r.store.Update(func(tx *cas.Tx) error {
		resolve := func(p string) (parent, ino uint64, ok bool) {
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
		for _, p := range remove {
			parent, ino, ok := resolve(p)
			if !ok {
				continue
			}
			if err := tx.Unlink(parent, path.Base(p)); err != nil {
				return err
			}
			if _, err := tx.DropLink(ino, now); err != nil { // its other names (hard links) keep it
				return err
			}
		}
		for i, p := range put {
			w := want[p]
			n := w.Node
			parent, ino, ok := resolve(p)
			if ok {
				// A node with other names (a hard link here; snapshots have
				// none) is not changed under them: the path gets a node
				// of its own.
				if old, found, err := tx.Node(ino); err != nil {
					return err
				} else if found && old.Nlink > 1 {
					if _, err := tx.DropLink(ino, now); err != nil {
						return err
					}
					ok = false
				}
			}
			if !ok {
				parent, ok = cas.RootIno, true
				if d := path.Dir(p); d != "." {
					_, parent, ok = resolve(d)
				}
				if !ok {
					return fmt.Errorf("%s: its directory is missing", p)
				}
				ino = inos[i]
				if err := tx.Link(parent, path.Base(p), ino); err != nil {
					return err
				}
			} else if old, ok, err := tx.Node(ino); err == nil && ok && old.IsDir() {
				n.Mtime, n.Atime, n.Ctime = old.Mtime, old.Atime, old.Ctime
			}
			n.Ino = ino
			if n.Mtime == 0 {
				n.Mtime = now
			}
			if n.Ctime == 0 {
				n.Ctime = n.Mtime
			}
			if w.kind() == syscall.S_IFREG {
				n.Size = w.m.Size()
				if err := tx.PutManifest(ino, w.m); err != nil {
					return err
				}
			}
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		return nil
	})
	return len(remove) + len(put), err
}
