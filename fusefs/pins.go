package fusefs

// pin keeps n findable by inode number (n.mu held).
func (f *FS) pin(n *fileNode) {
	f.pins.mu.Lock()
	f.pins.files[n.attr.Ino] = n
	f.pins.mu.Unlock()
}

// settled reports whether the catalog holds all of n's state (n.mu held).
func (n *fileNode) settled() bool {
	return n.handles == 0 && n.writers == 0 && !n.dirty && !n.staged() && n.fork == nil && n.origin == nil && !n.forked
}

// unpinIfSettled unpins n once the catalog holds all of its state (n.mu
// held), and drops its manifest, which the next open reads again.
func (f *FS) unpinIfSettled(n *fileNode) {
	if !n.settled() {
		return
	}
	f.pins.mu.Lock()
	if f.pins.files[n.attr.Ino] == n {
		delete(f.pins.files, n.attr.Ino)
		f.pins.epoch++
		f.pins.recent[f.pins.epoch%recentUnpins] = n.attr.Ino
	}
	f.pins.mu.Unlock()
	if !n.unlinked.Load() && n.manifest != nil {
		// The catalog has it: a closed file holds no chunk list.
		n.manifest, n.offsets, n.spans = nil, nil, nil
	}
}

// pinEpoch returns the current unpin epoch.
func (f *FS) pinEpoch() uint64 {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	return f.pins.epoch
}

// pinnedFile returns the pinned file with inode number ino, if any. since is
// the epoch read before the catalog read that found ino: stale reports that
// ino was unpinned since then (or that too many files were to tell), so the
// record read may predate its last commit (a commit writes the catalog
// before it unpins) and must be read again.
func (f *FS) pinnedFile(ino, since uint64) (n *fileNode, stale bool) {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	if n := f.pins.files[ino]; n != nil {
		return n, false
	}
	if f.pins.epoch-since >= recentUnpins {
		return nil, true
	}
	for e := since + 1; e <= f.pins.epoch; e++ {
		if f.pins.recent[e%recentUnpins] == ino {
			return nil, true
		}
	}
	return nil, false
}

// pinnedFiles returns every pinned file.
func (f *FS) pinnedFiles() []*fileNode {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	out := make([]*fileNode, 0, len(f.pins.files))
	for _, n := range f.pins.files {
		out = append(out, n)
	}
	return out
}
