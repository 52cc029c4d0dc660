"""make bench: ckptfs against the same operations on a plain directory on the
store's filesystem, side by side in one run, each repeated and reported as the
median, as ratios (ckptfs / plain) plus MB/s. Writes a stable text file
(KEY VALUE per line, sorted) so that two runs can be compared with diff.

Run through test/bench/run.sh (it prepares the venv and builds ckptfs)."""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

MiB = 1 << 20


def drop_caches():
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class Daemon:
    def __init__(self, binary, store, mnt, cache_size, readahead_kb, extra=()):
        self.binary, self.store, self.mnt, self.cache_size = binary, store, mnt, cache_size
        self.readahead_kb = readahead_kb
        self.extra = list(extra)
        self.proc = None
        self.peak_rss = 0
        self._sampler = None

    def start(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        args = ["--cache-size", self.cache_size, *self.extra]
        if self.readahead_kb is not None:
            args += ["--readahead-kb", str(self.readahead_kb)]
        self.proc = subprocess.Popen([str(self.binary), "mount", *args, str(self.store), str(self.mnt)],
                                     stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"ckptfs mount failed: {line!r}")
        self._stop = False
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self):
        status = Path(f"/proc/{self.proc.pid}/status")
        while not self._stop:
            try:
                for l in status.read_text().splitlines():
                    if l.startswith("VmRSS:"):
                        self.peak_rss = max(self.peak_rss, int(l.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.02)

    def stop(self, check=True):
        self._stop = True
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=120) != 0 and check:
            raise SystemExit("ckptfs mount exited non-zero")

    def restart(self):
        self.stop()
        self.start()

    def stats(self):
        import json
        return json.loads((self.mnt / ".ckptfs" / "stats.json").read_text())

    def settle(self, timeout=900):
        """Waits for the daemon's background re-encodes of what was just saved,
        so that they neither steal CPU from the plain directory's timed run
        nor leave chunks raw (cheaper to read) for the read measurements."""
        start = time.monotonic()
        while self.stats()["reencode_pending"] > 0:
            if time.monotonic() > start + timeout:
                raise SystemExit("ckptfs: re-encode queue did not drain")
            time.sleep(0.1)
        return time.monotonic() - start


