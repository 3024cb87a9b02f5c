"""Threads x unroll sweep behind the row-flat activation kernel's defaults (``row_config`` in
nvrtc_engine/ops/activation.py: gated and dgated ops without MXFP8, MXFP8 rowwise outputs).

    python bench/tuning/activation_row_tuning.py [--tokens 16384] [--hidden 8192] [--rounds 2]
                                          [--repeat 20] [--workers 8]
                                          [--cases "reglu:mxfp8 rowwise,..."] [--name NAME]

For swiglu, geglu and dswiglu (bf16 input tokens x 2*hidden) to bf16, to fp8_e4m3 with tensor
scaling and to MXFP8 rowwise, and gelu and dgelu (tokens x hidden) to MXFP8 rowwise (plain
ops without MXFP8 run the flat kernel, not this one): times every threads-per-block x
chunks-in-flight-per-thread configuration of CANDIDATES, each with the key's hidden_size None
(the run-time size) and compiled in (``hidden_size=hidden``); for the plain ops also the
``owner`` mode (a thread owns whole 32-value blocks; ``unroll`` counts blocks); for MXFP8
rowwise also ``split_scales`` (SPLIT: a block's lanes share its E8M0 work) and for FP8
outputs ``fp8_words=False`` (BYTES: FP8 stored byte by byte, the kernel before). A summary
gives each case's best per mode. Variants
compile in parallel (``--workers`` threads, each with its configuration thread-local), then
the whole sweep runs ``--rounds`` times (median reported, spread shown). GB/s counts each
tensor once, MXFP8 scale bytes included. Prints the best configurations per case and the
default's rank; writes bench/results/activation_row_tuning.json (``--name``: another file).
``--cases`` sweeps only the given op:output pairs (any gated or plain op, e.g. reglu). MXFP8
rowwise gated cases also try WIDE (more chunks in flight per block).
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
# Variants differ by monkeypatched configurations that neither the key nor the key index's
# environment fingerprint sees: compile each in memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import activation_tile_tuning as tt
import common
import families.activation as ab

CASES = [(op, out) for op in ("swiglu", "geglu", "dswiglu")
         for out in ("bf16", "fp8 tensor", "mxfp8 rowwise")]  # fmt: skip
CASES += [("gelu", "mxfp8 rowwise"), ("dgelu", "mxfp8 rowwise")]
# (threads, unroll): around the measured optima (256 x 1 without scaling, 128 x 4 otherwise)
CANDIDATES = [(128, 1), (128, 2), (128, 4), (256, 1), (256, 2), (256, 4), (512, 1), (512, 2)]
OWNER = [(128, 1), (128, 2), (256, 1), (256, 2)]  # plain ops, MXFP8: blocks per thread
# MXFP8 rowwise, also timed with split_scales (unroll a multiple of 4: bf16 input) ...
SPLIT = [(128, 4), (256, 4), (128, 8), (64, 8)]
BYTES = [(128, 4), (256, 1)]  # ... and with fp8_words=False (FP8 stored as bytes, before)
WIDE = [(512, 4), (256, 8), (1024, 2)]  # MXFP8 rowwise, gated: more bytes in flight per block


def main() -> int:
    sys.argv, workers = _pop(sys.argv, "--workers", "8")
    sys.argv, only = _pop(sys.argv, "--cases", "")
    sys.argv, name = _pop(sys.argv, "--name", "activation_row_tuning")
    cases = [tuple(c.split(":", 1)) for c in only.split(",")] if only else CASES
    args = tt.parse_args(__doc__, rounds=True)
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.activation as activation

    copy = common.copy_bandwidth_gbps()
    chosen = activation.row_config
    local = threading.local()  # each compiling thread's configuration
    activation.row_config = lambda key: local.config
    started = time.perf_counter()
    rows = []
    try:
        for op, output in cases:
            inputs, shape = ab.make_inputs(op, args.tokens, args.hidden)
            nbytes = ab.traffic(op, output, args.tokens, args.hidden)
            fields = ab.kernel_fields(output)
            default = chosen(ne.make_key(op, **fields))
            configs = [activation.LaunchConfig(t, u) for t, u in CANDIDATES]
            if op in ("gelu", "dgelu"):
                configs += [activation.LaunchConfig(t, u, owner=True) for t, u in OWNER]
            if output == "mxfp8 rowwise":
                configs += [activation.LaunchConfig(t, u, split_scales=True) for t, u in SPLIT]
                if op not in ("gelu", "dgelu"):
                    configs += [activation.LaunchConfig(t, u) for t, u in WIDE]
            if output != "bf16":
                configs += [activation.LaunchConfig(t, u, fp8_words=False) for t, u in BYTES]
            variants = list(itertools.product(configs, (None, args.hidden)))

            built = tt.compile_variants(op, fields, variants, local, int(workers))
            calls = {}
            for (config, hidden_size), kernel in zip(variants, built, strict=True):
                row = {"op": op, "output": output, "threads": config.threads,
                       "unroll": config.unroll, "owner": config.owner,
                       "split_scales": config.split_scales, "fp8_words": config.fp8_words,
                       "hidden_size": hidden_size, "default": config == default,
                       "ms_rounds": []}  # fmt: skip
                rows.append(row)
                if isinstance(kernel, str):
                    row["error"] = kernel
                    continue
                fn = tt.launcher(op, output, inputs, shape, kernel)
                if isinstance(fn, str):
                    row["error"] = fn
                    continue
                calls[len(rows) - 1] = fn
            for _ in range(args.rounds):
                for i, fn in calls.items():
                    rows[i]["ms_rounds"].append(common.cuda_time_ms(fn, repeat=args.repeat))
            for i in calls:
                r = rows[i]
                r["ms"] = statistics.median(r["ms_rounds"])
                r["gbps"] = nbytes / (r["ms"] * 1e-3) / 1e9
                r["pct"] = 100 * r["gbps"] / copy
                pcts = [100 * nbytes / (t * 1e-3) / 1e9 / copy for t in r["ms_rounds"]]
                r["spread"] = max(pcts) - min(pcts)
            del inputs, calls
            torch.cuda.empty_cache()
            print(f"{op} {output} done ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        activation.row_config = chosen
    path = common.write_results(name, {
        **common.gpu_info(), "copy_gbps": copy, "shape": [args.tokens, args.hidden],
        "rounds": args.rounds, "rows": rows,
    })  # fmt: skip
    shown = [{**r, "h": r["hidden_size"] or "any", "mode": mode(r)} for r in tt.ranked(rows, 5)]
    print(f"device copy {copy:.0f} GB/s")
    print(common.table(shown, [
        ("default", "default", ""), ("rank", "rank", ""), ("op", "op", ""),
        ("output", "output", ""), ("threads", "thr", ""), ("unroll", "unroll", ""),
        ("mode", "mode", ""), ("h", "h", ""), ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"),
        ("pct", "% copy", ".1f"), ("spread", "+-", ".1f"),
    ]))  # fmt: skip
    tt.switch_summary(rows, mode)
    for r in rows:
        if "error" in r:
            print(f"{r['op']} {r['output']} {r['threads']}x{r['unroll']}: {r['error']}")
    print(f"wrote {path}")
    return 0


def mode(r: dict) -> str:
    """The row's kernel mode: owner / split (split_scales) / lane, " bytes" without fp8_words."""
    m = "owner" if r["owner"] else "split" if r["split_scales"] else "lane"
    return m + ("" if r["fp8_words"] else " bytes")


def _pop(argv: list[str], flag: str, default: str) -> tuple[list[str], str]:
    """``flag VALUE`` taken out of argv (before tt.parse_args sees it), or ``default``."""
    out, value, i = [], default, 0
    while i < len(argv):
        if argv[i] == flag and i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out, value


if __name__ == "__main__":
    sys.exit(main())
