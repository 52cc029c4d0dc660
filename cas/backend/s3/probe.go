package s3

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/ckptfs/ckptfs/cas/backend"
)

// ErrUnsupported means the server does not honour a conditional request the
// remote tier's protocol rests on (cas/remote/doc.go): If-None-Match: * for
// create-only objects, If-Match for compare-and-swap.
var ErrUnsupported = errors.New("the server does not support conditional writes")

// probePrefix names the scratch objects CheckConditional writes under
// PREFIX/locks/; nothing else uses the name.
const probePrefix = "probe."

// CheckConditional asks the server, on a scratch object of its own under
// PREFIX/locks/, whether it honours the conditional writes a writing mount
// needs, and removes the object again:
//
//  1. a put-if-absent of a new key succeeds;
//  2. a second put-if-absent of that key, with other bytes, is refused (412)
//     and leaves the first bytes in place;
//  3. a replace with If-Match naming a version the object does not have is
//     refused and changes nothing;
//  4. a replace with If-Match naming the version read succeeds;
//  5. a delete with If-Match naming a version the object does not have is
//     refused and leaves the object (the writer lease's release relies on
//     it: cas/remote's Session.Close).
//
// A server that ignores the headers answers 200 to 2 or 3 (an unconditional
// write): CheckConditional then fails with ErrUnsupported and a message
// naming the header. Any other failure (the server is down, the credentials
// may not write) is returned as it is. It costs eight requests, once per
// writing mount.
func (b *Backend) CheckConditional(ctx context.Context) error {
	var nonce [8]byte
	rand.Read(nonce[:])
	h := backend.Handle{Kind: backend.Lock, Name: probePrefix + hex.EncodeToString(nonce[:])}
	body := func(step string) []byte {
		return []byte("ckptfs conditional-write probe " + h.Name + " " + step)
	}
	err := b.checkConditional(ctx, h, body)
	// Clean up whatever happened; a failed removal leaves only a small
	// object no reader looks at.
	if derr := b.Delete(context.WithoutCancel(ctx), h); derr != nil && err == nil {
		err = fmt.Errorf("remove the probe object: %w", derr)
	}
	if err != nil {
		return fmt.Errorf("s3: %s: check conditional writes: %w", b.location, err)
	}
	return nil
}

func (b *Backend) checkConditional(ctx context.Context, h backend.Handle, body func(string) []byte) error {
	if err := b.Put(ctx, h, body("create"), backend.PutOptions{IfAbsent: true}); err != nil {
		return fmt.Errorf("put-if-absent of a new key: %w", err)
	}
	err := b.Put(ctx, h, body("overwrite"), backend.PutOptions{IfAbsent: true})
	switch {
	case err == nil:
		return fmt.Errorf("%w: it ignores If-None-Match: * (a put-if-absent replaced an existing object)", ErrUnsupported)
	case !errors.Is(err, backend.ErrExists):
		return fmt.Errorf("put-if-absent of an existing key: %w", err)
	}
	got, tag, err := b.GetTag(ctx, h, nil)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, body("create")) {
		return fmt.Errorf("%w: a refused put-if-absent changed the object", ErrUnsupported)
	}
	other := md5.Sum(body("no such version"))
	_, err = b.PutIfMatch(ctx, h, body("stale"), `"`+hex.EncodeToString(other[:])+`"`)
	switch {
	case err == nil:
		return fmt.Errorf("%w: it ignores If-Match (a replace naming another version succeeded)", ErrUnsupported)
	case !errors.Is(err, ErrModified):
		return fmt.Errorf("replace with a stale If-Match: %w", err)
	}
	if _, err := b.PutIfMatch(ctx, h, body("replace"), tag); err != nil {
		if errors.Is(err, ErrModified) {
			return fmt.Errorf("%w: a replace with If-Match naming the current version was refused", ErrUnsupported)
		}
		return fmt.Errorf("replace with If-Match: %w", err)
	}
	err = b.DeleteIfMatch(ctx, h, tag) // tag is stale now
	if err != nil && !errors.Is(err, ErrModified) {
		return fmt.Errorf("delete with a stale If-Match: %w", err)
	}
	if _, serr := b.Stat(ctx, h); errors.Is(serr, backend.ErrNotExist) {
		return fmt.Errorf("%w: it ignores If-Match on DELETE (a delete naming another version removed the object)", ErrUnsupported)
	} else if serr != nil {
		return serr
	}
	return nil
}
