"""Write docs/performance.md from the JSON files in bench/results/ (run after the benchmarks).

    python bench/make_report.py [--output docs/performance.md]

Needs matplotlib for the bandwidth plot (``pip install -e '.[bench]'``): without it the
report is not written. Every figure in the report comes from a results file; a missing file
leaves its section out.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "performance.md"


def load(name: str) -> dict[str, Any] | None:
    """bench/results/NAME.json, its ``benchmark`` field set to NAME (the file's name, which
    the data links use: a file renamed after its run keeps the name it was written under)."""
    path = RESULTS / f"{name}.json"
    return {**json.loads(path.read_text()), "benchmark": name} if path.exists() else None


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def source(d: dict[str, Any], script: str) -> str:
    where = f"{d.get('gpu', 'CPU only')}" + (f", NVRTC {d['nvrtc']}" if d.get("nvrtc") else "")
    return (
        f"Measured {d['date'][:10]} on {where} ({d['cpus']} CPUs); "
        f"`python bench/{script}`; data: `bench/results/{d['benchmark']}.json`."
    )


def gelu_section() -> str | None:
    d = load("gelu_bandwidth")
    if d is None:
        return None
    rows = [
        [
            r["case"],
            r["impl"],
            f"{r['ms'] * 1e3:.1f}",
            f"{r['gbps']:.0f}",
            f"{r['pct_of_copy']:.1f}%",
        ]
        for r in d["kernels"]
    ]
    shape = "x".join(map(str, d["shape"]))
    return "\n\n".join(
        [
            "## GELU bandwidth (engine core)",
            source(d, "gelu_bandwidth.py"),
            f"Input {shape} bf16; GB/s counts the input read and the output written once; device "
            f"copy bandwidth measured in the same run: **{d['copy_gbps']:.0f} GB/s**. Target: "
            "bf16->fp8_e4m3 at >= 85% of copy.",
            md_table(["case", "implementation", "us", "GB/s", "% of copy"], rows),
        ]
    )


def launcher_name(status: str) -> str:
    """``launcher.status()`` as the report names it."""
    return "compiled launcher" if status.startswith("compiled") else "cuda.bindings path"


def launch_rows(d: dict[str, Any]) -> list[list[str]]:
    """A launch_overhead result's rows: case, us, and the excess over the bare launch for the
    paired rows ("-" for the others)."""
    return [[r["case"], f"{r['us']:.2f}",
             f"{r['over_bare_us']:+.2f}" if "over_bare_us" in r else "-"]
            for r in d["rows"]]  # fmt: skip


def launch_verdict(d: dict[str, Any]) -> str:
    """The target's verdict for ``Kernel.__call__(x, out)`` in a launch_overhead result."""
    by_case = {r["case"]: r for r in d["rows"]}
    best = by_case.get("Kernel.__call__(x, out)")
    paired = by_case.get("paired: Kernel.__call__(x, out)")
    if best is None:
        return ""
    text = f" In this run: {best['us']:.2f} us (best of the runs)"
    if paired is not None:
        text += (f", median {paired['us']:.2f} us over {paired['rounds']} paired rounds, "
                 f"{paired['over_bare_us']:.2f} us more than the bare launch")  # fmt: skip
    return text + (": met." if best["us"] <= 5 else ": missed (judged by the best of the runs).")


def launch_section() -> str | None:
    d = load("launch_overhead")
    cpu = load("launch_overhead-cpu")
    if d is None and cpu is None:
        return None
    parts = ["## Launch overhead"]
    if d is not None:
        rows = launch_rows(d)
        if "version" in d:
            what = (
                f"Measured version: {d['version']}. `Kernel.__call__(x, out)` is a GELU bf16 "
                "kernel on a (1, 1024) tensor from the third call on, through its launch plan "
                "(docs/architecture.md#launch); the generic path is the same call with plans "
                "switched off (what CuPy arrays and first calls take); the family rows are one "
                "small call each"
                + (
                    f"; launches went through the {launcher_name(d['launcher'])}"
                    if d.get("launcher")
                    else ""
                )
            )
        else:
            what = (
                "Measured before launch plans. `Kernel.__call__` runs a GELU bf16 kernel on a "
                "(1, 1024) tensor"
            )
        parts += [
            source(d, "launch_overhead.py"),
            "Host time per call, GPU not waited on (best of 5 x 5000 calls). "
            f"{what}; `step:` rows time one piece of a launch alone; `paired:` rows are the "
            "main ones timed again in shuffled rounds of 200 calls, medians over the rounds, "
            "with each row's median excess over the bare compiled launch (the driver's "
            "cuLaunchKernel called from C with fixed arguments) in the same round. Target: "
            "`Kernel.__call__` with torch tensors <= 5 us, host time: judged on the runs of "
            "200 calls below.",
            md_table(["call", "us", "over the bare launch, us"], rows),
        ]
    short = load("launch_overhead-200")
    if short is not None:
        parts += [
            "The same script in runs of 200 calls (best of 20; `python bench/launch_overhead.py "
            "--calls 200 --repeat 20 --paired 40 --name launch_overhead-200`, "
            f"{short['date'][:10]}, "
            f"{short.get('gpu', 'GPU')}): a run of 5000 launches outgrows the GPU's queue of "
            "pending launches, after which each launch waits for the GPU to retire one, so the "
            "longer runs time the GPU as much as the host. The `floor:` rows are "
            "cuLaunchKernel called from C++ (bench/launch_floor.cu, built with nvcc there), "
            "timed at the end of the run: the driver's own time per launch, which bounds any "
            "launch path from below; the host's speed drifts between minutes, so a row timed "
            "earlier can read below them (the paired rows compare within rounds)."
            + launch_verdict(short),
            md_table(["call", "us", "over the bare launch, us"], launch_rows(short)),
        ]
        recheck = load("launch_overhead-200-recheck")
        if recheck is not None:
            later = [r for r in (recheck, *(load(f"launch_overhead-200-2026-12-02{v}")
                                               for v in ("", "b"))) if r]  # fmt: skip
            runs = [short, *later]
            wanted = [
                "Kernel.__call__(x, out)",
                "paired: Kernel.__call__(x, out)",
                "Kernel.__call__(x, out), Python fast path (plans.fast_path, LaunchPlan.run)",
                "Kernel.__call__(x, out), through cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)",
                "torch.nn.functional.gelu(x)",
                "paired: torch.nn.functional.gelu(x)",
                "step: cuLaunchKernel (compiled launcher, packed params)",
                "paired: step: cuLaunchKernel (compiled launcher, packed params)",
                "floor: cuLaunchKernel from C++, 7 params, legacy stream, runs of 200",
            ]
            by_run = [{r["case"]: r for r in run["rows"]} for run in runs]

            def cell(row: dict[str, Any] | None) -> str:
                if row is None:
                    return "-"
                over = f" ({row['over_bare_us']:+.2f})" if "over_bare_us" in row else ""
                return f"{row['us']:.2f}{over}"

            rows = [[case, *(cell(b.get(case)) for b in by_run)] for case in wanted]
            text = (
                "The same command again at "
                f"{recheck['date'][11:16]} UTC ({recheck['version']}, the same launch path; "
                "`bench/results/launch_overhead-200-recheck.json`), beside the run above: the "
                "host ran slower then, the Python side most (paired rows: median us, and in "
                "parentheses the excess over the bare launch of the same rounds)."
                + launch_verdict(recheck)
            )
            for run, suffix in zip(later[1:], ("", "b"), strict=False):
                text += (
                    f" And on {run['date'][:10]} at {run['date'][11:16]} UTC ({run['version']}, "
                    "the same launch path, another lease of the machine; `bench/results/"
                    f"launch_overhead-200-2026-12-02{suffix}.json`)." + launch_verdict(run)
                )
            floor = [b[wanted[-1]]["us"] for b in by_run if wanted[-1] in b]
            excess = [b[wanted[1]]["over_bare_us"] for b in by_run if wanted[1] in b]
            met = sum(b[wanted[0]]["us"] <= 5 for b in by_run)
            text += (
                " The driver's own launch (the `floor:` row above, 7 parameters on the legacy "
                f"stream in runs of 200) took {min(floor):.1f}-{max(floor):.1f} us of the 5 in "
                f"these runs, and ours added {min(excess):.1f}-{max(excess):.1f} us to the bare "
                f"launch of the same rounds; met in {met} of the {len(by_run)} runs of this launch "
                "path (the runs of earlier paths, launch_overhead-200-run1/-run2/-steps, missed "
                "too): the target is met or missed by the host of the day."
            )
            columns = [f"us, {run['date'][5:10]} {run['date'][11:16]}" for run in runs]
            parts += [text, md_table(["call", *columns], rows)]
    if cpu is not None:
        base = load("launch_overhead-cpu-baseline") or {"rows": []}
        before = {r["case"]: r["us"] for r in base["rows"]}
        rows = [[r["case"], f"{r['us']:.2f}",
                 f"{before[r['case']]:.2f}" if r["case"] in before else "-"]
                for r in cpu["rows"]]  # fmt: skip
        parts += [
            f"Python side only, measured {cpu['date'][:10]} on {cpu['cpus']} CPUs "
            f"({cpu['cpu_model']}), no GPU: `python bench/launch_overhead.py --cpu` (data: "
            "`bench/results/launch_overhead-cpu*.json`). A stub libcuda "
            "(tests/host_cuda/libcuda_stub.c) returns at once from every call, so cuda.bindings "
            "and ctypes still convert their arguments but the driver's own time (~3 us per "
            "launch on the H200 host) is missing; tensors are tests/fake_torch.py's. The "
            "baseline column is the same script run against "
            f"{base.get('version', 'the previous version')}"
            + (
                f", on the same machine ({base['date'][:10]})"
                if base.get("cpu_model") == cpu.get("cpu_model")
                else f", on another machine ({base.get('cpu_model', '?')}, {base['date'][:10]}): "
                "compare rows within a column"
            )
            + ".",
            md_table(["call", "us", "baseline us"], rows),
        ]
    return "\n\n".join(parts)


