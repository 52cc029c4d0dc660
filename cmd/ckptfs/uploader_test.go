package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/remote"
)

// fakeRounder answers rounds from a list of errors, then nil.
type fakeRounder struct {
	mu     sync.Mutex
	errs   []error
	rounds int
}

func (f *fakeRounder) UploadRound(context.Context, bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rounds++
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

func (f *fakeRounder) Location() string { return "s3://bucket/prefix" }

// TestSyncReportsBackgroundSuperseded: a background round that finds a
// path superseded logs it, and the next `ckptfs sync` fails naming it
// though its own round had nothing left to upload; the sync after that
// succeeds. --commit=remote's sync after a commit reports its own round only.
func TestSyncReportsBackgroundSuperseded(t *testing.T) {
	lost := fmt.Errorf("s3://bucket/prefix: %w: runs/r/1/model.pt (by session w1)", remote.ErrSuperseded)
	f := &fakeRounder{errs: []error{lost}}
	u := newUploader(f, log.New(io.Discard, "", 0), time.Hour)
	noted := func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.superseded != nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for !noted() {
		if time.Now().After(deadline) {
			t.Fatal("the background round did not run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if err := u.sync(context.Background()); err != nil { // --commit=remote: this round's result only
		t.Fatalf("a commit's sync: %v", err)
	}
	err := u.syncReport(context.Background())
	if !errors.Is(err, remote.ErrSuperseded) || !strings.Contains(err.Error(), "runs/r/1/model.pt") {
		t.Fatalf("ckptfs sync after a background round lost a path: %v, want ErrSuperseded naming it", err)
	}
	if err := u.syncReport(context.Background()); err != nil {
		t.Fatalf("the next ckptfs sync: %v, want nil (reported once)", err)
	}
}
