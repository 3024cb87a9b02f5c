"""What the last, partial wave of a persistent norm forward costs.

    python bench/norm_tail.py [--cases layernorm:4096:fp8:16384,rmsnorm:65536:fp8:2048]
                              [--rounds 10] [--name norm_tail]

A staged forward's grid is persistent: G clusters (``Kernel.launch_grid``) take row groups
i, i + G, ... So N rows are N / G waves, and where G does not divide N the last wave is
partial: at 2048 rows over 62 clusters, 2 clusters take a 34th row while 60 stop at 33. This
script times each case's kernel at N and at the whole waves around it, floor(N / G) * G and
ceil(N / G) * G rows, and a device copy (torch ``copy_``) of the same bytes at each, in
paired rounds (common.paired_ms), each call on its own buffers (norm_bandwidth.Cycle).

Reading: ``wave_us`` is the time of one whole wave (the difference of the two whole-wave
times); ``tail_us`` what N costs over the whole waves below it, against ``tail_share_us``,
the same fraction of a wave. A tail near a whole wave where its share is small is time the
partial wave leaves the rest of the GPU idle; near its share, the partial wave costs what
its rows do. ``--cases`` NORM:H:OUT:N, NORM layernorm or rmsnorm, OUT bf16 or fp8 (tensor
scaling). Writes bench/results/NAME.json (and $OUT/NAME.json when set).
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
from norm_bandwidth import Cycle, forward_rows, forward_weights, kernel_forward, same_bytes_copy

DEFAULT_CASES = "layernorm:4096:fp8:16384,rmsnorm:65536:fp8:2048"


def parse_cases(text: str) -> list[tuple[str, int, str, int]]:
    """``NORM:H:OUT:N,...`` as (norm, H, out, N); ValueError names a bad one."""
    cases = []
    for item in text.split(","):
        parts = item.split(":")
        if (len(parts) != 4 or parts[0] not in ("layernorm", "rmsnorm")
                or parts[2] not in ("bf16", "fp8") or not parts[1].isdigit()
                or not parts[3].isdigit() or int(parts[1]) < 1 or int(parts[3]) < 1):  # fmt: skip
            raise ValueError(f"{item!r}: NORM:H:OUT:N, NORM layernorm or rmsnorm, H and N >= 1, "
                             "OUT bf16 or fp8; e.g. rmsnorm:65536:fp8:2048")  # fmt: skip
        cases.append((parts[0], int(parts[1]), parts[2], int(parts[3])))
    return cases


def time_case(norm: str, h: int, out: str, n: int, rounds: int) -> dict[str, Any]:
    """The kernel's and the same-bytes copy's ms per call at N and the whole waves around it."""
    import torch

    import nvrtc_engine as ne

    fp8 = out == "fp8"
    k = ne.get_kernel(f"{norm}_fwd", in_dtype="bf16", out_dtype=out, hidden_size=h)
    device = torch.cuda.current_device()
    grid = k.launch_grid(n, device=device) // k.config.cluster  # clusters (CTAs)
    per_wave = grid * k.config.rows
    low, high = n // per_wave * per_wave, -(-n // per_wave) * per_wave
    sizes = sorted({s for s in (low, n, high, high + per_wave if low == high else 0) if s})
    w, b, extra = forward_weights(h, fp8)
    fns: dict[tuple[str, int], Any] = {}
    nbytes: dict[int, int] = {}
    keep = []
    for rows in sizes:
        nbytes[rows] = rows * h * (2 + (1 if fp8 else 2))
        kc = Cycle(functools.partial(forward_rows, rows, h, fp8), nbytes[rows])
        fns[("kernel", rows)] = kernel_forward(k, kc, norm == "layernorm", w, b, **extra)
        fns[("copy", rows)], cc = same_bytes_copy(nbytes[rows])
        keep += [kc, cc]
    times = common.paired_ms(fns, rounds=rounds, seed=h)
    us = {key: 1e3 * statistics.median(v) for key, v in times.items()}
    result: dict[str, Any] = {
        "case": f"{norm}:{h}:{out}:{n}", "kernel": k.artifact.symbols[0],
        "residency": k.residency(device), "clusters": grid, "rows_per_wave": per_wave,
        "sizes": [{"rows": s, "bytes": nbytes[s], "kernel_us": us[("kernel", s)],
                   "copy_us": us[("copy", s)],
                   "kernel_us_rounds": [1e3 * t for t in times[("kernel", s)]],
                   "copy_us_rounds": [1e3 * t for t in times[("copy", s)]]} for s in sizes],
    }  # fmt: skip
    if low != high and low:
        for impl in ("kernel", "copy"):
            wave = us[(impl, high)] - us[(impl, low)]
            result[f"{impl}_wave_us"] = wave
            result[f"{impl}_tail_us"] = us[(impl, n)] - us[(impl, low)]
        result["tail_share_us"] = result["kernel_wave_us"] * (n - low) / per_wave
    del keep
    torch.cuda.empty_cache()
    return result


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--cases", default=DEFAULT_CASES, help="NORM:H:OUT:N,... (see above)")
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds (default 10)")
    parser.add_argument("--name", type=common.result_name, default="norm_tail",
                        help="bench/results/NAME.json (default %(default)s)")  # fmt: skip
    args = parser.parse_args()
    try:
        cases = parse_cases(args.cases)
    except ValueError as exc:
        parser.error(f"--cases {exc}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    torch = common.torch_or_exit(parser)
    torch.manual_seed(0)
    results = []
    for case in cases:
        r = time_case(*case, args.rounds)
        results.append(r)
        print(f"{r['case']} ({r['kernel']}): {r['clusters']} clusters, "
              f"{r['rows_per_wave']} rows a wave")  # fmt: skip
        for s in r["sizes"]:
            print(f"  {s['rows']:6d} rows: kernel {s['kernel_us']:7.1f} us, "
                  f"copy {s['copy_us']:7.1f} us")  # fmt: skip
        if "kernel_wave_us" in r:
            print(f"  a wave: kernel {r['kernel_wave_us']:.2f} us, copy {r['copy_wave_us']:.2f} "
                  f"us; the partial wave: kernel {r['kernel_tail_us']:.2f} us (its share "
                  f"{r['tail_share_us']:.2f}), copy {r['copy_tail_us']:.2f} us")  # fmt: skip
    path = common.write_results(args.name, {
        **common.gpu_info(), **common.host_info(), "benchmark": args.name,
        "rounds": args.rounds, "cases": results,
    })  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
