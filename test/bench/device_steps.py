"""make bench's device steps (issue #25): a bf16 state dict held on the
accelerator (CUDA when torch sees one, else the CPU; --device or $DEV picks),
saved and loaded with the frameworks' own calls into the mount and into the
plain directory, side by side. The cases of
../shared/tools/device-bench/gpu_bench.py, moved here so that every machine
runs them with the other steps:

  10   torch.save from the device
  10b  safetensors save_file from the device (another state: the same one
       would dedupe against 10's chunks and be a re-save)
  11   the same state saved again, every tensor unchanged, with torch.save
  11b  the same with save_file
  12   cold safetensors load_file(device=DEV)
  12b  cold torch.load(map_location=DEV, mmap=True)
  12c  cold torch.load(map_location=DEV)

A save in ckptfs is timed to the return of close (the commit: durable); the
plain save is timed to the return of fsync of the file and of its directory,
the same durability. Each save is also timed into memory (/dev/shm, tmpfs),
the writer's own cost: the floor under both, which tells whether ckptfs's
write path or the writer sets the pace (NAME_vs_memory in the results). A cold load starts from a restarted daemon (its chunk
cache empty) and a dropped page cache; the plain load after a dropped page
cache. Every load is checked against the saved state, outside the timing.
gpu_bench.py's eight parallel writers are not here: bench.py's steps measure
one writer, and the writers' own tensor generation dominated that case."""

import gc
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MiB = 1 << 20
MEMORY = Path("/dev/shm")  # tmpfs: the save steps' floor
TENSOR_SHAPE = (4096, 2048)  # bf16: 16 MiB, gpu_bench.py's tensor
STEPS = ("10", "10b", "11", "11b", "12", "12b", "12c")


def pick_device(flag=None):
    """The device the steps run on and a line that says why: flag, else $DEV,
    else cuda when torch sees it, else cpu."""
    dev = flag or os.environ.get("DEV")
    if dev:
        why = "asked for"
    elif torch.cuda.is_available():
        dev, why = "cuda", "torch.cuda.is_available()"
    else:
        dev, why = "cpu", "no CUDA device (torch.cuda.is_available() is False)"
    name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu"
    return dev, f"{dev} ({name}; {why})"


