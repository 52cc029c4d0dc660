package fusefs

import (
	"os"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
)

// TestCommitPacksFileInOrder: a file without a tensor layout, committed
// through the mount (its ~32 KiB chunks put by the commit's workers at
// once, finishing in no fixed order), lies in its packs in file order: in
// each pack the file's chunks follow each other forward, and most chunks
// start where the one before them ends (not all: a chunk that finished
// after its neighbours' pack was written leads the next pack, two steps
// away from its neighbours; up to 15 of them at each of the two pack
// boundaries). Packed as they finished, a fifth of the steps had jumped,
// forward or back (cas/doc.go, "Order in a pack").
func TestCommitPacksFileInOrder(t *testing.T) {
	m := newMount(t)
	mustWrite(t, m.path("f"), randBytes(11, 24<<20)) // three packs
	f, err := os.Open(m.path("f"))                   // the node's manifest, loaded
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := m.fileNodeAt("f")
	n.mu.Lock()
	refs := n.manifest.Chunks
	n.mu.Unlock()
	var infos []cas.ChunkInfo // of the packed chunks, in file order
	err = m.cas.View(func(tx *cas.Tx) error {
		for i, ref := range refs {
			info, ok, err := tx.Chunk(ref.ID)
			if err != nil || !ok || !(info.Packed() || info.Inline) {
				t.Fatalf("chunk %d: %+v, indexed %v, %v: want a packed chunk (or an inline one)", i, info, ok, err)
			}
			if info.Packed() {
				infos = append(infos, info)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	packs := map[cas.ID]bool{infos[0].Pack: true}
	last := map[cas.ID]cas.ChunkInfo{infos[0].Pack: infos[0]} // each pack's chunk met last
	next := 0                                                 // steps to the chunk right after
	for i := 1; i < len(infos); i++ {
		prev, c := infos[i-1], infos[i]
		if c.Pack == prev.Pack && c.Offset == prev.Offset+prev.StoredLen {
			next++
		}
		if l, ok := last[c.Pack]; ok && c.Offset < l.Offset+l.StoredLen {
			t.Fatalf("packed chunk %d lies at %d in its pack, before one it follows in the file (at %d)", i, c.Offset, l.Offset)
		}
		packs[c.Pack] = true
		last[c.Pack] = c
	}
	steps := len(infos) - 1
	if len(packs) < 3 || len(infos) < len(refs)-2 || next < steps*85/100 {
		t.Fatalf("%d of %d chunks in %d packs, %d of %d steps to the chunk right after: want all but the inline ones (16 KiB), 3 packs or more, 85%%", len(infos), len(refs), len(packs), next, steps)
	}
	t.Logf("%d chunks in %d packs, %d of %d steps to the chunk right after", len(infos), len(packs), next, steps)
}
