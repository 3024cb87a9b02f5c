"""How much of a norm forward's time is a fixed cost per call, and how much is bandwidth.

    python bench/norm_fixed_cost.py [--rounds 3] [--repeat 20] [--name norm_fixed_cost]

bench/norm_bandwidth.py judges each kernel against the copy bandwidth of a 1 GiB copy, a
0.5 ms kernel. LayerNorm FP8 at 16384 x 4096 moves 192 MiB in about 56 us, so a fixed cost
per call (the launch of the grid, the first loads' latency, the last row's tail, the gap
between two kernels of a batch) weighs ten times more on it. This script times each case's
specialized kernel (the TUNED layout, as norm_bandwidth.py runs it) at four row counts and a
device copy (torch ``copy_``) of the same bytes at each, in paired rounds
(common.paired_ms: every round times every function once, in a shuffled order), each call
on its own buffers (norm_bandwidth.Cycle: nothing is served from L2). A least-squares line
through (bytes, time) gives each its fixed cost (us) and its marginal bandwidth (GB/s).

Reading: if a kernel's marginal bandwidth is at or above 90% of the copy's while its figure
at the issue's shape is not, the shortfall is the fixed cost, which no change inside the
row's arithmetic removes. Where the kernels are programmatic dependent launches (sm_90+,
``NVRTC_ENGINE_DEPENDENT_LAUNCH``), the same kernel made with them off is timed too
(``ordinary``) in the same rounds; ``dependent_speedup`` is the median same-round ratio.
Writes bench/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from norm_bandwidth import EPS, Cycle, forward_rows, forward_weights, same_bytes_copy

# (op, H, out, the issue's N, the row counts timed)
CASES = [
    ("layernorm_fwd", 4096, "fp8", 16384, (8192, 16384, 32768, 65536)),
    ("layernorm_fwd", 4096, "bf16", 16384, (8192, 16384, 32768, 65536)),
    ("rmsnorm_fwd", 4096, "fp8", 16384, (8192, 16384, 32768, 65536)),
    ("layernorm_fwd", 8192, "fp8", 16384, (4096, 8192, 16384, 32768)),
    ("rmsnorm_fwd", 8192, "bf16", 16384, (4096, 8192, 16384, 32768)),
    ("layernorm_fwd", 65536, "fp8", 2048, (1024, 2048, 4096, 8192)),
    ("rmsnorm_fwd", 65536, "fp8", 2048, (1024, 2048, 4096, 8192)),
    ("layernorm_fwd", 65536, "bf16", 2048, (1024, 2048, 4096, 8192)),
    ("rmsnorm_fwd", 65536, "bf16", 2048, (1024, 2048, 4096, 8192)),
]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``ms = a + bytes * b`` through (bytes, ms): returns (a in us, 1/b in GB/s)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return (my - slope * mx) * 1e3, 1.0 / (slope * 1e-3) / 1e9


def time_case(op: str, h: int, out: str, sizes: tuple[int, ...], args: Any) -> dict[str, Any]:
    """Per row count: the kernel's and the same-bytes copy's milliseconds per call (median
    over rounds), and the two fits."""
    import torch

    import nvrtc_engine as ne

    ln = op.startswith("layernorm")
    fp8 = out == "fp8"
    kernels = {}
    for impl, dependent in (("kernel", True), ("ordinary", False)):
        ne.configure(dependent_launch=dependent)  # a kernel decides when it is made
        ne.clear_cache(disk=False)
        kernels[impl] = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, hidden_size=h)
    ne.configure(dependent_launch=True)
    kernel = kernels["kernel"]
    w, b, kw = forward_weights(h, fp8)
    fns: dict[tuple[str, int], Any] = {}
    nbytes: dict[int, int] = {}
    keep = []
    for n in sizes:
        elem = n * h
        nbytes[n] = 2 * elem + elem * (1 if fp8 else 2) + h * 2 * (2 if ln else 1)
        kc = Cycle(functools.partial(forward_rows, n, h, fp8), nbytes[n])

        def run(kc: Cycle = kc, kernel: Any = kernel) -> None:
            s = kc.next()
            if ln:
                kernel(s["x"], w, b, EPS, s["z"], s["mu"], s["rs"], **kw)
            else:
                kernel(s["x"], w, EPS, s["z"], s["rs"], **kw)

        copy, cc = same_bytes_copy(nbytes[n])
        fns[("kernel", n)], fns[("copy", n)] = run, copy
        if kernels["ordinary"]._dependent != kernel._dependent:
            fns[("ordinary", n)] = functools.partial(run, kc, kernels["ordinary"])
        keep += [kc, cc]
    times = common.paired_ms(fns, rounds=args.rounds, repeat=args.repeat)
    ms = {k: statistics.median(v) for k, v in times.items()}
    impls = sorted({impl for impl, _ in fns})
    result: dict[str, Any] = {"op": op, "hidden": h, "out": out,
                              "kernel": kernel.artifact.symbols[0],
                              "dependent_launch": kernel._dependent, "sizes": []}  # fmt: skip
    for n in sizes:
        entry: dict[str, Any] = {"rows": n, "bytes": nbytes[n]}
        for impl in impls:
            entry[f"{impl}_ms"] = ms[(impl, n)]
            entry[f"{impl}_gbps"] = nbytes[n] / (ms[(impl, n)] * 1e-3) / 1e9
            entry[f"{impl}_ms_rounds"] = times[(impl, n)]
        if "ordinary" in impls:  # same-round ratios: above 1, the dependent launch is faster
            entry["dependent_speedup"] = statistics.median(
                o / k for o, k in zip(times[("ordinary", n)], times[("kernel", n)], strict=True)
            )
        result["sizes"].append(entry)
    for impl in impls:
        a_us, gbps = fit([(nbytes[n], ms[(impl, n)]) for n in sizes])
        result[f"{impl}_fixed_us"], result[f"{impl}_marginal_gbps"] = a_us, gbps
    del keep
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--name", type=common.result_name, default="norm_fixed_cost")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    results = []
    rows = []
    for op, h, out, issue_n, sizes in CASES:
        r = time_case(op, h, out, sizes, args)
        results.append(r)
        at = next(s for s in r["sizes"] if s["rows"] == issue_n)
        rows.append({
            "case": f"{op} {out} {issue_n}x{h}", "pct": 100 * at["kernel_gbps"] / copy,
            "same": 100 * at["kernel_gbps"] / at["copy_gbps"],
            "copy_pct": 100 * at["copy_gbps"] / copy,
            "k_fixed": r["kernel_fixed_us"], "k_marg": 100 * r["kernel_marginal_gbps"] / copy,
            "c_fixed": r["copy_fixed_us"], "c_marg": 100 * r["copy_marginal_gbps"] / copy,
            "us": at["kernel_ms"] * 1e3, "o_fixed": r.get("ordinary_fixed_us"),
            "o_pct": 100 * at["ordinary_gbps"] / copy if "ordinary_gbps" in at else None,
            "speedup": at.get("dependent_speedup"),
        })  # fmt: skip
        print(f"{rows[-1]['case']}: {rows[-1]['pct']:.1f}% of copy", flush=True)
    path = common.write_results(args.name, {
        **common.gpu_info(), "copy_gbps": copy, "rounds": args.rounds, "repeat": args.repeat,
        "cases": results, "summary": rows,
    })  # fmt: skip
    print(f"device copy (1 GiB): {copy:.0f} GB/s; % columns are of it unless named otherwise")
    print(common.table(rows, [
        ("case", "case (issue's shape)", ""), ("us", "us", ".1f"), ("pct", "% of copy", ".1f"),
        ("copy_pct", "same-bytes copy, % of copy", ".1f"),
        ("same", "% of same-bytes copy", ".1f"), ("k_fixed", "kernel fixed us", ".1f"),
        ("k_marg", "kernel marginal %", ".1f"), ("c_fixed", "copy fixed us", ".1f"),
        ("c_marg", "copy marginal %", ".1f"), ("o_pct", "ordinary launch, % of copy", ".1f"),
        ("o_fixed", "ordinary fixed us", ".1f"), ("speedup", "x ordinary", ".3f"),
    ]))  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
