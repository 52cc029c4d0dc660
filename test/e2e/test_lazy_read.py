"""Lazy partial reads and bounded daemon memory on 1 GiB checkpoints (256
float32 tensors of 4 MiB) in every format ckptfs parses, measured through
stats.json and /proc.

- Eight scattered tensors (32 MiB), read cold through each format's lazy
  reader (torch.load(mmap=True) with and without weights_only, safe_open,
  get_slice, a llama.cpp-style GGUF mmap reader, np.load(mmap_mode="r")),
  load at most 1.5 x the bytes used + 8 MiB from the store (issue #13).
- A daemon with default flags inside a 128 MiB memory cgroup completes the
  torch and safetensors lazy reads (issue #13: it was OOM-killed).

- One tensor, read after a remount (cold chunk cache) and a dropped page cache,
  loads only that tensor plus the kernel's readahead and chunk rounding from the
  store. Through a plain mmap: store_read_bytes grows by <= 4 MiB + 2*readahead
  + 2*chunk_size, plus the header's readahead window. Through safe_open the
  kernel reads more (see the test).
- Reading the whole file through mmap keeps the daemon's RSS within its
  --cache-size plus 128 MiB."""

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import torch

import gguf_mmap
from conftest import Daemon
from helpers import MiB, drop_caches, run_py

E2E_DIR = os.path.dirname(os.path.abspath(__file__))

N_TENSORS = 256
ELEMS = 1 << 20  # float32: 4 MiB per tensor, 1 GiB in all
TENSOR_BYTES = ELEMS * 4
CACHE_SIZE = 256 * MiB
RSS_SLACK = 128 * MiB
PICK = "t0137"


def tensor_array(i: int) -> np.ndarray:
    return np.random.default_rng(i).random(ELEMS, dtype=np.float32)


def tensor_data(i: int) -> bytes:
    return tensor_array(i).tobytes()


