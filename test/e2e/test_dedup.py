"""Dedup through stats.json: the same state dict saved into two runs costs one
copy of unique bytes, while logical bytes count every file."""

import pytest
import torch
from safetensors.torch import save_file

from helpers import MiB


def make_state_dict(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {f"block.{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(4)}  # 16 MiB
    sd["head"] = torch.randn(1000, 333, generator=g).bfloat16()
    return sd


def nbytes(sd: dict) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def save(fmt: str, sd: dict, d) -> None:
    d.mkdir(parents=True)
    if fmt == "torch":
        torch.save(sd, d / "model.pt")
    else:
        save_file(sd, d / "model.safetensors")


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_same_state_dict_in_two_runs(ckptfs, run_dir, record, fmt):
    sd = make_state_dict(7 if fmt == "torch" else 8)
    size = nbytes(sd)
    s0 = ckptfs.stats()
    save(fmt, sd, run_dir / "run-a" / "100")
    s1 = ckptfs.stats()
    save(fmt, sd, run_dir / "run-b" / "100")
    s2 = ckptfs.stats()

    first = s1["unique_bytes"] - s0["unique_bytes"]
    second = s2["unique_bytes"] - s1["unique_bytes"]
    record(f"dedup {fmt}: tensor bytes / unique bytes added by run-a / by run-b (same tensors)",
           f"{size} / {first} / {second}")
    assert s1["files"] - s0["files"] == 1 and s2["files"] - s1["files"] == 1
    assert s2["logical_bytes"] - s1["logical_bytes"] == s1["logical_bytes"] - s0["logical_bytes"] >= size
    assert size <= first <= size + MiB, f"run-a added {first} unique bytes for {size} tensor bytes"
    assert second <= 64 * 1024, f"run-b added {second} unique bytes for an identical file; want ~0"

