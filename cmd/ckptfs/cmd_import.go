package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
	"github.com/ckptfs/ckptfs/gc"
	"golang.org/x/sys/unix"
)

// import copies a directory tree into a store through a mount, so that its
// files are chunked and deduplicated exactly as if training had written them
// there. Given an unmounted store it mounts the store itself, on a temporary
// directory, for the copy. Each file is written under a temporary name and
// renamed into place once committed: an interrupted import leaves whole files
// (and at most one temporary file), never a truncated checkpoint under its
// real name.

// importEntry is one thing to copy.
type importEntry struct {
	rel  string // relative to SRC; "." for SRC itself
	mode fs.FileMode
	size int64
	st   syscall.Stat_t
	link string // symlink target
}

// importSummary is import's answer.
type importSummary struct {
	Source       string   `json:"source"`
	Target       string   `json:"target"`
	Dest         string   `json:"dest"` // relative to the mount root
	Files        int      `json:"files"`
	Dirs         int      `json:"dirs"`
	Symlinks     int      `json:"symlinks"`
	Skipped      []string `json:"skipped,omitempty"` // sockets, devices, FIFOs
	LogicalBytes int64    `json:"logical_bytes"`     // bytes of the files imported
	AddedBytes   int64    `json:"added_bytes"`       // growth of the store's unique bytes
	Ratio        *float64 `json:"ratio"`             // logical / added; null when nothing was added
	// ReencodedChunks: chunks the copy stored raw (no inline encoder was
	// free) that were taken off the re-encode queue before the import
	// returned: encoded, or kept raw where encoding did not pay. Always 0 for
	// a mounted target, whose daemon does this once idle.
	ReencodedChunks int     `json:"reencoded_chunks"`
	Seconds         float64 `json:"seconds"`
}

// copyBlock matches the mount's largest write.
const copyBlock = 1 << 20

func runImport(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print the summary as JSON")
	encoders := inlineEncodersFlag(fl)
	pos, err := parseArgs(fl, args, 3)
	if err != nil {
		return err
	}
	if err := checkInlineEncoders(*encoders, c, stderr); err != nil {
		return err
	}
	targetArg, src, destArg := pos[0], pos[1], pos[2]
	dest, err := cleanDest(destArg)
	if err != nil {
		return err
	}
	srcAbs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	if srcAbs, err = filepath.EvalSymlinks(srcAbs); err != nil { // SRC may be a link to the run
		return err
	}
	entries, total, err := planImport(srcAbs)
	if err != nil {
		return err
	}

	mnt, unmount, err := importMount(ctx, targetArg, *encoders, stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	bar := newProgressBar(stderr)
	sum, err := importInto(ctx, mnt, srcAbs, dest, entries, total, bar)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %s is partial (%d of %d files imported; no file is truncated)", dest, sum.Files, countFiles(entries))
	}
	reencoded, uerr := unmount(bar.update)
	if err == nil {
		err = uerr
	}
	sum.ReencodedChunks = reencoded
	if err != nil {
		bar.finish("")
		return err
	}
	sum.Target, _ = filepath.Abs(targetArg)
	sum.Seconds = time.Since(start).Seconds()
	if sum.AddedBytes > 0 {
		r := float64(sum.LogicalBytes) / float64(sum.AddedBytes)
		sum.Ratio = &r
	}
	if *asJSON {
		bar.finish("")
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	bar.finish(fmt.Sprintf("import: copied %d files, %s; added %s to the store",
		sum.Files, formatRate(sum.LogicalBytes, time.Duration(sum.Seconds*float64(time.Second))), formatBytes(sum.AddedBytes)))
	fmt.Fprintf(stdout, "imported %s into %s at %s: %d files, %d directories, %d symlinks\n", sum.Source, sum.Target, sum.Dest, sum.Files, sum.Dirs, sum.Symlinks)
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "logical\t%s\t(%d bytes)\n", formatBytes(sum.LogicalBytes), sum.LogicalBytes)
	fmt.Fprintf(tw, "added to the store\t%s\t(%d bytes of new chunks)\n", formatBytes(sum.AddedBytes), sum.AddedBytes)
	if sum.Ratio != nil {
		fmt.Fprintf(tw, "ratio\t%s\t(logical / added; saved %s)\n", formatRatio(*sum.Ratio), formatBytes(sum.LogicalBytes-sum.AddedBytes))
	} else {
		fmt.Fprintf(tw, "ratio\t-\t(every chunk was in the store already)\n")
	}
	if sum.ReencodedChunks > 0 {
		fmt.Fprintf(tw, "re-encoded\t%d chunks\t(stored raw during the copy)\n", sum.ReencodedChunks)
	}
	if len(sum.Skipped) > 0 {
		fmt.Fprintf(tw, "skipped\t%d\t(not files, directories or symlinks: %s)\n", len(sum.Skipped), strings.Join(sum.Skipped, ", "))
	}
	return tw.Flush()
}

