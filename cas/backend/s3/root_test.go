package s3_test

import (
	"bytes"
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// chunkKey is where a backend on prefix (ending in "/", or "") keeps chunk
// name.
func chunkKey(prefix, name string) string {
	return prefix + "chunks/" + name[:2] + "/" + name[2:4] + "/" + name[4:]
}

// TestRootPrefixConfined: a backend on the bucket root (s3://BUCKET, an
// empty prefix) lists only keys of its own exact shapes: not another
// tool's keys at the root, not the look-alikes of its names, and not the
// keys of other ckptfs stores nested under any prefix, even one named
// chunks/, locks/ or manifests/ (package doc, "The bucket root"). A store
// nested under other/ in turn lists only its own keys.
func TestRootPrefixConfined(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	root := openAt(t, srv.Endpoint, "s3://"+s3test.Bucket, s3.Options{})
	nested := openAt(t, srv.Endpoint, "s3://"+s3test.Bucket+"/other/", s3.Options{})

	chunk, man := backendtest.Name("root chunk"), backendtest.Name("root manifest")
	n := backendtest.Name("nested")
	foreign := []string{
		// Another tool's objects at the root (restic's layout, a README).
		"README.md", "config", "data/ab/" + n, "index/" + n, "snapshots/" + n,
		// Look-alikes of ckptfs's names.
		chunkKey("", n) + ".tmp", "chunks/" + strings.ToUpper(n[:2]) + "/" + strings.ToUpper(n[2:4]) + "/" + strings.ToUpper(n[4:]),
		"chunks/README", "chunks/ab/cd/short", "manifests/" + n + ".json", "locks/Gc", "locks/a/b",
		// Other ckptfs stores, nested under prefixes that start like
		// ckptfs's own sub-prefixes.
		chunkKey("chunks/", n), "chunks/locks/gc", "chunks/manifests/" + n,
		chunkKey("chunks/ab/cd/", n), "chunks/ab/cd/locks/gc",
		chunkKey("locks/", n), "locks/locks/gc", "locks/locks/session.x",
		chunkKey("manifests/", n), "manifests/manifests/" + n, "manifests/locks/gc",
		chunkKey("deep/er/", n), "deep/er/locks/gc",
	}
	mine := []string{chunkKey("other/", n), "other/manifests/" + n, "other/locks/gc", "other/locks/session.x"}
	c := srv.Client()
	for _, key := range append(append([]string{}, foreign...), mine...) {
		if _, err := c.PutObject(ctx, &s3api.PutObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String(key), Body: bytes.NewReader([]byte(key))}); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	own := []backend.Handle{{Kind: backend.Chunk, Name: chunk}, {Kind: backend.Manifest, Name: man}, {Kind: backend.Lock, Name: "gc"}}
	for _, h := range own {
		if err := root.Put(ctx, h, []byte(h.String()), backend.PutOptions{IfAbsent: true}); err != nil {
			t.Fatal(err)
		}
	}
	// At the root, the keys carry no leading slash.
	if _, err := c.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String(chunkKey("", chunk))}); err != nil {
		t.Fatalf("the root's chunk is not at %s: %v", chunkKey("", chunk), err)
	}

	list := func(b *s3.Backend) []string {
		t.Helper()
		var got []string
		for _, k := range backend.Kinds {
			if err := b.List(ctx, k, func(in backend.Info) error { got = append(got, in.Handle.String()); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		sort.Strings(got)
		return got
	}
	want := []string{own[0].String(), own[2].String(), own[1].String()} // chunks, locks, manifests
	if got := list(root); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the root lists %v, want only its own %v", got, want)
	}
	want = []string{"chunks/" + n, "locks/gc", "locks/session.x", "manifests/" + n}
	if got := list(nested); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the store under other/ lists %v, want only its own %v", got, want)
	}
	// A delete at the root never reaches a nested key of the same name.
	if err := root.Delete(ctx, backend.Handle{Kind: backend.Lock, Name: "gc"}); err != nil {
		t.Fatal(err)
	}
	for _, key := range append(append([]string{}, foreign...), mine...) {
		if _, err := c.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String(key)}); err != nil {
			t.Errorf("%s after the root's delete of locks/gc: %v", key, err)
		}
	}
}
