package fusefs

import (
	"slices"
	"sort"
	"strings"

	"github.com/ckptfs/ckptfs/cas"
)

// Delta hints (issue #15). A commit tells its batch which committed chunk
// each of its chunks is likely close to (cas.Batch.SuggestBase); cas plans
// deltas from that and keeps one only when it pays. The previous version of
// a file is, in order of preference:
//
//  1. the file's own committed content that this commit replaces (a rewrite
//     in place, a fork of an open file, a rename over a committed file), or
//     for a file written under a temporary name, the file of the final name
//     in the same directory, which its rename will replace;
//  2. the file at the same relative path in the previous sibling of one of
//     its first maxHintLevels ancestor directories, in natural order of
//     names ("step-90" before "step-100"): runs/r1/0200/model.safetensors
//     for runs/r1/0210/model.safetensors, runs/r1/0200/bf16/model.safetensors
//     for runs/r1/0210/bf16/model.safetensors, checkpoint-500/ before
//     checkpoint-1000/. A sibling without that path (a save that crashed
//     before its commit leaves its step directory empty; a directory of
//     logs between steps) is passed over, up to maxHintSiblings siblings a
//     level: otherwise the save after it would start a new chain, and with
//     the latest save kept whole (cas/deltaplan.go) the save before it would
//     wait for good, never released, a whole copy.
//
// A file written under a temporary name and renamed into place commits under
// the temporary name: the previous step is searched for the name without a
// temporary suffix (finalName), and a hidden temporary name stands for the
// visible one: rsync's ".model.safetensors.Xy12Ab" and `ckptfs import`'s
// ".model.safetensors.ckptfs-import-PID" for "model.safetensors". A writer
// that picks a random name (Python's tempfile) gives no hint at commit.
//
// Chunks are paired by tensor when both files have a tensor index (same
// name, dtype and length: the same offset within the tensor), and by file
// offset otherwise; a pair must have equal lengths. Finding a hint never
// fails a commit (no hint means no delta) and costs O(the file), not O(the
// directory) (issue #27): per level, one seek in the catalog's index of
// directory entries in natural order (Tx.PrevSibling, kept by the
// transactions that change entries) and a lookup of the relative path, at
// most maxHintLevels levels; and none of it when no chunk of the file is
// large enough to be paired (minHintChunk).
const (
	maxHintLevels   = 3
	maxHintSiblings = 4       // previous siblings tried a level
	minHintChunk    = 4 << 10 // smaller chunks are not worth a second object on read
)

// hintPlace is where a commit's file lives, for finding its previous version.
type hintPlace struct {
	dir   *dirNode
	name  string
	prior []uint64 // committed nodes whose content this commit replaces, preferred first
}

// suggestBases finds the previous version of the file at place and suggests
// its chunks as bases for refs (the new content, indexed by ix, may be nil).
func (f *FS) suggestBases(batch *cas.Batch, place hintPlace, m *cas.Manifest, ix *FileIndex) {
	if !slices.ContainsFunc(m.Chunks, func(c cas.ChunkRef) bool {
		return c.Len >= minHintChunk && batch.HintWanted(c.ID, int(c.Len))
	}) {
		return // nothing to pair (small files: inline; small chunks: packed): no need to look for the previous version
	}
	var prev *cas.Manifest
	_ = f.store.View(func(tx *cas.Tx) error {
		if hook := f.hintHook; hook != nil {
			defer func() { hook(prev, tx.Walked()) }()
		}
		for _, ino := range place.prior {
			if m, ok, err := tx.Manifest(ino); err == nil && ok && len(m.Chunks) > 0 {
				prev = m
				return nil
			}
		}
		prev = previousStep(tx, place)
		return nil
	})
	if prev == nil {
		return
	}
	var pix *FileIndex
	if ix != nil && len(ix.Tensors) > 0 {
		if p, err := ParseFileIndex(prev.Extra); err == nil && len(p.Tensors) > 0 {
			pix = p
		}
	}
	for _, p := range pairChunks(m, ix, prev, pix) {
		batch.SuggestBase(p[0], p[1])
	}
}

