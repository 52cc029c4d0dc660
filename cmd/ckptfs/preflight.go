package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Mounting as an ordinary user goes through the setuid helper fusermount3
// (fusefs.Mount). go-fuse reports its failures as "fusermount exited with
// code 256"; checkMountPrereqs checks what fusermount3 would refuse first, so
// a refused mount names what is missing, and does so before the store is
// created (a refused mount changes nothing).

// fuseConf is fusermount3's configuration file.
const fuseConf = "/etc/fuse.conf"

// checkMountPrereqs checks, for a mount by the current user, what the kernel
// and fusermount3 need: the helper installed and setuid root, read-write
// access to /dev/fuse, write access to the mountpoint, and user_allow_other in
// /etc/fuse.conf when allowOther is asked for. Root needs only /dev/fuse.
func checkMountPrereqs(mnt string, allowOther bool) error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("/dev/fuse is missing: load the fuse kernel module (modprobe fuse) or, in a container, pass the device through (--device /dev/fuse): %w", err)
	}
	if os.Geteuid() == 0 {
		return nil
	}
	uid := os.Getuid()
	if err := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); err != nil {
		return fmt.Errorf("you (uid %d) cannot open /dev/fuse read-write (%v): ask an administrator to make it mode 0666, as Debian's fuse3 does", uid, err)
	}
	bin, err := fusermountPath()
	if err != nil {
		return err
	}
	st, err := os.Stat(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if st.Mode()&os.ModeSetuid == 0 || sys == nil || sys.Uid != 0 {
		return fmt.Errorf("%s is not setuid root, so it cannot mount for an ordinary user: reinstall fuse3 (or chmod u+s it as root), or mount as root", bin)
	}
	if err := unix.Access(mnt, unix.W_OK); err != nil {
		return fmt.Errorf("mountpoint %s is not writable by you (uid %d): fusermount3 mounts only on a directory you may write to (e.g. one you own)", mnt, uid)
	}
	if allowOther {
		ok, err := fuseConfAllowsOther(fuseConf)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("--allow-other needs a line \"user_allow_other\" in %s when you are not root", fuseConf)
		}
	}
	return nil
}

// fusermountPath finds the helper the way go-fuse does: fusermount3, then
// fusermount, in $PATH and /bin.
func fusermountPath() (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		if p := filepath.Join("/bin", name); isExecutable(p) {
			return p, nil
		}
	}
	return "", errors.New("fusermount3 is not installed: ordinary users mount through it (Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3), or mount as root")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// fuseConfAllowsOther reports whether path has a user_allow_other line (a
// missing file allows nothing).
func fuseConfAllowsOther(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "user_allow_other" {
			return true, nil
		}
	}
	return false, sc.Err()
}

// detach lazily unmounts mnt: MNT_DETACH as root, fusermount3 -u -z otherwise.
func detach(mnt string) error {
	if os.Geteuid() == 0 {
		return syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
	bin, err := fusermountPath()
	if err != nil {
		return err
	}
	out, err := exec.Command(bin, "-u", "-z", mnt).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -u -z: %v: %s", bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmountCommand is what the mounter types to unmount mnt: umount as root,
// fusermount3 -u otherwise.
func unmountCommand(mnt string) string { return unmountCommandFor(os.Geteuid(), mnt) }

// newStoreCleanup is called before a mount opens its store. When the store
// does not exist yet, the returned function removes what opening it created
// (the directory, or its contents if the directory was there and empty), for
// a mount that then fails; otherwise it does nothing.
func newStoreCleanup(dir string) func() {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return func() {}
	}
	if _, err := os.Stat(filepath.Join(abs, "catalog.db")); err == nil {
		return func() {}
	}
	ents, err := os.ReadDir(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Remove the directory and any parents MkdirAll made.
		top := abs
		for {
			p := filepath.Dir(top)
			if p == top {
				break
			}
			if _, err := os.Stat(p); err == nil {
				break
			}
			top = p
		}
		return func() { os.RemoveAll(top) }
	case err == nil && len(ents) == 0:
		return func() {
			ents, _ := os.ReadDir(abs)
			for _, e := range ents {
				os.RemoveAll(filepath.Join(abs, e.Name()))
			}
		}
	}
	return func() {} // not a store and not empty: cas.Open refuses it
}
