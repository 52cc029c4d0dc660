package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeNode is a path of fakeSystem: a directory or file, or the error
// stat(2) and open(2) meet there.
type fakeNode struct {
	dir  bool
	uid  uint32
	mode fs.FileMode
	data []byte
	err  error // for stat and read alike, unless readErr is set
	// readErr is what reading the file meets when stat succeeds (a dead
	// mount's cached attributes).
	readErr error
}

type fakeInfo struct {
	name string
	n    fakeNode
}

func (i fakeInfo) Name() string       { return filepath.Base(i.name) }
func (i fakeInfo) Size() int64        { return int64(len(i.n.data)) }
func (i fakeInfo) ModTime() time.Time { return time.Time{} }
func (i fakeInfo) IsDir() bool        { return i.n.dir }
func (i fakeInfo) Mode() fs.FileMode {
	if i.n.dir {
		return fs.ModeDir | i.n.mode
	}
	return i.n.mode
}
func (i fakeInfo) Sys() any { return &syscall.Stat_t{Uid: i.n.uid, Dev: 1} }

// fakeSystem is a prober over a made-up file system: paths not in nodes do
// not exist; statfs fails with statfs[path], if any.
func fakeSystem(euid int, nodes map[string]fakeNode, statfs map[string]error, mounts []mountEntry) prober {
	return prober{
		stat: func(name string) (fs.FileInfo, error) {
			n, ok := nodes[name]
			switch {
			case !ok:
				return nil, &fs.PathError{Op: "stat", Path: name, Err: syscall.ENOENT}
			case n.err != nil:
				return nil, &fs.PathError{Op: "stat", Path: name, Err: n.err}
			}
			return fakeInfo{name, n}, nil
		},
		readFile: func(name string) ([]byte, error) {
			n, ok := nodes[name]
			switch {
			case !ok:
				return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
			case n.readErr != nil:
				return nil, &fs.PathError{Op: "open", Path: name, Err: n.readErr}
			case n.err != nil:
				return nil, &fs.PathError{Op: "open", Path: name, Err: n.err}
			case n.dir:
				return nil, &fs.PathError{Op: "read", Path: name, Err: syscall.EISDIR}
			}
			return n.data, nil
		},
		statfs: func(name string) error { return statfs[name] },
		mounts: func() ([]mountEntry, error) { return mounts, nil },
		euid:   euid,
	}
}

