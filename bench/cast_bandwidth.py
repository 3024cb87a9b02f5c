"""Cast / transpose / quantize bandwidth on the GPU: nvrtc_engine vs device copy, PyTorch
eager and torch.compile producing the same outputs.

    python bench/cast_bandwidth.py [--shapes 16384x8192,8192x28672] [--no-compile]
                                   [--paired ROUNDS] [--name cast_bandwidth]

For each shape (bf16 input), in one run:
  - cast bf16 -> fp8_e4m3 (tensor scaling: amax, scale_inv),
  - cast_transpose -> fp8_e4m3 (q and qt),
  - cast_transpose_dbias -> fp8_e4m3 (q, qt, dbias in bf16),
  - cast_transpose_dbias_dgelu -> fp8_e4m3 (from grad and the GELU input),
  - MXFP8 E4M3 rowwise, and both directions (data + E8M0 scales),
  - NVFP4 rowwise (packed E2M1 + E4M3 scales) with the amax given, and with the amax pass
    (which reads the input a second time),
beside the device copy bandwidth (torch copy_ of 1 GiB). GB/s counts each tensor read or
written once (input(s), outputs, scales; not the amax word or internal workspaces). The
torch.compile column compiles the same function as the eager one; a compile failure is
reported in the JSON and the table, not fatal. With ``--paired ROUNDS`` each case's
nvrtc_engine call and torch.compile function are timed again in ROUNDS shuffled rounds
(``common.paired_ms``: both in every round, so a drift of the GPU's speed between minutes
lands on both), and the rows add ``x_vs_compile_paired``, the median over rounds of
torch.compile's time over ours in the same round, with its lowest and highest round
(the ratio the 2x target of issue 5 is read from; the single-run ``x_vs_compile`` sets two
medians taken minutes apart against each other). Writes bench/results/NAME.json (default
cast_bandwidth; and $OUT/NAME.json when OUT is set).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

E4M3_MAX = 448.0


def torch_fns(torch: Any) -> dict[str, Callable[..., Any]]:
    """The same outputs in plain PyTorch (pure functions, for eager and torch.compile)."""
    f8 = torch.float8_e4m3fn

    def fp8(v, scale):
        return (v * scale).clamp(-E4M3_MAX, E4M3_MAX).to(f8)

    def cast(x, scale):
        v = x.float()
        return fp8(v, scale), v.abs().amax(), scale.reciprocal()

    def cast_transpose(x, scale):
        q, amax, scale_inv = cast(x, scale)
        return q, q.t().contiguous(), amax, scale_inv

    def cast_transpose_dbias(x, scale):
        q, qt, amax, scale_inv = cast_transpose(x, scale)
        return q, qt, x.float().sum(0).to(x.dtype), amax, scale_inv

    def cast_transpose_dbias_dgelu(grad, act, scale):
        v = torch.ops.aten.gelu_backward(grad.float(), act.float(), approximate="tanh")
        q = fp8(v, scale)
        return q, q.t().contiguous(), v.sum(0).to(grad.dtype), v.abs().amax(), scale.reciprocal()

    def e8m0(amax):  # TransformerEngine's float_to_e8m0(amax / 448), as int32
        bits = (amax.float() * (1.0 / E4M3_MAX)).view(torch.int32)
        exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
        return torch.where(amax == 0, 0, exponent + up.int())

    def multiplier(e):  # 2^(127 - e) as float bits; 1 for e == 0
        return torch.where(e == 0, 127 << 23, (254 - e) << 23).view(torch.float32)

    def mx_rowwise(x):
        m, k = x.shape
        blocks = x.float().view(m, k // 32, 32)
        e = e8m0(blocks.abs().amax(-1))
        return fp8(blocks, multiplier(e)[..., None]).view(m, k), e.to(torch.uint8)

    def mx_columnwise(x):
        m, k = x.shape
        blocks = x.float().view(m // 32, 32, k)
        e = e8m0(blocks.abs().amax(1))
        return fp8(blocks, multiplier(e)[:, None, :]).view(m, k), e.to(torch.uint8)

    def mx_both(x):
        return (*mx_rowwise(x), *mx_columnwise(x))

    def e2m1(v):  # round to nearest even over the E2M1 values, saturating; sign in bit 3
        a = v.abs()
        code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
                + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())  # fmt: skip
        return code | (torch.signbit(v).int() << 3)

    def nvfp4_rowwise(x, amax):
        m, k = x.shape
        s_enc = torch.where(amax == 0, 1.0, (448.0 * 6.0) / amax).clamp(max=3.4028234e38)
        blocks = x.float().view(m, k // 16, 16)
        sv = blocks.abs().amax(-1) * (s_enc * (1.0 / 6.0))
        scale = sv.clamp(max=E4M3_MAX).to(f8)
        mult = (1.0 / (scale.float() * (1.0 / s_enc))).clamp(max=3.4028234e38)
        codes = e2m1(blocks * mult[..., None]).view(m, k // 2, 2)
        return (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8), scale.view(torch.uint8)

    def nvfp4_rowwise_with_amax(x):
        amax = x.float().abs().amax()
        return (*nvfp4_rowwise(x, amax), amax)

    return {
        "cast": cast, "cast_transpose": cast_transpose,
        "cast_transpose_dbias": cast_transpose_dbias,
        "cast_transpose_dbias_dgelu": cast_transpose_dbias_dgelu,
        "mxfp8_rowwise": mx_rowwise, "mxfp8_both": mx_both,
        "nvfp4_rowwise": nvfp4_rowwise, "nvfp4_rowwise_amax": nvfp4_rowwise_with_amax,
    }  # fmt: skip


def bench_shape(
    m: int, k: int, compiled_fns: dict[str, Any] | None, paired: int = 0
) -> list[dict[str, Any]]:
    import torch

    import nvrtc_engine as ne
    from nvrtc_engine.ops.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

    n = m * k
    dev = "cuda"
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    act = torch.randn(m, k, device=dev).to(torch.bfloat16)
    scale = torch.full((1,), 2.0, device=dev)
    amax = torch.zeros(1, device=dev)
    scale_inv = torch.empty(1, device=dev)
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=dev)
    qt = torch.empty(k, m, dtype=torch.float8_e4m3fn, device=dev)
    q_col = torch.empty_like(q)
    dbias = torch.empty(k, dtype=torch.bfloat16, device=dev)

    def u8(shape):
        return torch.empty(shape, dtype=torch.uint8, device=dev)

    mx_r, mx_c = u8(mxfp8_scale_shape(m, k, "rowwise")), u8(mxfp8_scale_shape(m, k, "columnwise"))
    fp4_data, fp4_scales = u8((m, k // 2)), u8(nvfp4_scale_shape(m, k, "rowwise"))
    fp4_amax, fp4_ws = x.float().abs().amax().reshape(1), torch.empty(1024, device=dev)
    tensor = {"scale": scale, "amax": amax, "scale_inv": scale_inv}

    ct_dbias = ne.get_kernel("cast_transpose_dbias", dtype="fp8")
    dgelu = ne.get_kernel("cast_transpose_dbias_dgelu", dtype="fp8")
    ws = torch.empty(ct_dbias.workspace_rows(m), k, device=dev)
    ws_dgelu = torch.empty(dgelu.workspace_rows(m), k, device=dev)
    k_cast = ne.get_kernel("cast", dtype="fp8")
    k_ct = ne.get_kernel("cast_transpose", dtype="fp8")
    k_mx_r = ne.get_kernel("quantize", dtype="fp8", layout="rowwise")
    k_mx_b = ne.get_kernel("quantize", dtype="fp8", layout="both")
    k_fp4 = ne.get_kernel("quantize", dtype="fp4_e2m1", layout="rowwise")
    fp4_out = {"rowwise_data": fp4_data, "rowwise_scale_inv": fp4_scales}

    # (case, bytes moved, nvrtc_engine call, torch function name, torch arguments)
    cases = [
        ("cast bf16->fp8", 3 * n, lambda: k_cast(x, q, **tensor), "cast", (x, scale)),
        ("cast_transpose fp8", 4 * n, lambda: k_ct(x, out=q, out_t=qt, **tensor),
         "cast_transpose", (x, scale)),
        ("cast_transpose_dbias fp8", 4 * n + 2 * k,
         lambda: ct_dbias(x, out=q, out_t=qt, dbias=dbias, workspace=ws, **tensor),
         "cast_transpose_dbias", (x, scale)),
        ("cast_transpose_dbias_dgelu fp8", 6 * n + 2 * k,
         lambda: dgelu(x, act, out=q, out_t=qt, dbias=dbias, workspace=ws_dgelu, **tensor),
         "cast_transpose_dbias_dgelu", (x, act, scale)),
        ("mxfp8 rowwise", 3 * n + n // 32,
         lambda: k_mx_r(x, rowwise_data=q, rowwise_scale_inv=mx_r), "mxfp8_rowwise", (x,)),
        ("mxfp8 both", 4 * n + 2 * (n // 32),
         lambda: k_mx_b(x, rowwise_data=q, rowwise_scale_inv=mx_r, columnwise_data=q_col,
                        columnwise_scale_inv=mx_c), "mxfp8_both", (x,)),
        ("nvfp4 rowwise (amax given)", 2 * n + n // 2 + n // 16,
         lambda: k_fp4(x, **fp4_out, amax=fp4_amax, compute_amax=False),
         "nvfp4_rowwise", (x, fp4_amax[0])),
        ("nvfp4 rowwise + amax pass", 2 * n + n // 2 + n // 16,
         lambda: k_fp4(x, **fp4_out, amax=amax, workspace=fp4_ws), "nvfp4_rowwise_amax", (x,)),
    ]  # fmt: skip
    fns = torch_fns(torch)
    rows: list[dict[str, Any]] = []
    shape = f"{m}x{k}"

    def add(case: str, impl: str, nbytes: int, fn: Callable[[], Any] | None, error: str = ""):
        row: dict[str, Any] = {"shape": shape, "case": case, "impl": impl, "bytes": nbytes}
        if fn is not None:
            try:
                ms = common.cuda_time_ms(fn)
                row.update(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9)
            except Exception as exc:  # report, keep measuring the others
                error = f"{type(exc).__name__}: {exc}"
        if error:
            row["error"] = error[:300]
        rows.append(row)

    for case, nbytes, ours, name, args in cases:
        add(case, "nvrtc_engine", nbytes, ours)
        eager = fns[name]
        add(case, "torch eager", nbytes, lambda eager=eager, args=args: eager(*args))
        torch.cuda.empty_cache()
        if compiled_fns is None:
            continue
        try:
            compiled = compiled_fns.setdefault(name, torch.compile(eager, dynamic=False))
            compiled(*args)  # compile (for this shape) outside the timing
        except Exception as exc:
            add(case, "torch.compile", nbytes, None, f"compile failed: {type(exc).__name__}: {exc}")
            continue

        def theirs(c: Any = compiled, args: tuple = args) -> Any:
            return c(*args)

        add(case, "torch.compile", nbytes, theirs)
        if paired:
            times = common.paired_ms({"ours": ours, "compile": theirs}, rounds=paired)
            ratio = common.paired_ratios(times, "compile")["ours"]  # theirs / ours, per round
            row = next(r for r in rows if r["case"] == case and r["impl"] == "nvrtc_engine")
            row.update(x_vs_compile_paired=ratio["median"], paired_low=ratio["low"],
                       paired_high=ratio["high"], paired_rounds=paired,
                       paired_ms=times)  # fmt: skip
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="16384x8192,8192x28672",
                        help="comma-separated MxK (each a multiple of 32)")  # fmt: skip
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time ours against torch.compile in ROUNDS shuffled rounds",
    )
    parser.add_argument(
        "--name", type=common.result_name, default="cast_bandwidth", help="bench/results/NAME.json"
    )
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    rows: list[dict[str, Any]] = []
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    compiled_fns: dict[str, Any] | None = None if args.no_compile else {}
    for m, k in shapes:
        rows += bench_shape(m, k, compiled_fns, args.paired)
    compiled = {(r["shape"], r["case"]): r.get("ms") for r in rows if r["impl"] == "torch.compile"}
    for r in rows:
        if r.get("gbps") is not None:
            r["pct_of_copy"] = 100.0 * r["gbps"] / copy
        other = compiled.get((r["shape"], r["case"]))
        if r["impl"] == "nvrtc_engine" and r.get("ms") and other:
            r["x_vs_compile"] = other / r["ms"]
    path = common.write_results(args.name, {
        **common.gpu_info(), "copy_gbps": copy, "shapes": [list(s) for s in shapes],
        "input_dtype": "bf16", "paired_rounds": args.paired, "kernels": rows,
    })  # fmt: skip
    print(f"device copy: {copy:.0f} GB/s   bf16 input")
    print(common.table(rows, [
        ("shape", "shape", ""), ("case", "case", ""), ("impl", "implementation", ""),
        ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"), ("pct_of_copy", "% of copy", ".1f"),
        ("x_vs_compile", "x torch.compile", ".2f"),
        ("x_vs_compile_paired", "x compile, paired", ".3f"),
        ("paired_low", "low", ".3f"), ("paired_high", "high", ".3f"),
    ]))  # fmt: skip
    failed = [r for r in rows if r.get("error")]
    for r in failed:
        print(f"  {r['shape']} {r['case']} [{r['impl']}]: {r['error']}")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
