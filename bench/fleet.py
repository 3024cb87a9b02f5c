"""A fleet sharing one remote cache: N node processes, each with its own empty disk cache,
prewarm one model's variant list at once against one Redis server, then the same without it.

    python bench/fleet.py [--nodes 16] [--workers 1] [--repeat 1] [--list FILE]

Needs ``redis-server`` on the PATH (started here on a free port in a temporary directory, no
persistence) and the ``redis`` extra; no GPU. Each node is a fresh process that imports
nvrtc_engine, waits until every node has (so they miss the same kernels at the same moment),
then runs ``prewarm(list, workers=W)``; the wall time runs from that moment to the last node's
end. Reported per run: the kernels NVRTC compiled over all nodes (with the remote cache: one
per variant, the rest remote hits; without: one per variant per node), the wall time, each
node's prewarm time, and the CacheWarnings the nodes raised. Writes bench/results/fleet.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "docs" / "examples" / "llama3_8b_fp8_mlp.toml"

_NODE = r"""
import json, os, sys, time, warnings
import nvrtc_engine
from nvrtc_engine.tools.prewarm import prewarm
open(sys.argv[3], "w").close()  # ready
while not os.path.exists(sys.argv[4]):
    time.sleep(0.002)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    report = prewarm(sys.argv[1], workers=int(sys.argv[2]), progress=False)
info = nvrtc_engine.cache_info()
print(json.dumps({"compiled": len(report.compiled), "cached": len(report.cached),
                  "failed": [f.error for f in report.failed], "wall_s": report.wall_s,
                  "remote_hits": info.remote_hits, "compiles": info.compiles,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    """A redis-server of this run's own: (process, URL)."""
    import redis

    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("needs redis-server on the PATH (apt-get install redis-server)")
    port = _free_port()
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                "", "--appendonly", "no", "--dir", str(directory)],
                               stdout=subprocess.DEVNULL)  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(500):
        try:
            client.ping()
            return process, f"redis://127.0.0.1:{port}/0"
        except redis.exceptions.ConnectionError:
            time.sleep(0.01)
    raise SystemExit("redis-server did not start")


def run_fleet(tmp: Path, nodes: int, workers: int, variants: Path, url: str | None) -> dict:
    """One run: ``nodes`` processes with empty caches, released together."""
    run = Path(tempfile.mkdtemp(dir=tmp))
    go = run / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVRTC_ENGINE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = []
    for i in range(nodes):
        node_env = {**env, "NVRTC_ENGINE_CACHE_DIR": str(run / f"node{i}")}
        if url:
            node_env["NVRTC_ENGINE_REMOTE_CACHE"] = url
        args = [str(variants), str(workers), str(run / f"ready{i}"), str(go)]
        procs.append(subprocess.Popen([sys.executable, "-c", _NODE, *args], env=node_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    while not all((run / f"ready{i}").exists() for i in range(nodes)):
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a node died: {[p.communicate()[1] for p in procs if p.poll()]}")
        time.sleep(0.005)
    start = time.perf_counter()
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a node failed:\n{err}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - start
    shutil.rmtree(run, ignore_errors=True)
    if any(r["failed"] for r in results):
        raise SystemExit(f"variants failed: {[r['failed'] for r in results if r['failed']]}")
    node_s = [r["wall_s"] for r in results]
    return {
        "remote": bool(url), "wall_s": wall, "compiles": sum(r["compiles"] for r in results),
        "remote_hits": sum(r["remote_hits"] for r in results),
        "node_prewarm_s_median": statistics.median(node_s), "node_prewarm_s_max": max(node_s),
        "warnings": sorted({w for r in results for w in r["warnings"]}),
        "nodes": results,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16, help="node processes (16)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="prewarm's worker processes per node (1: compile in the node)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting")
    parser.add_argument("--list", type=Path, default=LIST, help="variant file (the Llama MLP)")
    args = parser.parse_args()
    from nvrtc_engine.core.cpus import available_cpus
    from nvrtc_engine.core.nvrtc import nvrtc_version
    from nvrtc_engine.tools.variants import load_variants

    variants = [str(k) for k in load_variants(args.list)]
    tmp = Path(tempfile.mkdtemp(prefix="nvrtc-engine-fleet-"))
    server, url = start_redis(tmp)
    import redis

    runs: dict[str, list[dict]] = {"remote": [], "local": []}
    load_before = os.getloadavg()[0]  # (other work on the machine slows both settings)
    try:
        for _ in range(args.repeat):
            for name, target in (("remote", url), ("local", None)):
                redis.Redis.from_url(url).flushall()
                result = run_fleet(tmp, args.nodes, args.workers, args.list, target)
                runs[name].append(result)
                print(f"{name}: {result['compiles']} compiles, {result['wall_s']:.1f} s",
                      flush=True)  # fmt: skip
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {name: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                      "compiles": [r["compiles"] for r in rs],
                      "remote_hits": [r["remote_hits"] for r in rs],
                      "node_prewarm_s_median": statistics.median(
                          r["node_prewarm_s_median"] for r in rs)}
               for name, rs in runs.items()}  # fmt: skip
    payload = {
        "nvrtc": nvrtc_version(), "available_cpus": available_cpus(), "nodes": args.nodes,
        "workers_per_node": args.workers, "variant_file": str(args.list.relative_to(ROOT)),
        "variants": variants, "summary": summary,
        "speedup": summary["local"]["wall_s"] / summary["remote"]["wall_s"],
        "load_average": [load_before, os.getloadavg()[0]], "runs": runs,
    }  # fmt: skip
    # the table of docs/performance.md (bench/make_report.py), from the figures above
    payload["caption"] = (
        f"{len(variants)} variants (`{payload['variant_file']}`), NVRTC {payload['nvrtc']}, "
        f"{args.nodes} node processes on {payload['available_cpus']} CPUs, "
        f"{args.workers} compile at a time per node; median of {args.repeat} run(s); load "
        f"average {load_before:.1f} before. With one Redis: x{payload['speedup']:.1f}."
    )
    payload["head"] = ["run", "NVRTC compiles, all nodes", "wall s", "a node's prewarm s, median"]
    where = {"remote": "one Redis", "local": "no remote cache"}
    payload["rows"] = [[f"{args.nodes} nodes, {where[name]}", "/".join(map(str, s["compiles"])),
                        f"{s['wall_s']:.1f}", f"{s['node_prewarm_s_median']:.1f}"]
                       for name, s in summary.items()]  # fmt: skip
    path = common.write_results("fleet", payload)
    print(payload["caption"])
    print("\n".join(" | ".join(map(str, row)) for row in [payload["head"], *payload["rows"]]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
