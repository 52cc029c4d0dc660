package s3_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/backendtest"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

var prefixes atomic.Int64

// open returns a backend on a fresh prefix of the bucket behind endpoint.
func open(tb testing.TB, endpoint string, opts s3.Options) *s3.Backend {
	tb.Helper()
	return openAt(tb, endpoint, fmt.Sprintf("s3://%s/t%d/p", s3test.Bucket, prefixes.Add(1)), opts)
}

// openAt returns a backend on url's bucket and prefix behind endpoint.
func openAt(tb testing.TB, endpoint, url string, opts s3.Options) *s3.Backend {
	tb.Helper()
	_, prefix, err := s3.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	return s3test.Open(tb, endpoint, prefix, opts)
}

func TestConformance(t *testing.T) {
	srv := s3test.Start(t)
	backendtest.Run(t, func(tb testing.TB) backend.Backend { return open(tb, srv.Endpoint, s3.Options{}) })
}