// previousStep looks for the file at the same relative path under the
// previous sibling of each of place's first ancestors (versionBefore).
func previousStep(tx *cas.Tx, place hintPlace) *cas.Manifest {
	if place.dir == nil {
		return nil
	}
	_, m, _ := versionBefore(tx, hintDirs(place.dir), place.name)
	return m
}

// pathDir is a directory on a file's path: its inode number and its name
// in the directory before it on the path.
type pathDir struct {
	ino  uint64
	name string
}

// hintDirs is dir and the ancestors a search for a previous version from a
// place in it climbs (at most maxHintLevels), from the inode tree, top
// first: the root has no name.
func hintDirs(dir *dirNode) []pathDir {
	in := dir.EmbeddedInode()
	dirs := []pathDir{{ino: in.StableAttr().Ino}}
	for len(dirs) <= maxHintLevels {
		name, parent := in.Parent()
		if parent == nil {
			break
		}
		dirs[len(dirs)-1].name = name
		dirs = append(dirs, pathDir{ino: parent.StableAttr().Ino})
		in = parent
	}
	slices.Reverse(dirs)
	return dirs
}

// versionBefore finds the previous version of a file named name in the
// last of dirs (top first, each named in the one before it; hintDirs), which
// need not be in the inode tree: what a save there pairs its chunks with
// (previousStep), and what a rename that moves a file compares before and
// after (dir.go). It returns the version's inode number and manifest (0,
// nil: none), and the level it was found at: 0 for the file the name's
// final one would replace, k for the file at the same relative path in a
// previous sibling of the k-th directory up (at most maxHintSiblings of
// them a level, maxHintLevels levels).
func versionBefore(tx *cas.Tx, dirs []pathDir, name string) (uint64, *cas.Manifest, int) {
	final := finalName(name)
	if final != name {
		// Written under a temporary name: the file it will replace.
		if ino, m := versionAt(tx, dirs[len(dirs)-1].ino, []string{final}); m != nil {
			return ino, m, 0
		}
	}
	rel := []string{final}
	for level := 1; level <= maxHintLevels && level < len(dirs); level++ {
		in, parent := dirs[len(dirs)-level], dirs[len(dirs)-level-1]
		for sibName, i := in.name, 0; i < maxHintSiblings; i++ {
			var sib uint64
			var ok bool
			if sibName, sib, ok = previousSibling(tx, parent.ino, sibName); !ok {
				break
			}
			if ino, m := versionAt(tx, sib, rel); m != nil {
				return ino, m, level
			}
		}
		rel = append([]string{in.name}, rel...)
	}
	return 0, nil, 0
}

// versionAt resolves rel under directory dir to a regular file with
// content: its inode number and manifest (nil: none, or no chunks, as a
// file of holes only has).
func versionAt(tx *cas.Tx, dir uint64, rel []string) (uint64, *cas.Manifest) {
	ino := dir
	for _, name := range rel {
		next, ok := tx.Lookup(ino, name)
		if !ok {
			return 0, nil
		}
		ino = next
	}
	n, ok, err := tx.Node(ino)
	if err != nil || !ok || !n.IsRegular() {
		return 0, nil
	}
	m, ok, err := tx.Manifest(ino)
	if err != nil || !ok || len(m.Chunks) == 0 {
		return 0, nil
	}
	return ino, m
}

// previousSibling returns the directory entry of dir that comes right before
// name in natural order: one seek in the catalog's index of entries in that
// order (cas/catalog: Tx.PrevSibling), whatever dir's size.
func previousSibling(tx *cas.Tx, dir uint64, name string) (string, uint64, bool) {
	sib, ino, ok, err := tx.PrevSibling(dir, name)
	return sib, ino, ok && err == nil
}

// errStopWalk ends a walk of a directory early.
type errStopWalk struct{}

func (errStopWalk) Error() string { return "stop" }

