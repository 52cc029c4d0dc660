package fusefs

import (
	"slices"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/hanwen/go-fuse/v2/fs"
)

// forgetWaits drops the waiting delta plans of the content of file ino,
// which tx deletes with the file's last name, but those of keep's chunks
// (the content that takes its place; nil: none): cas.Deltas.Forget, so that
// delta_waiting no longer counts the chunks of a deleted file. A file with
// other names keeps them. It reads nothing when no plan waits, else the
// file's manifest and a row per chunk of it.
func forgetWaits(tx *cas.Tx, ino uint64, keep *cas.Manifest) error {
	if !tx.Deltas().Waiting() {
		return nil
	}
	if n, ok, err := tx.Node(ino); err != nil || !ok || !n.IsRegular() || n.Nlink > 1 {
		return err
	}
	return forgetContent(tx, ino, keep)
}

// forgetContent drops the waiting delta plans of file ino's committed
// content, which tx deletes or replaces, but those of keep's chunks.
func forgetContent(tx *cas.Tx, ino uint64, keep *cas.Manifest) error {
	if !tx.Deltas().Waiting() {
		return nil
	}
	m, ok, err := tx.Manifest(ino)
	if err != nil || !ok {
		return err
	}
	return tx.Deltas().Forget(m, keep)
}

// Delta waits a rename ends (cas: deltaplan.go). With the latest save kept
// whole, a file's changed chunks wait until a save finds the file as its
// previous version (bases.go: the file at the same relative path in a
// previous sibling of one of the save's first directories, or the file it
// replaces). A rename that takes a file away from the version before it
// takes it out of its run: the run's next save finds that earlier version
// instead, and nothing would ever release the file's plans. So a rename
// releases the waiting plans of each committed file it moves (the renamed
// file, or the regular files at most maxHintLevels deep in the renamed
// directory; deeper ones move with every directory their versions are
// looked for in) whose previous version, looked for as a save at its place
// looks for it, is another file after the rename than before:
//
//   - `mv runs/r/0300 archive/` and `mv model.safetensors best.safetensors`
//     release (0300's files found runs/r/0200's before, and nothing or
//     archive's after);
//   - `mv runs/r archive/r` (the run moves whole: its steps find each
//     other), `mv tmp-checkpoint-500 checkpoint-500` (checkpoint-400's
//     files either way), a file's temporary name renamed to its final one,
//     and a rename over the file's previous version keep them.
//
// A file with no previous version either way (the version before it was
// deleted) keeps its plans only when the renamed entry stays in its
// directory, a file under the same final name: it stays among the same
// siblings. A file with other names (hard links) keeps them: another name
// may be where its run goes on. Not caught: a step directory renamed in
// place to a name the run's next steps sort before (`mv 0300 best`: 0400
// finds 0200), which keeps its plans waiting as before.
//
// The other way round, a file moved to where it finds another previous
// version releases that version's plans, as its save there would have: a
// step written elsewhere and moved into its run (`mv staging/0400
// runs/r/`) is the run's latest, not 0300, whose plans would wait for good.
//
// Cost: nothing when no plan waits; else a search (a few seeks) per file
// the rename moves, a second one when the version found lies outside the
// renamed directory, and for each file released its manifest and a row
// per chunk. All in the rename's transaction, nsMu held.

// movedFile is a committed file a rename moves, and its previous version
// before the rename.
type movedFile struct {
	ino   uint64
	inner []pathDir // the directories from the renamed one (not included) down to the file's
	name  string    // the file's name; "" for the renamed file itself
	prev  uint64    // its previous version's inode number (0: none)
}

// movedFiles returns the committed files the rename of src (d/name, over
// dst when not nil) moves whose previous version it may change, each with
// that version before the rename: the files whose plans may wait and
// whose previous version lies outside the renamed entry. None when no plan
// waits. nsMu held.
func (d *dirNode) movedFiles(tx *cas.Tx, src fs.InodeEmbedder, name string, dst fs.InodeEmbedder) ([]movedFile, error) {
	if !tx.Deltas().Waiting() {
		return nil, nil
	}
	above := hintDirs(d)
	switch src := src.(type) {
	case *fileNode:
		if !src.persisted || !singleName(tx, inoOf(src)) {
			return nil, nil
		}
		prev, _, _ := versionBefore(tx, above, name)
		if prev != 0 && dst != nil && prev == inoOf(dst) {
			return nil, nil // it takes its previous version's place
		}
		return []movedFile{{ino: inoOf(src), prev: prev}}, nil
	case *dirNode:
		var out []movedFile
		top := append(slices.Clip(above), pathDir{inoOf(src), name})
		err := filesBelow(tx, inoOf(src), nil, func(ino uint64, inner []pathDir, fname string) {
			prev, _, level := versionBefore(tx, append(slices.Clip(top), inner...), fname)
			if prev != 0 && level <= len(inner) {
				return // found in the renamed directory: it moves with the file
			}
			out = append(out, movedFile{ino, slices.Clone(inner), fname, prev})
		})
		return out, err
	}
	return nil, nil
}

// releaseMoved releases the waiting plans of the files of moved (movedFiles
// for the rename of src from d/name to np/newName, which tx has made) whose
// previous version the rename changed. nsMu held.
func (d *dirNode) releaseMoved(tx *cas.Tx, moved []movedFile, src fs.InodeEmbedder, name string, np *dirNode, newName string) error {
	if len(moved) == 0 {
		return nil
	}
	_, srcIsDir := src.(*dirNode)
	stays := np == d && (srcIsDir || finalName(newName) == finalName(name))
	above := hintDirs(np)
	for _, f := range moved {
		dirs, fname := above, newName
		if f.name != "" {
			dirs = append(append(slices.Clip(above), pathDir{inoOf(src), newName}), f.inner...)
			fname = f.name
		}
		prev, _, _ := versionBefore(tx, dirs, fname)
		if prev == f.prev && (prev != 0 || stays) {
			continue
		}
		// It left the version before it; the one it finds now has it for
		// its next version, as if saved there.
		for _, ino := range []uint64{f.ino, prev} {
			if ino == 0 {
				continue
			}
			if m, ok, err := tx.Manifest(ino); err != nil {
				return err
			} else if ok {
				if err := tx.Deltas().ReleaseIn(m); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// singleName reports whether node ino has one name.
func singleName(tx *cas.Tx, ino uint64) bool {
	n, ok, err := tx.Node(ino)
	return err == nil && ok && n.Nlink <= 1
}

// filesBelow calls fn for each regular file with one name at most
// maxHintLevels levels below directory dir (inner: the directories from
// dir's below, not included, down to it), in the catalog.
func filesBelow(tx *cas.Tx, dir uint64, inner []pathDir, fn func(ino uint64, inner []pathDir, name string)) error {
	var subdirs []pathDir // listed first: the walk reads other rows
	if err := tx.Children(dir, func(name string, ino uint64) error {
		n, ok, err := tx.Node(ino)
		switch {
		case err != nil || !ok:
			return err
		case n.IsRegular() && n.Nlink <= 1:
			fn(ino, inner, name)
		case n.IsDir() && len(inner)+1 < maxHintLevels:
			subdirs = append(subdirs, pathDir{ino, name})
		}
		return nil
	}); err != nil {
		return err
	}
	for _, sub := range subdirs {
		if err := filesBelow(tx, sub.ino, append(slices.Clip(inner), sub), fn); err != nil {
			return err
		}
	}
	return nil
}
