"""Tile-shape sweep behind the tiled activation kernel's defaults (``TileConfig`` in
nvrtc_engine/ops/activation.py: MXFP8 columnwise and both outputs; results to go in
docs/performance.md). The row-flat kernel (gated ops, MXFP8 rowwise) has its own sweep,
bench/activation_row_tuning.py.

    python bench/tuning/activation_tile_tuning.py [--tokens 16384] [--hidden 8192] [--repeat 20]

For swiglu and geglu (bf16 input tokens x 2*hidden), gelu (tokens x hidden) and dswiglu to
MXFP8 both directions: times every tile shape (threads per block x 16-byte chunks per tile
row x chunks per thread; MXFP8 tiles are exactly 32 rows high), with the columnwise scales
computed by one thread per column (``col_owner``, the default) and, for the shapes of
OLD_SCALES, by every thread for its own columns (the kernel before); for the shapes of
PIPELINED also with 2, 4 and 8 tiles per block (the next tile's loads in flight during the
current tile's outputs); for the shapes of CLAMPED with ``clamp_loads`` (1 and 2 tiles per
block), of BYTES with ``fp8_words=False`` (FP8 stored byte by byte, the kernel before) and
of SPLIT with ``split_scales`` (rowwise E8M0 work split over a block's lanes, guarded and
clamped loads);
each with hidden_size None and compiled in. Variants compile in
parallel (8 threads, the configuration thread-local). GB/s counts each tensor once, MXFP8
scale bytes included. Prints the best shapes per case and the default's rank; writes
bench/results/activation_tile_tuning.json.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
# Variants differ by monkeypatched configurations that neither the key nor the key index's
# environment fingerprint sees: compile each in memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import common
import families.activation as ab

CASES = [("swiglu", "mxfp8 both"), ("geglu", "mxfp8 both"), ("gelu", "mxfp8 both"),
         ("dswiglu", "mxfp8 both")]  # fmt: skip
OLD_SCALES = [(128, 16, 4), (128, 8, 2), (256, 16, 2)]  # also timed with col_owner=False
PIPELINED = [(64, 8, 4), (128, 16, 4), (128, 8, 2)]  # also timed with tiles_per_block 2, 4, 8
# also timed with clamp_loads (no bounds checks or zero fill), 1 and 2 tiles per block
CLAMPED = [(64, 8, 4), (128, 16, 4), (128, 8, 2), (64, 4, 2)]
BYTES = [(64, 8, 4), (128, 16, 4)]  # also timed with fp8_words=False (FP8 stored as bytes)
SPLIT = [(64, 8, 4), (128, 16, 4), (32, 4, 4)]  # also with split_scales (iters % 4 == 0)


def shapes(mxfp8: bool) -> list[tuple[int, int, int]]:
    """(threads, chunks_per_row, iters) to try; MXFP8 tiles must be 32 rows high."""
    if not mxfp8:
        return list(itertools.product([128, 256, 512], [8, 16, 32], [1, 2, 4]))
    out = []
    for threads, cpr in itertools.product([64, 128, 256, 512], [4, 8, 16, 32]):
        iters = 32 * cpr // threads
        if iters >= 1 and iters * threads == 32 * cpr:
            out.append((threads, cpr, iters))
    return out


def parse_args(doc: str, rounds: bool = False) -> argparse.Namespace:
    """The sweeps' command line: shape, timing samples (and rounds of the whole sweep)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=20)
    if rounds:
        parser.add_argument("--rounds", type=int, default=2)
    return parser.parse_args()


def ranked(rows: list[dict], keep: int) -> list[dict]:
    """Measured rows, fastest first per (op, output), each given its ``rank``: the best
    ``keep`` of each case and every default row."""
    ok = sorted((r for r in rows if "gbps" in r), key=lambda r: (r["op"], r["output"], -r["gbps"]))
    shown = []
    for i, r in enumerate(ok):
        rank = sum((q["op"], q["output"]) == (r["op"], r["output"]) for q in ok[:i])
        r["rank"] = rank + 1
        if rank < keep or r["default"]:
            shown.append(r)
    return shown


def error_text(exc: BaseException) -> str:
    """A variant's failure, one line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def compile_variants(
    op: str, fields: dict, variants: list, local: threading.local, workers: int
) -> list[Any]:
    """Each ``(config, hidden_size)`` of ``variants`` compiled in memory, ``workers`` threads
    at once: the sweep patches the module's config function to return ``local.config``, which
    each thread sets before its compile, and a fresh Engine renders the configuration anew.
    The kernel, or the error text of a variant that does not compile."""
    import nvrtc_engine as ne
    from nvrtc_engine.engine import Engine

    def build(variant: tuple) -> Any:
        config, hidden_size = variant
        local.config = config
        try:
            return Engine().get(ne.make_key(op, hidden_size=hidden_size, **fields))
        except Exception as exc:  # a configuration that does not compile
            return error_text(exc)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(build, variants))


def launcher(op: str, output: str, inputs: tuple, shape: tuple, kernel: Any) -> Any:
    """A no-argument launch of ``kernel`` on the case's inputs (activation_bandwidth's
    engine_call), run once; or the error text of a kernel that does not launch."""
    import torch

    def get(*_: Any, **__: Any) -> Any:
        return kernel

    try:
        fn = ab.engine_call(op, output, inputs, shape, get_kernel=get)
        fn()  # load the module and launch once
        torch.cuda.synchronize()
    except Exception as exc:  # a configuration that does not launch
        return error_text(exc)
    return fn


def switch_summary(rows: list[dict], label) -> None:
    """Per case and switch setting (``label(row)``): the best measured % of copy and the
    configuration that reached it, so each switch's effect shows beside the ranking."""
    best: dict = {}
    for r in rows:
        if "pct" in r:
            k = (r["op"], r["output"], label(r))
            if k not in best or r["pct"] > best[k]["pct"]:
                best[k] = r
    for (op, output, lab), r in sorted(best.items()):
        shape = "x".join(str(r[f]) for f in ("threads", "chunks_per_row", "iters", "unroll")
                         if f in r)  # fmt: skip
        print(
            f"switch {op} {output} [{lab}]: best {r['pct']:.1f}% ({shape}, "
            f"h={r['hidden_size'] or 'any'})"
        )


