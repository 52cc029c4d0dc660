"""make bench-delta, mount level: the workload of workload.py saved into two
ckptfs mounts side by side in one training run (OUT and --also), one storing
deltas (the default) and one without (--delta-keyframe 1). Prints, per kind of
file (bf16 and fp32 save_pretrained, torch.save of model + optimizer), stored
÷ logical as `ckptfs du` reports what deleting them would free, the time the
saves took in each mount, and the cold sequential read of every file of the
last 10 saves (daemons restarted, page cache dropped) in each:

    MOUNT bf16 delta 0.337 standalone 0.661
    MOUNT-SAVE-S delta 12.3 standalone 11.9
    MOUNT-COLD-READ-S delta 2.1 standalone 1.6 ratio 1.31

Needs root (mount, drop_caches) and the e2e venv's python."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench import Daemon, drop_caches  # noqa: E402


def read_all(paths):
    buf = bytearray(4 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--save-from", type=int, default=200)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="ckptfs-delta-mount."))
    d = Daemon(Path(a.bin), root / "store-delta", root / "mnt-delta", "256MiB", None)
    n = Daemon(Path(a.bin), root / "store-standalone", root / "mnt-standalone", "256MiB", None,
               extra=["--delta-keyframe", "1"])
    d.start()
    n.start()
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).parent / "workload.py"), str(d.mnt / "run"),
                              "--steps", str(a.steps), "--save-from", str(a.save_from), "--full",
                              "--threads", "1", "--also", str(n.mnt / "run")],
                             check=True, capture_output=True, text=True).stdout
        w = json.loads(next(l for l in out.splitlines() if l.startswith("WORKLOAD "))[len("WORKLOAD "):])
        drained = {name: m.settle() for name, m in (("delta", d), ("standalone", n))}
        steps = sorted(p.name for p in (d.mnt / "run").iterdir())
        for kind in ("bf16", "fp32", "full.pt"):
            ratios = {}
            for name, m in (("delta", d), ("standalone", n)):
                paths = [str(m.mnt / "run" / s / kind) for s in steps]
                t = json.loads(subprocess.run([a.bin, "du", "--json", *paths], check=True,
                                              capture_output=True, text=True).stdout)["total"]
                ratios[name] = t["frees_stored_bytes"] / t["logical_bytes"]
            print(f"MOUNT {kind} delta {ratios['delta']:.3f} standalone {ratios['standalone']:.3f}", flush=True)
        print(f"MOUNT-SAVE-S delta {w['save_seconds'][0]:.1f} standalone {w['save_seconds'][1]:.1f} "
              f"(re-encode queue drained {drained['delta']:.1f} / {drained['standalone']:.1f} s after the run)")
        print(f"MOUNT-DELTAS {d.stats()['delta_chunks']} delta chunks")
        took = {}
        for name, m in (("delta", d), ("standalone", n)):
            m.restart()
        for name, m in (("delta", d), ("standalone", n)):
            files = [p for s in steps[-10:] for p in sorted((m.mnt / "run" / s).rglob("*")) if p.is_file()]
            drop_caches()
            t0 = time.monotonic()
            read_all(files)
            took[name] = time.monotonic() - t0
        print(f"MOUNT-COLD-READ-S delta {took['delta']:.2f} standalone {took['standalone']:.2f} "
              f"ratio {took['delta'] / took['standalone']:.2f}")
    finally:
        d.stop(check=False)
        n.stop(check=False)
        if a.dir is None:
            subprocess.run(["rm", "-rf", str(root)])


if __name__ == "__main__":
    main()
