package s3test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
)

// Test credentials and region of every server Start runs.
const (
	AccessKey = "ckptfs-test"
	SecretKey = "ckptfs-test-secret"
	Region    = "us-east-1"
	// Bucket is the bucket Start creates.
	Bucket = "ckptfs-test"
)

// startTimeout bounds how long Start and Restart wait for the port to answer.
const startTimeout = 20 * time.Second

// Server is one S3 server process (versitygw or moto, see Kind) on
// 127.0.0.1.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Dir      string // versitygw's root: one subdirectory per bucket (moto keeps objects in memory)
	Kind     string // Versitygw or Moto

	tb     testing.TB
	bin    string
	addr   string
	logf   string
	cfgDir string

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	front *front        // moto: the port clients reach (Stop closes it, not the process)
}

// The servers Start can run, picked by $CKPTFS_S3_SERVER (KindEnv).
const (
	Versitygw = "versitygw" // the default
	Moto      = "moto"
	KindEnv   = "CKPTFS_S3_SERVER"
)

// ServerKind returns the kind of server $CKPTFS_S3_SERVER names
// (Versitygw when it is unset).
func ServerKind() (string, error) {
	switch k := os.Getenv(KindEnv); k {
	case "", Versitygw:
		return Versitygw, nil
	case Moto:
		return Moto, nil
	default:
		return "", fmt.Errorf("s3test: %s=%q: want %s or %s", KindEnv, k, Versitygw, Moto)
	}
}

// Binary returns the path of the program of the server $CKPTFS_S3_SERVER
// names, as test/tools.sh installs it: versitygw in $CKPTFS_TOOLS/bin,
// moto_server in $CKPTFS_TOOLS/moto-venv/bin.
func Binary() (string, error) {
	kind, err := ServerKind()
	if err != nil {
		return "", err
	}
	tools := os.Getenv("CKPTFS_TOOLS")
	if tools == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("s3test: no $CKPTFS_TOOLS and no home directory: %w", err)
		}
		tools = filepath.Join(home, ".cache", "ckptfs", "tools")
	}
	bin, what := filepath.Join(tools, "bin", "versitygw"), "versitygw v1.8.0 into $CKPTFS_TOOLS/bin"
	if kind == Moto {
		bin, what = filepath.Join(tools, "moto-venv", "bin", "moto_server"), "moto[server] 5.2.5 into $CKPTFS_TOOLS/moto-venv"
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("s3test: the S3 test server is missing (%w); build it with test/tools.sh "+
			"(it installs %s, default ~/.cache/ckptfs/tools)", err, what)
	}
	return bin, nil
}

