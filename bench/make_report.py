"""Write the tables of docs/performance.md (between ``<!-- bench:NAME -->`` and ``<!--
/bench:NAME -->``, see BLOCKS) and its plot from bench/results/: ``python bench/make_report.py
[--check] [--no-plot]``. ``--check``: exit 1 where the page is out of date, writing nothing.
The plot (docs/img/bandwidth.png) needs matplotlib (``pip install -e '.[bench]'``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "img" / "bandwidth.png"
BLOCK = re.compile(r"(<!-- bench:(\w+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)
NORM_OTHERS = ("nvrtc_engine general", "torch eager", "torch eager autograd", "torch.compile")
PHASES = ("start", "import", "nvrtc_init", "render", "compile", "store")  # bench/prewarm.py's
PREWARM_ROWS = ["host (load average)", "date, commit", "compiled by", "sum of single compiles",
                "cold: the prewarm call (/ sum of single compiles)", "cold: the whole command",
                "warm: the whole command (median)", "N threads against 1: speed-up (CPU / wall)",
                *(f"phase {p}, ms: sum (largest share)" for p in PHASES)]  # fmt: skip


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def pct(value: float | None, spec: str = ".1f", unit: str = "%") -> str:
    return "-" if value is None else format(value, spec) + unit


def of_copy(gbps: float | None, copy: float) -> str:
    return pct(None if gbps is None else 100 * gbps / copy)


def grouped(rows: list[dict[str, Any]], *fields: str) -> dict[tuple, dict[str, dict]]:  # by impl
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[f] for f in fields), {})[r["impl"]] = r
    return out


def timing(r: dict[str, Any]) -> list[str]:  # us, GB/s and % of copy of a row
    return [f"{r['ms'] * 1e3:.0f}" if r.get("ms") else "-",
            f"{r['gbps']:.0f}" if r.get("gbps") else "-", pct(r.get("pct_of_copy"))]  # fmt: skip


def run_line(d: dict[str, Any], name: str) -> str:  # where, when and on what code
    arch = f"sm_{d.get('capability', '').replace('.', '')}"
    where = (f"{d['gpu']} ({arch}, {d['sm_count']} SMs), torch {d['torch']}, NVRTC {d['nvrtc']}"
             if "gpu" in d else f"{d['cpus']} CPUs ({d['cpu_model']})")  # fmt: skip
    copy = f"; device copy {d['copy_gbps']:.0f} GB/s" if "copy_gbps" in d else ""
    if "copy_gbps_end" in d:
        copy += f" ({d['copy_gbps_end']:.0f} at the end of the run)"
    return (f"Measured on {where}, {d['date'][:10]}, commit {d['commit']}{copy}. "
            f"Data: `bench/results/{name}.json`.")  # fmt: skip


def activation() -> list[str]:
    if (d := load("activation_bandwidth")) is None:
        return []
    copy = d["copy_gbps"]
    rows = [[r["op"], r["output"], f"{r['engine_ms'] * 1e3:.0f}", f"{r['engine_gbps']:.0f}",
             pct(r["engine_pct_of_copy"]), of_copy(r.get("eager_gbps"), copy),
             of_copy(r.get("compile_gbps"), copy), pct(r.get("speedup_vs_compile"), ".2f", "x")]
            for r in d["rows"] if "engine_ms" in r]  # fmt: skip
    shape = "x".join(map(str, d["shape"]))
    head = ["op", "output", "us", "GB/s", "% of copy", "eager, % of copy",
            "torch.compile, % of copy", "x torch.compile"]  # fmt: skip
    return [f"{run_line(d, 'activation_bandwidth')} Input {shape} bf16 (gated ops: twice the "
            f"hidden size); {d['kernels']} kernels.", table(head, rows)]  # fmt: skip


def norm() -> list[str]:
    if (d := load("norm_bandwidth")) is None:
        return []
    rows = []
    for (nm, case, n, h), impl in grouped(d["rows"], "norm", "case", "tokens", "hidden").items():
        k = impl.get("nvrtc_engine specialized", {})
        won = k.get("faster_than_compile")
        paired = pct(k.get("vs_compile_paired"), ".2f", "x") + ("" if won is None
                                                                else f" ({won:.2f})")  # fmt: skip
        others = [of_copy(impl.get(name, {}).get("gbps"), d["copy_gbps"]) for name in NORM_OTHERS]
        rows.append([nm, case, f"{n}x{h}", *timing(k), pct(k.get("pct_of_copy_paired")),
                     *others, paired])  # fmt: skip
    head = ["norm", "pass", "N x H", "us", "GB/s", "% of copy", "% of copy, paired",
            "general kernel, % of copy", "eager, % of copy", "eager autograd, % of copy",
            "torch.compile, % of copy", "x torch.compile, paired (won)"]  # fmt: skip
    return [f"{run_line(d, 'norm_bandwidth')} bf16 input; {d['repeat']} samples per "
            f"timing, {d['paired_rounds']} paired rounds.", table(head, rows)]  # fmt: skip


def cast() -> list[str]:
    if (d := load("cast_bandwidth")) is None:
        return []
    rows = [[*case, *timing(impl.get("nvrtc_engine", {})),
             *(of_copy(impl.get(i, {}).get("gbps"), d["copy_gbps"])
               for i in ("torch eager", "torch.compile")),
             pct(impl.get("nvrtc_engine", {}).get("x_vs_compile"), ".2f", "x")]
            for case, impl in grouped(d["kernels"], "shape", "case").items()]  # fmt: skip
    head = ["shape", "case", "us", "GB/s", "% of copy", "eager, % of copy",
            "torch.compile, % of copy", "x torch.compile"]  # fmt: skip
    out = [f"{run_line(d, 'cast_bandwidth')} bf16 input.", table(head, rows)]
    name = "cast_bandwidth" if any("x_vs_compile_paired" in r for r in d["kernels"]) else (
        "cast_bandwidth-paired")  # fmt: skip
    if (p := load(name)) is None:
        return out
    pairs = [[r["shape"], r["case"], f"{r['x_vs_compile_paired']:.3f}x",
              f"{r['paired_low']:.3f}-{r['paired_high']:.3f}", "{} of {}".format(sum(
                  c / o >= 2 for o, c in zip(r["paired_ms"]["ours"], r["paired_ms"]["compile"],
                                             strict=True)), r["paired_rounds"])]
             for r in p["kernels"] if "x_vs_compile_paired" in r]  # fmt: skip
    return [*out, f"The kernel against torch.compile in {p['paired_rounds']} paired rounds "
            f"(median of the same-round ratios). {run_line(p, name)}",
            table(["shape", "case", "x torch.compile, paired", "rounds, low-high",
                   "rounds at 2x or more"], pairs)]  # fmt: skip


def launch() -> list[str]:
    if (d := load("launch_overhead")) is None:
        return []
    shown = [r for r in d["rows"] if not r["case"].endswith("runs of 200")]  # (JSON: all)
    rows = [[r["case"], f"{r['us']:.2f}", f"{r['min_us']:.2f}"] for r in shown]
    met = "; ".join(f"{t['engine']} at most {t['torch']}: {('missed', 'met')[t['met']]}"
                    for t in d.get("targets", []))  # fmt: skip
    return [f"{run_line(d, 'launch_overhead')} Kernel {d['kernel']}, x of "
            f"{'x'.join(map(str, d['shape']))} bf16. Targets: {met or '-'}.",
            table(["call", f"us per call, median of {d['rounds']} rounds of {d['calls']}",
                   "least round, us"], rows)]  # fmt: skip


def compile_latency() -> list[str]:
    runs = [(f.stem, json.loads(f.read_text())) for f in sorted(RESULTS.glob("compile_lat*.json"))]
    rows = [[n.removeprefix("compile_latency-"), f"{d['cpus']} x {d['cpu_model']}", d["nvrtc"],
             f"{d['first_compile_wall_ms']:.0f}", f"{d['cold_compile_nvrtc_median_ms']:.1f}",
             f"{d['warm_import_ms']:.0f}", f"{d['warm_first_get_kernel_ms']:.1f}",
             f"{d['warm_disk_hit_median_ms']:.2f}", f"{d['memory_get_kernel_us']:.2f}",
             d["date"][:10], d["commit"]] for n, d in runs]  # fmt: skip
    head = ["host", "CPUs", "NVRTC", "first compile ms", "cold compile ms, median",
            "new process: import ms", "first get_kernel ms", "disk hit ms per key",
            "memory hit us", "date", "commit"]  # fmt: skip
    out = [f"Data: {', '.join(f'`bench/results/{n}.json`' for n, _ in runs)}.", table(head, rows)]
    runs = [(n, d) for n in ("cache_lookup", "cache_lookup-before") if (d := load(n))]
    if runs:  # bench/cache_lookup.py: a new process gets a prewarmed list from the disk cache
        c = runs[0][1]
        before = "; `--code` at the commit named: `bench/results/cache_lookup-before.json`"
        out += [f"{run_line(c, 'cache_lookup')} {len(c['variants'])} prewarmed variants"
                f"{before if len(runs) > 1 else ''}:", table(
            ["code", "API import ms", "keys parsed ms", "lookups ms", "after the import ms",
             "its range ms", "total ms", "compiles", "renders", "load average"],
            [[d["commit"], f"{s['import_ms']:.1f}", f"{s['keys_ms']:.1f}", f"{s['lookup_ms']:.1f}",
              f"{s['after_import_ms']:.1f}",
              "-".join(f"{v:.1f}" for v in s["after_import_ms_range"]), f"{s['total_ms']:.1f}",
              s["compiles"], s["renders"], f"{d['load_average'][0]:.1f}"]
             for _, d in runs for s in [d["summary"]]])]  # fmt: skip
    return out


def prewarm() -> list[str]:
    runs = [(f.stem, json.loads(f.read_text())) for f in sorted(RESULTS.glob("prewarm-*.json"))]
    cols = []
    for _, d in runs:
        c, tr, s = d["cold"], d["cold"]["trace"], d["single"]
        cols.append([f"{d['cpus']} x {d['cpu_model']} ({d['load_average'][0]:.1f})",
                     f"{d['date'][:10]}, {d['commit']}", c["compiled_by"],
                     f"{s['sum_single_s']:.2f} s", f"{c['prewarm_s']:.2f} s ("
                     f"{c['x_sum_single']:.2f}x)", f"{c['command_s']:.2f} s",
                     f"{d['warm']['command_ms']:.0f} ms",
                     f"{s['speedup']:.2f}x ({s['cpu_per_wall']:.2f})", *(f"{tr['phases_ms'][p]:.0f}"
                     f" ({tr['phases_max_ms'][p]:.0f})" for p in PHASES)])  # fmt: skip
    rows = [[label, *cells] for label, *cells in zip(PREWARM_ROWS, *cols, strict=True)]
    data = ", ".join(f"`bench/results/{n}.json`" for n, _ in runs)
    head = ["", *(n.removeprefix("prewarm-") for n, _ in runs)]
    return [f"Data: {data}; variants: `{runs[0][1]['list']}`.", table(head, rows)] if runs else []


def fanout() -> list[str]:
    if (d := load("fanout")) is None:
        return []
    rows = [["variants", f"{d['variants']} ({'+'.join(d['ops'])}, 3 input x 5 output dtypes, "
             f"{len(d['hidden_sizes']) + 1} hidden sizes, {d['arch']})"],
            [f"nvcc {d['nvcc_version']}, one translation unit", f"{d['nvcc_wall_s']:.1f} s"],
            [f"NVRTC {d['nvrtc_version']}, variant by variant", f"{d['nvrtc_total_s']:.1f} s"],
            ["cubin bytes (nvcc / NVRTC)", f"{d['nvcc_cubin_bytes']} / {d['nvrtc_cubin_bytes']}"],
            [f"one model's variants ({', '.join(d['model'])})",
             f"{d['model_nvrtc_s'] * 1e3:.0f} ms, {d['model_cubin_bytes']} bytes"],
            ["the model's compile time, % of the nvcc fan-out", f"{d['model_pct_of_nvcc']:.2f}%"],
            ["this project's wheel", f"{d['wheel_bytes']} bytes"]]  # fmt: skip
    rows += d.get("beside_te", [])  # TE's build beside a model's cold prewarm (fanout.py)
    return [run_line(d, "fanout"), table(["measure", "value"], rows)]


def fleet() -> list[str]:  # (bench/fleet.py writes its table's cells)
    return [f"{run_line(d, 'fleet')} {d['caption']}", table(d["head"], d["rows"])] if (
        d := load("fleet")) else []  # fmt: skip


def torch_block() -> list[str]:
    if (d := load("torch_block")) is None:
        return []
    g, impls = d["groups"], ["torch eager", "torch.compile", "engine", "engine compiled"]
    rows = [[n, *(f"{g[n]['ms'][i]:.3f} ({g[n]['ratio_to_compile'][i]:.3f}x)" if i in g[n]["ms"]
                  else "-" for i in impls)] for n in ("step", "norm_act", "fp8")]  # fmt: skip
    host = ", ".join(f"{k} {v:.1f} us" for k, v in g["host"]["us"].items())
    # bench/torch_block.py's FLOOR and STEP_FLOOR cases (reference rows, not targets)
    for part, floor in {"step": "GEMMs, free norm and act", "norm_act": "copy, same bytes"}.items():
        if floor in g[part]["ms"]:
            ms, x = g[part]["ms"][floor], g[part]["ratio_to_compile"][floor]
            rows.append([f"{part}: {floor}", "-", "-", f"{ms:.3f} ({x:.3f}x)", "-"])
    least = ", ".join(f"{part} {x:.3f}x" for part, x in d.get("floors", {}).items())
    met = ", ".join(f"{t['group']} {t['case']} {t['ratio']:.3f}x (at most {t['at_most']}x): "
                    f"{('missed', 'met')[t['met']]}" for t in d["targets"])  # fmt: skip
    return [
        f"{run_line(d, 'torch_block')} Tokens {d['tokens']}, hidden {d['hidden']}, inter"
        f"mediate {d['inter']}, {d['dtype']}; ms (x torch.compile).",
        table(["part", *impls], rows),
        f"Host time per eager call: {host}.",
        f"Targets: {met}.",
    ] + ([f"Floors (norm and activation at the copy's time): {least}."] if least else [])


def cross_nvrtc() -> list[str]:
    if (d := load("cross_nvrtc")) is None:
        return []
    got = "; ".join(f"{p['phase']}: {sum(p['origins'].values())} loaded, {p['compiles']} compiles"
                    for p in d["phases"])  # fmt: skip
    checks = ("failed", "passed")[d["demo_rc"] == 0]
    return [f"{run_line(d, 'cross_nvrtc')} {d['imported']} kernels built by NVRTC "
            f"{d['nvrtc_bundle']} on the 2-CPU machine, under NVRTC {d['nvrtc_here']} with "
            f"`--any-nvrtc`: {got}; demo checks {checks}."]  # fmt: skip


BLOCKS: dict[str, Callable[[], list[str]]] = {"activation": activation, "norm": norm,
    "cast": cast, "launch": launch, "compile": compile_latency, "prewarm": prewarm,
    "fanout": fanout, "fleet": fleet,
    "torch": torch_block, "cross_nvrtc": cross_nvrtc}  # fmt: skip


def render(page: str) -> str:
    """``page`` with each bench block's content replaced by its tables."""

    def fill(m: re.Match[str]) -> str:
        parts = BLOCKS[m.group(2)]() or [f"_No results for {m.group(2)} in bench/results._"]
        return m.group(1) + "\n" + "\n\n".join(parts) + "\n\n" + m.group(4)

    found = {m.group(2) for m in BLOCK.finditer(page)}
    if found != set(BLOCKS):
        raise SystemExit(f"{PAGE}: bench blocks {sorted(found)}, want one each of {list(BLOCKS)}")
    return BLOCK.sub(fill, page)


