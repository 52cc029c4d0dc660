"""JAX's orbax-checkpoint on the mount: StandardCheckpointer's default layout
(OCDBT, zarr, zstd), on one host device and sharded over eight.

Orbax writes the same compressed bytes for an unchanged array in every save,
but batches them into new, randomly named OCDBT data files in whatever order
its threads finish. Cut by content alone, an unchanged re-save of the sharded
model stored 61% of its bytes again; ckptfs cuts those files at every zstd
frame and b-tree node (formats/zstdframes.go), so the re-save stores little
more than orbax's metadata files, and a save that changed three arrays about
those arrays. Every save and restore runs in a subprocess: XLA_FLAGS must be
set before jax starts."""

import subprocess
import sys

import pytest

# The model: a small transformer's pytree (13 MB: a bf16 embedding, 4 layers
# of f32 attention and bf16 MLP weights, norms, biases, a step counter);
# variant 1 changes an MLP weight, a bias and the final norm.
MODEL = r'''
import os, sys
ndev = int(sys.argv[3])
if ndev > 1:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ndev}"
import numpy as np, jax, jax.numpy as jnp
import orbax.checkpoint as ocp

def model(variant):
    rng = np.random.default_rng(0)
    d, ff, layers, vocab = 256, 1024, 4, 8000
    def w(*s, dt=np.float32):
        return (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(dt)
    bf = jnp.bfloat16
    tree = {"embed": w(vocab, d, dt=bf), "final_norm": np.ones(d, np.float32), "lm_head_b": np.zeros(vocab, np.float32)}
    for i in range(layers):
        tree[f"layer_{i}"] = {
            "attn": {"qkv": w(d, 3 * d), "qkv_b": w(3 * d), "out": w(d, d), "out_b": w(d)},
            "mlp": {"up": w(d, ff, dt=bf), "up_b": w(ff), "down": w(ff, d, dt=bf), "down_b": w(d)},
            "ln": {"scale": 1 + w(d), "bias": w(d)},
        }
    tree["step"] = np.int32(100)
    if variant:
        tree["layer_2"]["mlp"]["up"] = (tree["layer_2"]["mlp"]["up"].astype(np.float32) + 1e-3).astype(bf)
        tree["layer_1"]["attn"]["qkv_b"] = tree["layer_1"]["attn"]["qkv_b"] + 1
        tree["final_norm"] = tree["final_norm"] * 1.01
        tree["step"] = np.int32(200)
    tree = jax.tree.map(jnp.asarray, tree)
    if ndev > 1:  # rows over the devices, as a data-parallel job shards them
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()), ("x",))
        def put(x):
            spec = P("x") if x.ndim >= 1 and x.shape[0] % ndev == 0 else P()
            return jax.device_put(x, NamedSharding(mesh, spec))
        tree = jax.tree.map(put, tree)
    return tree
'''

SAVE = MODEL + r'''
ck = ocp.StandardCheckpointer()
ck.save(os.path.abspath(sys.argv[1]), model(int(sys.argv[2])))
ck.wait_until_finished()
print("saved")
'''

RESTORE = MODEL + r'''
want = model(int(sys.argv[2]))
got = ocp.StandardCheckpointer().restore(os.path.abspath(sys.argv[1]), jax.tree.map(ocp.utils.to_shape_dtype_struct, want))
leaves = 0
for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
    w, g = np.asarray(w), np.asarray(g)
    assert w.dtype == g.dtype and w.shape == g.shape and w.tobytes() == g.tobytes(), jax.tree_util.keystr(path)
    leaves += 1
print("restored", leaves)
'''


def run(code: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, cwd="/")
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.mark.parametrize("ndev", [1, 8])
def test_orbax_resave(ckptfs, run_dir, record, ndev):
    added = []
    for step, variant in ((1, 0), (2, 0), (3, 1)):
        before = ckptfs.stats()["unique_bytes"]
        run(SAVE, str(run_dir / f"step_{step}"), str(variant), str(ndev))
        added.append(ckptfs.stats()["unique_bytes"] - before)
    first, again, changed = added
    record(f"orbax OCDBT, {ndev} device(s): unique bytes added by the first save / an unchanged re-save / "
           "a save changing 3 arrays (0.5 MiB of bf16)", f"{first} / {again} / {changed}")
    assert first > 8 << 20, added  # the model (13 MB), compressed by orbax
    assert again <= 0.03 * first, f"an unchanged re-save stored {again} bytes again, of {first}"
    # The changed arrays: an MLP weight of 512 KiB (bf16, compressed by orbax
    # to about 0.8 of that), a bias and a norm of 3 KiB and 1 KiB.
    assert changed <= again + 768 << 10, f"a save changing 0.5 MiB of arrays stored {changed} bytes"

    ckptfs.restart()
    for step, variant in ((2, 0), (3, 1)):
        out = run(RESTORE, str(run_dir / f"step_{step}"), str(variant), str(ndev))
        assert out.startswith("restored "), out
