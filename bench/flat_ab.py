"""Paired A/B of the flat kernel's tensor-scaled launch configurations (``launch_config`` in
nvrtc_engine/ops/activation.py), op by op, on the H200.

    python bench/flat_ab.py [--shapes 16384x8192,8192x28672] [--ops cast,gelu]
        [--configs default,512x2x16+s-g,...] [--rounds 20] [--zero-amax] [--name flat_ab]

A configuration is ``THREADSxUNROLLxCHUNK_BYTES`` with optional ``+s``/``-s`` (streaming cache
hints on/off) and ``+g``/``-g`` (the guarded amax atomic on/off); without them the module-wide
``CODEGEN`` setting applies; ``default`` is the op's current configuration. A suffix ``@gN``
caps the grid at N blocks (``activation.MAX_GRID`` while the call is planned; the kernel's
blocks then loop over the rest), e.g. ``default@g1056``. The first
configuration is the baseline. Every op x configuration of a shape is timed in each round, in
an order shuffled per round (``common.paired_ms``), and each candidate is reported as the
median over rounds of its speed relative to the baseline *in the same round*: the shared
GPU's speed drifts by more than the differences sought (bench/results/logs/
flat-config-ab-2026-12-01.txt), and a same-round ratio cancels the drift. bf16 input, FP8
E4M3 output with tensor scaling; % of copy counts input(s) + output once (gradient ops,
``dgelu`` etc., read grad and x). ``--zero-amax`` zeroes the amax word before every call
(inside the timing, for every candidate alike), as a training step does; by default the word
keeps its maximum, as in bench/cast_bandwidth.py. Needs torch and a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Variants differ by monkeypatched configurations that the key does not see: compile each in
# memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import common

DEFAULT_CONFIGS = "default,512x2x16+s-g,512x2x16-g,512x2x16+s,256x1x32+s,128x2x32+s,128x2x32"


def parse_config(text: str, activation: Any) -> tuple[Any, dict[str, bool]]:
    """``(LaunchConfig, CODEGEN switches)`` from ``THREADSxUNROLLxCHUNK[+s|-s][+g|-g]``;
    ``(None, {})`` for ``default``."""
    if text == "default":
        return None, {}
    body, switches = text, {}
    for letter, field in (("s", "streaming"), ("g", "amax_guard")):
        for sign, value in (("+", True), ("-", False)):
            if sign + letter in body:
                body = body.replace(sign + letter, "")
                switches[field] = value
    threads, unroll, chunk = (int(v) for v in body.split("x"))
    return activation.LaunchConfig(threads, unroll, chunk), switches


def _call(kernel: Any, inputs: tuple[Any, ...], y8: Any, scale: Any, amax: Any, scale_inv: Any,
          zero: bool) -> Any:  # fmt: skip
    """One timed call of ``kernel`` on ``inputs`` (x, or grad and x for a gradient op), with
    the amax word zeroed first when ``zero``."""
    tensor = {"scale": scale, "amax": amax, "scale_inv": scale_inv}
    if zero:
        return lambda: (amax.zero_(), kernel(*inputs, y8, **tensor))
    return lambda: kernel(*inputs, y8, **tensor)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="16384x8192,8192x28672",
                        help="MxK shapes of the bf16 input (default: %(default)s)")  # fmt: skip
    parser.add_argument("--ops", default="cast,gelu",
                        help="flat ops with tensor scaling (default: %(default)s)")  # fmt: skip
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help="comma-separated; the first is the baseline; 'default' is the "
                        "op's current configuration (default: %(default)s)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=20,
                        help="paired rounds (default: %(default)s)")  # fmt: skip
    parser.add_argument("--zero-amax", action="store_true",
                        help="zero the amax word before every call, inside the timing")  # fmt: skip
    parser.add_argument(
        "--name", type=common.result_name, default="flat_ab", help="bench/results/NAME.json"
    )
    args = parser.parse_args()
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.activation as activation
    from nvrtc_engine.engine import Engine
    from nvrtc_engine.ops.base import CODEGEN

    codegen = dict(CODEGEN)
    copy = common.copy_bandwidth_gbps()
    chosen = activation.launch_config
    labels = args.configs.split(",")
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        n = m * k
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        grad = None
        y8 = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda")
        scale = torch.full((1,), 2.0, device="cuda")
        amax = torch.zeros(1, device="cuda")
        scale_inv = torch.empty(1, device="cuda")
        fns = {}
        used = {}
        nbytes: dict[tuple[str, str], int] = {}
        for op in args.ops.split(","):
            for label in labels:
                text, _, cap = label.partition("@g")
                cfg, switches = parse_config(text, activation)
                key = ne.make_key(op, dtype="fp8")
                activation.launch_config = (lambda key, cfg=cfg: cfg) if cfg else chosen
                CODEGEN.update(switches)  # read when the candidate is rendered
                try:
                    kernel = Engine().get(key)
                    used[op, label] = (cfg or chosen(key), {**codegen, **switches}, cap)
                finally:
                    activation.launch_config = chosen
                    CODEGEN.update(codegen)
                if kernel._backward and grad is None:
                    grad = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                inputs = (grad, x) if kernel._backward else (x,)
                nbytes[op, label] = (2 * len(inputs) + 1) * n
                fns[op, label] = _call(kernel, inputs, y8, scale, amax, scale_inv,
                                       args.zero_amax)  # fmt: skip
                grid_cap = activation.MAX_GRID
                activation.MAX_GRID = int(cap) if cap else grid_cap
                try:  # the first call plans the launch: its grid stays with the plan
                    fns[op, label]()
                finally:
                    activation.MAX_GRID = grid_cap
        times = common.paired_ms(fns, rounds=args.rounds)
        for op in args.ops.split(","):
            ratios = common.paired_ratios({lb: times[op, lb] for lb in labels}, labels[0])
            for label in labels:
                ms = statistics.median(times[op, label])
                cfg, switches, cap = used[op, label]
                rows.append({
                    "shape": shape, "op": op, "config": label,
                    "max_grid": int(cap) if cap else None, "threads": cfg.threads,
                    "unroll": cfg.unroll, "chunk_bytes": cfg.chunk_bytes, **switches,
                    "ms_rounds": times[op, label], "ms": ms,
                    "pct": 100 * nbytes[op, label] / (ms * 1e-3) / 1e9 / copy,
                    "vs_baseline": ratios[label],
                })  # fmt: skip
        print(f"{shape} done", flush=True)
        x = y8 = grad = None
        torch.cuda.empty_cache()
    info = {**common.gpu_info(), "copy_gbps": copy, "rounds": args.rounds,
            "zero_amax": args.zero_amax, "baseline": labels[0]}  # fmt: skip
    path = common.write_results(args.name, {**info, "rows": rows})
    shown = [{**r, "x": r["vs_baseline"]["median"], "lo": r["vs_baseline"]["low"],
              "hi": r["vs_baseline"]["high"], "won": r["vs_baseline"]["faster"]}
             for r in rows]  # fmt: skip
    print(f"device copy {copy:.0f} GB/s; x = speed over {labels[0]} in the same round (median)")
    columns = [("shape", "shape", ""), ("op", "op", ""), ("config", "config", ""),
               ("ms", "ms", ".4f"), ("pct", "% copy", ".1f"), ("x", "x base", ".4f"),
               ("lo", "low", ".4f"), ("hi", "high", ".4f"), ("won", "won", ".2f")]  # fmt: skip
    print(common.table(shown, columns))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
