package fsutil

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// MaxFDWait bounds how long OpenRetry waits for a file descriptor.
//
// A daemon that has every descriptor of its limit open (a flood of
// connections, thousands of open files) gets EMFILE from open(2), and the
// system as a whole ENFILE. Both pass: descriptors are closed as requests
// finish. An open that fails with them is an open that came too early, not an
// answer about the file, so the daemon waits for a descriptor instead of
// failing a read or dropping a commit's staged bytes (as net/http's Accept
// loop waits instead of giving up). Past MaxFDWait the error is returned,
// wrapped, so a caller still sees why.
const MaxFDWait = 20 * time.Second

// IsFDExhausted reports whether err says the process or the system is out of
// file descriptors.
func IsFDExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// OpenRetry calls open until it returns an error other than EMFILE or ENFILE,
// ctx ends, or MaxFDWait has passed, backing off from 1 ms to 50 ms between
// tries.
func OpenRetry[T any](ctx context.Context, open func() (T, error)) (T, error) {
	v, err := open()
	if err == nil || !IsFDExhausted(err) {
		return v, err
	}
	deadline := time.Now().Add(MaxFDWait)
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("waiting for a file descriptor: %w (%w)", ctx.Err(), err)
		case <-t.C:
		}
		if v, err = open(); err == nil || !IsFDExhausted(err) {
			return v, err
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("no file descriptor free after %v: %w", MaxFDWait, err)
		}
		wait = min(2*wait, 50*time.Millisecond)
		t.Reset(wait)
	}
}
