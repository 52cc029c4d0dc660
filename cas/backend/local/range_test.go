package local

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// TestGetRange: ranges of a pack read back exactly, short ones through the
// page cache and long ones (DirectRangeMin or more) with O_DIRECT widened
// to whole pages: at unaligned offsets, ending at the file's last byte, into
// a buffer given or not; a range past the end is an error, never fewer
// bytes.
func TestGetRange(t *testing.T) {
	b := New(filepath.Join(t.TempDir(), "objects"), Options{})
	defer b.Close()
	ctx := context.Background()
	data := make([]byte, 3*DirectRangeMin+1234)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	h := backend.Handle{Kind: backend.Pack, Name: strings.Repeat("ab", 32)}
	if err := b.Put(ctx, h, data, backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	size := int64(len(data))
	tests := []struct {
		name   string
		off, n int64
		buf    []byte
	}{
		{"short, unaligned", 5000, 30 << 10, nil},
		{"long, aligned", 4096, DirectRangeMin, nil},
		{"long, unaligned", 4097, DirectRangeMin + 3, nil},
		{"long, to the last byte", size - DirectRangeMin - 77, DirectRangeMin + 77, nil},
		{"long, into a buffer", 123, 2 * DirectRangeMin, make([]byte, 0, 4*DirectRangeMin)},
		{"whole file", 0, size, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := b.GetRange(ctx, h, tt.off, tt.n, tt.buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[tt.off:tt.off+tt.n]) {
				t.Fatalf("GetRange(%d, %d): %d bytes, not the file's", tt.off, tt.n, len(got))
			}
		})
	}
	for _, n := range []int64{100, DirectRangeMin} {
		if _, err := b.GetRange(ctx, h, size-n+1, n, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("GetRange of %d bytes one past the end: %v, want io.ErrUnexpectedEOF", n, err)
		}
	}
}
