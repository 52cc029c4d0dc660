package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/gc"
)

// du asks the daemon, which has every manifest, what the files of each PATH
// in the mount cost and what deleting them would free (du.go): the daemon
// finds a directory's files in the catalog; a file's inode number, or those
// of a directory when the daemon is older, come from a walk of the mount.
func runDu(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error {
	fl := newFlags(c, stderr)
	asJSON := fl.Bool("json", false, "print JSON")
	paths, err := parseArgsMin(fl, args, 1)
	if err != nil {
		return err
	}
	root, rootDev, groups, dirs, err := duPaths(paths)
	if err != nil {
		return err
	}
	t, err := resolveTarget(root)
	if err != nil {
		return err
	}
	// The daemon finds a directory's files in the catalog: a walk through
	// the mount costs FUSE requests per directory and file (a run of 10⁴
	// steps: seconds). A daemon that does not know GroupDirs ignores them:
	// then walk.
	req := controlRequest{Op: "du", Groups: groups}
	if slices.ContainsFunc(dirs, func(d uint64) bool { return d != 0 }) {
		req.GroupDirs = dirs
	}
	res, err := duAsk(ctx, t.socket, req, len(paths))
	if err != nil {
		return err
	}
	if req.GroupDirs != nil && !res.DirsExpanded {
		for i, p := range paths {
			if dirs[i] == 0 {
				continue
			}
			if groups[i], err = inodesUnder(p, root, rootDev); err != nil {
				return err
			}
		}
		if res, err = duAsk(ctx, t.socket, controlRequest{Op: "du", Groups: groups}, len(paths)); err != nil {
			return err
		}
	}
	type pathUsage struct {
		Path string `json:"path"`
		duUsage
	}
	out := struct {
		Paths    []pathUsage `json:"paths"`
		Total    duUsage     `json:"total"`
		ReadOnly bool        `json:"read_only,omitempty"`
	}{Total: res.Total, ReadOnly: res.ReadOnly}
	for i, p := range paths {
		out.Paths = append(out.Paths, pathUsage{p, res.Groups[i]})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FILES\tLOGICAL\tUNIQUE\tDELETING FREES\tON DISK\tPATH")
	row := func(u duUsage, name string) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", u.Files, formatBytes(u.LogicalBytes), formatBytes(u.UniqueBytes), formatBytes(u.FreesBytes), formatBytes(u.FreesStoredBytes), name)
	}
	for _, pu := range out.Paths {
		row(pu.duUsage, pu.Path)
	}
	if len(paths) > 1 {
		row(res.Total, "total (all paths together)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.ReadOnly {
		fmt.Fprintln(stdout, "a --read-only mount of a remote: nothing can be deleted here; DELETING FREES is what deleting these files frees in a store that holds them as this one does")
	}
	// What deleting does not free though only these files use it.
	kept := func(u duUsage, name string) {
		if u.FreesPackedDeadBytes > 0 {
			fmt.Fprintf(stdout, "%s: %s of its chunks stay on disk, dead, in packs other files' chunks keep (freed with the last of them)\n",
				name, formatBytes(u.FreesPackedDeadBytes))
		}
		if u.KeptChunks > 0 {
			fmt.Fprintf(stdout, "%s: %s kept (%s on disk): bases of %d live deltas in other files (freed with the last of them)\n",
				name, formatBytes(u.KeptBytes), formatBytes(u.KeptStoredBytes), u.KeptForDeltas)
		}
		if u.OtherNames > 0 {
			files := fmt.Sprintf("%d files have", u.OtherNames)
			if u.OtherNames == 1 {
				files = "1 file has"
			}
			fmt.Fprintf(stdout, "%s: %s names outside it too (hard links): deleting it leaves them, and their chunks\n", name, files)
		}
		if u.WaitingChunks > 0 {
			fmt.Fprintf(stdout, "%s: %d changed chunks (%s on disk) stay whole as the latest save of their tensors, until the next save of their run stores them as deltas (mount --delta-latest)\n",
				name, u.WaitingChunks, formatBytes(u.WaitingStoredBytes))
		}
	}
	for _, pu := range out.Paths {
		kept(pu.duUsage, pu.Path)
	}
	if len(paths) > 1 {
		kept(res.Total, "total")
	}
	return nil
}

// catalogIno is the catalog's inode number of p in the mount at root, whose
// stat said ino: the same but for the root, which the kernel numbers itself.
func catalogIno(p, root string, ino uint64) uint64 {
	if abs, err := filepath.Abs(p); err == nil && abs == root {
		return cas.RootIno
	}
	return ino
}

// duPaths finds the mount of paths (one for all) and, for each, its
// directory's catalog inode number for the daemon to expand, or else (a file,
// or a directory of another file system mounted inside) the inode numbers
// of its files.
func duPaths(paths []string) (root string, rootDev uint64, groups [][]uint64, dirs []uint64, err error) {
	dirs = make([]uint64, len(paths))
	groups = make([][]uint64, len(paths))
	for i, p := range paths {
		r, dev, err := mountRootFor(p)
		if err != nil {
			return "", 0, nil, nil, err
		}
		if root == "" {
			root, rootDev = r, dev
		} else if r != root {
			return "", 0, nil, nil, fmt.Errorf("%s and %s are in different mounts (%s, %s): run du once per mount", paths[0], p, root, r)
		}
		var st syscall.Stat_t
		lerr := syscall.Lstat(p, &st)
		if lerr == nil {
			if err := checkNotControl(p, root, &st); err != nil {
				return "", 0, nil, nil, err
			}
		}
		if lerr == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR && st.Dev == rootDev {
			dirs[i] = catalogIno(p, root, st.Ino)
			continue
		}
		if groups[i], err = inodesUnder(p, root, rootDev); err != nil {
			return "", 0, nil, nil, err
		}
	}
	return root, rootDev, groups, dirs, nil
}

// duAsk sends a du request for n paths.
func duAsk(ctx context.Context, socket string, req controlRequest, n int) (duResult, error) {
	var res duResult
	if err := callDaemon(ctx, socket, req, func(gc.Progress) {}, &res); err != nil {
		return res, err
	}
	if len(res.Groups) != n {
		return res, fmt.Errorf("the daemon answered %d groups for %d paths", len(res.Groups), n)
	}
	return res, nil
}

// mountRootFor returns the root of the ckptfs mount holding p (p itself, or
// an ancestor) and the mount's device number. A p in a mount whose daemon is
// gone, or that the user may not look into, fails with probeTarget's error
// of that kind (errDaemonGone, fs.ErrPermission).
func mountRootFor(p string) (string, uint64, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", 0, err
	}
	var st syscall.Stat_t
	blocked := func(err error) bool { return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, fs.ErrPermission) }
	if err := syscall.Lstat(abs, &st); err != nil {
		if blocked(err) {
			return "", 0, duExplain(p, err)
		}
		return "", 0, fmt.Errorf("%s: %w", p, err)
	}
	_, err = os.Stat(filepath.Join(abs, ".ckptfs", "stats.json"))
	if err == nil {
		return abs, st.Dev, nil
	}
	if blocked(err) {
		return "", 0, duExplain(p, err)
	}
	if root, ok := mountRootOf(abs, st.Dev); ok {
		return root, st.Dev, nil
	}
	// The kernel may still answer stat in a dead mount from its cache;
	// statfs always asks the daemon.
	if err := osProber().statfs(abs); errors.Is(err, syscall.ENOTCONN) {
		return "", 0, duExplain(p, err)
	}
	return "", 0, fmt.Errorf("%s is not in a ckptfs mount (du asks the daemon: give paths under a mountpoint)", p)
}

