"""Regenerates the torch and numpy fixtures in this directory.

Run with a Python that has torch and numpy (the committed files were made with
Debian bookworm's python3-torch 1.13.1 and python3-numpy 1.24.2):

    python3 gen_fixtures.py

Each file stays well under 200 KB. formats_test.go checks the tensor byte
ranges Parse reports against the .json sidecars written here, which hold
every tensor's bytes as hex, so the tests do not need torch.
"""
import collections
import json

import numpy as np
import torch

torch.manual_seed(0)
np.random.seed(0)


def dump(path, tensors):
    """Writes name -> {dtype, shape, hex of contiguous bytes} for the test."""
    out = {}
    for name, t in tensors.items():
        c = t.contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        out[name] = {"dtype": str(t.dtype), "shape": list(t.shape), "hex": raw.hex()}
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


# A state dict with several dtypes, a tied weight, a transposed view and a
# slice view of one storage.
base = torch.randn(8, 16)
sd = collections.OrderedDict()
sd["embed.weight"] = base
sd["lm_head.weight"] = base  # tied: same storage
sd["proj.weight_t"] = base.t()  # non-contiguous view of the same storage
sd["proj.rows"] = base[2:5]  # view with a storage offset
sd["norm.weight"] = torch.ones(16, dtype=torch.float16)
sd["norm.bias"] = torch.zeros(16, dtype=torch.bfloat16)
sd["pos.ids"] = torch.arange(32, dtype=torch.int64)
sd["mask"] = torch.rand(12) > 0.5
sd["scale"] = torch.tensor(3.5, dtype=torch.float64)
sd["empty"] = torch.zeros(0, 4)
torch.save(sd, "torch_state_dict.pt")
dump("torch_state_dict.json", sd)

# An optimizer state dict after one Adam step.
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.randn(3, 4)).sum().backward()
opt.step()
osd = opt.state_dict()
torch.save(osd, "torch_optimizer.pt")
flat = {}
for pid, st in osd["state"].items():
    for k, v in st.items():
        if torch.is_tensor(v):
            flat["state.%d.%s" % (pid, k)] = v
dump("torch_optimizer.json", flat)

# A training checkpoint: nested dicts, lists and plain Python values.
ckpt = {"model": model.state_dict(), "optimizer": osd, "epoch": 3, "lr": 0.1,
        "names": ["a", "b"], "big": 1 << 40}
torch.save(ckpt, "torch_checkpoint.pt")

# The legacy (non-zip) format and a whole pickled module.
torch.save(model.state_dict(), "torch_legacy.pt", _use_new_zipfile_serialization=False)
torch.save(model, "torch_module.pt")

# numpy
arrs = {"weights": np.random.rand(10, 20).astype(np.float32),
        "ids": np.arange(7, dtype=np.int64),
        "flags": np.array([True, False, True]),
        "half": np.ones((3, 3), dtype=np.float16),
        "scalar": np.float64(2.5),
        "names": np.array(["ab", "cde"])}
np.savez("np_arrays.npz", **arrs)
np.savez_compressed("np_compressed.npz", **arrs)
np.save("np_array.npy", arrs["weights"])
np.save("np_fortran.npy", np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)))
