package test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// daemonFDs returns how many descriptors process pid has open.
func daemonFDs(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// daemonNoFile returns the soft and hard RLIMIT_NOFILE of process pid.
func daemonNoFile(t testing.TB, pid int) (soft, hard string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); strings.HasPrefix(line, "Max open files") && len(f) >= 5 {
			return f[3], f[4]
		}
	}
	t.Fatalf("no 'Max open files' in /proc/%d/limits", pid)
	return "", ""
}

// flood opens n connections to addr and holds them until the returned
// function is called; it reports how many connected (a client past the
// server's backlog may time out: that is the server's right).
func flood(t testing.TB, addr string, n int) (int, func()) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return len(conns), func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// TestCloseUnderConnectionFlood is issue 26's first item as it was found: an
// ordinary user opened more connections to --metrics-addr than the daemon had
// descriptors; root's writes then closed with 0 and ended empty (the FLUSH
// could not name its caller and skipped the commit, and the commit at
// RELEASE failed with EMFILE where nobody saw it). The daemon runs under a
// low file limit (prlimit) so that a few hundred connections are a flood.
// Every close must return 0 and every file must hold its bytes after a
// remount; reads during the flood must not fail; the metrics endpoint must
// answer once the flood is gone.
func TestCloseUnderConnectionFlood(t *testing.T) {
	const limit = 256
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	wrap := []string{"prlimit", "--nofile=" + strconv.Itoa(limit) + ":" + strconv.Itoa(limit), "--"}
	d := startDaemonUnder(t, wrap, store, mnt, "--metrics-addr", addr)
	pid := d.cmd.Process.Pid
	if soft, hard := daemonNoFile(t, pid); soft != strconv.Itoa(limit) || hard != strconv.Itoa(limit) {
		t.Fatalf("daemon's file limit %s:%s, want %d:%d (the wrapper did not apply)", soft, hard, limit, limit)
	}

	dir := filepath.Join(mnt, "runs", "r", "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := randBytes(7, 3<<20)
	if err := os.WriteFile(filepath.Join(dir, "before.bin"), old, 0o644); err != nil {
		t.Fatal(err)
	}

	connected, release := flood(t, addr, 3*limit)
	defer release()
	fds := daemonFDs(t, pid)
	t.Logf("flood: %d of %d connections made; the daemon holds %d descriptors of %d", connected, 3*limit, fds, limit)
	if connected < limit {
		t.Fatalf("only %d connections: the flood did not reach the daemon's limit of %d, the test proves nothing", connected, limit)
	}
	if fds >= limit-8 {
		t.Errorf("the daemon holds %d of its %d descriptors under a connection flood: its listener is not bounded", fds, limit)
	}

	// As found: 100 kB files, each closed, from several writers at once;
	// and readers of a committed file meanwhile.
	const files = 40
	want := map[string][]byte{}
	for i := range files {
		want[filepath.Join(dir, fmt.Sprintf("f%03d.bin", i))] = randBytes(uint64(100+i), 100_000+i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*files)
	sem := make(chan struct{}, 8)
	for p, data := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			f, err := os.Create(p)
			if err != nil {
				errs <- fmt.Errorf("create %s: %w", p, err)
				return
			}
			if _, err := f.Write(data); err != nil {
				f.Close()
				errs <- fmt.Errorf("write %s: %w", p, err)
				return
			}
			if err := f.Close(); err != nil {
				errs <- fmt.Errorf("close %s: %w", p, err)
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := os.ReadFile(filepath.Join(dir, "before.bin"))
			if err != nil {
				errs <- fmt.Errorf("read during the flood: %w", err)
			} else if !bytes.Equal(got, old) {
				errs <- fmt.Errorf("read during the flood: wrong bytes")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	release()

	// The endpoint serves again once the flood is gone.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(body, []byte("ckptfs_")) {
				break
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics endpoint after the flood: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if strings.Contains(d.stderr.String(), "staged content lost") {
		t.Errorf("the daemon dropped staged content:\n%s", d.stderr)
	}

	d.stop(syscall.SIGTERM)
	startDaemon(t, store, mnt)
	for p, data := range want {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("after remount: %v", err)
			continue
		}
		if !bytes.Equal(got, data) {
			t.Errorf("after remount: %s holds %d bytes, want the %d written and closed", filepath.Base(p), len(got), len(data))
		}
	}
}

// TestDescriptorExhaustion runs the daemon with a file limit far below what
// its clients ask for at once: writers that stage out of order (a spool file
// each) and readers (an object open each) together need more descriptors than
// the daemon has. Nothing may fail with EMFILE (requests wait for a
// descriptor), and every close that returned 0 must have committed.
func TestDescriptorExhaustion(t *testing.T) {
	const limit = 40
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	wrap := []string{"prlimit", "--nofile=" + strconv.Itoa(limit) + ":" + strconv.Itoa(limit), "--"}
	d := startDaemonUnder(t, wrap, store, mnt)
	dir := filepath.Join(mnt, "d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 32
	readPaths := make([]string, n)
	readData := make([][]byte, n)
	for i := range n {
		readPaths[i] = filepath.Join(dir, fmt.Sprintf("r%02d.bin", i))
		readData[i] = randBytes(uint64(1000+i), 2<<20)
		if err := os.WriteFile(readPaths[i], readData[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Cold reads: the chunks come from object files, not the daemon's cache.
	d.stop(syscall.SIGTERM)
	d = startDaemonUnder(t, wrap, store, mnt)
	base := daemonFDs(t, d.cmd.Process.Pid)
	t.Logf("the daemon holds %d of its %d descriptors at rest", base, limit)

	writeData := map[string][]byte{}
	for i := range n {
		writeData[filepath.Join(dir, fmt.Sprintf("w%02d.bin", i))] = randBytes(uint64(2000+i), 300_000+i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	start := make(chan struct{})
	for p, data := range writeData {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f, err := os.Create(p)
			if err != nil {
				errs <- fmt.Errorf("create %s: %w", filepath.Base(p), err)
				return
			}
			// The second half first: the file is staged in a spool.
			half := len(data) / 2
			if _, err := f.WriteAt(data[half:], int64(half)); err != nil {
				f.Close()
				errs <- fmt.Errorf("write %s: %w", filepath.Base(p), err)
				return
			}
			time.Sleep(50 * time.Millisecond) // hold the spool while the others open theirs
			if _, err := f.WriteAt(data[:half], 0); err != nil {
				f.Close()
				errs <- fmt.Errorf("write %s: %w", filepath.Base(p), err)
				return
			}
			if err := f.Close(); err != nil {
				errs <- fmt.Errorf("close %s: %w", filepath.Base(p), err)
			}
		}()
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got, err := os.ReadFile(readPaths[i])
			if err != nil {
				errs <- fmt.Errorf("read %s: %w", filepath.Base(readPaths[i]), err)
			} else if !bytes.Equal(got, readData[i]) {
				errs <- fmt.Errorf("read %s: wrong bytes", filepath.Base(readPaths[i]))
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d.stop(syscall.SIGTERM)
	startDaemon(t, store, mnt)
	for p, data := range writeData {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("after remount: %v", err)
		} else if !bytes.Equal(got, data) {
			t.Errorf("after remount: %s holds %d bytes, want the %d written and closed", filepath.Base(p), len(got), len(data))
		}
	}
}
