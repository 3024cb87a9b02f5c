"""LayerNorm/RMSNorm family for bench/bandwidth.py: nvrtc_engine (specialized and general
kernels) against the device copy, PyTorch eager and torch.compile.

bf16, N x H of ``--shapes`` (default 16384 rows at H 1024, 4096, 8192 and 14336, 2048 rows
at 65536), ``--ops`` layernorm, rmsnorm or both. Cases: fwd bf16->bf16 (z, mu, rsigma); fwd
bf16->fp8 (z in fp8_e4m3 with tensor scaling: amax, scale_inv); bwd (dx, dgamma, dbeta from
dz, x, mu, rsigma, gamma). Implementations: nvrtc_engine with hidden_size=H ("specialized";
the kernel symbol names its launch configuration) and hidden_size=None ("general"); torch
eager (F.layer_norm / F.rms_norm, then amax and a saturating cast for FP8; backward:
aten.native_layer_norm_backward, for RMSNorm the kernel's math in torch ops and, apart,
autograd through F.rms_norm); torch.compile of the same functions, compiled afresh per shape.
Then, per case, the specialized kernel, torch.compile and the reference copy again in
``--paired`` rounds (default 20; common.paired_ms): ``vs_compile_paired``, the median of
torch.compile's time over the kernel's in the same round (with lowest, highest and
``faster_than_compile``, the fraction of rounds the kernel won), and ``pct_of_copy_paired``,
the median of the kernel's GB/s over the copy's in the same round.

GB/s counts each tensor once: forward x read, z written, gamma (and beta) read; backward x
and dz read, dx written. Each timed call touches its own copy of the row tensors, cycling
over enough copies that a cycle moves at least 256 MB (nothing is served from L2). Result
schema: ``copy_gbps``, ``copy_gbps_end``, ``repeat``, ``paired_rounds`` and ``rows`` of
{norm, case, tokens, hidden, impl, bytes, kernel, digest, residency, ms, gbps, pct_of_copy,
pct_of_copy_paired(_low, _high), copy_gbps_paired, vs_compile_paired(_low, _high),
faster_than_compile, error}.
"""

from __future__ import annotations

import argparse
import traceback
from collections.abc import Callable
from typing import Any

import common

CASES = [(16384, 1024), (16384, 4096), (16384, 8192), (16384, 14336), (2048, 65536)]
EPS = 1e-5
FP8_MAX = 448.0
MIN_CYCLE_BYTES = 256 << 20