def _best_and_default(
    rows: list[dict[str, Any]], group: Callable[[dict[str, Any]], tuple], score: str
) -> list[tuple[tuple, str, dict[str, Any]]]:
    """Per group of rows: the best by ``score`` and the row marked ``default`` (if any)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(group(r), []).append(r)
    out = []
    for g, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        rs = sorted(rs, key=lambda r: -r[score])
        out.append((g, "best", rs[0]))
        chosen = next((r for r in rs if r.get("default")), None)
        if chosen is not None and chosen is not rs[0]:
            out.append((g, "default", chosen))
    return out


def tuning_section() -> str | None:
    d = load("activation_tuning")
    if d is None or "chunk_bytes" not in d["rows"][0]:
        return None
    rows = []
    for (fn, out), tag, r in _best_and_default(d["rows"], lambda r: (r["fn"], r["out"]), "pct"):
        rounds = " / ".join(f"{p:.1f}" for p in r["pct_rounds"])
        hints, guard = ("on" if r[f] else "off" for f in ("streaming", "amax_guard"))
        row = [fn, out, tag, r["threads"], r["unroll"], r["chunk_bytes"], hints, guard]
        rows.append([*row, f"{r['pct']:.1f}%", rounds])
    parts = [
        "## Activation launch configuration",
        source(d, "activation_tuning.py"),
        "Flat kernel sweep: threads per block x chunks in flight per thread x input bytes per "
        "chunk x streaming cache hints x guarded amax atomic (FP8 only), GELU and the identity "
        "function through the same template, bf16 input 16384 x 8192, one-pass grid; % of the "
        f"device copy bandwidth, median of {d.get('rounds', 1)} rounds (each round's figure "
        "after it).",
        md_table(
            [
                "function",
                "output",
                "",
                "threads",
                "unroll",
                "chunk bytes",
                "hints",
                "amax guard",
                "% of copy",
                "rounds",
            ],
            rows,
        ),
    ]
    t = load("activation_tile_tuning")
    if t is not None:
        trows = []
        for (op, out, h), tag, r in _best_and_default(
            [r for r in t["rows"] if "gbps" in r],
            lambda r: (r["op"], r["output"], r.get("hidden_size")), "gbps",
        ):  # fmt: skip
            tag = f"{tag}, h={h}" if h is not None else tag
            iters = f"{r['iters']}" + ("" if r.get("col_owner", True) else " (scales per thread)")
            if r.get("tiles_per_block", 1) > 1:
                iters += f", {r['tiles_per_block']} tiles/block"
            trows.append([op, out, tag, r["threads"], r["chunks_per_row"], iters,
                          f"{r['pct']:.1f}%"])  # fmt: skip
        parts += [
            "Tiled kernel sweep (`python bench/activation_tile_tuning.py`; data: "
            "`bench/results/activation_tile_tuning.json`): every tile shape; the default row "
            "is the shape this data chose (the file was measured before the defaults changed).",
            md_table(
                ["op", "output", "", "threads", "chunks/row", "chunks/thread", "% of copy"], trows
            ),
        ]
    r2 = load("activation_row_tuning")
    if r2 is not None:
        measured = [r for r in r2["rows"] if "gbps" in r]
        rrows = []
        for (op, out, h), tag, r in _best_and_default(
            measured, lambda r: (r["op"], r["output"], r["hidden_size"]), "gbps"
        ):
            mode = " owner" if r.get("owner") else ""
            tag = f"{tag}, h={h}" if h is not None else tag
            rrows.append([op, out, tag, r["threads"], f"{r['unroll']}{mode}", f"{r['pct']:.1f}%"])
        parts += [
            "Row-flat kernel sweep (`python bench/activation_row_tuning.py`; data: "
            "`bench/results/activation_row_tuning.json`): threads x chunks per thread, the "
            "key's hidden_size unset (run-time H) but for the `h=` rows (H compiled in).",
            md_table(["op", "output", "", "threads", "chunks/thread", "% of copy"], rrows),
        ]
    return "\n\n".join(parts)


def norm_tuning_section() -> str | None:
    d = load("norm_tuning")
    if d is None:
        return None
    table: dict[tuple, dict[str, dict[str, Any]]] = {}  # case -> {"best": row, "default": row}
    for case, tag, r in _best_and_default(
        d["rows"], lambda r: (r["norm"], r["hidden"], r["direction"], r["out"]), "pct"
    ):
        table.setdefault(case, {})[tag] = r
    rows = []
    for (nm, h, direction, out), chosen in sorted(table.items()):
        best = chosen["best"]
        default = chosen.get("default", best if best.get("default") else None)
        rows.append([
            nm, h, direction, out, f"`{best['config']}` {best.get('host') or ''}".strip(),
            f"{best['pct']:.1f}%",
            "-" if default is None else f"`{default['config']}`",
            "-" if default is None else f"{default['pct']:.1f}%",
        ])  # fmt: skip
    return "\n\n".join([
        "## Norm launch configuration",
        source(d, "norm_tuning.py"),
        "Every candidate layout and code switch per case (bf16 input; N = 16384, N = 2048 at "
        "H = 65536; % of the device copy bandwidth counting x and z forward, x, dz and dx "
        "backward): the best one and the default when the sweep ran (since then `TUNED` "
        "takes more winners: docs/norms.md; the "
        "configuration tag reads w warps per row, r rows per CTA, v elements per access, j "
        "accesses per thread, c CTAs per row, then the switches; `loop` is the general "
        "algorithm with H compiled in).",
        md_table(["norm", "H", "pass", "output", "best", "% of copy", "default", "% of copy"],
                 rows),
    ])  # fmt: skip


def cast_tuning_section() -> str | None:
    d = load("cast_tuning")
    if d is None:
        return None
    rows = []
    for (op, stream), tag, r in _best_and_default(
        d["rows"], lambda r: (r["op"], r["streaming"]), "pct"
    ):
        shape = "-"
        if r["threads"]:
            tile = f"{r['tile_rows']} x {r['tile_cols']}"
            shape = f"{r['threads']} thr, {tile}, {r['min_blocks']}/SM"
            if r.get("mapping"):  # quantize: tile or warp mapping
                shape = f"{r['mapping']}: {shape}"
        rows.append([op, "on" if stream else "off", tag, shape, f"{r['pct']:.1f}%"])
    return "\n\n".join([
        "## Cast tile shapes",
        source(d, "cast_tuning.py"),
        "bf16 16384 x 8192 to fp8_e4m3: every tile shape the template accepts (threads, tile "
        "rows x columns, blocks per SM the registers are capped for), and the quantize kernels' "
        "thread mappings (tile, or warp with its block shape) with and without streaming cache "
        "hints; the default rows are the shapes used before "
        "this sweep chose new ones.",
        md_table(["op", "hints", "", "shape", "% of copy"], rows),
    ])  # fmt: skip


def _then_and_best(
    rows: list[dict[str, Any]],
    group: Callable[[dict[str, Any]], tuple],
    label: Callable[[dict[str, Any]], str],
    paired: bool = False,
) -> list[list[Any]]:
    """Per group: the default when the sweep ran, the best row (by median % of copy), and the
    gain in points; with ``paired`` (sweeps timed in shuffled rounds) also the best row's
    median same-round speed over the default and the fraction of rounds it was faster (a
    best by medians can still have lost most rounds)."""
    out = []
    chosen: dict[tuple, dict[str, dict[str, Any]]] = {}
    for case, tag, r in _best_and_default([r for r in rows if "pct" in r], group, "pct"):
        chosen.setdefault(case, {})[tag] = r
    for case, pair in chosen.items():
        best = pair["best"]
        then = pair.get("default", best if best.get("default") else None)
        out.append([*case, "-" if then is None else label(then),
                    "-" if then is None else f"{then['pct']:.1f}%", label(best),
                    f"{best['pct']:.1f}%",
                    "-" if then is None else
                    f"{round(best['pct'], 1) - round(then['pct'], 1):+.1f}"])  # fmt: skip
        if paired:
            same = best.get("vs_default")
            won = best.get("faster_rounds")
            out[-1].append("-" if same is None or best is then
                           else f"{same:.3f}x ({won:.0%})")  # fmt: skip
    return out


def candidates_section() -> str | None:
    """The candidate sweeps (2026-12-01 and 02) behind the new defaults."""
    parts = []
    d = load("norm_tuning-fp8")
    if d is not None:
        rows = _then_and_best(d["rows"], lambda r: (r["norm"], r["hidden"], r["out"]),
                              lambda r: f"`{r['config']}`")  # fmt: skip
        parts += [
            "### Norm FP8 forward switches",
            source(d, "norm_tuning.py --candidates fp8 --name norm_tuning-fp8"),
            "bf16 input, N = 16384, % of copy (x read, z written once): the layout in force "
            "when the sweep ran and the best of the round-4 switches (`o`: the output stage "
            "under one branch, `g`: warp-level amax atomics, `m`: a register cap); "
            "`TUNED` now takes each FP8 winner (docs/norms.md).",
            md_table(["norm", "H", "output", "then", "% of copy", "best", "% of copy", "gain"],
                     sorted(rows, key=lambda r: (r[0], r[1], r[2]))),
        ]  # fmt: skip
    later = [
        (
            "norm_tuning-fp8b",
            "--candidates fp8b",
            "Norm FP8 forward, round 5",
            "bf16 input, N = 16384 (2048 at H = 65536), % of copy (x read, z written once): the "
            "layout in force when the sweep ran (the round-4 `TUNED` entries) and the best with "
            "the round-5 switches (`q`: bf16 unpacked and FP8 packed as 32-bit words, `p`: the "
            "next row group's x copied ahead by cp.async; host settings: row groups per CTA); "
            "`TUNED` now takes each winner (`x4` for 4 groups per CTA; at LayerNorm 8192 the "
            "default 8 groups, 87.5%, within a point of 16; docs/norms.md).",
        ),
        (
            "norm_tuning-bwd",
            "--candidates bwd",
            "Norm backward, staged kernel",
            "bf16, N = 16384 (2048 at H = 65536), % of copy (x, dz read, dx written once): the "
            "layout in force when the sweep ran and the best staged layout (`t{stages}`: x and "
            "dz copied into shared memory by cp.async, stages rows ahead, read once); "
            "`TUNED` now takes each winner (docs/norms.md).",
        ),
        (
            "norm_tuning-big",
            "--candidates big",
            "Norm forward at H = 65536, clusters",
            "bf16 input, N = 2048, % of copy (x read, z written once): the layout in force when "
            "the sweep ran and the best of the row split over clusters of 2, 4 and 8 CTAs at "
            "2-8 accesses per thread, as is, with held weights (`h`) and with the next row "
            "group's x copied ahead (`p`, clusters of 4 and 8; host settings: row groups per "
            "CTA); `TUNED` now takes each winner (docs/norms.md).",
        ),
        (
            "norm_tuning-bf16p",
            "--candidates bf16p",
            "Norm bf16 forward, next-row copies",
            "bf16 input and output, N = 16384, % of copy (x read, z written once): the default "
            "layout and the best with the next row group's x copied ahead (`p`, on it and its "
            "neighbours, 4-16 row groups per CTA; `hp` with held weights). The defaults won "
            "everywhere; nothing was adopted.",
        ),
        (
            "norm_tuning-bwd2",
            "--candidates bwd2",
            "Norm backward, staged layouts and grids",
            "bf16, N = 16384, % of copy (x, dz read, dx written once): the layout in force when "
            "the sweep ran and the best staged layout at 1-4 accesses per thread, 2-6 stages, "
            "with the persistent grid capped at 2, 4 or 8 CTAs per SM (host setting "
            "`BWD_CTAS_PER_SM`; `b2` in a tag); `TUNED` takes the 4096 winners "
            "(docs/norms.md).",
        ),
        (
            "norm_tuning-near-ln",
            "--candidates near --norms layernorm --hidden 4096,8192,14336 --rounds 8 --repeat 5 "
            "--shuffle",
            "LayerNorm, neighbourhood of each entry (paired rounds)",
            "bf16 input, N = 16384, % of copy: the entry in force when the sweep ran and the "
            "best of its neighbourhood (each switch flipped, other row-group counts, half and "
            "twice the accesses; the staged backward's depth and grid), timed in 8 shuffled "
            "rounds; the JSON's `vs_default` is each case's median same-round speed over the "
            "entry. `TUNED` takes the winners faster in >= 88% of the rounds (docs/norms.md).",
        ),
        (
            "norm_tuning-near-rms",
            "--candidates near --norms rmsnorm --hidden 4096 --rounds 8 --repeat 5 --shuffle",
            "RMSNorm at 4096, neighbourhood of each entry (paired rounds)",
            "As the LayerNorm table above, at H = 4096.",
        ),
        (
            "norm_tuning-big-mail",
            "--candidates big --rounds 3 --repeat 5 --shuffle",
            "Norm forward at H = 65536 after the cluster mailboxes",
            "bf16 input, N = 2048, % of copy: the entries of the time (clusters of 2), now "
            "with the row sums exchanged through mailboxes instead of a cluster barrier, and "
            "the best of the `--candidates big` layouts (docs/norms.md).",
        ),
        (
            "norm_tuning-big2",
            "--candidates big2 --rounds 3 --repeat 5 --shuffle",
            "Norm at H = 65536, clusters of 4 and 8 (paired rounds)",
            "bf16, N = 2048, % of copy: the entry in force when the sweep ran and the best of "
            "clusters of 4 and 8 with the next row copied ahead (16-64 row groups per CTA, "
            "held weights or not, `u` or not) and of the staged backward over clusters of 8; "
            "`TUNED` takes each winner (docs/norms.md).",
        ),
        (
            "norm_tuning-onered",
            "--candidates onered --norms layernorm",
            "LayerNorm forward, one reduction",
            "bf16 input, N = 16384 (2048 at H = 65536), % of copy: the layout in force when the "
            "sweep ran and the best with the one (count, mean, M2) reduction (`u`; `a2`: split "
            "sums), on TUNED's FP8 layouts below 65536 and on the cluster leaders at 65536; "
            "`TUNED` takes the 65536 winners (docs/norms.md).",
        ),
        (
            "norm_tuning-lanes",
            "--candidates lanes --rounds 12 --repeat 5 --shuffle",
            "Norm round 8: row sums across lanes, 32-bit word reads (paired rounds)",
            "bf16, N = 16384 (2048 at H = 65536), % of copy: the entry in force when the sweep "
            "ran and the best with `l` (a row sum's per-warp values added across lanes by "
            "shuffles) and, where the entry had none, `q` (the staged backward's shared-memory "
            "reads, or the bf16 forward's loads, as 32-bit words), timed in 12 shuffled "
            "rounds; `TUNED` takes the backward winners faster in >= 92% of the rounds "
            "(docs/norms.md). Every forward kept its entry.",
        ),
        (
            "norm_tuning-fold",
            "--candidates fold --rounds 12 --repeat 5 --shuffle",
            "Norm staged backward: fp32 gamma, folded dx (paired rounds)",
            "bf16, N = 16384 (2048 at H = 65536), % of copy: the staged backward entries after "
            "the round above and the best with `f` (weight(gamma) in shared memory as fp32) "
            "and `d` (dx from the row's constants, two FFMA per element), 12 shuffled rounds; "
            "`TUNED` takes RMSNorm 14336 (`f`) and LayerNorm 4096 (`d`, since replaced "
            "by the cluster layout below).",
        ),
        (
            "norm_tuning-bwdc",
            "--candidates bwdc --hidden 8192,14336 --rounds 8 --repeat 5 --shuffle",
            "Norm at 8192 and 14336 over clusters of 2 and 4 CTAs (paired rounds)",
            "bf16, N = 16384, % of copy: the entry in force and the best of the staged "
            "backward and the FP8 forward with each row split over a thread block cluster of "
            "2 or 4 CTAs (1-8 accesses per thread, 2 or 3 stages, 16 or 64 row groups per CTA "
            "with the next row copied ahead), 8 shuffled rounds; `TUNED` takes LayerNorm "
            "backward 14336 (`w7r1v8j4c2qt3`: the table's `b2` twin tied with it) and RMSNorm "
            "FP8 forward 8192 (docs/norms.md).",
        ),
        (
            "norm_tuning-bwdc-4096",
            "--candidates bwdc --hidden 4096 --rounds 8 --repeat 5 --shuffle",
            "Norm at 4096 over clusters of 2 and 4 CTAs (paired rounds)",
            "As the table above, at H = 4096; `TUNED` takes LayerNorm backward (a "
            "cluster of 4 CTAs of one warp each).",
        ),
        (
            "norm_tuning-sfwd",
            "--candidates sfwd --norms layernorm --rounds 6 --repeat 5 --shuffle",
            "LayerNorm, the staged forward (paired rounds)",
            "bf16 input, N = 16384 (2048 at H = 65536), % of copy: the entry in force and the "
            "best staged forward (`t{stages}`: x copied into shared memory by cp.async, 2-4 rows "
            "deep, a persistent grid; the weights there as stored or, `f`, as fp32), 1-8 CTAs "
            "per row, 2-8 accesses per thread, 6 shuffled rounds; `TUNED` takes the four "
            "FP8 winners, each faster in every round (docs/norms.md). The bf16 forwards kept "
            "their register kernels.",
        ),
        (
            "norm_tuning-snear",
            "--candidates snear --norms layernorm --rounds 8 --repeat 5 --shuffle",
            "LayerNorm FP8, the staged entries' neighbourhood (paired rounds)",
            "As the table above, around each staged entry: one stage more and fewer, `f`, `l` "
            "and `u` flipped, 1-4 CTAs per SM (`b`), other clusters and accesses per thread; "
            "`TUNED` takes `u` at 8192 (faster in every round).",
        ),
        (
            "norm_tuning-sfwd-rms",
            "--candidates sfwd --norms rmsnorm --hidden 4096,65536 --rounds 6 --repeat 5 --shuffle",
            "RMSNorm, the staged forward (paired rounds)",
            "As the LayerNorm table above, for RMSNorm at 4096 and 65536: every staged layout "
            "lost to the entries (by 1-10%); nothing was adopted.",
        ),
        (
            "norm_tuning-srows",
            "--candidates srows --rounds 6 --repeat 5 --shuffle",
            "Norm forward, the staged forward with 2 and 4 rows per CTA (paired rounds)",
            "bf16 input, N = 16384, % of copy: the entry in force and the best staged forward "
            "with 2 or 4 rows per CTA sharing the weights (`r2`, `r4`; 2, 4 and 8 accesses per "
            "thread, 2 or 3 stages, weights as stored or `f`), 6 shuffled rounds; LayerNorm "
            "FP8 won at 4096 and 14336 (every round), the others kept their entries.",
        ),
        (
            "norm_tuning-bal",
            "--candidates bal --rounds 8 --repeat 5 --shuffle",
            "Norm, balanced persistent grids and two rows per staged CTA (paired rounds)",
            "Every persistent entry with `PERSISTENT_BALANCED` (host side: the fewest CTAs that "
            "keep the most row groups one CTA takes), and the staged LayerNorm FP8 entries with "
            "2 rows per CTA, 8 shuffled rounds; `TUNED` takes the `r2` layouts at 4096 and "
            "14336 (faster in every round); the balanced grid gained nothing (0.993-1.002x) and "
            "stays off.",
        ),
        (
            "norm_tuning-sregs",
            "--candidates sregs --hidden 4096,65536 --rounds 4 --repeat 5 --shuffle",
            "Norm forward, the staged forward with its weights in registers (paired rounds)",
            "The staged forward with gamma and beta held in registers once per CTA (`h`) or "
            "loaded per row from global memory (`e`) instead of shared memory, 1-2 rows per CTA "
            "or clusters, 2-4 stages, 4 shuffled rounds; `TUNED` takes LayerNorm FP8 at "
            "4096 (1.014x) and 65536 (1.043x) and LayerNorm bf16 at 65536 (1.036x), each faster "
            "in every round; RMSNorm kept its entries.",
        ),
        (
            "norm_tuning-defer",
            "--candidates defer --rounds 6 --repeat 5 --shuffle",
            "Norm backward, each row's dx written a row later (paired rounds)",
            "The staged backward with `i` (a row's sums posted, its dx written after the next "
            "row's first pass, so the cluster exchange's wait overlaps that work; one row fewer "
            "in flight), at the entry's depth and deeper, and at 65536 over 4, 8 or 16 warps per "
            "CTA, 3-5 stages and 1-3 CTAs per SM, 6 shuffled rounds; `TUNED` takes the "
            "backward at 65536 (LayerNorm 1.090x, RMSNorm 1.125x) and RMSNorm at 14336 "
            "(1.008x), each faster in every round. At LayerNorm 65536 the best layouts tie "
            "(1.086-1.090x; `b1` and `b2` of one layout launch the same grid where one CTA "
            "fits an SM); `TUNED` takes `w16r1v8j2c8qlit3b2`, the highest `vs_default` "
            "with three stages.",
        ),
        (
            "norm_tuning-fdefer",
            "--candidates fdefer --rounds 6 --repeat 5 --shuffle",
            "Norm forward, each row's z written a row later (paired rounds)",
            "The staged forward with `i` (one row per CTA: a row's statistics posted, its z "
            "written after the next row's, x read again from its stage), each staged entry at "
            "its depth and one deeper with `u` flipped, and at 65536 every forward as 8 CTAs of "
            "4 warps with held weights, 3-4 stages, 1-2 CTAs per SM, 6 shuffled rounds; "
            "`TUNED` takes LayerNorm bf16 65536 (1.057x), LayerNorm FP8 4096 (1.010x) and "
            "RMSNorm bf16 and FP8 65536 (1.023x, 1.052x), each faster in every round; LayerNorm "
            "FP8 lost with `i` at 8192-65536 (0.43-0.96x).",
        ),
        (
            "norm_tuning-caps",
            "--candidates caps --rounds 6 --repeat 5 --shuffle",
            "Norm forward, register caps for more CTAs per SM (paired rounds)",
            "Each forward entry with `m` (`__launch_bounds__` asking ptxas for more CTAs per SM "
            "than its registers allowed: ptxas -v gave e.g. LayerNorm FP8 at 65536 168 registers "
            "and 3 CTAs per SM, 128 and 4 under m4, no spill), staged entries also with `h` and "
            "`i`, 6 shuffled rounds: every candidate lost, by 1-89% (most by 10-50%), and "
            "`TUNED` is unchanged.",
        ),
        (
            "norm_tuning-reread",
            "--candidates reread --hidden 4096,65536 --rounds 4 --repeat 5 --shuffle",
            "Norm forward, x read from its stage in each pass (paired rounds)",
            "The staged forward with `y` (x read again from its stage for each pass and, one "
            "access at a time, for the output stage: 168 -> 128 registers for LayerNorm FP8 at "
            "65536), each staged entry at its depth and one deeper, with and without `i`, and "
            "the 4096 register entries staged, 4 shuffled rounds: `TUNED` takes LayerNorm "
            "FP8 65536 `w4r1v8j8c8hogqiyt3` (1.051x, every round); `y` lost elsewhere "
            "(0.81-0.998x).",
        ),
        (
            "norm_tuning-hreread",
            "--candidates hreread --norms layernorm --hidden 8192,14336 --rounds 6 --repeat 5 "
            "--shuffle",
            "LayerNorm forward, weights in registers and x read from its stage (paired rounds)",
            "Round 14: the staged entries that keep their weights in shared memory (FP8 at 8192, "
            "two CTAs per SM by their 80 KB; 14336 over a cluster of 2 in place of the r2 "
            "entry) with `h` and `y` together (ptxas -v: 127-150 registers and 48 KB, 3-4 "
            "CTAs per SM at 8192), with and without `i` and `u`, 2-4 stages, 6 shuffled "
            "rounds: the best, `w4r1v8j8c1huogqiyt3` at 8192, was 1.009x but faster in 5 of "
            "6 rounds only; the others 0.88-0.99x at 8192 and 0.74-0.96x at 14336. "
            "`TUNED` is unchanged.",
        ),
        (
            "norm_tuning-wide",
            "--candidates wide --norms layernorm --hidden 65536 --rounds 4 --repeat 5 --shuffle",
            "LayerNorm FP8 at 65536, the row's columns over 8 or 16 warps per CTA (paired rounds)",
            "Round 15: the entry bound by instruction issue inside the row (see the fixed cost "
            "per call above) with its 8192 columns per CTA over 8 or 16 warps instead of 4 "
            "(ptxas -v: 78 registers at 8 warps; 2 warps did not fit), with and without `u` and "
            "`y`, 3-4 stages, 4 "
            "shuffled rounds: every candidate lost (0.29-0.96x); `TUNED` is unchanged.",
        ),
        (
            "norm_tuning-shift",
            "--candidates shift --norms layernorm --rounds 4 --shuffle",
            "LayerNorm FP8, one-pass statistics about the row's first element (paired rounds)",
            "Round 16: each staged LayerNorm FP8 entry with `z` (the statistics in one pass "
            'about x[row, 0], one exchange of two sums per row; docs/norms.md, "One-pass '
            'statistics"; 128 -> 96 registers at 65536), `u` dropped, with and without `y` '
            "and `i`, 3-4 stages, 4 shuffled rounds: `TUNED` takes LayerNorm FP8 65536 "
            "`w4r1v8j8c8hogqiyzt3` (1.086x, every round; the other layouts with `i` 1.04-1.06x, "
            "without it 0.85-0.95x); `z` lost at 4096-14336 (0.82-0.99x).",
        ),
        (
            "norm_tuning-pdl-ln14336",
            "--candidates pdl --norms layernorm --hidden 14336 --rounds 6 --shuffle "
            "--versus-compile",
            "LayerNorm bf16 at 14336, the staged layouts again after the dependent launches "
            "(paired rounds, torch.compile beside them)",
            "Round 17: the bf16 forward at 14336 sat at parity with torch.compile (0.98-1.03x "
            "across runs), so the staged layouts of rounds 9 and 13 were timed again now that a "
            "staged kernel also triggers the next launch, 6 shuffled rounds, with torch.compile "
            "of the same op in every round (one buffer set, so torch.compile reads lower here "
            "than on norm_bandwidth.py's rotating buffers): `w7r1v8j8c1qft4` 1.022x over the "
            "register entry (4 of 6 rounds). `bench/source_ab.py` then confirmed it on rotating "
            "buffers (below); `TUNED` takes it.",
        ),
        (
            "norm_tuning-pdl-4096",
            "--candidates pdl --norms layernorm --hidden 4096 --rounds 8 --shuffle",
            "LayerNorm at 4096 after round 17 (paired rounds)",
            "Round 17, LayerNorm at 4096, the forward closest to 90% of copy in FP8 (88.5-90.5% "
            "across the runs of 2026-12-03): the staged FP8 entry's neighbourhood and its layout "
            "as a register kernel (weights reloaded, or held over 4 or 8 row groups), and the "
            "staged bf16 layouts, 8 shuffled rounds: nothing beat either entry (FP8 at most "
            "0.999x, bf16 at most 0.89x). `TUNED` is unchanged.",
        ),
        (
            "norm_tuning-pdl-rms8192",
            "--candidates pdl --norms rmsnorm --hidden 8192 --rounds 6 --shuffle --versus-compile",
            "RMSNorm bf16 at 8192, the staged layouts (paired rounds, torch.compile beside them)",
            "Round 17, RMSNorm bf16 at 8192: every staged layout lost to the register entry "
            "(at most 0.92x), and the register entry (before the trigger below) read 0.996x of "
            "torch.compile in this run, slower in all 6 rounds. `TUNED` is unchanged.",
        ),
    ]
    later.append(
        (
            "norm_tuning-bal65536",
            "--candidates bal --hidden 65536 --rounds 16 --shuffle --versus-compile",
            "The persistent grids at 65536, balanced (paired rounds)",
            "Round 20: each H = 65536 entry with `PERSISTENT_BALANCED` (the fewest clusters that "
            "keep the most rows any cluster takes), 16 shuffled rounds. With 62 clusters of 8 "
            "CTAs resident at once (`cuOccupancyMaxActiveClusters`, read by a probe on this "
            "lease that was not kept; the later runs record it) 2 clusters took 34 rows of "
            "the 2048 and 60 took 33; balanced, 61 clusters of up to 34 rows: RMSNorm "
            "FP8 0.959x (slower in 13 of 16 rounds), the others 0.9997-1.006x. "
            "`PERSISTENT_BALANCED` stays off.",
        )
    )
    later += [
        (
            "norm_tuning-fetch256",
            "--candidates fetch256 --shuffle --rounds 8 --repeat 5",
            "The staged backwards with `L` (paired rounds)",
            "Round 22: each staged backward entry with its x and dz row copies asking L2 for "
            "256 bytes (`L`; round 21 had timed it on the forwards only), 8 shuffled rounds: "
            "RMSNorm 14336 1.014x (every round), the others 0.988-1.000x.",
        ),
        (
            "norm_tuning-fetch256-rms14336",
            "--candidates fetch256 --norms rmsnorm --hidden 14336 --shuffle --rounds 20 --repeat 5",
            "RMSNorm backward 14336 with `L`, again (paired rounds)",
            "Round 22, the one winner above alone, 20 shuffled rounds: 1.016x, faster in every "
            "round. `TUNED` takes `w28r1v8j2c1lfiLt3` for `rmsnorm_bwd` and "
            "`rmsnorm_bwd_add` at 14336.",
        ),
    ]
    for name, flag, title, text in later:
        d = load(name)
        if d is None:
            continue
        paired = any("vs_default" in r for r in d["rows"])
        candidates = [r for r in d["rows"] if r["config"] != "torch.compile"]
        rows = _then_and_best(
            candidates, lambda r: (r["norm"], r["hidden"], r.get("direction", "fwd"), r["out"]),
            lambda r: f"`{r['config']}`" + (f" {r['host']}" if r.get("host") else ""), paired,
        )  # fmt: skip
        header = ["norm", "H", "dir", "output", "then", "% of copy", "best", "% of copy", "gain"]
        parts += [
            f"### {title}",
            source(d, f"norm_tuning.py {flag} --name {name}"),
            text,
            md_table(header + (["same round (won)"] if paired else []),
                     sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3]))),
        ]  # fmt: skip
    for shape in ("8192x28672", "16384x8192", "strip-8192x28672"):
        d = load(f"cast_candidates-{shape}")
        if d is None:
            continue

        def shape_of(r: dict[str, Any]) -> str:
            switches = r.get("switches") or "-"
            return (f"{r['threads']} thr, {r['min_blocks']}/SM, group {r['load_group']}, "
                    f"{switches}")  # fmt: skip

        rows = _then_and_best(d["rows"], lambda r: (r["op"],), shape_of)
        strip = shape.startswith("strip-")
        command = "cast_tuning.py --candidates --shapes 8192x28672,16384x8192 --rounds 2"
        if strip:
            command = (
                f"cast_tuning.py --candidates --switch strip --shapes 8192x28672 --name {shape}"
            )
            command = command.replace("--name ", "--name cast_candidates-")
        parts += [
            f"### Cast tile switches, {shape.removeprefix('strip-')}"
            + (" (`strip`: column sums over several tiles per block)" if strip else ""),
            source(d, command),
            "bf16 to fp8_e4m3 (tensor scaling), 128 x 128 tiles, % of copy: the shape in force "
            "when the sweep ran and the best candidate (`gather4`: 4-byte shared-memory reads "
            "in the transposed write, `prefetch`: L2 prefetches of a thread's later chunks, "
            "`sum_scatter`: dbias sums reduce-scattered); `tile_config` now takes the winners "
            "(docs/cast.md)."
            + (
                " This sweep marks no default row and has no switch on its rows without one: "
                "the shapes then (dbias 128 thr, 4/SM, group 1; dbias_dgelu 256 thr, 2/SM, "
                "group 1) without prefetch, 69.2% and 59.1% (the defaults then also had "
                "prefetch)."
                if strip
                else ""
            ),
            md_table(["op", "then", "% of copy", "best", "% of copy", "gain"], rows),
        ]
    d = load("activation_row_tuning-mxfp8")
    if d is not None:
        rows = _then_and_best(
            [r for r in d["rows"] if r.get("hidden_size")], lambda r: (r["op"], r["output"]),
            lambda r: f"{r['threads']} x {r['unroll']}" + (
                " split" if r.get("split_scales") else "") + (
                "" if r.get("fp8_words", True) else " bytes"),
        )  # fmt: skip
        parts += [
            "### Gated activations to MXFP8 rowwise",
            source(d, 'activation_row_tuning.py --cases "reglu:mxfp8 rowwise,glu:mxfp8 '
                   'rowwise,swiglu:mxfp8 rowwise" --rounds 3 --name activation_row_tuning-mxfp8'),
            "bf16 16384 x 2 x 8192 input, H compiled in, threads x chunks per thread, median of "
            "3 rounds; `row_config` now takes 128 x 2 for gated forward ops to MXFP8 rowwise "
            "(the best for glu and swiglu, and for reglu within its rounds' spread).",
            md_table(["op", "output", "then", "% of copy", "best", "% of copy", "gain"], rows),
        ]  # fmt: skip
    if not parts:
        return None
    return "\n\n".join(["## Candidate sweeps of 2026-12-01 and 2026-12-02 (new defaults)", *parts])


PHASES = ("CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation", "total (wall)")


# compile_latency-<tag>.json files, in the report's order: the 2-core development machines of
# 2026-12-02 (AMD EPYC), 2026-12-01 (Intel Xeon) and 2026-11-30 (AMD EPYC), the GPU host.
COMPILE_HOSTS = ("dev-2core-2026-12-02", "dev-2core", "dev-2core-2026-11-30", "h200-host")


def compile_section() -> str | None:
    rows = []
    for tag in COMPILE_HOSTS:
        d = load(f"compile_latency-{tag}")
        if d is None:
            continue
        indexed = "warm_imported" in d  # measured with the key index
        no_bc = d.get("warm_import_no_bytecode_ms")
        rows.append(
            [
                tag,
                f"{d['cpus']} x {d.get('cpu_model', '?')}",
                d["nvrtc"],
                f"{d['first_compile_wall_ms']:.0f}",
                f"{d['cold_compile_nvrtc_median_ms']:.1f}",
                "yes" if indexed else "no",
                f"{d['warm_import_ms']:.0f}" + ("" if indexed else " (no bytecode)"),
                "-" if no_bc is None else f"{no_bc:.0f}",
                f"{d['warm_first_get_kernel_ms']:.1f}",
                f"{d['warm_disk_hit_median_ms']:.2f}",
                f"{d['memory_get_kernel_us']:.2f}",
                d["date"][:10],
            ]
        )
    if not rows:
        return None
    phase_rows = []
    for tag in COMPILE_HOSTS:
        d = load(f"compile_latency-{tag}")
        for what, phases in ((d or {}).get("phases_ms") or {}).items():
            phase_rows.append([tag, what] + [f"{phases.get(p, float('nan')):.1f}" for p in PHASES])
    phase_parts = []
    if phase_rows:
        phase_parts = [
            "Where a cold compile's time goes: NVRTC's own report (`-time`), medians over the "
            'same GELU variants compiled again, and over an empty kernel (`extern "C" '
            "__global__ void k(float*) {}`): the fixed cost of any compile with these options.",
            md_table(["host", "source", *PHASES], phase_rows),
        ]
    return "\n\n".join(
        [
            "## Compile latency and cache hits",
            "`python bench/compile_latency.py` (no GPU needed); data: "
            "`bench/results/compile_latency-*.json`. Cold compiles are the NVRTC time of 14 "
            "distinct GELU variants for sm_90, median (the first of the 15 variants, which pays "
            "for NVRTC's initialization, has its own column); the new-process columns come from a"
            " fresh interpreter that finds all 15 variants on disk: its import time (with the "
            "package's bytecode cached, as an installed wheel has it, and without), its first "
            "`get_kernel` (all one-time set-up included) and the median per-key disk hit after "
            "that. With the key index ([cache.md](cache.md)) the set-up is reading settings and "
            "the index's environment fingerprint, and a disk hit is an index record, a read and a"
            " verification: no Jinja2, no NVRTC, no diskcache; without it (rows marked no: "
            "measured before the index) the first `get_kernel` loaded NVRTC to learn its version,"
            " imported Jinja2 and opened the cache, and each disk hit rendered and digested the "
            "source.",
            md_table(
                [
                    "host",
                    "CPUs",
                    "NVRTC",
                    "first compile ms (NVRTC init)",
                    "cold compile ms (NVRTC)",
                    "key index",
                    "new process: import ms",
                    "import ms, no bytecode",
                    "first get_kernel ms",
                    "disk hit ms / key",
                    "memory hit us",
                    "date",
                ],
                rows,
            ),
            *phase_parts,
            *_compile_target(),
        ]
    )


def _option_floor() -> list[str]:
    """bench/nvrtc_option_floor.py: the empty kernel's compile under option sets."""
    d = load("nvrtc_option_floor-dev-2core")
    if d is None:
        return []
    rows = [[r["options"], r["output"], "yes" if r["keeps_sass"] else "no", f"{r['ms']:.1f}",
             f"{r['min_ms']:.1f}-{r['max_ms']:.1f}"] for r in d["rows"]]  # fmt: skip
    return [
        f"NVRTC's fixed cost per compile under option sets: {source(d, 'nvrtc_option_floor.py')} "
        f"An empty kernel for {d['arch']}, NVRTC {d['nvrtc']}, rounds over all sets in turn "
        "after three warm-up compiles (the `-time` figures above come from a few compiles "
        "each, less settled). Only options that keep a kernel's SASS are open to issue 7.",
        md_table(["options", "output", "keeps SASS", "median ms", "range ms"], rows),
        *_kernel_ladder(d),
    ]