class RssSampler:
    """Samples a process's RSS every 50 ms on a thread until stopped."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = self.first = self.proc.memory_info().rss
        self.samples = 1
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            rss = self.proc.memory_info().rss
            self.peak = max(self.peak, rss)
            self.samples += 1

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


@pytest.fixture(scope="module")
def big(daemon_factory, record):
    """A daemon with --cache-size 256MiB and a 1 GiB safetensors file on it."""
    d = daemon_factory("lazy", f"--cache-size={CACHE_SIZE // MiB}MiB")
    path = d.mnt / "runs" / "big" / "model.safetensors"
    path.parent.mkdir(parents=True)
    header = {"__metadata__": {"format": "pt"}}
    for i in range(N_TENSORS):
        header[f"t{i:04d}"] = {"dtype": "F32", "shape": [1024, 1024],
                               "data_offsets": [i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES]}
    hdr = json.dumps(header, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    digests = {}
    t0 = time.monotonic()
    with RssSampler(d.pid) as rss, open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
        for i in range(N_TENSORS):
            data = tensor_data(i)
            digests[f"t{i:04d}"] = hashlib.sha256(data).hexdigest()
            f.write(data)
    secs = time.monotonic() - t0
    assert path.stat().st_size == 8 + len(hdr) + N_TENSORS * TENSOR_BYTES
    record("lazy: write of the 1 GiB safetensors file (s, MiB/s)", f"{secs:.1f}, {1024 / secs:.0f}")
    record("lazy: daemon peak RSS while writing 1 GiB (MiB)", f"{rss.peak / MiB:.0f}")
    yield d, path, digests
    d.stop()
    shutil.rmtree(d.store.parent)


def readahead_bytes(mnt) -> int:
    st = os.stat(mnt)
    with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb") as f:
        return int(f.read()) * 1024


def cold(d) -> None:
    """Remount (empty chunk cache) and drop the page cache."""
    d.restart()
    drop_caches()


READ_ONE = {
    # A plain reader: mmap the file, touch one tensor's bytes.
    "mmap": (
        "import hashlib, mmap, sys\n"
        "f = open(sys.argv[1], 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "b, e = int(sys.argv[2]), int(sys.argv[3])\n"
        "print(hashlib.sha256(memoryview(m)[b:e]).hexdigest())\n"),
    # safetensors: parses the header from its own mmap of the whole file, then
    # torch.UntypedStorage.from_file maps it again and get_tensor slices that.
    "safe_open": (
        "import hashlib, sys\n"
        "from safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    assert len(f.keys()) == 256\n"
        "    print(hashlib.sha256(f.get_tensor(sys.argv[4]).numpy().tobytes()).hexdigest())\n"),
}


@pytest.mark.parametrize("how", sorted(READ_ONE))
def test_one_tensor_reads_little(big, record, how):
    d, path, digests = big
    with open(path, "rb") as f:  # before cold(): this read must not count
        n = struct.unpack("<Q", f.read(8))[0]
    begin = 8 + n + int(PICK[1:]) * TENSOR_BYTES
    cold(d)
    ra = readahead_bytes(d.mnt)
    before = d.stats()
    out = run_py(READ_ONE[how], str(path), str(begin), str(begin + TENSOR_BYTES), PICK)
    after = d.stats()
    assert out.strip() == digests[PICK], "wrong bytes for the tensor"
    read = after["store_read_bytes"] - before["store_read_bytes"]
    chunk = after["chunk_size"]
    # Both readers parse the header through a mapping: that first fault reads
    # one readahead window at offset 0, which also touches the first chunk of
    # the first tensor (ra + chunk).
    header = ra + chunk
    if how == "mmap":
        # The tensor, the kernel's read-around and one async readahead window,
        # and a partial chunk at either end.
        budget = header + TENSOR_BYTES + 2 * ra + 2 * chunk
    else:
        # Measured kernel behaviour with safe_open (torch 2.15, Linux 6.18):
        # torch's from_file calls posix_fadvise(POSIX_FADV_SEQUENTIAL) on its
        # mapping, which doubles that file's readahead window (2 * ra): the
        # tensor costs itself plus two such windows, each of which may start
        # and end inside a chunk.
        budget = header + TENSOR_BYTES + 2 * (2 * ra) + 2 * chunk
    record(f"lazy ({how}): one 4 MiB tensor of 1 GiB, cold: store_read_bytes / budget (MiB), readahead (KiB)",
           f"{read / MiB:.2f} / {budget / MiB:.2f}, {ra // 1024}")
    assert read >= TENSOR_BYTES, f"store_read_bytes grew by {read}: less than the tensor itself (stats broken?)"
    assert read <= budget, \
        f"reading one 4 MiB tensor ({how}) loaded {read / MiB:.1f} MiB from the store (budget {budget / MiB:.1f})"


READ_ALL = {
    "safe_open": (
        "import hashlib, sys\n"
        "from safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    for k in f.keys():\n"
        "        print(k, hashlib.sha256(f.get_tensor(k).numpy().tobytes()).hexdigest())\n"),
    "mmap": (
        "import hashlib, json, mmap, struct, sys\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "n = struct.unpack('<Q', m[:8])[0]\n"
        "hdr = json.loads(m[8:8 + n])\n"
        "for k, v in hdr.items():\n"
        "    if k != '__metadata__':\n"
        "        b, e = v['data_offsets']\n"
        "        print(k, hashlib.sha256(memoryview(m)[8 + n + b:8 + n + e]).hexdigest())\n"),
}


@pytest.mark.parametrize("how", sorted(READ_ALL))
def test_whole_file_rss_bounded(big, record, how):
    d, path, digests = big
    cold(d)
    before = d.stats()
    t0 = time.monotonic()
    with RssSampler(d.pid) as rss:
        p = subprocess.run([sys.executable, "-c", READ_ALL[how], str(path)], cwd="/",
                           capture_output=True, text=True, timeout=600)
    secs = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    got = dict(line.split() for line in p.stdout.splitlines())
    assert got == digests, "wrong bytes in the 1 GiB read"
    loaded = d.stats()["store_read_bytes"] - before["store_read_bytes"]
    record(f"rss ({how}): read 1 GiB cold in {secs:.1f} s; daemon RSS start/peak (MiB), samples; store_read (MiB)",
           f"{rss.first / MiB:.0f}/{rss.peak / MiB:.0f}, {rss.samples}; {loaded / MiB:.0f}")
    assert rss.peak <= CACHE_SIZE + RSS_SLACK, \
        f"daemon RSS peaked at {rss.peak / MiB:.0f} MiB with --cache-size {CACHE_SIZE // MiB}MiB"


# ------------------------------------------------ eight tensors, every format

# Scattered, so that every tensor pays the kernel's read-around on both sides.
PICKS = [f"t{i:04d}" for i in (3, 40, 77, 110, 137, 180, 211, 250)]


@pytest.fixture(scope="module")
def all_formats(big, record):
    """The tensors of `big` saved again as torch.save, GGUF and one 2-D .npy
    array (row i = tensor i), on the same mount: {format: path}."""
    d, st_path, _ = big
    arrays = [tensor_array(i) for i in range(N_TENSORS)]
    paths = {"safetensors": st_path}
    t0 = time.monotonic()
    paths["torch"] = st_path.with_name("model.pt")
    torch.save({f"t{i:04d}": torch.from_numpy(a).view(1024, 1024) for i, a in enumerate(arrays)}, paths["torch"])
    paths["gguf"] = st_path.with_name("model.gguf")
    gguf_mmap.write(paths["gguf"], [(f"t{i:04d}", a.reshape(1024, 1024)) for i, a in enumerate(arrays)])
    paths["npy"] = st_path.with_name("model.npy")
    with open(paths["npy"], "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (N_TENSORS, ELEMS)})
        for a in arrays:
            f.write(a.tobytes())
    record("lazy: torch.save + GGUF + npy writes of 1 GiB each (s)", f"{time.monotonic() - t0:.1f}")
    del arrays
    return paths


# Each reader prints "name sha256" for the tensors named in argv[2:].
READ_PICKS = {
    "torch.load(mmap=True)": ("torch", (
        "import hashlib, sys, torch\n"
        "sd = torch.load(sys.argv[1], mmap=True, weights_only=False)\n"
        "for k in sys.argv[2:]:\n"
        "    print(k, hashlib.sha256(sd[k].numpy().tobytes()).hexdigest())\n")),
    "torch.load(mmap=True, weights_only=True)": ("torch", (
        "import hashlib, sys, torch\n"
        "sd = torch.load(sys.argv[1], mmap=True, weights_only=True)\n"
        "for k in sys.argv[2:]:\n"
        "    print(k, hashlib.sha256(sd[k].numpy().tobytes()).hexdigest())\n")),
    "safe_open": ("safetensors", (
        "import hashlib, sys\n"
        "from safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    for k in sys.argv[2:]:\n"
        "        print(k, hashlib.sha256(f.get_tensor(k).numpy().tobytes()).hexdigest())\n")),
    # Row by row through get_slice, as sharded loaders do.
    "get_slice": ("safetensors", (
        "import hashlib, sys\n"
        "from safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    for k in sys.argv[2:]:\n"
        "        s, h = f.get_slice(k), hashlib.sha256()\n"
        "        for r in range(0, s.get_shape()[0], 256):\n"
        "            h.update(s[r:r + 256].contiguous().numpy().tobytes())\n"
        "        print(k, h.hexdigest())\n")),
    "gguf mmap": ("gguf", (
        f"import hashlib, sys; sys.path.insert(0, {E2E_DIR!r})\n"
        "import gguf_mmap\n"
        "ts = gguf_mmap.open_mmap(sys.argv[1])\n"
        "for k in sys.argv[2:]:\n"
        "    print(k, hashlib.sha256(ts[k].tobytes()).hexdigest())\n")),
    "np.load(mmap_mode='r')": ("npy", (
        "import hashlib, sys\n"
        "import numpy as np\n"
        "a = np.load(sys.argv[1], mmap_mode='r')\n"
        "for k in sys.argv[2:]:\n"
        "    print(k, hashlib.sha256(a[int(k[1:])].tobytes()).hexdigest())\n")),
}


def read_picks_cold(d, path, how) -> tuple[int, int]:
    """Cold read of PICKS through READ_PICKS[how]: checks every byte, returns
    (bytes used, bytes loaded from the store)."""
    _, code = READ_PICKS[how]
    cold(d)
    before = d.stats()
    out = run_py(code, str(path), *PICKS)
    loaded = d.stats()["store_read_bytes"] - before["store_read_bytes"]
    got = dict(line.split() for line in out.splitlines())
    want = {k: hashlib.sha256(tensor_data(int(k[1:]))).hexdigest() for k in PICKS}
    used = len(PICKS) * TENSOR_BYTES
    assert got == want, f"{how}: wrong bytes for the picked tensors"
    return used, loaded


def lazy_budget(used: int) -> int:
    return used * 3 // 2 + 8 * MiB


@pytest.mark.parametrize("how", list(READ_PICKS))
def test_eight_tensors_read_little(big, all_formats, record, how):
    d, _, _ = big
    used, loaded = read_picks_cold(d, all_formats[READ_PICKS[how][0]], how)
    record(f"lazy ({how}): 8 scattered of 256 x 4 MiB, cold: used / store_read_bytes / budget (MiB)",
           f"{used / MiB:.0f} / {loaded / MiB:.2f} / {lazy_budget(used) / MiB:.0f}")
    assert loaded >= used, f"store_read_bytes grew by {loaded}: less than the bytes read (stats broken?)"
    assert loaded <= lazy_budget(used), \
        f"{how}: reading {used / MiB:.0f} MiB loaded {loaded / MiB:.1f} MiB (budget {lazy_budget(used) / MiB:.0f})"


# ------------------------------------------------ a daemon in a 128 MiB cgroup

CGROUP_LIMIT = 128 * MiB


class MemoryCgroup:
    """A fresh memory cgroup limited to `limit` bytes without swap: v1's memory
    controller if mounted (/sys/fs/cgroup/memory), else cgroup v2's. Fails the
    test, saying why, if neither can be made."""

    def __init__(self, name: str, limit: int):
        v1 = "/sys/fs/cgroup/memory"
        try:
            if os.path.exists(f"{v1}/memory.limit_in_bytes"):
                self.path = f"{v1}/{name}"
                os.mkdir(self.path)
                self._write("memory.limit_in_bytes", limit)
                if os.path.exists(f"{self.path}/memory.memsw.limit_in_bytes"):
                    self._write("memory.memsw.limit_in_bytes", limit)
                self.v2 = False
            else:
                root = cgroup2_mount()
                if root is None:
                    pytest.fail("no cgroup v1 memory controller and no cgroup2 mount: cannot limit the daemon's memory")
                with open(f"{root}/cgroup.controllers") as f:
                    if "memory" not in f.read().split():
                        pytest.fail(f"{root}/cgroup.controllers lacks the memory controller")
                with open(f"{root}/cgroup.subtree_control") as f:
                    enabled = "memory" in f.read().split()
                if not enabled:
                    with open(f"{root}/cgroup.subtree_control", "w") as f:
                        f.write("+memory")
                self.path = f"{root}/{name}"
                os.mkdir(self.path)
                self._write("memory.max", limit)
                if os.path.exists(f"{self.path}/memory.swap.max"):
                    self._write("memory.swap.max", 0)
                self.v2 = True
        except OSError as e:
            pytest.fail(f"cannot make a {limit // MiB} MiB memory cgroup: {e}")

    def _write(self, name, value) -> None:
        with open(f"{self.path}/{name}", "w") as f:
            f.write(str(value))

    def _read(self, name) -> str:
        with open(f"{self.path}/{name}") as f:
            return f.read()

    def prefix(self) -> list[str]:
        """argv that runs the rest of the command inside the cgroup."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{self.path}/cgroup.procs"]

    def oom_kills(self) -> int:
        text = self._read("memory.events" if self.v2 else "memory.oom_control")
        m = re.search(r"^oom_kill (\d+)", text, re.M)
        assert m, f"no oom_kill count in {self.path}"
        return int(m.group(1))

    def peak(self) -> int | None:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int(self._read(name))
        except OSError:
            return None

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # processes left (a failed stop): the cgroup outlives the test