def state_dict(dev, size_mib, seed):
    """bf16 weights of N(0, 0.02), 16 MiB tensors (smaller when the whole
    state is below 16 MiB), size_mib in all, generated on dev."""
    g = torch.Generator(device=dev).manual_seed(seed)
    rows, cols = TENSOR_SHAPE
    n = max(1, size_mib * MiB // (rows * cols * 2))
    if size_mib * MiB < rows * cols * 2:
        rows = max(1, size_mib * MiB // (cols * 2))
    return {f"layers.{i:04d}.weight": (torch.randn(rows, cols, device=dev, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(n)}


def nbytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def _sync_dev(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize(torch.device(dev))


def _fsync(path):
    for p, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(p, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _resident(sd, dev):
    """On the CPU, torch.load(mmap=True) and safetensors' load_file map the
    file and read little of it (load_file of 256 MiB through a mount: 31 MiB
    fetched): a clone of each tensor reads every byte, as the copy to the
    device does on CUDA."""
    return {k: t.clone() for k, t in sd.items()} if dev == "cpu" else sd


def _same(got, sd):
    bad = [k for k in sd if k not in got or not torch.equal(got[k].to(sd[k].device), sd[k])]
    if bad or len(got) != len(sd):
        raise SystemExit(f"a load gave other tensors than were saved: {bad[:3]} ({len(got)} of {len(sd)})")


class Steps:
    """One round of the device steps. bench is bench.py's context: the
    daemon (d), the plain directory, want(), record() and drop_caches()."""

    def __init__(self, bench, dev, size_mib):
        self.b, self.dev, self.size_mib = bench, dev, size_mib

    def timed(self, fn):
        _sync_dev(self.dev)
        t = time.monotonic()
        fn()
        _sync_dev(self.dev)
        return time.monotonic() - t

    def save_pair(self, name, save, sd, ck_path, pl_path):
        # ckptfs first: its commit's background work (re-encoding) is
        # waited for before the plain save, so that it does not steal
        # the plain save's CPU.
        ck = self.timed(lambda: save(sd, ck_path))
        self.b.d.settle()
        pl = self.timed(lambda: (save(sd, pl_path), _fsync(pl_path)))
        self.b.record(name, ck, pl)
        # The same save into memory (tmpfs): the writer's own cost (the
        # copy off the device, serializing, write(2) into the page cache),
        # the floor under both; ckptfs ÷ this says how much the daemon adds.
        if MEMORY.is_dir():
            mem_path = MEMORY / f"ckptfs-bench-{os.getpid()}-{pl_path.name}"
            try:
                mem = self.timed(lambda: save(sd, mem_path))
            finally:
                mem_path.unlink(missing_ok=True)
            self.b.res.setdefault(f"{name}_vs_memory", []).append((ck, mem))
            print(f"  {name}: into memory (tmpfs) {mem:.3f} s; ckptfs / memory {ck / mem:.3f}", flush=True)

    def cold_pair(self, name, load, ck_path, pl_path, sd):
        got = {}
        self.b.d.restart()
        self.b.drop_caches()
        ck = self.timed(lambda: got.update(load(ck_path)))
        _same(got, sd)
        got = None
        gc.collect()
        self.b.drop_caches()
        pl = self.timed(lambda: load(pl_path))
        gc.collect()
        self.b.record(name, ck, pl)

    def run(self, r):
        want, dev, plain = self.b.want, self.dev, self.b.plain
        # Two states: a (torch.save) and b (save_file). One state saved both
        # ways would make 10b a re-save: its tensors' chunks are 10's.
        sd_a = state_dict(dev, self.size_mib, 1000 * r + 5)
        sd_b = state_dict(dev, self.size_mib, 1000 * r + 6) if want("10b", "11b", "12") else None
        run = self.b.mnt / "runs" / f"dev{r}"
        run.mkdir(parents=True, exist_ok=True)
        pt = lambda s, p: torch.save(s, p)
        st = lambda s, p: save_file(s, str(p))
        # The first saves are made whenever a later step needs their files.
        if want("10", "11", "12b", "12c"):
            self.save_pair("10_dev_torch_save", pt, sd_a, run / "model.pt", plain / f"dev{r}.pt")
        if want("10b", "11b", "12"):
            self.save_pair("10b_dev_safetensors_save", st, sd_b, run / "model.safetensors", plain / f"dev{r}.safetensors")
        if want("11"):
            self.save_pair("11_dev_resave_same_torch", pt, sd_a, run / "again.pt", plain / f"dev{r}-again.pt")
        if want("11b"):
            self.save_pair("11b_dev_resave_same_safetensors", st, sd_b, run / "again.safetensors",
                           plain / f"dev{r}-again.safetensors")
        for p in (plain / f"dev{r}-again.pt", plain / f"dev{r}-again.safetensors"):
            p.unlink(missing_ok=True)
        if want("12"):
            self.cold_pair("12_cold_load_file_dev", lambda p: _resident(load_file(str(p), device=dev), dev),
                           run / "model.safetensors", plain / f"dev{r}.safetensors", sd_b)
        if want("12b"):
            self.cold_pair("12b_cold_torch_load_mmap_dev", lambda p: _resident(
                torch.load(p, map_location=dev, weights_only=True, mmap=True), dev),
                run / "model.pt", plain / f"dev{r}.pt", sd_a)
        if want("12c"):
            self.cold_pair("12c_cold_torch_load_dev", lambda p: torch.load(p, map_location=dev, weights_only=True),
                           run / "model.pt", plain / f"dev{r}.pt", sd_a)
        for p in (plain / f"dev{r}.pt", plain / f"dev{r}.safetensors"):
            p.unlink(missing_ok=True)
        return nbytes(sd_a)
