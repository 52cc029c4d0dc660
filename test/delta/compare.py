#!/usr/bin/env python3
"""ZipNN beside ckptfs's delta codec on test/delta/workload.py's checkpoints.

For every kind of file in DIR/step-*/ (bf16/model.safetensors,
fp32/model.safetensors, full.pt) prints ZipNN's stored ÷ logical ratio:
standalone (every save compressed alone), "chain" (every save XOR-delta
against the previous, ZipNN's delta mode) and "keyframe 5" (every 5th save
alone, the others against it), the same schemes the Go benchmark
(BenchmarkDeltaWorkload in package cas/object) reports for ckptfs.

    python test/delta/compare.py DIR
"""

import glob
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        import zipnn
    except ImportError:
        sys.exit("zipnn is not installed (pip install zipnn==0.5.4, pinned in test/e2e/requirements.txt)")
    steps = sorted(glob.glob(os.path.join(sys.argv[1], "step-*")))
    for kind, dtype in (("bf16/model.safetensors", "bfloat16"), ("fp32/model.safetensors", "float32"),
                        ("full.pt", "float32")):
        paths = [os.path.join(s, kind) for s in steps if os.path.exists(os.path.join(s, kind))]
        if len(paths) < 2:
            continue
        data = [open(p, "rb").read() for p in paths]
        logical = sum(len(d) for d in data)
        alone = zipnn.ZipNN(bytearray_dtype=dtype, threads=1)
        delta = zipnn.ZipNN(bytearray_dtype=dtype, threads=1, delta_compressed_type="byte")
        size_alone = [len(alone.compress(d)) for d in data]
        size_chain = [size_alone[0]] + [len(delta.compress(data[i], delta_second_data=data[i - 1]))
                                        for i in range(1, len(data))]
        size_kf = []
        for i, d in enumerate(data):
            if i % 5 == 0:
                size_kf.append(size_alone[i])
            else:
                size_kf.append(len(delta.compress(d, delta_second_data=data[i - i % 5])))
        # check one delta decodes (ZipNN's own round trip)
        back = delta.decompress(delta.compress(data[1], delta_second_data=data[0]), delta_second_data=data[0])
        assert bytes(back) == data[1], "ZipNN delta round trip differs"
        print(f"ZIPNN {kind:24s} saves {len(data):2d}  logical {logical / 1e6:6.1f} MB  "
              f"none {sum(size_alone) / logical:.3f}  chain {sum(size_chain) / logical:.3f}  "
              f"keyframe 5 {sum(size_kf) / logical:.3f}", flush=True)


if __name__ == "__main__":
    main()
