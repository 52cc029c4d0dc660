package local

import (
	"context"

	"github.com/ckptfs/ckptfs/cas/internal/fsutil"
)

// MaxFDWait bounds how long OpenRetry waits for a file descriptor
// (fsutil.MaxFDWait has the reasons).
const MaxFDWait = fsutil.MaxFDWait

// IsFDExhausted reports whether err says the process or the system is out of
// file descriptors.
func IsFDExhausted(err error) bool { return fsutil.IsFDExhausted(err) }

// OpenRetry calls open until it returns an error other than EMFILE or ENFILE,
// ctx ends, or MaxFDWait has passed (fsutil.OpenRetry).
func OpenRetry[T any](ctx context.Context, open func() (T, error)) (T, error) {
	return fsutil.OpenRetry(ctx, open)
}
