package powerloss

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
)

// The model's rules, on Disk directly.

func must(t *testing.T, errno syscall.Errno) {
	t.Helper()
	if errno != 0 {
		t.Fatal(errno)
	}
}

func create(t *testing.T, d *Disk, parent uint64, name string) uint64 {
	t.Helper()
	a, errno := d.Create(parent, name, syscall.S_IFREG|0o644, 0, 0, true, false)
	must(t, errno)
	return a.Ino
}

func mkdir(t *testing.T, d *Disk, parent uint64, name string) uint64 {
	t.Helper()
	a, errno := d.Mkdir(parent, name, 0o755, 0, 0)
	must(t, errno)
	return a.Ino
}

// content returns path's bytes on d, or nil and false when it is absent.
func content(t *testing.T, d *Disk, path ...string) ([]byte, bool) {
	t.Helper()
	ino := uint64(RootIno)
	for _, name := range path {
		a, errno := d.Lookup(ino, name)
		if errno == syscall.ENOENT {
			return nil, false
		}
		must(t, errno)
		ino = a.Ino
	}
	a, errno := d.GetAttr(ino)
	must(t, errno)
	b, errno := d.Read(ino, 0, int(a.Size)+1)
	must(t, errno)
	return b, true
}

func crash(t *testing.T, d *Disk, mode Mode, seed int64) *Disk {
	t.Helper()
	d.Crash(mode, seed)
	after := d.After()
	if after == nil {
		t.Fatal("no disk after the crash")
	}
	if _, errno := d.GetAttr(RootIno); errno != syscall.EIO {
		t.Fatalf("request after the crash: %v, want EIO", errno)
	}
	return after
}

func TestDurabilityRules(t *testing.T) {
	v1, v2 := []byte("version one"), []byte("version two, longer")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, d *Disk) // changes after a durable root/f = v1
		want []byte                      // f after a DropAll crash; nil: absent
	}{
		{"write without fsync is lost", func(t *testing.T, d *Disk) {
			ino := lookup(t, d, "f")
			must(t, d.Write(ino, 0, v2))
		}, v1},
		{"fsync makes data durable", func(t *testing.T, d *Disk) {
			ino := lookup(t, d, "f")
			must(t, d.Write(ino, 0, v2))
			must(t, d.Sync(ino))
		}, v2},
		{"truncate without fsync is lost", func(t *testing.T, d *Disk) {
			zero := uint64(0)
			_, errno := d.SetAttr(lookup(t, d, "f"), SetAttrs{Size: &zero})
			must(t, errno)
		}, v1},
		{"unlink without directory fsync is lost", func(t *testing.T, d *Disk) {
			must(t, d.Unlink(RootIno, "f"))
		}, v1},
		{"unlink with directory fsync", func(t *testing.T, d *Disk) {
			must(t, d.Unlink(RootIno, "f"))
			must(t, d.Sync(RootIno))
		}, nil},
		{"fsynced file renamed over, no directory fsync", func(t *testing.T, d *Disk) {
			tmp := create(t, d, RootIno, "tmp")
			must(t, d.Write(tmp, 0, v2))
			must(t, d.Sync(tmp))
			must(t, d.Rename(RootIno, "tmp", RootIno, "f", 0))
		}, v1},
		{"fsynced file renamed over, directory fsync", func(t *testing.T, d *Disk) {
			tmp := create(t, d, RootIno, "tmp")
			must(t, d.Write(tmp, 0, v2))
			must(t, d.Sync(tmp))
			must(t, d.Rename(RootIno, "tmp", RootIno, "f", 0))
			must(t, d.Sync(RootIno))
		}, v2},
		{"rename over without data fsync gives an empty file", func(t *testing.T, d *Disk) {
			tmp := create(t, d, RootIno, "tmp")
			must(t, d.Write(tmp, 0, v2))
			must(t, d.Rename(RootIno, "tmp", RootIno, "f", 0))
			must(t, d.Sync(RootIno))
		}, []byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New()
			f := create(t, d, RootIno, "f")
			must(t, d.Write(f, 0, v1))
			must(t, d.Sync(f))
			must(t, d.Sync(RootIno))
			tc.run(t, d)
			after := crash(t, d, DropAll, 1)
			got, ok := content(t, after, "f")
			switch {
			case tc.want == nil && ok:
				t.Fatalf("f survived with %q, want absent", got)
			case tc.want != nil && !ok:
				t.Fatalf("f is absent, want %q", tc.want)
			case tc.want != nil && !bytes.Equal(got, tc.want):
				t.Fatalf("f = %q, want %q", got, tc.want)
			}
			if _, ok := content(t, after, "tmp"); ok {
				t.Fatal("tmp survived")
			}
		})
	}
}

func lookup(t *testing.T, d *Disk, name string) uint64 {
	t.Helper()
	a, errno := d.Lookup(RootIno, name)
	must(t, errno)
	return a.Ino
}

// A file in a new directory needs the directory's own entry made durable.
func TestNewDirectoryNeedsParentSync(t *testing.T) {
	for _, syncRoot := range []bool{false, true} {
		d := New()
		dir := mkdir(t, d, RootIno, "a")
		sub := mkdir(t, d, dir, "b")
		f := create(t, d, sub, "f")
		must(t, d.Write(f, 0, []byte("x")))
		must(t, d.Sync(f))
		must(t, d.Sync(sub))
		must(t, d.Sync(dir))
		if syncRoot {
			must(t, d.Sync(RootIno))
		}
		after := crash(t, d, DropAll, 1)
		got, ok := content(t, after, "a", "b", "f")
		if ok != syncRoot || (ok && string(got) != "x") {
			t.Fatalf("root synced %v: a/b/f present %v (%q)", syncRoot, ok, got)
		}
	}
}

