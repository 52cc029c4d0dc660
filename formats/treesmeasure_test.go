package formats

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// TestMeasureSaves reports, for the saves in $CKPTFS_SAVES (one directory of
// files per series, sorted by name), the bytes of new chunks over the last
// file's size: the dedup a store of these saves gets from the cuts alone.
func TestMeasureSaves(t *testing.T) {
	root := os.Getenv("CKPTFS_SAVES")
	if root == "" {
		t.Skip("CKPTFS_SAVES not set")
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "*"))
	for _, d := range dirs {
		files, _ := filepath.Glob(filepath.Join(d, "round-*"))
		sort.Strings(files)
		seen := map[[32]byte]bool{}
		var added, last, nchunks int64
		format := ""
		parts := 0
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cuts, ix := chunk(data, 1<<20, 1<<20)
			prev := int64(0)
			for _, c := range cuts {
				h := sha256.Sum256(data[prev:c])
				if !seen[h] {
					seen[h] = true
					added += c - prev
				}
				prev = c
			}
			last, nchunks, format, parts = int64(len(data)), int64(len(cuts)), ix.Format, len(ix.Tensors)
		}
		t.Logf("%-16s %-13s %.3f  (%d unique / %d final, %d chunks, %d parts)", filepath.Base(d), format,
			float64(added)/float64(last), added, last, nchunks, parts)
	}
}