def cgroup2_mount() -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "cgroup2":
                return fields[4]
    return None


def test_daemon_in_128mib_cgroup(big, all_formats, ckptfs_bin, record):
    """With default flags, a daemon limited to 128 MiB sizes its cache from the
    cgroup (logged) and completes the torch and safetensors lazy reads within
    the same budget, without being OOM-killed."""
    d, _, _ = big
    d.stop()
    cg = MemoryCgroup(f"ckptfs-e2e-{os.getpid()}", CGROUP_LIMIT)
    small = Daemon(ckptfs_bin, d.store, d.mnt, (), log_dir=d.log_dir, prefix=cg.prefix())
    try:
        small.start()
        log = small.stderr()
        assert re.search(r"chunk cache 32 MiB .*memory budget 128 MiB \(" + re.escape(cg.path), log), \
            f"the daemon did not size its cache from the cgroup; its log:\n{log}"
        for how in ("torch.load(mmap=True, weights_only=True)", "safe_open"):
            used, loaded = read_picks_cold(small, all_formats[READ_PICKS[how][0]], how)
            record(f"cgroup 128 MiB, default flags ({how}): store_read_bytes / budget (MiB)",
                   f"{loaded / MiB:.2f} / {lazy_budget(used) / MiB:.0f}")
            assert loaded <= lazy_budget(used), f"{how} in the cgroup: {loaded / MiB:.1f} MiB loaded"
        peak = cg.peak()
        record("cgroup 128 MiB: peak memory charged to the cgroup (MiB)", "n/a" if peak is None else f"{peak / MiB:.0f}")
        assert cg.oom_kills() == 0, "the daemon's cgroup saw an OOM kill"
        small.stop()
    finally:
        if small.proc is not None:
            small.proc.kill()
            small.proc.wait()
            subprocess.run(["umount", "-l", str(small.mnt)], check=False)
            small.proc = None
        cg.remove()
        d.start()
