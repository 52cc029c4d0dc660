"""safetensors on the mount: save_file (temp file, set_len, write, rename while
open), load_file, and safe_open's lazy get_tensor / get_slice over its mmap."""

import json
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import assert_same


def make_tensors(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(4096, 512, generator=g),  # 8 MiB
        "layer.0.w": torch.randn(512, 2048, generator=g).bfloat16(),
        "layer.0.b": torch.randn(2048, generator=g).half(),
        "layer.1.w": torch.randn(1000, 1000, generator=g, dtype=torch.float64),
        "positions": torch.arange(-5000, 5000, dtype=torch.int64),
        "bytes": torch.randint(0, 256, (12345,), generator=g, dtype=torch.uint8),
        "mask": torch.rand(777, generator=g) > 0.3,
        "scalar": torch.tensor(1.5),
        "empty": torch.empty(0, 3),
    }


def test_save_load_file(run_dir):
    tensors = make_tensors()
    path = run_dir / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt", "step": "10"})
    assert sorted(p.name for p in run_dir.iterdir()) == ["model.safetensors"], "temp file left behind"
    loaded = load_file(path)
    assert_same(dict(sorted(tensors.items())), dict(sorted(loaded.items())))
    # The header is what safetensors wrote: a u64 length, JSON, exact file size.
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt", "step": "10"}
    assert max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__") + 8 + n == len(raw)


def test_safe_open(run_dir):
    tensors = make_tensors(1)
    path = run_dir / "model.safetensors"
    save_file(tensors, path)
    with safe_open(path, framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        # Lazily, in reverse order: every get_tensor faults its own pages in.
        for k in sorted(f.keys(), reverse=True):
            assert_same(tensors[k], f.get_tensor(k), k)
        sl = f.get_slice("embed.weight")
        assert sl.get_shape() == [4096, 512]
        assert sl.get_dtype() == "F32"
        assert_same(tensors["embed.weight"][1000:1003], sl[1000:1003], "slice rows")
        assert_same(tensors["embed.weight"][4000:, 17:300], sl[4000:, 17:300], "slice block")
        sl = f.get_slice("layer.0.w")
        assert_same(tensors["layer.0.w"][511:], sl[511:], "last row bf16")


def test_overwrite_with_new_content(run_dir):
    """save_file over an existing file replaces it for new readers."""
    path = run_dir / "model.safetensors"
    first, second = make_tensors(2), make_tensors(3)
    save_file(first, path)
    assert_same(dict(sorted(first.items())), dict(sorted(load_file(path).items())))
    save_file(second, path)
    assert_same(dict(sorted(second.items())), dict(sorted(load_file(path).items())))