func countFiles(entries []importEntry) int {
	n := 0
	for _, e := range entries {
		if e.mode.IsRegular() {
			n++
		}
	}
	return n
}

// cleanDest checks DEST: a path below the mount root, outside .ckptfs.
func cleanDest(d string) (string, error) {
	bad := fmt.Errorf("DEST %q must be a new path below the mount root (e.g. runs/imported), outside .ckptfs", d)
	if filepath.IsAbs(d) {
		// Not a host path: taken relative to the mount root, it would land
		// somewhere the user did not name.
		return "", fmt.Errorf("DEST %q is absolute: give a path relative to the mount root (e.g. runs/imported)", d)
	}
	for _, part := range strings.Split(d, "/") {
		if part == ".." {
			return "", bad
		}
	}
	c := strings.TrimPrefix(filepath.Clean("/"+d), "/")
	if c == "" || strings.Split(c, "/")[0] == ".ckptfs" {
		return "", bad
	}
	return c, nil
}

// planImport lists SRC (a directory or one file) in walk order, each
// directory's entries in natural order of names (checkpoint-500 before
// checkpoint-1000, as `ckptfs log` orders steps): each step is then imported
// after the one before it, which its commit takes as the previous version
// of its files for delta coding (fusefs: bases.go).
func planImport(src string) ([]importEntry, int64, error) {
	var entries []importEntry
	var total int64
	err := walkNatural(src, func(p string) error {
		var e importEntry
		var err error
		if e.rel, err = filepath.Rel(src, p); err != nil {
			return err
		}
		if err := syscall.Lstat(p, &e.st); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		e.mode = fs.FileMode(e.st.Mode&0o7777).Perm() | modeType(e.st.Mode)
		if e.st.Mode&syscall.S_ISUID != 0 {
			e.mode |= fs.ModeSetuid
		}
		if e.st.Mode&syscall.S_ISGID != 0 {
			e.mode |= fs.ModeSetgid
		}
		if e.st.Mode&syscall.S_ISVTX != 0 {
			e.mode |= fs.ModeSticky
		}
		switch {
		case e.mode.IsRegular():
			e.size = e.st.Size
			total += e.size
		case e.mode&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	if !entries[0].mode.IsDir() && !entries[0].mode.IsRegular() {
		return nil, 0, fmt.Errorf("SRC %s is neither a directory nor a regular file", src)
	}
	return entries, total, nil
}

// walkNatural calls fn for root and, root being a directory, for everything
// under it, depth first, a directory before its entries and its entries in
// natural order of names (bytewise among names equal in that order).
func walkNatural(root string, fn func(p string) error) error {
	if err := fn(root); err != nil {
		return err
	}
	if st, err := os.Lstat(root); err != nil || !st.IsDir() {
		return err
	}
	return walkEntries(root, fn)
}

// walkEntries is walkNatural under directory dir.
func walkEntries(dir string, fn func(p string) error) error {
	ents, err := os.ReadDir(dir) // bytewise
	if err != nil {
		return err
	}
	slices.SortStableFunc(ents, func(a, b fs.DirEntry) int {
		switch {
		case naturalLess(a.Name(), b.Name()):
			return -1
		case naturalLess(b.Name(), a.Name()):
			return 1
		}
		return 0
	})
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := fn(p); err != nil {
			return err
		}
		if e.IsDir() {
			if err := walkEntries(p, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func modeType(m uint32) fs.FileMode {
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	case syscall.S_IFREG:
		return 0
	}
	return fs.ModeIrregular
}

// importMount returns the mount root to copy into and what to call when done:
// TARGET itself when it is a mountpoint, else a temporary mount of the store
// TARGET (created when TARGET does not exist), whose unmount also encodes the
// chunks the copy stored raw, reporting that as phase "encode", and says how
// many.
func importMount(ctx context.Context, target string, encoders int, stderr io.Writer) (string, func(progress func(gc.Progress)) (int, error), error) {
	// A dead mount, or a store of another user, fails with probeTarget's
	// error of that kind; a TARGET that does not exist is a new store.
	kind, _, err := probeTarget(target)
	switch {
	case err == nil && kind == kindMount:
		return target, func(func(gc.Progress)) (int, error) { return 0, nil }, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", nil, err
	}
	// The mount's default without a remote: the latest save stays whole.
	store, err := openStore(target, storeOptions(runtime.GOMAXPROCS(0), encoders, cas.Options{DeltaLatestWhole: true}))
	if errors.Is(err, cas.ErrLocked) {
		return "", nil, fmt.Errorf("%w: import into its mountpoint instead", err)
	}
	if err != nil {
		return "", nil, err
	}
	logger := log.New(stderr, "ckptfs import: ", log.LstdFlags)
	fsys, err := fusefs.New(store, logger)
	if err != nil {
		store.Close()
		return "", nil, err
	}
	tmp, err := os.MkdirTemp("", "ckptfs-import-")
	if err != nil {
		fsys.Close()
		store.Close()
		return "", nil, err
	}
	srv, err := fusefs.Mount(fsys, tmp, fusefs.MountOptions{})
	if err != nil {
		fsys.Close()
		store.Close()
		os.Remove(tmp)
		return "", nil, err
	}
	unmount := func(progress func(gc.Progress)) (reencoded int, err error) {
		err = srv.Unmount()
		if err != nil {
			logger.Printf("unmount: %v; detaching lazily", err)
			err = syscall.Unmount(tmp, syscall.MNT_DETACH)
		}
		if err == nil {
			srv.Wait()
		}
		if cerr := fsys.CommitAll(context.Background()); err == nil {
			err = cerr
		}
		fsys.Close()
		if err == nil {
			reencoded = drainReencodes(ctx, store, logger, progress)
		}
		if cerr := store.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(tmp); err == nil {
			err = rerr
		}
		return reencoded, err
	}
	return tmp, unmount, nil
}

// drainReencodes encodes the chunks the import stored raw (its commits had
// no free inline encoder) before the store is closed, and returns how many
// queue rows it took. A mounted store does this in the background once idle;
// a store only ever imported into would otherwise keep them raw, costing its
// owner disk.
//
// Each row is tried once: ReencodeOne goes round the queue in key order, so a
// row that keeps failing would come back forever. Errors do not fail the
// import (the chunk is stored and verified, only larger): each is said on
// stderr, and three in a row that are not about one damaged chunk (a full
// disk, say) end the drain. So does ctx; what is left stays queued, and the
// next mount re-encodes it. Progress is phase "encode", in chunks.
func drainReencodes(ctx context.Context, store *cas.Store, logger *log.Logger, progress func(gc.Progress)) int {
	var pending int64
	if err := store.View(func(tx *cas.Tx) error {
		pending = tx.Counts().ReencodePending
		return nil
	}); err != nil {
		logger.Printf("re-encode queue: %v (the next mount re-encodes it)", err)
		return 0
	}
	done, failures := 0, 0
	for i := range pending {
		progress(gc.Progress{Phase: "encode", Done: i, Total: pending})
		more, err := store.ReencodeOne(ctx)
		switch {
		case ctx.Err() != nil:
			logger.Printf("interrupted: %d chunks stay stored raw until the next mount re-encodes them", pending-int64(done))
			return done
		case err == nil:
			done++
			failures = 0
		case errors.Is(err, cas.ErrCorrupt) || errors.Is(err, cas.ErrMissing):
			done++ // dropped from the queue; fsck names it
			logger.Printf("re-encode: %v", err)
		default:
			logger.Printf("re-encode (the chunk stays stored raw): %v", err)
			if failures++; failures == 3 {
				logger.Printf("giving up re-encoding after 3 errors in a row; the next mount retries")
				return done
			}
		}
		if !more {
			break
		}
	}
	return done
}

// importInto copies entries from src to dest below mnt, reporting phase
// "import" in bytes, and "commit" while it waits for a file's commit.
func importInto(ctx context.Context, mnt, src, dest string, entries []importEntry, total int64, bar *progressBar) (importSummary, error) {
	sum := importSummary{Source: src, Dest: dest}
	base := filepath.Join(mnt, dest)
	if err := checkDestFree(base, dest); err != nil {
		return sum, err
	}
	before, err := uniqueBytes(mnt)
	if err != nil {
		return sum, err
	}
	if err := mkdirBeneath(mnt, filepath.Dir(dest)); err != nil {
		return sum, err
	}
	var done int64
	progress := func(n int64) {
		done += n
		bar.update(gc.Progress{Phase: "import", Done: done, Total: total, Bytes: true})
	}
	wait := func(rel string, size int64) func() {
		return bar.waiting(ctx, "commit", fmt.Sprintf("%s (%s)", filepath.Join(dest, rel), formatBytes(size)))
	}
	buf := make([]byte, copyBlock)
	var dirs []importEntry // set their modes and times last, deepest first
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		p := filepath.Join(base, e.rel)
		switch {
		case e.mode.IsDir():
			// Writable until the end, whatever the source's mode.
			if err := os.Mkdir(p, 0o700); err != nil && !(e.rel == "." && errors.Is(err, fs.ErrExist)) {
				return sum, err
			}
			dirs = append(dirs, e)
			sum.Dirs++
		case e.mode.IsRegular():
			if err := copyFile(ctx, filepath.Join(src, e.rel), p, e, buf, progress, wait); err != nil {
				return sum, err
			}
			sum.Files++
			sum.LogicalBytes += e.size
		case e.mode&fs.ModeSymlink != 0:
			if err := os.Symlink(e.link, p); err != nil {
				return sum, err
			}
			if err := setTimes(p, e, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return sum, err
			}
			sum.Symlinks++
		default:
			sum.Skipped = append(sum.Skipped, filepath.Join(src, e.rel))
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		p := filepath.Join(base, dirs[i].rel)
		if err := os.Chmod(p, dirs[i].mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return sum, err
		}
		if err := setTimes(p, dirs[i], 0); err != nil {
			return sum, err
		}
	}
	after, err := uniqueBytes(mnt)
	if err != nil {
		return sum, err
	}
	sum.AddedBytes = max(0, after-before)
	return sum, nil
}

// mkdirBeneath creates the directories of rel (a clean relative path) under
// mnt that do not exist yet, and refuses a component that is a symlink or not
// a directory: a symlink already in the mount (an earlier import keeps the
// source's links verbatim) may point anywhere on the host, and the import
// runs as root, so following it would write outside the store. The entries
// import then creates below DEST are its own, and it creates none below a
// symlink (the walk of SRC does not descend into links).
func mkdirBeneath(mnt, rel string) error {
	p := mnt
	if rel == "." {
		return nil
	}
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if st, err = os.Lstat(p); err != nil {
				return err
			}
		case err != nil:
			return err
		}
		if !st.IsDir() {
			what := "not a directory"
			if st.Mode()&fs.ModeSymlink != 0 {
				what = "a symlink (import does not follow links in the mount)"
			}
			r, _ := filepath.Rel(mnt, p)
			return fmt.Errorf("DEST: %s in the store is %s", r, what)
		}
	}
	return nil
}

// checkDestFree refuses a DEST that exists, unless it is an empty directory.
// It does not follow a symlink at DEST: one is refused as existing.
func checkDestFree(base, dest string) error {
	st, err := os.Lstat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		ents, err := os.ReadDir(base)
		if err != nil {
			return err
		}
		if len(ents) == 0 {
			return nil
		}
	}
	return fmt.Errorf("DEST %s exists in the store: import into a new path", dest)
}

// copyFile copies src to dst through a temporary name in dst's directory;
// once committed it gets src's mode and times and its name. It calls
// progress with the bytes of each write, and wait before the commit (whose
// fsync may take seconds) and what that returns after it.
func copyFile(ctx context.Context, src, dst string, e importEntry, buf []byte, progress func(int64), wait func(rel string, size int64) func()) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := filepath.Join(filepath.Dir(dst), fmt.Sprintf(".%s.ckptfs-import-%d", filepath.Base(dst), os.Getpid()))
	if len(filepath.Base(tmp)) > 255 {
		tmp = filepath.Join(filepath.Dir(dst), fmt.Sprintf(".ckptfs-import-%d", os.Getpid()))
	}
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close() // the error that matters is err
			os.Remove(tmp)
		}
	}()
	// Plain reads and writes: no copy_file_range or splice into the mount.
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		k, rerr := in.Read(buf)
		if k > 0 {
			if _, err := out.Write(buf[:k]); err != nil {
				return err
			}
			n += int64(k)
			progress(int64(k))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if n != e.size {
		return fmt.Errorf("%s changed while being imported (%d bytes, was %d)", src, n, e.size)
	}
	// fsync commits the file and waits for the commit, also on a mount with
	// --commit async (where close alone may return first): the summary's
	// store statistics must include it.
	stop := wait(e.rel, e.size)
	err = out.Sync()
	stop()
	if err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if err := os.Chmod(tmp, e.mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return setTimes(dst, e, 0)
}

// setTimes gives p e's access and modification times.
func setTimes(p string, e importEntry, flags int) error {
	ts := []unix.Timespec{unix.NsecToTimespec(e.st.Atim.Nano()), unix.NsecToTimespec(e.st.Mtim.Nano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, flags); err != nil {
		return fmt.Errorf("set times of %s: %w", p, err)
	}
	return nil
}

// uniqueBytes reads the store's unique_bytes through the mount.
func uniqueBytes(mnt string) (int64, error) {
	st, err := readStats(mnt)
	if err != nil {
		return 0, err
	}
	u, ok := st["unique_bytes"].(float64)
	if !ok {
		return 0, fmt.Errorf("%s: stats.json has no unique_bytes", mnt)
	}
	return int64(u), nil
}
