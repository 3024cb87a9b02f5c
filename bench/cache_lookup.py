"""Warm cache lookups: a new process gets 100 prewarmed kernels from the disk cache.

    python bench/cache_lookup.py [--runs 7] [--tag NAME] [--code DIR]

The 100 variants are the example model lists' (docs/examples/*.toml: a Llama-3-8B-style FP8
MLP block and a GPT-style GELU block: norms, gated activations, cast/transpose), topped up
with GELU variants (dtype pairs x hidden sizes x sm_90/sm_100a). One process prewarms them
into an empty cache directory; then each run is a new process that imports the API
(timed: ``import_ms``: ``from nvrtc_engine import KernelKey, cache_info, get_kernel``; the
package's names load on first use, and the API's import brings the disk store's library and
the compiled launcher), parses the 100 kernel names into keys (timed: ``keys_ms``: the
families' specs load here) and calls ``get_kernel(key)`` for the 100 keys (timed together:
``lookup_ms``; ``total_ms`` is the three together), counting NVRTC compiles
(``cache_info().compiles``) and renders (calls of ``nvrtc_engine.core.render.render``,
patched to count as its module is imported: the script imports nothing of the package outside
the timed phases), and noting which heavy modules the lookups imported. The first run fills
Python's bytecode cache and is not counted. Needs no GPU. ``--code DIR``: measure the package
in DIR (a ``git archive`` of another commit with its nvrtc_engine/ and templates/; one from
before the core/ layout, such as 347c8bd, has its render module at ``nvrtc_engine.render``).

Targets (2-core machine, issue 39): ``after_import_ms`` (keys and lookups: everything after
the import) <= 30, import_ms <= 60, 0 compiles, 0 renders.
Writes bench/results/cache_lookup.json (or cache_lookup-<tag>.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

ROOT = Path(__file__).resolve().parent.parent
COUNT = 100
TARGETS = {"after_import_ms": 30.0, "import_ms": 60.0, "compiles": 0, "renders": 0}

_WARM = r"""
import importlib.machinery, json, sys, time
names = json.load(open(sys.argv[1]))
renders = []
class CountRenders:  # patches render() as its module is first imported, whenever that is
    def find_spec(self, name, path, target=None):
        if name not in ("nvrtc_engine.core.render", "nvrtc_engine.render"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            real = module.render
            def render(key):
                renders.append(str(key))
                return real(key)
            module.render = render
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, CountRenders())
t0 = time.perf_counter()
from nvrtc_engine import KernelKey, cache_info, get_kernel
t1 = time.perf_counter()
tk = time.perf_counter()
keys = [KernelKey.parse(n) for n in names]
tk = (time.perf_counter() - tk) * 1e3
before = set(sys.modules)
c2, t2 = time.process_time(), time.perf_counter()
for key in keys:
    get_kernel(key)
t3, c3 = time.perf_counter(), time.process_time()
loaded = sorted(m for m in ("jinja2", "cuda.bindings.nvrtc", "cuda.pathfinder", "diskcache",
                            "sqlite3") if m in sys.modules and m not in before)
info = cache_info()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "keys_ms": tk, "lookup_ms": (t3 - t2) * 1e3,
                  "after_import_ms": (t3 - t1) * 1e3, "total_ms": (t3 - t0) * 1e3,
                  "lookup_cpu_ms": (c3 - c2) * 1e3,
                  "compiles": info.compiles, "renders": len(renders),
                  "disk_hits": info.disk_hits, "imported_by_lookups": loaded}))