// duExplain is probeTarget's error for err, a dead mount's ENOTCONN or a
// permission error met at p, for du: which needs the daemon, so a dead mount
// must be mounted again (du of a store directory is no alternative).
func duExplain(p string, err error) error {
	if errors.Is(err, syscall.ENOTCONN) {
		return osProber().deadMount(p, false)
	}
	return osProber().explain(p, err)
}

// errControlDir: du was given the mount's .ckptfs directory, or a path in it.
var errControlDir = errors.New("ckptfs's control directory")

// checkNotControl refuses p when it is the .ckptfs directory of the mount at
// root, or below it: the mount's statistics and the manifests of its files,
// which ckptfs makes up on the fly. They are no files of the store: du has
// nothing to count there (the daemon, asked about the directory, would not
// find it in the catalog). st is p's lstat.
func checkNotControl(p, root string, st *syscall.Stat_t) error {
	ctl := filepath.Join(root, ".ckptfs")
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil
	}
	var cs syscall.Stat_t
	var what string
	switch {
	case abs == ctl || st.Mode&syscall.S_IFMT == syscall.S_IFDIR && syscall.Stat(ctl, &cs) == nil && cs.Dev == st.Dev && cs.Ino == st.Ino:
		what = p + " is" // the directory itself, or through a symbolic link (LINK/.)
	case strings.HasPrefix(abs, ctl+"/"):
		what = p + " is in " + ctl + ","
	default:
		return nil
	}
	return fmt.Errorf("%s %w (the mount's statistics and the manifests of its files, made up on the fly), not files of the store: du has nothing to count there; give paths of the mount outside .ckptfs", what, errControlDir)
}

// inodesUnder lists the inode numbers of the regular files at or below p, on
// the mount's device, leaving out the mount's .ckptfs directory.
func inodesUnder(p, root string, dev uint64) ([]uint64, error) {
	ctl := filepath.Join(root, ".ckptfs")
	inos := []uint64{}
	err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		if d.IsDir() && abs == ctl {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || st.Dev != dev {
			return nil
		}
		inos = append(inos, st.Ino)
		return nil
	})
	return inos, err
}