def _kernel_ladder(d: dict[str, Any]) -> list[str]:
    """The same run's kernel ladder: what a GELU kernel adds to the empty kernel's compile."""
    kernels = d.get("kernels")
    if not kernels:
        return []
    rows = [[r["kernel"], f"{r['ms']:.1f}", f"{r['over_floor_ms']:+.1f}",
             f"{r['min_ms']:.1f}-{r['max_ms']:.1f}"] for r in kernels]  # fmt: skip
    return [
        "The same run, kernels under the engine's options in turn: the empty kernel, the "
        "smallest GELU kernel the device helpers allow (one bf16 element per thread, a bounds "
        "check; a lower bound, far from the bandwidth targets) and the engine's GELU variants.",
        md_table(["kernel", "median ms", "over empty", "range ms"], rows),
    ]


def _compile_target() -> list[str]:
    """The issue's compile target against each host's median and fixed (empty-kernel) cost."""
    parts = []
    for tag in COMPILE_HOSTS:
        d = load(f"compile_latency-{tag}")
        if d is None:
            continue
        target = 40.0 if tag.startswith("h200") else 30.0  # issue 7: 2-core dev machine / host
        median = d["cold_compile_nvrtc_median_ms"]
        empty = ((d.get("phases_ms") or {}).get("empty kernel") or {}).get("total (wall)")
        verdict = "met" if median <= target else "missed"
        floor = "" if empty is None else f"; an empty kernel alone {empty:.1f} ms (-time run)"
        parts.append(f"{tag} ({d.get('cpu_model', '?')}, {d['date'][:10]}): median "
                     f"{median:.1f} ms against <= {target:.0f} ms, {verdict}{floor}.")  # fmt: skip
    if not parts:
        return []
    return [
        *_option_floor(),
        "Targets (issue 7: <= 30 ms on the 2-core development machine, <= 40 ms on the "
        "H200 host; the phases were measured on the 2-core machines only): " + " ".join(parts),
    ]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _ratio(value: float | None) -> str:
    """A speed-up as ``1.31x``; three decimals within half a percent of 1 or 2 (a tie, or the
    cast targets' 2x, to read)."""
    if value is None:
        return "-"
    near = abs(value - 1) < 0.005 or abs(value - 2) < 0.01
    return f"{value:.3f}x" if near else f"{value:.2f}x"


