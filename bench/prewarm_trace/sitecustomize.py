"""Where a prewarm's time goes, in each process and thread (bench/prewarm.py's tracer).

bench/prewarm.py puts this directory first on ``PYTHONPATH`` and names a directory in
``NVRTC_ENGINE_BENCH_TRACE``; Python then imports this module at start-up in the command's
process and in any process it spawns, and each appends its events to
``<dir>/<pid>.jsonl``, one JSON list per line: ``["process", pid, created]``, then
``[phase, thread, start, end, cpu]`` (``time.time()`` seconds, a clock every process shares;
``cpu``: the thread's CPU seconds in it).
Phases: ``import`` (each import of a module of the package, with what it imports but
without the phases below it: the package imports its modules when they are first used, so
they come in several pieces), ``nvrtc_init`` (the first import of the NVRTC bindings),
``render``, ``compile`` (NVRTC, without the bindings' import), ``store`` and ``lookup`` (the
disk cache's ``put`` and ``get``). ``created`` is the process's start:
``NVRTC_ENGINE_BENCH_T0`` for the command itself (set by the benchmark just before it
starts the command), else the kernel's record of it (``/proc/self/stat``, 10 ms steps).
Without ``NVRTC_ENGINE_BENCH_TRACE`` this module does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

_DIR = os.environ.get("NVRTC_ENGINE_BENCH_TRACE")
_local = threading.local()


def _created() -> float:
    given = os.environ.pop("NVRTC_ENGINE_BENCH_T0", None)  # (so children do not inherit it)
    if given:
        return float(given)
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: start time
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def _emit(event: list[Any]) -> None:
    line = json.dumps(event) + "\n"
    with open(os.path.join(_DIR or "", f"{os.getpid()}.jsonl"), "a") as f:
        f.write(line)


def _timed(phase: str, func: Any, once: bool = False) -> Any:
    """``func`` recording its calls as ``phase`` (exclusive of the traced calls inside it);
    ``once``: only the first call of the process."""
    done: list[bool] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if once and done:
            return func(*args, **kwargs)
        done.append(True)
        stack = _local.__dict__.setdefault("stack", [])
        stack.append([0.0, 0.0])
        start, cpu = time.time(), time.thread_time()
        try:
            return func(*args, **kwargs)
        finally:
            end, used = time.time() - start, time.thread_time() - cpu
            inner = stack.pop()
            if stack:
                stack[-1][0] += end
                stack[-1][1] += used
            _emit([phase, threading.get_ident(), start, start + end - inner[0], used - inner[1]])

    wrapper.__wrapped__ = func
    return wrapper


def _patch(name: str, module: Any) -> None:
    name = name.replace(".core.", ".")  # (also the layout before core/: bench/prewarm.py --code)
    if name == "nvrtc_engine.nvrtc":
        module._nvrtc = _timed("nvrtc_init", module._nvrtc, once=True)
        module.compile_source = _timed("compile", module.compile_source)
    elif name == "nvrtc_engine.render":
        module.render = _timed("render", module.render)
    elif name in ("nvrtc_engine.tiers", "nvrtc_engine.cache"):
        disk = getattr(module, "DiskTier", None) or getattr(module, "DiskCache", None)
        if disk is not None:
            disk.put = _timed("store", disk.put)
            disk.get = _timed("lookup", disk.get)


class _Finder:
    """Times the import of each of the package's modules and patches the modules named in
    :func:`_patch` as soon as they have run (before any other module imports names from
    them)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "nvrtc_engine" and not name.startswith("nvrtc_engine."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, run = spec.loader, _timed("import", spec.loader.exec_module)

        def exec_module(module: Any) -> None:
            run(module)
            _patch(name, module)

        loader.exec_module = exec_module
        return spec


if _DIR:
    _emit(["process", os.getpid(), _created()])
    sys.meta_path.insert(0, _Finder())
