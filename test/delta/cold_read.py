"""Issue #15's read target through a mount: the cold sequential read of a
delta-coded file against the same file stored without deltas, for one or more
ckptfs binaries side by side (say main's and a branch's):

    python test/delta/cold_read.py --bin /tmp/ckptfs-main --bin bin/ckptfs

For each binary, two mounts (deltas, and --delta-keyframe 1) receive the same
three consecutive bf16 checkpoints (bench.py's model_steps: every weight moved
by about 1% of its magnitude) in step directories; the second is stored as
deltas against the first in the one mount (once the third is committed: the
latest stays whole). Then, --repeat rounds going
through the binaries in turn: both daemons of the binary restart (empty chunk
cache), the page cache is dropped, and the second file is read sequentially
from each mount, the two in alternating order. Reported per binary: medians of the wall time and of the daemon's CPU time (utime + stime
from /proc; what the other processes of a shared machine disturb least), and
the delta ÷ standalone ratios:

    COLD-READ /tmp/ckptfs-main wall delta 3.10 standalone 1.20 ratio 2.58 cpu delta 4.0 standalone 1.5 ratio 2.67

Needs root (mount, drop_caches) and the e2e venv's python (numpy)."""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench import Daemon, cpu_seconds, drop_caches, model_steps, read_all, save  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="a ckptfs binary (repeatable)")
    ap.add_argument("--size-mib", type=int, default=1024, help="size of each checkpoint")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="ckptfs-cold-read.", dir="/var/tmp"))
    n_tensors = 64
    # Three saves: the second is read. It is stored as deltas once the third
    # is committed; the third, the latest, stays whole (--delta-latest whole).
    saves = model_steps(15, n_tensors, a.size_mib * (1 << 20) // n_tensors, n=3)
    mounts = []  # per binary: (binary, delta daemon, standalone daemon)
    try:
        for bi, binary in enumerate(a.bin):
            d = Daemon(Path(binary), root / f"{bi}-delta" / "store", root / f"{bi}-delta" / "mnt", "256MiB", None)
            n = Daemon(Path(binary), root / f"{bi}-standalone" / "store", root / f"{bi}-standalone" / "mnt", "256MiB",
                       None, extra=["--delta-keyframe", "1"])
            mounts.append((binary, d, n))
            for m in (d, n):
                m.start()
                for step, sd in zip(("0001", "0002", "0003"), saves):
                    (m.mnt / "run" / step).mkdir(parents=True, exist_ok=True)
                    save(sd, m.mnt / "run" / step / "model.safetensors", fsync=False)
                m.settle()
            if d.stats()["delta_chunks"] == 0 or n.stats()["delta_chunks"] != 0:
                raise SystemExit(f"{binary}: {d.stats()['delta_chunks']} delta chunks with deltas, "
                                 f"{n.stats()['delta_chunks']} without")
        # Rounds go through the binaries in turn (rotating who is first), so
        # that the machine's other load falls on all of them alike.
        wall = [{"delta": [], "standalone": []} for _ in mounts]
        cpu = [{"delta": [], "standalone": []} for _ in mounts]
        for r in range(a.repeat):
            for j in range(len(mounts)):
                bi = (j + r) % len(mounts)
                _, d, n = mounts[bi]
                d.restart()
                n.restart()
                order = [("delta", d), ("standalone", n)]
                if (r + j) % 2:
                    order.reverse()
                for name, m in order:
                    drop_caches()
                    c0, t0 = cpu_seconds(m.proc.pid), time.monotonic()
                    read_all(m.mnt / "run" / "0002" / "model.safetensors")
                    wall[bi][name].append(time.monotonic() - t0)
                    cpu[bi][name].append(cpu_seconds(m.proc.pid) - c0)
        results = []
        for bi, (binary, d, _) in enumerate(mounts):
            w = {k: statistics.median(v) for k, v in wall[bi].items()}
            c = {k: statistics.median(v) for k, v in cpu[bi].items()}
            line = (f"COLD-READ {binary} {a.size_mib} MiB, {d.stats()['delta_chunks']} delta chunks: "
                    f"wall delta {w['delta']:.2f} standalone {w['standalone']:.2f} ratio {w['delta'] / w['standalone']:.2f} "
                    f"cpu delta {c['delta']:.2f} standalone {c['standalone']:.2f} ratio {c['delta'] / c['standalone']:.2f} "
                    f"(all wall {wall[bi]}, cpu {cpu[bi]})")
            print(line, flush=True)
            results.append(line)
    finally:
        for _, d, n in mounts:
            for m in (d, n):
                if m.proc is not None:
                    m.stop(check=False)
        if a.dir is None:
            subprocess.run(["rm", "-rf", str(root)])
    for line in results:
        print(line.split(" (all")[0])


if __name__ == "__main__":
    main()
