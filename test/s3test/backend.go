package s3test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/ckptfs/ckptfs/cas/backend/s3"
)

// Open returns a cas/backend/s3 backend on Bucket/prefix of the server at
// endpoint (a Server's or a Proxy's), with the test credentials, closed when
// tb ends. opts may shorten timeouts for fault tests; its endpoint, region
// and credentials are set here.
func Open(tb testing.TB, endpoint, prefix string, opts s3.Options) *s3.Backend {
	tb.Helper()
	opts.Endpoint = endpoint
	opts.Region = Region
	opts.Credentials = credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, "")
	b, err := s3.Open(context.Background(), "s3://"+Bucket+"/"+prefix, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b
}
