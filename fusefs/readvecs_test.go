package fusefs

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
)

// TestReadOverManyChunks: a READ over more chunks than one writev takes
// (1,024 slices) is answered. The store cuts files into chunks of at most
// 64 bytes, so every READ of 64 KiB or more spans over 1,024; the file is
// read with O_DIRECT (READs of up to max_read) and through the page cache.
// Before the fix the first such READ was never answered and the reader hung
// (found by a probe: a file of 1,100 one-line zstd frames).
func TestReadOverManyChunks(t *testing.T) {
	m := &testMount{t: t, store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir(), cas0: cas.Options{ChunkSize: 64}}
	m.mount()
	t.Cleanup(m.unmount)
	data := make([]byte, 512<<10)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	p := filepath.Join(m.dir, "tiny-chunks")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := m.fsys.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Chunks < 4096 {
		t.Fatalf("%d chunks for %d bytes: the store did not cut small chunks", st.Chunks, len(data))
	}
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			got, err := io.ReadAll(f)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, data) {
				return errors.New("O_DIRECT read: other bytes")
			}
			if got, err = os.ReadFile(p); err != nil {
				return err
			}
			if !bytes.Equal(got, data) {
				return errors.New("buffered read: other bytes")
			}
			return nil
		}()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a READ over many chunks was not answered in 2 minutes")
	}
}