class Cycle:
    """``copies`` sets of buffers, handed out in turn so consecutive calls touch new memory."""

    def __init__(self, make: Any, bytes_per_call: int) -> None:
        self.copies = max(1, -(-MIN_CYCLE_BYTES // bytes_per_call))
        self.sets = [make() for _ in range(self.copies)]
        self.i = 0

    def next(self) -> Any:
        s = self.sets[self.i]
        self.i = (self.i + 1) % self.copies
        return s


def forward_weights(h: int, fp8: bool) -> tuple[Any, Any, dict[str, Any]]:
    """bf16 gamma (about 1) and beta (about 0) of ``h`` elements, and for an FP8 output the
    tensor-scaling arguments (scale 2, amax, scale_inv) a forward call takes."""
    import torch

    w = (torch.randn(h, device="cuda") * 0.1 + 1).to(torch.bfloat16)
    b = (torch.randn(h, device="cuda") * 0.1).to(torch.bfloat16)
    fp8_args: dict[str, Any] = {}
    if fp8:
        fp8_args = {"scale": torch.full((1,), 2.0, device="cuda"),
                    "amax": torch.zeros(1, device="cuda"),
                    "scale_inv": torch.empty(1, device="cuda")}  # fmt: skip
    return w, b, fp8_args


def forward_rows(rows: int, h: int, fp8: bool) -> dict[str, Any]:
    """One set of a forward's row tensors: bf16 ``x`` (rows, h), ``z`` (E4M3 or bf16), fp32
    ``mu`` and ``rs`` (rows,), as :func:`kernel_forward` takes them."""
    import torch

    return {"x": torch.randn(rows, h, device="cuda").to(torch.bfloat16),
            "z": torch.empty(rows, h, device="cuda",
                             dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16),
            "mu": torch.empty(rows, device="cuda"),
            "rs": torch.empty(rows, device="cuda")}  # fmt: skip


def torch_fns(norm: str, h: int) -> dict[str, Any]:
    """Forward, FP8 forward and backward in plain torch (eager; also what gets compiled)."""
    import torch
    import torch.nn.functional as F

    def fwd(x, w, b):
        if norm == "layernorm":
            return F.layer_norm(x, (h,), w, b, EPS)
        return F.rms_norm(x, (h,), w, EPS)

    def fwd_fp8(x, w, b, scale, amax, scale_inv, z8):
        y = fwd(x, w, b)
        amax.copy_(torch.maximum(amax, y.abs().amax().float()))
        z8.copy_((y.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
        scale_inv.copy_(scale.reciprocal())

    def ln_bwd(dz, x, mu, rs, w, b):
        return torch.ops.aten.native_layer_norm_backward(dz, x, [h], mu, rs, w, b,
                                                         [True, True, True])  # fmt: skip

    def rms_bwd(dz, x, rs, w):  # the same math as the kernel, in torch ops
        xhat = x.float() * rs[:, None]
        dy = dz.float() * w.float()
        mdyy = (dy * xhat).mean(-1, keepdim=True)
        dx = (rs[:, None] * (dy - xhat * mdyy)).to(x.dtype)
        return dx, (dz.float() * xhat).sum(0).to(w.dtype)

    return {"fwd": fwd, "fwd_fp8": fwd_fp8, "bwd": ln_bwd if norm == "layernorm" else rms_bwd}


def kernel_forward(k: Any, cycle: Cycle, ln: bool, w: Any, b: Any, z: str = "z",
                   **fp8: Any) -> Callable[[], None]:  # fmt: skip
    """A call of the forward kernel ``k`` (LayerNorm if ``ln``) on ``cycle``'s next buffer
    set (``x``, ``mu``, ``rs`` and the output ``z``), with ``fp8``'s scale, amax and
    scale_inv for an FP8 output."""
    if ln:

        def run() -> None:
            s = cycle.next()
            k(s["x"], w, b, EPS, s[z], s["mu"], s["rs"], **fp8)
    else:

        def run() -> None:
            s = cycle.next()
            k(s["x"], w, EPS, s[z], s["rs"], **fp8)

    return run


def torch_forward(f: Any, cycle: Cycle, w: Any, b: Any, z: str = "z",
                  **fp8: Any) -> Callable[[], None]:  # fmt: skip
    """A call of :func:`torch_fns`' ``fwd`` (no ``fp8``) or ``fwd_fp8`` (eager or compiled)
    on ``cycle``'s next buffer set, as :func:`kernel_forward`."""
    if not fp8:
        return lambda: f(cycle.next()["x"], w, b)
    scale, amax, scale_inv = fp8["scale"], fp8["amax"], fp8["scale_inv"]

    def run() -> None:
        s = cycle.next()
        f(s["x"], w, b, scale, amax, scale_inv, s[z])

    return run


def bench_shape(norm: str, n: int, h: int, args: argparse.Namespace,
                copy: common.CopyReference) -> list[dict]:  # fmt: skip
    import torch

    import nvrtc_engine as ne

    bf16 = torch.bfloat16
    rows: list[dict] = []
    elem = n * h
    fwd_bytes = 2 * elem * 2 + h * 2 * (2 if norm == "layernorm" else 1)
    fp8_bytes = 2 * elem + elem * 1 + h * 2 * (2 if norm == "layernorm" else 1)
    bwd_bytes = 3 * elem * 2

    timed: dict[str, dict[str, Any]] = {}

    def add(case: str, impl: str, nbytes: int, fn: Any, k: Any = None) -> None:
        """Time ``fn`` into a row; ``k``: the engine's kernel it calls (its symbol and cache
        digest, which tells runs of the same code apart from runs of the same layout)."""
        timed.setdefault(case, {})[impl] = fn
        row = {"norm": norm, "case": case, "tokens": n, "hidden": h, "impl": impl, "bytes": nbytes,
               "kernel": k.artifact.symbols[0] if k is not None else "",
               "digest": k.artifact.digest[:16] if k is not None else "",
               "ms": None, "gbps": None}  # fmt: skip
        if k is not None:  # the grid's residency on this GPU (clusters: per GPC, it varies)
            row["residency"] = k.residency(torch.cuda.current_device())
        try:
            ms = common.cuda_time_ms(fn, repeat=args.repeat)
            row.update(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9)
        except Exception as exc:  # report and keep measuring the rest
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            if args.verbose:
                traceback.print_exc()
        rows.append(row)
        torch.cuda.synchronize()

    def pair(case: str) -> None:
        """The specialized kernel, torch.compile and the reference copy (``copy``: the
        same 1 GiB copy as the run's copy bandwidth) of ``case`` again, in paired rounds
        (common.paired_ms): the kernel's same-round ratio to torch.compile and its same-round
        % of copy, free of the drift between timings minutes apart."""
        impls = ("nvrtc_engine specialized", "torch.compile")
        mine = [r for r in rows if r["case"] == case and r["impl"] in impls and r["ms"]]
        if args.paired < 1 or not mine or mine[0]["impl"] != impls[0]:
            return
        fns = {r["impl"]: timed[case][r["impl"]] for r in mine}
        fns["device copy"] = copy.call
        times = common.paired_ms(fns, rounds=args.paired, seed=h)
        kernel_row = mine[0]
        pct = common.paired_pct_of_copy(times[impls[0]], kernel_row["bytes"],
                                        times["device copy"], copy.nbytes)  # fmt: skip
        kernel_row.update(pct_of_copy_paired=pct["median"], pct_of_copy_paired_low=pct["low"],
                          pct_of_copy_paired_high=pct["high"],
                          copy_gbps_paired=pct["copy_gbps"])  # fmt: skip
        if impls[1] in times:
            ratio = common.paired_ratios(times, impls[1])[impls[0]]
            kernel_row.update(vs_compile_paired=ratio["median"],
                              vs_compile_paired_low=ratio["low"],
                              vs_compile_paired_high=ratio["high"],
                              faster_than_compile=ratio["faster"])  # fmt: skip
        torch.cuda.synchronize()

    w, b, fp8 = forward_weights(h, True)

    def fwd_set():  # forward_rows' set with an E4M3 z, as z8, and a bf16 z beside it
        s = forward_rows(n, h, True)
        return {**s, "z8": s["z"], "z": torch.empty_like(s["x"])}

    fc = Cycle(fwd_set, 2 * elem * 2)
    op = f"{norm}_fwd"
    ln = norm == "layernorm"
    for impl, hidden in (("nvrtc_engine specialized", h), ("nvrtc_engine general", None)):
        k16 = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
        k8 = ne.get_kernel(op, in_dtype="bf16", out_dtype="fp8", hidden_size=hidden)
        add("fwd bf16->bf16", impl, fwd_bytes, kernel_forward(k16, fc, ln, w, b), k16)
        add("fwd bf16->fp8", impl, fp8_bytes, kernel_forward(k8, fc, ln, w, b, "z8", **fp8), k8)

    fns = torch_fns(norm, h)
    variants = [("torch eager", fns)]
    if not args.no_compile:
        compiled = {name: common.fresh_compile(f, dynamic=False) for name, f in fns.items()}
        variants.append(("torch.compile", compiled))
    for impl, f in variants:
        add("fwd bf16->bf16", impl, fwd_bytes, torch_forward(f["fwd"], fc, w, b))
        add("fwd bf16->fp8", impl, fp8_bytes, torch_forward(f["fwd_fp8"], fc, w, b, "z8", **fp8))
    pair("fwd bf16->bf16")
    pair("fwd bf16->fp8")
    fc.sets.clear()  # free the forward buffers
    torch.cuda.empty_cache()

    # backward: mu/rsigma from a forward pass on each copy
    ref_fwd = ne.get_kernel(op, in_dtype="bf16", hidden_size=h)

    def bwd_set():
        x = torch.randn(n, h, device="cuda").to(bf16)
        mu, rs = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        if ln:
            ref_fwd(x, w, b, EPS, mu=mu, rsigma=rs)
        else:
            ref_fwd(x, w, EPS, rsigma=rs)
        return {"x": x, "dz": torch.randn(n, h, device="cuda").to(bf16), "mu": mu, "rs": rs,
                "dx": torch.empty_like(x)}  # fmt: skip

    bc = Cycle(bwd_set, bwd_bytes)
    dw, db = torch.empty_like(w), torch.empty_like(b)
    dev = torch.cuda.current_device()
    for impl, hidden in (("nvrtc_engine specialized", h), ("nvrtc_engine general", None)):
        kb = ne.get_kernel(f"{norm}_bwd", in_dtype="bf16", hidden_size=hidden)
        ws = torch.empty(max(1, kb.workspace_elements(n, h, device=dev)), device="cuda")

        def runb(k=kb, ws=ws):
            s = bc.next()
            if ln:
                k(s["dz"], s["x"], s["mu"], s["rs"], w, s["dx"], dw, db, workspace=ws)
            else:
                k(s["dz"], s["x"], s["rs"], w, s["dx"], dw, workspace=ws)

        add("bwd", impl, bwd_bytes, runb, kb)
    for impl, f in variants:

        def tb(f=f):
            s = bc.next()
            if ln:
                f["bwd"](s["dz"], s["x"], s["mu"][:, None], s["rs"][:, None], w, b)
            else:
                f["bwd"](s["dz"], s["x"], s["rs"], w)

        add("bwd", impl, bwd_bytes, tb)
    pair("bwd")
    if not ln:  # also autograd through F.rms_norm, as a model would run it
        x = bc.sets[0]["x"].detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        y = torch.nn.functional.rms_norm(x, (h,), wr, EPS)
        dz = bc.sets[0]["dz"]
        add("bwd", "torch eager autograd", bwd_bytes,
            lambda: torch.autograd.grad(y, (x, wr), dz, retain_graph=True))  # fmt: skip
    bc.sets.clear()
    torch.cuda.empty_cache()
    return rows


DEFAULTS = {"shapes": ",".join(f"{n}x{h}" for n, h in CASES), "repeat": 50, "paired": 20}
NORMS = ("layernorm", "rmsnorm")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments for this family, or None."""
    if not set(filter(None, args.ops.split(","))) <= set(NORMS):
        return f"--ops {args.ops!r}: layernorm, rmsnorm or both"
    if args.compile_ops or args.kernels != "specialized":
        return "the norm family takes no --compile-ops or --kernels (it runs both kernels)"
    return None


def norms(args: argparse.Namespace) -> list[str]:
    return [n for n in args.ops.split(",") if n] or list(NORMS)


def kernels(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(op, get_kernel fields) of every engine kernel the run launches."""
    out = []
    for norm in norms(args):
        for _, h in args.shapes:
            for hidden in (h, None):
                out += [(f"{norm}_fwd", {"in_dtype": "bf16", "hidden_size": hidden}),
                        (f"{norm}_fwd", {"in_dtype": "bf16", "out_dtype": "fp8",
                                         "hidden_size": hidden}),
                        (f"{norm}_bwd", {"in_dtype": "bf16", "hidden_size": hidden})]  # fmt: skip
    return out


def run(args: argparse.Namespace, reference: common.CopyReference, copy: float) -> dict[str, Any]:
    """The family's result payload, rows against ``copy`` (the reference copy's GB/s)."""
    rows = []
    for norm in norms(args):
        for n, h in args.shapes:
            rows += bench_shape(norm, n, h, args, reference)
    for r in rows:
        r["pct_of_copy"] = 100.0 * r["gbps"] / copy if r["gbps"] else None
    return {"dtype": "bf16", "eps": EPS, "repeat": args.repeat, "paired_rounds": args.paired,
            "rows": rows}  # fmt: skip


def show(payload: dict[str, Any]) -> str:
    """The table printed at the end of a run."""
    return common.table(payload["rows"], [
        ("norm", "norm", ""), ("case", "case", ""), ("tokens", "N", "d"), ("hidden", "H", "d"),
        ("impl", "implementation", ""), ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"),
        ("pct_of_copy", "% of copy", ".1f"), ("pct_of_copy_paired", "% of copy, paired", ".1f"),
        ("vs_compile_paired", "x compile, paired", ".3f"),
        ("faster_than_compile", "won", ".2f"), ("kernel", "kernel", ""), ("error", "error", ""),
    ])  # fmt: skip
