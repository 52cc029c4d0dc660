"""torch.distributed.checkpoint in one process, on the mount.

- FileSystemWriter / FileSystemReader (torch format): __0_0.distcp data files,
  .metadata.tmp written, fsynced and renamed to .metadata.
- The .distcp file's tensors: ckptfs reads it as the sequence of torch.save
  archives it is, so each tensor is chunked, compressed and deduplicated as a
  tensor (the same chunks as in a safetensors file of the same weights), and
  `ckptfs tensors` / `diff` name them by .metadata's keys.
- HuggingFaceStorageWriter / HuggingFaceStorageReader: DCP writing sharded
  safetensors plus model.safetensors.index.json. (FileSystemReader cannot read
  FileSystemWriter's SerializationFormat.SAFETENSORS in torch 2.15: it always
  torch.loads the data; this is torch's limitation, seen on any filesystem.)

Each runs in a gloo process group of world size 1 (what a single-node job has) and
with no_dist=True (no process group)."""

import json
import os
import socket
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import (FileSystemReader, FileSystemWriter, HuggingFaceStorageReader,
                                          HuggingFaceStorageWriter)

from safetensors.torch import save_file

from helpers import assert_same, clone_tree, raw_bytes


@pytest.fixture(params=["gloo", "no_dist"])
def dist_mode(request):
    """How the checkpoint is coordinated: a gloo world of one, or no_dist=True."""
    if request.param == "no_dist":
        yield {"no_dist": True}
        return
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield {}
    dist.destroy_process_group()


def make_model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 512)).sum().backward()
    opt.step()
    return model


def test_dcp_filesystem(run_dir, dist_mode):
    model = make_model(0)
    state = {
        "model": model.state_dict(),
        "extra": {"bf16": torch.randn(300, 700).bfloat16(), "ids": torch.arange(100_000)},
        "step": 42,
    }
    want = clone_tree(state)
    ckpt = run_dir / "step-42"
    dcp.save(state, storage_writer=FileSystemWriter(str(ckpt), thread_count=2), **dist_mode)
    names = sorted(os.listdir(ckpt))
    assert ".metadata" in names and ".metadata.tmp" not in names, names
    assert any(n.endswith(".distcp") for n in names), names

    # Load in place into differently initialised tensors of the same shapes.
    other = make_model(1)
    target = {
        "model": other.state_dict(),
        "extra": {"bf16": torch.zeros(300, 700, dtype=torch.bfloat16), "ids": torch.zeros(100_000, dtype=torch.int64)},
        "step": 0,
    }
    dcp.load(target, storage_reader=FileSystemReader(str(ckpt)), **dist_mode)
    assert_same(want, target)
    assert_same(want["model"], other.state_dict(), "model loaded in place")

    # Saving the same directory again replaces .metadata (unlink + rename).
    state["step"] = 43
    dcp.save(state, storage_writer=FileSystemWriter(str(ckpt), overwrite=True), **dist_mode)
    target["step"] = 0
    dcp.load(target, storage_reader=FileSystemReader(str(ckpt)), **dist_mode)
    assert target["step"] == 43
    assert_same(want["model"], target["model"], "model after the second save")


def test_dcp_tensor_index(ckptfs, ckptfs_bin, run_dir, record):
    """Each tensor of a .distcp shard is indexed where .metadata says it is,
    and a safetensors file of the same weights adds next to nothing: the
    shard's tensors were cut, compressed and stored as tensors, not as
    content-defined chunks of an unknown file."""
    g = torch.Generator().manual_seed(5)
    state = {f"layers.{i}.weight": (torch.randn(512, 1024, generator=g) * 0.02).bfloat16() for i in range(6)}
    state["head.weight"] = torch.randn(256, 512, generator=g)
    state["ids"] = torch.arange(5000)
    tensors = dict(state)
    state["step"] = 7  # a non-tensor value: an archive of its own, before the tensors
    ckpt = run_dir / "step-7"
    dcp.save(state, storage_writer=FileSystemWriter(str(ckpt), thread_count=1), no_dist=True)
    shard = ckpt / "__0_0.distcp"
    p = subprocess.run([str(ckptfs_bin), "tensors", "--json", str(shard)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    listing = json.loads(p.stdout)
    assert listing["format"] == "distcp", listing["format"]
    assert sorted(t["name"] for t in listing["tensors"]) == sorted(tensors), [t["name"] for t in listing["tensors"]]
    data = shard.read_bytes()
    md = FileSystemReader(str(ckpt)).read_metadata()
    for idx, info in md.storage_data.items():
        if idx.fqn not in tensors:
            continue
        want = tensors[idx.fqn]
        inside = [t for t in listing["tensors"]
                  if info.offset <= t["offset"] and t["offset"] + t["length"] <= info.offset + info.length]
        assert len(inside) == 1, (idx.fqn, info, inside)
        t = inside[0]
        assert t["name"] == idx.fqn and t["shape"] == list(want.shape), (idx.fqn, t)
        assert data[t["offset"]:t["offset"] + t["length"]] == raw_bytes(want), f"{idx.fqn}: {t} holds other bytes"

    before = ckptfs.stats()["unique_bytes"]
    export = run_dir / "export.safetensors"
    save_file(tensors, str(export))
    added = ckptfs.stats()["unique_bytes"] - before
    record("DCP shard then safetensors of the same tensors: added unique bytes / export size",
           f"{added} / {export.stat().st_size}")
    assert added <= 0.02 * export.stat().st_size, f"the export added {added} of its {export.stat().st_size} bytes"
    # ckptfs diff pairs the shard's tensors with the export's by name.
    d = subprocess.run([str(ckptfs_bin), "diff", "--json", str(ckpt), str(export)], capture_output=True, text=True, timeout=300)
    assert d.returncode == 0 and d.stderr == "", d.stderr
    counts = json.loads(d.stdout)["counts"]
    assert counts.get("same") == len(tensors) and not any(counts.get(k) for k in ("changed", "added", "removed")), counts


def test_dcp_huggingface(run_dir, dist_mode):
    sd = {f"model.{k}": v for k, v in make_model(2).state_dict().items()}
    sd["lm_head.weight"] = torch.randn(1000, 333).bfloat16()
    want = clone_tree(sd)
    mapping = {k: 1 + i % 3 for i, k in enumerate(sorted(sd))}  # three shards
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(run_dir), fqn_to_index_mapping=mapping), **dist_mode)
    names = sorted(os.listdir(run_dir))
    assert [n for n in names if n.endswith(".safetensors")] == \
        [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)], names
    assert "model.safetensors.index.json" in names, names
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(target, storage_reader=HuggingFaceStorageReader(str(run_dir)), **dist_mode)
    assert_same(want, target)
