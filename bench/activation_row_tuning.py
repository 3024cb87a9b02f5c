"""Threads x unroll sweep behind the row-flat activation kernel's defaults (``row_config`` in
nvrtc_engine/ops/activation.py: gated and dgated ops without MXFP8, MXFP8 rowwise outputs).

    python bench/activation_row_tuning.py [--tokens 16384] [--hidden 8192] [--rounds 2]
                                          [--repeat 20]

For swiglu and geglu (bf16 input tokens x 2*hidden) to bf16, to fp8_e4m3 with tensor scaling
and to MXFP8 rowwise; gelu (tokens x hidden) to MXFP8 rowwise; dswiglu to bf16 and to MXFP8
rowwise: times every threads-per-block x chunks-in-flight-per-thread configuration, with the
key's hidden_size None (the run-time size, as bench/activation_bandwidth.py uses) and, for
the default configuration, also compiled in (``hidden_size=hidden``). The whole sweep runs
``--rounds`` times (median reported, spread shown). GB/s counts each tensor once, MXFP8
scale bytes included. Prints the best configurations per case and the default's rank;
writes bench/results/activation_row_tuning.json.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Variants differ by monkeypatched configurations that neither the key nor the key index's
# environment fingerprint sees: compile each in memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import activation_bandwidth as ab
import activation_tile_tuning as tt
import common

CASES = [("swiglu", "bf16"), ("swiglu", "fp8 tensor"), ("swiglu", "mxfp8 rowwise"),
         ("geglu", "bf16"), ("geglu", "fp8 tensor"), ("geglu", "mxfp8 rowwise"),
         ("gelu", "mxfp8 rowwise"), ("dswiglu", "bf16"), ("dswiglu", "mxfp8 rowwise")]  # fmt: skip
THREADS = [128, 256, 512, 1024]
UNROLL = [1, 2, 4, 8]


def main() -> int:
    args = tt.parse_args(__doc__, rounds=True)
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.activation as activation
    from nvrtc_engine.engine import Engine

    copy = common.copy_bandwidth_gbps()
    chosen = activation.row_config
    started = time.perf_counter()
    rows = []
    try:
        for op, output in CASES:
            inputs, shape = ab.make_inputs(op, args.tokens, args.hidden)
            nbytes = ab.traffic(op, output, args.tokens, args.hidden)
            fields = ab.kernel_fields(output)
            default = chosen(ne.make_key(op, **fields))
            variants = [(t, u, None) for t, u in itertools.product(THREADS, UNROLL)]
            variants.append((default.threads, default.unroll, args.hidden))
            calls = {}
            for threads, unroll, hidden_size in variants:
                config = activation.LaunchConfig(threads, unroll)
                row = {"op": op, "output": output, "threads": threads, "unroll": unroll,
                       "hidden_size": hidden_size, "default": config == default,
                       "ms_rounds": []}  # fmt: skip
                activation.row_config = lambda key, config=config: config
                engine = Engine()  # a fresh memory cache: the configuration is rendered anew

                def get(op_, engine=engine, hidden_size=hidden_size, **kw):
                    return engine.get(ne.make_key(op_, hidden_size=hidden_size, **kw))

                try:
                    fn = ab.engine_call(op, output, inputs, shape, get_kernel=get)
                    fn()  # load the module and launch once while the configuration holds
                    torch.cuda.synchronize()
                except Exception as exc:  # a configuration that does not compile or launch
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                finally:
                    activation.row_config = chosen
                rows.append(row)
                if "error" not in row:
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
    path = common.write_results("activation_row_tuning", {
        **common.gpu_info(), "copy_gbps": copy, "shape": [args.tokens, args.hidden],
        "rounds": args.rounds, "rows": rows,
    })  # fmt: skip
    shown = [{**r, "h": r["hidden_size"] or "any"} for r in tt.ranked(rows, 5)]
    print(f"device copy {copy:.0f} GB/s")
    print(common.table(shown, [
        ("default", "default", ""), ("rank", "rank", ""), ("op", "op", ""),
        ("output", "output", ""), ("threads", "thr", ""), ("unroll", "unroll", ""),
        ("h", "h", ""), ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"), ("pct", "% copy", ".1f"),
        ("spread", "+-", ".1f"),
    ]))  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['op']} {r['output']} {r['threads']}x{r['unroll']}: {r['error']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
