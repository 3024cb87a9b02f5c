"""Cast / transpose / quantize family for bench/bandwidth.py: nvrtc_engine against the
device copy, PyTorch eager and torch.compile producing the same outputs.

For each M x K of ``--shapes`` (default 16384x8192,8192x28672; multiples of 32), bf16 input:
cast to fp8_e4m3 (tensor scaling: amax, scale_inv); cast_transpose (q and qt);
cast_transpose_dbias (q, qt, bf16 dbias); cast_transpose_dbias_dgelu (from grad and the GELU
input); MXFP8 E4M3 rowwise and both directions (data and E8M0 scales); NVFP4 rowwise
(packed E2M1 and E4M3 scales) with the amax given and with the amax pass (which reads the
input a second time). GB/s counts each tensor read or written once (inputs, outputs, scales;
not the amax word or internal workspaces). torch.compile compiles the eager function; a
failure is reported in the row, not fatal. With ``--paired ROUNDS`` each case's kernel and
torch.compile are timed again in ROUNDS shuffled rounds (common.paired_ms) and the kernel's
row adds ``x_vs_compile_paired``: the median over rounds of torch.compile's time over the
kernel's in the same round, with the lowest and highest round. Result schema: ``copy_gbps``,
``shapes``, ``paired_rounds`` and ``kernels``, one row per (shape, case, impl) of {shape,
case, impl, bytes, ms, gbps, pct_of_copy, x_vs_compile, x_vs_compile_paired, paired_low,
paired_high, paired_rounds, paired_ms, error}.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

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


# (case, op, get_kernel fields) of the engine kernels each shape launches
KERNELS = [
    ("cast bf16->fp8", "cast", {"dtype": "fp8"}),
    ("cast_transpose fp8", "cast_transpose", {"dtype": "fp8"}),
    ("cast_transpose_dbias fp8", "cast_transpose_dbias", {"dtype": "fp8"}),
    ("cast_transpose_dbias_dgelu fp8", "cast_transpose_dbias_dgelu", {"dtype": "fp8"}),
    ("mxfp8 rowwise", "quantize", {"dtype": "fp8", "layout": "rowwise"}),
    ("mxfp8 both", "quantize", {"dtype": "fp8", "layout": "both"}),
    ("nvfp4 rowwise", "quantize", {"dtype": "fp4_e2m1", "layout": "rowwise"}),
]


def bench_shape(
    m: int, k: int, compiled_fns: dict[str, Any] | None, paired: int = 0, repeat: int = 20
) -> list[dict[str, Any]]:
    import torch

    import nvrtc_engine as ne
    from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

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

    kern = {case: ne.get_kernel(op, **fields) for case, op, fields in KERNELS}
    ct_dbias, dgelu = kern["cast_transpose_dbias fp8"], kern["cast_transpose_dbias_dgelu fp8"]
    ws = torch.empty(ct_dbias.workspace_rows(m), k, device=dev)
    ws_dgelu = torch.empty(dgelu.workspace_rows(m), k, device=dev)
    k_cast, k_ct = kern["cast bf16->fp8"], kern["cast_transpose fp8"]
    k_mx_r, k_mx_b, k_fp4 = kern["mxfp8 rowwise"], kern["mxfp8 both"], kern["nvfp4 rowwise"]
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
                ms = common.cuda_time_ms(fn, repeat=repeat)
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


DEFAULTS = {"shapes": "16384x8192,8192x28672", "repeat": 20, "paired": 0}


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments for this family, or None."""
    if any(m % 32 or k % 32 for m, k in args.shapes):
        return "cast shapes are M x K with both multiples of 32"
    if args.ops or args.compile_ops or args.kernels != "specialized":
        return "the cast family takes no --ops, --compile-ops or --kernels"
    return None


def kernels(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(op, get_kernel fields) of every engine kernel the run launches."""
    return [(op, fields) for _, op, fields in KERNELS]


def run(args: argparse.Namespace, reference: common.CopyReference, copy: float) -> dict[str, Any]:
    """The family's result payload, rows against ``copy`` (the reference copy's GB/s)."""
    rows: list[dict[str, Any]] = []
    compiled_fns: dict[str, Any] | None = None if args.no_compile else {}
    for m, k in args.shapes:
        rows += bench_shape(m, k, compiled_fns, args.paired, args.repeat)
    compiled = {(r["shape"], r["case"]): r.get("ms") for r in rows if r["impl"] == "torch.compile"}
    for r in rows:
        if r.get("gbps") is not None:
            r["pct_of_copy"] = 100.0 * r["gbps"] / copy
        other = compiled.get((r["shape"], r["case"]))
        if r["impl"] == "nvrtc_engine" and r.get("ms") and other:
            r["x_vs_compile"] = other / r["ms"]
    return {"shapes": [list(s) for s in args.shapes], "input_dtype": "bf16",
            "paired_rounds": args.paired, "kernels": rows}  # fmt: skip


def show(payload: dict[str, Any]) -> str:
    """The table printed at the end of a run."""
    rows = payload["kernels"]
    lines = [common.table(rows, [
        ("shape", "shape", ""), ("case", "case", ""), ("impl", "implementation", ""),
        ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"), ("pct_of_copy", "% of copy", ".1f"),
        ("x_vs_compile", "x torch.compile", ".2f"),
        ("x_vs_compile_paired", "x compile, paired", ".3f"),
        ("paired_low", "low", ".3f"), ("paired_high", "high", ".3f"),
    ])]  # fmt: skip
    lines += [f"  {r['shape']} {r['case']} [{r['impl']}]: {r['error']}"
              for r in rows if r.get("error")]  # fmt: skip
    return "\n".join(lines)
