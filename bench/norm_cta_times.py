"""When each CTA of a staged norm forward starts, takes its rows and ends: does the persistent
grid finish together, or does its last CTA run on alone (a tail that a balanced or dynamic row
assignment would take back)?

    python bench/norm_cta_times.py [--cases layernorm:4096] [--out fp8] [--samples 10]
                                   [--edits dynrows] [--name norm_cta_times]

Needs PyTorch with a GPU (``pip install -e '.[test,torch]'``); the arguments are checked first,
each case's kernel too (rendered for sm_90 with the probe and the edits: no GPU needed). Each
case compiles its default kernel (TUNED or the rules; it must be a staged forward, ``t``
in its tag) from the rendered source with a probe added (bench/source_ab.py's edits, on an
engine without a disk cache), then the edits ``--edits`` names (``+``-joined, bench/source_ab.py's):
thread 0 of every CTA writes ``%globaltimer`` (ns) when the CTA starts, at the top of each row
(up to 64 rows) and when it ends, with ``%smid`` and ``%warpid``, into ``__device__`` arrays
read back after the call. A sample is one call after 20 back-to-back calls on rotating buffers
(norm_bandwidth.Cycle), so the GPU is in its busy state. The probe adds a few stores per row
of thread 0 only, but it can change the kernel's registers (hogqit3: 96 to 80, so 6 CTAs per
SM instead of 5): the figures are the kernel's shape in time, not its speed
(bench/source_ab.py times it). Writes bench/results/NAME.json (and $OUT/NAME.json when set).

Per sample: the span (first start to last end), the spread of the CTAs' starts and ends, the
steady row time (gaps between a CTA's row tops, rows 2 to its last but one: median, mean,
tail percentiles, and the spread of each CTA's median over the CTAs), the rows each CTA took,
each SM's rows per microsecond (its rows over its last CTA's end), and the first sample's CTAs
by their rank on their SM (ordered by the warp slot of their first warp: does the hardware
favour some CTAs of an SM over others?), with each CTA's own figures in the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"  # the key does not see the edits

import common
import source_ab
from norm_bandwidth import Cycle, forward_rows, forward_weights, kernel_forward

MAX_CTAS = 4096
MAX_ROWS = 64
PROBE_DECL = f"""// (bench/norm_cta_times.py) per-CTA timestamps
__device__ unsigned long long nve_probe_cta[{MAX_CTAS} * 4];
__device__ unsigned long long nve_probe_rows[{MAX_CTAS} * {MAX_ROWS}];
__device__ __forceinline__ unsigned long long nve_probe_now() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}}
__device__ __forceinline__ unsigned nve_probe_sm() {{
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}}
__device__ __forceinline__ unsigned nve_probe_warp() {{
  unsigned w;
  asm volatile("mov.u32 %0, %%warpid;" : "=r"(w));
  return w;
}}
"""
KERNEL_HEAD = 'extern "C" __global__'
START = source_ab.WAIT
START_PROBE = (
    "  int nve_it = 0;\n"
    "  if (threadIdx.x == 0 && blockIdx.x < " + str(MAX_CTAS) + ") {\n"
    "    nve_probe_cta[blockIdx.x * 4] = nve_probe_now();\n"
    "    nve_probe_cta[blockIdx.x * 4 + 2] = nve_probe_sm();\n"
    "    nve_probe_cta[blockIdx.x * 4 + 3] = nve_probe_warp();\n"
    "  }\n"
)
ROW_TOP = "    cp_wait<D - 1>();  // this row's copies (and the weights') have landed\n"
ROW_PROBE = (
    "    if (threadIdx.x == 0 && blockIdx.x < "
    + str(MAX_CTAS)
    + " && nve_it < "
    + str(MAX_ROWS)
    + ") nve_probe_rows[blockIdx.x * "
    + str(MAX_ROWS)
    + " + nve_it] = nve_probe_now();\n    ++nve_it;\n"
)
END = "  if (blockIdx.x == 0 && threadIdx.x == 0 && scale_inv_ptr != nullptr)"
END_PROBE = (
    "  if (threadIdx.x == 0 && blockIdx.x < "
    + str(MAX_CTAS)
    + ") nve_probe_cta[blockIdx.x * 4 + 1] = nve_probe_now();\n"
)
source_ab.EDITS["ctaprobe"] = [
    ("source", KERNEL_HEAD, PROBE_DECL + KERNEL_HEAD),
    ("source", START, START + START_PROBE),
    ("source", ROW_TOP, ROW_TOP + ROW_PROBE),
    ("source", END, END_PROBE + END),
]


class DeviceArray:
    """A ``__device__`` array of unsigned 64-bit words in a loaded module, looked up once."""

    def __init__(self, module: Any, name: str) -> None:
        from nvrtc_engine import driver

        self._drv, self._check = driver._drv(), driver.check
        found = self._check(self._drv.cuModuleGetGlobal(module, name.encode()), "cuModuleGetGlobal")
        self.ptr, self.size = found

    def clear(self) -> None:
        """Zero every byte."""
        self._check(self._drv.cuMemsetD8(self.ptr, 0, self.size), "cuMemsetD8")

    def read(self) -> list[int]:
        """The words, copied to the host (the caller synchronizes first)."""
        import numpy as np

        host = np.zeros(self.size // 8, dtype=np.uint64)
        self._check(self._drv.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes),
                    "cuMemcpyDtoH")  # fmt: skip
        return [int(v) for v in host]


def summarize(cta: list[int], rows_t: list[int], grid: int) -> dict[str, Any]:
    """One sample's figures (microseconds) from the probe arrays of a grid of ``grid`` CTAs,
    and each CTA's own (``ctas``: start, end, SM, warp slot of its first warp, rows taken and
    the median gap between its row tops)."""
    if grid < 1:
        raise ValueError("no CTA wrote its end: the probe did not run (not a staged forward?)")
    starts = [cta[4 * i] for i in range(grid)]
    t0 = min(starts)
    ctas = []
    gaps: list[float] = []
    for i in range(grid):
        tops = [t for t in rows_t[i * MAX_ROWS : (i + 1) * MAX_ROWS] if t]
        d = [(b - a) / 1e3 for a, b in itertools.pairwise(tops[1:-1])]
        gaps += d
        ctas.append({"cta": i, "start_us": (cta[4 * i] - t0) / 1e3,
                     "end_us": (cta[4 * i + 1] - t0) / 1e3, "sm": cta[4 * i + 2],
                     "warp_slot": cta[4 * i + 3], "rows": len(tops),
                     "row_us": statistics.median(d) if d else None})  # fmt: skip
    ends = sorted(c["end_us"] for c in ctas)
    q = statistics.quantiles(ends, n=20)
    per_cta = [c["row_us"] for c in ctas if c["row_us"] is not None]
    g = statistics.quantiles(gaps, n=100) if len(gaps) > 100 else [None] * 99
    # each CTA's rank among the CTAs of its SM, by the warp slot of its first warp
    by_sm: dict[int, list[dict[str, Any]]] = {}
    for c in ctas:
        by_sm.setdefault(c["sm"], []).append(c)
    ranks: dict[int, list[dict[str, Any]]] = {}
    sm_rate = []
    for group in by_sm.values():
        for rank, c in enumerate(sorted(group, key=lambda c: c["warp_slot"])):
            ranks.setdefault(rank, []).append(c)
        sm_rate.append(sum(c["rows"] for c in group) / max(c["end_us"] for c in group))
    by_rank = [{"rank": r, "ctas": len(cs),
                "row_us_mean": statistics.fmean([c["row_us"] for c in cs if c["row_us"]] or [0.0]),
                "end_us_mean": statistics.fmean(c["end_us"] for c in cs),
                "rows_mean": statistics.fmean(c["rows"] for c in cs)}
               for r, cs in sorted(ranks.items())]  # fmt: skip
    return {
        "grid": grid, "sms": len(by_sm), "span_us": ends[-1],
        "start_spread_us": max(c["start_us"] for c in ctas),
        "end_min_us": ends[0], "end_p5_us": q[0], "end_median_us": q[9],
        "end_p95_us": q[-1], "end_max_us": ends[-1], "tail_us": ends[-1] - ends[0],
        "rows_min": min(c["rows"] for c in ctas), "rows_max": max(c["rows"] for c in ctas),
        "row_us_median": statistics.median(gaps) if gaps else None,
        "row_us_mean": statistics.fmean(gaps) if gaps else None,
        "row_us_p90": g[89], "row_us_p99": g[98], "row_us_max": max(gaps) if gaps else None,
        "row_us_cta_min": min(per_cta) if per_cta else None,
        "row_us_cta_max": max(per_cta) if per_cta else None,
        "sm_rows_per_us_min": min(sm_rate), "sm_rows_per_us_max": max(sm_rate),
        "by_rank": by_rank, "ctas": ctas,
    }  # fmt: skip


def check_case(norm: str, h: int, out: str, edits: list[str], arch: str = "sm_90") -> None:
    """ValueError unless the case's kernel (rendered for ``arch``: no GPU, no compile) is a
    staged forward, whose row loop the probe times, and takes the probe and ``edits``."""
    import nvrtc_engine.engine as engine_mod

    if "ctaprobe" in edits:
        raise ValueError("--edits: the probe (ctaprobe) is always applied; leave it out")
    key = source_ab.case_key(norm, h, out, arch)
    rendered = engine_mod.render(key)
    if rendered.source.count(ROW_TOP) != 1:
        raise ValueError(f"case {norm}:{h} --out {out}: {rendered.name} is not a staged forward "
                         "(no row loop of stages to probe; TUNED names the staged entries: "
                         "t in their tags)")  # fmt: skip
    try:
        source_ab.edited(rendered, ["ctaprobe", *edits])
    except ValueError as exc:
        raise ValueError(f"case {norm}:{h} --out {out}: {exc}") from None


def run_case(norm: str, h: int, out: str, samples: int, edits: list[str]) -> dict[str, Any]:
    import torch

    n = 2048 if h >= 65536 else 16384
    ln, fp8 = norm == "layernorm", out == "fp8"
    w, b, fp8_kw = forward_weights(h, fp8)
    cycle = Cycle(lambda: forward_rows(n, h, fp8), 2 * n * h * 2)
    key = source_ab.case_key(norm, h, out)
    k = source_ab.build(key, ["ctaprobe", *edits])
    symbol = k.artifact.symbols[0]
    call = kernel_forward(k, cycle, ln, w, b, **fp8_kw)
    module = k.loaded(0).module
    cta_array = DeviceArray(module, "nve_probe_cta")
    rows_array = DeviceArray(module, "nve_probe_rows")
    out_rows = []
    for _ in range(samples):
        for _ in range(20):
            call()
        for array in (cta_array, rows_array):
            array.clear()
        call()
        torch.cuda.synchronize()
        cta, rows_t = cta_array.read(), rows_array.read()
        grid = sum(1 for i in range(MAX_CTAS) if cta[4 * i + 1])
        out_rows.append(summarize(cta, rows_t, grid))
    for sample in out_rows[1:]:
        del sample["ctas"]  # (the first sample's are kept)
    cycle.sets.clear()
    torch.cuda.empty_cache()
    return {
        "norm": norm,
        "hidden": h,
        "out": out,
        "kernel": symbol,
        "edits": edits,
        "samples": out_rows,
    }


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--cases", default="layernorm:4096",
                        help="NORM:H,... (default %(default)s)")  # fmt: skip
    parser.add_argument("--out", default="fp8", help="bf16 or fp8 (default %(default)s)")
    parser.add_argument("--samples", type=int, default=10, help="calls probed (default 10)")
    parser.add_argument("--edits", default="", help="bench/source_ab.py edits, '+'-joined")
    parser.add_argument(
        "--name", type=common.result_name, default="norm_cta_times", help="bench/results/NAME.json"
    )
    args = parser.parse_args()
    if args.out not in ("bf16", "fp8"):
        parser.error(f"--out {args.out!r}: bf16 or fp8")
    if args.samples < 1:
        parser.error("--samples: at least 1")
    edits = [e for e in args.edits.split("+") if e]
    try:
        cases = source_ab.parse_cases(args.cases)
        source_ab.check_edits(edits)
        for norm, h in cases:
            check_case(norm, h, args.out, edits)
    except ValueError as exc:
        parser.error(str(exc))
    common.torch_or_exit(parser)
    results = [run_case(norm, h, args.out, args.samples, edits) for norm, h in cases]
    path = common.write_results(args.name, {**common.gpu_info(), "cases": results})
    cols = [("span_us", "span", ".1f"), ("start_spread_us", "starts", ".2f"),
            ("end_min_us", "end min", ".1f"), ("end_median_us", "end med", ".1f"),
            ("end_max_us", "end max", ".1f"), ("row_us_median", "row", ".3f"),
            ("row_us_mean", "row mean", ".3f"), ("row_us_p99", "row p99", ".3f"),
            ("row_us_max", "row max", ".2f"), ("row_us_cta_min", "CTA row min", ".3f"),
            ("row_us_cta_max", "CTA row max", ".3f"), ("rows_min", "rows min", ""),
            ("rows_max", "rows max", ""), ("sm_rows_per_us_min", "SM rows/us min", ".3f"),
            ("sm_rows_per_us_max", "SM rows/us max", ".3f")]  # fmt: skip
    rank_cols = [("rank", "rank on SM", ""), ("ctas", "CTAs", ""),
                 ("row_us_mean", "row us", ".3f"), ("rows_mean", "rows", ".1f"),
                 ("end_us_mean", "end us", ".1f")]  # fmt: skip
    for case in results:
        edited = f" (+{'+'.join(case['edits'])})" if case["edits"] else ""
        print(f"{case['kernel']}{edited}: microseconds from the first CTA's start")
        print(common.table(case["samples"], [("grid", "CTAs", ""), *cols]))
        print("the first sample by each CTA's rank on its SM (by its first warp's slot):")
        print(common.table(case["samples"][0]["by_rank"], rank_cols))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
