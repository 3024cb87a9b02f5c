"""Prewarm: 100 distinct variants compiled cold with 1, 2, 4, 8 and the default number of
worker processes, then made ready from the disk cache by a fresh process.

    python bench/prewarm.py [--repeat 3] [--workers 1 2 4 8] [--tag NAME]

The variants come from the example model lists (docs/examples/*.toml: a Llama-3-8B-style FP8
MLP block and a GPT-style GELU block). Entries whose op is not registered in this build, or
whose fields it does not support yet, are skipped (and listed); the list is topped up to 100
distinct variants with GELU variants (dtype pairs x hidden sizes x archs). It needs no GPU.

Each cold run is a fresh process with an empty cache directory; it reports prewarm()'s wall
time (worker start-up included) and NVRTC's median compile time. The warm run is a fresh
process over the filled cache: "ready" is prewarm()'s wall time there (reading the variant
list; then for each kernel its key index record, reading and verifying the cubin: no
rendering, no NVRTC, no diskcache), after ``import nvrtc_engine`` (reported apart), and
again after loading the NVRTC bindings and library first (which a GPU job pays anyway: they
come with the driver bindings it launches through), timed apart. Warm processes run with the
package's bytecode cached (a temporary PYTHONPYCACHEPREFIX, filled by one run first), as an
installed wheel has it. Targets (H200 host, 16 cores): cold <= 2 s, warm ready <= 100 ms.
Writes bench/results/prewarm-<tag>.json (default tag: "<usable CPUs>cpu").
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.toml"))
TARGET = 100
TOP_UP_ARCHS = ("sm_90", "sm_100a")
TOP_UP_PAIRS = [
    (i, o)
    for i in ("bf16", "fp16", "fp32")
    for o in ("fp8_e4m3", "bf16", "fp16", "fp32", "fp8_e5m2")
]
TOP_UP_HIDDEN = (4096, 14336, 16384, 11008, None)

_RUN = r"""
import json, sys, time
t0 = time.perf_counter()
import nvrtc_engine
from nvrtc_engine.prewarm import prewarm
t1 = time.perf_counter()
names = json.load(open(sys.argv[1]))
workers = None if sys.argv[2] == "default" else int(sys.argv[2])
nvrtc_ms = 0.0
if sys.argv[3] == "split":  # load the NVRTC bindings and library first, timed apart
    from nvrtc_engine.nvrtc import nvrtc_version, supported_archs
    nvrtc_version(), supported_archs()
    nvrtc_ms = (time.perf_counter() - t1) * 1e3
t1 = time.perf_counter()
report = prewarm(names, workers=workers, progress=False)
t2 = time.perf_counter()
info = nvrtc_engine.cache_info()
print(json.dumps({"import_ms": (t1 - t0) * 1e3 - nvrtc_ms, "nvrtc_load_ms": nvrtc_ms,
                  "prewarm_ms": (t2 - t1) * 1e3,
                  "wall_s": report.wall_s, "compiled": len(report.compiled),
                  "cached": len(report.cached), "failed": [f.error for f in report.failed],
                  "workers": report.workers, "median_compile_ms": report.median_compile_ms,
                  "memory_entries": info.memory_entries}))
"""


def pick_variants() -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(names, names by source, skipped entries) for the benchmark's 100 variants."""
    from nvrtc_engine import KernelKey, make_key
    from nvrtc_engine.ops import registered_ops
    from nvrtc_engine.variants import VariantListError, expand_entry, read_entries

    names: dict[str, None] = {}
    by_source: dict[str, list[str]] = {}
    skipped: list[str] = []
    for path in EXAMPLES:
        got = by_source.setdefault(path.name, [])
        for i, entry in enumerate(read_entries(path)):
            if isinstance(entry, str):  # a kernel name fixes every field
                try:
                    keys = [KernelKey.parse(entry)]
                except ValueError as exc:
                    skipped.append(f"{path.name} entry {i}: {exc}")
                    continue
            elif entry["op"] not in registered_ops():
                skipped.append(f"{path.name} entry {i}: op {entry['op']!r} not registered yet")
                continue
            else:
                try:
                    keys = expand_entry(entry, source=path.name, index=i)
                except VariantListError as exc:
                    skipped.append(f"{exc} (not supported by this build yet)")
                    continue
            for key in keys:
                if str(key) not in names and len(names) < TARGET:
                    names[str(key)] = None
                    got.append(str(key))
    top_up = by_source.setdefault("gelu top-up", [])
    for arch, hidden, (i, o) in itertools.product(TOP_UP_ARCHS, TOP_UP_HIDDEN, TOP_UP_PAIRS):
        if len(names) >= TARGET:
            break
        name = str(make_key("gelu", in_dtype=i, out_dtype=o, hidden_size=hidden, arch=arch))
        if name not in names:
            names[name] = None
            top_up.append(name)
    return list(names), by_source, skipped