"""

_PREWARM = r"""
import json, sys
from nvrtc_engine import prewarm
report = prewarm(json.load(open(sys.argv[1])), workers=2, progress=False)
assert report.ok, report.summary()
print(len(report.compiled) + len(report.cached))
"""


def pick_variants() -> list[str]:
    """The benchmark's 100 kernel names: the example lists' variants, then GELU ones."""
    from nvrtc_engine import make_key
    from nvrtc_engine.tools.variants import resolve_variants

    names: dict[str, None] = {}
    for path in sorted((ROOT / "docs" / "examples").glob("*.toml")):
        keys = resolve_variants(path, default_arch=lambda: "sm_90")
        names.update((str(key), None) for key in keys)
    pairs = [(i, o) for i in ("bf16", "fp16", "fp32")
             for o in ("fp8_e4m3", "bf16", "fp16", "fp32", "fp8_e5m2")]  # fmt: skip
    hidden = (4096, 14336, 16384, 11008, None)
    for arch, size, (i, o) in itertools.product(("sm_90", "sm_100a"), hidden, pairs):
        if len(names) >= COUNT:
            break
        names[str(make_key("gelu", in_dtype=i, out_dtype=o, hidden_size=size, arch=arch))] = None
    return list(names)[:COUNT]


def _run(script: str, arg: Path, env: dict[str, str], code: Path) -> str:
    # cwd: `python -c` puts the working directory first on the path; time the code in `code`
    done = subprocess.run([sys.executable, "-c", script, str(arg)], env=env, cwd=code,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"a benchmark process failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="warm processes (median)")
    parser.add_argument("--tag", default=None, help="results file suffix")
    parser.add_argument("--code", type=Path, default=ROOT, help="the package copy to measure")
    args = parser.parse_args()
    code = args.code.resolve()
    if not (code / "nvrtc_engine").is_dir():
        parser.error(f"--code {args.code}: no nvrtc_engine/ there")
    names = pick_variants()
    work = Path(tempfile.mkdtemp(prefix="nvrtc-engine-cache-lookup-"))
    names_file = work / "names.json"
    names_file.write_text(json.dumps(names))
    pythonpath = os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(work / "cache"), "PYTHONPATH": pythonpath}
    for name in ("NVRTC_ENGINE_DISABLE_DISK_CACHE", "NVRTC_ENGINE_READONLY_CACHE",
                 "PYTHONDONTWRITEBYTECODE"):  # fmt: skip
        env.pop(name, None)
    print(f"prewarming {len(names)} variants into {work / 'cache'} ...")
    try:
        _run(_PREWARM, names_file, env, code)
        _run(_WARM, names_file, env, code)  # fills the bytecode cache; not counted
        runs = [json.loads(_run(_WARM, names_file, env, code)) for _ in range(args.runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fields = ("import_ms", "keys_ms", "lookup_ms", "after_import_ms", "total_ms",
              "lookup_cpu_ms", "compiles")  # fmt: skip
    summary = {field: statistics.median(r[field] for r in runs) for field in (*fields, "renders")}
    summary["after_import_ms_range"] = [min(r["after_import_ms"] for r in runs),
                                        max(r["after_import_ms"] for r in runs)]  # fmt: skip
    met = {f: summary[f] <= limit for f, limit in TARGETS.items()}
    payload = {
        "load_average": list(os.getloadavg()),
        "code": "this checkout" if code == ROOT else str(args.code),
        "variants": names,
        "summary": summary,
        "targets": TARGETS,
        "met": met,
        "runs": runs,
    }
    path = common.write_results(f"cache_lookup-{args.tag}" if args.tag else "cache_lookup",
                                payload)  # fmt: skip
    rows = [{"what": f, "value": summary[f], "target": TARGETS[f], "ok": "yes" if met[f] else "NO"}
            for f in TARGETS]  # fmt: skip
    print(common.table(rows, [("what", "", ""), ("value", "median", ".1f"),
                              ("target", "at most", "g"), ("ok", "met", "")]))  # fmt: skip
    low, high = summary["after_import_ms_range"]
    print(f"after the import: keys parsed {summary['keys_ms']:.1f} ms, lookups "
          f"{summary['lookup_ms']:.1f} ms (CPU time {summary['lookup_cpu_ms']:.1f} ms), the two "
          f"{low:.1f}-{high:.1f} ms over {len(runs)} runs; import, keys and lookups together: "
          f"{summary['total_ms']:.1f} ms; load average {payload['load_average'][0]:.2f}; "
          f"imported by the lookups: {runs[-1]['imported_by_lookups']}\nwrote {path}")  # fmt: skip
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
