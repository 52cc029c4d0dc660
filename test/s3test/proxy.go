package s3test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Fault is one rule of a Proxy: which requests it touches and what it does to
// them. The first rule that matches a request (and has uses left) applies.
type Fault struct {
	// Match selects requests; nil matches every request.
	Match func(*http.Request) bool
	// Times is how many requests the rule affects; 0 means every one.
	Times int

	// Delay holds the request this long (or until the client gives up)
	// before the rest of the rule, or the forwarding, happens.
	Delay time.Duration
	// Status, when not zero, answers with this HTTP status and an S3 error
	// body instead of forwarding.
	Status int
	// HangUp closes the connection without an answer.
	HangUp bool
	// CorruptRequest flips one bit in the middle of the request body on its
	// way to the server.
	CorruptRequest bool
	// TruncateResponse sends the response's headers (Content-Length included)
	// and half its body, then closes the connection.
	TruncateResponse bool
	// ShortResponse sends half the body with a Content-Length that matches
	// it: a lie the client can only catch with a checksum.
	ShortResponse bool
	// CorruptResponse flips one bit in the middle of the response body.
	CorruptResponse bool
	// DropResponse forwards the request, so the server acts on it, then
	// closes the connection instead of answering: the client cannot know
	// whether its request took effect.
	DropResponse bool
	// StallResponse sends the headers and half the body, then waits this long
	// (or until the client gives up) before sending the rest.
	StallResponse time.Duration
	// IgnoreConditions makes the server act as one that does not support
	// conditional writes: the proxy drops If-None-Match and If-Match from
	// the request and signs it again with the test credentials, so the
	// server performs an unconditional write.
	IgnoreConditions bool
}

// IsGet, IsPut and IsHead match requests by method, for Fault.Match.
func IsGet(r *http.Request) bool  { return r.Method == http.MethodGet }
func IsPut(r *http.Request) bool  { return r.Method == http.MethodPut }
func IsHead(r *http.Request) bool { return r.Method == http.MethodHead }

// Proxy is a reverse proxy on 127.0.0.1 in front of an S3 server that
// injects Faults. It forwards the Host header unchanged, so signed requests
// stay valid.
type Proxy struct {
	URL string // http://127.0.0.1:PORT: give this to clients as the endpoint

	target string
	tr     *http.Transport
	srv    *httptest.Server

	mu     sync.Mutex
	faults []*rule

	requests atomic.Int64
	injected atomic.Int64
}

type rule struct {
	Fault
	used int
}

// NewProxy starts a proxy to target (an http://host:port endpoint), closed
// when tb ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	p := &Proxy{target: target, tr: &http.Transport{DisableCompression: true}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	p.URL = p.srv.URL
	tb.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
		p.tr.CloseIdleConnections()
	})
	return p
}

// Set replaces the proxy's rules.
func (p *Proxy) Set(faults ...Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = p.faults[:0]
	for _, f := range faults {
		p.faults = append(p.faults, &rule{Fault: f})
	}
}

// Clear removes every rule: the proxy forwards faithfully.
func (p *Proxy) Clear() { p.Set() }

// Requests is the number of requests the proxy has received.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Injected is the number of requests a rule has applied to.
func (p *Proxy) Injected() int64 { return p.injected.Load() }

func (p *Proxy) pick(r *http.Request) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.faults {
		if f.Times > 0 && f.used >= f.Times {
			continue
		}
		if f.Match != nil && !f.Match(r) {
			continue
		}
		f.used++
		p.injected.Add(1)
		fault := f.Fault
		return &fault
	}
	return nil
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	f := p.pick(r)
	if f == nil {
		f = &Fault{}
	}
	// Read the body first: only then does the server notice a client that
	// hangs up (and cancel r.Context()) while the rule delays.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if f.HangUp {
		panic(http.ErrAbortHandler)
	}
	if f.Status != 0 {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(f.Status)
		if r.Method != http.MethodHead {
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+
				`<Error><Code>%s</Code><Message>injected by s3test.Proxy</Message></Error>`, errorCode(f.Status))
		}
		return
	}

	if f.CorruptRequest && len(body) > 0 {
		body[len(body)/2] ^= 0x10
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	out.ContentLength = int64(len(body))
	if f.IgnoreConditions && (out.Header.Get("If-None-Match") != "" || out.Header.Get("If-Match") != "") {
		if err := resign(out); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		// The server is down: look like it to the client.
		panic(http.ErrAbortHandler)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if f.DropResponse {
		panic(http.ErrAbortHandler)
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	damaged := len(rb) > 1 && resp.StatusCode/100 == 2
	switch {
	case damaged && f.CorruptResponse:
		rb[len(rb)/2] ^= 0x10
	case damaged && f.ShortResponse:
		rb = rb[:len(rb)/2]
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rb)))
	switch {
	case damaged && f.TruncateResponse:
		w.WriteHeader(resp.StatusCode)
		w.Write(rb[:len(rb)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	case damaged && f.StallResponse > 0:
		w.WriteHeader(resp.StatusCode)
		w.Write(rb[:len(rb)/2])
		w.(http.Flusher).Flush()
		select {
		case <-time.After(f.StallResponse):
		case <-r.Context().Done():
			return
		}
		w.Write(rb[len(rb)/2:])
	default:
		w.WriteHeader(resp.StatusCode)
		w.Write(rb)
	}
}

// resign removes the conditional headers from r and signs it again (SigV4,
// the test credentials), keeping the payload hash the client sent.
func resign(r *http.Request) error {
	r.Header.Del("If-None-Match")
	r.Header.Del("If-Match")
	r.Header.Del("Authorization")
	r.Header.Del("X-Amz-Date")
	creds := aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}
	hash := r.Header.Get("X-Amz-Content-Sha256")
	return v4.NewSigner().SignHTTP(r.Context(), creds, r, hash, "s3", Region, time.Now())
}

func errorCode(status int) string {
	switch status {
	case http.StatusServiceUnavailable:
		return "SlowDown"
	case http.StatusInternalServerError:
		return "InternalError"
	case http.StatusForbidden:
		return "AccessDenied"
	case http.StatusNotFound:
		return "NoSuchKey"
	default:
		return "Injected" + strconv.Itoa(status)
	}
}
