"""GELU bandwidth on the GPU: nvrtc_engine vs device copy and PyTorch eager.

    python bench/gelu_bandwidth.py [--tokens 16384] [--hidden 8192]

Measures, in one run, at tokens x hidden (default 16384 x 8192, bf16 input):
  - device copy bandwidth (torch copy_ of 1 GiB, bytes read + written),
  - GELU bf16->fp8_e4m3 (tensor scaling: amax, scale_inv) and bf16->bf16 (launch
    configurations: see bench/activation_tuning.py),
  - PyTorch eager doing the same math (gelu, then amax and a saturating FP8 cast).
Host overhead per launch is measured by bench/launch_overhead.py.
GB/s counts each tensor read or written once. Writes bench/results/gelu_bandwidth.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def bench_bandwidth(tokens: int, hidden: int) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import nvrtc_engine as ne

    n = tokens * hidden
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    scale = torch.full((1,), 2.0, device="cuda")
    amax = torch.zeros(1, device="cuda")
    scale_inv = torch.empty(1, device="cuda")
    y8 = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device="cuda")
    y16 = torch.empty_like(x)
    rows = []

    def add(name, impl, out_bytes, fn):
        ms = common.cuda_time_ms(fn)
        rows.append(
            {
                "case": name,
                "impl": impl,
                "ms": ms,
                "gbps": (2 * n + out_bytes * n) / (ms * 1e-3) / 1e9,
            }
        )

    k8 = ne.get_kernel("gelu", dtype="fp8")
    k16 = ne.get_kernel("gelu", dtype="bf16")
    add(
        "gelu bf16->fp8_e4m3",
        "nvrtc_engine",
        1,
        lambda: k8(x, y8, scale=scale, amax=amax, scale_inv=scale_inv),
    )
    add("gelu bf16->bf16", "nvrtc_engine", 2, lambda: k16(x, y16))

    def torch_fp8():
        y = F.gelu(x, approximate="tanh")
        amax.copy_(torch.maximum(amax, y.abs().amax().float()))
        y8.copy_((y.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
        scale_inv.copy_(scale.reciprocal())

    add("gelu bf16->fp8_e4m3", "torch eager", 1, torch_fp8)
    add("gelu bf16->bf16", "torch eager", 2, lambda: F.gelu(x, approximate="tanh"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=8192)
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    rows = bench_bandwidth(args.tokens, args.hidden)
    for r in rows:
        r["pct_of_copy"] = 100.0 * r["gbps"] / copy
    path = common.write_results("gelu_bandwidth", {
        **common.gpu_info(), "shape": [args.tokens, args.hidden], "copy_gbps": copy,
        "kernels": rows,
    })  # fmt: skip
    print(f"device copy: {copy:.0f} GB/s   shape {args.tokens}x{args.hidden} bf16 input")
    print(common.table(rows, [("case", "case", ""), ("impl", "implementation", ""),
                              ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"),
                              ("pct_of_copy", "% of copy", ".1f")]))  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
