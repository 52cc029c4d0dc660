"""make bench-scale (issue 27): many small files and a long run, ckptfs against
a plain directory on the same disk, side by side in one run.

  creates   N files of 4 KiB from 8 writers (and N1 from 1 writer), in the mount
            (close = durable) and in a plain directory (each file fsync'd: the
            same durability); files/s and the ratio of times ckptfs ÷ plain;
            with --floor-bin the same creates through fusefloor's noop mount
            (FUSE's own ceiling here) and its loopback with fsync
  walks     after a daemon restart and a drop of the page cache: find, stat of
            every path, read of every file; ratio to plain and µs per file;
            with --floor-bin find and the stat walk through fusefloor's
            loopback of the plain directory (a LOOKUP a stat: FUSE's floor)
  store     gc and fsck of the mount: µs per file
  memory    the daemon's VmRSS and RssAnon after the walks
  cgroup    (--cgroup-mib M) the daemon restarted in a memory cgroup of M MiB
            without swap, then find, stat, read-all, gc and fsck in it: whether
            it completes, the cgroup's peak, anon and file memory, OOM kills
  run       S tiny checkpoints (a safetensors file and metrics.json per step),
            one step at a time: commit latency of the first and last 100 steps,
            then `ckptfs log`, `best`, `report` and `du` on the run: s and µs
            per step (--run-only: this phase alone, while iterating)

Needs root (mount, drop_caches). Output: KEY VALUE lines (sorted) on stdout
and in --out, with the load averages at the start and the end. Scratch under
--dir (default /tmp/scale-bench-XXXX), removed unless --keep; --reuse measures
a kept scratch directory again without creating its files (at 10⁶ files the
creates take most of an hour)."""

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FILE_BYTES = 4096
PER_DIR = 1000  # files per directory, like ranks of a step


