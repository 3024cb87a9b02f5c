"""Write docs/performance.md from the JSON files in bench/results/ (run after the benchmarks).

    python bench/make_report.py

Every figure in the report comes from a results file; a missing file leaves its section out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "performance.md"


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


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


def launch_section() -> str | None:
    d = load("launch_overhead")
    if d is None:
        return None
    rows = [[r["case"], f"{r['us']:.2f}"] for r in d["rows"]]
    return "\n\n".join(
        [
            "## Launch overhead",
            source(d, "launch_overhead.py"),
            "Host time per call for a GELU bf16 kernel on a (1, 1024) tensor, GPU not waited "
            "on (best of 5 x 5000 calls); `step:` rows time one piece of the launch path alone. "
            "Target: `Kernel.__call__` with torch tensors <= 5 us.",
            md_table(["call", "us"], rows),
        ]
    )


def tuning_section() -> str | None:
    d = load("activation_tuning")
    if d is None:
        return None
    best: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in d["rows"]:
        best.setdefault((r["fn"], r["out"]), []).append(r)
    rows = []
    for (fn, out), rs in sorted(best.items()):
        rs = sorted(rs, key=lambda r: -r["gbps"])
        chosen = next((r for r in rs if r.get("default")), None)
        capped = max((r for r in rs if r["blocks_per_sm"] != "one pass"), key=lambda r: r["gbps"])
        for tag, r in (("best", rs[0]), ("default", chosen), ("best capped grid", capped)):
            if r is not None:
                rows.append(
                    [
                        fn,
                        out,
                        tag,
                        r["threads"],
                        r["unroll"],
                        r["blocks_per_sm"],
                        f"{r['pct']:.1f}%",
                    ]
                )
    return "\n\n".join(
        [
            "## Activation launch configuration",
            source(d, "activation_tuning.py"),
            "Sweep of threads per block x 16-byte chunks per thread x grid (a single pass, or "
            "capped at N blocks per SM and looped), GELU and the identity function through the "
            "same template, bf16 input; % of the device copy bandwidth.",
            md_table(
                ["function", "output", "", "threads", "chunks/thread", "grid", "% of copy"], rows
            ),
        ]
    )


def compile_section() -> str | None:
    rows = []
    for tag in ("dev-2core", "h200-host"):
        d = load(f"compile_latency-{tag}")
        if d is None:
            continue
        rows.append(
            [
                tag,
                d["cpus"],
                d["nvrtc"],
                f"{d['first_compile_wall_ms']:.0f}",
                f"{d['cold_compile_nvrtc_median_ms']:.1f}",
                f"{d['warm_import_ms']:.0f}",
                f"{d['warm_first_get_kernel_ms']:.0f}",
                f"{d['warm_disk_hit_median_ms']:.2f}",
                f"{d['memory_get_kernel_us']:.2f}",
                d["date"][:10],
            ]
        )
    if not rows:
        return None
    return "\n\n".join(
        [
            "## Compile latency and cache hits",
            "`python bench/compile_latency.py` (no GPU needed); data: "
            "`bench/results/compile_latency-*.json`. Cold compiles are the median of 14 distinct "
            "GELU variants for sm_90; the new-process columns come from a fresh interpreter that "
            "finds all 15 variants on disk: its import time, its first `get_kernel` (which pays "
            "the one-time set-up: loading NVRTC to learn its version, importing Jinja2, "
            "opening the cache) and the median per-key disk hit after that (render, digest, "
            "read, verify).",
            md_table(
                [
                    "host",
                    "CPUs",
                    "NVRTC",
                    "first compile ms (NVRTC init)",
                    "cold compile ms",
                    "new process: import ms",
                    "first get_kernel ms",
                    "disk hit ms / key",
                    "memory hit us",
                    "date",
                ],
                rows,
            ),
        ]
    )


def main() -> int:
    sections = [
        s for s in (gelu_section(), tuning_section(), compile_section(), launch_section()) if s
    ]
    text = "\n\n".join(
        [
            "# Performance",
            "Generated by `python bench/make_report.py` from `bench/results/*.json`; every number "
            "below was measured by the script named in its section. GPU figures: NVIDIA H200 "
            "(sm_90, 132 SMs).",
            *sections,
        ]
    )
    OUT.write_text(text + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
