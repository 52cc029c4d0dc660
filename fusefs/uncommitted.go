package fusefs

// UncommittedFile is a file that has a name in the mount but no catalog
// record yet: created, and its first commit not done. READDIR lists it from
// the tree; a reader of the catalog alone would not see it.
type UncommittedFile struct {
	Dir   uint64 // inode number of the directory holding its name
	Name  string
	Ino   uint64
	Size  int64 // as stat says now
	Ctime int64 // ns
}

// UncommittedFiles returns the files with a name and no catalog record yet,
// so that a caller answering from the catalog (the control socket's tree
// request) can list them where READDIR would. Such a file is pinned from its
// create until its first commit, so the walk is over the pinned files (the
// open and dirty ones), not the tree. Taken before a catalog read, the list
// may name a file that commits meanwhile: the catalog's entry wins then.
func (f *FS) UncommittedFiles() []UncommittedFile {
	pinned := f.pinnedFiles()
	type named struct {
		n    *fileNode
		dir  *dirNode
		name string
	}
	var found []named
	f.lockNS()
	for _, n := range pinned {
		if n.persisted || n.dir == nil || n.unlinked.Load() {
			continue
		}
		found = append(found, named{n, n.dir, n.name})
	}
	f.nsMu.Unlock()
	out := make([]UncommittedFile, 0, len(found))
	for _, e := range found {
		u := UncommittedFile{Dir: e.dir.ino(), Name: e.name}
		e.n.attrMu.Lock()
		u.Ino, u.Size, u.Ctime = e.n.attr.Ino, e.n.attr.Size, max(e.n.attr.Ctime, e.n.linkCtime.Load())
		e.n.attrMu.Unlock()
		out = append(out, u)
	}
	return out
}
