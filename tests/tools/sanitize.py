"""Launch each family's kernels once on small, awkward shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck --report-api-errors no python3 tests/tools/sanitize.py
    compute-sanitizer --tool racecheck --report-api-errors no python3 tests/tools/sanitize.py

(``--report-api-errors no``: cuda.bindings probes driver entry points that an older driver
lacks, which is not a fault.) ``--list`` prints the case names; ``--case SUBSTRING`` runs only
the matching cases (a process per case isolates a fault). bench/run_all.sh runs both tools.

Activations: the flat kernel (GELU over dtype pairs, lengths that leave a scalar tail, an
unaligned start), the row-flat kernel (gated and dgated ops, MXFP8 rowwise) and the tiled one
(MXFP8 columnwise and both, partial tiles), each also with a grid of 3 blocks that loop over
the rest (``activation.MAX_GRID``, which a launch plans with; no code changes). Norms:
LayerNorm and RMSNorm forward (bf16, FP8 tensor scaling, MXFP8) and backward, specialized (the
tuned layouts at sm_90 included) and general, with odd hidden sizes, rows that do not fill a
CTA and rows that wrap a staged kernel's stages. Cast family: cast (aligned and at an odd
offset), transpose, cast_transpose (+ dbias, + dgelu, gated dswiglu), multi_cast_transpose and
MXFP8/NVFP4 quantize in every layout, on shapes that leave partial tiles. Only the kernels the
engine builds for a key; correctness is the GPU tests' job, this only runs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

Case = Callable[[], None]


def activation_cases(t: Callable, tensor: Callable) -> dict[str, Case]:
    import nvrtc_engine as ne
    from nvrtc_engine.families.activation import kernels as activation

    out: dict[str, Case] = {}
    for i, o in [("bf16", "fp8_e4m3"), ("bf16", "bf16"), ("fp32", "fp8_e5m2"), ("fp16", "fp32")]:
        for n, offset in [(1, 0), (37, 0), (4099, 0), (70001, 0), (4099, 1), (4104, 0)]:

            def flat(i=i, o=o, n=n, offset=offset):
                kernel = ne.get_kernel("gelu", in_dtype=i, out_dtype=o)
                kw = tensor() if kernel.key.scaling == "tensor" else {}
                kernel(t(n + offset, dtype=i)[offset:], **kw)

            out[f"gelu_{i}_{o}_{n}+{offset}"] = flat
    shaped = [
        ("swiglu", {"dtype": "bf16"}), ("dgeglu", {"dtype": "fp8"}),
        ("dclamped_swiglu", {"in_dtype": "fp32", "out_dtype": "fp16"}),
        ("gelu", {"dtype": "fp8", "scaling": "mxfp8", "layout": "rowwise"}),
        ("dsrelu", {"dtype": "fp8", "scaling": "mxfp8", "layout": "rowwise"}),
        ("dgeglu", {"dtype": "fp8", "scaling": "mxfp8", "layout": "rowwise"}),
        ("gelu", {"dtype": "fp8", "scaling": "mxfp8", "layout": "both"}),
        ("dswiglu", {"dtype": "fp8", "scaling": "mxfp8", "layout": "both"}),
        ("dsilu", {"in_dtype": "fp32", "out_dtype": "e5m2", "scaling": "mxfp8",
                   "layout": "columnwise"}),
    ]  # fmt: skip
    for op, fields in shaped:
        key = ne.make_key(op, **fields)
        gated = key.spec.kind in ("gated", "dgated")
        shapes = [(64, 96), (96, 160), (32, 32)] if key.scaling == "mxfp8" else [(7, 67), (33, 512)]
        if key.scaling == "mxfp8" and key.layout == "rowwise":
            shapes += [(37, 64), (37, 128), (1, 96)]  # 128: compact scale rows
        for (rows, cols), grid in ((s, g) for s in shapes for g in (None, 3)):

            def run(key=key, rows=rows, cols=cols, grid=grid, gated=gated):
                kernel = ne.get_kernel(key)
                x = t(rows, 2 * cols if gated else cols, dtype=key.in_dtype)
                args = (t(rows, cols, dtype=key.in_dtype), x) if key.op.startswith("d") else (x,)
                kw: dict[str, Any] = {"limit": 7.0} if "clamped" in key.op else {}
                kw.update(tensor() if key.scaling == "tensor" else {})
                chosen = activation.MAX_GRID
                activation.MAX_GRID = grid or chosen  # 3: every block loops over several
                kernel._prepared.clear()  # a prepared launch keeps the grid it was made with
                try:
                    kernel(*args, **kw)
                finally:
                    activation.MAX_GRID = chosen
                    kernel._prepared.clear()

            out[f"{key}_{rows}x{cols}_grid{grid or 'all'}"] = run
    return out


def norm_cases(t: Callable, tensor: Callable) -> dict[str, Case]:
    import torch

    import nvrtc_engine as ne

    out: dict[str, Case] = {}
    # (97, 65536): clusters taking two row groups; (2000, 4096), (700, 14336), (513, 4096),
    # (67, 8192): more rows than the persistent grid's CTAs, the stages wrap
    shapes = [(3, 1000, 1000), (5, 4096, 4096), (513, 4096, 4096), (2000, 4096, 4096),
              (37, 8192, 8192), (67, 8192, 8192), (2, 14336, 14336), (700, 14336, 14336),
              (97, 65536, 65536), (7, 1000, None), (37, 1001, None), (3, 768, None)]  # fmt: skip
    for rows, h, hidden in shapes:
        for nm in ("layernorm", "rmsnorm"):
            tag = f"{nm}_h{hidden or 'any'}_{h}x{rows}"

            def fwd(nm=nm, rows=rows, h=h, hidden=hidden, out_dtype="bf16", scaling=None):
                x, w, b = t(rows, h), t(h), t(h)
                fields = {"scaling": scaling} if scaling else {}
                k = ne.get_kernel(f"{nm}_fwd", in_dtype="bf16", out_dtype=out_dtype,
                                  hidden_size=hidden, **fields)  # fmt: skip
                kw = tensor() if out_dtype == "fp8" and not scaling else {}
                k(x, w, b, 1e-5, **kw) if nm == "layernorm" else k(x, w, 1e-5, **kw)

            def bwd(nm=nm, rows=rows, h=h, hidden=hidden):
                x, dz, w = t(rows, h), t(rows, h), t(h)
                mu, rs = torch.zeros(rows, device="cuda"), torch.ones(rows, device="cuda")
                k = ne.get_kernel(f"{nm}_bwd", in_dtype="bf16", hidden_size=hidden)
                k(dz, x, mu, rs, w) if nm == "layernorm" else k(dz, x, rs, w)

            out[f"{tag}_fwd"] = fwd
            out[f"{tag}_fwd_fp8"] = lambda f=fwd: f(out_dtype="fp8")
            if h % 32 == 0:
                out[f"{tag}_fwd_mxfp8"] = lambda f=fwd: f(out_dtype="fp8", scaling="mxfp8")
            out[f"{tag}_bwd"] = bwd
    return out


def cast_cases(t: Callable, tensor: Callable) -> dict[str, Case]:
    import nvrtc_engine as ne

    def fp8(op: str) -> Any:
        return ne.get_kernel(op, dtype="fp8")

    out: dict[str, Case] = {}
    # (96, 320): aligned rows, partial tiles; (256, 512): MXFP8's fast path (aligned shapes)
    for m, k in [(31, 33), (130, 260), (1, 1), (256, 512), (96, 320), (300, 260)]:
        tag = f"{m}x{k}"
        out[f"cast_{tag}"] = lambda m=m, k=k: fp8("cast")(t(m, k), **tensor())
        out[f"cast_unaligned_{tag}"] = lambda m=m, k=k: fp8("cast")(t(m * k + 1)[1:], **tensor())
        out[f"transpose_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "transpose", in_dtype="bf16", out_dtype="bf16")(t(m, k))  # fmt: skip
        for op in ("cast_transpose", "cast_transpose_dbias"):
            out[f"{op}_{tag}"] = lambda m=m, k=k, op=op: fp8(op)(t(m, k), **tensor())
        out[f"cast_transpose_dbias_dgelu_{tag}"] = lambda m=m, k=k: fp8(
            "cast_transpose_dbias_dgelu")(t(m, k), t(m, k), **tensor())  # fmt: skip
        out[f"dswiglu_cast_transpose_{tag}"] = lambda m=m, k=k: fp8("dswiglu_cast_transpose")(
            t(m, k), t(m, 2 * k), **tensor())  # fmt: skip

        def multi(m=m, k=k):
            lists = [tensor(), tensor()]
            fp8("multi_cast_transpose")(
                [t(m, k), t(m + 1, k)], scales=[d["scale"] for d in lists],
                amaxes=[d["amax"] for d in lists], scale_invs=[d["scale_inv"] for d in lists],
            )  # fmt: skip

        out[f"multi_cast_transpose_{tag}"] = multi
        for layout in ("rowwise", "columnwise", "both"):
            for dtype in ("fp8", "fp4_e2m1"):
                out[f"quantize_{dtype}_{layout}_{tag}"] = lambda m=m, k=k, d=dtype, lay=layout: (
                    ne.get_kernel("quantize", dtype=d, layout=lay)(t(m, k)))  # fmt: skip
    return out


def cases() -> dict[str, Case]:
    """Name -> a function that launches one kernel (its arguments made on the call)."""
    import torch

    import nvrtc_engine as ne

    def t(*shape: int, dtype: str = "bf16") -> Any:
        return torch.randn(*shape, device="cuda").to(getattr(torch, ne.DTYPES[dtype].torch_name))

    def tensor() -> dict[str, Any]:
        return {"scale": torch.full((1,), 2.0, device="cuda"),
                "amax": torch.zeros(1, device="cuda"),
                "scale_inv": torch.empty(1, device="cuda")}  # fmt: skip

    return {**activation_cases(t, tensor), **norm_cases(t, tensor), **cast_cases(t, tensor)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--case", default="", help="run only cases containing this substring")
    args = parser.parse_args()
    import torch

    chosen = {name: fn for name, fn in cases().items() if args.case in name}
    if args.list:
        print("\n".join(chosen))
        return 0
    for name, fn in chosen.items():
        print(name, flush=True)
        fn()
        torch.cuda.synchronize()  # a fault is reported at the launch that caused it
    print(f"{len(chosen)} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
