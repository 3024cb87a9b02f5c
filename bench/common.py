"""Shared benchmark helpers: timing with CUDA events, copy bandwidth, result files.

Every script prints a table last and writes JSON under bench/results/ (``BENCH_RESULTS``
overrides the directory; the scripts under bench/tuning/ write to bench/tuning/results/,
which git ignores) with the date, the host, the commit measured and, for GPU benchmarks, the
GPU, torch and NVRTC versions; and a copy under ``$OUT`` where that is set.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def commit() -> str:
    """The commit measured: ``BENCH_COMMIT`` where set (a copy of the checkout without its git
    directory, as on a GPU machine the tree was copied to), else ``git rev-parse --short HEAD``
    with ``-dirty`` for uncommitted changes to tracked files, else ``unknown``."""
    import subprocess

    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=BENCH, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()  # fmt: skip

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def results_dir() -> Path:
    """Where :func:`write_results` writes: ``BENCH_RESULTS``, else bench/tuning/results/ for
    a script run from bench/tuning/ (sweeps are scratch work), else bench/results/."""
    if os.environ.get("BENCH_RESULTS"):
        return Path(os.environ["BENCH_RESULTS"])
    script = Path(sys.argv[0]).resolve()
    return script.parent / "results" if script.parent.name == "tuning" else RESULTS


def host_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu_model": cpu,
        "platform": platform.platform(),
        "commit": commit(),
        # how the script was run
        "command": " ".join([f"bench/{Path(sys.argv[0]).name}", *map(shlex.quote, sys.argv[1:])]),
    }


def gpu_info() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    from nvrtc_engine.core import nvrtc

    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "nvrtc": nvrtc.nvrtc_version(),
    }


def result_name(text: str) -> str:
    """The ``--name`` argument's type: a file name for bench/results/NAME.json (``.json`` may be
    given), not a path; argparse's error otherwise."""
    import argparse

    name = text.removesuffix(".json")
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a file name for bench/results/NAME.json, not a path"
        )
    return name


def write_results(
    name: str, payload: dict[str, Any], out_dir: str | None = None, directory: Path | None = None
) -> Path:
    """Write ``payload`` (plus host info) to NAME.json in ``directory`` (default
    :func:`results_dir`) and in ``$OUT`` (or ``out_dir``) where set; returns the first path."""
    payload = {"benchmark": name, **host_info(), **payload}
    directory = directory or results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    text = json.dumps(payload, indent=2, sort_keys=False)
    path.write_text(text + "\n")
    extra = out_dir or os.environ.get("OUT")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        (Path(extra) / f"{name}.json").write_text(text + "\n")
    return path


def torch_or_exit(parser: Any, gpu: bool = True) -> Any:
    """PyTorch, for a bench script that times on the GPU through it (``gpu=False``: a run on
    the CPU); otherwise the script's usage error (``parser.error``: exit code 2) saying what
    to install, or that there is no CUDA GPU."""
    try:
        import torch
    except ImportError:
        parser.error("needs PyTorch" + " and a GPU" * gpu + " (pip install -e '.[test,torch]')")
    if gpu and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (PyTorch sees none)")
    return torch