def drop_caches():
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class Daemon:
    def __init__(self, binary, store, mnt):
        self.binary, self.store, self.mnt = binary, store, mnt
        self.proc = None
        self.prefix = []  # argv before the binary: a cgroup's wrapper

    def start(self):
        """Mounts; start_s is how long until the daemon served (at 10⁶ files,
        opening the catalog reads it whole: a cost of its own)."""
        self.mnt.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen([*self.prefix, str(self.binary), "mount", str(self.store), str(self.mnt)],
                                     stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"ckptfs mount failed: {line!r}")
        self.start_s = time.monotonic() - t0

    def stop(self):
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=600)
        self.proc = None
        if rc != 0:
            raise SystemExit(f"ckptfs mount exited with {rc}")

    def kill(self):
        """After a failure: the daemon gone and its mount with it."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        subprocess.run(["umount", "-l", str(self.mnt)], check=False, capture_output=True)

    def memory(self):
        out = {}
        for l in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            k, _, v = l.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
        return out


class FloorMount:
    """A mount of test/bench/fusefloor: FUSE with nothing (noop) or a
    loopback of a directory on the same disk (fsync passed down) behind it,
    with ckptfs's mount options: what FUSE itself costs a create here. (bench.py
    mounts its read mode, extra ["-size", N], for a cold read's floor.)"""

    def __init__(self, binary, mode, mnt, backing=None, extra=()):
        self.mnt = mnt
        mnt.mkdir(parents=True, exist_ok=True)
        argv = [str(binary), "-mode", mode, *extra]
        if backing is not None:
            backing.mkdir(parents=True, exist_ok=True)
            argv += ["-backing", str(backing)]
        self.proc = subprocess.Popen([*argv, str(mnt)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            raise SystemExit(f"fusefloor -mode {mode} failed: {line!r}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "killed"
        if rc != 0:
            subprocess.run(["umount", "-l", str(self.mnt)], check=False, capture_output=True)
            if exc[0] is None:
                raise SystemExit(f"fusefloor at {self.mnt} exited with {rc}")


def floor_creates(binary, base, w, n, content, tp, out):
    """The same creates (n files, w writers) into fusefloor's noop mount
    (closed, nothing durable: FUSE's own ceiling here) and its loopback of a
    directory on this disk (each file fsync'd, as plain's): files/s and the
    ratio of times to plain's tp, measured right after it."""
    for name, mode, fsync, backing in (("fuse_noop", "noop", False, None),
                                       ("fuse_loopback_fsync", "loopback", True, base / "floor-loop-backing")):
        with FloorMount(binary, mode, base / f"floor-{mode}", backing) as m:
            t = create(paths(m.mnt / f"w{w}", n), w, fsync, content, w)
        out[f"create_w{w}.{name}_files_per_s"] = n / t
        out[f"create_w{w}.{name}_ratio"] = t / tp
        (base / f"floor-{mode}").rmdir()
        if backing is not None:
            shutil.rmtree(backing)  # not part of the walks that follow


class MemoryCgroup:
    """A fresh memory cgroup limited to limit bytes without swap: v1's memory
    controller if mounted (/sys/fs/cgroup/memory), else cgroup v2's (as
    test_daemon_in_128mib_cgroup in test/e2e/test_lazy_read.py makes it)."""

    def __init__(self, name, limit):
        v1 = "/sys/fs/cgroup/memory"
        try:
            if os.path.exists(f"{v1}/memory.limit_in_bytes"):
                self.path, self.v2 = f"{v1}/{name}", False
                os.mkdir(self.path)
                self._write("memory.limit_in_bytes", limit)
                if os.path.exists(f"{self.path}/memory.memsw.limit_in_bytes"):
                    self._write("memory.memsw.limit_in_bytes", limit)
            else:
                root = cgroup2_mount()
                if root is None:
                    raise SystemExit("no cgroup v1 memory controller and no cgroup2 mount")
                if "memory" not in Path(f"{root}/cgroup.controllers").read_text().split():
                    raise SystemExit(f"{root}/cgroup.controllers lacks the memory controller")
                if "memory" not in Path(f"{root}/cgroup.subtree_control").read_text().split():
                    Path(f"{root}/cgroup.subtree_control").write_text("+memory")
                self.path, self.v2 = f"{root}/{name}", True
                os.mkdir(self.path)
                self._write("memory.max", limit)
                if os.path.exists(f"{self.path}/memory.swap.max"):
                    self._write("memory.swap.max", 0)
        except OSError as e:
            raise SystemExit(f"cannot make a {limit >> 20} MiB memory cgroup: {e}")

    def _write(self, name, value):
        Path(self.path, name).write_text(str(value))

    def _read(self, name):
        return Path(self.path, name).read_text()

    def prefix(self):
        """argv that runs the rest of the command inside the cgroup."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{self.path}/cgroup.procs"]

    def figures(self):
        """The peak charged, anon and file bytes now (v2's names; v1's rss and
        cache), and the OOM kills: KEY -> value."""
        st = dict(l.split() for l in self._read("memory.stat").splitlines())
        st = {k: int(v) for k, v in st.items()}
        out = {}
        if self.v2:
            out["peak_mib"] = int(self._read("memory.peak")) / (1 << 20)
            out["anon_mib"] = st["anon"] / (1 << 20)
            out["file_mib"] = st["file"] / (1 << 20)
            out["file_mapped_mib"] = st["file_mapped"] / (1 << 20)
        else:
            out["peak_mib"] = int(self._read("memory.max_usage_in_bytes")) / (1 << 20)
            out["anon_mib"] = st["rss"] / (1 << 20)
            out["file_mib"] = st["cache"] / (1 << 20)
            out["file_mapped_mib"] = st["mapped_file"] / (1 << 20)
        events = self._read("memory.events" if self.v2 else "memory.oom_control")
        kills = [l.split()[1] for l in events.splitlines() if l.startswith("oom_kill ")]
        out["oom_kills"] = int(kills[0]) if kills else -1  # -1: not counted by this kernel
        return out

    def remove(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # processes left (a failed stop): the cgroup outlives the run


def cgroup2_mount():
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            return fields[4]
    return None


def paths(root, n):
    return [root / f"d{i // PER_DIR:05d}" / f"f{i:07d}" for i in range(n)]


def file_bytes(i, content, salt=0):
    """File i's 4 KiB: its number repeated (pattern: compresses ~100x, as
    nothing real does) or pseudo-random bytes (random: incompressible, as a
    rank's tensor shard); distinct for each (i, salt)."""
    if content == "random":
        return random.Random(salt << 32 | i).randbytes(FILE_BYTES)
    return (b"%08d%08d" % (salt, i)) * (FILE_BYTES // 16)


def create(files, writers, fsync, content="pattern", salt=0):
    """Writes every file of files (4 KiB each, distinct bytes, see
    file_bytes) from writers threads; with fsync, each is fsync'd before its
    close. Returns seconds."""
    for d in sorted({p.parent for p in files}):
        d.mkdir(parents=True, exist_ok=True)
    if fsync:  # the directories are durable before the timed part, as ckptfs's are
        subprocess.run(["sync"], check=True)
    errors = []

    def work(k):
        try:
            for i in range(k, len(files), writers):
                data = file_bytes(i, content, salt)
                fd = os.open(files[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
                if fsync:
                    os.fsync(fd)
                os.close(fd)
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(writers)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.monotonic() - start
    if errors:
        raise SystemExit(f"create failed: {errors[0]}")
    return took


_shown = set()


def progress(msg, out=None):
    """msg on stderr, after the figures of out not shown yet (a run cut short
    still says what it measured)."""
    for k in sorted(set(out or ()) - _shown):
        _shown.add(k)
        print(f"scale: {k} {out[k]}", file=sys.stderr)
    print(f"scale: {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def timed(fn):
    start = time.monotonic()
    out = fn()
    return time.monotonic() - start, out


def find(root):
    out = subprocess.run(["find", str(root), "-name", ".ckptfs", "-prune", "-o", "-type", "f", "-print"], check=True, capture_output=True, text=True).stdout
    return out.split()


def stat_all(names):
    for p in names:
        os.lstat(p)


def read_all(names):
    for p in names:
        with open(p, "rb") as f:
            if len(f.read()) != FILE_BYTES:
                raise SystemExit(f"{p}: short read")


def walks(root, cold, read=True, after_stat=None, every=1):
    """find, stat of every path, read of every file under root (of every
    every-th in find's order; unless not read: None), each after cold() (a
    restart and a cache drop), calling after_stat() between the stat walk and
    the read; returns seconds for each (the read's per file read) and the
    number of files found."""
    cold()
    t_find, names = timed(lambda: find(root))
    cold()
    find(root)  # the stat walk starts from the list, as `find | xargs stat` would
    t_stat, _ = timed(lambda: stat_all(names))
    if after_stat:
        after_stat()
    t_read = None
    if read:
        cold()
        picked = names[::every]
        t_read, _ = timed(lambda: read_all(picked))
        t_read *= len(names) / len(picked)  # per file as if all were read
    return t_find, t_stat, t_read, len(names)


def safetensors(step):
    vals = [float(step % 97) + i / 64 for i in range(64)]
    data = struct.pack("<64f", *vals)
    h = json.dumps({"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, len(data)]}},
                   separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def run_history(binary, run, steps, out):
    """Saves steps tiny checkpoints in run, one at a time, then times log,
    best, report and du."""
    lat = []
    for s in range(steps):
        d = run / f"step-{s:06d}"
        start = time.monotonic()
        d.mkdir()
        (d / "model.safetensors").write_bytes(safetensors(s))
        (d / "metrics.json").write_text(json.dumps({"loss": 1.0 / (1 + s % 1000)}))
        lat.append(time.monotonic() - start)
    k = min(100, steps)
    out["run.step_first100_ms"] = 1e3 * sum(lat[:k]) / k
    out["run.step_last100_ms"] = 1e3 * sum(lat[-k:]) / k
    for name, args in (("log", ["log", "--json", str(run)]),
                       ("best", ["best", "--metric", "loss", "--mode", "min", str(run)]),
                       ("report", ["report", "-o", os.devnull, str(run)]),
                       ("du", ["du", str(run)])):
        t, r = timed(lambda: subprocess.run([str(binary), *args], capture_output=True, text=True))
        if r.returncode != 0:
            raise SystemExit(f"ckptfs {name}: {r.stderr}")
        out[f"run.{name}_s"] = t
        out[f"run.{name}_us_per_step"] = 1e6 * t / steps


def store_ops(d, n, out, prefix):
    """gc and fsck of the mount (both run in the daemon): seconds and µs per
    file under prefix."""
    for name, args in (("gc", ["gc", "--grace", "0", str(d.mnt)]), ("fsck", ["fsck", str(d.mnt)])):
        t, r = timed(lambda: subprocess.run([str(d.binary), *args], capture_output=True, text=True))
        if r.returncode != 0:
            raise SystemExit(f"ckptfs {name}: {r.stdout}{r.stderr}")
        out[f"{prefix}.{name}_s"] = t
        out[f"{prefix}.{name}_us_per_file"] = 1e6 * t / n


def in_cgroup(d, mib, n, out, every):
    """The daemon restarted in a cgroup of mib MiB without swap, then find,
    stat, read of every file, gc and fsck in it (cold, as the walks): whether
    it completed, its times, the cgroup's figures and the daemon's RssAnon."""
    cg = MemoryCgroup(f"ckptfs-scale-{os.getpid()}", mib << 20)
    d.stop()
    d.prefix = cg.prefix()
    out["cgroup.mib"] = mib
    out["cgroup.completed"] = "no"
    done = threading.Event()
    high = {}

    def sample():  # the most anon and file memory charged at any time (every 0.2 s)
        while not done.wait(0.2):
            try:
                f = cg.figures()
            except OSError:
                continue
            for k in ("anon_mib", "file_mib", "file_mapped_mib"):
                high[k] = max(high.get(k, 0), f[k])

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        drop_caches()
        d.start()
        out["cgroup.mount_cold_s"] = d.start_s

        def mem_after_stat():
            for k, v in d.memory().items():
                out[f"cgroup.daemon_after_stat_{k.lower()}_mib"] = v / (1 << 20)

        f, s, r, cn = walks(d.mnt, drop_caches, after_stat=mem_after_stat, every=every)
        if cn != n:
            raise SystemExit(f"find in the cgroup: {cn} files, {n} expected")
        for k, t in (("find", f), ("stat", s), ("read", r)):
            out[f"cgroup.{k}_s"] = t
            out[f"cgroup.{k}_us_per_file"] = 1e6 * t / cn
        mem = d.memory()
        out["cgroup.daemon_rssanon_mib"] = mem["RssAnon"] / (1 << 20)
        out["cgroup.daemon_rssfile_mib"] = mem["RssFile"] / (1 << 20)
        store_ops(d, cn, out, "cgroup")
        for k, v in cg.figures().items():  # anon and file with the daemon still there
            if k != "peak_mib" and k.endswith("_mib"):
                out[f"cgroup.{k[:-4]}_end_mib"] = v
        d.stop()
        out["cgroup.completed"] = "yes"
    finally:
        done.set()
        sampler.join()
        f = cg.figures()
        out["cgroup.peak_mib"], out["cgroup.oom_kills"] = f["peak_mib"], f["oom_kills"]
        for k, v in high.items():
            out[f"cgroup.{k[:-4]}_max_mib"] = v
        d.kill()
        d.prefix = []
        cg.remove()


def loop_walks(binary, plain, plain_s, out):
    """find and the stat walk through fusefloor's loopback of the plain
    directory, remounted cold before each as the mount is, the stat walk
    with no listing before it in that mount: what a LOOKUP round trip with
    the thinnest FUSE daemon behind it costs here (ckptfs's stat walk past
    its node limit is one LOOKUP a file: the listing's attributes were
    pruned; the loopback prunes nothing), beside the plain directory's
    find + stat (plain_s seconds)."""
    mnt = plain.parent / "floor-loopwalk"
    mount = None

    def cold():
        nonlocal mount
        if mount is not None:
            mount.__exit__(None, None, None)
        drop_caches()
        mount = FloorMount(binary, "loopback", mnt, plain)

    try:
        cold()
        lf, names = timed(lambda: find(mnt))
        cold()
        ls, _ = timed(lambda: stat_all(names))
        ln = len(names)
    finally:
        if mount is not None:
            mount.__exit__(None, None, None)
        mnt.rmdir()
    out["walk.find_fuse_loopback_us_per_file"] = 1e6 * lf / ln
    out["walk.stat_fuse_loopback_us_per_file"] = 1e6 * ls / ln
    out["walk.find_stat_fuse_loopback_ratio"] = (lf + ls) / plain_s


def walk_phase(a, d, plain, files, out):
    """The walks of the plain directory and of the mount (restarted cold
    before each), their ratios and costs per file, and the daemon's memory
    after the stat walk and after the read; returns the files found."""
    def cold_mount():
        d.stop()
        drop_caches()
        d.start()

    def mem_after_stat():  # the daemon's memory with no file read yet (no chunk cached)
        for k, v in d.memory().items():
            out[f"mem.after_stat_{k.lower()}_mib"] = v / (1 << 20)

    pf, ps, pr, pn = walks(plain, drop_caches, read=not a.no_plain_read, every=a.read_every)
    cf, cs, cr, cn = walks(d.mnt, cold_mount, after_stat=mem_after_stat, every=a.read_every)
    if pn != cn or (cn != files and not a.reuse):
        raise SystemExit(f"find: {cn} files in the mount, {pn} in the plain directory, {files} created")
    for k, p, c in (("find", pf, cf), ("stat", ps, cs), ("read", pr, cr)):
        if p is not None:
            out[f"walk.{k}_ratio"] = c / p
            out[f"walk.{k}_plain_us_per_file"] = 1e6 * p / pn
        out[f"walk.{k}_ckptfs_us_per_file"] = 1e6 * c / cn
    out["walk.find_stat_ratio"] = (cf + cs) / (pf + ps)
    out["walk.mount_cold_s"] = d.start_s  # the last restart, after a cache drop
    if a.floor_bin:
        loop_walks(Path(a.floor_bin).resolve(), plain, pf + ps, out)
    mem = d.memory()
    # after the read of every file: the chunk cache (a quarter of the budget) is full
    out["mem.vmrss_mib"] = mem["VmRSS"] / (1 << 20)
    out["mem.rssanon_mib"] = mem["RssAnon"] / (1 << 20)
    out["mem.rssfile_mib"] = mem["RssFile"] / (1 << 20)
    return cn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("-n", type=int, default=100_000, help="files created by 8 writers (1000000 by hand)")
    ap.add_argument("--n1", type=int, default=None, help="files created by 1 writer (default n/10; 0: none)")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--content", choices=("pattern", "random"), default="pattern",
                    help="the files' bytes: a repeated number (compressible) or pseudo-random (incompressible)")
    ap.add_argument("--steps", type=int, default=10_000, help="tiny checkpoints of the run (0: no run)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new one under /tmp)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--floor-bin", default=None,
                    help="test/bench/fusefloor built: also time the creates through FUSE with nothing behind it and "
                         "through a loopback with fsync, and find and the stat walk through a loopback of the plain "
                         "directory (what FUSE itself costs a create and a lookup on this machine)")
    ap.add_argument("--creates-only", action="store_true", help="stop after the creates (while iterating)")
    ap.add_argument("--run-only", action="store_true", help="only the run of --steps checkpoints (while iterating)")
    ap.add_argument("--no-plain-read", action="store_true", help="skip the plain directory's read-all (10⁶: saves time)")
    ap.add_argument("--cgroup-mib", type=int, default=0,
                    help="then restart the daemon in a memory cgroup of this many MiB (no swap) and walk, gc, fsck in it")
    ap.add_argument("--read-every", type=int, default=1,
                    help="read every K-th file only (spread over the tree; at 10⁶ a read-all takes a quarter hour): "
                         "the read's seconds are scaled to all files")
    ap.add_argument("--skip-walks", action="store_true",
                    help="no walks (with --reuse: gc, fsck and the cgroup phase of a kept store again)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (for --reuse)")
    ap.add_argument("--reuse", action="store_true", help="--dir holds a kept run: measure it again, no creates")
    a = ap.parse_args()
    n1 = max(1, a.n // 10) if a.n1 is None else a.n1
    if a.reuse and not a.dir:
        raise SystemExit("--reuse needs --dir")
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="scale-bench-", dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    store, mnt, plain = base / "store", base / "mnt", base / "plain"
    plain.mkdir(exist_ok=a.reuse)
    d = Daemon(Path(a.bin).resolve(), store, mnt)
    out = {"n": a.n, "n1": n1, "writers": a.writers, "content": a.content, "steps": a.steps, "read_every": a.read_every,
           "load_start": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
    # the files the walks find: both passes' (the mount's run directory is not there yet)
    files = a.n + n1
    try:
        d.start()
        if a.run_only:
            progress(f"a run of {a.steps} steps", out)
            run = mnt / "run"
            run.mkdir()
            run_history(d.binary, run, a.steps, out)
            raise StopIteration
        for w, n in ((1, n1), (a.writers, a.n)):
            if a.reuse or n == 0:
                continue
            progress(f"create {n} files with {w} writers", out)
            tp = create(paths(plain / f"w{w}", n), w, True, a.content, w)
            tc = create(paths(mnt / f"w{w}", n), w, False, a.content, w)
            out[f"create_w{w}.plain_files_per_s"] = n / tp
            out[f"create_w{w}.ckptfs_files_per_s"] = n / tc
            out[f"create_w{w}.ratio"] = tc / tp
            if a.floor_bin:
                progress(f"the same {n} creates through fusefloor (noop, loopback)", out)
                floor_creates(Path(a.floor_bin).resolve(), base, w, n, a.content, tp, out)

        if not a.reuse:
            out["store.catalog_bytes_per_file"] = (store / "catalog.db").stat().st_size / files
        if a.creates_only:
            raise StopIteration

        if a.skip_walks:
            cn = len(find(mnt))  # untimed: the files for the costs per file
        else:
            progress("walks", out)
            cn = walk_phase(a, d, plain, files, out)

        progress("gc, fsck", out)
        store_ops(d, cn, out, "store")

        if a.cgroup_mib:
            progress(f"find, stat, read, gc, fsck in a {a.cgroup_mib} MiB cgroup", out)
            in_cgroup(d, a.cgroup_mib, cn, out, a.read_every)
            d.start()

        if a.steps:
            progress(f"a run of {a.steps} steps", out)
            run = mnt / "run"
            run.mkdir()
            run_history(d.binary, run, a.steps, out)
    except StopIteration:
        pass
    finally:
        try:
            d.stop()
        finally:
            d.kill()
            if not a.keep:
                shutil.rmtree(base, ignore_errors=True)
            # what was measured, also when a phase failed (the cgroup's figures)
            out["load_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            text = "".join(f"{k} {v:.3f}\n" if isinstance(v, float) else f"{k} {v}\n" for k, v in sorted(out.items()))
            sys.stdout.write(text)
            if a.out:
                Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
