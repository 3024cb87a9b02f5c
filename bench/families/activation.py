"""Activation family for bench/bandwidth.py: nvrtc_engine against the device copy, torch eager
and torch.compile of the same math.

At tokens x hidden (``--shapes``, one shape, default 16384x8192; gated ops read a
tokens x 2*hidden input and write tokens x hidden), bf16 input: every forward op (gelu,
qgelu, silu, relu, srelu, sigmoid, glu, geglu, qgeglu, swiglu, reglu, sreglu, clamped_swiglu)
to bf16, to fp8_e4m3 with tensor scaling (amax, scale_inv), to MXFP8 rowwise and to MXFP8
both directions, and the backward dgelu and dswiglu to bf16; each beside the same math in
torch eager and under torch.compile (FP8 cast, amax and E8M0 block scales included; a
compile failure is reported in the row, not fatal). GB/s counts each tensor read or written
once (MXFP8 scale bytes included); outputs are preallocated. The engine's kernels are the
specialized ones (hidden_size compiled in) unless ``--kernels general`` asks for
hidden_size None. Result schema: ``shape``, ``copy_gbps``, ``kernels``, ``hidden_size`` and
``rows`` of {op, output, bytes, engine_ms, engine_gbps, engine_pct_of_copy, eager_ms,
eager_gbps, compile_ms, compile_gbps, speedup_vs_compile, *_error}.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import common

PLAIN = ["gelu", "qgelu", "silu", "relu", "srelu", "sigmoid"]
GATED = ["glu", "geglu", "qgeglu", "swiglu", "reglu", "sreglu", "clamped_swiglu"]
GATE_ACT = {"glu": "sigmoid", "geglu": "gelu", "qgeglu": "qgelu", "swiglu": "silu",
            "reglu": "relu", "sreglu": "srelu"}  # fmt: skip
OUTPUTS = ["bf16", "fp8 tensor", "mxfp8 rowwise", "mxfp8 both"]
LIMIT = 7.0  # clamped SwiGLU's limit (GPT-OSS)
E4M3_MAX = 448.0


# -- the same math in torch ----------------------------------------------------------------


def torch_ops() -> tuple[dict[str, Callable], dict[str, Callable]]:
    """Forward ops (x -> y) and the two backward ops ((grad, x) -> dx), in torch."""
    import torch
    import torch.nn.functional as F

    act = {
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
        "silu": F.silu,
        "relu": F.relu,
        "srelu": lambda x: torch.square(F.relu(x)),
        "sigmoid": torch.sigmoid,
    }

    def gated(f: Callable) -> Callable:
        def g(x):
            a, b = x.chunk(2, dim=-1)
            return f(a) * b

        return g

    def clamped_swiglu(x):
        a, b = x.chunk(2, dim=-1)
        a = a.clamp(max=LIMIT)
        return a * torch.sigmoid(1.702 * a) * (b.clamp(-LIMIT, LIMIT) + 1.0)

    forward = {**act, **{op: gated(act[a]) for op, a in GATE_ACT.items()},
               "clamped_swiglu": clamped_swiglu}  # fmt: skip

    def dgelu(grad, x):
        return torch.ops.aten.gelu_backward(grad, x, approximate="tanh")

    def dswiglu(grad, x):
        a, b = x.chunk(2, dim=-1)
        s = torch.sigmoid(a)
        return torch.cat([grad * s * (1 + a * (1 - s)) * b, grad * a * s], dim=-1)

    return forward, {"dgelu": dgelu, "dswiglu": dswiglu}


def e8m0(amax):
    """TransformerEngine's E8M0 scale of fp32 block maxima, and the data multiplier."""
    import torch

    bits = (amax * (1.0 / E4M3_MAX)).view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa != 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = torch.where(amax == 0, 0, exponent + up.to(torch.int32))
    mult = torch.where(e == 0, 1.0, ((254 - e) << 23).view(torch.float32))
    return e.to(torch.uint8), mult


