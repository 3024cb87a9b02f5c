"""Why a norm forward reads faster in bench/norm_tuning.py than in bench/norm_bandwidth.py.

    python bench/norm_method.py [--rounds 6] [--repeat 20] [--name norm_method]

The same TUNED kernels read up to 4-5 points of copy higher in the tuning sweeps than in the
bandwidth runs (LayerNorm FP8 at 8192: 91.6-93.2% in four sweeps; 89.3% and 88.3% in the last
two bandwidth runs, 91.2% in an earlier one).
The two scripts differ in two ways, and this one times each kernel under all four
combinations, in paired rounds (each round times every combination once, in a shuffled
order, so that a drift of the GPU's speed lands on all of them alike):

  - data: norm_bandwidth's x (``randn``) or norm_tuning's (``randn`` plus a random offset per
    row, 3 standard deviations: the sweep's guard against one-pass variance);
  - state: ``idle`` (the GPU idle for --idle seconds first, as between norm_bandwidth's
    cases, which compile torch functions and time other implementations in between) or
    ``busy`` (the kernel run back to back for --busy seconds first, as inside a sweep's
    rounds).

Each sample is common.cuda_time_ms (the median of --repeat batches of 10 calls), as both
scripts use. Writes bench/results/NAME.json: per kernel and combination the per-round
milliseconds, their median, % of copy, and each combination's median same-round ratio
against (randn, idle), the bandwidth run's conditions.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

EPS = 1e-5
# (op, N, H, out): the forwards whose sweep and run figures differ, and two that agree
CASES = [
    ("layernorm_fwd", 16384, 4096, "fp8"),
    ("layernorm_fwd", 16384, 8192, "fp8"),
    ("layernorm_fwd", 2048, 65536, "fp8"),
    ("rmsnorm_fwd", 16384, 4096, "fp8"),
    ("rmsnorm_fwd", 2048, 65536, "fp8"),
    ("layernorm_fwd", 16384, 4096, "bf16"),
    ("rmsnorm_fwd", 16384, 8192, "bf16"),
]
COMBOS = [("randn", "idle"), ("randn", "busy"), ("offsets", "idle"), ("offsets", "busy")]


def time_case(op: str, n: int, h: int, out: str, args: argparse.Namespace, copy: float) -> list:
    """One kernel under the four combinations of :data:`COMBOS`, ``args.rounds`` rounds."""
    import torch

    import nvrtc_engine as ne

    bf16 = torch.bfloat16
    ln = op.startswith("layernorm")
    kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, hidden_size=h)
    x = {"randn": torch.randn(n, h, device="cuda").to(bf16)}
    x["offsets"] = x["randn"] + (torch.randn(n, 1, device="cuda") * 3).to(bf16)
    w = (torch.randn(h, device="cuda") * 0.1 + 1).to(bf16)
    b = (torch.randn(h, device="cuda") * 0.1).to(bf16)
    fp8 = out != "bf16"
    z = torch.empty(n, h, device="cuda", dtype=torch.float8_e4m3fn if fp8 else bf16)
    mu, rs = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    kw: dict[str, Any] = {}
    if fp8:
        kw = {"scale": torch.full((1,), 2.0, device="cuda"),
              "amax": torch.zeros(1, device="cuda"),
              "scale_inv": torch.empty(1, device="cuda")}  # fmt: skip

    def call(data: str) -> None:
        if ln:
            kernel(x[data], w, b, EPS, z, mu, rs, **kw)
        else:
            kernel(x[data], w, EPS, z, rs, **kw)

    nbytes = n * h * (2 + (1 if fp8 else 2)) + h * 2 * (2 if ln else 1)
    times: dict[tuple[str, str], list[float]] = {c: [] for c in COMBOS}
    rng = random.Random(0)
    order = list(COMBOS)
    common.cuda_time_ms(lambda: call("randn"), warmup=3, repeat=2)  # load, first use
    for _ in range(args.rounds):
        rng.shuffle(order)
        for data, state in order:
            torch.cuda.synchronize()
            if state == "idle":
                time.sleep(args.idle)
            else:
                end = time.perf_counter() + args.busy
                while time.perf_counter() < end:
                    for _ in range(20):
                        call(data)
                    torch.cuda.synchronize()
            ms = common.cuda_time_ms(lambda d=data: call(d), warmup=5, repeat=args.repeat)
            times[(data, state)].append(ms)
    base = times[("randn", "idle")]
    rows = []
    for (data, state), ms in times.items():
        med = statistics.median(ms)
        rows.append({
            "op": op, "tokens": n, "hidden": h, "out": out, "data": data, "state": state,
            "kernel": kernel.artifact.symbols[0], "ms_rounds": ms, "ms": med,
            "pct_of_copy": 100.0 * nbytes / (med * 1e-3) / 1e9 / copy,
            "vs_randn_idle": statistics.median(a / b for a, b in zip(base, ms, strict=True)),
        })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--idle", type=float, default=0.3, help="seconds idle before a sample")
    parser.add_argument("--busy", type=float, default=0.1, help="seconds of calls before one")
    parser.add_argument("--name", type=common.result_name, default="norm_method")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    rows = []
    for op, n, h, out in CASES:
        rows += time_case(op, n, h, out, args, copy)
        print(f"{op} {n}x{h} {out} done", flush=True)
    path = common.write_results(args.name, {
        **common.gpu_info(), "copy_gbps": copy, "rounds": args.rounds, "repeat": args.repeat,
        "idle_s": args.idle, "busy_s": args.busy, "rows": rows,
    })  # fmt: skip
    print(f"device copy: {copy:.0f} GB/s")
    print(common.table(rows, [("op", "op", ""), ("hidden", "H", "d"), ("out", "out", ""),
                              ("data", "x", ""), ("state", "GPU before", ""),
                              ("ms", "ms", ".4f"), ("pct_of_copy", "% of copy", ".1f"),
                              ("vs_randn_idle", "speed vs randn/idle", ".3f")]))  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
