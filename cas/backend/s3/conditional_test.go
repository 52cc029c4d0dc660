package s3_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// TestCompareAndSwap: PutIfMatch and DeleteIfMatch act only on the version
// read, on versitygw as on AWS.
func TestCompareAndSwap(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, s3.Options{})
	ctx := context.Background()
	h := backend.Handle{Kind: backend.Lock, Name: "writer"}
	// AWS answers 404 NoSuchKey to If-Match on a missing key.
	if _, err := b.PutIfMatch(ctx, h, []byte("x"), `"0123"`); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("PutIfMatch of a missing object: %v, want ErrNotExist", err)
	}
	if err := b.Put(ctx, h, []byte("v1"), backend.PutOptions{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	got, tag1, err := b.GetTag(ctx, h, nil)
	if err != nil || string(got) != "v1" || tag1 == "" {
		t.Fatalf("GetTag: %q %q %v", got, tag1, err)
	}
	tag2, err := b.PutIfMatch(ctx, h, []byte("v2"), tag1)
	if err != nil || tag2 == "" || tag2 == tag1 {
		t.Fatalf("PutIfMatch with the current tag: %q, %v", tag2, err)
	}
	if _, err := b.PutIfMatch(ctx, h, []byte("v3"), tag1); !errors.Is(err, s3.ErrModified) {
		t.Fatalf("PutIfMatch with a stale tag: %v, want ErrModified", err)
	}
	if err := b.DeleteIfMatch(ctx, h, tag1); !errors.Is(err, s3.ErrModified) {
		t.Fatalf("DeleteIfMatch with a stale tag: %v, want ErrModified", err)
	}
	if got, tag, err := b.GetTag(ctx, h, nil); err != nil || string(got) != "v2" || tag != tag2 {
		t.Fatalf("after refused writes: %q %q %v, want v2 %q", got, tag, err, tag2)
	}
	if err := b.DeleteIfMatch(ctx, h, tag2); err != nil {
		t.Fatalf("DeleteIfMatch with the current tag: %v", err)
	}
	if _, err := b.Stat(ctx, h); !errors.Is(err, backend.ErrNotExist) {
		t.Fatalf("after DeleteIfMatch: %v", err)
	}
	if err := b.DeleteIfMatch(ctx, h, tag2); err != nil {
		t.Fatalf("DeleteIfMatch of a missing object: %v, want nil", err)
	}
}

// TestCompareAndSwapRace: of writers that all read the same version and
// replace it with PutIfMatch, exactly one wins.
func TestCompareAndSwapRace(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, s3.Options{})
	ctx := context.Background()
	h := backend.Handle{Kind: backend.Lock, Name: "writer"}
	for round := range 5 {
		if err := b.Put(ctx, h, []byte(fmt.Sprint("stale ", round)), backend.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		_, tag, err := b.GetTag(ctx, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 10
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { _, errs[i] = b.PutIfMatch(ctx, h, []byte(fmt.Sprint("taker ", round, i)), tag) })
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: takers %d and %d both replaced the same version", round, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, s3.ErrModified):
				t.Fatalf("round %d taker %d: %v", round, i, err)
			}
		}
		got, err := b.Get(ctx, h, nil)
		if winner < 0 || err != nil || string(got) != fmt.Sprint("taker ", round, winner) {
			t.Fatalf("round %d: winner %d, object %q, %v", round, winner, got, err)
		}
	}
}

// TestPutIfMatchAnswerLost: a conditional replace whose answer is lost is
// retried; the retry's 412 comes from our own write and is success.
func TestPutIfMatchAnswerLost(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	// The dropped answer is a closed connection, not a timeout: the default
	// request timeout, so that a slow server (moto on a busy machine) is no
	// failure.
	b := open(t, proxy.URL, s3.Options{Backoff: fast.Backoff})
	ctx := context.Background()
	h := backend.Handle{Kind: backend.Lock, Name: "writer"}
	if err := b.Put(ctx, h, []byte("v1"), backend.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	_, tag, err := b.GetTag(ctx, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Set(s3test.Fault{Match: s3test.IsPut, DropResponse: true, Times: 1})
	tag2, err := b.PutIfMatch(ctx, h, []byte("v2"), tag)
	if err != nil {
		t.Fatalf("PutIfMatch with a lost answer: %v", err)
	}
	if proxy.Injected() != 1 {
		t.Fatal("the answer was not dropped")
	}
	if got, tag, err := b.GetTag(ctx, h, nil); err != nil || string(got) != "v2" || tag != tag2 {
		t.Fatalf("stored %q %q %v, want v2 %q", got, tag, err, tag2)
	}
}

// TestCheckConditional: the mount's probe passes on the test server,
// refuses one that ignores the conditional headers with ErrUnsupported
// naming the header, and leaves no object behind either way.
func TestCheckConditional(t *testing.T) {
	srv := s3test.Start(t)
	proxy := s3test.NewProxy(t, srv.Endpoint)
	ctx := context.Background()
	tests := []struct {
		name   string
		fault  s3test.Fault
		header string // "" when the probe passes
	}{
		{"conditional writes", s3test.Fault{}, ""},
		{"If-None-Match ignored", s3test.Fault{IgnoreConditions: true, Match: hasHeader("If-None-Match")}, "If-None-Match"},
		{"If-Match ignored", s3test.Fault{IgnoreConditions: true, Match: hasHeader("If-Match")}, "If-Match"},
		{"If-Match on DELETE ignored", s3test.Fault{IgnoreConditions: true, Match: func(r *http.Request) bool {
			return r.Method == http.MethodDelete && hasHeader("If-Match")(r)
		}}, "If-Match on DELETE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := open(t, proxy.URL, s3.Options{Backoff: fast.Backoff})
			proxy.Set(tt.fault)
			defer proxy.Clear()
			before := proxy.Injected()
			err := b.CheckConditional(ctx)
			switch {
			case tt.header == "" && err != nil:
				t.Fatalf("CheckConditional: %v", err)
			case tt.header != "" && (!errors.Is(err, s3.ErrUnsupported) || !strings.Contains(err.Error(), "ignores "+tt.header)):
				t.Fatalf("CheckConditional with %s: %v, want ErrUnsupported naming %s", tt.name, err, tt.header)
			case tt.header != "" && proxy.Injected() == before:
				t.Fatal("the proxy changed no request")
			}
			t.Logf("%s: %v", tt.name, err)
			n := 0
			if err := b.List(ctx, backend.Lock, func(backend.Info) error { n++; return nil }); err != nil || n != 0 {
				t.Fatalf("after the probe: %d objects under locks/ (%v), want 0", n, err)
			}
		})
	}
}

func hasHeader(name string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Header.Get(name) != "" }
}

// TestUnreachableHasNoErrno: the error of a server that is down carries
// no syscall.Errno (ECONNREFUSED) that fusefs would hand to read(2) instead
// of EIO, and stays transient.
func TestUnreachableHasNoErrno(t *testing.T) {
	srv := s3test.Start(t)
	b := open(t, srv.Endpoint, fast)
	srv.Stop()
	_, err := b.Get(context.Background(), chunkH("down"), nil)
	var errno syscall.Errno
	if err == nil || errors.As(err, &errno) || b.IsPermanent(err) {
		t.Fatalf("Get from a stopped server: %v (errno %v, permanent %v), want a transient error without an errno", err, errno, b.IsPermanent(err))
	}
	t.Log(err)
}