// pairChunks pairs each chunk of the new content with the chunk of the
// previous version holding the same bytes' place: [new, old] IDs. Places
// count the manifests' holes.
func pairChunks(m *cas.Manifest, ix *FileIndex, prev *cas.Manifest, pix *FileIndex) [][2]cas.ID {
	old := make(map[int64]cas.ChunkRef, len(prev.Chunks))
	for i, off := range prev.Offsets() {
		old[off] = prev.Chunks[i]
	}
	// Tensor placement: new tensor start → old tensor start, by name.
	type span struct{ off, len, oldOff int64 }
	var spans []span
	if pix != nil {
		byName := make(map[string]TensorEntry, len(pix.Tensors))
		for _, t := range pix.Tensors {
			byName[t.Name] = t
		}
		for _, t := range ix.Tensors {
			if o, ok := byName[t.Name]; ok && o.Length == t.Length && o.DType == t.DType {
				spans = append(spans, span{t.Offset, t.Length, o.Offset})
			}
		}
		sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	}
	var pairs [][2]cas.ID
	for i, at := range m.Offsets() {
		c := m.Chunks[i]
		if c.Len < minHintChunk {
			continue
		}
		if pix != nil {
			i := sort.Search(len(spans), func(i int) bool { return spans[i].off+spans[i].len > at })
			if i == len(spans) || spans[i].off > at {
				continue // not in a tensor both versions have
			}
			at = at - spans[i].off + spans[i].oldOff
		}
		if o, ok := old[at]; ok && o.Len == c.Len && o.ID != c.ID {
			pairs = append(pairs, [2]cas.ID{c.ID, o.ID})
		}
	}
	return pairs
}

// digits is the length of the run of ASCII digits s starts with.
func digits(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// tempSuffixes are what writers append to a file's name while they write it,
// before renaming it into place (".ckptfs-import": `ckptfs import`).
var tempSuffixes = []string{".tmp", ".temp", ".part", ".partial", ".incomplete", "~", ".ckptfs-import"}

// finalName is name without a temporary suffix: "model.safetensors.tmp" →
// "model.safetensors", "model.safetensors.tmp.1234" too. A hidden temporary
// name stands for the visible one: ".model.safetensors.tmp" and
// ".model.safetensors.ckptfs-import-1234" (`ckptfs import`), and rsync's
// ".model.safetensors.Xy12Ab" (mkstemp's six letters or digits after the
// name: mkstempSuffix), are "model.safetensors". A name taken for a temporary one that is
// not costs a lookup that finds nothing, or a delta that does not pay.
func finalName(name string) string {
	for _, suf := range tempSuffixes {
		if i := strings.LastIndex(name, suf); i > 0 {
			rest := name[i+len(suf):]
			if rest == "" || (rest[0] == '.' || rest[0] == '-' || rest[0] == '_') && digits(rest[1:]) == len(rest)-1 {
				if f := unhidden(name[:i]); f != "." {
					return f
				}
			}
		}
	}
	if i := strings.LastIndexByte(name, '.'); i > 1 && name[0] == '.' && len(name)-i-1 == 6 && mkstempSuffix(name[i+1:]) {
		return name[1:i] // rsync: .NAME.XXXXXX
	}
	return name
}

// mkstempSuffix reports whether s looks like mkstemp's random letters: all
// ASCII letters and digits, with a digit or a capital among them (".model.pickle"
// is a hidden file, not an rsync temporary; one in about 200 random
// suffixes is all small letters and is missed: no hint for that file).
func mkstempSuffix(s string) bool {
	mixed := false
	for i := range len(s) {
		switch c := s[i]; {
		case '0' <= c && c <= '9', 'A' <= c && c <= 'Z':
			mixed = true
		case 'a' <= c && c <= 'z':
		default:
			return false
		}
	}
	return mixed
}

// unhidden is name without its leading dot, unless that would leave nothing.
func unhidden(name string) string {
	if len(name) > 1 && name[0] == '.' {
		return name[1:]
	}
	return name
}
