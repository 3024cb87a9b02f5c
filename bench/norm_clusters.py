"""How a persistent norm forward's time depends on the clusters its grid has: the same kernel
with its grid capped at fewer clusters than the GPU holds at once, in paired rounds.

    python bench/norm_clusters.py [--case rmsnorm:65536:fp8] [--tokens 2048]
                                  [--caps 0,-1,-2,-4,-6] [--rounds 20] [--name norm_clusters]

Why: a persistent grid has at most as many clusters as are resident at once
(``cuOccupancyMaxActiveClusters``), and with clusters of 8 CTAs that number depends on how
a GPU's SMs fall into GPCs, which differs between GPUs of the same model. Capping the grid
on one GPU shows what a GPU that holds fewer clusters would give, with everything else the
same. ``--caps``: 0 is the grid as launched (the resident clusters, or fewer where the
kernel caps its CTAs per SM, ``b``); -k is k clusters fewer; a positive number is that many
clusters; the grid as launched is always timed, as the reference. ``--case`` NORM:H:OUT,
NORM layernorm or rmsnorm, OUT bf16 or fp8 (tensor scaling). Every call touches its own
buffers (norm_bandwidth.Cycle); ``vs_full`` is the same-round ratio of the full grid's time
over the capped one's (below 1: the capped grid is slower). Writes bench/results/NAME.json
(and $OUT/NAME.json when set).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from norm_bandwidth import Cycle, forward_rows, forward_weights, kernel_forward


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--case", default="rmsnorm:65536:fp8", help="NORM:H:OUT")
    parser.add_argument("--tokens", type=int, default=2048, help="rows (default 2048)")
    parser.add_argument("--caps", default="0,-1,-2,-4,-6",
                        help="clusters (see above; a list that starts with '-' needs '=', "
                        "--caps=-1,-2; the full grid is always timed; "
                        "default %(default)s)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds (default 20)")
    parser.add_argument("--name", type=common.result_name, default="norm_clusters",
                        help="bench/results/NAME.json (default %(default)s)")  # fmt: skip
    args = parser.parse_args()
    parts = args.case.split(":")
    if (len(parts) != 3 or parts[0] not in ("layernorm", "rmsnorm") or not parts[1].isdigit()
            or int(parts[1]) < 1 or parts[2] not in ("bf16", "fp8")):  # fmt: skip
        parser.error(f"--case {args.case!r}: NORM:H:OUT, NORM layernorm or rmsnorm, H >= 1, "
                     "OUT bf16 or fp8; e.g. rmsnorm:65536:fp8")  # fmt: skip
    try:
        caps = [int(c) for c in args.caps.split(",")]
    except ValueError:
        parser.error(f"--caps {args.caps!r}: comma-separated integers")
    if args.tokens < 1 or args.rounds < 1:
        parser.error("--tokens and --rounds must be at least 1")
    torch = common.torch_or_exit(parser)

    import nvrtc_engine as ne
    from nvrtc_engine.engine import Engine

    name, h, out = parts[0], int(parts[1]), parts[2]
    n = args.tokens
    fp8 = out == "fp8"
    k = ne.get_kernel(f"{name}_fwd", in_dtype="bf16", out_dtype="fp8" if fp8 else "bf16",
                      hidden_size=h)  # fmt: skip
    cfg = k.config
    if cfg.mode != "regs" or not cfg.stages:
        parser.error(f"{args.case}: its kernel ({cfg.tag}) has no persistent grid")
    device = torch.cuda.current_device()
    res = k.residency(device)
    full = k.launch_grid(n, device=device) // cfg.cluster
    counts = sorted({full} | {full + c if c <= 0 else c for c in caps}, reverse=True)
    if min(counts) < 1 or max(counts) > full:
        parser.error(f"--caps {args.caps!r}: between 1 and {full} clusters on this GPU")

    torch.manual_seed(0)
    w, b, extra = forward_weights(h, fp8)
    cycle = Cycle(lambda: forward_rows(n, h, fp8), n * h * 2)

    def capped(count: int) -> Any:
        """A call of a fresh kernel object of the same image whose grid is capped at
        ``count`` clusters (its own ``_grid``, which its launch plans take)."""
        fresh = Engine().get(k.key)
        grid = fresh._grid
        fresh._grid = lambda *a: min(grid(*a), count * cfg.cluster)  # type: ignore[method-assign]
        call = kernel_forward(fresh, cycle, name == "layernorm", w, b, **extra)
        call()
        torch.cuda.synchronize()
        return call

    fns = {c: capped(c) for c in counts}
    times = common.paired_ms(fns, rounds=args.rounds, seed=h)
    ratios = common.paired_ratios(times, full)
    nbytes = n * h * (2 + (1 if fp8 else 2)) + h * 2 * (2 if name == "layernorm" else 1)
    copy = common.copy_bandwidth_gbps()
    rows = []
    for c in counts:
        ms = sorted(times[c])[len(times[c]) // 2]
        gbps = nbytes / (ms * 1e-3) / 1e9
        rows.append({"clusters": c, "max_rows_per_cluster": -(-n // c), "ms": ms, "gbps": gbps,
                     "pct_copy": 100 * gbps / copy, "vs_full": ratios[c]["median"],
                     "full_faster": 1 - ratios[c]["faster"] if c != full else None})  # fmt: skip
        print(
            f"{c:4d} clusters ({-(-n // c)} rows max): {ms * 1e3:7.1f} us "
            f"{100 * gbps / copy:5.1f}% of copy, x full {ratios[c]['median']:.3f}"
        )
    common.write_results(args.name, {
        "benchmark": args.name, "case": args.case, "tokens": n, "kernel": k.artifact.symbols[0],
        "residency": res, "copy_gbps": copy, "rounds": args.rounds, "rows": rows,
        **common.gpu_info(), **common.host_info(),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
