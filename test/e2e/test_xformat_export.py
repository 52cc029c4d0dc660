"""Issue #26 item 4, on a mount: a training checkpoint written by torch.save and
then exported to safetensors (what every release does) stores almost nothing
new, and `ckptfs diff` compares the two tensor by tensor, by name.

The checkpoint is test/delta/workload.py's --full torch.save ({"step", "model":
a tiny GPT-2's state dict, "optim": AdamW's state dict}) after 10 steps. The
export flattens it with the names ckptfs gives torch tensors (the key path
joined with "."), so "model.transformer.wte.weight" and
"optim.state.0.exp_avg" name the same tensor in both files."""

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

from conftest import REPO
from helpers import assert_same

# What the export may add to the store, as a share of the torch.save file: its
# header plus tensors under 4 KiB, which are cut with the bytes around them.
MAX_ADDED_SHARE = 0.05


def flatten(obj, prefix=""):
    """The tensors of a nested dict/list, named by key path joined with "."."""
    out = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, torch.Tensor):
            out[name] = v
        else:
            out.update(flatten(v, name))
    return out


def test_torch_save_exported_to_safetensors(ckptfs, ckptfs_bin, run_dir, record):
    p = subprocess.run([sys.executable, str(REPO / "test" / "delta" / "workload.py"), str(run_dir),
                        "--steps", "10", "--save-every", "10", "--full", "--dtypes", ""],
                       capture_output=True, text=True, timeout=900, cwd="/")
    assert p.returncode == 0, f"workload failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    pt = run_dir / "step-00010" / "full.pt"
    st = run_dir / "step-00010" / "full.safetensors"

    tensors = flatten(torch.load(pt, weights_only=True))
    assert len(tensors) > 50, sorted(tensors)
    # safetensors refuses tensors that share memory (GPT-2's tied lm_head and
    # wte): the export stores a copy of each, as save_model's callers do.
    export = {k: v.contiguous().clone() for k, v in tensors.items()}
    before = ckptfs.stats()["unique_bytes"]
    save_file(export, st, metadata={"format": "pt"})
    added = ckptfs.stats()["unique_bytes"] - before
    size = pt.stat().st_size  # the checkpoint exported (the export is larger: it unties lm_head)
    record("export torch.save -> safetensors: added unique bytes / torch.save size / export size, share",
           f"{added} / {size} / {st.stat().st_size}, {added / size:.4f}")
    back = load_file(st)
    assert_same(dict(sorted(export.items())), dict(sorted(back.items())))
    del back

    d = subprocess.run([str(ckptfs_bin), "diff", "--json", str(pt), str(st)],
                       capture_output=True, text=True, timeout=300)
    assert d.returncode == 0, d.stderr
    res = json.loads(d.stdout)
    not_same = [(t["name"], t["status"]) for t in res["tensors"] if t["status"] != "same"]
    record("export torch.save -> safetensors: diff counts, B adds (bytes)",
           f'{json.dumps(res["counts"], sort_keys=True)}, {res["added_bytes"]}')
    assert added <= MAX_ADDED_SHARE * size, f"the export added {added} bytes, {added / size:.1%} of the {size}-byte torch.save"
    assert not not_same, f"{len(not_same)} of {len(res['tensors'])} tensors not same: {not_same[:20]}"
    assert res["counts"].get("same") == len(tensors), res["counts"]
    # The human form says so too.
    d = subprocess.run([str(ckptfs_bin), "diff", str(pt), str(st)], capture_output=True, text=True, timeout=300)
    assert d.returncode == 0, d.stderr
    assert f"same     {len(tensors):5d} tensors" in d.stdout, d.stdout
