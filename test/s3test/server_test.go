package s3test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestMissingBinary: without the tools, the message says how to get them.
func TestMissingBinary(t *testing.T) {
	t.Setenv("CKPTFS_TOOLS", t.TempDir())
	_, err := Binary()
	if err == nil || !strings.Contains(err.Error(), "test/tools.sh") {
		t.Fatalf("Binary() with no tools: %v, want a message naming test/tools.sh", err)
	}
}

// TestServer: the server listens on loopback only, its bucket exists, and a
// restart keeps the port and the objects.
func TestServer(t *testing.T) {
	s := Start(t)
	host, _, err := net.SplitHostPort(strings.TrimPrefix(s.Endpoint, "http://"))
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("endpoint %s is not on 127.0.0.1", s.Endpoint)
	}
	ctx := context.Background()
	c := s.Client()
	if _, err := c.PutObject(ctx, &s3api.PutObjectInput{Bucket: aws.String(Bucket), Key: aws.String("k"),
		Body: strings.NewReader("v")}); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if _, err := c.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: aws.String(Bucket), Key: aws.String("k")}); err == nil {
		t.Fatal("the stopped server answered")
	}
	s.Restart()
	if _, err := c.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: aws.String(Bucket), Key: aws.String("k")}); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}
