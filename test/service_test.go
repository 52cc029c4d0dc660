package test

// ckptfs as a service: ordinary users mounting through fusermount3, privacy,
// the control socket, metrics, mount(8), and the CLI's answers a new user
// meets. The tests run as root (CI does) and create their own users.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testUser is an ordinary user created for a test and removed after it.
type testUser struct {
	name     string
	uid, gid uint32
}

func newTestUser(t *testing.T, tag string) testUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests create users: run them as root (CI does)")
	}
	name := fmt.Sprintf("ckt%d%s", os.Getpid()%100000, tag)
	out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput()
	if err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return testUser{name: name, uid: uint32(uid), gid: uint32(gid)}
}

// command runs name args as u, with a plain environment.
func (u testUser) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}}
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/nonexistent", "LANG=C.UTF-8"}
	cmd.Dir = "/"
	return cmd
}

// run runs name args as u and returns exit code, stdout, stderr.
func (u testUser) run(t *testing.T, name string, args ...string) (int, string, string) {
	t.Helper()
	cmd := u.command(name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// sharedDir makes a directory every user can traverse, owned by u, holding
// a copy of the ckptfs binary (the test binary's directory is root's).
func sharedDir(t *testing.T, u testUser) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ckptfs-svc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "ckptfs")
	data, err := os.ReadFile(ckptfsBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	return home, bin
}

// startUserDaemon runs `bin mount store mnt` as the ordinary user u (through
// fusermount3) and waits until the mount serves.
func startUserDaemon(t *testing.T, u testUser, bin, store, mnt string, extra ...string) *daemon {
	t.Helper()
	d, err := launch(t, u.command(bin, append(append([]string{"mount"}, extra...), store, mnt)...), store, mnt, 20*time.Second)
	if err != nil {
		t.Fatalf("mount as %s: %v", u.name, err)
	}
	return d
}

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode()
}