// TestProbeTarget: what a path given to gc, fsck, stats, du or import is,
// and an error of its own kind, for errors.Is, for each way it can be
// neither a live mount nor a store: a mount whose daemon is gone (ENOTCONN)
// and a directory the user may not look into (EACCES, EPERM) are not taken
// for "neither a ckptfs mountpoint nor a store", nor a store for a mount.
func TestProbeTarget(t *testing.T) {
	const me = 1000
	dir := func(uid uint32, mode fs.FileMode) fakeNode { return fakeNode{dir: true, uid: uid, mode: mode} }
	file := func(data string) fakeNode { return fakeNode{data: []byte(data), mode: 0o644} }
	errNode := func(err error) fakeNode { return fakeNode{err: err} }
	ckptfsMount := func(point, store string, uid int) mountEntry {
		return mountEntry{point: point, fstype: "fuse.ckptfs", source: "ckptfs:" + store, uid: uid}
	}
	rootMount := mountEntry{point: "/", fstype: "ext4", source: "/dev/sda1", uid: -1}
	for _, tc := range []struct {
		name   string
		euid   int
		path   string
		nodes  map[string]fakeNode
		statfs map[string]error
		mounts []mountEntry
		kind   targetKind // when no error
		is     []error    // the error is each of these
		isNot  []error    // and none of these
		want   []string   // its message has these
		reject []string   // and not these
	}{
		{name: "live mount", euid: me, path: "/m",
			nodes: map[string]fakeNode{"/m": dir(me, 0o755), "/m/.ckptfs": dir(me, 0o555), "/m/.ckptfs/stats.json": file(`{"store":"/s"}`)},
			kind:  kindMount},
		{name: "store", euid: me, path: "/s",
			nodes: map[string]fakeNode{"/s": dir(me, 0o700), "/s/catalog.db": file("")},
			kind:  kindStore},
		{name: "dead mountpoint", euid: me, path: "/ckpt-test/mnt",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt": errNode(syscall.ENOTCONN)},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", me)},
			is:     []error{errDaemonGone, syscall.ENOTCONN}, isNot: []error{errNotTarget},
			want: []string{"/ckpt-test/mnt: the ckptfs daemon of this mount is gone", "not connected", "ckptfs mount /data/store /ckpt-test/mnt", "fusermount3 -u /ckpt-test/mnt",
				"store directory, /data/store,"},
			reject: []string{"neither", "(the mount at"}},
		{name: "dead mountpoint, as root", euid: 0, path: "/ckpt-test/mnt",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt": errNode(syscall.ENOTCONN)},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", 0)},
			is:     []error{errDaemonGone, syscall.ENOTCONN},
			want:   []string{"umount /ckpt-test/mnt", "ckptfs mount /data/store /ckpt-test/mnt"}, reject: []string{"fusermount3"}},
		{name: "dead mountpoint, cached attributes", euid: me, path: "/ckpt-test/mnt",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt": dir(me, 0o755), "/ckpt-test/mnt/.ckptfs/stats.json": {readErr: syscall.ENOTCONN}},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", me)},
			is:     []error{errDaemonGone, syscall.ENOTCONN}, isNot: []error{errNotTarget}},
		{name: "dead mountpoint, cached lookups too", euid: me, path: "/ckpt-test/mnt",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt": dir(me, 0o755)},
			statfs: map[string]error{"/ckpt-test/mnt": syscall.ENOTCONN},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", me)},
			is:     []error{errDaemonGone, syscall.ENOTCONN}, isNot: []error{errNotTarget}},
		{name: "directory in a dead mount", euid: me, path: "/ckpt-test/mnt/runs",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt/runs": errNode(syscall.ENOTCONN)},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", me)},
			is:     []error{errDaemonGone},
			want:   []string{"/ckpt-test/mnt/runs: the ckptfs daemon of this mount is gone (the mount at /ckpt-test/mnt)", "ckptfs mount /data/store /ckpt-test/mnt", "fusermount3 -u /ckpt-test/mnt"}},
		{name: "dead mount of an unknown store", euid: me, path: "/ckpt-test/mnt",
			nodes: map[string]fakeNode{"/ckpt-test/mnt": errNode(syscall.ENOTCONN)},
			is:    []error{errDaemonGone}, want: []string{"ckptfs mount STORE /ckpt-test/mnt"}},
		{name: "store of another user", euid: me, path: "/srv/store",
			nodes: map[string]fakeNode{"/srv/store": dir(0, 0o700), "/srv/store/.ckptfs/stats.json": errNode(syscall.EACCES), "/srv/store/catalog.db": errNode(syscall.EACCES)},
			is:    []error{fs.ErrPermission, syscall.EACCES}, isNot: []error{errNotTarget, errDaemonGone, fs.ErrNotExist},
			want:   []string{"/srv/store: permission denied: it belongs to root (mode 0700", "run as root"},
			reject: []string{"stats.json", "catalog.db", "neither"}},
		{name: "store of another user, EPERM", euid: me, path: "/srv/store",
			nodes: map[string]fakeNode{"/srv/store": dir(0, 0o700), "/srv/store/.ckptfs/stats.json": errNode(syscall.EPERM)},
			is:    []error{fs.ErrPermission, syscall.EPERM}, isNot: []error{errNotTarget},
			want: []string{"/srv/store: operation not permitted: it belongs to root"}},
		{name: "store under another user's directory", euid: me, path: "/home/ann/store",
			nodes: map[string]fakeNode{"/home/ann": dir(0, 0o700), "/home/ann/store": errNode(syscall.EACCES)},
			is:    []error{fs.ErrPermission}, isNot: []error{fs.ErrNotExist, errNotTarget},
			want: []string{"/home/ann/store: permission denied: the directory /home/ann belongs to root (mode 0700)"}},
		{name: "another user's live mount", euid: me, path: "/ckpt-test/mnt",
			nodes:  map[string]fakeNode{"/ckpt-test/mnt": errNode(syscall.EACCES)},
			mounts: []mountEntry{rootMount, ckptfsMount("/ckpt-test/mnt", "/data/store", 0)},
			is:     []error{fs.ErrPermission}, isNot: []error{errNotTarget},
			want: []string{"/ckpt-test/mnt: permission denied: it is the ckptfs mount of root", "--allow-other", "run as root"}},
		{name: "plain directory", euid: me, path: "/d",
			nodes: map[string]fakeNode{"/d": dir(me, 0o755)},
			is:    []error{errNotTarget}, isNot: []error{fs.ErrPermission, errDaemonGone},
			want: []string{"/d is neither a ckptfs mountpoint nor a store"}},
		{name: "missing", euid: me, path: "/nowhere",
			is: []error{fs.ErrNotExist}, isNot: []error{errNotTarget}, want: []string{"/nowhere: no such file or directory"}},
		{name: "file", euid: me, path: "/f",
			nodes: map[string]fakeNode{"/f": file("x")},
			want:  []string{"/f is a file: give a mountpoint or a store directory"}, isNot: []error{errNotTarget}},
		{name: "I/O error", euid: me, path: "/m",
			nodes: map[string]fakeNode{"/m": dir(me, 0o755), "/m/.ckptfs/stats.json": errNode(syscall.EIO)},
			is:    []error{syscall.EIO}, isNot: []error{errNotTarget, errDaemonGone, fs.ErrPermission}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, _, err := fakeSystem(tc.euid, tc.nodes, tc.statfs, tc.mounts).probe(tc.path)
			if len(tc.is)+len(tc.want) == 0 {
				if err != nil || kind != tc.kind {
					t.Fatalf("probe(%s) = %v, %v; want %v", tc.path, kind, err, tc.kind)
				}
				return
			}
			if err == nil {
				t.Fatalf("probe(%s) = %v, no error", tc.path, kind)
			}
			for _, e := range tc.is {
				if !errors.Is(err, e) {
					t.Errorf("%q is not %v", err, e)
				}
			}
			for _, e := range tc.isNot {
				if errors.Is(err, e) {
					t.Errorf("%q is %v", err, e)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(err.Error(), r) {
					t.Errorf("%q has %q", err, r)
				}
			}
		})
	}
}

