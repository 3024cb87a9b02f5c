"""Compile latency: cold NVRTC compiles, warm disk hits in a new process, memory hits.

    python bench/compile_latency.py [--arch sm_90] [--tag NAME]

Runs on any machine (no GPU needed). With an empty cache directory it measures:
  - the first get_kernel in the process (NVRTC library load, Jinja set-up, cache open),
  - cold compiles of 14 further distinct GELU variants (median, NVRTC time and get_kernel
    wall time: render + digest + compile + verified store + key index record),
  - a new process that finds them on disk (3 runs, medians): `import nvrtc_engine`, its first
    get_kernel (all one-time set-up included: settings, the key index's environment
    fingerprint, reading and verifying the entry) and the per-key disk hit after that (key
    index record, read, verify); and which of Jinja2, the NVRTC bindings and diskcache that
    process imported (none, when the key index answers),
  - get_kernel from memory (same arguments again), in microseconds,
  - where a cold compile's time goes: NVRTC's own per-phase report (-time: C++ front end,
    NVVM optimizer, PTX to SASS) for the same variants compiled again, and for an empty kernel
    (the fixed cost of any compile), medians.
The new processes run with the package's bytecode cached (in a temporary PYTHONPYCACHEPREFIX,
filled by one process first), as an installed wheel has it; the import is also timed without
bytecode (PYTHONDONTWRITEBYTECODE=1: every module compiled from source).
Writes bench/results/compile_latency-<tag>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

PAIRS = list(
    itertools.product(["bf16", "fp16", "fp32"], ["fp8_e4m3", "bf16", "fp16", "fp32", "fp8_e5m2"])
)

_WARM = r"""
import json, sys, time
t0 = time.perf_counter()
import nvrtc_engine as ne
t1 = time.perf_counter()
pairs = json.loads(sys.argv[1]); arch = sys.argv[2]
times = []
for i, o in pairs:
    s = time.perf_counter()
    k = ne.get_kernel("gelu", in_dtype=i, out_dtype=o, arch=arch)
    times.append((time.perf_counter() - s) * 1e3)
    assert k.origin == "disk", k.origin
loaded = [m for m in ("jinja2", "cuda.bindings.nvrtc", "diskcache") if m in sys.modules]
info = ne.cache_info()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "get_ms": times, "compiles": info.compiles,
                  "disk_hits": info.disk_hits, "loaded": loaded}))