def to_e4m3(v):
    import torch

    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def torch_output(f: Callable, output: str) -> Callable:
    """``f`` followed by the output stage of ``output`` (the FP8 cast, amax, scales)."""
    if output == "bf16":
        return f
    if output == "fp8 tensor":

        def tensor_scaled(*args, scale, amax):
            y = f(*args).float()
            amax.copy_(amax.maximum(y.abs().amax().reshape(1)))
            return to_e4m3(y * scale), scale.reciprocal()

        return tensor_scaled
    both = output == "mxfp8 both"

    def mxfp8(*args):
        y = f(*args).float()
        rows, cols = y.shape
        blocks = y.view(rows, cols // 32, 32)
        s_row, m_row = e8m0(blocks.abs().amax(-1))
        out = [to_e4m3(blocks * m_row.unsqueeze(-1)).view(rows, cols), s_row]
        if both:
            cblocks = y.view(rows // 32, 32, cols)
            s_col, m_col = e8m0(cblocks.abs().amax(1))
            out += [to_e4m3(cblocks * m_col.unsqueeze(1)).view(rows, cols), s_col]
        return out

    return mxfp8


# -- measurement ---------------------------------------------------------------------------


def traffic(op: str, output: str, tokens: int, hidden: int) -> int:
    """Bytes read + written once: bf16 input(s), the output, MXFP8 scale bytes."""
    n = tokens * hidden
    backward = op.startswith("d") and op[1:] in PLAIN + GATED
    base = op[1:] if backward else op
    x = 2 * n if base in GATED else n
    out = x if backward else n
    read = 2 * x + (2 * n if backward else 0)  # grad has the forward output's shape
    if output == "bf16":
        return read + 2 * out
    if output == "fp8 tensor":
        return read + out
    directions = 2 if output == "mxfp8 both" else 1
    return read + directions * (out + out // 32)


def kernel_fields(output: str) -> dict[str, str]:
    """get_kernel fields (bf16 input) of an output column of the table."""
    if output == "bf16":
        return {"dtype": "bf16"}
    if output == "fp8 tensor":
        return {"dtype": "fp8"}
    return {"dtype": "fp8", "scaling": "mxfp8", "layout": output.split()[1]}


def engine_call(
    op: str,
    output: str,
    inputs: tuple,
    shape: tuple[int, int],
    get_kernel: Callable | None = None,
    hidden_size: int | None = None,
) -> Callable:
    """A no-argument function launching the nvrtc_engine kernel into preallocated outputs
    (``get_kernel(op, **fields)``: default ``nvrtc_engine.get_kernel``; ``hidden_size``,
    when given, is one of the fields: the kernel specialized for it)."""
    import torch

    import nvrtc_engine as ne
    from nvrtc_engine.families.activation.spec import MXFP8Output
    from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape

    get_kernel = get_kernel or ne.get_kernel
    dev = inputs[-1].device
    fields = kernel_fields(output)
    if hidden_size is not None:
        fields["hidden_size"] = hidden_size
    kernel = get_kernel(op, **fields)
    kwargs: dict[str, Any] = {}
    if output == "bf16":
        out: Any = torch.empty(shape, dtype=torch.bfloat16, device=dev)
    elif output == "fp8 tensor":
        out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=dev)
        kwargs = {
            "scale": torch.full((1,), 2.0, device=dev),
            "amax": torch.zeros(1, device=dev),
            "scale_inv": torch.empty(1, device=dev),
        }
    else:
        layout = kernel.key.layout
        fields = {}
        for direction in ("rowwise", "columnwise"):
            if layout in (direction, "both"):
                fields[direction + "_data"] = torch.empty(
                    shape, dtype=torch.float8_e4m3fn, device=dev
                )
                fields[direction + "_scale_inv"] = torch.zeros(
                    mxfp8_scale_shape(*shape, direction), dtype=torch.uint8, device=dev
                )
        out = MXFP8Output(**fields)
    if op.endswith("clamped_swiglu"):
        kwargs["limit"] = LIMIT
    return lambda: kernel(*inputs, out, **kwargs)


def torch_call(fn: Callable, output: str, inputs: tuple) -> Callable:
    import torch

    if output == "fp8 tensor":
        dev = inputs[-1].device
        scale = torch.full((1,), 2.0, device=dev)
        amax = torch.zeros(1, device=dev)
        return lambda: fn(*inputs, scale=scale, amax=amax)
    return lambda: fn(*inputs)


def make_inputs(op: str, tokens: int, hidden: int) -> tuple[tuple, tuple[int, int]]:
    """bf16 inputs of ``op`` ((x,) or (grad, x)) and the output shape."""
    import torch

    backward_op = op in ("dgelu", "dswiglu")
    base = op[1:] if backward_op else op
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, 2 * hidden if base in GATED else hidden, device="cuda", generator=gen)
    inputs: tuple = (x.to(torch.bfloat16),)
    del x
    if backward_op:
        grad = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        inputs = (grad, *inputs)
    return inputs, (tuple(inputs[-1].shape) if backward_op else (tokens, hidden))


DEFAULTS = {"shapes": "16384x8192", "repeat": 30, "paired": 0}


def cases(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(op, output) of every row, ``--ops`` applied."""
    wanted = set(args.ops.split(",")) if args.ops else None
    every = [(op, o) for op in PLAIN + GATED for o in OUTPUTS]
    every += [("dgelu", "bf16"), ("dswiglu", "bf16")]
    return [(op, o) for op, o in every if wanted is None or op in wanted]


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments for this family, or None."""
    if len(args.shapes) != 1:
        return "the activation family takes one --shapes entry (tokens x hidden)"
    if args.paired:
        return "the activation family has no paired rounds (--paired)"
    known = set(PLAIN + GATED + ["dgelu", "dswiglu"])
    unknown = set(filter(None, args.ops.split(","))) - known
    return f"unknown ops {sorted(unknown)}: {sorted(known)}" if unknown else None


def hidden_size(args: argparse.Namespace) -> int | None:
    """The engine kernels' hidden_size field: H compiled in, or None (``--kernels general``)."""
    return args.shapes[0][1] if args.kernels == "specialized" else None


def kernels(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(op, get_kernel fields) of every engine kernel the run launches."""
    return [(op, {**kernel_fields(o), "hidden_size": hidden_size(args)}) for op, o in cases(args)]


def measure_case(op: str, output: str, args: argparse.Namespace, torch_fn: Callable) -> dict:
    """Time one op and output for nvrtc_engine, torch eager and torch.compile."""

    t, h = args.shapes[0]
    inputs, shape = make_inputs(op, t, h)
    math = torch_output(torch_fn, output)
    nbytes = traffic(op, output, t, h)
    row: dict[str, Any] = {"op": op, "output": output, "bytes": nbytes}
    makers = {
        "engine": lambda: engine_call(op, output, inputs, shape, hidden_size=hidden_size(args)),
        "eager": lambda: torch_call(math, output, inputs),
    }
    compile_ops = [o for o in args.compile_ops.split(",") if o]
    if not args.no_compile and (not compile_ops or op in compile_ops):
        makers["compile"] = lambda: torch_call(common.fresh_compile(math), output, inputs)
    for name, make in makers.items():
        try:
            ms = common.cuda_time_ms(make(), repeat=args.repeat)
        except Exception as exc:  # report (e.g. a torch.compile failure) and go on
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        row[f"{name}_ms"] = ms
        row[f"{name}_gbps"] = nbytes / (ms * 1e-3) / 1e9
    return row


def run(args: argparse.Namespace, reference: common.CopyReference, copy: float) -> dict[str, Any]:
    """The family's result payload, rows against ``copy`` (the reference copy's GB/s)."""
    import torch

    forward, backward = torch_ops()
    rows = []
    for op, output in cases(args):
        row = measure_case(op, output, args, {**forward, **backward}[op])
        torch.cuda.empty_cache()
        if "engine_gbps" in row:
            row["engine_pct_of_copy"] = 100.0 * row["engine_gbps"] / copy
            if "compile_ms" in row:
                row["speedup_vs_compile"] = row["compile_ms"] / row["engine_ms"]
        rows.append(row)
        done = "  ".join(f"{k}={row[k]:.0f}" for k in row if k.endswith("_gbps"))
        errors = "  ".join(f"{k}: {row[k]}" for k in row if k.endswith("_error"))
        print(f"{op:15s} {output:14s} {done} {errors}", file=sys.stderr)  # progress
    return {"shape": list(args.shapes[0]), "input_dtype": "bf16", "kernels": args.kernels,
            "hidden_size": hidden_size(args), "rows": rows}  # fmt: skip


def show(payload: dict[str, Any]) -> str:
    """The table printed at the end of a run."""
    rows = payload["rows"]
    lines = [common.table(rows, [
        ("op", "op", ""), ("output", "output", ""), ("engine_ms", "ms", ".4f"),
        ("engine_gbps", "GB/s", ".0f"), ("engine_pct_of_copy", "% of copy", ".1f"),
        ("eager_gbps", "eager GB/s", ".0f"), ("compile_gbps", "compile GB/s", ".0f"),
        ("speedup_vs_compile", "x vs compile", ".2f"),
    ])]  # fmt: skip
    lines += [f"{r['op']} {r['output']}: {k[:-6]} failed: {r[k]}"
              for r in rows for k in r if k.endswith("_error")]  # fmt: skip
    return "\n".join(lines)