// Start runs a server on a fresh temporary directory and a free loopback
// port, creates Bucket, and stops the server when tb ends. A missing binary
// or a server that does not come up fails tb.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	kind, _ := ServerKind() // Binary checked it
	tmp := tb.TempDir()
	s := &Server{
		tb:     tb,
		bin:    bin,
		Kind:   kind,
		Dir:    filepath.Join(tmp, "gw"),
		logf:   filepath.Join(tmp, kind+".log"),
		cfgDir: filepath.Join(tmp, "aws"),
	}
	for _, d := range []string{s.Dir, s.cfgDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, f := range []string{"config", "credentials"} {
		if err := os.WriteFile(filepath.Join(s.cfgDir, f), nil, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		if s.front != nil {
			s.front.close()
		}
		s.kill()
	})
	// The port is picked by binding :0 and closing it, so another process may
	// take it before versitygw binds; try a few ports.
	for attempt := 0; ; attempt++ {
		s.addr, err = freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s.Endpoint = "http://" + s.addr
		if err = s.startKind(); err == nil {
			break
		}
		if attempt == 2 {
			tb.Fatalf("s3test: start %s: %v\n%s", kind, err, s.log())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3api.CreateBucketInput{Bucket: aws.String(Bucket)}); err != nil {
		tb.Fatalf("s3test: create bucket %s: %v\n%s", Bucket, err, s.log())
	}
	return s
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("s3test: find a free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// startKind starts the server: versitygw on addr; moto on a port of its own
// behind a front on addr.
func (s *Server) startKind() error {
	if s.Kind != Moto {
		return s.start(s.Endpoint, s.bin, "--port", s.addr,
			"--access", AccessKey, "--secret", SecretKey, "--region", Region,
			"--quiet", "posix", s.Dir)
	}
	back, err := freePort()
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(back)
	if err := s.start("http://"+back, s.bin, "-H", host, "-p", port); err != nil {
		return err
	}
	s.front = &front{target: back}
	if err := s.front.open(s.addr); err != nil {
		s.kill()
		return err
	}
	return nil
}

// start runs the process with args and waits until url answers HTTP.
func (s *Server) start(url string, args ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("s3test: server already running")
	}
	logFile, err := os.OpenFile(s.logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "== %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(args[0], args[1:]...)
	// Keep the developer's or CI's own gateway settings out of the test.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.cfgDir}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("s3test: run %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(startTimeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(url + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("s3test: %s exited at start (%v)", s.Kind, cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			s.cmd = nil
			return fmt.Errorf("s3test: %s did not answer on %s within %v: %v", s.Kind, url, startTimeout, err)
		}
	}
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to exit.
// Stopping a stopped server does nothing. Moto keeps its objects in memory
// only, so for moto Stop closes the front instead: the port refuses new
// connections and open ones are reset, as when a server dies, while the
// process lives on for Restart.
func (s *Server) Stop() {
	if s.front != nil {
		s.front.close()
		return
	}
	s.kill()
}

// kill ends the process and waits for it.
func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a paused one too
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Pause stops the server process with SIGSTOP: connections are accepted by
// the kernel (or moto's front) and nothing answers, as with a server that
// hangs. Resume continues it; a test's end does too.
func (s *Server) Pause() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatal("s3test: Pause of a stopped server")
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("s3test: pause %s: %v", s.Kind, err)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Restart starts a stopped server again on the same directory and port; it
// fails the test when the server does not come back.
func (s *Server) Restart() {
	s.tb.Helper()
	var err error
	// The old socket may linger for a moment after the kill.
	for attempt := 0; attempt < 20; attempt++ {
		if s.front != nil {
			err = s.front.open(s.addr)
		} else {
			err = s.startKind()
		}
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("s3test: restart %s on %s: %v\n%s", s.Kind, s.addr, err, s.log())
}

// log returns the server's output, for failure messages.
func (s *Server) log() string {
	b, _ := os.ReadFile(s.logf)
	if len(b) > 4096 {
		b = append([]byte("…"), b[len(b)-4096:]...)
	}
	return string(bytes.TrimSpace(b))
}

// URL returns s3://Bucket/prefix, the way ckptfs is told where a remote is.
func (s *Server) URL(prefix string) string {
	return "s3://" + Bucket + "/" + prefix
}

// Env returns the environment variables by which an AWS client (the ckptfs
// daemon, the SDK's default configuration) finds this server: endpoint,
// credentials, region, and empty shared config and credentials files.
func (s *Server) Env() []string {
	return EnvFor(s.Endpoint, s.cfgDir)
}

// EnvFor is Env with another endpoint (a Proxy's, say); cfgDir holds empty
// config and credentials files.
func EnvFor(endpoint, cfgDir string) []string {
	return []string{
		"AWS_ENDPOINT_URL=" + endpoint,
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_CONFIG_FILE=" + filepath.Join(cfgDir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(cfgDir, "credentials"),
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// SetEnv sets Env's variables in this process for the rest of tb (with
// tb.Setenv, so the test must not be parallel).
func (s *Server) SetEnv(tb testing.TB) {
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		tb.Setenv(k, v)
	}
}

// Client returns a plain SDK client of the server (path-style, static
// credentials), for tests that inspect or damage the bucket directly.
func (s *Server) Client() *s3api.Client {
	return ClientFor(s.Endpoint)
}

// ClientFor returns a plain SDK client of an endpoint with the test
// credentials.
func ClientFor(endpoint string) *s3api.Client {
	return s3api.New(s3api.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		HTTPClient:   &http.Client{Timeout: 30 * time.Second},
	})
}
