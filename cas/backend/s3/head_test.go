package s3_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// TestGetHead: the first n bytes of an object, all of a shorter one, and
// ErrNotExist for none.
func TestGetHead(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, s3.Options{})
	long := bytes.Repeat([]byte("0123456789"), 10)
	short := []byte("short object")
	chunk := func(c string) backend.Handle { return backend.Handle{Kind: backend.Chunk, Name: strings.Repeat(c, 64)} }
	for name, obj := range map[string][]byte{"a": long, "b": short} {
		if err := b.Put(ctx, chunk(name), obj, backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		n    int64
		want []byte
	}{
		{"a", 60, long[:60]},
		{"a", 100, long},
		{"a", 1, long[:1]},
		{"b", 60, short},
	} {
		got, err := b.GetHead(ctx, chunk(tc.name), tc.n, nil)
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("GetHead(%s, %d) = %q, %v; want %q", tc.name, tc.n, got, err, tc.want)
		}
	}
	if _, err := b.GetHead(ctx, chunk("c"), 60, nil); !errors.Is(err, backend.ErrNotExist) {
		t.Errorf("GetHead of a missing object: %v, want ErrNotExist", err)
	}
}