def run(
    names_file: Path, cache_dir: Path, workers: str, split: bool = False, pyc: Path | None = None
) -> dict:
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(cache_dir)}
    env.pop("NVRTC_ENGINE_WORKERS", None)
    if pyc is not None:  # bytecode written to and read from there
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pyc)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    args = [str(names_file), workers, "split" if split else "whole"]
    done = subprocess.run([sys.executable, "-c", _RUN, *args], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_ms"] = (time.perf_counter() - start) * 1e3
    if result["failed"]:
        raise SystemExit(f"variants failed to compile: {result['failed'][:3]}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting (median)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tag", default=None, help="results file suffix (default: host kind)")
    args = parser.parse_args()
    names, by_source, skipped = pick_variants()
    print(f"{len(names)} distinct variants:")
    for source, got in by_source.items():
        print(f"  {len(got):3d} from {source}")
    for line in skipped:
        print(f"  skipped {line}")
    print("  " + "\n  ".join(names))
    tmp = Path(tempfile.mkdtemp(prefix="nvrtc-engine-prewarm-bench-"))
    names_file = tmp / "variants.json"
    names_file.write_text(json.dumps(names))
    cold = []
    last_cache = None
    for workers in [*map(str, args.workers), "default"]:
        runs = []
        for r in range(args.repeat):
            cache = tmp / f"cold-{workers}-{r}"
            result = run(names_file, cache, workers)
            assert result["compiled"] == len(names), result
            runs.append(result)
            last_cache = cache
        cold.append({
            "workers_requested": workers, "workers": runs[0]["workers"],
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_compile_ms": statistics.median(r["median_compile_ms"] for r in runs),
            "process_ms": statistics.median(r["process_ms"] for r in runs), "runs": runs,
        })  # fmt: skip
        print(f"cold, workers={workers}: {cold[-1]['wall_s']:.2f} s", flush=True)
    assert last_cache is not None
    warm_runs, split_runs = [], []
    pyc = tmp / "pyc"
    run(names_file, last_cache, "default", True, pyc)  # writes the bytecode
    for _ in range(max(3, args.repeat)):
        for split, runs in ((False, warm_runs), (True, split_runs)):
            result = run(names_file, last_cache, "default", split, pyc)
            assert result["cached"] == len(names) == result["memory_entries"], result
            runs.append(result)
    warm = {
        # prewarm() in a fresh process after `import nvrtc_engine`: everything included
        "ready_ms": statistics.median(r["wall_s"] * 1e3 for r in warm_runs),
        "import_ms": statistics.median(r["import_ms"] for r in warm_runs),
        "process_ms": statistics.median(r["process_ms"] for r in warm_runs),
        # the same with the NVRTC bindings and library loaded first (a GPU job loads the
        # same cuda.bindings package to launch anyway), timed apart
        "nvrtc_load_ms": statistics.median(r["nvrtc_load_ms"] for r in split_runs),
        "ready_after_nvrtc_load_ms": statistics.median(r["wall_s"] * 1e3 for r in split_runs),
        "runs": warm_runs,
        "split_runs": split_runs,
    }
    from nvrtc_engine.cpus import available_cpus
    from nvrtc_engine.nvrtc import nvrtc_version

    tag = args.tag or f"{available_cpus()}cpu"
    payload = {
        "nvrtc": nvrtc_version(),
        "available_cpus": available_cpus(),
        "variants": names,
        "variant_sources": {k: len(v) for k, v in by_source.items()},
        "skipped_entries": skipped,
        "cold": cold,
        "warm": warm,
        "targets": {"cold_s": 2.0, "warm_ready_ms": 100.0},
        "key_index": True,  # warm runs find kernels through the key index
    }
    path = common.write_results(f"prewarm-{tag}", payload)
    rows = [{"what": f"cold, {c['workers_requested']} workers"
             + (f" (= {c['workers']})" if c["workers_requested"] == "default" else ""),
             "value": c["wall_s"] * 1e3, "extra": c["median_compile_ms"],
             "process": c["process_ms"]} for c in cold]  # fmt: skip
    rows.append({"what": "warm: fresh process, 100 kernels ready", "value": warm["ready_ms"],
                 "extra": None, "process": warm["process_ms"]})  # fmt: skip
    rows.append({"what": "warm, split: NVRTC bindings + library load", "value":
                 warm["nvrtc_load_ms"], "extra": None, "process": None})  # fmt: skip
    rows.append({"what": "warm, split: then 100 kernels ready", "value":
                 warm["ready_after_nvrtc_load_ms"], "extra": None, "process": None})  # fmt: skip
    rows.append({"what": "warm: import nvrtc_engine (not included)", "value":
                 warm["import_ms"], "extra": None, "process": None})  # fmt: skip
    print(f"\nprewarm of {len(names)} variants, NVRTC {payload['nvrtc']}, "
          f"{payload['available_cpus']} usable CPUs, median of {args.repeat} runs")  # fmt: skip
    print(common.table(rows, [("what", "run", ""), ("value", "prewarm ms", ".1f"),
                              ("extra", "NVRTC median ms", ".1f"),
                              ("process", "process ms", ".0f")]))  # fmt: skip
    print(f"targets: cold <= 2000 ms, warm ready <= 100 ms\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
