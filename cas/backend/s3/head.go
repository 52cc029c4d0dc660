package s3

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// GetHead returns the first n bytes of h's object (all of it when it is
// shorter), read into buf when its capacity is enough: one ranged GET. The
// bucket's collection reads a delta's header with it (cas/remote) instead
// of the whole object. It is not a backend.RangeGetter on purpose: cas
// keeps packs in a backend that is one, and packs stay local. The bytes
// are not checked (a range has no stored MD5): the caller's decoder is.
func (b *Backend) GetHead(ctx context.Context, h backend.Handle, n int64, buf []byte) ([]byte, error) {
	if err := backend.CheckHandle(h); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("get the head of %v: %d bytes", h, n)
	}
	key := b.key(h)
	var out []byte
	err := b.do(ctx, "get", key, n, func(actx context.Context, a *attempt) error {
		resp, err := b.client.GetObject(actx, &s3api.GetObjectInput{Bucket: aws.String(b.bucket), Key: aws.String(key),
			Range: aws.String(fmt.Sprintf("bytes=0-%d", n-1))})
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if cap(buf) >= int(n) {
			out = buf[:n]
		} else {
			out = make([]byte, n)
		}
		m, err := io.ReadFull(resp.Body, out)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: %w", errTruncated, err)
		}
		if resp.ContentLength != nil && int64(m) != *resp.ContentLength {
			return fmt.Errorf("%w: %d bytes of a range of %d", errTruncated, m, *resp.ContentLength)
		}
		out = out[:m]
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.stats.getBytes.Add(int64(len(out)))
	return out, nil
}
