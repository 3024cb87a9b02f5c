"""Launch-configuration sweep behind the activation family's defaults (H200 numbers in
docs/performance.md).

    python bench/activation_tuning.py [--tokens 16384] [--hidden 8192]

For GELU bf16->fp8_e4m3 (tensor scaling) and bf16->bf16, and for the identity function
through the same template (the memory-only ceiling of the kernel's structure), times:
threads per block x chunks in flight per thread (unroll) x grid (capped at N blocks per SM
and looped, or one pass with as many blocks as the data needs). GB/s counts input + output
once. Writes bench/results/activation_tuning.json.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=8192)
    args = parser.parse_args()
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.activation as activation
    from nvrtc_engine.engine import Engine

    n = args.tokens * args.hidden
    x = torch.randn(args.tokens, args.hidden, device="cuda").to(torch.bfloat16)
    scale = torch.full((1,), 2.0, device="cuda")
    amax = torch.zeros(1, device="cuda")
    y8 = torch.empty(args.tokens, args.hidden, dtype=torch.float8_e4m3fn, device="cuda")
    y16 = torch.empty_like(x)
    copy = common.copy_bandwidth_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen, max_grid = activation.launch_config, activation.MAX_GRID
    spec = next(s for s in activation.ACTIVATION_SPECS if s.name == "gelu")
    rows = []
    for fn, threads, unroll, per_sm in itertools.product(
        ["gelu", "identity"], [128, 256, 512], [1, 2, 4], [4, 8, 16, 0]
    ):
        if threads * per_sm > 2048 * 2:
            continue
        config = activation.LaunchConfig(threads, unroll)
        activation.launch_config = lambda key, config=config: config
        activation.MAX_GRID = sms * per_sm if per_sm else max_grid  # 0: one pass
        spec.act = fn
        engine = Engine()
        for dtype, out, out_bytes, kwargs in [
            ("fp8", y8, 1, {"scale": scale, "amax": amax}),
            ("bf16", y16, 2, {}),
        ]:
            k = engine.get(ne.make_key("gelu", dtype=dtype))
            ms = common.cuda_time_ms(lambda k=k, out=out, kw=kwargs: k(x, out, **kw), repeat=30)
            gbps = (2 + out_bytes) * n / (ms * 1e-3) / 1e9
            default = chosen(k.key) == config and per_sm == 0
            rows.append({"fn": fn, "out": dtype, "threads": threads, "unroll": unroll,
                         "blocks_per_sm": per_sm or "one pass", "ms": ms, "gbps": gbps,
                         "pct": 100 * gbps / copy, "default": default})  # fmt: skip
    spec.act = "gelu"
    activation.launch_config, activation.MAX_GRID = chosen, max_grid
    rows.sort(key=lambda r: (r["fn"], r["out"], -r["gbps"]))
    path = common.write_results("activation_tuning", {**common.gpu_info(), "copy_gbps": copy,
                                                      "shape": [args.tokens, args.hidden],
                                                      "rows": rows})  # fmt: skip
    print(f"device copy {copy:.0f} GB/s")
    shown = []
    for i, r in enumerate(rows):
        rank = sum((q["fn"], q["out"]) == (r["fn"], r["out"]) for q in rows[:i])
        if rank < 5 or r["default"]:
            shown.append(r)
    columns = [("default", "default", ""), ("fn", "fn", ""), ("out", "out", ""),
               ("threads", "thr", ""), ("unroll", "unroll", ""),
               ("blocks_per_sm", "blocks/SM", ""), ("ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"),
               ("pct", "% copy", ".1f")]  # fmt: skip
    print(common.table(shown, columns))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
