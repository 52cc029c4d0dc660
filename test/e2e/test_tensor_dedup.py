"""Tensor-aware dedup through the mount, measured on stats.json, and
`ckptfs tensors` against what torch.load sees (the tensor-dedup issue)."""

import json
import subprocess

import numpy as np
import torch
import xgboost as xgb

from helpers import MiB


def param(seed: int, shape=(256, 1024), dtype=torch.float32) -> torch.Tensor:
    # Seeds of their own: randn from another test's seed would share its first
    # bytes (and rightly dedupe against them).
    g = torch.Generator().manual_seed(50_000 + seed)
    return torch.randn(*shape, generator=g).to(dtype)


def tensor_bytes(sd: dict) -> int:
    """Bytes of the distinct storages of a state dict (what torch.save writes)."""
    seen, total = set(), 0
    for t in sd.values():
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def test_torch_save_param_added_and_changed(ckptfs, run_dir, record):
    """B = A with a new 1 MiB parameter in front and one 1 MiB parameter
    changed: storing B adds at most 2.2 MiB plus B's non-tensor bytes."""
    a = {f"layers.{i}.weight": param(i) for i in range(24)}  # 24 x 1 MiB
    b = {"embed.weight": param(1000)}
    b.update(a)
    b["layers.5.weight"] = param(2000)
    torch.save(a, run_dir / "a.pt")
    before = ckptfs.stats()["unique_bytes"]
    torch.save(b, run_dir / "b.pt")
    added = ckptfs.stats()["unique_bytes"] - before
    header = (run_dir / "b.pt").stat().st_size - tensor_bytes(b)
    limit = int(2.2 * MiB) + header
    record("dedup torch.save: B adds / limit (bytes), B's non-tensor bytes", f"{added} / {limit}, {header}")
    assert added <= limit, f"B added {added} bytes, limit {limit}"
    for k, v in torch.load(run_dir / "b.pt", weights_only=True).items():
        assert torch.equal(v, b[k]), k


def xgb_data(n=20000, d=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = (x[:, 0] * 2 + np.sin(x[:, 1]) + rng.standard_normal(n) * 0.1).astype(np.float32)
    return xgb.DMatrix(x, label=y)


def test_xgboost_warm_start(ckptfs, run_dir, record):
    """seeds/000's XGBoost case: save_model after each of 10 rounds that each add
    50 trees of depth 6, as .json and as .ubj; unique bytes stay within 1.5x the
    final file (formats without a parser dedupe by content-defined chunking)."""
    dtrain = xgb_data()
    params = {"max_depth": 6, "eta": 0.1, "objective": "reg:squarederror", "nthread": 2, "seed": 0}
    for ext in ("json", "ubj"):
        d = run_dir / ext
        d.mkdir()
        before = ckptfs.stats()["unique_bytes"]
        bst = None
        logical = 0
        for r in range(10):
            bst = xgb.train(params, dtrain, num_boost_round=50, xgb_model=bst)
            path = d / f"round-{r:02d}.{ext}"
            bst.save_model(str(path))
            logical += path.stat().st_size
        final = path.stat().st_size
        added = ckptfs.stats()["unique_bytes"] - before
        record(f"dedup xgboost .{ext}: logical / unique / final file (bytes), unique/final",
               f"{logical} / {added} / {final}, {added / final:.2f}")
        assert added <= 1.5 * final, f".{ext}: unique {added} > 1.5 x final {final}"
        back = xgb.Booster(model_file=str(path))
        assert back.num_boosted_rounds() == 500


TORCH_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}


def flatten(obj, prefix=""):
    """Tensors of a nested state dict under dotted names."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def test_tensors_command_matches_torch_load(ckptfs, ckptfs_bin, run_dir, tmp_path):
    """`ckptfs tensors` on a torch file (in the mount: from its manifest; and a
    local copy: parsed) lists the names, dtypes and shapes torch.load gives."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 16)).sum().backward()
    opt.step()
    sd = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "extra": {dt_name: torch.ones(3, 2, dtype=dt) for dt, dt_name in TORCH_DTYPES.items()},
        "scalar": torch.tensor(3.5),
        "view": torch.arange(100, dtype=torch.int32)[10:30],
    }
    for path in (run_dir / "ckpt.pt", tmp_path / "ckpt.pt"):
        torch.save(sd, path)
        out = subprocess.run([str(ckptfs_bin), "tensors", "--json", str(path)],
                             capture_output=True, text=True, check=True).stdout
        listing = json.loads(out)
        assert listing["format"] == "torch"
        got = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in listing["tensors"]}
        want = {k: (TORCH_DTYPES[v.dtype], tuple(v.shape))
                for k, v in flatten(torch.load(path, weights_only=True)).items()}
        assert got == want, f"{path}:\nckptfs: {sorted(got.items())}\ntorch:  {sorted(want.items())}"
