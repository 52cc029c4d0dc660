"""Regenerates dcp_shard.distcp, dcp_shard.metadata, dcp_shard.json and dcp_single.*.

Run with a Python that has torch 2.x (the committed files were made with the
CI virtualenv's torch):

    python3 gen_distcp.py

torch.distributed.checkpoint saves one process's state into __0_0.distcp:
each item torch.save()d into the same stream, one zip archive after
another (non-tensor values first), and .metadata records each item's
offset and length. dcp_shard.json maps the name ckptfs gives each tensor
("<number among the archives holding tensors>") to its dtype, shape and bytes as hex, taken from
.metadata's offsets, so the test does not need torch.
"""
import json
import os
import shutil
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore")
torch.manual_seed(0)
state = {
    "layer.weight": torch.randn(8, 16),
    "layer.bias": torch.randn(16).to(torch.bfloat16),
    "norm.weight": torch.ones(16, dtype=torch.float16),
    "ids": torch.arange(24, dtype=torch.int64),
    "step": 1234,  # a non-tensor value: saved as bytes
    "config": {"lr": 0.1, "name": "run"},
    # A tuple is a leaf to DCP: one item, saved as bytes (torch.save of the
    # tuple), so one archive of two tensors.
    "bufs": (torch.arange(6, dtype=torch.int32), torch.ones(3, dtype=torch.float64)),
}
d = tempfile.mkdtemp()
dcp.save(state, storage_writer=dcp.FileSystemWriter(d))
shutil.copy(os.path.join(d, "__0_0.distcp"), "dcp_shard.distcp")
shutil.copy(os.path.join(d, ".metadata"), "dcp_shard.metadata")
md = dcp.FileSystemReader(d).read_metadata()
items = sorted(md.storage_data.items(), key=lambda kv: kv[1].offset)
out = {}
k = -1  # ckptfs numbers the archives that hold tensors
for idx, info in items:
    v = state.get(idx.fqn)
    if torch.is_tensor(v):
        k += 1
        named = {str(k): v}
    elif isinstance(v, tuple):
        k += 1
        named = {f"{k}.{j}": t for j, t in enumerate(v)}
    else:
        continue
    for name, t in named.items():
        t = t.contiguous()
        out[name] = {"fqn": idx.fqn, "dtype": str(t.dtype), "shape": list(t.shape),
                     "hex": t.reshape(-1).view(torch.uint8).numpy().tobytes().hex()}
with open("dcp_shard.json", "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
shutil.rmtree(d)

# A shard of one item is one torch.save archive (format torch): dcp_single.*.
d = tempfile.mkdtemp()
dcp.save({"only": torch.randn(4, 4)}, storage_writer=dcp.FileSystemWriter(d))
shutil.copy(os.path.join(d, "__0_0.distcp"), "dcp_single.distcp")
shutil.copy(os.path.join(d, ".metadata"), "dcp_single.metadata")
shutil.rmtree(d)
