"""Issue #15's done-when, on a mount: the workload of test/delta/workload.py (a
tiny GPT-2 trained with AdamW, weights saved with save_pretrained in bf16 and
fp32, 20 saves 10 steps apart) written into a fresh ckptfs mount.

- Every file reads back byte-exact (against a copy the same process saved to a
  plain directory), before and after a remount (cold: the daemon's cache is
  empty and the kernel's page cache dropped).
- Once the background re-encoder has drained its queue, the store holds the
  weights at stored / logical <= 0.45 (bf16) and <= 0.75 (fp32), as `ckptfs
  du` reports what deleting each kind would free; and it holds deltas.
- After deleting the first half of the steps, gc frees space, the other half
  still reads back byte-exact and `fsck --read-data` is clean (GC keeps every
  base a remaining delta needs)."""

import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

from conftest import REPO

BAR = {"bf16": 0.45, "fp32": 0.75}


def _ckptfs(bin_path, *args, timeout=600):
    p = subprocess.run([str(bin_path), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def _drain(d, timeout=900):
    """Waits until the re-encode queue is empty; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        st = d.stats()
        if st["reencode_pending"] == 0:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"re-encode queue not drained after {timeout}s: {st}"
        time.sleep(1)


def _same_files(run, ref, steps):
    n = 0
    for st in steps:
        for kind in ("bf16", "fp32"):
            a, b = run / st / kind, ref / st / kind
            names = sorted(os.listdir(b))
            assert sorted(os.listdir(a)) == names, f"{st}/{kind}"
            for name in names:
                assert filecmp.cmp(a / name, b / name, shallow=False), f"{st}/{kind}/{name} differs from the reference"
                n += 1
    return n


def _drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def test_delta_workload(daemon_factory, ckptfs_bin, tmp_path, record):
    d = daemon_factory("delta")
    run, ref = d.mnt / "run", tmp_path / "ref"
    run.mkdir()
    p = subprocess.run([sys.executable, str(REPO / "test" / "delta" / "workload.py"), str(run),
                        "--steps", "400", "--save-from", "200", "--save-every", "10",
                        "--threads", "1", "--also", str(ref)],
                       capture_output=True, text=True, timeout=1800, cwd="/")
    assert p.returncode == 0, f"workload failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    steps = sorted(x.name for x in run.iterdir())
    assert len(steps) == 20, steps
    record("delta workload files byte-exact (as written)", _same_files(run, ref, steps))

    record("delta re-encode queue drained after the workload (s)", round(_drain(d), 1))
    st = d.stats()
    assert st["delta_chunks"] > 0, st
    assert st["format_version"] >= 3, st  # deltas; packs of small chunks take it to 6
    for kind, bar in BAR.items():
        code, out, err = _ckptfs(ckptfs_bin, "du", "--json", *[run / s / kind for s in steps])
        assert code == 0, err
        t = json.loads(out)["total"]
        ratio = t["frees_stored_bytes"] / t["logical_bytes"]
        record(f"delta workload {kind} stored/logical (20 saves, keyframe 5)", f"{ratio:.3f} (bar {bar})")
        assert ratio <= bar, f"{kind}: stored/logical {ratio:.3f} > {bar}: {t}"

    d.restart()
    _drop_caches()
    t0 = time.monotonic()
    record("delta workload files byte-exact (cold, after a remount)", _same_files(run, ref, steps))
    record("delta workload cold compare of 40 dirs (s)", round(time.monotonic() - t0, 1))

    before = d.stats()["stored_bytes"]
    for s in steps[:10]:
        shutil.rmtree(run / s)
    code, out, err = _ckptfs(ckptfs_bin, "gc", "--grace", "0", "--json", d.mnt)
    assert code == 0, out + err
    after = d.stats()
    assert after["stored_bytes"] < before, (before, after)
    record("delta workload gc after deleting 10 of 20 steps: stored MiB before/after",
           f"{before / 2**20:.1f} / {after['stored_bytes'] / 2**20:.1f}")
    d.restart()
    _drop_caches()
    n = _same_files(run, ref, steps[10:])
    assert n >= 20, n  # at least the two model files of each remaining step
    code, out, err = _ckptfs(ckptfs_bin, "fsck", "--read-data", d.mnt)
    assert code == 0, f"fsck after gc:\n{out}\n{err}"
    record("delta workload after gc: files byte-exact, fsck --read-data clean", n)