def activation_family_section() -> str | None:
    d = load("activation_bandwidth")
    if d is None:
        return None
    copy = d["copy_gbps"]
    rows = []
    for r in d["rows"]:
        eager = r.get("eager_gbps")
        comp = r.get("compile_gbps")
        rows.append([
            r["op"], r["output"], f"{r['engine_ms'] * 1e3:.0f}", f"{r['engine_gbps']:.0f}",
            _pct(100 * r["engine_gbps"] / copy),
            "-" if eager is None else f"{eager:.0f}",
            "-" if comp is None else f"{comp:.0f}",
            _ratio(r.get("speedup_vs_compile")),
        ])  # fmt: skip
    shape = "x".join(map(str, d["shape"]))
    compiled = sorted({r["op"] for r in d["rows"] if r.get("compile_gbps") is not None})
    every = compiled == sorted({r["op"] for r in d["rows"]})
    command = "activation_bandwidth.py" if every else (
        f"activation_bandwidth.py --compile-ops={','.join(compiled)}")  # fmt: skip
    measured = (
        "every op (each case compiled after `torch._dynamo.reset()`)" if every
        else f"{', '.join(f'`{op}`' for op in compiled)} only in this run (device time); "
        "`-` = not measured"
    )  # fmt: skip
    ratios = [r for r in d["rows"] if r.get("speedup_vs_compile") is not None]
    slowest = min(ratios, key=lambda r: r["speedup_vs_compile"]) if ratios else None
    closest = "" if slowest is None else (
        f" Closest to torch.compile: {slowest['op']} {slowest['output']}, "
        f"{_ratio(slowest['speedup_vs_compile'])} ({slowest['engine_ms'] * 1e3:.1f} us against "
        f"{slowest['compile_ms'] * 1e3:.1f} us).")  # fmt: skip
    return "\n\n".join(
        [
            "## Activation family",
            source(d, command),
            f"Input {shape} {d.get('input_dtype', 'bf16')} (gated ops: 2 x the hidden size); "
            f"device copy **{copy:.0f} GB/s** in the same run. torch.compile was measured for "
            f"{measured}. Targets (issue 3): "
            ">= 90% of copy for rowwise outputs, >= 80% for MXFP8 both, never slower than "
            f"torch.compile.{closest}",
            md_table(
                [
                    "op",
                    "output",
                    "us",
                    "GB/s",
                    "% of copy",
                    "eager GB/s",
                    "compile GB/s",
                    "vs compile",
                ],
                rows,
            ),
        ]
    )


def norm_section() -> str | None:
    d = load(NORM_TABLE_RUN)
    if d is None:
        return None
    paired = any("vs_compile_paired" in r for r in d["rows"])
    copy_paired = any("pct_of_copy_paired" in r for r in d["rows"])

    def versus(r: dict[str, Any]) -> list[str]:
        out = [_pct(r.get("pct_of_copy_paired"))] if copy_paired else []
        if not paired:
            return out
        if r.get("vs_compile_paired") is None:
            return [*out, "-"]
        return [*out, f"{r['vs_compile_paired']:.3f}x ({r['faster_than_compile']:.2f})"]

    rows = [[r["norm"], r["case"], f"{r['tokens']}x{r['hidden']}", r["impl"],
             f"{r['ms'] * 1e3:.0f}", f"{r['gbps']:.0f}", _pct(r.get("pct_of_copy")), *versus(r)]
            for r in d["rows"] if r.get("ms") is not None]  # fmt: skip
    compiled = any(r["impl"] == "torch.compile" for r in d["rows"])
    return "\n\n".join(
        [
            "## Normalization family",
            source(
                d,
                d.get("command", "").removeprefix("bench/")
                or "norm_bandwidth.py"
                + ("" if compiled else " --no-compile")
                + f" --repeat={d.get('repeat', 20)}",
            ),
            f"bf16; device copy **{d['copy_gbps']:.0f} GB/s**"
            + (
                f" at the start of the run, {d['copy_gbps_end']:.0f} at its end"
                if "copy_gbps_end" in d
                else ""
            )
            + ("" if compiled else "; torch.compile not measured in this run (device time)")
            + ". Forward counts x read and z written once (plus gamma/beta); "
            "backward x and dz read and dx written once. Targets (issue 4): forward >= 90% of copy "
            "at H >= 4096 and never below torch.compile; backward >= 75%."
            + (
                " `% of copy, paired`: the specialized kernel and the same 1 GiB copy timed "
                "again in the same paired rounds (below), the median over the rounds of its "
                "GB/s over the copy's in that round; `% of copy` divides by the copy timed once "
                "at the start. A row meets its % target only where both figures do."
                if copy_paired
                else ""
            )
            + (
                f" The last column: the specialized kernel against torch.compile in "
                f"{d.get('paired_rounds')} paired rounds after the table's timings, the median "
                "same-round ratio (above 1: faster) and the fraction of rounds it was faster."
                if paired
                else ""
            )
            + _later_fp8(d),
            md_table(
                ["norm", "case", "N x H", "implementation", "us", "GB/s", "% of copy"]
                + (["% of copy, paired"] if copy_paired else [])
                + (["x torch.compile, paired (won)"] if paired else []),
                rows,
            ),
            f"This run: {d['date'][:16].replace('T', ' ')} UTC. {NORM_TABLE_NOTE} "
            f"{_target_line(d)} The other runs of the script that day are at the end of this "
            "section, each with the code it ran.",
            *_compile_recheck(d),
            *_held_rerun(d),
            *_rerun(d),
            *_method(),
            *_fixed_cost(),
            *_vs_cast(),
            *_dependent_launch(),
            *_source_ab(),
            *_cta_times(),
            *_spread(d),
            *_clusters(),
            *_tail(),
            *_other_runs(d),
        ]
    )


# The table's run of bench/norm_bandwidth.py (bench/results/NAME.json). The other runs of its
# day are found by name (norm_bandwidth*.json); what the files do not say about them goes
# here: the code they ran against the table's, and the command for the runs made before
# results recorded it.
NORM_TABLE_RUN = "norm_bandwidth-2026-12-05-round25-full"
# Round 19's source_ab runs were made while the template aligned every forward's reduction
# buffer to 16 bytes; it does so only where W is on since, so that the other kernels' sources
# are round 18's again.
ALIGNED = ("In this run every forward's reduction buffer was 16-byte aligned (the template "
           "has that attribute only where `W` is on since): the kernels without `W` here "
           "differ from the shipped ones by it.")  # fmt: skip
NORM_TABLE_NOTE = ("Round 25's kernels, the shipped set (`A` at LayerNorm FP8 4096 and 14336, "
                   "`w4r1v8j4c1hogqiAt3` and `w14r2v8j4c1ogqAt2`; `L` at RMSNorm backward 14336), "
                   "with torch.compile: the full run that round 25's no-compile run "
                   "(norm_bandwidth-2026-12-04-round25, counted in 'The same kernels across "
                   "runs' below) could not make. The code between "
                   "them moved the kernels' host side into modules of their own and split the "
                   "template; bench/render_snapshot.py found every norm key's rendered source "
                   "unchanged by it. This run was named the table's before it ran.")  # fmt: skip
OTHER_RUN_NOTES = {
    "norm_bandwidth": "Round 17's kernels: the RMSNorm FP8 register kernels at 4096-14336 "
    "(several row groups per CTA) and the staged forwards that hold their weights in "
    "registers (`h`) still had the trigger (`norm._triggers` has since left it out of both).",
    "norm_bandwidth-shift-first": "Round 16's kernels, before round 17's trigger in the "
    "register forwards and LayerNorm bf16 14336's staged entry.",
    "norm_bandwidth-2026-12-03-confirm": "The same lease, 90 s after the 08:33 run; its kernels.",
    "norm_bandwidth-2026-12-03-pdl4096": "Another lease, 30 minutes later; the 08:33 run's "
    "kernels (the sweep named by --tuned-from had no winner: no override).",
    "norm_bandwidth-2026-12-03-head": "Another lease, after commit 9fc4189: the RMSNorm FP8 "
    "register kernels at 4096-14336 (several row groups per CTA) without the trigger, which "
    "the runs before had (they ran 1.003-1.006x faster without it: 'Source edits, paired' "
    "above); the staged forwards that hold their weights (`h`) still with it.",
    "norm_bandwidth-2026-12-03-noheldtrigger": "Round 18's kernels (the table of the "
    "afternoon's first report); another lease.",
    "norm_bandwidth-2026-12-03-warpstats": "Round 19, a trial: besides the table's two `W` "
    "entries a third at LayerNorm bf16 4096 (`w4r1v8j4c1W`, not taken: level in "
    "source_ab-ln4096-W2.json), and every forward's reduction buffer 16-byte aligned (the "
    "template has that attribute only where `W` is on).",
    "norm_bandwidth-2026-12-03-final": "Round 19's entries, with every forward's reduction "
    "buffer 16-byte aligned (since only where `W` is on, so the other kernels' sources are "
    "round 18's again); another lease, 7 minutes before the table's run.",
    "norm_bandwidth-2026-12-03-final2": "The same code as the run before, 90 s later, same lease.",
    "norm_bandwidth-2026-12-03-round19": "Round 19's table run; another lease.",
    "norm_bandwidth-2026-12-03-round20": "Round 20's table run (the same kernels as round 19's "
    "by cache digest); another lease.",
    "norm_bandwidth-2026-12-04-round22-repeat": "The table's lease, right after it: LayerNorm "
    "at 4096 and 14336 again, without torch.compile (--no-compile), to see how far the same "
    "code moves between two runs on one GPU.",
    "norm_bandwidth-2026-12-04-rms14336-L": "Another lease, after `TUNED` took `L` for "
    "RMSNorm backward at 14336 (`w28r1v8j2c1lfiLt3`): RMSNorm at 14336 alone.",
    "norm_bandwidth-2026-12-04-align128": "Round 25, a trial: every staged kernel's stages on "
    "a 128-byte boundary (`__align__(128)` in the template for all; bench/source_ab.py's "
    "`align16` undoes it), without torch.compile (--no-compile). The kernels are not any "
    "shipped set: `TUNED` took the boundary (switch `A`) at LayerNorm FP8 4096 and 14336 "
    "only, where it won.",
    "norm_bandwidth-2026-12-05-repeat": "Another lease, 12 minutes after the table's run: "
    "the same kernels (by their cache digests) again, without torch.compile (--no-compile), "
    "to see how far one set of kernels moves between leases.",
    "norm_bandwidth-2026-12-04-round25": "Round 25's kernels: `A` at LayerNorm FP8 4096 and "
    "14336 (`w4r1v8j4c1hogqiAt3`, `w14r2v8j4c1ogqAt2`), every other kernel the table's; "
    "without torch.compile (--no-compile: the lease's device time was spent). The table's "
    "torch.compile figures hold for the kernels it shares with this run; the two new ones "
    "are faster than the table's. Its backward kernels' sources differ from the table's by a "
    "comment the template then had on the line that declares the stages (since taken out): "
    "their cubins are the table's byte for byte (compiled both ways for sm_90).",
}
LEGACY_COMMANDS = {
    "norm_bandwidth-2026-12-03-confirm": "--repeat=50 --name norm_bandwidth-2026-12-03-confirm",
    "norm_bandwidth-2026-12-03-pdl4096": "--repeat=50 --tuned-from "
    "bench/results/norm_tuning-pdl-4096.json --name norm_bandwidth-2026-12-03-pdl4096",
}


def _misses(r: dict[str, Any]) -> list[list[Any]]:
    """The specialized rows of a bench/norm_bandwidth.py run ``r`` that missed one of issue
    4's targets at H >= 4096 (forward >= 90% of copy, backward >= 75%, by the sequential
    figure and, where the run has it, the paired one too; and not slower than torch.compile
    in the sequential timings), as table rows: norm, case, H, % of copy (the paired figure
    after it, where there is one), the target(s) missed, x torch.compile (sequential; four
    decimals where three would read 1.000), x torch.compile paired (the fraction of rounds
    won)."""
    compiled = {(q["norm"], q["case"], q["hidden"]): q for q in r["rows"]
                if q["impl"] == "torch.compile" and q.get("ms")}  # fmt: skip
    rows = []
    for q in r["rows"]:
        if q["impl"] != "nvrtc_engine specialized" or q["hidden"] < 4096 or not q.get("ms"):
            continue
        target = 75.0 if q["case"] == "bwd" else 90.0
        c = compiled.get((q["norm"], q["case"], q["hidden"]))
        seq = c["ms"] / q["ms"] if c else None
        pcts = [q["pct_of_copy"], *([q["pct_of_copy_paired"]] if "pct_of_copy_paired" in q else [])]
        missed = [f">= {target:.0f}% of copy"] if min(pcts) < target else []
        missed += ["torch.compile"] if seq is not None and seq < 1 else []
        if missed:
            tie = seq is not None and f"{seq:.3f}" == "1.000"
            won = q.get("faster_than_compile")
            # two decimals where one would round up to the target
            shown = ", paired ".join(f"{p:.2f}%" if f"{p:.1f}" == f"{target:.1f}" else _pct(p)
                                     for p in pcts)  # fmt: skip
            rows.append([q["norm"], q["case"], q["hidden"], shown,
                         ", ".join(missed), f"{seq:.4f}x" if tie else _ratio(seq),
                         _ratio(q.get("vs_compile_paired"))
                         + (f" ({won:.2f})" if won is not None else "")])  # fmt: skip
    return rows


def _target_line(r: dict[str, Any]) -> str:
    """One sentence on which of issue 4's targets the run ``r`` met (:func:`_misses`)."""
    missed = _misses(r)
    scope = ("(the specialized kernels at H >= 4096, forward and backward; % of copy by the "
             "sequential and, where the run has it, the paired figure; torch.compile judged by "
             "the sequential timings)")  # fmt: skip
    if not missed:
        return f"Against issue 4's targets {scope} this run met every one."
    names = "; ".join(f"{m[0]} {m[1]} at {m[2]}, {m[4]} ({m[3]} of copy; {m[5]} of "
                      f"torch.compile in the sequential timings, {m[6]} paired)"
                      for m in missed)  # fmt: skip
    return (f"Against issue 4's targets {scope} this run missed {len(missed)}, every other "
            f"one met: {names}.")  # fmt: skip


def _same_code(r: dict[str, Any], d: dict[str, Any]) -> str:
    """A sentence comparing the specialized kernels of run ``r`` with those of the table's
    run ``d`` by their cache digests (recorded from 2026-12-03 on; empty where either run
    lacks them): the code itself, not only the layout in the kernel's name."""

    def digests(run: dict[str, Any]) -> dict[tuple, str]:
        return {(q["norm"], q["case"], q["hidden"]): q["digest"] for q in run["rows"]
                if q["impl"] == "nvrtc_engine specialized" and q.get("digest")}  # fmt: skip

    mine, table = digests(r), digests(d)
    if not mine or not table:
        return ""
    both = sorted(k for k in mine if k in table)
    differ = [k for k in both if mine[k] != table[k]]
    if not differ:
        return "Its specialized kernels are the table's, by their cache digests. "
    if len(differ) * 2 > len(both):  # name the fewer: those that are the same
        same = [k for k in both if k not in differ]
        names = ", ".join(f"{n} {c} {h}" for n, c, h in same) or "none"
        return (f"By their cache digests {len(differ)} of its {len(both)} specialized kernels "
                f"differ from the table's; the same: {names}. ")  # fmt: skip
    names = ", ".join(f"{n} {c} {h}" for n, c, h in differ)
    return (
        f"By their cache digests {len(differ)} of its specialized kernels differ from the "
        f"table's: {names}. "
    )


