package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/test/s3test"
)

// The server side of the remote tier (issue #24): what a mount does when
// the S3 server dies, hangs, answers errors, or lacks conditional writes.
// These run against every server test/s3test can start ($CKPTFS_S3_SERVER:
// versitygw, moto).

// serverReadBound is how long a read(2) may take to fail with
// --remote-timeout 1s: 3 attempts of 1 s plus 1 s per MiB, and backoffs.
const serverReadBound = 20 * time.Second

// readFails reads path and checks that it fails with EIO, within
// serverReadBound.
func readFails(t *testing.T, what, path string) {
	t.Helper()
	start := time.Now()
	_, err := os.ReadFile(path)
	d := time.Since(start)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("%s: read %s: %v, want EIO", what, filepath.Base(path), err)
	}
	if d > serverReadBound {
		t.Errorf("%s: read %s took %v with --remote-timeout 1s, want < %v", what, filepath.Base(path), d, serverReadBound)
	}
	t.Logf("%s: %v after %v", what, err, d.Round(time.Millisecond))
}

// readEqual reads path and compares it with want.
func readEqual(t *testing.T, what, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s: read %s: %v (%d bytes, want %d, equal %v)", what, filepath.Base(path), err, len(got), len(want), bytes.Equal(got, want))
	}
}

// TestRemoteServerStalledOrKilled: under a reading mount with
// --remote-timeout 1s, a server stopped with SIGSTOP and a killed one make
// read(2) fail with EIO (never ECONNREFUSED or another errno) in bounded
// time, and the same files read back byte-exact once the server is back.
func TestRemoteServerStalledOrKilled(t *testing.T) {
	e := newFaultEnv(t, "stall")
	_, mW := e.writer("W")
	files := map[string][]byte{}
	for i, name := range []string{"paused.bin", "killed.bin"} {
		files[name] = randBytes(uint64(240+i), 2<<20)
		put(t, filepath.Join(mW, name), files[name])
	}
	e.sync(mW)
	_, mR := e.writer("R", readOnlyFlag, "--remote-timeout", "1s")

	e.srv.Pause()
	readFails(t, "server stopped (SIGSTOP)", filepath.Join(mR, "paused.bin"))
	e.srv.Resume()
	readEqual(t, "server continued", filepath.Join(mR, "paused.bin"), files["paused.bin"])

	e.srv.Stop()
	readFails(t, "server killed", filepath.Join(mR, "killed.bin"))
	e.srv.Restart()
	readEqual(t, "server restarted", filepath.Join(mR, "killed.bin"), files["killed.bin"])
}

// TestRemoteServerErrors: whatever error the server answers a reading
// mount's GET with (a 5xx on every try, a refusal, a missing object, a
// connection it hangs up, a body cut short), read(2) fails with EIO, and the
// file reads back once the server behaves.
func TestRemoteServerErrors(t *testing.T) {
	e := newFaultEnv(t, "errors")
	_, mW := e.writer("W")
	faults := []struct {
		name  string
		fault s3test.Fault
	}{
		{"500 on every try", s3test.Fault{Match: s3test.IsGet, Status: http.StatusInternalServerError}},
		{"503 slow down", s3test.Fault{Match: s3test.IsGet, Status: http.StatusServiceUnavailable}},
		{"403 access denied", s3test.Fault{Match: s3test.IsGet, Status: http.StatusForbidden}},
		{"404 no such key", s3test.Fault{Match: s3test.IsGet, Status: http.StatusNotFound}},
		{"connection hung up", s3test.Fault{Match: s3test.IsGet, HangUp: true}},
		{"body cut short", s3test.Fault{Match: s3test.IsGet, TruncateResponse: true}},
	}
	files := make([][]byte, len(faults))
	for i := range faults {
		files[i] = randBytes(uint64(250+i), 1<<20)
		put(t, filepath.Join(mW, fmt.Sprintf("f%d.bin", i)), files[i])
	}
	e.sync(mW)
	proxy := s3test.NewProxy(t, e.srv.Endpoint)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	_, mR := e.writer("R", readOnlyFlag, "--remote-timeout", "1s")
	for i, f := range faults {
		path := filepath.Join(mR, fmt.Sprintf("f%d.bin", i))
		proxy.Set(f.fault)
		before := proxy.Injected()
		readFails(t, f.name, path)
		if proxy.Injected() == before {
			t.Errorf("%s: the read sent no GET through the fault", f.name)
		}
		proxy.Clear()
		readEqual(t, f.name+", then none", path, files[i])
	}
}