def main() -> int:
    args = parse_args(__doc__)
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.activation as activation

    copy = common.copy_bandwidth_gbps()
    chosen = activation.tile_config
    local = threading.local()  # each compiling thread's configuration
    activation.tile_config = lambda key: local.config
    rows = []
    try:
        for op, output in CASES:
            inputs, shape = ab.make_inputs(op, args.tokens, args.hidden)
            nbytes = ab.traffic(op, output, args.tokens, args.hidden)
            fields = ab.kernel_fields(output)
            default = chosen(ne.make_key(op, **fields))
            configs = [activation.TileConfig(*s) for s in shapes(output.startswith("mxfp8"))]
            configs += [activation.TileConfig(*s, col_owner=False) for s in OLD_SCALES]
            configs += [activation.TileConfig(*s, tiles_per_block=t)
                        for s in PIPELINED for t in (2, 4, 8)]  # fmt: skip
            configs += [activation.TileConfig(*s, clamp_loads=True, tiles_per_block=t)
                        for s in CLAMPED for t in (1, 2)]  # fmt: skip
            configs += [activation.TileConfig(*s, clamp_loads=c, split_scales=True)
                        for s in SPLIT for c in (False, True)]  # fmt: skip
            configs += [activation.TileConfig(*s, fp8_words=False) for s in BYTES]
            variants = list(itertools.product(configs, (None, args.hidden)))

            built = compile_variants(op, fields, variants, local, 8)
            for (config, hidden_size), kernel in zip(variants, built, strict=True):
                row = {"op": op, "output": output, "threads": config.threads,
                       "chunks_per_row": config.chunks_per_row, "iters": config.iters,
                       "col_owner": config.col_owner,
                       "tiles_per_block": config.tiles_per_block,
                       "clamp_loads": config.clamp_loads, "fp8_words": config.fp8_words,
                       "split_scales": config.split_scales,
                       "hidden_size": hidden_size,
                       "default": config == default}  # fmt: skip
                rows.append(row)
                if isinstance(kernel, str):
                    row["error"] = kernel
                    continue

                fn = launcher(op, output, inputs, shape, kernel)
                if isinstance(fn, str):
                    row["error"] = fn
                    continue
                ms = common.cuda_time_ms(fn, repeat=args.repeat)
                gbps = nbytes / (ms * 1e-3) / 1e9
                row.update(ms=ms, gbps=gbps, pct=100 * gbps / copy)
            del inputs
            torch.cuda.empty_cache()
    finally:
        activation.tile_config = chosen
    path = common.write_results("activation_tile_tuning", {
        **common.gpu_info(), "copy_gbps": copy, "shape": [args.tokens, args.hidden],
        "rows": rows,
    })  # fmt: skip
    shown = [{**r, "h": r["hidden_size"] or "any", "scales": "col" if r["col_owner"] else "own",
              "loads": "clamp" if r["clamp_loads"] else "guard",
              "fp8": "words" if r["fp8_words"] else "bytes",
              "split": "split" if r["split_scales"] else ""}
             for r in ranked(rows, 4)]  # fmt: skip
    print(f"device copy {copy:.0f} GB/s")
    print(common.table(shown, [
        ("default", "default", ""), ("rank", "rank", ""), ("op", "op", ""),
        ("output", "output", ""), ("threads", "thr", ""), ("chunks_per_row", "cpr", ""),
        ("iters", "iters", ""), ("scales", "scales", ""), ("tiles_per_block", "tiles/blk", ""),
        ("loads", "loads", ""), ("fp8", "fp8", ""), ("split", "rows", ""), ("h", "h", ""),
        ("ms", "ms", ".4f"),
        ("gbps", "GB/s", ".0f"), ("pct", "% copy", ".1f"),
    ]))  # fmt: skip
    switch_summary(rows, lambda r: ("clamp" if r["clamp_loads"] else "guard")
                   + ("" if r["fp8_words"] else " bytes")
                   + (" split" if r["split_scales"] else ""))  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['op']} {r['output']} {r['threads']}x{r['chunks_per_row']}x{r['iters']}: "
                  f"{r['error']}")  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
