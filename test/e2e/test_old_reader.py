"""A checkpoint overwritten while another process has the old version mmapped.

The reader (a subprocess) opens the file with torch.load(mmap=True) or safe_open,
touches the first tensor, and waits. The file is then replaced, either by writing
a temp file and renaming it over the path, or in place (open with O_TRUNC and
write, what torch.save(path) and safetensors <= 0.7's save_file do). The page
cache is dropped, so the reader's untouched pages must come from the daemon, and
the reader then checksums every tensor: it must see the OLD bytes. New readers
must see the new ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file, save_file

from helpers import assert_same, drop_caches, tensors_digest

HERE = str(Path(__file__).resolve().parent)

READER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
from helpers import raw_bytes, tensors_digest
kind, path = sys.argv[2], sys.argv[3]
if kind == "torch":
    tensors = torch.load(path, mmap=True, weights_only=True)
    get = tensors.__getitem__
    keys = list(tensors)
else:
    from safetensors import safe_open
    f = safe_open(path, framework="pt")
    get = f.get_tensor
    keys = list(f.keys())
raw_bytes(get(sorted(keys)[0]))  # fault in part of the old file before it is replaced
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
print(tensors_digest({k: get(k) for k in keys}), flush=True)
"""


def make_tensors(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = {f"layer.{i:02d}.weight": torch.randn(512, 1024 + 16 * i, generator=g) for i in range(10)}  # ~2 MiB each
    t["embed"] = torch.randn(1000, 999, generator=g).bfloat16()
    t["ids"] = torch.arange(seed, seed + 50_000)
    return t


def save(kind: str, tensors: dict, path: Path) -> None:
    if kind == "torch":
        torch.save(tensors, path)
    else:
        save_file(tensors, path)


def load(kind: str, path: Path) -> dict:
    if kind == "torch":
        return torch.load(path, weights_only=True)
    return load_file(path)


def overwrite(kind: str, how: str, tensors: dict, path: Path) -> None:
    if how == "rename":
        if kind == "torch":
            tmp = path.with_name(path.name + ".tmp")
            torch.save(tensors, tmp)
            os.replace(tmp, path)
        else:
            save_file(tensors, path)  # safetensors >= 0.8: temp file, then rename(2) over path
    else:
        assert how == "inplace"
        if kind == "torch":
            torch.save(tensors, path)  # open(path, O_WRONLY|O_CREAT|O_TRUNC)
        else:
            with open(path, "wb") as f:  # what save_file did up to safetensors 0.7
                f.write(safetensors.torch.save(tensors))


@pytest.mark.parametrize("how", ["rename", "inplace"])
@pytest.mark.parametrize("kind", ["torch", "safetensors"])
def test_old_reader_keeps_old_bytes(run_dir, kind, how):
    old, new = make_tensors(1), make_tensors(2)
    path = run_dir / ("model.pt" if kind == "torch" else "model.safetensors")
    save(kind, old, path)

    reader = subprocess.Popen([sys.executable, "-c", READER, HERE, kind, str(path)], cwd="/",
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = reader.stdout.readline()
        assert line.strip() == "ready", f"reader did not start: {line!r} {reader.stderr.read()[-3000:]}"

        overwrite(kind, how, new, path)
        drop_caches()
        assert_same(dict(sorted(new.items())), dict(sorted(load(kind, path).items())), "new reader")

        out, err = reader.communicate("go\n", timeout=300)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, (
        f"old reader exited {reader.returncode} after the file was replaced ({how})"
        f"{' (SIGBUS: its mapping lost its pages)' if reader.returncode == -7 else ''}:\n{err[-3000:]}")
    got = out.strip()
    assert got != tensors_digest(new), f"old reader sees the NEW bytes after the {how} overwrite"
    assert got == tensors_digest(old), f"old reader sees neither the old nor the new bytes after the {how} overwrite"