// TestOrdinaryUserMount: an ordinary user mounts through fusermount3, owns
// the mount's root, reads back what it wrote; the store is private (0700,
// catalog 0600, socket 0600); another user and root cannot enter the mount;
// a refused mount creates nothing; the control socket refuses other users
// even when its mode would let them connect.
func TestOrdinaryUserMount(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 is not installed (Debian: apt install fuse3; .ci/run installs it)")
	}
	alice, bob := newTestUser(t, "a"), newTestUser(t, "b")
	home, bin := sharedDir(t, alice)
	store, mnt := filepath.Join(home, "store"), filepath.Join(home, "mnt")
	if code, _, errOut := alice.run(t, "mkdir", mnt); code != 0 {
		t.Fatal(errOut)
	}

	// Refused before anything is created: --allow-other without
	// user_allow_other, a mountpoint alice may not write.
	if conf, _ := os.ReadFile("/etc/fuse.conf"); !bytes.Contains(conf, []byte("\nuser_allow_other")) {
		code, _, errOut := alice.run(t, bin, "mount", "--allow-other", store, mnt)
		if code != 1 || !strings.Contains(errOut, "user_allow_other") {
			t.Errorf("--allow-other: exit %d %q", code, errOut)
		}
	}
	rootMnt := filepath.Join(filepath.Dir(home), "root-owned")
	os.Mkdir(rootMnt, 0o755)
	code, _, errOut := alice.run(t, bin, "mount", store, rootMnt)
	if code != 1 || !strings.Contains(errOut, "not writable by you") {
		t.Errorf("mount on root's directory: exit %d %q", code, errOut)
	}
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Fatalf("a refused mount created the store: %v", err)
	}

	d := startUserDaemon(t, alice, bin, store, mnt)
	info, _ := os.ReadFile("/proc/self/mountinfo")
	if !bytes.Contains(info, []byte(mnt+" ")) || !bytes.Contains(info, []byte(fmt.Sprintf("user_id=%d", alice.uid))) {
		t.Fatalf("no FUSE mount of alice at %s in mountinfo", mnt)
	}
	for p, want := range map[string]os.FileMode{
		store:                               0o700 | os.ModeDir,
		filepath.Join(store, "catalog.db"):  0o600,
		filepath.Join(store, "objects"):     0o700 | os.ModeDir,
		filepath.Join(store, "daemon.sock"): 0o600 | os.ModeSocket,
	} {
		if got := mode(t, p); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	data := randBytes(7, 3<<20)
	src := filepath.Join(home, "src.bin")
	os.WriteFile(src, data, 0o644)
	dst := filepath.Join(mnt, "runs", "r1", "model.bin")
	if code, _, errOut := alice.run(t, "sh", "-c", "mkdir -p "+filepath.Dir(dst)+" && cp "+src+" "+dst+" && cmp "+src+" "+dst); code != 0 {
		t.Fatalf("alice writes and reads back: %s", errOut)
	}
	if code, out, errOut := alice.run(t, bin, "stats", "--json", mnt); code != 0 || !strings.Contains(out, `"files": 1`) {
		t.Errorf("alice's stats: %d %s %s", code, out, errOut)
	}
	if code, out, errOut := alice.run(t, bin, "gc", mnt); code != 0 {
		t.Errorf("alice's gc through the socket: %d %s %s", code, out, errOut)
	}
	// The control files are alice's too, with the mount's times (they were
	// root's, from 1970).
	ctl := filepath.Join(mnt, ".ckptfs")
	code, out, errOut := alice.run(t, "stat", "-c", "%n %u %g %Y", ctl, filepath.Join(ctl, "stats.json"), filepath.Join(ctl, "manifests"))
	if code != 0 {
		t.Fatalf("stat of the control files: %s", errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var name string
		var uid, gid uint32
		var mtime int64
		if _, err := fmt.Sscan(line, &name, &uid, &gid, &mtime); err != nil || uid != alice.uid || gid != alice.gid || time.Since(time.Unix(mtime, 0)) > time.Hour {
			t.Errorf("control file %q: owner %d:%d, mtime %d; want alice's (%d:%d) and the mount's time", line, uid, gid, mtime, alice.uid, alice.gid)
		}
	}
	// Private: bob and root are refused by the kernel (no allow_other).
	if code, _, errOut := bob.run(t, "ls", mnt); code == 0 || !strings.Contains(errOut, "Permission denied") {
		t.Errorf("bob lists alice's mount: exit %d %q", code, errOut)
	}
	if _, err := os.ReadFile(dst); err == nil {
		t.Errorf("root read alice's private mount")
	}

	// The control socket checks its peer: with the store and socket opened
	// up by root, bob still gets no gc, and a negative grace is refused.
	os.Chmod(store, 0o755)
	sock := filepath.Join(store, "daemon.sock")
	os.Chmod(sock, 0o666)
	ask := `import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
try: s.sendall(sys.argv[2].encode()+b"\n")
except BrokenPipeError: pass  # refused at once: the reason is already sent
print(s.makefile().readline().strip())`
	code, out, errOut = bob.run(t, "/usr/bin/python3", "-c", ask, sock, `{"op":"gc","grace":0}`)
	if code != 0 || !strings.Contains(out, "permission denied") || !strings.Contains(out, fmt.Sprintf("uid %d", bob.uid)) {
		t.Errorf("bob's gc request: %d %q %q", code, out, errOut)
	}
	code, out, errOut = alice.run(t, "/usr/bin/python3", "-c", ask, sock, `{"op":"gc","grace":-1000000000}`)
	if code != 0 || !strings.Contains(out, "negative") {
		t.Errorf("negative grace: %d %q %q", code, out, errOut)
	}
	d.stop(syscall.SIGTERM)
	if code, _, errOut := alice.run(t, "cmp", src, filepath.Join(store, "..", "mnt", "runs", "r1", "model.bin")); code == 0 {
		t.Errorf("the file is still visible after unmount: %s", errOut)
	}
	// Remount as alice: the data persists.
	d = startUserDaemon(t, alice, bin, store, mnt)
	if code, _, errOut := alice.run(t, "cmp", src, dst); code != 0 {
		t.Errorf("after remount: %s", errOut)
	}
	d.stop(syscall.SIGTERM)
}

// TestRootMountIsPrivateToo: root mounts with mount(2) (no fusermount3), and
// without --allow-other an ordinary user is refused; with it, let in.
func TestRootMountIsPrivateToo(t *testing.T) {
	bob := newTestUser(t, "c")
	dir, err := os.MkdirTemp("", "ckptfs-svc-root-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	d := startDaemon(t, store, mnt)
	os.WriteFile(filepath.Join(mnt, "runs", "f"), []byte("x"), 0o644)
	if code, _, errOut := bob.run(t, "cat", filepath.Join(mnt, "runs", "f")); code == 0 || !strings.Contains(errOut, "Permission denied") {
		t.Errorf("bob reads root's private mount: exit %d %q", code, errOut)
	}
	d.stop(syscall.SIGTERM)
	d = startDaemon(t, store, mnt, "--allow-other")
	if code, out, errOut := bob.run(t, "cat", filepath.Join(mnt, "runs", "f")); code != 0 || out != "x" {
		t.Errorf("bob reads root's --allow-other mount: exit %d %q %q", code, out, errOut)
	}
	d.stop(syscall.SIGTERM)
}

// TestMountHelper: `mount -t fuse.ckptfs` (through /sbin/mount.fuse.ckptfs,
// as `make install` puts it) mounts, returns, and umount stops the daemon;
// the metrics endpoint it was given answers with ckptfs_ series that move
// with a write.
func TestMountHelper(t *testing.T) {
	helper := "/sbin/mount.fuse.ckptfs"
	if _, err := os.Lstat(helper); err == nil {
		t.Fatalf("%s exists already: this test installs its own and will not replace it", helper)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "ckptfs")
	out, err := exec.Command("make", "-C", "..", "install", "PREFIX="+filepath.Join(dir, "usr"), "DESTDIR=", "SBINDIR="+filepath.Join(dir, "sbin"), "BIN="+bin).CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, p := range []string{"usr/bin/ckptfs", "sbin/mount.fuse.ckptfs", "sbin/mount.ckptfs"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("make install: %v", err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "usr/bin/ckptfs"), helper); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(helper)
	store, mnt := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logFile := filepath.Join(dir, "daemon.log")
	start := time.Now()
	out, err = exec.Command("mount", "-t", "fuse.ckptfs", store, mnt, "-o", "cache_size=64MiB,metrics_addr="+addr+",log="+logFile).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("mount -t fuse.ckptfs: %v\n%s\n%s", err, out, log)
	}
	t.Logf("mount -t fuse.ckptfs returned after %v", time.Since(start))
	defer func() {
		if mounted(t, mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}()
	if !mounted(t, mnt) {
		t.Fatal("mount returned but nothing is mounted")
	}
	scrape := func() map[string]float64 {
		// curl, as a user or a Prometheus operator checking the endpoint would.
		body, err := exec.Command("curl", "-fsS", "--max-time", "10", "http://"+addr+"/metrics").Output()
		if err != nil {
			t.Fatalf("curl of the metrics endpoint: %v", err)
		}
		m := map[string]float64{}
		for _, line := range strings.Split(string(body), "\n") {
			if !strings.HasPrefix(line, "ckptfs_") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err == nil {
				m[line[:i]] = v
			}
		}
		return m
	}
	before := scrape()
	if len(before) < 20 {
		t.Fatalf("%d ckptfs_ series: %v", len(before), before)
	}
	data := randBytes(9, 5<<20)
	if err := os.WriteFile(filepath.Join(mnt, "runs", "m.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "runs", "m.bin")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	after := scrape()
	for _, k := range []string{`ckptfs_commits_total{result="ok"}`, "ckptfs_commit_bytes_total", "ckptfs_store_files", "ckptfs_store_logical_bytes", "ckptfs_commit_duration_seconds_count"} {
		if after[k] <= before[k] {
			t.Errorf("%s: %v before the write, %v after", k, before[k], after[k])
		}
	}
	if after["ckptfs_store_logical_bytes"] != float64(len(data)) {
		t.Errorf("ckptfs_store_logical_bytes = %v, want %d", after["ckptfs_store_logical_bytes"], len(data))
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		log, _ := os.ReadFile(logFile)
		if bytes.Contains(log, []byte("unmounted")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not finish after umount:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A bad option fails the mount with mount(8)'s status and a clear message.
	out, err = exec.Command("mount", "-t", "fuse.ckptfs", store, mnt, "-o", "frobnicate").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown option") {
		t.Errorf("mount -o frobnicate: %v %s", err, out)
	}
}

// TestGCFreesDeletedFilesByDefault: chunks of deleted files are freed by a
// plain `ckptfs gc`, and --dry-run says how many raw bytes it would free.
func TestGCFreesDeletedFilesByDefault(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	keep, drop := randBytes(21, 2<<20), randBytes(22, 3<<20)
	os.WriteFile(filepath.Join(mnt, "runs", "keep"), keep, 0o644)
	os.WriteFile(filepath.Join(mnt, "runs", "drop"), drop, 0o644)
	os.Remove(filepath.Join(mnt, "runs", "drop"))
	code, out, errOut := ckptfs(t, "gc", "--dry-run", mnt)
	if code != 0 || !strings.Contains(out, "(3.00 MiB raw)") {
		t.Fatalf("gc --dry-run: %d %q %q", code, out, errOut)
	}
	code, out, errOut = ckptfs(t, "gc", "--json", mnt)
	var res struct {
		Chunks   int   `json:"freed_chunks"`
		RawBytes int64 `json:"freed_raw_bytes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.RawBytes != int64(len(drop)) {
		t.Fatalf("gc: %d %q %q", code, out, errOut)
	}
	if st := statsJSON(t, mnt); st["unique_bytes"] != int64(len(keep)) {
		t.Errorf("after gc: unique_bytes %d, want %d", st["unique_bytes"], len(keep))
	}
	code, out, _ = ckptfs(t, "fsck", mnt)
	if code != 0 || !strings.Contains(out, "0 unreferenced objects") {
		t.Errorf("fsck after gc: %d %q", code, out)
	}
}

// TestGCEvery: mount --gc-every frees a deleted file's chunks while mounted,
// without a ckptfs gc, and logs what it freed; a bad value is refused before
// anything starts.
func TestGCEvery(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	for _, bad := range [][]string{{"--gc-every", "-1s"}, {"--gc-every", "1h", "--read-only", "--remote", "s3://b/p"}} {
		args := append(append([]string{"mount"}, bad...), store, mnt)
		if code, _, errOut := ckptfs(t, args...); code != 2 || !strings.Contains(errOut, "--gc-every") {
			t.Errorf("mount %v: exit %d %q, want a usage error naming --gc-every", bad, code, errOut)
		}
	}
	d := startDaemon(t, store, mnt, "--gc-every", "1s")
	defer d.stop(syscall.SIGTERM)
	keep, drop := randBytes(23, 2<<20), randBytes(24, 3<<20)
	os.WriteFile(filepath.Join(mnt, "runs", "keep"), keep, 0o644)
	os.WriteFile(filepath.Join(mnt, "runs", "drop"), drop, 0o644)
	os.Remove(filepath.Join(mnt, "runs", "drop"))
	deadline := time.Now().Add(30 * time.Second)
	for statsJSON(t, mnt)["unique_bytes"] != int64(len(keep)) {
		if time.Now().After(deadline) {
			t.Fatalf("30s after the delete: unique_bytes %d, want %d; log:\n%s", statsJSON(t, mnt)["unique_bytes"], len(keep), d.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(d.stderr.String(), "gc: freed 3.00 MiB") || !strings.Contains(d.stderr.String(), "(every 1s)") {
		t.Errorf("the daemon's log does not say what the collection freed:\n%s", d.stderr)
	}
	if code, out, _ := ckptfs(t, "fsck", mnt); code != 0 || !strings.Contains(out, "0 unreferenced objects") {
		t.Errorf("fsck after the collection: %d %q", code, out)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "runs", "keep")); err != nil || !bytes.Equal(got, keep) {
		t.Errorf("the kept file reads back wrong: %v", err)
	}

	// A file deleted while a reader has it: the rounds while it is open
	// keep its chunks; its close moves no catalog counter, and the next
	// round must run all the same.
	held := filepath.Join(mnt, "runs", "held")
	os.WriteFile(held, randBytes(25, 3<<20), 0o644)
	r, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(held)
	time.Sleep(2500 * time.Millisecond) // rounds run while the reader holds it
	if got := statsJSON(t, mnt)["unique_bytes"]; got != int64(len(keep)+3<<20) {
		t.Errorf("while the deleted file is open: unique_bytes %d, want %d (its chunks kept)", got, len(keep)+3<<20)
	}
	r.Close()
	deadline = time.Now().Add(30 * time.Second)
	for statsJSON(t, mnt)["unique_bytes"] != int64(len(keep)) {
		if time.Now().After(deadline) {
			t.Fatalf("30s after the deleted file's close: unique_bytes %d, want %d; log:\n%s", statsJSON(t, mnt)["unique_bytes"], len(keep), d.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFsckNamesEveryFileOfACorruptChunk: a damaged chunk shared by several
// files through the mount is reported for each of them.
func TestFsckNamesEveryFileOfACorruptChunk(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	shared := randBytes(31, 1<<20) // one whole chunk
	var names []string
	for i := range 4 {
		name := fmt.Sprintf("runs/r%d/model.bin", i)
		os.MkdirAll(filepath.Join(mnt, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(mnt, name), append(append([]byte{}, shared...), randBytes(uint64(40+i), 1<<20)...), 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, "/"+name)
	}
	// Damage the shared chunk (the one the four manifests name first) where
	// the store keeps it: its object file, or its range of a pack (random
	// bytes are stored raw, so its bytes are there as written).
	damageStoredBytes(t, store, shared[100:4196])
	code, out, errOut := ckptfs(t, "fsck", "--read-data", mnt)
	if code != 1 {
		t.Fatalf("fsck --read-data: exit %d\n%s%s", code, out, errOut)
	}
	for _, n := range names {
		if !strings.Contains(out, n) {
			t.Errorf("fsck does not name %s:\n%s", n, out)
		}
	}
}

// TestDiffRefusesNonCheckpointsAndComparesStepDirs covers diff's answers
// beyond two checkpoint files.
func TestDiffRefusesNonCheckpointsAndComparesStepDirs(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	notes := filepath.Join(dir, "notes.txt")
	os.WriteFile(readme, []byte("# a model\n"), 0o644)
	os.WriteFile(notes, []byte("nothing\n"), 0o644)
	ckpt := filepath.Join(dir, "model.safetensors")
	writeSafetensors(t, ckpt, []stTensor{f32Tensor("a", 1, 1000), f32Tensor("b", 2, 1000)})
	code, out, errOut := ckptfs(t, "diff", readme, notes)
	if code != 1 || !strings.Contains(errOut, "neither") || strings.Contains(out, "same") {
		t.Errorf("diff of two text files: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = ckptfs(t, "diff", ckpt, readme)
	if code != 1 || !strings.Contains(errOut, "README.md is not a checkpoint") || strings.Contains(out, "removed") {
		t.Errorf("diff checkpoint README.md: exit %d %q %q", code, out, errOut)
	}
	// Two steps of a sharded checkpoint: b changes, c moves between shards
	// unchanged, d is new.
	s1, s2 := filepath.Join(dir, "100"), filepath.Join(dir, "200")
	os.Mkdir(s1, 0o755)
	os.Mkdir(s2, 0o755)
	writeSafetensors(t, filepath.Join(s1, "model-00001-of-00002.safetensors"), []stTensor{f32Tensor("a", 1, 1000), f32Tensor("b", 2, 1000)})
	writeSafetensors(t, filepath.Join(s1, "model-00002-of-00002.safetensors"), []stTensor{f32Tensor("c", 3, 1000)})
	writeSafetensors(t, filepath.Join(s2, "model-00001-of-00002.safetensors"), []stTensor{f32Tensor("a", 1, 1000), f32Tensor("b", 5, 1000), f32Tensor("c", 3, 1000)})
	writeSafetensors(t, filepath.Join(s2, "model-00002-of-00002.safetensors"), []stTensor{f32Tensor("d", 4, 1000)})
	os.WriteFile(filepath.Join(s2, "config.json"), []byte(`{"layers": 2}`), 0o644)
	code, out, errOut = ckptfs(t, "diff", "--json", s1, s2)
	var res struct {
		Counts map[string]int `json:"counts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("diff of step directories: exit %d %q %q", code, out, errOut)
	}
	if res.Counts["same"] != 2 || res.Counts["changed"] != 1 || res.Counts["added"] != 1 || res.Counts["removed"] != 0 {
		t.Errorf("diff of step directories: %v", res.Counts)
	}
}

// TestLogAddedIsNewToTheStore: a bit-identical copy of a run adds nothing to
// the store, and log says so.
func TestLogAddedIsNewToTheStore(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	a := filepath.Join(mnt, "runs", "a")
	for step := range 3 {
		p := filepath.Join(a, fmt.Sprint(step*10), "model.safetensors")
		os.MkdirAll(filepath.Dir(p), 0o755)
		writeSafetensors(t, p, []stTensor{f32Tensor("w", uint64(step), 200000)})
	}
	if out, err := exec.Command("cp", "-a", a, filepath.Join(mnt, "runs", "b")).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	var lg struct {
		Steps []struct {
			AddedBytes int64 `json:"added_bytes"`
		} `json:"steps"`
	}
	ckptfsJSON(t, &lg, "log", "--json", a)
	for i, s := range lg.Steps {
		if s.AddedBytes < 200000 {
			t.Errorf("run a step %d: added %d, want its whole tensor", i, s.AddedBytes)
		}
	}
	ckptfsJSON(t, &lg, "log", "--json", filepath.Join(mnt, "runs", "b"))
	for i, s := range lg.Steps {
		if s.AddedBytes != 0 {
			t.Errorf("copy b step %d: added %d bytes, want 0 (every chunk was in the store)", i, s.AddedBytes)
		}
	}
}

// TestInterruptWhileBusySaysItWaits: Ctrl-C while a file is open in the
// mount detaches it and says that the daemon waits for the mount's users;
// the daemon exits once they close their files.
func TestInterruptWhileBusySaysItWaits(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	f, err := os.Create(filepath.Join(mnt, "runs", "open.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(randBytes(3, 1<<20)); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(os.Interrupt)
	// Detached: gone from the namespace, the daemon still serving f.
	deadline := time.Now().Add(20 * time.Second)
	for mounted(t, mnt) {
		if time.Now().After(deadline) {
			t.Fatal("the busy mount was not detached after Ctrl-C")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-d.done:
		d.done <- err
		t.Fatalf("the daemon exited (%v) while a file was open\n%s", err, d.stderr)
	case <-time.After(300 * time.Millisecond):
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after the detach: %v", err)
	}
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			t.Fatalf("daemon: %v\n%s", err, d.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not exit after the last file closed")
	}
	if !strings.Contains(d.stderr.String(), "keeps serving the processes that still have files open") {
		t.Errorf("no word of waiting for the mount's users:\n%s", d.stderr)
	}
}

// damageStoredBytes flips a byte in the middle of the one place under
// store/objects that holds needle: a chunk object of its own or a pack.
func damageStoredBytes(t *testing.T, store string, needle []byte) {
	t.Helper()
	found := 0
	err := filepath.WalkDir(filepath.Join(store, "objects"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		i := bytes.Index(b, needle)
		if i < 0 {
			return nil
		}
		found++
		b[i+len(needle)/2] ^= 0x40
		return os.WriteFile(p, b, 0o600)
	})
	if err != nil || found != 1 {
		t.Fatalf("damage the stored bytes: %v, found in %d files, want 1", err, found)
	}
}
