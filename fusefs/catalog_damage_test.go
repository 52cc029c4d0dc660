package fusefs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
	"github.com/ckptfs/ckptfs/gc"
)

// TestDamagedCatalogSweep flips one byte at a time across a real catalog.db
// (every page in use: both meta pages, branch, leaf and overflow pages of every
// bucket) and, for each flip, runs fsck on the store and mounts it and reads
// every file and symlink. Each must either work, with the right bytes, or fail
// cleanly (an error, EIO): never a panic, a fault, or wrong bytes. Before
// records were checked, one such flip served a 2 MB file as 0 bytes and others
// crashed fsck and mount inside bbolt.
func TestDamagedCatalogSweep(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	m := &testMount{t: t, store: store, dir: t.TempDir(), cas0: cas.Options{ChunkSize: 16 << 10}}
	m.mount()
	want := map[string][]byte{}
	links := map[string]string{}
	for i := range 30 {
		p := fmt.Sprintf("runs/r%d/step-%03d.bin", i%3, i)
		want[p] = randBytes(uint64(100+i), 200+37*i)
	}
	want["runs/big/model.bin"] = randBytes(1, 200*16<<10+5) // a manifest over a page long
	want["runs/big/opt.bin"] = randBytes(2, 40*16<<10)
	for p, data := range want {
		if err := os.MkdirAll(filepath.Dir(m.path(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, m.path(p), data)
	}
	for i := range 5 {
		p := fmt.Sprintf("runs/r0/latest-%d", i)
		links[p] = fmt.Sprintf("step-%03d.bin", i)
		if err := os.Symlink(links[p], m.path(p)); err != nil {
			t.Fatal(err)
		}
	}
	m.unmount()
	m.srv = nil

	catalog := filepath.Join(store, "catalog.db")
	orig, err := os.ReadFile(catalog)
	if err != nil {
		t.Fatal(err)
	}
	ps, pages := cas.CatalogPagesInUse(t, catalog)
	// Per page in use: the header bytes bbolt trusts (id, flags, count,
	// overflow), one byte of an element header (position, sizes, child
	// page) and two bytes of keys or values, spread over the page. (Free
	// pages are not read by anyone: flips there prove nothing.)
	var offsets []int
	for _, id := range pages {
		pg := int(id)
		base := pg * ps
		offsets = append(offsets, base, base+8, base+10, base+11, base+12)
		offsets = append(offsets, base+16+(pg*7)%(8*16))
		offsets = append(offsets, base+16+8*16+(pg*331)%(ps/2), base+ps/2+(pg*997)%(ps/2))
	}
	if raceEnabled {
		// Every fourth: the full sweep runs without the race detector
		// (Makefile, test-go).
		var some []int
		for i := 0; i < len(offsets); i += 4 {
			some = append(some, offsets[i])
		}
		offsets = some
	}
	t.Logf("catalog of %d bytes, %d pages in use: %d flips", len(orig), len(pages), len(offsets))

	var outcomes = map[string]int{}
	for i, off := range offsets {
		damaged := append([]byte(nil), orig...)
		damaged[off] ^= []byte{0x01, 0x10, 0xff}[i%3]
		if err := os.WriteFile(catalog, damaged, 0o644); err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("byte %d (page %d +%d) ^%#x", off, off/ps, off%ps, orig[off]^damaged[off])
		outcomes["fsck "+checkFsck(t, store, what)]++
		outcomes["mount "+checkMountReads(t, store, what, want, links)]++
	}
	t.Logf("outcomes: %v", outcomes)
	if err := os.WriteFile(catalog, orig, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkFsck runs fsck on the damaged store and says how it ended.
func checkFsck(t *testing.T, store, what string) string {
	s, err := cas.Open(store, cas.Options{ReadOnly: true, KeepSpool: true, Objects: local.New(cas.ObjectsDir(store), local.Options{})})
	if err != nil {
		return "refused"
	}
	defer s.Close()
	res, err := gc.Fsck(context.Background(), s, gc.FsckOptions{})
	switch {
	case err != nil:
		return "error"
	case !res.OK():
		for _, p := range res.Problems {
			if p.Detail == "" {
				t.Errorf("%s: fsck problem without detail: %+v", what, p)
			}
		}
		return "problems"
	}
	return "clean"
}

// checkMountReads mounts the damaged store and reads every file and link:
// each either fails or is exact.
func checkMountReads(t *testing.T, store, what string, want map[string][]byte, links map[string]string) string {
	s, err := cas.Open(store, cas.Options{CacheSize: 16 << 20, Objects: local.New(cas.ObjectsDir(store), local.Options{})})
	if err != nil {
		if strings.Contains(err.Error(), "panic") {
			t.Errorf("%s: open: %v", what, err)
		}
		return "refused"
	}
	fsys, err := New(s, log.New(discard{}, "", 0), WithReencodeIdle(-1))
	if err != nil {
		s.Close()
		return "refused"
	}
	dir := t.TempDir()
	srv, err := Mount(fsys, dir, MountOptions{})
	if errors.Is(err, syscall.EIO) {
		// The kernel's first look at the root failed: the damage is in
		// the root's record or its directory, and the mount refuses.
		fsys.Close()
		s.Close()
		return "refused"
	}
	if err != nil {
		fsys.Close()
		s.Close()
		t.Fatalf("%s: mount: %v", what, err)
	}
	// A hang is a failure too: abort the connection rather than wait forever
	// (and leave the test binary unable to exit).
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatalf("%s: stat mountpoint: %v", what, err)
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-finished:
		case <-time.After(2 * time.Minute):
			t.Errorf("%s: reads still hang after 2 minutes; aborting the connection", what)
			os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", st.Dev&0xff|(st.Dev>>12)&0xfff00), []byte("1"), 0o200)
		}
	}()
	failed := 0
	for p, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("%s: read %s: %v (want EIO or ENOENT)", what, p, err)
			}
			failed++
			continue
		}
		if string(got) != string(data) {
			t.Errorf("%s: %s reads %d wrong bytes (want %d)", what, p, len(got), len(data))
		}
	}
	for p, target := range links {
		got, err := os.Readlink(filepath.Join(dir, p))
		if err != nil {
			failed++
			continue
		}
		if got != target {
			t.Errorf("%s: link %s reads %q, want %q", what, p, got, target)
		}
	}
	if err := srv.Unmount(); err != nil {
		t.Errorf("%s: unmount: %v", what, err)
		syscall.Unmount(dir, syscall.MNT_DETACH)
	}
	srv.Wait()
	fsys.Close()
	s.Close()
	if failed > 0 {
		return "some reads failed"
	}
	return "all reads exact"
}
