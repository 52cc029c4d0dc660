package powerloss

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// A test that writes through a FUSE mount whose daemon keeps its store on a
// disk must not serve that disk itself: if the test process dies (a timeout,
// a signal) while one of its threads waits on the mount, the daemon waits on
// the disk, whose server threads are gone but whose /dev/fuse descriptor is
// closed only once every thread has exited, and the process never does. So
// the disk is served by a child process (cmd plserve, built without the race
// detector: every request of the daemon's store goes through it), controlled
// over its stdin and stdout, and killed with its parent (Pdeathsig), which
// aborts the disk's connection and frees everyone.

// request and reply are the control protocol: one JSON object per line.
// The child also sends {"crashed":true} when the power is cut.
type request struct {
	Op   string `json:"op"` // mount, unmount, arm, crash, stats, reboot
	N    int64  `json:"n,omitempty"`
	Mode Mode   `json:"mode,omitempty"`
	Seed int64  `json:"seed,omitempty"`
}

type reply struct {
	Err     string `json:"err,omitempty"`
	Stats   *Stats `json:"stats,omitempty"`
	Crashed bool   `json:"crashed,omitempty"`
}

// Serve serves a disk at dir, answering the requests of a StartChild
// parent read from in, until in closes.
func Serve(dir string, in io.Reader, out io.Writer) error {
	var outMu sync.Mutex
	send := func(r reply) error {
		outMu.Lock()
		defer outMu.Unlock()
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = out.Write(append(b, '\n'))
		return err
	}
	disk := New()
	watch := func(d *Disk) {
		go func() {
			<-d.Crashed()
			_ = send(reply{Crashed: true}) // a broken pipe means the parent is gone
		}()
	}
	watch(disk)
	var srv *Server
	defer func() {
		if srv != nil {
			_ = srv.Unmount() // exiting anyway; the kernel detaches a dead server's mount
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var req request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fmt.Errorf("bad request %q: %w", sc.Text(), err)
		}
		var r reply
		var err error
		switch req.Op {
		case "mount":
			if srv != nil {
				err = errors.New("already mounted")
				break
			}
			srv, err = Mount(disk, dir)
		case "unmount":
			if srv != nil {
				err = srv.Unmount()
				srv = nil
			}
		case "arm":
			disk.CrashAfter(req.N, req.Mode, req.Seed)
		case "crash":
			disk.Crash(req.Mode, req.Seed)
		case "stats":
			st := disk.Stats()
			r.Stats = &st
		case "reboot":
			switch {
			case srv != nil:
				err = errors.New("reboot while mounted")
			case disk.After() == nil:
				err = errors.New("reboot before the power was cut")
			default:
				disk = disk.After()
				watch(disk)
			}
		default:
			err = fmt.Errorf("unknown op %q", req.Op)
		}
		if err != nil {
			r.Err = err.Error()
		}
		if err := send(r); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Child is a disk served by a child process at a directory.
type Child struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	replies chan reply
	done    chan struct{} // closed when the child's output ends

	mu      sync.Mutex // one request at a time
	crashMu sync.Mutex
	crashed chan struct{} // of the current boot
}

// StartChild runs server (a plserve binary) to serve a new, empty disk at
// dir; it is not mounted yet.
func StartChild(server, dir string) (*Child, error) {
	cmd := exec.Command(server, dir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, in: in, replies: make(chan reply), done: make(chan struct{}), crashed: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r reply
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			if r.Crashed {
				c.crashMu.Lock()
				close(c.crashed)
				c.crashMu.Unlock()
				continue
			}
			c.replies <- r
		}
	}()
	return c, nil
}

func (c *Child) call(req request) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return reply{}, err
	}
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return reply{}, fmt.Errorf("powerloss disk: %s: %w", req.Op, err)
	}
	select {
	case r := <-c.replies:
		if r.Err != "" {
			return r, fmt.Errorf("powerloss disk: %s: %s", req.Op, r.Err)
		}
		return r, nil
	case <-c.done:
		return reply{}, fmt.Errorf("powerloss disk: %s: the server exited", req.Op)
	}
}

// Mount mounts the disk at its directory.
func (c *Child) Mount() error { _, err := c.call(request{Op: "mount"}); return err }

// Unmount takes the disk off its directory (detaching it if it is busy).
func (c *Child) Unmount() error { _, err := c.call(request{Op: "unmount"}); return err }

// CrashAfter is Disk.CrashAfter.
func (c *Child) CrashAfter(n int64, mode Mode, seed int64) error {
	_, err := c.call(request{Op: "arm", N: n, Mode: mode, Seed: seed})
	return err
}

// Crash is Disk.Crash.
func (c *Child) Crash(mode Mode, seed int64) error {
	_, err := c.call(request{Op: "crash", Mode: mode, Seed: seed})
	return err
}

// Crashed is closed when the power of the current boot is cut.
func (c *Child) Crashed() <-chan struct{} {
	c.crashMu.Lock()
	defer c.crashMu.Unlock()
	return c.crashed
}

// Stats is Disk.Stats of the current boot.
func (c *Child) Stats() (Stats, error) {
	r, err := c.call(request{Op: "stats"})
	if err != nil {
		return Stats{}, err
	}
	return *r.Stats, nil
}

// Reboot replaces the disk, unmounted and crashed, by what survived.
func (c *Child) Reboot() error {
	<-c.Crashed() // its notice precedes the reply to any later request
	c.crashMu.Lock()
	c.crashed = make(chan struct{})
	c.crashMu.Unlock()
	_, err := c.call(request{Op: "reboot"})
	return err
}

// Close unmounts the disk and stops the child.
func (c *Child) Close() error {
	_, uerr := c.call(request{Op: "unmount"})
	c.in.Close()
	err := c.cmd.Wait()
	if uerr != nil {
		return uerr
	}
	return err
}
