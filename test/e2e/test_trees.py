"""Tree models through the mount (issue #29): each library's warm-started
saves (10 rounds of +50 trees, 4,000 samples x 20 features; tree_models.py)
cost at most 1.10x the final file in unique bytes, every saved step loads back
with its library and predicts what the model that saved it predicted, and
`ckptfs tensors` / `ckptfs diff` see the trees."""

import json
import subprocess

import numpy as np
import pytest

from tree_models import ROUNDS, ROWS, TREES_PER_ROUND, warm_start_saves

LIMIT = 1.10


def cli(binary, cmd: str, *args: str) -> dict:
    """`ckptfs CMD --json ARGS...`, decoded."""
    p = subprocess.run([str(binary), cmd, "--json", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"ckptfs {cmd} {' '.join(args)}: {p.stderr}"
    return json.loads(p.stdout)


@pytest.mark.parametrize("row", ROWS)
def test_warm_start_saves(daemon_factory, ckptfs_bin, record, row):
    # A store of its own: the rows share bytes (joblib nests the very pickle
    # of sklearn's trees that pickle.dump writes), and one row must not
    # dedupe against another's saves.
    d = daemon_factory(f"trees-{row}")
    before = d.stats()["unique_bytes"]
    saves = list(warm_start_saves(row, d.mnt))
    added = d.stats()["unique_bytes"] - before
    final = saves[-1][0].stat().st_size
    logical = sum(p.stat().st_size for p, _, _ in saves)
    record(f"trees {row}: logical / unique added / final file (bytes), unique/final",
           f"{logical} / {added} / {final}, {added / final:.3f}")
    assert added <= LIMIT * final, f"{row}: unique {added} > {LIMIT} x final {final} ({added / final:.3f})"

    for path, want, load in saves:
        got = load(path)
        assert np.array_equal(got, want), f"{path.name}: predictions differ from the model that saved it"

    tensors = cli(ckptfs_bin, "tensors", str(saves[-1][0]))
    parts = tensors["tensors"]
    want_format = {"xgboost-json": "xgboost-json", "xgboost-ubj": "xgboost-ubj",
                   "lightgbm-text": "lightgbm"}.get(row, "pickle")
    assert tensors["format"] == want_format
    trees = ROUNDS * TREES_PER_ROUND
    if want_format == "pickle":
        # sklearn's trees: each tree's nodes array (15 nodes x 64 bytes) is a buffer
        assert sum(p["dtype"] == "buffer" for p in parts) >= trees
    else:
        assert [p["name"] for p in parts] == [f"tree.{i}" for i in range(trees)]

    diff = cli(ckptfs_bin, "diff", str(saves[-2][0]), str(saves[-1][0]))
    counts = diff["counts"]
    if want_format == "pickle":
        assert diff["unit"] == "buffers"
        # pairs buffers by their bytes: the new trees' arrays are added, the
        # old trees' the same; train_score_ grows (one removed, one added)
        assert counts.get("added", 0) >= TREES_PER_ROUND, counts
        assert counts.get("same", 0) >= trees - TREES_PER_ROUND and counts.get("removed", 0) <= 2, counts
    else:
        assert diff["unit"] == "trees"
        assert counts == {"same": trees - TREES_PER_ROUND, "added": TREES_PER_ROUND}, counts
