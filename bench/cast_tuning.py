"""Block-shape and code-generation sweep behind the cast family's defaults (``tile_config``
in nvrtc_engine/ops/cast.py, ``CODEGEN`` in nvrtc_engine/ops/base.py).

    python bench/cast_tuning.py [--m 16384] [--k 8192] [--rounds 2] [--ops cast,mxfp8,nvfp4]
    python bench/cast_tuning.py --candidates [--shapes 8192x28672,16384x8192] [--name NAME]

bf16 input ``M x K``. For cast_transpose, cast_transpose_dbias and
cast_transpose_dbias_dgelu to fp8_e4m3 (tensor scaling): every tile shape (threads x tile
rows x tile columns x register cap) that the template accepts, and for 128 x 128 tiles the
``load_group`` values of ``LOAD_GROUPS`` (``TileConfig.load_group``; 0 in the other rows).
For the MXFP8 quantize kernels (rowwise, columnwise, both): every configuration of
``QUANTIZE_CANDIDATES`` (nvrtc_engine/ops/quantize.py: the tile mapping, and warp mappings
given as warps per block in rows x columns and a register cap as blocks per SM; the default
is ``quantize_config``'s) with the fast path off, and the fast path (map ``fast``: the
activation family's tiled kernel with the identity activation, ``quantize.MX_FAST_PATH``;
rowwise through ``MX_FAST_ROWWISE``), each with and without streaming hints; NVFP4
(rowwise, amax given): with and without streaming hints. ``--ops`` picks the groups
(substrings of the op names: ``cast``, ``mxfp8``, ``nvfp4``). Each sweep runs ``--rounds``
times; rows give every round and the median. GB/s counts each tensor once (as
bench/cast_bandwidth.py does). Writes bench/results/cast_tuning.json; with ``--ops``, the
rows of the other groups already in that file (same shape) are kept.

``--candidates``: only the three cast ops, each with its default ``tile_config`` and the
entries of ``CANDIDATES`` (``TileConfig.sum_scatter`` / ``prefetch`` / ``gather4`` /
``strip`` / ``prefetch_next``, off by default, and the blocks-per-SM counts 3, 6 and 8 that
``SHAPES`` leaves out; ``--switch NAME``: only the entries with a switch that starts with
NAME, beside the defaults), on every
shape of ``--shapes`` (each kernel compiled once for all shapes). ``--name`` names the JSON
file (default ``cast_tuning``, or ``cast_candidates-MxK`` with ``--candidates``; one file
per shape).
``--list`` prints the cases and exits (no GPU needed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Variants differ by monkeypatched configurations that neither the key nor the key index's
# environment fingerprint sees: compile each in memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import common

SHAPES = list(itertools.product([128, 256, 512], [32, 64, 128], [64, 128], [1, 2, 4]))
# TileConfig.load_group candidates (0, all chunks at once, is every SHAPES row): the 128 x 128
# tiles at 2 and 4 blocks per SM, each group size that divides a thread's chunks.
LOAD_GROUPS = [(t, 128, 128, b, g)
               for t, b, g in itertools.product([128, 256, 512], [2, 4], [1, 2, 4])
               if g < 128 // (t // 8) and (128 // (t // 8)) % g == 0]  # fmt: skip
CAST_OPS = ["cast_transpose", "cast_transpose_dbias", "cast_transpose_dbias_dgelu"]
# --candidates: (threads, blocks per SM, load_group, TileConfig switches) per op, 128 x 128
# tiles, timed against the op's default. sum_scatter (S) leaves 4 fp32 column sums live per
# thread instead of 16; prefetch (P) asks L2 for a thread's later chunks first (SASS: under
# register pressure ptxas issues them only after the earlier chunks are computed); gather4
# (G) reads phase 2's shared tile in words (sm_90 SASS per thread, 16-byte path:
# cast_transpose 920 -> 696 instructions, dbias at 128 x 4 2848 -> 1776); 3, 6 and 8 blocks
# per SM give register caps (40, 80, 64) between the swept 1, 2 and 4.
_S, _P, _G = ("sum_scatter",), ("prefetch",), ("gather4",)
_GP, _SG, _ALL = _P + _G, _S + _G, _S + _P + _G
# TileConfig.strip ("strip<N>": N tiles per block down a column strip, column sums and amax
# reduced once per block; sm_90 SASS of cast_transpose_dbias, 16-byte path: no local memory
# at 128 x 4 (128 registers, default: 12 local loads/stores) and 64 registers at 256 x 4,
# 1024 threads per SM) and prefetch_next (N: the block's next tile into L2 during phase 2).
# 8192 x 28672 has 64 tile rows: strip 4 gives 3584 blocks (6.8 waves of 528), strip 2 7168.
_P2, _P4, _P8 = ("strip2", "prefetch"), ("strip4", "prefetch"), ("strip8", "prefetch")
_P4N = (*_P4, "prefetch_next")
CANDIDATES: dict[str, list[tuple[int, int, int, tuple[str, ...]]]] = {
    "cast_transpose": [(512, 4, 0, _G), (512, 4, 0, _GP), (256, 4, 0, _G), (512, 3, 0, _G)],
    "cast_transpose_dbias": [
        (128, 4, 1, _P), (128, 4, 1, _S), (128, 4, 1, _G), (128, 4, 1, _GP), (128, 4, 1, _ALL),
        (128, 8, 1, ()), (128, 8, 1, _GP), (128, 8, 1, _ALL), (128, 6, 1, ()), (256, 3, 1, ()),
        (256, 4, 1, _GP), (256, 4, 1, _ALL), (256, 4, 0, _ALL), (256, 2, 1, _GP),
        (512, 2, 0, _ALL), (512, 3, 0, _SG), (512, 4, 0, _ALL),
        (128, 4, 1, _P4), (128, 4, 1, _P2), (128, 4, 1, _P4N), (128, 6, 1, _P4), (128, 8, 1, _P4),
        (256, 4, 1, _P4), (256, 4, 1, _P2), (256, 4, 1, _P8), (256, 4, 1, _P4N), (256, 4, 0, _P4),
        (256, 3, 1, _P4),
    ],
    "cast_transpose_dbias_dgelu": [
        (256, 2, 1, _P), (256, 2, 1, _G), (256, 2, 1, _GP), (256, 2, 1, _ALL), (256, 3, 1, ()),
        (256, 3, 1, _ALL), (256, 4, 1, _GP), (256, 4, 1, _ALL), (256, 4, 0, _ALL),
        (128, 4, 1, _GP), (128, 8, 1, _ALL), (128, 6, 1, ()), (512, 2, 0, _ALL),
        (512, 3, 0, _SG),
        (256, 2, 1, _P4), (256, 2, 1, _P4N), (256, 3, 1, _P4), (256, 4, 1, _P4), (256, 4, 1, _P2),
        (256, 4, 1, _P4N), (128, 6, 1, _P4),
    ],
}  # fmt: skip


def switch_fields(switches: tuple[str, ...]) -> dict[str, Any]:
    """TileConfig fields of a case's switch names: ``strip<N>`` sets ``strip=N``, any other
    name is a boolean switch set to True."""
    return {("strip" if s.startswith("strip") else s): int(s[5:]) if s.startswith("strip") else True
            for s in switches}  # fmt: skip


def build_cases(groups: list[str], candidates: bool, switch: str | None = None) -> list[tuple]:
    """The sweep's cases: (op, threads or mapping, rows, cols, blocks per SM, streaming,
    load_group, TileConfig switches); with ``switch``, only the candidates with a switch that
    starts with it (and the defaults). No GPU needed."""
    import nvrtc_engine as ne
    import nvrtc_engine.ops.cast as cast
    import nvrtc_engine.ops.quantize as quantize

    cases: list[tuple] = []
    if candidates:
        for op in CAST_OPS:
            d = cast.tile_config(ne.make_key(op, dtype="fp8", arch="sm_90"))  # any arch
            cases.append((op, d.threads, d.tile_rows, d.tile_cols, d.min_blocks, False,
                          d.load_group, ()))  # fmt: skip
            for threads, blocks, group, switches in CANDIDATES[op]:
                if switch and not any(s.startswith(switch) for s in switches):
                    continue
                cases.append((op, threads, 128, 128, blocks, False, group, switches))
        return [c for c in cases if any(g in c[0] for g in groups)]
    for op, (threads, rows, cols, min_blocks), streaming in itertools.product(
        CAST_OPS, SHAPES, [False]
    ):
        cases.append((op, threads, rows, cols, min_blocks, streaming, 0, ()))
    for op, (threads, rows, cols, min_blocks, group) in itertools.product(CAST_OPS, LOAD_GROUPS):
        cases.append((op, threads, rows, cols, min_blocks, False, group, ()))
    # Quantize rows: (op, mapping, warp rows, warp columns, blocks per SM, streaming).
    mx_ops = ["mxfp8 rowwise", "mxfp8 columnwise", "mxfp8 both"]
    for op, qcfg, streaming in itertools.product(mx_ops, quantize.QUANTIZE_CANDIDATES,
                                                 [False, True]):  # fmt: skip
        cases.append((op, qcfg.mapping, qcfg.warp_rows, qcfg.warp_cols, qcfg.min_blocks,
                      streaming, 0, ()))  # fmt: skip
    for op, streaming in itertools.product(mx_ops, [False, True]):  # the MXFP8 fast path
        cases.append((op, "fast", 0, 0, 0, streaming, 0, ()))
    for streaming in (False, True):
        cases.append(("nvfp4 rowwise", "tile", 2, 4, 4, streaming, 0, ()))  # QuantizeConfig()
    return [c for c in cases if any(g in c[0] for g in groups)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=16384)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--shapes", default=None,
                        help="comma-separated MxK (default: --m x --k)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ops", default="cast,mxfp8,nvfp4", help="comma-separated groups")
    parser.add_argument("--candidates", action="store_true",
                        help="the cast ops' CANDIDATES against their defaults only")  # fmt: skip
    parser.add_argument("--switch", default=None,
                        help="--candidates: only entries with a switch starting so")  # fmt: skip
    parser.add_argument(
        "--name", type=common.result_name, default=None, help="results file name (no .json)"
    )
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    args = parser.parse_args()
    groups = args.ops.split(",")
    cases = build_cases(groups, args.candidates, args.switch)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else [(args.m, args.k)])  # fmt: skip
    if args.name and len(shapes) > 1:
        parser.error("--name names one file: give one shape, or leave --name out")
    if args.list:
        for case in cases:
            print(case)
        print(f"{len(cases)} cases x {len(shapes)} shapes")
        return 0
    kernels: dict[tuple, Any] = {}
    for m, k in shapes:
        name = args.name or (f"cast_candidates-{m}x{k}" if args.candidates else "cast_tuning")
        sweep(m, k, cases, groups, args.rounds, name, kernels, show_all=args.candidates)
    return 0


def sweep(m: int, k: int, cases: list[tuple], groups: list[str], rounds: int, name: str,
          kernels: dict[tuple, Any], *, show_all: bool = False) -> None:  # fmt: skip
    """Time ``cases`` on bf16 ``m x k`` inputs; write bench/results/<name>.json and print
    the defaults and best rows (``show_all``: every row). Cast kernels are compiled once
    (``kernels``, by case) and take the shape at run time."""
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.cast as cast
    import nvrtc_engine.ops.quantize as quantize
    from nvrtc_engine.engine import Engine
    from nvrtc_engine.errors import CompileError
    from nvrtc_engine.ops.activation import tile_config
    from nvrtc_engine.ops.base import CODEGEN
    from nvrtc_engine.ops.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

    n = m * k
    dev = "cuda"
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    act = torch.randn(m, k, device=dev).to(torch.bfloat16)
    tensor = {"scale": torch.full((1,), 2.0, device=dev), "amax": torch.zeros(1, device=dev),
              "scale_inv": torch.empty(1, device=dev)}  # fmt: skip
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=dev)
    qt = torch.empty(k, m, dtype=torch.float8_e4m3fn, device=dev)
    q_col = torch.empty_like(q)
    dbias = torch.empty(k, dtype=torch.bfloat16, device=dev)

    def u8(shape: tuple[int, ...]) -> Any:
        return torch.empty(shape, dtype=torch.uint8, device=dev)

    mx_r, mx_c = u8(mxfp8_scale_shape(m, k, "rowwise")), u8(mxfp8_scale_shape(m, k, "columnwise"))
    fp4_data, fp4_scales = u8((m, k // 2)), u8(nvfp4_scale_shape(m, k, "rowwise"))
    fp4_amax = x.float().abs().amax().reshape(1)
    copy = common.copy_bandwidth_gbps()
    chosen, codegen = cast.tile_config, dict(CODEGEN)
    chosen_q = quantize.quantize_config
    fast_on, fast_rowwise = quantize.MX_FAST_PATH, quantize.MX_FAST_ROWWISE

    def quantize_call(engine: Any, op: str) -> Any:
        if op.startswith("mxfp8"):
            layout = op.split()[1]
            kern = engine.get(ne.make_key("quantize", dtype="fp8", layout=layout))
            outs = {}
            if layout in ("rowwise", "both"):
                outs.update(rowwise_data=q, rowwise_scale_inv=mx_r)
            if layout in ("columnwise", "both"):
                outs.update(columnwise_data=q_col, columnwise_scale_inv=mx_c)
            return lambda: kern(x, **outs)
        kern = engine.get(ne.make_key("quantize", dtype="fp4_e2m1"))
        return lambda: kern(
            x, rowwise_data=fp4_data, rowwise_scale_inv=fp4_scales, amax=fp4_amax,
            compute_amax=False,
        )  # fmt: skip

    calls: dict[tuple, Any] = {}
    results: dict[tuple, list[float]] = {}
    nbytes: dict[str, int] = {"cast_transpose": 4 * n, "cast_transpose_dbias": 4 * n + 2 * k,
                              "cast_transpose_dbias_dgelu": 6 * n + 2 * k,
                              "mxfp8 rowwise": 3 * n + n // 32, "mxfp8 both": 4 * n + n // 16,
                              "mxfp8 columnwise": 3 * n + n // 32,
                              "nvfp4 rowwise": 2 * n + n // 2 + n // 16}  # fmt: skip
    for rnd in range(rounds):
        for case in cases:
            op, threads, rows, cols, min_blocks, streaming, group, switches = case
            if case not in calls:
                CODEGEN.update(streaming=streaming)
                engine = Engine()
                calls[case] = None
                try:
                    if op.startswith("cast"):
                        if case not in kernels:  # None: refused by a static_assert
                            kernels[case] = None
                            cfg = cast.TileConfig(threads, rows, cols, 16, min_blocks, group,
                                                  **switch_fields(switches))  # fmt: skip
                            cast.tile_config = lambda key, cfg=cfg: cfg
                            kernels[case] = engine.get(ne.make_key(op, dtype="fp8"))
                        kern = kernels[case]
                        if kern is None:
                            pass
                        elif op == "cast_transpose":
                            calls[case] = lambda kern=kern: kern(x, out=q, out_t=qt, **tensor)
                        elif op == "cast_transpose_dbias_dgelu":
                            ws = torch.empty(kern.workspace_rows(m), k, device=dev)
                            calls[case] = lambda kern=kern, ws=ws: kern(
                                x, act, out=q, out_t=qt, dbias=dbias, workspace=ws, **tensor
                            )
                        else:
                            ws = torch.empty(kern.workspace_rows(m), k, device=dev)
                            calls[case] = lambda kern=kern, ws=ws: kern(
                                x, out=q, out_t=qt, dbias=dbias, workspace=ws, **tensor
                            )
                    elif threads == "fast":  # the tiled kernel (rowwise: rendered in on request)
                        quantize.MX_FAST_ROWWISE = True
                        calls[case] = quantize_call(engine, op)
                    else:  # quantize: (mapping, warp rows, warp columns, blocks per SM)
                        qcfg = quantize.QuantizeConfig(threads, rows, cols, min_blocks)
                        quantize.quantize_config = lambda key, qcfg=qcfg: qcfg
                        calls[case] = quantize_call(engine, op)
                except CompileError:  # a tile shape the template's static_asserts refuse
                    pass
                finally:
                    cast.tile_config = chosen
                    quantize.quantize_config = chosen_q
                    quantize.MX_FAST_ROWWISE = fast_rowwise
                    CODEGEN.update(codegen)
            if calls[case] is not None:
                quantize.MX_FAST_PATH = threads == "fast"  # read per call
                results.setdefault(case, []).append(common.cuda_time_ms(calls[case]))
                quantize.MX_FAST_PATH = fast_on
        print(f"{m}x{k}: round {rnd + 1}/{rounds} done", flush=True)
    out = []
    for case, times in results.items():
        op, threads, rows, cols, min_blocks, streaming, group, switches = case
        ms = statistics.median(times)
        row = {"op": op, "streaming": streaming, "load_group": group, "ms_rounds": times, "ms": ms,
               "pct": 100 * nbytes[op] / (ms * 1e-3) / 1e9 / copy,
               "switches": "+".join(switches)}  # fmt: skip
        if op.startswith("cast"):
            cfg = cast.TileConfig(threads, rows, cols, 16, min_blocks, group,
                                  **switch_fields(switches))  # fmt: skip
            row.update(threads=threads, tile_rows=rows, tile_cols=cols, min_blocks=min_blocks,
                       load_group=group, mapping="")  # fmt: skip
            default = chosen(ne.make_key(op, dtype="fp8")) == cfg
        elif threads == "fast":
            layout = op.split()[1]
            tcfg = tile_config(ne.make_key("quantize", dtype="fp8", layout=layout))
            row.update(threads=tcfg.threads, tile_rows=tcfg.tile_rows(),
                       tile_cols=tcfg.tile_cols(8), min_blocks=0, mapping="fast")  # fmt: skip
            default = fast_on and (layout != "rowwise" or fast_rowwise)
        else:
            qcfg = quantize.QuantizeConfig(threads, rows, cols, min_blocks)
            layout = op.split()[1]
            key = ne.make_key("quantize", dtype="fp4_e2m1" if op.startswith("nvfp4") else "fp8",
                              layout=layout)  # fmt: skip
            want = chosen_q(key)
            fast = fast_on and op.startswith("mxfp8") and (layout != "rowwise" or fast_rowwise)
            default = want == qcfg and not fast
            row.update(threads=qcfg.threads, tile_rows=qcfg.tile[0], tile_cols=qcfg.tile[1],
                       min_blocks=min_blocks if qcfg.mapping == "warp" else 4,
                       mapping=qcfg.mapping)  # fmt: skip
        row["default"] = default and streaming == codegen["streaming"]
        out.append(row)
    out.sort(key=lambda r: (r["op"], r["ms"]))
    info = {**common.gpu_info(), "copy_gbps": copy, "shape": [m, k], "rounds": rounds}
    kept = []
    previous = common.RESULTS / f"{name}.json"
    if previous.exists():  # a partial sweep replaces only its own ops' rows
        old = json.loads(previous.read_text())
        if old.get("shape") == [m, k]:
            kept = [r for r in old["rows"] if not any(g in r["op"] for g in groups)]
    out = sorted(kept + out, key=lambda r: (r["op"], r["ms"]))
    path = common.write_results(name, {**info, "rows": out})
    shown = [r for i, r in enumerate(out)
             if show_all or r["default"] or sum(q["op"] == r["op"] for q in out[:i]) < 5
             or not any(q["op"] == r["op"] and q.get("load_group") == r.get("load_group")
                        for q in out[:i])]  # best of each load_group too  # fmt: skip
    print(f"device copy {copy:.0f} GB/s")
    columns = [
        ("default", "default", ""), ("op", "op", ""), ("mapping", "map", ""),
        ("threads", "thr", ""), ("tile_rows", "rows", ""), ("tile_cols", "cols", ""),
        ("min_blocks", "minb", ""), ("load_group", "grp", ""), ("switches", "switches", ""),
        ("streaming", "stream", ""), ("ms", "ms", ".4f"), ("pct", "% copy", ".1f"),
    ]  # fmt: skip
    print(common.table(shown, columns))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