def _other_runs(d: dict[str, Any]) -> list[str]:
    """The other runs of bench/norm_bandwidth.py on the day of ``d``'s (issue 4's shapes at
    H >= 4096), oldest first: each specialized row that missed a target there."""
    others = []
    for path in RESULTS.glob("norm_bandwidth*.json"):
        r = load(path.stem)
        if (r and path.stem != NORM_TABLE_RUN and r["date"][:10] == d["date"][:10]
                and any(q.get("ms") for q in r["rows"])):  # fmt: skip
            others.append(r)  # (load names it by its file: a run renamed after it ran)
    out: list[str] = []
    for r in sorted(others, key=lambda r: r["date"]):
        name = r["benchmark"]
        command = r.get("command", "").removeprefix("bench/") or "norm_bandwidth.py " + (
            LEGACY_COMMANDS.get(name) or f"--repeat={r.get('repeat', 20)}")  # fmt: skip
        rows = _misses(r)
        if not out:
            out.append("### Other runs of bench/norm_bandwidth.py that day")
        out.append(
            f"{r['date'][:16].replace('T', ' ')} UTC. {OTHER_RUN_NOTES.get(name, '')} "
            + _same_code(r, d)
            + source(r, command)
            + f" Device copy {r['copy_gbps']:.0f} GB/s. "
            + (f"{len(rows)} specialized row{'s' if len(rows) > 1 else ''} missed a target "
               "(below); every other one met them." if rows else
               "Every specialized row met its targets.")
        )  # fmt: skip
        if rows:
            out.append(md_table(["norm", "case", "H", "% of copy", "missed", "x torch.compile",
                                 "x torch.compile, paired (won)"], rows))  # fmt: skip
    return out