def plot(path: Path = PLOT) -> bool:
    """Each family's kernels at one shape against the device copy, torch eager and
    torch.compile, in % of copy; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # (the bench extra)
        return False
    act, nrm, cst = load("activation_bandwidth"), load("norm_bandwidth"), load("cast_bandwidth")
    bars = [(f"{r['op']} {r['output']}", *(100 * (r.get(f"{i}_gbps") or 0) / act["copy_gbps"]
                                           for i in ("engine", "compile", "eager")))
            for r in (act or {}).get("rows", []) if "engine_gbps" in r
            and r["op"] in ("gelu", "swiglu", "dgelu", "dswiglu")]  # fmt: skip
    norms = grouped([r for r in (nrm or {}).get("rows", []) if r["hidden"] == 8192], "norm", "case")
    casts = grouped([r for r in (cst or {}).get("kernels", []) if r["shape"] == "16384x8192"],
                    "case")  # fmt: skip
    for label, ours, impl in [*((f"{n} {c} H=8192", "nvrtc_engine specialized", i) for (n, c), i
                                in norms.items()), *((c, "nvrtc_engine", i) for (c,), i
                                                     in casts.items())]:  # fmt: skip
        bars.append((label, *(impl.get(k, {}).get("pct_of_copy") or 0
                              for k in (ours, "torch.compile", "torch eager"))))  # fmt: skip
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(bars) + 1.5))
    y = range(len(bars))
    for i, name in enumerate(("nvrtc_engine", "torch.compile", "torch eager")):
        ax.barh([j + 0.27 * (i - 1) for j in y], [b[i + 1] for b in bars], height=0.27, label=name)
    ax.axvline(100, color="black", linestyle="--", label="device copy")
    ax.set_yticks(list(y), [b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"% of device copy bandwidth ({(act or nrm or cst or {}).get('gpu', 'GPU')})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    return fig.savefig(path, dpi=110) or True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    parser.add_argument("--no-plot", action="store_true", help="leave docs/img alone")
    args = parser.parse_args(argv)
    page, new = PAGE.read_text(), render(PAGE.read_text())
    print(f"{PAGE.relative_to(ROOT)}: {'up to date' if new == page else 'out of date'}")
    if args.check:
        return int(new != page)
    PAGE.write_text(new)
    if not args.no_plot:
        print(f"wrote {PLOT.relative_to(ROOT)}" if plot() else "no matplotlib: plot not written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
