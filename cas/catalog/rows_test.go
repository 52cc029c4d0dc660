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
