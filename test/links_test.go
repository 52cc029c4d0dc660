package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ckptfs/ckptfs/test/testrand"
)

// linkRun writes a run directory as training jobs leave one: checkpoints
// whose unchanged files are hard links to the previous checkpoint's
// (rsync --link-dest, cp -al snapshots), and best.pt a link to one model.
// It returns the run's root.
func linkRun(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "run")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for step := 1; step <= 3; step++ {
		dir := filepath.Join(src, fmt.Sprintf("ckpt-%d", step))
		must(os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
		must(os.WriteFile(filepath.Join(dir, "model.pt"), testrand.Bytes(uint64(step), 300_000+step*1000), 0o644))
		must(os.WriteFile(filepath.Join(dir, "sub", "optim.pt"), testrand.Bytes(uint64(10+step), 50_000), 0o600))
		if step == 1 {
			must(os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"vocab":1}`), 0o644))
			must(os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"layers":2}`), 0o644))
			continue
		}
		prev := filepath.Join(src, fmt.Sprintf("ckpt-%d", step-1))
		for _, f := range []string{"tokenizer.json", "config.json"} {
			must(os.Link(filepath.Join(prev, f), filepath.Join(dir, f)))
		}
	}
	must(os.Link(filepath.Join(src, "ckpt-2", "model.pt"), filepath.Join(src, "best.pt")))
	return src
}

// linkGroups returns, for the regular files under root, the groups of
// paths (relative) that share an inode, each group sorted and the list in
// order, with the link count each group's inode reports; the content of
// every file must be the same through each of its names.
func linkGroups(t *testing.T, root string) []string {
	t.Helper()
	byIno := map[uint64][]string{}
	nlink := map[uint64]uint64{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && fi.Name() == ".ckptfs" {
			return filepath.SkipDir
		}
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(root, p)
		byIno[st.Ino] = append(byIno[st.Ino], rel)
		nlink[st.Ino] = uint64(st.Nlink)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var groups []string
	for ino, names := range byIno {
		sort.Strings(names)
		groups = append(groups, strings.Join(names, "=")+" nlink "+strconv.FormatUint(nlink[ino], 10))
	}
	sort.Strings(groups)
	return groups
}

// duBytes is `du -sb` of the paths together: du counts a file with several
// names once.
func duBytes(t *testing.T, paths ...string) int64 {
	t.Helper()
	out, err := exec.Command("du", append([]string{"-sbc"}, paths...)...).Output()
	if err != nil {
		t.Fatalf("du %v: %v", paths, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	n, err := strconv.ParseInt(strings.Fields(lines[len(lines)-1])[0], 10, 64)
	if err != nil {
		t.Fatalf("du output %q", out)
	}
	return n
}

// uniqueBytes is the size of the distinct regular files under root.
func uniqueBytes(t *testing.T, root string) int64 {
	t.Helper()
	seen := map[uint64]bool{}
	var n int64
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		if ino := fi.Sys().(*syscall.Stat_t).Ino; !seen[ino] {
			seen[ino] = true
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCopyRunKeepsHardLinks: rsync -aH of a run directory with hard links
// into the mount, and cp -al of it inside the mount, keep every link (same
// inode, the link count of the source), the bytes, and du's count of each
// file once; a remount and fsck agree.
func TestCopyRunKeepsHardLinks(t *testing.T) {
	if _, err := exec.LookPath("rsync"); err != nil {
		t.Fatal("rsync is missing (apt-get install rsync; .ci/run installs it)")
	}
	src := linkRun(t)
	store, mnt := filepath.Join(t.TempDir(), "store"), filepath.Join(t.TempDir(), "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, store, mnt)
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	run("rsync", "-aH", src+"/", filepath.Join(mnt, "rsync"))
	run("cp", "-al", filepath.Join(mnt, "rsync"), filepath.Join(mnt, "snap"))

	want := linkGroups(t, src)
	if len(want) != 8 { // model x3 (ckpt-2's with best.pt), optim x3, tokenizer, config
		t.Fatalf("source groups: %v", want)
	}
	// In the mount each snap/ name doubles its rsync/ twin's links.
	doubled := func() []string {
		var g []string
		for _, w := range want {
			names, n, _ := strings.Cut(w, " nlink ")
			var both []string
			for _, p := range strings.Split(names, "=") {
				both = append(both, "rsync/"+p, "snap/"+p)
			}
			sort.Strings(both)
			k, _ := strconv.Atoi(n)
			g = append(g, strings.Join(both, "=")+" nlink "+strconv.Itoa(2*k))
		}
		sort.Strings(g)
		return g
	}()
	size := uniqueBytes(t, src)
	check := func(when string) {
		t.Helper()
		if got := linkGroups(t, filepath.Join(mnt, "rsync")); len(got) != len(want) || strings.Join(got, "\n") != strings.Join(doubledOnly(want), "\n") {
			t.Errorf("%s: rsync -aH groups\n%s\nwant\n%s", when, strings.Join(got, "\n"), strings.Join(doubledOnly(want), "\n"))
		}
		if got := linkGroups(t, mnt); strings.Join(got, "\n") != strings.Join(doubled, "\n") {
			t.Errorf("%s: groups in the mount\n%s\nwant\n%s", when, strings.Join(got, "\n"), strings.Join(doubled, "\n"))
		}
		if got := duBytes(t, filepath.Join(mnt, "rsync"), filepath.Join(mnt, "snap")); got != size {
			t.Errorf("%s: du -sb of both copies %d, want %d (each file once)", when, got, size)
		}
		run("diff", "-r", src, filepath.Join(mnt, "snap"))
	}
	check("after the copies")
	d.stop(syscall.SIGTERM)
	d = startDaemon(t, store, mnt)
	check("after a remount")
	d.stop(syscall.SIGTERM)
	out, err := exec.Command(ckptfsBin, "fsck", store).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0 problems") {
		t.Fatalf("fsck: %v: %s", err, out)
	}
}

// doubledOnly is want as rsync/ alone shows it in the mount: the same
// groups, each link count doubled by snap/'s names.
func doubledOnly(want []string) []string {
	var g []string
	for _, w := range want {
		names, n, _ := strings.Cut(w, " nlink ")
		k, _ := strconv.Atoi(n)
		g = append(g, names+" nlink "+strconv.Itoa(2*k))
	}
	return g
}

// TestOrdinaryUserHardLinks: an ordinary user in a mount of her own links
// her files (ckptfs has no rule of its own: the kernel's protected_hardlinks
// applies, as on ext4) and sees the count.
func TestOrdinaryUserHardLinks(t *testing.T) {
	alice := newTestUser(t, "l")
	home, bin := sharedDir(t, alice)
	store, mnt := filepath.Join(home, "store"), filepath.Join(home, "mnt")
	if code, _, errOut := alice.run(t, "mkdir", mnt); code != 0 {
		t.Fatal(errOut)
	}
	d := startUserDaemon(t, alice, bin, store, mnt)
	defer d.stop(syscall.SIGTERM)
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	script := fmt.Sprintf("echo hi > %s && ln %s %s && echo more >> %s && stat -c '%%h %%U' %s && cat %s", a, a, b, b, a, a)
	code, out, errOut := alice.run(t, "sh", "-c", script)
	if code != 0 || out != "2 "+alice.name+"\nhi\nmore\n" {
		t.Fatalf("link as %s: %q %s", alice.name, out, errOut)
	}
}