// One side of a cross-directory rename made durable makes the other durable.
func TestRenameIsAtomic(t *testing.T) {
	for _, syncDir := range []string{"a", "b"} {
		d := New()
		a, b := mkdir(t, d, RootIno, "a"), mkdir(t, d, RootIno, "b")
		f := create(t, d, a, "x")
		must(t, d.Sync(f))
		for _, ino := range []uint64{a, b, RootIno} {
			must(t, d.Sync(ino))
		}
		must(t, d.Rename(a, "x", b, "y", 0))
		must(t, d.Sync(map[string]uint64{"a": a, "b": b}[syncDir]))
		after := crash(t, d, DropAll, 1)
		_, oldOK := content(t, after, "a", "x")
		_, newOK := content(t, after, "b", "y")
		if oldOK || !newOK {
			t.Fatalf("fsync of %s: a/x present %v, b/y present %v; want only b/y", syncDir, oldOK, newOK)
		}
	}
}

// Partial keeps each unsynced page and namespace change or not; nothing else
// ever appears.
func TestPartialCrashes(t *testing.T) {
	const pages = 6
	old := bytes.Repeat([]byte{'o'}, pages*pageSize)
	cur := bytes.Repeat([]byte{'n'}, pages*pageSize+100)
	seen := map[string]bool{}
	for seed := int64(0); seed < 300; seed++ {
		d := New()
		f := create(t, d, RootIno, "f")
		must(t, d.Write(f, 0, old))
		must(t, d.Sync(f))
		must(t, d.Sync(RootIno))
		must(t, d.Write(f, 0, cur))
		g := create(t, d, RootIno, "g") // unsynced entry
		must(t, d.Sync(g))
		after := crash(t, d, Partial, seed)
		got, ok := content(t, after, "f")
		if !ok {
			t.Fatal("f lost its durable entry")
		}
		if len(got) < len(old) || len(got) > len(cur) {
			t.Fatalf("seed %d: size %d, want between %d and %d", seed, len(got), len(old), len(cur))
		}
		var shape []byte
		for p := 0; p*pageSize < len(got); p++ {
			page := got[p*pageSize : min((p+1)*pageSize, len(got))]
			switch {
			case bytes.Equal(page, old[p*pageSize:min((p+1)*pageSize, len(old))]) && p < pages:
				shape = append(shape, 'o')
			case bytes.Equal(page, cur[p*pageSize : min((p+1)*pageSize, len(cur))][:len(page)]):
				shape = append(shape, 'n')
			case bytes.Count(page, []byte{0}) == len(page):
				shape = append(shape, '0')
			default:
				t.Fatalf("seed %d: page %d holds bytes no write put there", seed, p)
			}
		}
		_, gOK := content(t, after, "g")
		seen[fmt.Sprintf("%s g=%v", shape, gOK)] = true
		seen[fmt.Sprintf("g=%v", gOK)] = true
	}
	if !seen["g=true"] || !seen["g=false"] {
		t.Errorf("the unsynced create always or never survived: %v", seen)
	}
	if !seen[fmt.Sprintf("%s g=true", bytes.Repeat([]byte{'o'}, pages))] && !seen[fmt.Sprintf("%s g=false", bytes.Repeat([]byte{'o'}, pages))] {
		t.Errorf("no crash kept only the durable content")
	}
	mixed := 0
	for k := range seen {
		if bytes.Contains([]byte(k), []byte("o")) && bytes.Contains([]byte(k), []byte("n")) {
			mixed++
		}
	}
	if mixed < 5 {
		t.Errorf("only %d mixed outcomes of old and new pages: %v", mixed, seen)
	}
}

// CrashAfter cuts the power at the n-th changing request: it and everything
// after fail, what came before is kept by the rules.
func TestCrashAfter(t *testing.T) {
	d := New()
	f := create(t, d, RootIno, "f") // request 1
	d.CrashAfter(3, DropAll, 1)
	must(t, d.Write(f, 0, []byte("abc"))) // 1 of 3
	must(t, d.Sync(f))                    // 2
	if _, errno := d.Lookup(RootIno, "f"); errno != 0 {
		t.Fatal("a lookup counted as a change")
	}
	if errno := d.Sync(RootIno); errno != syscall.EIO { // 3: the power is cut
		t.Fatalf("third change: %v, want EIO", errno)
	}
	select {
	case <-d.Crashed():
	default:
		t.Fatal("Crashed not closed")
	}
	if errno := d.Write(f, 0, []byte("x")); errno != syscall.EIO {
		t.Fatalf("write after the crash: %v", errno)
	}
	if _, ok := content(t, d.After(), "f"); ok {
		t.Fatal("f survived although its entry was never made durable")
	}
}

// Truncating and growing again reads zeros, durable or not.
func TestTruncateGrow(t *testing.T) {
	d := New()
	f := create(t, d, RootIno, "f")
	must(t, d.Write(f, 0, []byte("abcdef")))
	two, six := uint64(2), uint64(6)
	_, errno := d.SetAttr(f, SetAttrs{Size: &two})
	must(t, errno)
	_, errno = d.SetAttr(f, SetAttrs{Size: &six})
	must(t, errno)
	must(t, d.Sync(f))
	must(t, d.Sync(RootIno))
	got, _ := content(t, crash(t, d, DropAll, 1), "f")
	if want := []byte("ab\x00\x00\x00\x00"); !bytes.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
