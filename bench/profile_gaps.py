"""Launch, once each, the kernels whose bandwidth targets are still missed, for a
hardware-counter profile of exactly those launches:

    ncu --clock-control none --set full --csv --page details \\
        python bench/profile_gaps.py [--cases ln_bwd_14336,ct_dbias] > gaps.csv

Cases (bf16 input): norm backward at H = 4096, 8192, 14336 (16384 rows) and 65536 (2048 rows),
norm forward to FP8 (tensor scaling) at H = 4096, 8192, 14336 and 65536 and to bf16 at 4096
and 65536,
cast_transpose_dbias (and _dgelu) to FP8 at 8192 x 28672. Every kernel is compiled and its
inputs made before the first launch, so the profile holds one launch of each case's kernels
(the backward's partial-sum finalize kernel included). `--list` prints the cases.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def _cases(torch: Any, ne: Any) -> dict[str, Callable[[], Callable[[], Any]]]:
    dev = "cuda"
    bf16 = torch.bfloat16 if torch is not None else None

    def tensor_scaling() -> dict[str, Any]:
        return {"scale": torch.full((1,), 2.0, device=dev), "amax": torch.zeros(1, device=dev),
                "scale_inv": torch.empty(1, device=dev)}  # fmt: skip

    def norm_bwd(norm: str, n: int, h: int) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            k = ne.get_kernel(f"{norm}_bwd", in_dtype="bf16", hidden_size=h)
            x, dz = torch.randn(n, h, device=dev).to(bf16), torch.randn(n, h, device=dev).to(bf16)
            g = torch.rand(h, device=dev).to(bf16)
            mu, rs = x.float().mean(1), torch.rsqrt(x.float().var(1, unbiased=False) + 1e-5)
            if norm == "layernorm":
                return lambda: k(dz, x, mu, rs, g)
            return lambda: k(dz, x, rs, g)

        return make

    def norm_fwd(norm: str, n: int, h: int, out: str) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            k = ne.get_kernel(f"{norm}_fwd", in_dtype="bf16", out_dtype=out, hidden_size=h)
            x = torch.randn(n, h, device=dev).to(bf16)
            g, b = torch.rand(h, device=dev).to(bf16), torch.rand(h, device=dev).to(bf16)
            extra = tensor_scaling() if out == "fp8" else {}
            if norm == "layernorm":
                return lambda: k(x, g, b, 1e-5, **extra)
            return lambda: k(x, g, 1e-5, **extra)

        return make

    def ct_dbias(op: str, m: int, k_: int) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            k = ne.get_kernel(op, dtype="fp8")
            x = torch.randn(m, k_, device=dev).to(bf16)
            extra = tensor_scaling()
            if op.endswith("dgelu"):
                a = torch.randn(m, k_, device=dev).to(bf16)
                return lambda: k(x, a, **extra)
            return lambda: k(x, **extra)

        return make

    cases: dict[str, Callable[[], Callable[[], Any]]] = {}
    for norm, short in (("layernorm", "ln"), ("rmsnorm", "rms")):
        for h in (4096, 8192, 14336):
            cases[f"{short}_bwd_{h}"] = norm_bwd(norm, 16384, h)
        cases[f"{short}_bwd_65536"] = norm_bwd(norm, 2048, 65536)
        for h in (4096, 8192, 14336):
            cases[f"{short}_fwd_fp8_{h}"] = norm_fwd(norm, 16384, h, "fp8")
        cases[f"{short}_fwd_fp8_65536"] = norm_fwd(norm, 2048, 65536, "fp8")
        cases[f"{short}_fwd_4096"] = norm_fwd(norm, 16384, 4096, "bf16")
        cases[f"{short}_fwd_65536"] = norm_fwd(norm, 2048, 65536, "bf16")
    cases["ct_dbias"] = ct_dbias("cast_transpose_dbias", 8192, 28672)
    cases["ct_dbias_dgelu"] = ct_dbias("cast_transpose_dbias_dgelu", 8192, 28672)
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(_cases(None, None)))
        return 0
    import torch

    import nvrtc_engine as ne

    cases = _cases(torch, ne)
    names = [c for c in args.cases.split(",") if c] or list(cases)
    unknown = [c for c in names if c not in cases]
    if unknown:
        parser.error(f"unknown cases {unknown}; --list prints them")
    calls = [(name, cases[name]()) for name in names]
    torch.cuda.synchronize()
    for name, call in calls:
        print(f"profile_gaps: {name}", file=sys.stderr)
        call()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
