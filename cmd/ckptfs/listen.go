package main

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// Listeners the daemon serves (the metrics endpoint, the control socket) must
// never take the descriptors its reads and commits need: anyone who can reach
// --metrics-addr could otherwise open connections until the daemon's file
// limit is spent. A boundedListener accepts at most max connections at once;
// further clients wait in the kernel's listen backlog, holding none of the
// daemon's descriptors, until one closes. An Accept that finds the process
// out of descriptors (EMFILE, ENFILE) waits and tries again instead of ending
// the serving loop.

// Connection limits of the daemon's listeners.
const (
	maxMetricsConns = 32
	maxControlConns = 64
)

type boundedListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	close sync.Once
}

func newBoundedListener(ln net.Listener, max int) *boundedListener {
	return &boundedListener{Listener: ln, slots: make(chan struct{}, max), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *boundedListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	wait := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return &boundedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
		}
		if !local.IsFDExhausted(err) {
			<-l.slots
			return nil, err
		}
		select {
		case <-time.After(wait):
		case <-l.done:
			<-l.slots
			return nil, net.ErrClosed
		}
		wait = min(2*wait, time.Second)
	}
}

// Close stops Accept, also one waiting for a slot.
func (l *boundedListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type boundedConn struct {
	net.Conn
	release func()
}

// NetConn returns the connection c wraps (as tls.Conn's does), for
// SO_PEERCRED.
func (c *boundedConn) NetConn() net.Conn { return c.Conn }

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// lowFileLimit is the descriptor limit below which the daemon warns at start.
const lowFileLimit = 1024

// raiseFileLimit raises the soft RLIMIT_NOFILE to the hard one (Go's os
// package does so at start too; doing it here states the daemon's need and
// survives a runtime that stops doing it) and returns the limit now in force.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("raise the file limit to %d: %w", lim.Max, err)
		}
	}
	return lim.Cur, nil
}
