"""Helpers shared by the end-to-end tests (imported by conftest and the tests)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

MiB = 1 << 20


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements as bytes, in C order (any dtype, any layout)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(saved, loaded, where: str = "root") -> None:
    """loaded must equal saved bit for bit: same structure, same keys, and for
    every tensor the same dtype, shape and bytes (torch.equal alone would take
    -0.0 for 0.0 and fail on NaN)."""
    if isinstance(saved, torch.Tensor):
        assert isinstance(loaded, torch.Tensor), f"{where}: {type(loaded).__name__}, want a tensor"
        assert loaded.dtype == saved.dtype, f"{where}: dtype {loaded.dtype}, want {saved.dtype}"
        assert loaded.shape == saved.shape, f"{where}: shape {tuple(loaded.shape)}, want {tuple(saved.shape)}"
        has_nan = (saved.is_floating_point() or saved.is_complex()) and bool(saved.isnan().any())
        if not has_nan:
            assert torch.equal(loaded, saved), f"{where}: values differ"
        assert raw_bytes(loaded) == raw_bytes(saved), f"{where}: bytes differ"
    elif isinstance(saved, dict):
        assert isinstance(loaded, dict), f"{where}: {type(loaded).__name__}, want a dict"
        assert list(loaded.keys()) == list(saved.keys()), f"{where}: keys {list(loaded)}, want {list(saved)}"
        for k in saved:
            assert_same(saved[k], loaded[k], f"{where}[{k!r}]")
    elif isinstance(saved, (list, tuple)):
        assert type(loaded) is type(saved), f"{where}: {type(loaded).__name__}, want {type(saved).__name__}"
        assert len(loaded) == len(saved), f"{where}: length {len(loaded)}, want {len(saved)}"
        for i, (a, b) in enumerate(zip(saved, loaded)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert loaded == saved, f"{where}: {loaded!r}, want {saved!r}"


def tensors_digest(tensors: dict) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in key order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k]
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(raw_bytes(t))
    return h.hexdigest()


def clone_tree(obj):
    """A deep copy that owns its tensors (a snapshot of a live state dict)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tree(v) for v in obj)
    return obj


def drop_caches() -> None:
    """Write back and drop the kernel's page cache (and dentries/inodes), so the
    next read of a file on the mount reaches the daemon. Needs root. The daemon's
    own chunk cache is not affected: restart the daemon for a cold read."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run_py(code: str, *args: str, timeout: float = 600) -> str:
    """Run `code` in a fresh interpreter of this venv (cwd /, off the mount);
    fail the test on a non-zero exit (a SIGBUS shows as -7). Returns stdout."""
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=timeout, cwd="/")
    if p.returncode != 0:
        pytest.fail(f"subprocess exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\n"
                    f"stderr:\n{p.stderr[-3000:]}", pytrace=False)
    return p.stdout


def is_mounted(path: Path) -> bool:
    """Whether path is a mount point in this mount namespace."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]) == real:
                return True
    return False
