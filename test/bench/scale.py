"""make bench-scale (issue 27): many small files and a long run, ckptfs against
a plain directory on the same disk, side by side in one run.

  creates   N files of 4 KiB from 8 writers (and N1 from 1 writer), in the mount
            (close = durable) and in a plain directory (each file fsync'd: the
            same durability); files/s and the ratio of times ckptfs ÷ plain
  walks     after a daemon restart and a drop of the page cache: find, stat of
            every path, read of every file; ratio to plain and µs per file
  store     gc and fsck of the mount: µs per file
  memory    the daemon's VmRSS and RssAnon after the walks
  run       S tiny checkpoints (a safetensors file and metrics.json per step),
            one step at a time: commit latency of the first and last 100 steps,
            then `ckptfs log`, `best`, `report` and `du` on the run: s and µs
            per step (--run-only: this phase alone, while iterating)

Needs root (mount, drop_caches). Output: KEY VALUE lines (sorted) on stdout
and in --out. Scratch under --dir (default /tmp/scale-bench-XXXX), removed."""

import argparse
import json
import os
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

    def start(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([str(self.binary), "mount", str(self.store), str(self.mnt)],
                                     stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"ckptfs mount failed: {line!r}")

    def stop(self):
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=600)
        self.proc = None
        if rc != 0:
            raise SystemExit("ckptfs mount exited non-zero")

    def memory(self):
        out = {}
        for l in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            k, _, v = l.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
        return out


def paths(root, n):
    return [root / f"d{i // PER_DIR:05d}" / f"f{i:07d}" for i in range(n)]


def create(files, writers, fsync):
    """Writes every file of files (4 KiB each, distinct bytes) from writers
    threads; with fsync, each is fsync'd before its close. Returns seconds."""
    for d in sorted({p.parent for p in files}):
        d.mkdir(parents=True, exist_ok=True)
    if fsync:  # the directories are durable before the timed part, as ckptfs's are
        subprocess.run(["sync"], check=True)
    errors = []

    def work(k):
        try:
            for i in range(k, len(files), writers):
                data = (b"%016d" % i) * (FILE_BYTES // 16)
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


def walks(root, cold):
    """find, stat of every path, read of every file under root, each after
    cold() (a restart and a cache drop); returns seconds for each and the
    number of files found."""
    cold()
    t_find, names = timed(lambda: find(root))
    cold()
    find(root)  # the stat walk starts from the list, as `find | xargs stat` would
    t_stat, _ = timed(lambda: stat_all(names))
    cold()
    t_read, _ = timed(lambda: read_all(names))
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("-n", type=int, default=100_000, help="files created by 8 writers (1000000 by hand)")
    ap.add_argument("--n1", type=int, default=0, help="files created by 1 writer (default n/10)")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10_000, help="tiny checkpoints of the run")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new one under /tmp)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--creates-only", action="store_true", help="stop after the creates (while iterating)")
    ap.add_argument("--run-only", action="store_true", help="only the run of --steps checkpoints (while iterating)")
    a = ap.parse_args()
    n1 = a.n1 or max(1, a.n // 10)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="scale-bench-", dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    store, mnt, plain = base / "store", base / "mnt", base / "plain"
    plain.mkdir()
    d = Daemon(Path(a.bin).resolve(), store, mnt)
    out = {"n": a.n, "n1": n1, "writers": a.writers, "steps": a.steps}
    try:
        d.start()
        if a.run_only:
            progress(f"a run of {a.steps} steps", out)
            run = mnt / "run"
            run.mkdir()
            run_history(d.binary, run, a.steps, out)
            raise StopIteration
        for w, n in ((1, n1), (a.writers, a.n)):
            progress(f"create {n} files with {w} writers", out)
            tp = create(paths(plain / f"w{w}", n), w, True)
            tc = create(paths(mnt / f"w{w}", n), w, False)
            out[f"create_w{w}.plain_files_per_s"] = n / tp
            out[f"create_w{w}.ckptfs_files_per_s"] = n / tc
            out[f"create_w{w}.ratio"] = tc / tp

        if a.creates_only:
            raise StopIteration

        def cold_mount():
            d.stop()
            drop_caches()
            d.start()

        progress("walks", out)
        pf, ps, pr, pn = walks(plain, drop_caches)
        cf, cs, cr, cn = walks(mnt, cold_mount)
        if pn != cn:
            raise SystemExit(f"find: {cn} files in the mount, {pn} in the plain directory")
        for k, p, c in (("find", pf, cf), ("stat", ps, cs), ("read", pr, cr)):
            out[f"walk.{k}_ratio"] = c / p
            out[f"walk.{k}_ckptfs_us_per_file"] = 1e6 * c / cn
            out[f"walk.{k}_plain_us_per_file"] = 1e6 * p / pn
        out["walk.find_stat_ratio"] = (cf + cs) / (pf + ps)
        mem = d.memory()
        out["mem.vmrss_mib"] = mem["VmRSS"] / (1 << 20)
        out["mem.rssanon_mib"] = mem["RssAnon"] / (1 << 20)
        out["mem.rssfile_mib"] = mem["RssFile"] / (1 << 20)

        progress("gc, fsck", out)
        for name, args in (("gc", ["gc", "--grace", "0", str(mnt)]), ("fsck", ["fsck", str(mnt)])):
            t, r = timed(lambda: subprocess.run([str(d.binary), *args], capture_output=True, text=True))
            if r.returncode != 0:
                raise SystemExit(f"ckptfs {name}: {r.stdout}{r.stderr}")
            out[f"store.{name}_s"] = t
            out[f"store.{name}_us_per_file"] = 1e6 * t / cn

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
            shutil.rmtree(base, ignore_errors=True)
    text = "".join(f"{k} {v:.3f}\n" if isinstance(v, float) else f"{k} {v}\n" for k, v in sorted(out.items()))
    sys.stdout.write(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
