package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func chunkH(s string) backend.Handle {
	return backend.Handle{Kind: backend.Chunk, Name: backendtest.Name(s)}
}

// fast makes attempts short so that fault tests take a second, not minutes.
var fast = s3.Options{Attempts: 3, RequestTimeout: 300 * time.Millisecond, Backoff: 10 * time.Millisecond, MinThroughput: 64 << 20}

// bound is the longest a call with fast may take on an object of n bytes:
// three attempts and their backoffs, plus scheduling slack on a busy machine.
func bound(n int) time.Duration {
	per := fast.RequestTimeout + time.Duration(float64(n)/float64(fast.MinThroughput)*float64(time.Second))
	return time.Duration(fast.Attempts)*per + 2*time.Second
}

// TestPutIfAbsentRaceManyKeys shows that versitygw honours If-None-Match: *
// atomically: of many concurrent conditional PUTs of one new key exactly one
// wins, on every key, and the stored object is the winner's.
func TestPutIfAbsentRaceManyKeys(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, s3.Options{})
	const keys, writers = 20, 12
	var wg sync.WaitGroup
	errs := make([][]error, keys)
	for k := range keys {
		errs[k] = make([]error, writers)
		for w := range writers {
			wg.Go(func() {
				h := backend.Handle{Kind: backend.Lock, Name: fmt.Sprintf("key%d", k)}
				errs[k][w] = b.Put(context.Background(), h, []byte(fmt.Sprintf("writer %d", w)), backend.PutOptions{IfAbsent: true})
			})
		}
	}
	wg.Wait()
	for k := range keys {
		winner := -1
		for w, err := range errs[k] {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("key %d: writers %d and %d both won", k, winner, w)
			case err == nil:
				winner = w
			case !errors.Is(err, backend.ErrExists):
				t.Fatalf("key %d writer %d: %v", k, w, err)
			}
		}
		if winner < 0 {
			t.Fatalf("key %d: nobody won", k)
		}
		got, err := b.Get(context.Background(), backend.Handle{Kind: backend.Lock, Name: fmt.Sprintf("key%d", k)}, nil)
		if err != nil || string(got) != fmt.Sprintf("writer %d", winner) {
			t.Fatalf("key %d holds %q (%v), want writer %d's", k, got, err, winner)
		}
	}
}

