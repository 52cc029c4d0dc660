package remote

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// bucketKeys returns every key of the test bucket with its ETag.
func bucketKeys(t *testing.T, srv *s3test.Server) map[string]string {
	t.Helper()
	c := srv.Client()
	out := map[string]string{}
	var token *string
	for {
		page, err := c.ListObjectsV2(context.Background(), &s3api.ListObjectsV2Input{Bucket: aws.String(s3test.Bucket), ContinuationToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			out[aws.ToString(o.Key)] = aws.ToString(o.ETag)
		}
		if !aws.ToBool(page.IsTruncated) {
			return out
		}
		token = page.NextContinuationToken
	}
}

// TestRootPrefixLeavesOthersAlone: stores on the bucket root (s3://BUCKET,
// an empty prefix) collect their garbage, in two phases beside a live
// writer and at once alone, without touching another tool's objects at the
// root (restic's layout, a lock of a name ckptfs does not use) or the
// objects of other ckptfs stores nested under other/ and under chunks/
// (a prefix named like the root's own sub-prefix), their unnamed chunks
// included; those stores still read their files, and a nested store's own
// collection leaves the root's files alone (doc.go, "The bucket root").
func TestRootPrefixLeavesOthersAlone(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)

	// Two stores nested in the bucket, each with a published file and the
	// chunks of a removed one, unnamed in the bucket; then gone.
	type nestedStore struct {
		be   backend.Backend
		keep []byte
		gone int // its unnamed chunk objects
	}
	nested := map[string]*nestedStore{}
	for i, p := range []string{"other", "chunks"} {
		n := &nestedStore{be: s3test.Open(t, srv.Endpoint, p, s3.Options{}), keep: pseudoRandom(90000, byte(60+i))}
		s, r := testStore(t, n.be)
		sess := join(t, s, r)
		commitNamed(t, s, "keep", n.keep)
		commitNamed(t, s, "gone", pseudoRandom(150000, byte(70+i)))
		if err := r.UploadRound(ctx, true); err != nil {
			t.Fatal(err)
		}
		n.gone = len(readPublished(t, n.be)["gone"].m.Chunks)
		unlinkNamed(t, s, "gone")
		if err := r.UploadRound(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := sess.Close(ctx); err != nil {
			t.Fatal(err)
		}
		nested[p] = n
	}
	// Another tool's objects at the root, some in ckptfs's sub-prefixes.
	hex := chunkHandle(cas.Sum([]byte("another tool"))).Name
	for _, key := range []string{"README.md", "config", "data/ab/" + hex, "keys/" + hex,
		"locks/" + hex, "locks/notes.txt", "chunks/README", "chunks/ab/cd/x.tmp", "manifests/" + hex + ".json"} {
		if _, err := srv.Client().PutObject(ctx, &s3api.PutObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String(key), Body: bytes.NewReader([]byte(key))}); err != nil {
			t.Fatal(err)
		}
	}
	before := bucketKeys(t, srv)

	// Two writers at the root: writer 0 wrote and removed f.
	root := s3test.Open(t, srv.Endpoint, "", s3.Options{})
	fx := newTrashFixture(t, root, 2, SessionOptions{Logf: t.Logf}, true)
	gc := fx.tiers[1]
	res, err := gc.Collect(ctx, time.Now(), nil, false)
	if err != nil || res.Trashed != len(fx.fChunks) {
		t.Fatalf("the root's trash phase: %+v %v, want f's %d chunks trashed", res, err, len(fx.fChunks))
	}
	fx.roundAll(t)
	fx.age()
	if res, err = gc.Collect(ctx, time.Now(), nil, false); err != nil || res.Freed != len(fx.fChunks) {
		t.Fatalf("the root's purge: %+v %v, want f's %d chunks freed", res, err, len(fx.fChunks))
	}
	// Alone at the root now: the collection deletes at once.
	if err := fx.sess[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	commitNamed(t, fx.stores[1], "g", pseudoRandom(120000, 81))
	fx.roundAll(t, 0)
	unlinkNamed(t, fx.stores[1], "g")
	fx.roundAll(t, 0)
	fx.age()
	if res, err = gc.Collect(ctx, time.Now(), nil, false); err != nil || res.Freed == 0 || res.Trashed != 0 {
		t.Fatalf("the root's collection alone: %+v %v, want g's chunks freed at once", res, err)
	}

	after := bucketKeys(t, srv)
	for key, tag := range before {
		if after[key] != tag {
			t.Errorf("%s: ETag %q after the root's collections, was %q (deleted or rewritten)", key, after[key], tag)
		}
	}
	for p, n := range nested {
		if got := readFresh(t, n.be, "keep"); !bytes.Equal(got, n.keep) {
			t.Errorf("the store under %s/ reads its file wrong after the root's collections", p)
		}
	}

	// A nested store's own collection frees its own garbage, nothing of
	// the root's.
	o := nested["other"]
	s, r := testStore(t, o.be)
	join(t, s, r)
	if res, err = r.Collect(ctx, time.Now(), nil, false); err != nil || res.Freed != o.gone {
		t.Fatalf("other/'s collection: %+v %v, want its %d unnamed chunks freed", res, err, o.gone)
	}
	if got := readFresh(t, root, "w1"); !bytes.Equal(got, fx.kept[1]) {
		t.Fatal("the root's file reads wrong after other/'s collection")
	}
	final := bucketKeys(t, srv)
	for key := range after {
		if _, ok := final[key]; !ok && !strings.HasPrefix(key, "other/chunks/") {
			t.Errorf("%s deleted by other/'s collection", key)
		}
	}
}