def _spread(d: dict[str, Any]) -> list[str]:
    """The table's specialized kernels across every run of bench/norm_bandwidth.py that ran
    the same code (by cache digest): for each row that missed its % of copy target in any of
    them, the runs, their lowest, median and highest % of copy and how many met it."""
    table = {(q["norm"], q["case"], q["hidden"]): q["digest"] for q in d["rows"]
             if q["impl"] == "nvrtc_engine specialized" and q.get("digest")
             and q["hidden"] >= 4096}  # fmt: skip
    seen: dict[tuple, list[tuple[float, str]]] = {k: [] for k in table}
    for path in sorted(RESULTS.glob("norm_bandwidth*.json")):
        r = load(path.stem)
        for q in r["rows"] if r else []:
            k = (q["norm"], q["case"], q["hidden"])
            same = k in table and q.get("digest") == table[k]
            if same and q["impl"] == "nvrtc_engine specialized" and q.get("pct_of_copy"):
                seen[k].append((q["pct_of_copy"], path.stem))
    runs = sorted({name for v in seen.values() for _, name in v})
    if len(runs) < 2:
        return []
    rows = []
    for k, v in sorted(seen.items()):
        target = 75.0 if k[1] == "bwd" else 90.0
        pcts = sorted(p for p, _ in v)
        met = sum(p >= target for p in pcts)
        if met < len(pcts):
            low, mid, high = pcts[0], pcts[len(pcts) // 2], pcts[-1]
            rows.append([*k, f"{target:.0f}%", len(pcts), _pct(low), _pct(mid), _pct(high),
                         f"{met} of {len(pcts)}"])  # fmt: skip
    named = ", ".join(f"`{n}`" for n in runs)
    sizes = sorted(len(v) for v in seen.values())
    counts = f"{sizes[0]}" if sizes[0] == sizes[-1] else f"{sizes[0]} to {sizes[-1]}"
    verdict = "Every row met its % of copy target in each of them."
    if rows:
        which = "1 row missed its" if len(rows) == 1 else f"{len(rows)} rows missed their"
        verdict = (f"{which} % of copy target in at least one run "
                   "(median: the middle run, the higher of the two with an even count); "
                   "every other row met it in all of them.")  # fmt: skip
    header = ["norm", "case", "H", "target", "runs", "lowest", "median", "highest", "met"]
    return [
        "### The same kernels across runs",
        f"The table's specialized kernels (H >= 4096) in every run of bench/norm_bandwidth.py "
        f"that ran them, the table's included, on several leases of the H200: a run counts "
        f"for a row where its kernel's cache digest is the table's ({counts} runs a row, of "
        f"{named}). {verdict}",
        *([md_table(header, rows)] if rows else []),
    ]


def _clusters() -> list[str]:
    """bench/norm_clusters.py runs: a persistent forward with its grid capped at fewer
    clusters than the GPU holds."""
    out: list[str] = []
    names = ("norm_clusters-rms65536-fp8", "norm_clusters-ln65536-fp8",
             "norm_clusters-rms65536-bf16-check")  # fmt: skip
    for name in names:
        d = load(name)
        if d is None:
            continue
        if not out:
            out += [
                "### Resident clusters",
                "A persistent grid over clusters of 8 CTAs has at most as many clusters as "
                "the GPU holds at once, which depends on how its SMs fall into GPCs (62 for "
                "these kernels on the two leases where it was recorded, 2026-12-03 18:20 and "
                "18:52 UTC; `residency` in the JSON). The grid as launched has fewer where the "
                "layout caps its CTAs per SM (`b`: 33 for RMSNorm bf16, the last run below, "
                "a 5-round check of the script). To see what a "
                "GPU holding fewer would give, the same kernel with its grid capped at fewer "
                "clusters, in paired rounds on one GPU (`x full`: the full grid's time over "
                "the capped one's). The time does not follow the rows per cluster: 56 clusters "
                "of up to 37 rows ran as fast as 62 of up to 34, 58 of up to 36 2.5% slower; "
                "so a GPU with fewer resident clusters would not by that alone explain the "
                "spread above.",
            ]
        full = max(r["clusters"] for r in d["rows"])
        rows = [[r["clusters"], r["max_rows_per_cluster"], f"{r['ms'] * 1e3:.1f}",
                 _pct(r["pct_copy"]), _ratio(r["vs_full"]) if r["clusters"] != full else "-"]
                for r in d["rows"]]  # fmt: skip
        out += [
            f"{d['case']}, {d['tokens']} rows, `{d['kernel']}`. "
            + source(d, f"norm_clusters.py --case {d['case']} --name {name}")
            + f" Device copy {d['copy_gbps']:.0f} GB/s; {d['rounds']} paired rounds.",
            md_table(["clusters", "rows per cluster, at most", "us", "% of copy", "x full"], rows),
        ]
    return out


def _tail() -> list[str]:
    """bench/norm_tail.py: what the partial last wave of a persistent forward costs."""
    d = load("norm_tail-2026-12-03")
    if d is None:
        return []
    rows = []
    for c in d["cases"]:
        for s in c["sizes"]:
            rows.append([c["case"], f"`{c['kernel'].rsplit('_', 1)[-1]}`", c["clusters"],
                         s["rows"], f"{s['kernel_us']:.1f}", f"{s['copy_us']:.1f}"])  # fmt: skip
    return [
        "### The last wave",
        "A persistent grid of G clusters takes N / G waves of rows; where G does not divide N "
        "the last wave is partial (2048 rows over 62 clusters: 2 take a 34th row). The "
        "forwards nearest 90% of copy at N and at the whole waves around it, beside a device "
        "copy of the same bytes. RMSNorm FP8 65536 took as long at 2048 rows as at 2046 "
        "(62 x 33): the two rows of the partial wave cost nothing measurable, so the tail is "
        "not where its time goes. LayerNorm FP8 4096's partial wave (544 of 660 CTAs) cost "
        "1.6 us against 1.3 us for its share of a whole one. "
        + source(d, "norm_tail.py --rounds 10 --name norm_tail-2026-12-03")
        + f" {d['rounds']} paired rounds; medians; the kernels before `L`.",
        md_table(["case", "layout", "clusters", "rows", "kernel us", "copy us"], rows),
        "A hardware-counter profile of the same forwards (one launch each, "
        "`bench/profile_norm_forwards.py` under `ncu --clock-control none`; "
        "`results/ncu/norm-forwards-2026-12-03.csv`): LayerNorm FP8 4096 issues an "
        "instruction on 74% of the scheduler cycles (LayerNorm bf16 4096: 52%, RMSNorm FP8 "
        "4096: 46%) at 29% achieved occupancy (96 registers, 5 CTAs per SM), about 17.5 "
        "instructions per element. Cutting 32 of the ~560 a thread issues per row (`fmacenter`) "
        "and raising the CTAs per SM (`m6`) did not make it faster (above), so its issue rate "
        "is not the limit either. ncu's durations are shorter than the timed loops' (RMSNorm "
        "FP8 65536: 96.4 us against 105-107 us). A likely cause, not measured: a lone "
        "profiled launch ends with its last writes still in L2, which a loop pays for during "
        "the next call.",
    ]


def _source_ab() -> list[str]:
    """bench/source_ab.py runs: edits of a kernel's rendered source against the kernel as
    it was, in paired rounds beside torch.compile."""
    runs = [
        ("source_ab-trigger", "--cases rmsnorm:8192,layernorm:14336,rmsnorm:4096,layernorm:4096 "
         "--variants base,trigger,l2pf,plainst,trigger+l2pf --rounds 20",
         "The trigger in the register forwards, before it was in the template (the run wrote "
         "source_ab.json, kept as source_ab-trigger.json). `l2pf` and `plainst` edit the streaming "
         "path of `nve_memory.cuh`, which the norm templates do not enable: those kernels are "
         "the base kernel compiled again, so their rows show the spread of identical kernels "
         "(medians 1.000-1.001x; single rounds down to 0.961x)."),
        ("source_ab-stream", "--cases rmsnorm:8192,layernorm:14336,rmsnorm:4096,layernorm:4096,"
         "layernorm:8192,rmsnorm:14336 --out bf16,fp8 --variants base,stream,stream+l1w "
         "--rounds 20 --name source_ab-stream",
         "The activation and cast templates' streaming hints in the norm kernels (base: with "
         "the trigger): x loaded without allocating in L1 and z stored evict-first lost "
         "everywhere (bf16 0.75-0.92x; with the weights still through L1, `l1w`, 0.88-1.00x; "
         "FP8 0.98-1.00x). The norm templates keep plain loads and stores."),
        ("source_ab-ln14336", "--cases layernorm:14336 --variants base,stream+l1w,"
         "@w7r1v8j8c1qft4,@w7r1v8j8c1qft3,@w7r1v8j8c1qft4+stream --rounds 20 "
         "--name source_ab-ln14336",
         "LayerNorm bf16 at 14336: the staged `w7r1v8j8c1qft4` (round 17's best) beside the "
         "register entry with the trigger; `TUNED` takes it."),
        ("source_ab-fp8-trigger", "--cases rmsnorm:4096,rmsnorm:8192,rmsnorm:14336 --out fp8 "
         "--variants base,notrigger --rounds 20 --name source_ab-fp8-trigger",
         "The trigger in the register forwards whose CTAs take several row groups (`h`, `p`: "
         "RMSNorm FP8), which the template had put there too: without it they were faster in "
         "16-18 of 20 rounds, so `norm._triggers` leaves them out."),
        # later runs record their command
        ("source_ab-ln14336-held", "",
         "LayerNorm bf16 at 14336: staged layouts with the weights held in registers (`h`), "
         "the register entry and the merged statistics (`u`) beside the entry `qft4`: every "
         "one lost; torch.compile was faster than the entry on this lease."),
        ("source_ab-ln4096-fp8-trigger", "",
         "The trigger in the staged LayerNorm FP8 forward at 4096 (`hogqit3`, weights held "
         "in registers): faster without it in 18 of 20 rounds."),
        ("source_ab-staged-fp8-trigger", "",
         "The trigger in the staged FP8 forwards, a few minutes later on the same lease: "
         "without it the kernels that hold their weights in registers (`h`) were as fast or "
         "faster, LayerNorm FP8 8192 (`uogqt3`, weights in shared memory) slower."),
        ("source_ab-staged-bf16-trigger", "",
         "The same for the staged bf16 forwards, same lease: LayerNorm 65536 (`hqit3`) 1.021x "
         "faster without the trigger, LayerNorm 14336 (`qft4`, no `h`) 0.993x. Hence "
         "`norm._triggers`: no trigger where the weights are held."),
        *((f"source_ab-{case}-W-twopassmerge", "",
           f"Round 19, {what}, with the first form of `W`'s exchange (each warp's values "
           "read twice; ptxas held them beside the row: 119 registers at 14336, 80 at 8192, "
           "a spill at 14 warps); base is the entry without `W`. The run wrote "
           f"source_ab-{case}-W.json, a name round 20 used again. {ALIGNED}")
          for case, what in (("ln14336", "LayerNorm bf16 14336 (staged and register)"),
                             ("ln4096", "LayerNorm bf16 4096 (register)"),
                             ("ln8192", "LayerNorm bf16 8192 (register: 3 CTAs per SM, not 4)"),
                             ("ln8192-fp8", "LayerNorm FP8 8192 (in place of `u`)"),
                             ("ln4096-fp8", "LayerNorm FP8 4096 (without `i`)"),
                             ("ln14336-fp8", "LayerNorm FP8 14336 (two 14-warp rows per CTA)"))),
        ("source_ab-ln14336-W2", "",
         "Round 19, the exchange kept (each warp's values read once; 108 registers): LayerNorm "
         "bf16 14336, base is the layout with `W`, beside round 17's `qft4`; `TUNED` "
         f"takes `qfWt4`. {ALIGNED}"),
        ("source_ab-ln8192-fp8-W2", "",
         "The same exchange at LayerNorm FP8 8192: base is `W` in place of `u`, beside "
         f"`uogqt3`; `TUNED` takes `ogqWt3`. {ALIGNED}"),
        ("source_ab-ln4096-W2", "",
         "The same exchange on the register layout at LayerNorm bf16 4096: base is `W`, "
         "beside the rules' layout without it, which was faster in 16 of 20 rounds (0.998x "
         "for `W`; the first form had won 1.010x in every round on another lease, not "
         f"explained); not taken. {ALIGNED}"),
        ("source_ab-ln14336-fp8-W2", "",
         "The same exchange in the FP8 14336 entry's layout (two 14-warp rows per CTA): here "
         "base is the entry without `W` and the `@` row is `W`, at a third of the entry's "
         "speed and 0.63x of torch.compile, without spills; not explained, not taken. "
         f"{ALIGNED}"),
        ("source_ab-rms65536-fp8", "",
         "RMSNorm FP8 at 65536, the table's one miss: the entry (base) beside its "
         "neighbours, 4 stages, `y`, no `i`, `b2`, 8 warps of 4 accesses, and `y` with 4 "
         f"stages: every one slower (0.93-1.00x). {ALIGNED}"),
        ("source_ab-ln4096-fp8-W", "",
         "Round 20, LayerNorm FP8 at 4096 (the forward closest to 90% of copy with RMSNorm FP8 "
         "65536): the staged entry (base) beside `W` in its layout (which drops `i`), without "
         "`h`, over 2 rows per CTA, 4 stages and 8 warps: every one slower (0.78-0.97x)."),
        ("source_ab-ln4096-fp8-Wregs", "",
         "The same case, register layouts with several row groups per CTA (RMSNorm FP8 "
         "4096's form, `x4`; `p` copies the next group ahead), with and without `W`: every "
         "one slower than the staged entry (0.73-0.93x). `TUNED` is unchanged."),
        ("source_ab-rms65536-fp8-c4", "",
         "Round 20, RMSNorm FP8 at 65536 over clusters of 4 CTAs of 8 warps (2 CTAs per SM, "
         "so as many warps per SM as the entry's 4 CTAs of 4 warps) and of 2 CTAs of 16 "
         "warps: 0.966-0.994x of the entry's cluster of 8."),
        ("source_ab-ln65536-fp8-c4", "",
         "The same for LayerNorm FP8 at 65536: a cluster of 4 0.933x, of 2 1.001x (faster in "
         "12 of 20 rounds); `TUNED` is unchanged."),
        ("source_ab-ln4096-fp8-deep", "",
         "Round 20, more rows in flight: LayerNorm FP8 at 4096 with 4 and 5 stages (2 and 3 "
         "rows in flight beside the one worked on and the one written a row later; 5 CTAs "
         "per SM as the entry), and with `y` (64 registers): every one slower (0.92-0.95x)."),
        ("source_ab-rms65536-fp8-deep", "",
         "The same for RMSNorm FP8 at 65536: 8 warps of 4 accesses with 4 stages, with and "
         "without `y` (3 CTAs per SM): 0.94x and 0.93x. The entry read 94.5% of copy on "
         "this lease, 90.2-91.3% on the two before it."),
        ("source_ab-ln4096-fp8-b", "",
         "Round 20, fewer CTAs per SM in the persistent grid (`b`): LayerNorm FP8 at 4096 with "
         "at most 4 and 3 (the entry takes 5): 0.961x and 0.875x."),
        ("source_ab-rms65536-fp8-b", "",
         "The same for RMSNorm FP8 at 65536, at most 3 CTAs per SM (49 clusters of 8 in "
         "place of 62): 0.970x. The entry read 96.1% of copy on this lease."),
        ("source_ab-ln-fp8-fmacenter", "",
         "Round 21, `fmacenter`: the LayerNorm output stage's `(x - mu) * rsigma` as one FFMA "
         "(`x * rsigma - mu * rsigma`), 32 instructions fewer per row and thread at 4096 "
         "(`bench/sass.py`: the row loop 919 -> 857 with both access paths), same registers. "
         "Fewer instructions did not make it faster: 0.946x at 8192 (slower in every round), "
         "0.999x at 14336. (Its first run also asked for `notrigger` on the held-weight "
         "kernels, which have no trigger; only the runs below it are in the file.)"),
        ("source_ab-ln4096-fp8-fmacenter", "",
         "The same at 4096, with the weights in shared memory as fp32 (`f`, 56 KB per CTA: "
         "3 CTAs per SM) and with `u` in place of the two row sums: 1.004x (within the spread "
         "of identical kernels), 0.853x, 0.924x. Not taken."),
        ("source_ab-ln4096-fp8-m6", "",
         "More warps per SM: LayerNorm FP8 at 4096 capped at 80 registers (`m6`: 6 CTAs per SM "
         "in place of 5; ptxas spills one register outside the row loop), with `fmacenter`, and "
         "with 4 stages: 0.943x, 0.955x, 0.905x."),
        ("source_ab-rms65536-fp8-w8t3", "",
         "RMSNorm FP8 at 65536 over 8 warps of 4 accesses with 3 stages (64 registers, 32 warps "
         "per SM against the entry's 16): 0.987x."),
        ("source_ab-fp8-cphints", "",
         "Round 21, the staged kernels' `cp.async` row copies: `cp256` asks L2 for 256 bytes "
         "(`.L2::256B` in place of `.L2::128B`), `cpnohint` for nothing; `stream` as above. "
         "RMSNorm FP8 at 65536 ran 1.048x with `cp256` (faster in every round) and 1.032x "
         "without the hint; LayerNorm FP8 at 4096 0.990x and 0.997x."),
        ("source_ab-fp8-cp256", "",
         "`cp256` on every staged FP8 forward: RMSNorm FP8 65536 1.046x (18 of 20 rounds), the "
         "others 0.988-0.997x. `TUNED` takes it for RMSNorm FP8 65536 (switch `L`, "
         "`STAGED_FETCH256`; docs/norms.md)."),
        ("source_ab-bf16-cp256", "",
         "`cp256` on the staged bf16 forwards: 0.988-1.000x. Not taken."),
        ("source_ab-ln4096-fp8-diag", "",
         "Round 22, a diagnostic (wrong results, timing only): LayerNorm FP8 at 4096 without "
         "the amax update (`noamax`, one FMNMX per element), without the scale multiply "
         "(`noscale`, one FMUL) and without both, 64 of the ~530 instructions a thread issues "
         "per row: 1.006x, 1.003x, 1.014x. The kernel is not bound by issuing instructions: "
         "an eighth fewer buys under 1.5%, so the points it lacks are not in the instruction "
         "count."),
        ("source_ab-ln4096-fp8-Wi", "",
         "Round 23, LayerNorm FP8 at 4096: `W` together with `i` (one exchange of the "
         "statistics per row, z a row later; 80 registers against 96, 6 CTAs per SM against "
         "5), with the weights held (`h`), in shared memory, and 4 stages deep: 0.974x, "
         "0.966x, 0.947x, slower in every round. Not taken; the switch pair stays available "
         "(docs/norms.md)."),
        ("source_ab-ln4096-fp8-evict", "",
         "Round 23: the staged kernels' row copies under an L2 evict-first policy "
         "(`cpevictfirst`) 0.878x; the dependent launch triggered as each CTA starts its last "
         "row (`latetrigger`) 0.991x."),
        ("source_ab-fp8-evict", "",
         "`cpevictfirst` on the staged LayerNorm FP8 forwards at 8192 and 14336: 0.866x and "
         "0.909x."),
        ("source_ab-ln4096-fp8-policy", "",
         "The row copies under the `evict_last` and `evict_normal` policies: 1.001x and 0.963x; "
         "the copies as the template makes them (no policy) are as fast as any."),
        ("source_ab-ln4096-fp8-stpolicy", "",
         "z's 8-byte stores under the `evict_first` and `evict_last` policies (`stevictfirst`, "
         "`stevictlast`): 0.995x and 1.001x; with the copies' `evict_last`, 0.995x."),
        ("source_ab-ln4096-fp8-tma", "",
         "Each row's refill issued after its first block barrier (`latefill`: the copy has "
         "less time to land) 0.980x; that and the stage filled by one bulk copy of the row "
         "(`tma`: `cp.async.bulk` issued by one thread, an mbarrier per stage) 0.935x. Both "
         "gave the base's results bit for bit (`same`)."),
        ("source_ab-fp8-earlyfill", "",
         "The refill issued before the wait for the row's own copies (`earlyfill`: each thread "
         "refills only its own slots, so it may) on the staged FP8 forwards with `i`: "
         "0.989-0.992x, slower in every case. With `latefill` above, the refill's place at "
         "the top of the row is the faster of the three."),
        ("source_ab-ln4096-fp8-v16", "",
         "16 elements per access (`v16`: 32-byte copies, 16-byte FP8 stores; 4 or 2 warps): "
         "0.751-0.870x."),
        ("source_ab-ln4096-fp8-regz", "",
         "Round 24, `z` (one-pass statistics about x[row, 0]) on the register layouts, whose "
         "threads read K from global memory: every one slower than the staged entry, and than "
         "the same layout without `z` where both were timed (docs/norms.md). Two `p` layouts "
         "of this run are left out: their kernel skipped the copy of the next row group "
         "(wrong results, found by the GPU test; the JSON lists them in `invalid_variants`)."),
        ("source_ab-ln4096-fp8-regz-p", "",
         "The `p` layouts again with the copy in place, beside the same layouts without `z`: "
         "0.907x and 0.918x against 0.935x and 0.936x."),
        ("source_ab-ln4096-fp8-warps", "",
         "Round 24, the entry's switches over 8, 16 and 2 warps per row in place of 4 "
         "(2, 1 and 8 accesses per thread; 40-96 registers, 10-48 warps per SM against the "
         "entry's 20): 0.62-0.85x."),
        ("source_ab-ln4096-fp8-dynrows", "",
         "Round 25 (base: `hogqit3`, its stages 32 bytes into the shared memory): rows handed "
         "out at run time from one ticket counter (`dynrows`; bench/source_ab.py's `DYN_*`), "
         "meant to take back the tail that bench/norm_cta_times.py showed (below), and the "
         "same with the layout of 4 stages: 0.841x and 0.823x."),
        ("source_ab-ln4096-fp8-dynshards", "",
         "The counter split into 8 and 32 (each for a shard of the rows and of the CTAs, "
         "128 bytes apart), in case one counter's atomics were the bottleneck: 0.884x and "
         "0.871x. These and the next run ended each CTA with a `__threadfence` (a "
         "`MEMBAR.SC.GPU`) before the count of CTAs done; the runs after it without."),
        ("source_ab-ln4096-fp8-dyndiag", "",
         "dynrows32 taken apart: its code with the static assignment's tickets and no atomic "
         "(`dynstatic32`) 0.843x, the same with the atomic taken and waited for "
         "(`dynatomic32`) 0.809x: the run-time assignment itself won back 4%, and the code "
         "around it lost 16%."),
        ("source_ab-ln4096-fp8-dynnofence", "",
         "Without the fence: the same order (`dynstatic32` 0.854x)."),
        ("source_ab-ln4096-fp8-dynstatic", "",
         "With one shard and static tickets (`dynstatic1`: the base's rows, in the base's "
         "order) 0.854x: not the order of the rows."),
        ("source_ab-ln4096-fp8-dynparts", "",
         "Only the loop over a ring of row groups that every thread works out (`dynloop1`) "
         "0.997x; with the tickets posted through shared memory and no count at the end "
         "(`dynstatic1r`) 0.856x. What the post added was 16 bytes of static shared memory "
         "(`dyn_box`), which moved the stages from 32 to 48 bytes into the CTA's shared "
         "memory."),
        ("source_ab-ln4096-fp8-smemoffset", "",
         "The reduction buffer 4, 8 or 24 floats longer (`red4`, `red8`, `red24`): the stages "
         "at 48, 64 and 128 bytes: 0.861x, 0.998x and 1.010x (every round). Round 25's switch "
         "`A` (`STAGED_ALIGNED`, docs/norms.md) starts the stages on a 128-byte boundary."),
        ("source_ab-align16", "",
         "With the template asking every staged kernel for a 128-byte boundary (as in "
         "norm_bandwidth-2026-12-04-align128 below), each staged forward against its stages on "
         "a 16-byte one (`align16`, where they were before): LayerNorm FP8 14336 ran 0.947x "
         "without the 128-byte boundary (its stages at 224), LayerNorm bf16 14336 1.060x (at "
         "224) and RMSNorm FP8 65536 1.016x (at 192) without it, the others within 0.8%. "
         "`TUNED` takes `A` at LayerNorm FP8 4096 and 14336 only."),
        ("source_ab-2026-12-05-stage-offsets", "",
         "Where the stages may start, LayerNorm FP8 4096 (base: the shipped `hogqiAt3`, its "
         "stages on a 128-byte boundary): without `A` (`@w4r1v8j4c1hogqit3`, at 32 bytes) "
         "0.987x; the reduction buffer 12, 16 or 20 floats longer without `A` (stages at 80, 96 "
         "and 112 bytes) 0.841x, 0.987x and 0.871x, slower than the base in every round; on a "
         "256- or 512-byte boundary (`align256`, `align512`) 1.000x and 1.001x. With round 25's "
         "48, 64 and 128 (0.861x, 0.998x, 1.010x against `hogqit3`): every start 16 bytes off "
         "a 32-byte boundary (48, 80, 112) loses 13-16%, every start on one (32, 64, 96) is "
         "within 1.5% of the 128-byte boundary, and boundaries beyond 128 bytes add nothing. "
         "The 16-byte cp.async copies of a 32-byte global sector land in two shared-memory "
         "sectors exactly where the start is 16 bytes off."),
    ]  # fmt: skip
    out: list[str] = []
    for name, flags, text in runs:
        d = load(name)
        if d is None:
            continue
        flags = flags or d.get("command", "").removeprefix("bench/source_ab.py ")
        if not out:
            out.append("### Source edits, paired (bench/source_ab.py)")
        rows = []
        invalid = set(d.get("invalid_variants", ()))
        for r in d["rows"]:
            if r["variant"] in invalid:
                continue
            versus = []
            for ref, field in (("base", "vs_base"), ("torch.compile", "vs_compile")):
                ratio = r.get(field)
                if ratio and r["variant"] != ref:
                    versus += [_ratio(ratio["median"]), f"{ratio['faster']:.2f}"]
                else:
                    versus += ["-", "-"]
            rows.append([r["norm"], r["hidden"], r["out"], f"`{r['variant']}`",
                         f"{r['ms'] * 1e3:.1f}", _pct(r["pct_of_copy"]), *versus])  # fmt: skip
        out += [
            text + " " + source(d, f"source_ab.py {flags}") + f" Device copy "
            f"{d['copy_gbps']:.0f} GB/s; {d['rounds']} paired rounds on rotating buffers; "
            "ratios are same-round medians (above 1: faster), 'won' the fraction of rounds.",
            md_table(["norm", "H", "output", "variant", "us", "% of copy", "x base", "won",
                      "x torch.compile", "won"], rows),
        ]  # fmt: skip
    return out


def _cta_times() -> list[str]:
    """bench/norm_cta_times.py runs: when the CTAs of a staged forward start, take their rows
    and end."""
    runs = [
        ("norm_cta_times-ln4096-fp8",
         "LayerNorm FP8 4096 as shipped before round 25 (`hogqit3`) with the probe (thread 0 of "
         "each CTA writes `%globaltimer` at its start, at each row and at its end): the probe "
         "itself took ptxas to 80 registers (6 CTAs per SM, not 5), so the grid here is 792 "
         "CTAs. The CTAs end between 41 and 55 us into the call, and an SM's CTAs do not share "
         "it evenly: the later a CTA's warps took their slots, the slower its rows."),
        ("norm_cta_times-2026-12-05-ln4096-fp8-A",
         "LayerNorm FP8 4096 as shipped since round 25 (`hogqiAt3`: the stages on a 128-byte "
         "boundary) with the probe, 792 CTAs (the probe's registers again): the first CTAs end "
         "41-42 us into the call, the last 53-56 us; rows of 2.02-2.05 us at the median, and "
         "the later a CTA took its SM slot the slower its rows (rank 0 1.91 us, rank 5 2.36 "
         "us). Within 1-2% of the probe without `A` above, sample by sample: with the probe "
         "(6 CTAs per SM) the stage offset shows no more than the spread between samples. The "
         "first run of the script's DeviceArray readback on a GPU (`--samples 3`, written as "
         "norm_cta_times.json by default and renamed here)."),
        ("norm_cta_times-ln4096-fp8-dynrows32",
         "The same with rows handed out at run time (`dynrows32`, its first form, with the "
         "fence; 5 CTAs per SM): the CTAs take 19-32 rows, and end later than the base's last "
         "(bench/source_ab.py above: the 16 bytes of shared memory the edit added)."),
    ]  # fmt: skip
    out: list[str] = []
    for name, text in runs:
        d = load(name)
        if d is None:
            continue
        if not out:
            out.append("### Where the CTAs' time goes (bench/norm_cta_times.py)")
        case = d["cases"][0]
        rows = [[s["grid"], f"{s['span_us']:.1f}", f"{s['end_min_us']:.1f}",
                 f"{s['end_median_us']:.1f}", f"{s['end_max_us']:.1f}",
                 f"{s['row_us_median']:.2f}", f"{s['row_us_cta_min']:.2f}",
                 f"{s['row_us_cta_max']:.2f}", f"{s['rows_min']}-{s['rows_max']}",
                 f"{s['sm_rows_per_us_min']:.2f}-{s['sm_rows_per_us_max']:.2f}"]
                for s in case["samples"]]  # fmt: skip
        ranks = [[r["rank"], f"{r['row_us_mean']:.2f}", f"{r['rows_mean']:.1f}",
                  f"{r['end_us_mean']:.1f}"] for r in case["samples"][0]["by_rank"]]  # fmt: skip
        edits = "+".join(case.get("edits") or [])
        out += [
            text + " " + source(d, "norm_cta_times.py" + (f" --edits {edits}" if edits else ""))
            + f" `{case['kernel']}`; one call per sample after 20 back-to-back calls; "
            "microseconds from the first CTA's start; a row's time is the gap between a CTA's "
            "row tops (its median over the CTA's rows; the columns give the median over all "
            "and the CTAs' lowest and highest).",
            md_table(["CTAs", "span", "first end", "median end", "last end", "row",
                      "CTA row, min", "CTA row, max", "rows a CTA", "SM rows/us"], rows),
            "The first sample by each CTA's rank on its SM (ordered by its first warp's slot):",
            md_table(["rank", "row us (mean)", "rows (mean)", "end us (mean)"], ranks),
        ]  # fmt: skip
    return out


def _vs_cast() -> list[str]:
    """norm_vs_cast-2026-12-04.json: the FP8 forwards beside a cast of the same x."""
    d = load("norm_vs_cast-2026-12-04")
    if d is None:
        return []
    rows = []
    for r in d["rows"]:
        v = r.get("vs_cast")
        rows.append([r["shape"], r["impl"], f"{r['ms'] * 1e3:.1f}",
                     f"{_pct(r['pct_of_copy'])} ({r['pct_low']:.1f}-{r['pct_high']:.1f})",
                     f"{v['median']:.3f}x ({v['faster']:.2f})" if v else "-"])  # fmt: skip
    at = {r["impl"]: r for r in d["rows"] if r["shape"] == "16384x4096"}
    cast, ln = at["cast"]["pct_of_copy"], at["layernorm"]
    return [
        "### Beside a cast of the same bytes",
        "What a bf16 -> E4M3 pass costs with nothing else to do: the FP8 forwards beside "
        "nvrtc_engine's `cast` of the same x (tensor scaling: x read, z written, the amax; the "
        "forwards' bytes less the weights and mu and rsigma), a copy of the LayerNorm's "
        "bytes and the 1 GiB copy, all in the same rounds (% of the 1 GiB copy, median and "
        "range over the rounds; the norm's speed over the cast's, same-round median, and the "
        "fraction of rounds the norm was faster). "
        + source(d, "norm_vs_cast.py")
        + f" At 16384 x 4096 the cast itself reaches {_pct(cast)} of copy and the same-bytes "
        f"copy {_pct(at['same-bytes copy']['pct_of_copy'])}: 90% asks LayerNorm FP8 for "
        f"{90 / cast:.1%} of the cast's speed, and it ran at {ln['vs_cast']['median']:.1%} "
        f"({_pct(ln['pct_of_copy'])} of copy).",
        md_table(
            ["N x H", "kernel", "us", "% of copy, paired (range)", "x the cast's speed (won)"], rows
        ),
        *_ncu_vs_cast(),
    ]


NCU_VS_CAST = "ncu-norm-vs-cast-2026-12-04.csv"


def _ncu_vs_cast() -> list[str]:
    """logs/NCU_VS_CAST: Nsight Compute's counters for one cold launch of each FP8 forward at
    16384 x 4096 and of a cast of the same x (bench/profile_norm_forwards.py --cast)."""
    path = RESULTS / "logs" / NCU_VS_CAST
    if not path.exists():
        return []
    metrics: dict[str, dict[str, float]] = {}
    header: list[str] | None = None
    for row in csv.reader(path.read_text().splitlines()):
        if row[:1] == ["ID"]:
            header = row
        elif header is not None and len(row) == len(header):
            r = dict(zip(header, row, strict=True))
            name = r["Kernel Name"].split("_")[0]
            value = float(r["Metric Value"].replace(",", ""))
            metrics.setdefault(name, {}).setdefault(r["Metric Name"], value)  # the first launch
    rows = [[name, f"{m['dram__bytes_read.sum'] / 1e6:.1f}",
             f"{m['dram__bytes_write.sum'] / 1e6:.1f}", f"{m['gpu__time_duration.sum'] / 1e3:.1f}",
             f"{m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.1f}",
             f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.1f}",
             f"{m['smsp__issue_active.avg.pct_of_peak_sustained_active']:.1f}"]
            for name, m in metrics.items()]  # fmt: skip
    return [
        "Hardware counters of one cold launch each at 16384 x 4096 (the first cast's, where the "
        "run launched two), NVIDIA H200, 2026-12-04: `ncu --clock-control none -k "
        "regex:'layernorm_fwd|rmsnorm_fwd|cast' --metrics ... python "
        "bench/profile_norm_forwards.py --cases layernorm:4096:fp8:16384,rmsnorm:4096:fp8:16384 "
        f"--cast`; data: `bench/results/logs/{NCU_VS_CAST}`. Each reads x from DRAM once and "
        "writes about the same bytes (z is 67.1 MB; the rest is still in L2 at the end), so the "
        "norms repeat no traffic. The SMs differ: LayerNorm keeps fewer warps busy and issues "
        "on twice the cycles. Cold single launches do not rank the kernels as the paired "
        "rounds above do.",
        md_table(
            [
                "kernel",
                "DRAM read MB",
                "DRAM write MB",
                "us",
                "DRAM busy %",
                "warps active %",
                "issue active %",
            ],
            rows,
        ),
    ]


