package catalog

import (
	"testing"

	"github.com/ckptfs/ckptfs/cas/object"
)

func TestManifestAndNodeRecords(t *testing.T) {
	m := &Manifest{Chunks: []ChunkRef{{object.Sum([]byte("a")), 1}, {object.Sum([]byte("bc")), 1 << 20}}, Extra: []byte("tensor index")}
	got, err := ParseManifest(m.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Chunks) != 2 || got.Chunks[1] != m.Chunks[1] || string(got.Extra) != "tensor index" || got.Size() != 1<<20+1 {
		t.Fatalf("manifest round trip: %+v", got)
	}
	for _, bad := range [][]byte{nil, {9}, {1, 0xff, 0xff, 0xff, 0xff, 0x0f}, m.Marshal()[:40]} {
		if _, err := ParseManifest(bad); err == nil {
			t.Errorf("manifest %x parsed", bad)
		}
	}
	n := Node{Ino: 42, Mode: 0o100644, UID: 1, GID: 2, Size: 3, Atime: 4, Mtime: 5, Ctime: 6, Target: "x/y", Nlink: 1}
	back, err := unmarshalNode(42, n.marshal())
	if err != nil || back != n {
		t.Fatalf("node round trip: %+v %v", back, err)
	}
}

// Special files keep their type and device number through a record, in the
// record format older binaries read (no format bump): such a binary, reading
// the tail as a symlink target, ignores it for a node that is no symlink.
func TestSpecialNodeRecords(t *testing.T) {
	for _, n := range []Node{
		{Ino: 7, Mode: 0o010640, UID: 1, GID: 2, Atime: 3, Mtime: 4, Ctime: 5, Nlink: 1},               // FIFO
		{Ino: 7, Mode: 0o140755, UID: 1, GID: 2, Atime: 3, Mtime: 4, Ctime: 5, Nlink: 1},               // socket
		{Ino: 7, Mode: 0o020600, UID: 0, GID: 6, Atime: 3, Mtime: 4, Ctime: 5, Rdev: 0x0103, Nlink: 1}, // char 1,3
		{Ino: 7, Mode: 0o060660, UID: 0, GID: 6, Atime: 3, Mtime: 4, Ctime: 5, Rdev: 0x0801, Nlink: 1}, // block 8,1
	} {
		if !n.IsSpecial() || n.IsRegular() || n.IsDir() || n.IsSymlink() {
			t.Errorf("mode %o: type predicates wrong", n.Mode)
		}
		rec := n.marshal()
		if rec[0] != nodeRecordVersion {
			t.Errorf("mode %o: record version %d", n.Mode, rec[0])
		}
		back, err := unmarshalNode(7, rec)
		if err != nil || back != n {
			t.Errorf("mode %o: round trip %+v %v", n.Mode, back, err)
		}
	}
	dev := Node{Ino: 7, Mode: 0o020600, Rdev: 1}
	if _, err := unmarshalNode(7, dev.marshal()[:45]); err == nil {
		t.Error("a device record without its number parsed")
	}
}

// Holes round-trip in a version-2 record; a manifest without them keeps the
// version-1 record older binaries read; damaged hole lists are refused.
func TestManifestHoles(t *testing.T) {
	a, b := object.Sum([]byte("a")), object.Sum([]byte("b"))
	plain := &Manifest{Chunks: []ChunkRef{{a, 10}}}
	if rec := plain.Marshal(); rec[0] != manifestVersion {
		t.Fatalf("a manifest without holes has record version %d", rec[0])
	}
	m := &Manifest{Chunks: []ChunkRef{{a, 10}, {b, 5}}, Extra: []byte("x"),
		Holes: []Hole{{0, 100}, {1, 1 << 40}, {2, 999_999_999_999_999}}}
	rec := m.Marshal()
	if rec[0] != manifestVersionHoles {
		t.Fatalf("record version %d", rec[0])
	}
	got, err := ParseManifest(rec)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Holes) != 3 || got.Holes[2] != m.Holes[2] || string(got.Extra) != "x" {
		t.Fatalf("round trip: %+v", got)
	}
	if want := int64(15 + 100 + 1<<40 + 999_999_999_999_999); got.Size() != want {
		t.Fatalf("size %d, want %d", got.Size(), want)
	}
	if offs := got.Offsets(); offs[0] != 100 || offs[1] != 110+1<<40 {
		t.Fatalf("offsets %v", offs)
	}
	for name, c := range map[string]struct {
		off, data int64
		ok        bool
		hole      int64
	}{
		"in first hole": {0, 100, true, 0},
		"in chunk 0":    {105, 105, true, 110},
		"in hole 2":     {200, 110 + 1<<40, true, 200},
		"in chunk 1":    {110 + 1<<40, 110 + 1<<40, true, 115 + 1<<40},
		"in tail hole":  {116 + 1<<40, 0, false, 116 + 1<<40},
	} {
		offs := got.Offsets()
		d, ok := got.NextData(offs, c.off)
		if ok != c.ok || (ok && d != c.data) {
			t.Errorf("%s: NextData(%d) = %d, %v", name, c.off, d, ok)
		}
		if h := got.NextHole(offs, c.off); h != c.hole {
			t.Errorf("%s: NextHole(%d) = %d, want %d", name, c.off, h, c.hole)
		}
	}
	for name, holes := range map[string][]Hole{
		"out of order": {{1, 5}, {0, 5}},
		"same place":   {{1, 5}, {1, 5}},
		"past the end": {{3, 5}},
		"empty":        {{0, 0}},
		"overflow":     {{0, 1 << 62}, {1, 1 << 62}},
	} {
		bad := (&Manifest{Chunks: m.Chunks, Holes: holes}).Marshal()
		if _, err := ParseManifest(bad); err == nil {
			t.Errorf("%s: holes %v parsed", name, holes)
		}
	}
	if _, err := ParseManifest(append(rec, 0)); err == nil {
		t.Error("a record with bytes past its holes parsed")
	}
}
