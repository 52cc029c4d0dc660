package s3test

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// front is a TCP forwarder on a fixed address to a server's own port. It
// lets a test take an in-memory server (moto) "down" and back without losing
// its objects: close refuses new connections and resets open ones, as a
// crashed server's port does; open listens again.
type front struct {
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

// open listens on addr and forwards each connection to target.
func (f *front) open(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("s3test: listen on %s: %w", addr, err)
	}
	f.mu.Lock()
	f.ln = ln
	if f.conns == nil {
		f.conns = make(map[net.Conn]struct{})
	}
	f.mu.Unlock()
	go f.accept(ln)
	return nil
}

func (f *front) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed
		}
		go f.pipe(c)
	}
}

// pipe copies both ways between c and a new connection to target.
func (f *front) pipe(c net.Conn) {
	b, err := net.Dial("tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	if !f.track(c, b) {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(b, c)
		if tc, ok := b.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		close(done)
	}()
	io.Copy(c, b)
	c.Close()
	b.Close()
	<-done
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, b)
	f.mu.Unlock()
}

// track records c and b as open, or closes them when the front is closed.
func (f *front) track(c, b net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln == nil {
		c.Close()
		b.Close()
		return false
	}
	f.conns[c] = struct{}{}
	f.conns[b] = struct{}{}
	return true
}

// close stops listening and resets every open connection.
func (f *front) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln != nil {
		f.ln.Close()
		f.ln = nil
	}
	for c := range f.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not an orderly close
		}
		c.Close()
		delete(f.conns, c)
	}
}