// TestServerStoppedAndRestarted: with the server down, calls fail quickly
// with transient errors; after a restart on the same port, the caller's retry
// succeeds and everything stored before the stop is still there.
func TestServerStoppedAndRestarted(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, fast)
	ctx := context.Background()
	before := map[backend.Handle][]byte{}
	for i := range 10 {
		h := chunkH(fmt.Sprint("before", i))
		before[h] = randBytes(100 << 10)
		if err := b.Put(ctx, h, before[h], backend.PutOptions{IfAbsent: true}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()
	h := chunkH("during")
	obj := randBytes(1 << 20)
	start := time.Now()
	err := b.Put(ctx, h, obj, backend.PutOptions{IfAbsent: true})
	if err == nil {
		t.Fatal("Put with the server stopped succeeded")
	}
	if b.IsPermanent(err) {
		t.Fatalf("Put with the server stopped failed permanently: %v", err)
	}
	if d := time.Since(start); d > bound(len(obj)) {
		t.Fatalf("Put with the server stopped took %v (bound %v)", d, bound(len(obj)))
	}
	if _, err := b.Get(ctx, h, nil); err == nil || b.IsPermanent(err) {
		t.Fatalf("Get with the server stopped: %v, want a transient error", err)
	}
	srv.Restart()
	if err := b.Put(ctx, h, obj, backend.PutOptions{IfAbsent: true}); err != nil {
		t.Fatalf("retried Put after the restart: %v", err)
	}
	before[h] = obj
	for h, want := range before {
		got, err := b.Get(ctx, h, nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after the restart %v: %v (equal %v)", h, err, bytes.Equal(got, want))
		}
	}
}

// TestServerStoppedMidUpload stops the server while a large PUT is in
// flight (held by the proxy): the Put fails within its bound, and the
// caller's retry after the restart stores the object whole.
func TestServerStoppedMidUpload(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	opts := fast
	opts.RequestTimeout = 2 * time.Second
	b := open(t, proxy.URL, opts)
	proxy.Set(s3test.Fault{Match: s3test.IsPut, Delay: 500 * time.Millisecond})
	h := chunkH("mid-upload")
	obj := randBytes(8 << 20)
	done := make(chan error, 1)
	go func() { done <- b.Put(context.Background(), h, obj, backend.PutOptions{IfAbsent: true}) }()
	time.Sleep(200 * time.Millisecond)
	srv.Stop()
	err := <-done
	if err == nil || b.IsPermanent(err) {
		t.Fatalf("Put across a server stop: %v, want a transient error", err)
	}
	srv.Restart()
	proxy.Clear()
	if err := b.Put(context.Background(), h, obj, backend.PutOptions{IfAbsent: true}); err != nil {
		t.Fatalf("retry after restart: %v", err)
	}
	got, err := b.Get(context.Background(), h, nil)
	if err != nil || !bytes.Equal(got, obj) {
		t.Fatalf("object after restart: %v (equal %v)", err, bytes.Equal(got, obj))
	}
}

// TestFaults puts a misbehaving proxy between the backend and the server:
// every call either returns the right bytes or an error, within its bound;
// never damaged data as success.
func TestFaults(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	const size = 256 << 10
	for _, tc := range []struct {
		name  string
		fault s3test.Fault
		put   bool // the fault hits the Put, not the Get
		ok    bool // the call succeeds (after retries)
		// perm: the error is permanent. A body damaged on every attempt
		// cannot be told from an object damaged at rest.
		perm bool
	}{
		{"get 500 always", s3test.Fault{Match: s3test.IsGet, Status: 500}, false, false, false},
		{"get 503 twice", s3test.Fault{Match: s3test.IsGet, Status: 503, Times: 2}, false, true, false},
		{"get slow", s3test.Fault{Match: s3test.IsGet, Delay: 5 * time.Second}, false, false, false},
		{"get slow once", s3test.Fault{Match: s3test.IsGet, Delay: 5 * time.Second, Times: 1}, false, true, false},
		{"get hang-up", s3test.Fault{Match: s3test.IsGet, HangUp: true}, false, false, false},
		{"get truncated", s3test.Fault{Match: s3test.IsGet, TruncateResponse: true}, false, false, false},
		{"get truncated once", s3test.Fault{Match: s3test.IsGet, TruncateResponse: true, Times: 1}, false, true, false},
		{"get short with matching length", s3test.Fault{Match: s3test.IsGet, ShortResponse: true}, false, false, true},
		{"get corrupted", s3test.Fault{Match: s3test.IsGet, CorruptResponse: true}, false, false, true},
		{"get corrupted once", s3test.Fault{Match: s3test.IsGet, CorruptResponse: true, Times: 1}, false, true, false},
		{"get stalled body", s3test.Fault{Match: s3test.IsGet, StallResponse: 5 * time.Second}, false, false, false},
		{"put 500 always", s3test.Fault{Match: s3test.IsPut, Status: 500}, true, false, false},
		{"put slow", s3test.Fault{Match: s3test.IsPut, Delay: 5 * time.Second}, true, false, false},
		{"put corrupted on the way", s3test.Fault{Match: s3test.IsPut, CorruptRequest: true}, true, false, false},
		{"put corrupted once", s3test.Fault{Match: s3test.IsPut, CorruptRequest: true, Times: 1}, true, true, false},
		{"put answer lost", s3test.Fault{Match: s3test.IsPut, DropResponse: true, Times: 1}, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := open(t, proxy.URL, fast)
			ctx := context.Background()
			h := chunkH(tc.name)
			obj := randBytes(size)
			if !tc.put {
				if err := b.Put(ctx, h, obj, backend.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			proxy.Set(tc.fault)
			defer proxy.Clear()
			injected := proxy.Injected()
			start := time.Now()
			var err error
			var got []byte
			if tc.put {
				err = b.Put(ctx, h, obj, backend.PutOptions{IfAbsent: true})
			} else {
				got, err = b.Get(ctx, h, nil)
			}
			elapsed := time.Since(start)
			if proxy.Injected() == injected {
				t.Fatal("the fault was never injected")
			}
			if elapsed > bound(size) {
				t.Fatalf("took %v, bound %v (err %v)", elapsed, bound(size), err)
			}
			if !tc.ok {
				if err == nil {
					if tc.put {
						t.Fatal("Put succeeded through a fault that should make it fail")
					}
					t.Fatalf("Get succeeded through the fault (bytes equal: %v)", bytes.Equal(got, obj))
				}
				if b.IsPermanent(err) != tc.perm {
					t.Fatalf("IsPermanent(%v) = %v, want %v", err, !tc.perm, tc.perm)
				}
			} else if err != nil {
				t.Fatalf("the retry should have got through: %v", err)
			}
			proxy.Clear()
			// Whatever happened, the bucket holds the right bytes or nothing.
			stored, gerr := b.Get(ctx, h, nil)
			switch {
			case errors.Is(gerr, backend.ErrNotExist) && tc.put && !tc.ok:
			case gerr != nil:
				t.Fatalf("Get after the fault: %v", gerr)
			case !bytes.Equal(stored, obj):
				t.Fatal("the bucket holds other bytes than were Put")
			}
			if !tc.put && tc.ok && !bytes.Equal(got, obj) {
				t.Fatal("Get returned other bytes than were Put")
			}
		})
	}
}

// TestDamagedAtRest: an object whose stored bytes were changed behind the
// server's back (bit rot, a bad disk, a tool) fails Get permanently, naming
// the damage; it is never returned.
func TestDamagedAtRest(t *testing.T) {
	srv := s3test.Start(t)
	url := srv.URL(fmt.Sprintf("rot%d", prefixes.Add(1)))
	b := openAt(t, srv.Endpoint, url, fast)
	h := chunkH("rot")
	obj := randBytes(64 << 10)
	if err := b.Put(context.Background(), h, obj, backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	_, prefix, _ := s3.ParseURL(url)
	path := filepath.Join(srv.Dir, s3test.Bucket, prefix, "chunks", h.Name[:2], h.Name[2:4], h.Name[4:])
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("the object is not where versitygw keeps it: %v", err)
	}
	if _, err := f.WriteAt([]byte{obj[1000] ^ 1}, 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := b.Get(context.Background(), h, nil)
	if err == nil {
		t.Fatalf("Get of a damaged object succeeded (bytes equal: %v)", bytes.Equal(got, obj))
	}
	if !b.IsPermanent(err) || !strings.Contains(err.Error(), "MD5") {
		t.Fatalf("Get of a damaged object: %v (permanent %v), want a permanent MD5 error", err, b.IsPermanent(err))
	}
}

// TestIfAbsentAnswerLostToAnother: when the retry of a conditional Put whose
// first attempt got no answer finds someone else's object, that is
// ErrExists, not our success (the writer lock depends on it); when it finds
// its own bytes, it is success (TestFaults "put answer lost").
func TestIfAbsentAnswerLostToAnother(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	url := srv.URL(fmt.Sprintf("lost%d", prefixes.Add(1)))
	me := openAt(t, proxy.URL, url, fast)
	other := openAt(t, srv.Endpoint, url, fast)
	h := backend.Handle{Kind: backend.Lock, Name: "writer"}
	// My first attempt is held, then dropped before it reaches the server;
	// meanwhile the other writer takes the lock.
	proxy.Set(s3test.Fault{Match: s3test.IsPut, Delay: 250 * time.Millisecond, HangUp: true, Times: 1})
	done := make(chan error, 1)
	go func() { done <- me.Put(context.Background(), h, []byte("me"), backend.PutOptions{IfAbsent: true}) }()
	time.Sleep(50 * time.Millisecond)
	if err := other.Put(context.Background(), h, []byte("other"), backend.PutOptions{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, backend.ErrExists) {
		t.Fatalf("my retried Put found the other's lock: %v, want ErrExists", err)
	}
	if proxy.Injected() != 1 {
		t.Fatalf("fault injected %d times, want 1", proxy.Injected())
	}
}

// TestCancel: a call blocked on a slow server returns promptly with
// context.Canceled when its context is cancelled.
func TestCancel(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	b := open(t, proxy.URL, s3.Options{}) // default, long timeouts
	h := chunkH("cancel")
	if err := b.Put(context.Background(), h, randBytes(1000), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy.Set(s3test.Fault{Delay: time.Minute})
	for _, op := range []string{"get", "put", "stat", "list"} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		var err error
		switch op {
		case "get":
			_, err = b.Get(ctx, h, nil)
		case "put":
			err = b.Put(ctx, chunkH("cancel2"), randBytes(1000), backend.PutOptions{})
		case "stat":
			_, err = b.Stat(ctx, h)
		case "list":
			err = b.List(ctx, backend.Chunk, func(backend.Info) error { return nil })
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s cancelled: %v, want context.Canceled", op, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s returned %v after its context was cancelled", op, d)
		}
	}
}

// TestForeignObjectsIgnored: keys under the prefix that are not ckptfs
// objects are not listed, and objects written by another tool (without the
// MD5 metadata) are still read.
func TestForeignObjectsIgnored(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, s3.Options{})
	prefix := b.Location()[len("s3://"+s3test.Bucket+"/"):]
	prefix = prefix[:len(prefix)-len(" at "+srv.Endpoint)]
	c := srv.Client()
	ctx := context.Background()
	h := chunkH("foreign")
	name := h.Name
	for key, body := range map[string]string{
		prefix + "/chunks/" + name[:2] + "/" + name[2:4] + "/" + name[4:]: "by another tool",
		prefix + "/chunks/README":              "x",
		prefix + "/chunks/ab/cd/short":         "x",
		prefix + "/manifests/" + name + ".tmp": "x",
	} {
		if _, err := c.PutObject(ctx, &s3api.PutObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String(key), Body: bytes.NewReader([]byte(body))}); err != nil {
			t.Fatal(err)
		}
	}
	var got []backend.Handle
	for _, k := range backend.Kinds {
		if err := b.List(ctx, k, func(in backend.Info) error { got = append(got, in.Handle); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || got[0] != h {
		t.Fatalf("List reported %v, want only %v", got, h)
	}
	obj, err := b.Get(ctx, h, nil)
	if err != nil || string(obj) != "by another tool" {
		t.Fatalf("Get of an object without MD5 metadata: %q, %v", obj, err)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in, bucket, prefix string
		ok                 bool
	}{
		{"s3://b/p", "b", "p", true},
		{"s3://b/p/q/", "b", "p/q", true},
		{"s3://b", "b", "", true},
		{"s3://b/", "b", "", true},
		{"s3:///p", "", "", false},
		{"http://b/p", "", "", false},
		{"s3://b/p?x=1", "", "", false},
		{"s3://k:s@b/p", "", "", false},
		{"s3://b/a//c", "", "", false},
		{"b/p", "", "", false},
	} {
		bucket, prefix, err := s3.ParseURL(tc.in)
		if (err == nil) != tc.ok || bucket != tc.bucket || prefix != tc.prefix {
			t.Errorf("ParseURL(%q) = %q, %q, %v", tc.in, bucket, prefix, err)
		}
	}
}

// TestOpenErrors: a wrong bucket or wrong keys fail at Open, with a message
// that says so, and do not hang.
func TestOpenErrors(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	_, err := s3.Open(ctx, "s3://no-such-bucket/p", s3.Options{Endpoint: srv.Endpoint, Region: s3test.Region,
		Credentials: staticCreds(s3test.AccessKey, s3test.SecretKey)})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("does not exist")) {
		t.Fatalf("Open of a missing bucket: %v", err)
	}
	_, err = s3.Open(ctx, "s3://"+s3test.Bucket+"/p", s3.Options{Endpoint: srv.Endpoint, Region: s3test.Region,
		Credentials: staticCreds(s3test.AccessKey, "wrong secret")})
	if err == nil {
		t.Fatal("Open with a wrong secret succeeded")
	}
	t.Logf("wrong secret: %v", err)
	// A key id the server does not know: the same kind of message, not
	// "does not exist" (versitygw answers it with a 404).
	_, err = s3.Open(ctx, "s3://"+s3test.Bucket+"/p", s3.Options{Endpoint: srv.Endpoint, Region: s3test.Region,
		Credentials: staticCreds("no-such-key-id", s3test.SecretKey)})
	if err == nil || !errors.Is(err, s3.ErrDenied) {
		t.Fatalf("Open with an unknown access key id: %v, want ErrDenied", err)
	}
	t.Logf("unknown key id: %v", err)
}

// TestEnvConfig: with only the standard AWS_* variables set (as a user
// would for the aws CLI), Open finds the endpoint, credentials and region.
func TestEnvConfig(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	b, err := s3.Open(context.Background(), srv.URL("env"), s3.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Put(context.Background(), chunkH("env"), []byte("x"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().HeadObject(context.Background(), &s3api.HeadObjectInput{
		Bucket: aws.String(s3test.Bucket), Key: aws.String("env/chunks/" + chunkH("env").Name[:2] + "/" + chunkH("env").Name[2:4] + "/" + chunkH("env").Name[4:]),
	}); err != nil {
		t.Fatalf("the object is not at the documented key: %v", err)
	}
}

func staticCreds(key, secret string) aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(key, secret, "")
}