// TestParseMountinfo: a ckptfs mount's line gives its mountpoint (unescaped),
// its store and who mounted it; mountOf picks the innermost mount.
func TestParseMountinfo(t *testing.T) {
	const info = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
42 22 0:39 / /ckpt-test/v/my\040mnt rw,nosuid,nodev,relatime shared:7 - fuse.ckptfs ckptfs:/ckpt-test/v/my\040store rw,user_id=1000,group_id=1000,default_permissions
43 22 0:40 / /ckpt-test/v rw - tmpfs tmpfs rw
`
	ms, err := parseMountinfo(strings.NewReader(info))
	if err != nil || len(ms) != 3 {
		t.Fatalf("parseMountinfo: %v, %v", ms, err)
	}
	m := ms[1]
	if store, ok := m.store(); m.point != "/ckpt-test/v/my mnt" || !ok || store != "/ckpt-test/v/my store" || m.uid != 1000 {
		t.Errorf("ckptfs line: %+v (store %q, %v)", m, store, ok)
	}
	if ms[0].uid != -1 {
		t.Errorf("ext4 line has uid %d", ms[0].uid)
	}
	if _, ok := ms[2].store(); ok {
		t.Errorf("tmpfs line has a store")
	}
	pr := prober{mounts: func() ([]mountEntry, error) { return ms, nil }}
	for path, want := range map[string]string{
		"/ckpt-test/v/my mnt/runs/1": "/ckpt-test/v/my mnt",
		"/ckpt-test/v/my mnt":        "/ckpt-test/v/my mnt",
		"/ckpt-test/v/my mntx":       "/ckpt-test/v",
		"/ckpt-test/v/lib":           "/ckpt-test/v",
		"/etc/nonexistent":           "/",
	} {
		if got, ok := pr.mountOf(path); !ok || got.point != want {
			t.Errorf("mountOf(%s) = %q, %v; want %q", path, got.point, ok, want)
		}
	}
}

// TestProbeTargetRealFiles: the same on real files: a made-up mount (a
// directory with .ckptfs/stats.json), a store, and what is neither, where a
// directory inside the mount names the mountpoint.
func TestProbeTargetRealFiles(t *testing.T) {
	base := t.TempDir()
	mnt := filepath.Join(base, "mnt")
	store := filepath.Join(base, "store")
	for _, d := range []string{filepath.Join(mnt, ".ckptfs"), filepath.Join(mnt, "runs"), store, filepath.Join(base, "plain")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(mnt, ".ckptfs", "stats.json"), []byte(`{"store":"`+store+`"}`), 0o644)
	os.WriteFile(filepath.Join(store, "catalog.db"), nil, 0o600)
	os.WriteFile(filepath.Join(base, "file"), []byte("x"), 0o644)

	if tg, err := resolveTarget(mnt); err != nil || tg.storeDir != store {
		t.Errorf("resolveTarget(mount) = %+v, %v", tg, err)
	}
	if tg, err := resolveTarget(store); err != nil || tg.storeDir != store || tg.socket != "" {
		t.Errorf("resolveTarget(store) = %+v, %v", tg, err)
	}
	for _, tc := range []struct {
		path string
		is   error
		want string
	}{
		{filepath.Join(base, "plain"), errNotTarget, "neither a ckptfs mountpoint nor a store"},
		{filepath.Join(mnt, "runs"), errNotTarget, "is a directory in the ckptfs mount at " + mnt + "; give that mountpoint"},
		{filepath.Join(base, "missing"), fs.ErrNotExist, "missing: no such file or directory"},
		{filepath.Join(base, "file"), nil, "is a file: give a mountpoint or a store directory"},
	} {
		_, err := resolveTarget(tc.path)
		if err == nil || tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resolveTarget(%s) = %v; want %v, %q", tc.path, err, tc.is, tc.want)
		}
		if _, err2 := readStats(tc.path); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("readStats(%s) = %v; want resolveTarget's %v", tc.path, err2, err)
		}
	}
}

// TestDuControlDir: du of the mount's .ckptfs, or of a path in it, says what
// the directory is instead of asking the daemon about an inode the catalog
// does not have.
func TestDuControlDir(t *testing.T) {
	mnt := t.TempDir()
	ctl := filepath.Join(mnt, ".ckptfs")
	os.MkdirAll(filepath.Join(ctl, "manifests"), 0o755)
	os.MkdirAll(filepath.Join(mnt, "runs"), 0o755)
	os.WriteFile(filepath.Join(ctl, "stats.json"), []byte(`{"store":"/s"}`), 0o644)
	os.Symlink(".ckptfs", filepath.Join(mnt, "link"))
	for _, p := range []string{ctl, filepath.Join(ctl, "stats.json"), filepath.Join(ctl, "manifests"), filepath.Join(mnt, "runs", "..", ".ckptfs"), filepath.Join(mnt, "link") + "/"} {
		_, _, _, _, err := duPaths([]string{p})
		if !errors.Is(err, errControlDir) || !strings.Contains(err.Error(), "not files of the store") {
			t.Errorf("du %s: %v", p, err)
		}
	}
	if _, _, _, dirs, err := duPaths([]string{filepath.Join(mnt, "runs"), mnt}); err != nil || len(dirs) != 2 || dirs[0] == 0 {
		t.Errorf("du runs: %v, %v", dirs, err)
	}
}
