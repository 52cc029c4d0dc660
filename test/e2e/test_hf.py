"""transformers save_pretrained / from_pretrained on the mount, single file and
sharded (model-0000i-of-0000N.safetensors + model.safetensors.index.json). The
model is built from a config with random weights: nothing comes from the hub
(conftest sets HF_HUB_OFFLINE=1)."""

import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import assert_same


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
    return GPT2LMHeadModel(cfg).eval()


def check_round_trip(model: GPT2LMHeadModel, d) -> None:
    loaded = GPT2LMHeadModel.from_pretrained(d, local_files_only=True).eval()
    assert loaded.config.to_dict()["n_embd"] == 64
    assert_same(model.state_dict(), loaded.state_dict())
    x = torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)


def test_save_pretrained_single(run_dir):
    model = tiny_gpt2()
    model.save_pretrained(run_dir)
    names = sorted(p.name for p in run_dir.iterdir())
    assert "model.safetensors" in names and "config.json" in names, names
    assert not [n for n in names if n.startswith(".tmp")], names
    check_round_trip(model, run_dir)


def test_save_pretrained_sharded(run_dir):
    model = tiny_gpt2(1)
    model.save_pretrained(run_dir, max_shard_size="150KB")
    names = sorted(p.name for p in run_dir.iterdir())
    shards = [n for n in names if n.startswith("model-") and n.endswith(".safetensors")]
    assert len(shards) >= 3, names
    assert "model.safetensors.index.json" in names and "model.safetensors" not in names, names
    index = json.loads((run_dir / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    check_round_trip(model, run_dir)

    # Saving again (new weights, fewer shards) removes the stale shards.
    model2 = tiny_gpt2(2)
    model2.save_pretrained(run_dir, max_shard_size="400KB")
    index = json.loads((run_dir / "model.safetensors.index.json").read_text())
    now = sorted(p.name for p in run_dir.glob("model-*.safetensors"))
    assert now == sorted(set(index["weight_map"].values())), (now, index["weight_map"])
    check_round_trip(model2, run_dir)
