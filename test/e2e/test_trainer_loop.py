"""A Trainer-like loop: a checkpoint-N/ directory every step, written with the
real save calls HF Trainer uses (save_pretrained, torch.save of optimizer,
scheduler and RNG state, TrainerState.save_to_json), rotated to the last two with
shutil.rmtree. The survivors must load bit for bit and resume training exactly;
the rotated-out directories must be gone, also after a remount."""

import json
import os
import shutil

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerState

from helpers import assert_same, clone_tree

STEPS = 6
KEEP = 2


def make_run(seed: int = 0):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def train_step(model, opt, sched, step: int) -> float:
    torch.manual_seed(step)  # dropout: a resumed run draws the same masks
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 1000, (4, 32), generator=g)
    loss = model(input_ids=x, labels=x).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def save_checkpoint(d, model, opt, sched, state: TrainerState) -> None:
    os.makedirs(d)
    model.save_pretrained(d)
    torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
    torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
    torch.save({"cpu": torch.get_rng_state()}, os.path.join(d, "rng_state.pth"))
    state.save_to_json(os.path.join(d, "trainer_state.json"))


def rotate(run_dir, keep: int) -> list:
    ckpts = sorted((p for p in run_dir.iterdir() if p.name.startswith("checkpoint-")),
                   key=lambda p: int(p.name.split("-")[1]))
    for p in ckpts[:-keep]:
        shutil.rmtree(p)
    return [p.name for p in ckpts[:-keep]]


def test_checkpoint_rotation(ckptfs, run_dir):
    model, opt, sched = make_run()
    model.train()
    state = TrainerState(max_steps=STEPS, save_steps=1, logging_steps=1)
    snapshots = {}
    deleted = []
    for step in range(1, STEPS + 1):
        loss = train_step(model, opt, sched, step)
        state.global_step = step
        state.log_history.append({"loss": loss, "step": step})
        d = run_dir / f"checkpoint-{step}"
        save_checkpoint(d, model, opt, sched, state)
        snapshots[step] = {
            "model": clone_tree(model.state_dict()),
            "optimizer": clone_tree(opt.state_dict()),
            "scheduler": clone_tree(sched.state_dict()),
            "log_history": [dict(h) for h in state.log_history],
        }
        deleted += rotate(run_dir, KEEP)

    survivors = [f"checkpoint-{s}" for s in range(STEPS - KEEP + 1, STEPS + 1)]
    gone = [f"checkpoint-{s}" for s in range(1, STEPS - KEEP + 1)]
    assert sorted(deleted) == sorted(gone)

    def verify():
        assert sorted(os.listdir(run_dir)) == sorted(survivors)
        for name in gone:
            assert not (run_dir / name).exists(), name
        for name in survivors:
            step = int(name.split("-")[1])
            d = run_dir / name
            snap = snapshots[step]
            loaded = GPT2LMHeadModel.from_pretrained(d, local_files_only=True)
            assert_same(snap["model"], loaded.state_dict(), f"{name} model")
            assert_same(snap["optimizer"], torch.load(d / "optimizer.pt", weights_only=True), f"{name} optimizer")
            assert_same(snap["scheduler"], torch.load(d / "scheduler.pt", weights_only=False), f"{name} scheduler")
            assert isinstance(torch.load(d / "rng_state.pth", weights_only=True)["cpu"], torch.Tensor)
            ts = TrainerState.load_from_json(str(d / "trainer_state.json"))
            assert ts.global_step == step
            assert ts.log_history == snap["log_history"]

    verify()

    # Resuming from the last checkpoint gives the same next step as the live run.
    last = run_dir / survivors[-1]
    r_model, r_opt, r_sched = make_run(seed=99)  # different init: everything must come from disk
    r_model = GPT2LMHeadModel.from_pretrained(last, local_files_only=True)
    r_opt = torch.optim.AdamW(r_model.parameters(), lr=1e-3)
    r_sched = torch.optim.lr_scheduler.LambdaLR(r_opt, lambda s: 1.0 / (1 + s))
    r_opt.load_state_dict(torch.load(last / "optimizer.pt", mmap=True, weights_only=True))
    r_sched.load_state_dict(torch.load(last / "scheduler.pt", weights_only=False))
    r_model.train()
    assert train_step(r_model, r_opt, r_sched, STEPS + 1) == train_step(model, opt, sched, STEPS + 1)
    assert_same(model.state_dict(), r_model.state_dict(), "resumed")

    # Everything holds after a remount (cold caches, state from the catalog).
    del r_model, r_opt, r_sched
    ckptfs.restart()
    verify()
