package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// flipChunkByte flips a byte in the middle of chunk id's object, in its
// pack when it is packed (content-defined chunks are) or in its own file.
// The store must not be open. It reports whether the chunk was packed.
func flipChunkByte(t *testing.T, store string, id cas.ID) (packed bool) {
	t.Helper()
	s, err := cas.Open(store, cas.Options{Objects: local.New(cas.ObjectsDir(store), local.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	var info cas.ChunkInfo
	err = s.View(func(tx *cas.Tx) error {
		var ok bool
		info, ok, err = tx.Chunk(id)
		if err == nil && !ok {
			err = fmt.Errorf("chunk %v not indexed", id)
		}
		return err
	})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	h := id.String()
	path, at := filepath.Join(cas.ObjectsDir(store), h[:2], h[2:4], h[4:]), int64(info.StoredLen)/2
	if info.Packed() {
		path, at = filepath.Join(cas.ObjectsDir(store), "packs", info.Pack.String()), int64(info.Offset)+at
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b[:], at); err != nil {
		t.Fatal(err)
	}
	return info.Packed()
}