def model(seed, n_tensors, tensor_bytes):
    rng = np.random.default_rng(seed)
    # bf16 has no numpy dtype: random 16-bit patterns of N(0, 0.02) values.
    out = {}
    for i in range(n_tensors):
        f = rng.standard_normal(tensor_bytes // 2, dtype=np.float32) * 0.02
        out[f"layers.{i:03d}.weight"] = (f.view(np.uint32) >> 16).astype(np.uint16)
    return out


def model_steps(seed, n_tensors, tensor_bytes, rel=0.01):
    """Two consecutive checkpoints of a bf16 model: every weight of the second
    moved by about rel of the typical magnitude (an Adam-like step), the
    relative change of the issue's workload between saves 10 steps apart."""
    rng = np.random.default_rng(seed)
    a, b = {}, {}
    for i in range(n_tensors):
        f = rng.standard_normal(tensor_bytes // 2, dtype=np.float32) * 0.02
        a[f"layers.{i:03d}.weight"] = (f.view(np.uint32) >> 16).astype(np.uint16)
        f += rng.standard_normal(tensor_bytes // 2, dtype=np.float32) * (0.02 * rel)
        b[f"layers.{i:03d}.weight"] = (f.view(np.uint32) >> 16).astype(np.uint16)
    return a, b


def save(sd, path, fsync):
    """save_file as the frameworks do; with fsync, also make it durable (ckptfs's
    close is durable, so the fair baseline is write + fsync)."""
    save_bf16(sd, path)
    if fsync:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        dfd = os.open(path.parent, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)


def save_bf16(sd, path):
    # safetensors.numpy has no bf16: write uint16 arrays, then patch the dtype in
    # the header (same length: "U16" -> "BF16" would change it, so pad instead).
    import json
    import struct
    header = {}
    off = 0
    for k in sorted(sd):
        n = sd[k].nbytes
        header[k] = {"dtype": "BF16", "shape": [sd[k].size], "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:  # temp + rename, like safetensors' writer
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k in sorted(sd):
            f.write(memoryview(sd[k]).cast("B"))
    os.rename(tmp, path)


def read_all(path):
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(4 * MiB)
        while f.readinto(buf):
            pass


LOAD_ALL = """
import sys, time
from safetensors import safe_open
t = time.monotonic()
with safe_open(sys.argv[1], framework="pt") as f:
    s = 0
    for k in f.keys():
        s += int(f.get_tensor(k).view(-1)[-1].item())
print(time.monotonic() - t)
"""

# torch.load(mmap=True) of eight scattered tensors (issue #13): prints the
# bytes of the tensors it read.
LOAD_TORCH_EIGHT = """
import sys, torch
sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
keys = sorted(sd)
n = 0
for k in keys[len(keys) // 16::len(keys) // 8][:8]:
    n += len(sd[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
print(n)
"""

LOAD_ONE = """
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="pt") as f:
    t = f.get_tensor(sys.argv[2])
    print(t.numel() * t.element_size())
"""


def machine(path):
    """The cores and the disk the run measures on: what its ratios depend on."""
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "?")
    src = subprocess.run(["findmnt", "-no", "SOURCE", "-T", str(path)], capture_output=True, text=True).stdout.strip()
    disk = src or "?"
    blk = Path("/sys/class/block") / Path(src).name
    if src and blk.exists():
        top = blk.resolve().parent if (blk / "partition").exists() else blk.resolve()
        model = top / "device" / "model"
        rot = top / "queue" / "rotational"
        disk = (f"{src} ({model.read_text().strip() if model.exists() else top.name}, "
                f"{'rotational' if rot.exists() and rot.read_text().strip() == '1' else 'non-rotational'})")
    return os.cpu_count(), cpu, disk


def timed(fn):
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-bench")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache-size", default="256MiB")
    ap.add_argument("--out", default="bench-results.txt")
    ap.add_argument("--readahead-kb", type=int, default=None, help="passed to ckptfs mount (default: its own)")
    ap.add_argument("--steps", default="all",
                    help="comma-separated steps to run, e.g. 3,3b,9 (default: all); "
                         "step 1's write runs whenever one of 1-6b does")
    a = ap.parse_args()
    steps = None if a.steps == "all" else set(a.steps.split(","))

    def want(*names):
        return steps is None or any(x in steps for x in names)

    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    plain, store, mnt = root / "plain", root / "store", root / "mnt"
    plain.mkdir(parents=True)
    cores, cpu, disk = machine(root)
    print(f"machine: {cores} cores ({cpu}); disk {disk}", flush=True)
    tensor_bytes = 4 * MiB
    n = a.size_mib * MiB // tensor_bytes
    size = n * tensor_bytes
    cache_bytes = int(a.cache_size.lower().rstrip("mib")) * MiB if a.cache_size.lower().endswith("mib") else None

    d = Daemon(Path(a.bin), store, mnt, a.cache_size, a.readahead_kb)
    # The same daemon without deltas: the baseline of step 9.
    nd = Daemon(Path(a.bin), root / "store-nodelta", root / "mnt-nodelta", a.cache_size, a.readahead_kb,
                extra=["--delta-keyframe", "1"])
    d.start()
    (mnt / "runs").mkdir(exist_ok=True)
    res = {}  # name -> list of (ckptfs_s, plain_s)
    settled = []  # seconds until the re-encode queue drained after each fresh write

    def record(name, ck, pl):
        res.setdefault(name, []).append((ck, pl))
        print(f"  {name}: ckptfs {ck:.3f} s, plain {pl:.3f} s", flush=True)

    try:
        for r in range(a.repeat):
            print(f"round {r + 1}/{a.repeat}", flush=True)
            if want("1", "2", "3", "4", "5", "6", "6b"):
                base = model(1000 * r + 1, n, tensor_bytes)
                # 1. fresh model: write (close included) vs plain write + fsync, and without fsync.
                drop_caches()
                ck = timed(lambda: save(base, mnt / "runs" / f"r{r}-a.safetensors", fsync=False))
                settled.append(d.settle())  # for information: background work after the close
                pl = timed(lambda: save(base, plain / f"r{r}-a.safetensors", fsync=True))
                record("1_write_fresh", ck, pl)
                pl_nosync = timed(lambda: save(base, plain / f"r{r}-a2.safetensors", fsync=False))
                subprocess.run(["sync"], check=True)  # its writeback must not overlap the next timed step
                res.setdefault("1_write_fresh_vs_nofsync", []).append((ck, pl_nosync))
                if want("2"):
                    # 2. re-save with 90% of the bytes unchanged.
                    resave = dict(base)
                    changed = model(1000 * r + 2, n // 10, tensor_bytes)
                    for i, k in enumerate(sorted(base)[: n // 10]):
                        resave[k] = changed[f"layers.{i:03d}.weight"]
                    ck = timed(lambda: save(resave, mnt / "runs" / f"r{r}-b.safetensors", fsync=False))
                    d.settle()
                    pl = timed(lambda: save(resave, plain / f"r{r}-b.safetensors", fsync=True))
                    record("2_resave_90pct_same", ck, pl)
                f_ck, f_pl = mnt / "runs" / f"r{r}-a.safetensors", plain / f"r{r}-a.safetensors"
                if want("3"):
                    # 3. cold sequential read (page cache dropped; daemon restarted: cold chunk cache).
                    d.restart()
                    drop_caches()
                    ck = timed(lambda: read_all(f_ck))
                    drop_caches()
                    pl = timed(lambda: read_all(f_pl))
                    record("3_cold_read", ck, pl)
                if want("5"):
                    # 5. warm re-read. Both files get the same number of earlier reads
                    # (two), since the kernel treats a page's second touch differently
                    # from later ones (it moves it to the active list): the drop before
                    # the plain cold read dropped ckptfs's pages, so ckptfs's file is
                    # read twice here and the plain one once.
                    read_all(f_pl)
                    read_all(f_ck)
                    read_all(f_ck)
                    ck = timed(lambda: read_all(f_ck))
                    pl = timed(lambda: read_all(f_pl))
                    record("5_warm_read", ck, pl)
                if want("4"):
                    # 4. cold load of all tensors with safe_open (mmap), in a fresh process.
                    d.restart()
                    drop_caches()
                    ck = float(subprocess.run([sys.executable, "-c", LOAD_ALL, str(f_ck)], check=True, capture_output=True, text=True).stdout)
                    drop_caches()
                    pl = float(subprocess.run([sys.executable, "-c", LOAD_ALL, str(f_pl)], check=True, capture_output=True, text=True).stdout)
                    record("4_cold_safe_open_all", ck, pl)
                if want("6"):
                    # 6. lazy read of one tensor: bytes fetched from the store / tensor bytes.
                    d.restart()
                    drop_caches()
                    s0 = d.stats()["store_read_bytes"]
                    key = sorted(base)[n // 2]
                    nbytes = int(subprocess.run([sys.executable, "-c", LOAD_ONE, str(f_ck), key], check=True, capture_output=True, text=True).stdout)
                    fetched = d.stats()["store_read_bytes"] - s0
                    res.setdefault("6_lazy_one_tensor", []).append((fetched, nbytes))
                    print(f"  6_lazy_one_tensor: fetched {fetched} for {nbytes} tensor bytes", flush=True)
                if want("6b"):
                    # 6b. the same model as torch.save; torch.load(mmap=True) reads 8
                    # scattered tensors: bytes fetched / bytes read, against the
                    # budget (1.5 x read + 8 MiB) / read = 1.75 for 32 MiB.
                    import torch
                    f_pt = mnt / "runs" / f"r{r}-a.pt"
                    torch.save({k: torch.from_numpy(v.view(np.int16)) for k, v in base.items()}, f_pt)
                    d.restart()
                    drop_caches()
                    s0 = d.stats()["store_read_bytes"]
                    nbytes = int(subprocess.run([sys.executable, "-c", LOAD_TORCH_EIGHT, str(f_pt)], check=True, capture_output=True, text=True).stdout)
                    fetched = d.stats()["store_read_bytes"] - s0
                    res.setdefault("6b_lazy_torch_8_tensors", []).append((fetched, nbytes))
                    print(f"  6b_lazy_torch_8_tensors: fetched {fetched} for {nbytes} tensor bytes", flush=True)
                for p in (plain / f"r{r}-a.safetensors", plain / f"r{r}-a2.safetensors", plain / f"r{r}-b.safetensors"):
                    p.unlink(missing_ok=True)
            # 3b. cold sequential read of incompressible bytes that no format
            # parser knows (random .bin): content-defined chunks of ~32 KiB,
            # the worst case for the read path and for the store's layout.
            if want("3b"):
                rnd = np.random.default_rng(1000 * r + 4).bytes(size)
                f_ck, f_pl = mnt / "runs" / f"r{r}.bin", plain / f"r{r}.bin"
                for p in (f_ck, f_pl):
                    with open(p, "wb") as f:
                        f.write(rnd)
                        os.fsync(f.fileno())
                del rnd
                d.settle()
                d.restart()
                drop_caches()
                ck = timed(lambda: read_all(f_ck))
                drop_caches()
                pl = timed(lambda: read_all(f_pl))
                record("3b_cold_read_incompressible", ck, pl)
                f_pl.unlink()
                f_ck.unlink()
            # 9. cold sequential read of a delta-coded file (issue #15): two
            # consecutive checkpoints in step directories; the second is
            # stored as deltas against the first. The same two files in a
            # store without deltas (--delta-keyframe 1) are the baseline.
            if not want("9"):
                continue
            s1, s2 = model_steps(1000 * r + 3, n, tensor_bytes)
            nd.start()
            try:
                for mount in (d, nd):
                    run = mount.mnt / "runs" / f"delta{r}"
                    for step, sd in (("0001", s1), ("0002", s2)):
                        (run / step).mkdir(parents=True, exist_ok=True)
                        save(sd, run / step / "model.safetensors", fsync=False)
                    mount.settle()
                deltas = d.stats()["delta_chunks"]
                assert deltas > 0 and nd.stats()["delta_chunks"] == 0, (deltas, nd.stats())
                f_d = d.mnt / "runs" / f"delta{r}" / "0002" / "model.safetensors"
                f_n = nd.mnt / "runs" / f"delta{r}" / "0002" / "model.safetensors"
                d.restart()
                nd.restart()
                drop_caches()
                ck = timed(lambda: read_all(f_d))
                drop_caches()
                pl = timed(lambda: read_all(f_n))
                record("9_delta_cold_read", ck, pl)
                du = {}
                for name, mount in (("delta", d), ("standalone", nd)):
                    out = subprocess.run([str(a.bin), "du", "--json", str(mount.mnt / "runs" / f"delta{r}" / "0002")],
                                         check=True, capture_output=True, text=True).stdout
                    t = json.loads(out)["total"]
                    du[name] = t["frees_stored_bytes"] / t["logical_bytes"]
                res.setdefault("9_delta_stored_per_logical", []).append((du["delta"], du["standalone"]))
                print(f"  9_delta_stored_per_logical: delta {du['delta']:.3f}, standalone {du['standalone']:.3f}", flush=True)
            finally:
                nd.stop(check=False)
    except BaseException:
        d.stop(check=False)  # leave no mount behind
        raise
    d.stop()

    lines = {}
    def med(name, i):
        return statistics.median(x[i] for x in res[name])
    for name in res:
        ck, pl = med(name, 0), med(name, 1)
        if name == "9_delta_stored_per_logical":
            lines[f"{name}.delta"] = f"{ck:.3f}"
            lines[f"{name}.standalone"] = f"{pl:.3f}"
            continue
        if name in ("6_lazy_one_tensor", "6b_lazy_torch_8_tensors"):
            lines[f"{name}.fetched_bytes"] = f"{ck:.0f}"
            lines[f"{name}.tensor_bytes"] = f"{pl:.0f}"
            lines[f"{name}.ratio"] = f"{ck / pl:.3f}"
            continue
        lines[f"{name}.ckptfs_s"] = f"{ck:.3f}"
        lines[f"{name}.plain_s"] = f"{pl:.3f}"
        lines[f"{name}.ratio"] = f"{ck / pl:.3f}"
        lines[f"{name}.ckptfs_MBps"] = f"{size / ck / 1e6:.0f}"
        lines[f"{name}.plain_MBps"] = f"{size / pl / 1e6:.0f}"
    if settled:
        lines["1_write_fresh.reencode_drained_after_s"] = f"{statistics.median(settled):.3f}"
    lines["7_peak_rss.bytes"] = str(d.peak_rss)
    lines["7_peak_rss.limit_bytes"] = str((cache_bytes or 0) + 128 * MiB)
    lines["7_peak_rss.ratio"] = f"{d.peak_rss / ((cache_bytes or 0) + 128 * MiB):.3f}"
    lines["config.size_bytes"] = str(size)
    lines["config.repeat"] = str(a.repeat)
    lines["config.cache_size"] = a.cache_size
    lines["config.readahead_kb"] = str(a.readahead_kb if a.readahead_kb is not None else "default")
    lines["config.steps"] = a.steps
    lines["machine.cores"] = str(cores)
    lines["machine.cpu"] = cpu.replace(" ", "_")
    lines["machine.disk"] = disk.replace(" ", "_")
    Path(a.out).write_text("".join(f"{k} {v}\n" for k, v in sorted(lines.items())))
    targets = {"1_write_fresh": 1.0, "2_resave_90pct_same": 0.35, "3_cold_read": 1.8,
               "3b_cold_read_incompressible": 1.4, "4_cold_safe_open_all": 2.0, "5_warm_read": 1.2, "6_lazy_one_tensor": 1.5,
               "6b_lazy_torch_8_tensors": 1.75, "7_peak_rss": 1.0, "9_delta_cold_read": 1.3}
    print(f"\n{'measurement':28} {'ratio':>7} {'target':>7}  ckptfs MB/s  plain MB/s")
    for name, target in targets.items():
        if f"{name}.ratio" not in lines:
            continue
        ratio = float(lines[f"{name}.ratio"])
        mb = f"{lines.get(f'{name}.ckptfs_MBps', ''):>11}  {lines.get(f'{name}.plain_MBps', ''):>10}"
        print(f"{name:28} {ratio:7.3f} {target:7.2f}  {mb}  {'ok' if ratio <= target else 'OVER'}")
    if "1_write_fresh_vs_nofsync.ratio" in lines:
        print(f"(1 without fsync for the plain directory: ratio {lines['1_write_fresh_vs_nofsync.ratio']})")
    if "9_delta_stored_per_logical.delta" in lines:
        print(f"(9 compares ckptfs with deltas against ckptfs without; the file stored at "
              f"{lines['9_delta_stored_per_logical.delta']} of its size as deltas, "
              f"{lines['9_delta_stored_per_logical.standalone']} standalone)")
    print(f"machine: {cores} cores ({cpu}); disk {disk}")
    print(f"results in {a.out}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
