#!/usr/bin/env python3
"""A reproducible training run whose checkpoints exercise delta coding (issue #15).

Trains a tiny transformers GPT-2 on a synthetic language on CPU with AdamW and,
every SAVE_EVERY steps, writes into OUT/step-NNNNN/:

    bf16/   save_pretrained of the weights rounded to bf16 (model.safetensors)
    fp32/   save_pretrained of the fp32 weights (model.safetensors)
    full.pt torch.save({"model": state_dict, "optim": optimizer.state_dict()})
            (only with --full)

OUT is normally a directory on a ckptfs mount. Everything is seeded, so two runs
with the same arguments on the same torch build write the same bytes.

The synthetic language (Zipfian unigrams, a few sparse successors per token,
some noise) and the optimizer settings (AdamW beta=(0.9, 0.95), weight decay
0.1, clipping 1.0, warm-up then cosine) follow notes/remote-and-delta.md part B,
so the relative change between saves (what decides the delta ratio) is that of
an ordinary run, not of an artificially slow one.

    python test/delta/workload.py OUT                          # 200 steps from init, save every 10
    python test/delta/workload.py OUT --steps 400 --save-from 200    # CI: 20 saves in the second half
    python test/delta/workload.py OUT --steps 400 --save-from 200 --full  # + model and optimizer

It prints one line per save and, at the end, a JSON summary line
("WORKLOAD {...}") with the saved directories and the wall time.
"""

import argparse
import json
import math
import os
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--save-from", type=int, default=0,
                    help="first save after this step (train this many steps unsaved first)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--full", action="store_true", help="also torch.save model + optimizer state")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--also", help="save every checkpoint into this directory too (a reference copy)")
    a = ap.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    # Synthetic language: token t is followed by one of its 32 successors
    # succ[t] (drawn from a Zipf unigram distribution), or by a uniformly
    # random token with probability 0.1.
    ranks = torch.arange(1, a.vocab + 1, dtype=torch.float64)
    unigram = (1.0 / ranks) / (1.0 / ranks).sum()
    succ = torch.multinomial(unigram, a.vocab * 32, replacement=True, generator=gen).view(a.vocab, 32)

    def batch():
        x = torch.empty(a.batch, a.ctx, dtype=torch.long)
        x[:, 0] = torch.multinomial(unigram, a.batch, replacement=True, generator=gen)
        for i in range(1, a.ctx):
            pick = succ[x[:, i - 1], torch.randint(0, 32, (a.batch,), generator=gen)]
            noise = torch.rand(a.batch, generator=gen) < 0.1
            rnd = torch.randint(0, a.vocab, (a.batch,), generator=gen)
            x[:, i] = torch.where(noise, rnd, pick)
        return x

    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.ctx, n_embd=a.embd,
                     n_layer=a.layers, n_head=a.heads)
    model = GPT2LMHeadModel(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        p = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    dtypes = [d for d in a.dtypes.split(",") if d]
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    saved = []
    save_seconds = [0.0, 0.0]  # time spent saving into OUT, and into --also
    model.train()
    for step in range(1, a.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        x = batch()
        loss = model(input_ids=x, labels=x).loss  # the model shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step > a.save_from and step % a.save_every == 0:
            for i, root in enumerate([a.out] + ([a.also] if a.also else [])):
                ts = time.time()
                d = os.path.join(root, f"step-{step:05d}")
                os.makedirs(d, exist_ok=True)
                if "fp32" in dtypes:
                    model.save_pretrained(os.path.join(d, "fp32"))
                if "bf16" in dtypes:
                    # A bf16 export: the fp32 master weights rounded to nearest
                    # even. model.to() would round the master weights too.
                    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
                    model.save_pretrained(os.path.join(d, "bf16"), state_dict=sd)
                if a.full:
                    torch.save({"step": step, "model": model.state_dict(),
                                "optim": opt.state_dict()}, os.path.join(d, "full.pt"))
                save_seconds[i] += time.time() - ts
            saved.append(os.path.join(a.out, f"step-{step:05d}"))
            print(f"step {step} loss {loss.item():.4f} saved {d} ({time.time() - t0:.1f}s)", flush=True)
    print("WORKLOAD " + json.dumps({"saved": saved, "seconds": round(time.time() - t0, 1),
                                    "steps": a.steps, "save_every": a.save_every,
                                    "save_seconds": [round(x, 2) for x in save_seconds]}), flush=True)


if __name__ == "__main__":
    main()