def _fixed_cost() -> list[str]:
    """norm_fixed_cost.json (ordinary launches): each missed forward's fixed cost per call
    and marginal bandwidth beside a copy of the same bytes."""
    f = load("norm_fixed_cost")
    if f is None:
        return []
    copy = f["copy_gbps"]
    rows = []
    for c, summary in zip(f["cases"], f["summary"], strict=True):
        rows.append([summary["case"], f"`{c['kernel'].rsplit('_', 1)[-1]}`",
                     f"{summary['us']:.1f}", _pct(summary["pct"]), _pct(summary["copy_pct"]),
                     _pct(summary["same"]), f"{c['kernel_fixed_us']:.1f}",
                     _pct(100 * c["kernel_marginal_gbps"] / copy),
                     f"{c['copy_fixed_us']:.1f}",
                     _pct(100 * c["copy_marginal_gbps"] / copy)])  # fmt: skip
    return [
        "### Fixed cost per call",
        "Where the forwards that missed 90% of copy lose it: each timed at four row counts "
        "beside a device copy of the same bytes (paired rounds, every call on its own "
        "buffers), and a line fitted through (bytes, time) for each: "
        + source(f, "norm_fixed_cost.py")
        + f" Device copy (1 GiB) {copy:.0f} GB/s; ordinary launches (before the dependent "
        "launches below). At 4096 and 8192 the kernels' marginal rate is 96-103% of the "
        "(1 GiB) copy's bandwidth, but they pay 4.7-10.2 us per call where the copy pays "
        "2.9-4.1, and a copy of the same bytes itself reaches only 92.8-94.6% of the 1 GiB "
        "copy at 4096 (95.9-98.2% at 8192): the shortfall there is the fixed cost. LayerNorm "
        "FP8 at 65536 is bound inside the row instead (87.0% at the margin; under ncu, "
        "`logs/ncu-gaps-2026-12-02.csv`: 73% of issue slots busy, DRAM at 70.6%).",
        md_table(["case (issue's shape)", "configuration", "us", "% of copy",
                  "same-bytes copy, % of copy", "% of same-bytes copy", "fixed us",
                  "marginal, % of copy", "copy fixed us", "copy marginal"], rows),
    ]  # fmt: skip


# bench/norm_fixed_cost.py runs with both launch kinds, and what the report says before each.
FIXED_COST_RUNS = {
    "norm_fixed_cost-pdl": "The norm forwards, each launched both ways in the same rounds: ",
    "norm_fixed_cost-2026-12-04-check": "The same with the kernels of the table above, one "
    "round of two samples (a check that the script still ran after its setup moved into "
    "norm_bandwidth.py; rough figures). ",
}


def _same_bytes_need(runs: dict[str, Any], case: str = "layernorm_fwd fp8 16384x4096") -> str:
    """For ``case`` of a bench/norm_fixed_cost.py run: its fixed cost and marginal rate beside
    the copy's, and what 90% of the 1 GiB copy asks of it against a copy of the same bytes."""
    for c, summary in zip(runs["cases"], runs["summary"], strict=True):
        if summary["case"] != case:
            continue
        rows = int(case.rsplit(" ", 1)[1].split("x")[0])
        size = next((z for z in c["sizes"] if z["rows"] == rows), None)
        if size is None:
            return ""
        same = 100 * size["copy_gbps"] / runs["copy_gbps"]
        return (f"{case} pays {c['kernel_fixed_us']:.1f} us per call against the copy's "
                f"{c['copy_fixed_us']:.1f} and runs at "
                f"{100 * c['kernel_marginal_gbps'] / c['copy_marginal_gbps']:.1f}% of the "
                f"copy's marginal rate; a copy of its {size['bytes'] / 1e6:.0f} MB reaches "
                f"{same:.1f}% of the 1 GiB copy, so 90% of copy asks for "
                f"{100 * 90 / same:.1f}% of a same-bytes copy. ")  # fmt: skip
    return ""


def _dependent_launch() -> list[str]:
    """pdl_probe.json and norm_fixed_cost-pdl.json: what a programmatic dependent launch
    saves, on a copy kernel and on the norm forwards (paired against ordinary launches)."""
    probe, runs = load("pdl_probe"), load("norm_fixed_cost-pdl")
    out: list[str] = []
    if probe is not None:
        prows = [[r["grid"], r["mode"], f"{r['us']:.2f}", f"{r['saved_us']:.2f}",
                  f"{r['vs_plain']:.3f}", _pct(r["pct_of_copy"])]
                 for r in probe["rows"]]  # fmt: skip
        out += [
            "### Programmatic dependent launches",
            "A copy kernel launched back to back, ordinarily and as a programmatic dependent "
            "launch (`griddepcontrol.wait` first; with `launch_dependents` after it too): "
            + source(probe, "pdl_probe.py")
            + f" {probe['mib']} MiB per call, {probe['rounds']} paired rounds.",
            md_table(["grid", "mode", "us", "saved us", "x plain", "% of copy"], prows),
        ]
    for name, lead in FIXED_COST_RUNS.items():
        runs = load(name)
        if runs is None or not any("ordinary_ms" in s for c in runs["cases"] for s in c["sizes"]):
            continue
        copy = runs["copy_gbps"]
        rows = []
        for c, summary in zip(runs["cases"], runs["summary"], strict=True):
            rows.append([summary["case"], f"`{c['kernel'].rsplit('_', 1)[-1]}`",
                         _pct(summary.get("o_pct")), _pct(summary["pct"]),
                         _ratio(summary.get("speedup")),
                         f"{c.get('ordinary_fixed_us', float('nan')):.1f}",
                         f"{c['kernel_fixed_us']:.1f}",
                         _pct(100 * c["kernel_marginal_gbps"] / copy)])  # fmt: skip
        out += [
            lead
            + (_same_bytes_need(runs) if name != "norm_fixed_cost-pdl" else "")
            + source(runs, runs.get("command", "").removeprefix("bench/")
                     or f"norm_fixed_cost.py --name {name}")
            + f" Device copy {copy:.0f} GB/s.",
            md_table(["case (issue's shape)", "configuration", "ordinary, % of copy",
                      "dependent, % of copy", "x ordinary", "fixed us, ordinary",
                      "fixed us, dependent", "marginal, % of copy"], rows),
        ]  # fmt: skip
    return out


def _rerun(d: dict[str, Any]) -> list[str]:
    """The same command on a later lease with the same kernels (norm_bandwidth-2026-12-02b),
    the specialized rows beside the run ``d``."""
    r = load("norm_bandwidth-2026-12-02b")
    if r is None or r["date"] <= d["date"]:
        return []
    before = {(q["norm"], q["case"], q["hidden"], q["impl"]): q for q in d["rows"]}
    rows, missed = [], [0, 0]
    for q in r["rows"]:
        if q["impl"] != "nvrtc_engine specialized" or q.get("ms") is None or q["hidden"] < 4096:
            continue
        old = before.get((q["norm"], q["case"], q["hidden"], q["impl"]))
        target = 75.0 if q["case"] == "bwd" else 90.0
        for i, run in enumerate((old, q)):
            missed[i] += bool(run and run["pct_of_copy"] < target)
        rows.append([q["norm"], q["case"], q["hidden"], f"`{q['kernel'].rsplit('_', 1)[-1]}`",
                     _pct(old["pct_of_copy"]) if old else "-", _pct(q["pct_of_copy"]),
                     f"{target:.0f}%"])  # fmt: skip
    return [
        "The same command on a later lease, the kernels unchanged: "
        + source(r, "norm_bandwidth.py --repeat=50 --name norm_bandwidth-2026-12-02b")
        + f" Device copy {r['copy_gbps']:.0f} GB/s. Rows at H >= 4096 below their target: "
        f"{missed[0]} in the run above, {missed[1]} in this one; a row near its target passes "
        "or fails by the lease.",
        md_table(["norm", "case", "H", "configuration", "run above", "this run", "target"], rows),
    ]


def _method() -> list[str]:
    """norm_method.json: the forwards under the sweeps' and the bandwidth run's conditions."""
    m = load("norm_method")
    if m is None:
        return []
    rows = [[r["op"], r["hidden"], r["out"], r["data"], r["state"], _pct(r["pct_of_copy"]),
             f"{r['vs_randn_idle']:.3f}"] for r in m["rows"]]  # fmt: skip
    return [
        "Why a sweep can read a kernel a few points higher than a bandwidth run (LayerNorm FP8 "
        "at 8192: 91.6-93.2% in four sweeps; 89.3% and 88.3% in the two bandwidth runs just "
        "before this check on 2026-12-02, the first since overwritten by a later run of its "
        "name, the second norm_bandwidth-2026-12-02b.json; 91.2% in an earlier one, "
        "norm_bandwidth-mend.json): the inputs (the sweeps "
        "add a random offset per row) and the GPU's state before a sample (idle for 0.3 s, or "
        "0.1 s of back-to-back calls first) were each timed in paired rounds: "
        + source(m, "norm_method.py")
        + f" {m['rounds']} rounds of {m['repeat']} samples. "
        "The inputs move no kernel by more than 0.5%. The busy state is the slower one: "
        "LayerNorm FP8 1.6-1.8% at 8192 and 0.7-0.9% at 4096, the others within 0.7%. On the same"
        " lease the caps sweep (candidate sweeps, below; 5 samples a case) read LayerNorm FP8"
        " at 8192 at 91.3%, this check 90.2% idle and 88.8% busy, and the rerun of "
        "norm_bandwidth.py right after (50 samples, timed just after the bf16 case) 88.3%: "
        "the longer and more sustained the timing, the lower the reading of the issue-bound "
        "FP8 LayerNorm. The sweeps' short bursts read it 1-3 points above a sustained run, "
        "and leases differ by 1-5 points besides; the targets are judged on the bandwidth "
        "runs.",
        md_table(["op", "H", "z", "x", "GPU before", "% of copy", "speed vs randn, idle"], rows),
    ]


def _held_rerun(d: dict[str, Any]) -> list[str]:
    """LayerNorm at 4096 and 65536 again after round 10's held-weight entries
    (norm_bandwidth-sregs.json) and the rows round 13 changed (norm_bandwidth-reread.json),
    each beside the full run ``d``, when newer than it."""
    return _partial_rerun(
        d,
        "norm_bandwidth-sregs",
        "norm_bandwidth.py --norms layernorm --shapes 16384x4096,2048x65536 --repeat=50 "
        "--name norm_bandwidth-sregs",
        "LayerNorm again after round 10's last entries (the staged forward with its weights "
        "held in registers at 4096 FP8 and at 65536 bf16 and FP8; docs/norms.md), on the "
        "lease after the run above: ",
    ) + _partial_rerun(
        d,
        "norm_bandwidth-reread",
        "norm_bandwidth.py --repeat=50 --shapes winners --tuned-from "
        "bench/results/norm_tuning-reread.json --name norm_bandwidth-reread",
        "The shapes whose `TUNED` entries round 13 changed (`y`: x read again from its "
        "stage in each pass; docs/norms.md), after the runs above: ",
    )


def _partial_rerun(d: dict[str, Any], name: str, command: str, lead: str) -> list[str]:
    """The specialized rows of a partial norm_bandwidth run ``name`` beside the full run
    ``d`` (with the kernel's tag and its speed against torch.compile), when newer than it."""
    r = load(name)
    if r is None or r["date"] <= d["date"]:
        return []
    before = {(q["norm"], q["case"], q["tokens"], q["hidden"], q["impl"]): q for q in d["rows"]}
    rows = []
    for q in r["rows"]:
        if q["impl"] != "nvrtc_engine specialized" or q.get("ms") is None:
            continue
        old = before.get((q["norm"], q["case"], q["tokens"], q["hidden"], q["impl"]))
        compiled = next((c for c in r["rows"] if c["impl"] == "torch.compile" and
                         (c["norm"], c["case"], c["hidden"]) ==
                         (q["norm"], q["case"], q["hidden"])), None)  # fmt: skip
        rows.append([q["norm"], q["case"], f"{q['tokens']}x{q['hidden']}",
                     f"`{q['kernel'].rsplit('_', 1)[-1]}`", _pct(q["pct_of_copy"]),
                     _pct(old["pct_of_copy"]) if old else "-",
                     f"{compiled['ms'] / q['ms']:.2f}x" if compiled and compiled.get("ms")
                     else "-"])  # fmt: skip
    header = ["norm", "case", "N x H", "configuration", "% of copy", "in the run above",
              "vs torch.compile"]  # fmt: skip
    return [
        lead + source(r, command) + f" Device copy {r['copy_gbps']:.0f} GB/s; the "
        "configuration is the kernel's tag.",
        md_table(header, rows),
    ]


def _compile_recheck(d: dict[str, Any]) -> list[str]:
    """The torch.compile recheck (norm_bandwidth-compile-recheck.json), when newer than ``d``:
    runs up to 2026-12-02 reused one function's code over every shape, so past dynamo's
    recompile limit (8) the last shapes' torch.compile rows ran eagerly."""
    r = load("norm_bandwidth-compile-recheck")
    if r is None or r["date"] <= d["date"]:
        return []
    by = {(q["norm"], q["case"], q["tokens"], q["hidden"], q["impl"]): q for q in r["rows"]}
    rows = []
    for (norm, case, n, h, impl), q in sorted(by.items()):
        if impl != "torch.compile" or q.get("ms") is None:
            continue
        ours = by.get((norm, case, n, h, "nvrtc_engine specialized"))
        if ours is None or ours.get("ms") is None:
            continue
        rows.append([norm, case, f"{n}x{h}", _pct(ours["pct_of_copy"]), _pct(q["pct_of_copy"]),
                     f"{q['ms'] / ours['ms']:.2f}x"])  # fmt: skip
    shapes = ", ".join(sorted({f"{q['tokens']}x{q['hidden']}" for q in r["rows"]}))
    return [
        "In the run above torch.compile's rows for the last shapes ran eagerly: the benchmark "
        "compiled the same function for every shape, and past dynamo's recompile limit (8) "
        "dynamo falls back to eager (its log says so; RMSNorm forward at 14336 and 65536). "
        f"It now compiles each shape afresh (`common.fresh_compile`). The recheck of {shapes} "
        "with the fix, both implementations in the same run:",
        source(r, f"norm_bandwidth.py --norms rmsnorm --shapes {shapes.replace(', ', ',')} "
                  "--name norm_bandwidth-compile-recheck"),
        md_table(["norm", "case", "N x H", "nvrtc_engine specialized", "torch.compile",
                  "x torch.compile"], rows),
    ]  # fmt: skip


