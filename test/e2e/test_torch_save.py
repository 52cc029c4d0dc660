"""torch.save / torch.load on the mount: state dicts, whole modules, optimizer
state; each loaded plainly, with weights_only=True where torch allows it, and
with mmap=True (the pages then come from the daemon lazily)."""

import pytest
import torch

from helpers import assert_same, clone_tree


def make_state_dict(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1024, 1024, generator=g)  # 4 MiB: several chunks
    sd = {
        "w": w,
        "b": torch.randn(1024, generator=g),
        "half": torch.randn(333, 77, generator=g).half(),
        "bf16": torch.randn(2048, 300, generator=g).bfloat16(),
        "f64": torch.randn(5, 7, generator=g, dtype=torch.float64),
        "ids": torch.randint(-2**40, 2**40, (4096,), generator=g),
        "i8": torch.randint(-128, 127, (1000,), generator=g, dtype=torch.int8),
        "mask": torch.rand(1000, generator=g) > 0.5,
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
        "neg_zero_nan": torch.tensor([-0.0, 0.0, float("nan"), float("inf")]),
        "w_t": w.t(),  # a non-contiguous view sharing w's storage
        "w_rows": w[100:200],  # a view at an offset into w's storage
        "nested": {"step": 7, "lr": 1e-3, "names": ["a", "b"], "t": torch.arange(10)},
    }
    return sd


def load_all_ways(path, weights_only_ok: bool):
    """(label, loaded) for every way of loading path."""
    ways = [("plain", torch.load(path, weights_only=False))]
    if weights_only_ok:
        ways.append(("weights_only", torch.load(path, weights_only=True)))
    ways.append(("mmap", torch.load(path, mmap=True, weights_only=weights_only_ok)))
    return ways


def test_state_dict(run_dir):
    sd = make_state_dict()
    path = run_dir / "model.pt"
    torch.save(sd, path)
    for label, loaded in load_all_ways(path, weights_only_ok=True):
        assert_same(sd, loaded, label)
        # Views keep sharing one storage after the round trip.
        assert loaded["w_t"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr(), label
        assert torch.equal(loaded["w_t"].t(), loaded["w"]), label
    del loaded


def test_whole_module(run_dir):
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Embedding(500, 64),
        torch.nn.LayerNorm(64),
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 64),
    )
    model[1].weight.data.uniform_()  # not the default ones, so a lost tensor shows
    path = run_dir / "module.pt"
    torch.save(model, path)
    x = torch.randint(0, 500, (3, 11))
    want = model(x)
    # A pickled nn.Module is not loadable with weights_only=True: plain and mmap only.
    for label, loaded in load_all_ways(path, weights_only_ok=False):
        assert type(loaded) is type(model), label
        assert_same(model.state_dict(), loaded.state_dict(), label)
        assert torch.equal(loaded(x), want), label


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW"])
def test_optimizer_state(run_dir, opt_name):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = getattr(torch.optim, opt_name)(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(32, 256)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    saved = clone_tree(opt.state_dict())
    assert saved["state"], "optimizer has no state after 3 steps"
    path = run_dir / "optimizer.pt"
    torch.save(opt.state_dict(), path)
    for label, loaded in load_all_ways(path, weights_only_ok=True):
        assert_same(saved, loaded, label)
    # The loaded state drives an identical next step.
    twin = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    twin.load_state_dict(model.state_dict())
    twin_opt = getattr(torch.optim, opt_name)(twin.parameters(), lr=1e-3)
    twin_opt.load_state_dict(torch.load(path, mmap=True, weights_only=True))
    x = torch.randn(32, 256)
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    assert_same(model.state_dict(), twin.state_dict(), "after one more step")
