package s3

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// Compare-and-swap on mutable objects (the writer lock): read an object with
// its version tag (the ETag), then replace or delete it only if it still has
// that tag (If-Match on PutObject and DeleteObject; AWS since 2024-2025,
// versitygw and s3proxy; MinIO ignores If-Match on DeleteObject). A lock
// taken over by rewriting it with PutIfMatch, instead of deleting it and
// putting a new one, cannot be taken by two writers at once: of two writers
// that read the same stale lock, one replaces it and the other gets
// ErrModified. Likewise a heartbeat written with PutIfMatch never overwrites a
// lock someone else took meanwhile, and Unlock with DeleteIfMatch never
// removes someone else's.

// ErrModified means the object no longer has the tag a conditional write
// named: someone else changed or replaced it.
var ErrModified = errors.New("s3: object changed since it was read")

// GetTag returns h's object and its version tag, read in one response.
func (b *Backend) GetTag(ctx context.Context, h backend.Handle, buf []byte) ([]byte, string, error) {
	if err := backend.CheckHandle(h); err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	return b.getTag(ctx, b.key(h), buf)
}

// PutIfMatch replaces h's object with obj if its version tag is still tag,
// and returns the new tag. It fails with ErrModified when the object has
// another tag, and with an error wrapping backend.ErrNotExist when it is
// gone. As with IfAbsent puts, a retry that finds the object changed after an
// attempt whose answer was lost reads it back: if it holds obj, the change was
// ours and PutIfMatch succeeds (give every write distinct bytes, a holder id
// and a time, for that to mean anything).
func (b *Backend) PutIfMatch(ctx context.Context, h backend.Handle, obj []byte, tag string) (string, error) {
	if err := backend.CheckHandle(h); err != nil {
		return "", err
	}
	if tag == "" {
		return "", errors.New("s3: PutIfMatch needs a tag")
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	sum := md5.Sum(obj)
	key := b.key(h)
	var newTag string
	uncertain := false
	err := b.do(ctx, "put if match", key, int64(len(obj)), func(actx context.Context, _ *attempt) error {
		resp, err := b.client.PutObject(actx, &s3api.PutObjectInput{
			Bucket:        aws.String(b.bucket),
			Key:           aws.String(key),
			Body:          bytes.NewReader(obj),
			ContentLength: aws.Int64(int64(len(obj))),
			ContentMD5:    aws.String(base64.StdEncoding.EncodeToString(sum[:])),
			ContentType:   aws.String("application/octet-stream"),
			Metadata:      map[string]string{md5Meta: hex.EncodeToString(sum[:])},
			IfMatch:       aws.String(tag),
		}, unsignedPayload)
		if err == nil {
			newTag = aws.ToString(resp.ETag)
			return nil
		}
		if uncertain && (statusOf(err) == http.StatusPreconditionFailed || statusOf(err) == http.StatusNotFound) {
			if got, t, gerr := b.getTag(ctx, key, nil); gerr == nil && bytes.Equal(got, obj) {
				newTag = t
				return nil
			}
		}
		if !isDefinite(err) {
			uncertain = true
		}
		return err
	})
	if errors.Is(err, backend.ErrExists) { // 412: the precondition failed
		return "", fmt.Errorf("%w (%v)", ErrModified, err)
	}
	return newTag, err
}

// DeleteIfMatch removes h's object if its version tag is still tag. It
// fails with ErrModified when the object has another tag; a missing object is
// not an error (whoever removed it, the version named is gone).
func (b *Backend) DeleteIfMatch(ctx context.Context, h backend.Handle, tag string) error {
	if err := backend.CheckHandle(h); err != nil {
		return err
	}
	if tag == "" {
		return errors.New("s3: DeleteIfMatch needs a tag")
	}
	key := b.key(h)
	err := b.do(ctx, "delete if match", key, 0, func(actx context.Context, _ *attempt) error {
		_, err := b.client.DeleteObject(actx, &s3api.DeleteObjectInput{
			Bucket: aws.String(b.bucket), Key: aws.String(key), IfMatch: aws.String(tag),
		})
		return err
	})
	switch {
	case errors.Is(err, backend.ErrNotExist):
		return nil
	case errors.Is(err, backend.ErrExists):
		return fmt.Errorf("%w (%v)", ErrModified, err)
	}
	return err
}