def _later_fp8(d: dict[str, Any]) -> str:
    """A pointer to the FP8 forward sweep when it is newer than this norm run."""
    fp8 = load("norm_tuning-fp8")
    if fp8 is None or fp8["date"] <= d["date"]:
        return ""
    return (f" The FP8 forward rows at H = 4096-14336 predate the `TUNED` entries of "
            f"{fp8['date'][:10]}: their figures are under \"Candidate sweeps\" below.")  # fmt: skip


def cast_section() -> str | None:
    d = load("cast_bandwidth")
    if d is None:
        return None
    rows = [
        [
            r["shape"],
            r["case"],
            r["impl"],
            f"{r['ms'] * 1e3:.0f}",
            f"{r['gbps']:.0f}",
            _pct(r.get("pct_of_copy")),
        ]
        for r in d["kernels"]
        if r.get("ms") is not None
    ]
    compiled = any(r["impl"] == "torch.compile" for r in d["kernels"])
    speedups = {(r["shape"], r["case"]): r.get("x_vs_compile")
                for r in d["kernels"] if r["impl"] == "nvrtc_engine"}  # fmt: skip
    for row in rows:
        x = speedups.get((row[0], row[1])) if row[2] == "nvrtc_engine" else None
        row.append(_ratio(x))
    return "\n\n".join(
        [
            "## Cast / transpose family",
            source(d, "cast_bandwidth.py" if compiled else "cast_bandwidth.py --no-compile"),
            f"bf16 input; device copy **{d['copy_gbps']:.0f} GB/s**"
            + ("" if compiled else "; torch.compile not measured in this run (device time)")
            + ". Targets (issue 5): cast >= 90%, cast-transpose >= 85%, MXFP8 both >= 80% of "
            "copy; at least 2x torch.compile where torch.compile re-reads the input (its "
            "kernels read x more than once: the amax and the cast, or the transpose, are "
            "separate passes)." + _under_two(d),
            md_table(
                ["shape", "case", "implementation", "us", "GB/s", "% of copy", "x torch.compile"],
                rows,
            ),
            *_cast_paired(),
        ]
    )


def _cast_paired() -> list[str]:
    """The paired rerun (cast_bandwidth-paired.json): ours against torch.compile in shuffled
    rounds, the ratio per round."""
    d = load("cast_bandwidth-paired")
    if d is None:
        return []
    rows = []
    for r in d["kernels"]:
        times = r.get("paired_ms")
        if r["impl"] != "nvrtc_engine" or not times:
            continue
        ratios = [c / o for o, c in zip(times["ours"], times["compile"], strict=True)]
        rows.append([r["shape"], r["case"], f"{statistics.median(times['ours']) * 1e3:.0f}",
                     f"{statistics.median(times['compile']) * 1e3:.0f}",
                     _ratio(r.get("x_vs_compile")), f"{r['x_vs_compile_paired']:.3f}x",
                     f"{min(ratios):.3f}-{max(ratios):.3f}",
                     f"{sum(x >= 2 for x in ratios)} of {len(ratios)}"])  # fmt: skip
    shapes = ",".join(f"{m}x{k}" for m, k in d["shapes"])
    rereads = {r["case"] for r in d["kernels"]  # torch.compile at most 60%: it re-reads x
               if r["impl"] == "torch.compile" and (r.get("pct_of_copy") or 100) <= 60}  # fmt: skip
    under = [f"{r['case']} {r['x_vs_compile']:.2f}x" for r in d["kernels"]
             if r.get("paired_ms") and r.get("x_vs_compile") is not None
             and r["x_vs_compile"] < 2 and r["case"] in rereads]  # fmt: skip
    return [
        "Ours against torch.compile in paired rounds: the same script again, each case's two "
        f"implementations timed in {d['paired_rounds']} shuffled rounds (`common.paired_ms`: "
        "both in every round, so a drift of the GPU's speed between minutes lands on both); "
        "the ratio is torch.compile's time over ours in the same round, its median the figure "
        "the 2x target is read from (the table above sets two medians taken minutes apart "
        "against each other).",
        source(d, f"cast_bandwidth.py --shapes {shapes} --paired {d['paired_rounds']} "
                  "--name cast_bandwidth-paired"),
        f"Device copy **{d['copy_gbps']:.0f} GB/s** in that run; us: medians over the rounds; "
        "x, single run: the same run's plain timing first (each implementation's median of 20 "
        "samples, taken one after the other, as in the table above)"
        + (f", under 2x there for {', '.join(under)}" if under else "")
        + "; x, paired median: the median over rounds of the same-round ratio.",
        md_table(["shape", "case", "ours us", "torch.compile us", "x, single run",
                  "x, paired median", "rounds (low-high)", "rounds >= 2x"], rows),
    ]  # fmt: skip


def _under_two(d: dict[str, Any]) -> str:
    """The engine's cases under 2x torch.compile where torch.compile re-reads the input.

    A kernel that reads 16-bit x twice moves at least 5/3 of the bytes counted for a cast to
    8 bits (2 read + 1 written), so it cannot pass 60% of copy: above that, torch.compile
    made one pass and the 2x target does not apply."""
    compiled = {(r["shape"], r["case"]): r.get("pct_of_copy") for r in d["kernels"]
                if r["impl"] == "torch.compile"}  # fmt: skip
    under = [f"{r['case']} at {r['shape']} ({_ratio(r['x_vs_compile'])})" for r in d["kernels"]
             if r["impl"] == "nvrtc_engine" and r.get("x_vs_compile") is not None
             and r["x_vs_compile"] < 2
             and (compiled.get((r["shape"], r["case"])) or 100) <= 60]  # fmt: skip
    if not under:
        return " Every case where torch.compile re-reads x is at least 2x."
    paired = load("cast_bandwidth-paired")
    again = ""
    if paired is not None:
        named = [u.split(" (")[0] for u in under]
        medians = [f"{r['case']} at {r['shape']} {r['x_vs_compile_paired']:.3f}x"
                   for r in paired["kernels"] if r.get("x_vs_compile_paired") is not None
                   and f"{r['case']} at {r['shape']}" in named]  # fmt: skip
        if medians:
            again = (" In the paired rerun below (the two timed round by round), the median "
                     "ratios: " + "; ".join(medians) + ".")  # fmt: skip
    return (
        " Under 2x where torch.compile re-reads x (its figure at most 60% of copy, the "
        "cap a second read of 16-bit x puts on a cast to 8 bits) in this run: "
        + "; ".join(under)
        + "."
        + again
    )


def prewarm_section() -> str | None:
    files = sorted(RESULTS.glob("prewarm-*.json"))
    if not files:
        return None
    parts = ["## Prewarm"]
    for f in files:
        d = json.loads(f.read_text())
        rows = [[f"cold, {c['workers_requested']} workers", f"{c['wall_s'] * 1e3:.0f}",
                 "-" if c.get("median_compile_ms") is None else f"{c['median_compile_ms']:.1f}"]
                for c in d["cold"]]  # fmt: skip
        w = d["warm"]
        rows.append(["warm: fresh process, all kernels ready", f"{w['ready_ms']:.0f}", "-"])
        if "ready_after_nvrtc_load_ms" in w:
            rows.append(["warm, NVRTC loaded first: all kernels ready",
                         f"{w['ready_after_nvrtc_load_ms']:.0f}", "-"])  # fmt: skip
        rows.append(["warm: NVRTC bindings + library load (timed apart)",
                     f"{w['nvrtc_load_ms']:.0f}", "-"])  # fmt: skip
        rows.append(["warm: import nvrtc_engine (not included)", f"{w['import_ms']:.0f}", "-"])
        count = len(d["variants"]) if isinstance(d["variants"], list) else d["variants"]
        before = (
            "" if d.get("key_index") else " Measured before the key index ([cache.md](cache.md))."
        )
        parts += [
            f"`python bench/prewarm.py` on {d['cpus']} CPUs, NVRTC {d['nvrtc']}, "
            f"{count} variants, {d['date'][:10]}; data: `bench/results/{f.name}`. "
            f"Targets (issue 6): cold <= {d['targets']['cold_s']} s, warm <= "
            f"{d['targets']['warm_ready_ms']:.0f} ms.{before}",
            md_table(["run", "ms", "median compile ms"], rows),
        ]
    return "\n\n".join(parts)


def fanout_section() -> str | None:
    d = load("fanout")
    if d is None:
        return None
    rows = [
        ["variants", f"{d['variants']} ({'+'.join(d['ops'])}, 3 input x 5 output dtypes, "
         f"{len(d['hidden_sizes']) + 1} hidden sizes, {d['arch']})"],
        [f"nvcc {d['nvcc_version']}, one translation unit", f"{d['nvcc_wall_s']:.1f} s"],
        ["NVRTC, variant by variant", f"{d['nvrtc_total_s']:.1f} s"],
        ["cubin bytes, all variants (nvcc / NVRTC)",
         f"{d['nvcc_cubin_bytes']} / {d['nvrtc_cubin_bytes']}"],
        [f"one model's variants ({len(d['model'])})", f"{d['model_nvrtc_s'] * 1e3:.0f} ms, "
         f"{d['model_cubin_bytes']} bytes"],
        ["model's compile time / nvcc fan-out", f"{d['model_pct_of_nvcc']:.2f}% (target <= 1%)"],
        ["this project's wheel", f"{d['wheel_bytes']} bytes"],
    ]  # fmt: skip
    return "\n\n".join(
        [
            "## The fan-out it replaces",
            source(d, "fanout.py"),
            f"Model: {', '.join(d['model'])}.",
            md_table(["measure", "value"], rows),
        ]
    )


def bandwidth_plot() -> str | None:
    """docs/img/bandwidth.png: each family's kernels beside copy and the PyTorch baselines
    (eager and, where the run measured it, torch.compile)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    # label, engine % of copy, eager %, torch.compile %
    bars: list[tuple[str, float, float | None, float | None]] = []

    def pct(gbps: float | None, copy: float) -> float | None:
        return None if gbps is None else 100 * gbps / copy

    act = load("activation_bandwidth")
    if act:
        copy = act["copy_gbps"]
        for r in act["rows"]:
            if r["op"] in ("gelu", "swiglu", "dgelu", "dswiglu"):
                bars.append(
                    (
                        f"{r['op']} {r['output']}",
                        100 * r["engine_gbps"] / copy,
                        pct(r.get("eager_gbps"), copy),
                        pct(r.get("compile_gbps"), copy),
                    )
                )
    norm = load(NORM_TABLE_RUN)
    if norm:
        for r in norm["rows"]:
            if r["hidden"] == 8192 and r["impl"] == "nvrtc_engine specialized":
                same = {
                    q["impl"]: q["pct_of_copy"]
                    for q in norm["rows"]
                    if (q["norm"], q["case"], q["hidden"]) == (r["norm"], r["case"], 8192)
                }
                bars.append(
                    (
                        f"{r['norm']} {r['case']} H=8192",
                        r["pct_of_copy"],
                        same.get("torch eager"),
                        same.get("torch.compile"),
                    )
                )
    cast = load("cast_bandwidth")
    if cast:
        for r in cast["kernels"]:
            if r["shape"] == "16384x8192" and r["impl"] == "nvrtc_engine":
                same = {
                    q["impl"]: q["pct_of_copy"]
                    for q in cast["kernels"]
                    if (q["shape"], q["case"]) == (r["shape"], r["case"])
                }
                bars.append(
                    (
                        r["case"],
                        r["pct_of_copy"],
                        same.get("torch eager"),
                        same.get("torch.compile"),
                    )
                )
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(bars) + 1.5))
    y = range(len(bars))
    ax.barh([i - 0.27 for i in y], [b[1] for b in bars], height=0.27, label="nvrtc_engine")
    ax.barh(
        [i for i in y],
        [b[3] or 0 for b in bars],
        height=0.27,
        label="torch.compile (0: not measured)",
    )
    ax.barh([i + 0.27 for i in y], [b[2] or 0 for b in bars], height=0.27, label="torch eager")
    ax.axvline(100, color="black", linestyle="--", label="device copy")
    ax.set_yticks(list(y), [b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% of device copy bandwidth (H200)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = ROOT / "docs" / "img" / "bandwidth.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=110)
    return "![bandwidth per family](img/bandwidth.png)"


def timing_section() -> str:
    return "\n\n".join([
        "## How kernels are timed",
        "Every GPU figure comes from `bench/common.py`'s `cuda_time_ms`: CUDA events around "
        "10 back-to-back calls, divided by 10, median of 20 such samples (50 in the norm "
        "bandwidth runs, `--repeat=50`) after 5 warm-up calls "
        "(the cast and activation runs marked rejected-flat-ab warmed up for 30 ms more, a "
        "change tried for them and then undone); "
        "the copy bandwidth is a torch `copy_` of 1 GiB timed the same way (bytes read + "
        "written). Until 2026-11-29 each sample was a single call between two events, which "
        "read a 0.13 ms kernel 5-15% slower than the batched figure for the same code; the "
        "results in this report are all from the batched method unless a section says "
        "otherwise.",
        "To run a script: `python` in these sections is a Python with this package and "
        "PyTorch, e.g. the quick start's environment with the torch extra "
        "(`.venv/bin/pip install -e '.[test,torch]'`, then `.venv/bin/python bench/NAME.py`); "
        "`bench/make_report.py`, which writes this page from the results, needs matplotlib "
        "instead (the bench extra, `.[bench]`). "
        "On a GPU machine without network, `. bench/wheels.sh` installs the wheels carried in "
        "`.whl/` (diskcache, platformdirs) and sets `PYTHONPATH` for its own python3. Each "
        "script's `--help` gives its options; results go to `bench/results/NAME.json` (and "
        "`$OUT` where set).",
    ])  # fmt: skip


def profile_section() -> str | None:
    d = load("profile_kernels")
    if d is None:
        return None
    rows = []
    for name, m in d["kernels"].items():
        rows.append([f"`{name}`", m.get("DRAM Throughput", "-"),
                     m.get("Compute (SM) Throughput", "-"), m.get("Registers Per Thread", "-"),
                     m.get("Achieved Occupancy", "-"),
                     m.get("Local Memory Spilling Requests", "-")])  # fmt: skip
    return "\n\n".join([
        "## Hardware counters of the slow kernels",
        f"`{d['tool']}`; data: `bench/results/profile_kernels.json` ({d['date']}, {d['gpu']}; "
        "the kernels as they were before the tile shapes and norm layouts above changed).",
        md_table(["kernel", "DRAM", "SM", "registers", "occupancy", "local spills"], rows),
        "Reading: the MXFP8 activation and NVFP4 kernels and the FP8 norm forward are bound by "
        "instruction issue (SM throughput 75-90%, DRAM 37-58%); the norm backward spilled "
        "registers at the 128-register cap of its 512-thread CTAs (fixed since: the register "
        "estimate now keeps such layouts out); cast_transpose_dbias ran at 12.5% occupancy "
        "(255 registers).",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=OUT, help="default: %(default)s")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        print("make_report: needs matplotlib for the bandwidth plot: pip install -e '.[bench]'",
              file=sys.stderr)  # fmt: skip
        return 2
    builders = (bandwidth_plot, timing_section, gelu_section, activation_family_section,
                norm_section, cast_section, tuning_section, norm_tuning_section,
                cast_tuning_section, candidates_section, profile_section, compile_section,
                launch_section, prewarm_section, fanout_section)  # fmt: skip
    sections = [s for s in (b() for b in builders) if s]
    text = "\n\n".join(
        [
            "# Performance",
            "Generated by `python bench/make_report.py` from `bench/results/*.json`; every number "
            "below was measured by the script named in its section. GPU figures: NVIDIA H200 "
            "(sm_90, 132 SMs).",
            *sections,
        ]
    )
    args.output.write_text(text + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