// TestRemoteServerWithoutConditionalWrites: a writing mount on a server
// that ignores If-None-Match (or If-Match) is refused with one line naming
// the header, leaves nothing in the bucket, and a reading mount, which
// writes nothing, still works there.
func TestRemoteServerWithoutConditionalWrites(t *testing.T) {
	e := newFaultEnv(t, "nocond")
	_, mW := e.writer("W")
	f := randBytes(260, 1<<20)
	put(t, filepath.Join(mW, "f.bin"), f)
	e.sync(mW)
	proxy := s3test.NewProxy(t, e.srv.Endpoint)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	for _, header := range []string{"If-None-Match", "If-Match"} {
		proxy.Set(s3test.Fault{IgnoreConditions: true, Match: func(r *http.Request) bool { return r.Header.Get(header) != "" }})
		url := e.srv.URL("nocond-" + strings.ToLower(header))
		code, _, errOut := ckptfs(t, "mount", remoteFlag, url, e.dir("S-"+header), e.dir("S-"+header+"-mnt"))
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code == 0 || len(lines) != 1 || !strings.Contains(errOut, "ignores "+header) {
			t.Errorf("writing mount on a server that ignores %s: exit %d, %d lines:\n%s", header, code, len(lines), errOut)
		}
		t.Logf("ignores %s: %s", header, strings.TrimSpace(errOut))
		out, err := e.srv.Client().ListObjectsV2(context.Background(), &s3api.ListObjectsV2Input{
			Bucket: aws.String(s3test.Bucket), Prefix: aws.String("nocond-")})
		if err != nil || len(out.Contents) != 0 {
			t.Errorf("after the refused mount: %d objects under nocond-* (%v), want none", len(out.Contents), err)
		}
	}
	_, mR := e.reader("R")
	readEqual(t, "reading mount on that server", filepath.Join(mR, "f.bin"), f)
}

// TestRemoteServerEmptyPrefixBackground: `mount --background --read-only`
// of a prefix with nothing published warns once on the terminal that ran
// it, and once in the daemon's log.
func TestRemoteServerEmptyPrefixBackground(t *testing.T) {
	e := newFaultEnv(t, "bg")
	mnt, logFile := e.dir("E-mnt"), filepath.Join(e.tmp, "E.log")
	code, out, errOut := ckptfs(t, "mount", "--background", "--log", logFile, remoteFlag, e.srv.URL("nothing-here"), readOnlyFlag, e.dir("E"), mnt)
	defer unmountNow(t, mnt, logFile)
	if code != 0 {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("mount --background --read-only: exit %d %q %q\n%s", code, out, errOut, log)
	}
	time.Sleep(3 * time.Second) // a refresh or so: still one warning
	log, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	const warning = "nothing is published in " + "s3://" + s3test.Bucket + "/nothing-here"
	if n := strings.Count(errOut, warning); n != 1 {
		t.Errorf("stderr of mount --background has the warning %d times, want 1:\n%s", n, errOut)
	}
	if n := strings.Count(string(log), warning); n != 1 {
		t.Errorf("the daemon's log has the warning %d times, want 1:\n%s", n, log)
	}
	t.Logf("stderr: %s", strings.TrimSpace(errOut))
}
