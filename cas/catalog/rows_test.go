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
	n := Node{Ino: 42, Mode: 0o100644, UID: 1, GID: 2, Size: 3, Atime: 4, Mtime: 5, Ctime: 6, Target: "x/y"}
	back, err := unmarshalNode(42, n.marshal())
	if err != nil || back != n {
		t.Fatalf("node round trip: %+v %v", back, err)
	}
}
