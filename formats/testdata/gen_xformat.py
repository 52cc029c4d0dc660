"""Regenerates xformat.pt and xformat.safetensors: one state dict saved by
torch.save and by safetensors' save_file (issue #26: the same tensors must
give the same chunks in both). TestChunkerSameTensorsAcrossFormats cuts both.

Run with a Python that has torch and safetensors (the committed files were
made with torch 2.15.0 and safetensors 0.8.0 from test/e2e/setup_venv.sh):

    python3 gen_xformat.py

Tensor sizes straddle the chunker's thresholds (4 KiB: own chunks; 12 KiB:
edge chunks); both files stay under 70 KB.
"""
import torch
from safetensors.torch import save_file

g = torch.Generator().manual_seed(26)
sd = {
    "layer.0.weight": torch.randn(64, 80, generator=g),  # 20480 B
    "layer.0.bias": torch.randn(80, generator=g),  # 320 B
    "layer.1.weight": torch.randn(3073, generator=g),  # 12292 B: edges + 4
    "layer.1.bias": torch.randn(1024, generator=g),  # 4096 B: the smallest own chunk
    "layer.2.weight": torch.randn(1025, generator=g),  # 4100 B
    "layer.2.bias": torch.randn(1023, generator=g),  # 4092 B: cut with its neighbours
    "embed.weight": torch.randn(100, 100, generator=g).to(torch.bfloat16),  # 20000 B
    "step": torch.tensor(7.0),
}
torch.save(sd, "xformat.pt")
save_file(sd, "xformat.safetensors", metadata={"format": "pt"})