"""


def _warm_process(pairs: list, arch: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _WARM, json.dumps(pairs), arch],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _phases(arch: str) -> dict[str, dict[str, float]]:
    """Median milliseconds per NVRTC phase (its -time report), for the GELU variants of PAIRS
    and for an empty kernel; the compiles here are cold (NVRTC keeps nothing between them)."""
    import csv
    from collections import defaultdict

    import nvrtc_engine as ne
    from nvrtc_engine.core.nvrtc import CompileOptions, compile_source
    from nvrtc_engine.core.render import render

    empty = 'extern "C" __global__ void empty_kernel(float* y) {}\n'
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for what in ("gelu variants", "empty kernel"):
            report = Path(tmp) / f"{what}.csv"
            options = CompileOptions(arch=arch, extra=(f"-time={report}",))
            totals = []
            for i, o in PAIRS if what == "gelu variants" else PAIRS[:5]:
                r = render(ne.make_key("gelu", in_dtype=i, out_dtype=o, arch=arch))
                source, headers = (r.source, r.headers) if what == "gelu variants" else (empty, [])
                totals.append(compile_source(r.name, source, headers, options).seconds * 1e3)
            phases = defaultdict(list)
            with report.open() as f:
                for row in csv.reader(f):
                    if len(row) >= 3 and row[0] != "File name":
                        phases[row[1].strip()].append(float(row[2]))
            out[what] = {p: statistics.median(v) for p, v in phases.items()}
            out[what]["total (wall)"] = statistics.median(totals)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--tag", default=None, help="results file suffix (default: host kind)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="nvrtc-engine-bench-")
    os.environ["NVRTC_ENGINE_CACHE_DIR"] = tmp
    import nvrtc_engine as ne

    ne.clear_cache()
    # 1. first compile in this process: includes NVRTC initialization
    i, o = PAIRS[0]
    start = time.perf_counter()
    first = ne.get_kernel("gelu", in_dtype=i, out_dtype=o, arch=args.arch)
    first_wall = (time.perf_counter() - start) * 1e3
    # 2. cold compiles of distinct variants
    nvrtc_ms, wall_ms = [], []
    for i, o in PAIRS[1:]:
        start = time.perf_counter()
        k = ne.get_kernel("gelu", in_dtype=i, out_dtype=o, arch=args.arch)
        wall_ms.append((time.perf_counter() - start) * 1e3)
        nvrtc_ms.append(k.artifact.compile_ms)
        assert k.origin == "compiled"
    # 3. a new process finds them all on disk (the key index written by steps 1-2)
    with_bytecode = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with_bytecode["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="nvrtc-engine-pyc-")
    _warm_process(PAIRS, args.arch, with_bytecode)  # writes the bytecode
    warm_runs = [_warm_process(PAIRS, args.arch, with_bytecode) for _ in range(3)]
    no_bytecode = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    no_bytecode.pop("PYTHONPYCACHEPREFIX", None)
    source_runs = [_warm_process(PAIRS, args.arch, no_bytecode) for _ in range(3)]
    assert all(r["compiles"] == 0 for r in warm_runs + source_runs)
    per_key = [t for r in warm_runs for t in r["get_ms"][1:]]
    # 4. memory hits
    calls = 20000
    memo_us = min(timeit.repeat(
        lambda: ne.get_kernel("gelu", dtype="fp8", arch=args.arch), number=calls, repeat=5
    )) / calls * 1e6  # fmt: skip
    key = ne.make_key("gelu", dtype="fp8", arch=args.arch)
    key_us = min(timeit.repeat(lambda: ne.get_kernel(key), number=calls, repeat=5)) / calls * 1e6
    # 5. where the time of a cold compile goes
    phases = _phases(args.arch)
    tag = args.tag or ("h200-host" if ne.core.driver.device_count() else "dev-2core")
    result = {
        "arch": args.arch,
        "nvrtc": ne.core.nvrtc.nvrtc_version(),
        "first_compile_wall_ms": first_wall,
        "first_compile_nvrtc_ms": first.artifact.compile_ms,
        "cold_compile_nvrtc_ms": nvrtc_ms,
        "cold_compile_nvrtc_median_ms": statistics.median(nvrtc_ms),
        "cold_get_kernel_wall_median_ms": statistics.median(wall_ms),
        "variants": len(nvrtc_ms),
        "warm_import_ms": statistics.median(r["import_ms"] for r in warm_runs),
        "warm_first_get_kernel_ms": statistics.median(r["get_ms"][0] for r in warm_runs),
        "warm_disk_hit_median_ms": statistics.median(per_key),
        "warm_imported": sorted({m for r in warm_runs for m in r["loaded"]}),
        "warm_import_no_bytecode_ms": statistics.median(r["import_ms"] for r in source_runs),
        "warm_first_get_kernel_no_bytecode_ms": statistics.median(
            r["get_ms"][0] for r in source_runs
        ),
        "memory_get_kernel_us": memo_us,
        "memory_get_kernel_by_key_us": key_us,
        "phases_ms": phases,
    }
    path = common.write_results(f"compile_latency-{tag}", result)
    rows = [
        {"what": "first compile in process (NVRTC init), wall", "value": first_wall, "unit": "ms"},
        {"what": f"cold compile, NVRTC, median of {len(nvrtc_ms)}",
         "value": result["cold_compile_nvrtc_median_ms"], "unit": "ms"},
        {"what": "cold get_kernel wall (render+digest+compile+store+index), median",
         "value": result["cold_get_kernel_wall_median_ms"], "unit": "ms"},
        {"what": "new process: import nvrtc_engine", "value": result["warm_import_ms"],
         "unit": "ms"},
        {"what": "new process: first get_kernel (disk hit + one-time set-up)",
         "value": result["warm_first_get_kernel_ms"], "unit": "ms"},
        {"what": "new process: disk hit per key, median",
         "value": result["warm_disk_hit_median_ms"], "unit": "ms"},
        {"what": "new process, no bytecode: import nvrtc_engine",
         "value": result["warm_import_no_bytecode_ms"], "unit": "ms"},
        {"what": "new process, no bytecode: first get_kernel",
         "value": result["warm_first_get_kernel_no_bytecode_ms"], "unit": "ms"},
        {"what": "get_kernel from memory (same arguments)", "value": memo_us, "unit": "us"},
        {"what": "get_kernel(KernelKey) from memory", "value": key_us, "unit": "us"},
    ]  # fmt: skip
    print(
        f"compile latency, arch {args.arch}, NVRTC {result['nvrtc']}, "
        f"{common.host_info()['cpus']} CPUs"
    )
    print(
        common.table(rows, [("what", "measure", ""), ("value", "value", ".2f"), ("unit", "", "")])
    )
    for what, by_phase in phases.items():
        parts = ", ".join(f"{p} {ms:.1f}" for p, ms in by_phase.items())
        print(f"NVRTC phases, {what}, median ms: {parts}")
    imported = ", ".join(result["warm_imported"]) or "none"
    print(f"new process imported (of jinja2, cuda.bindings.nvrtc, diskcache): {imported}")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