def cuda_time_ms(
    fn: Callable[[], Any], *, warmup: int = 5, repeat: int = 20, batch: int = 10
) -> float:
    """Milliseconds per ``fn()`` on torch's current stream: the median over ``repeat``
    samples, each a CUDA-event interval around ``batch`` back-to-back calls, divided by
    ``batch``, after ``warmup`` calls. Batching keeps the event records' own cost and any gap
    between launches out of the figure (a 0.1 ms kernel timed alone reads a few percent
    slow)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / batch)
    return statistics.median(times)


def paired_ms(
    fns: dict[Any, Callable[[], Any]], *, rounds: int = 20, repeat: int = 5, batch: int = 10,
    seed: int = 0,
) -> dict[Any, list[float]]:  # fmt: skip
    """Milliseconds per call of each of ``fns``, one figure per round (:func:`cuda_time_ms`
    with ``repeat`` samples of ``batch`` calls). Every round times each function once, in an
    order shuffled per round (``seed``), so that a slow drift of the GPU's speed (seen on
    the shared H200: 4-8 points between minutes) lands on all of them alike. Compare
    candidates round by round (:func:`paired_ratios`), not by their overall medians."""
    import random

    rng = random.Random(seed)
    names = list(fns)
    for name in names:  # warm-up: compile, load, first use
        cuda_time_ms(fns[name], warmup=2, repeat=1, batch=1)
    out: dict[Any, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            out[name].append(cuda_time_ms(fns[name], warmup=1, repeat=repeat, batch=batch))
    return out


def paired_ratios(times: dict[Any, list[float]], baseline: Any) -> dict[Any, dict[str, float]]:
    """Per candidate of :func:`paired_ms`'s ``times``: the median, lowest and highest over
    rounds of (baseline's time / the candidate's time) in the same round (above 1: faster
    than the baseline), and the fraction of rounds it was faster."""
    base = times[baseline]
    out = {}
    for name, ts in times.items():
        ratios = [b / t for b, t in zip(base, ts, strict=True)]
        out[name] = {
            "median": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "faster": sum(r > 1 for r in ratios) / len(ratios),
        }  # fmt: skip
    return out


def fresh_compile(fn: Any, **options: Any) -> Any:
    """``torch.compile(fn, **options)`` after ``torch._dynamo.reset()``: each case compiles
    fresh, as a program that compiles just that op would. Without the reset, closures of one
    function share dynamo's per-code cache, and past its recompile limit (8) the later cases
    silently run eagerly (seen 2026-12-01: srelu's MXFP8 "compiled" timing was eager's)."""
    import torch

    torch._dynamo.reset()
    return torch.compile(fn, **options)


class CopyReference:
    """The reference copy: a torch ``copy_`` of ``size`` bytes (default 1 GiB) between two
    buffers it keeps, so that it can be timed again later (in :func:`paired_ms` rounds beside
    a kernel, or at the end of a run). ``nbytes``: bytes moved per call (read + written)."""

    def __init__(self, size: int = 1 << 30) -> None:
        import torch

        self.src = torch.empty(size, dtype=torch.uint8, device="cuda").random_()
        self.dst = torch.empty_like(self.src)
        self.nbytes = 2 * size

    def call(self) -> None:
        self.dst.copy_(self.src)

    def gbps(self) -> float:
        """Copy bandwidth now (bytes read + written per second, GB/s), timed like every kernel
        (:func:`cuda_time_ms`)."""
        ms = cuda_time_ms(self.call, repeat=20, batch=5)
        return self.nbytes / (ms * 1e-3) / 1e9


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s) of a torch
    ``copy_`` of ``nbytes`` (default 1 GiB), timed like every kernel (:func:`cuda_time_ms`)."""
    return CopyReference(nbytes).gbps()


def paired_pct_of_copy(kernel_ms: list[float], kernel_bytes: int, copy_ms: list[float],
                       copy_bytes: int) -> dict[str, float]:  # fmt: skip
    """A kernel's % of copy bandwidth round by round (:func:`paired_ms` times of the kernel,
    moving ``kernel_bytes`` per call, and of the reference copy, ``copy_bytes`` per call, in
    the same rounds): the median, lowest and highest over the rounds, and the copy's median
    GB/s. Same-round figures leave out the GPU's drift between timings minutes apart."""
    pcts = [100.0 * (kernel_bytes / k) / (copy_bytes / c)
            for k, c in zip(kernel_ms, copy_ms, strict=True)]  # fmt: skip
    copy_gbps = [copy_bytes / (c * 1e-3) / 1e9 for c in copy_ms]
    return {"median": statistics.median(pcts), "low": min(pcts), "high": max(pcts),
            "copy_gbps": statistics.median(copy_gbps)}  # fmt: skip


def memory_only() -> None:
    """Turn the disk cache off for the rest of this process, for builds that their key does
    not describe. An edited source (bench/tuning/source_ab.py) keeps the key's symbols and
    so its digest: the disk cache would hand back the kernel stored under the key instead of
    building it; a forced configuration changes the symbols (another digest) but would fill
    the cache with trial kernels. The scripts also set NVRTC_ENGINE_DISABLE_DISK_CACHE=1
    at import, which only counts where nothing has read the settings yet (a test, or a
    caller that made a kernel first); this counts either way."""
    from nvrtc_engine.core import config

    if not config.settings().disable_disk_cache:
        config.configure(disable_disk_cache=True)


@contextlib.contextmanager
def norm_configured(cfg: Any) -> Iterator[None]:
    """Inside the block every norm key compiles with ``cfg`` (a norm ``ForwardConfig`` or
    ``BackwardConfig``, as given: no TUNED entry or rule changes it), or with its own where
    ``cfg`` is None. The benchmarks' way of building a candidate configuration: compile it on
    a fresh ``Engine``; the disk cache is turned off (:func:`memory_only`)."""
    import nvrtc_engine.families.norm.spec as norm

    if cfg is None:
        yield
        return
    memory_only()
    chosen = norm.norm_config
    norm.norm_config = lambda key: cfg
    try:
        yield
    finally:
        norm.norm_config = chosen


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Format rows as a fixed-width table; columns are (key, header, format spec)."""
    widths = []
    for key, head, spec in columns:
        cells = [format(r[key], spec) if r.get(key) is not None else "-" for r in rows]
        widths.append(max(len(head), *(len(c) for c in cells)) if cells else len(head))
    lines = ["  ".join(h.ljust(w) for (_, h, _), w in zip(columns, widths, strict=False))]
    for r in rows:
        cells = [format(r[k], s) if r.get(k) is not None else "-" for k, _, s in columns]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)))
    return "\n".join(lines)
