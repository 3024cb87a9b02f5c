"""Prewarm: make a model's kernels ready at start-up, compiling the missing ones in parallel.

    >>> from nvrtc_engine.prewarm import prewarm
    >>> report = prewarm("llama3_8b_fp8_mlp.toml", arch="sm_90")
    >>> print(report.summary())

Kernels already in memory or on disk are loaded here (verified) and kept in memory. The
others compile in worker *processes* (measured for issue 6: threads gave no speed-up once
CUDA headers were included, processes did), started with ``spawn`` so that they inherit
nothing from this process: no CUDA state, no locks, and they do not run the calling script
again. Workers render, compile and store; they never touch the GPU. Their images come back
to this process's memory cache, so later :func:`~nvrtc_engine.get_kernel` calls are
dictionary lookups, even with the disk cache off.

The number of workers defaults to the number of kernels to compile, capped by the CPUs this
process may use (:func:`~nvrtc_engine.cpus.available_cpus`: affinity mask and cgroup quota);
``NVRTC_ENGINE_WORKERS`` or ``workers=`` override it. With one worker, or one kernel to
compile, the compile runs in this process (starting a worker costs more than it saves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import sys
import time
import types
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import config, nvrtc
from .cpus import available_cpus
from .engine import default_engine
from .errors import ArgumentError, ArgumentTypeError, CacheWarning, CompileError, counted
from .kernel import Artifact
from .key import KernelKey

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

__all__ = ["PrewarmFailure", "PrewarmReport", "default_workers", "prewarm"]


@dataclass(frozen=True)
class PrewarmFailure:
    """A variant that could not be built: its ``key``, ``error`` (the first NVRTC error line
    for a compile error, else ``"ExceptionName: message"``) and ``exception`` (class name)."""

    key: KernelKey
    error: str
    exception: str


@dataclass(frozen=True)
class PrewarmReport:
    """What :func:`prewarm` did.

    Attributes:
        compiled: keys compiled by this call (in a worker or here), in input order.
        cached: keys that were already in memory or on disk (or that another process
            compiled meanwhile), in input order.
        failed: :class:`PrewarmFailure` for each key that could not be built.
        wall_s: wall-clock seconds of the whole call.
        median_compile_ms: median NVRTC time of the compiled keys (``None`` if none).
        workers: worker processes started (0: none needed or compiled in this process).
    """

    compiled: tuple[KernelKey, ...]
    cached: tuple[KernelKey, ...]
    failed: tuple[PrewarmFailure, ...]
    wall_s: float
    median_compile_ms: float | None
    workers: int

    @property
    def ok(self) -> bool:
        """``True`` when no variant failed."""
        return not self.failed

    @property
    def total(self) -> int:
        return len(self.compiled) + len(self.cached) + len(self.failed)

    def summary(self) -> str:
        """A few lines for people: counts, time, and one line per failure."""
        median = (
            f", median compile {self.median_compile_ms:.1f} ms"
            if self.median_compile_ms is not None
            else ""
        )
        workers = counted(self.workers, "worker process", "worker processes")
        where = workers if self.workers else "in this process"
        lines = [
            f"prewarm: {counted(self.total, 'variant')}: {len(self.compiled)} compiled, "
            f"{len(self.cached)} already cached, {len(self.failed)} failed in "
            f"{self.wall_s:.2f} s ({where}{median})"
        ]
        lines += [f"  FAILED {f.key}: {f.error}" for f in self.failed]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able values (keys as canonical names)."""
        return {
            "compiled": [str(k) for k in self.compiled],
            "cached": [str(k) for k in self.cached],
            "failed": [
                {"key": str(f.key), "error": f.error, "exception": f.exception} for f in self.failed
            ],
            "wall_s": self.wall_s,
            "median_compile_ms": self.median_compile_ms,
            "workers": self.workers,
        }


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CompileError):
        return exc.first_error or str(exc).splitlines()[0]
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def default_workers(to_compile: int) -> int:
    """Worker processes for ``to_compile`` kernels: ``NVRTC_ENGINE_WORKERS`` if set, else
    the CPUs this process may use; never more than ``to_compile``."""
    if to_compile <= 0:
        return 0
    configured = config.settings().workers
    return min(to_compile, configured if configured is not None else available_cpus())


# -- worker side (spawned processes) ----------------------------------------------------


def _worker_init(settings: config.Settings) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    warnings.simplefilter("ignore", CacheWarning)  # the parent warns once
    warnings.filterwarnings("ignore", message=nvrtc.DEBUG_DIR_WARNING, category=RuntimeWarning)
    config.configure(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)})


_Outcome = tuple[KernelKey, Artifact | None, str, str | None, str | None]


def _build_one(key: KernelKey) -> _Outcome:
    """Render, compile (unless on disk) and store one key; never raises, never uses the GPU.
    Runs in a worker process, or in the caller's with one worker."""
    try:
        artifact, origin = default_engine().build_artifact(key)
        return key, artifact, origin, None, None
    except Exception as exc:
        return key, None, "failed", _describe(exc), type(exc).__name__


def _current_device_arch() -> str:
    from .api import _device_arch

    return _device_arch(None)


# -- parent side --------------------------------------------------------------------------


@contextlib.contextmanager
def _without_main_module() -> Iterator[None]:
    """While workers start, hide ``__main__`` from ``spawn``: otherwise each worker imports
    the caller's script again, which may initialize CUDA, load a model, or call prewarm."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main
        else:
            del sys.modules["__main__"]


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    # imported here: a warm start that compiles nothing never pays for them
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(config.settings(),),
    )


def _default_arch() -> str:
    """The current GPU's arch, without initializing CUDA in this process if it is not yet:
    a process that initialized CUDA cannot use it in fork()ed children."""
    from . import driver

    torch = sys.modules.get("torch")
    if getattr(driver, "_init_pid", None) == os.getpid() or (
        torch is not None and torch.cuda.is_initialized()
    ):
        return _current_device_arch()
    pool = _spawn_pool(1)
    try:
        with _without_main_module():
            future = pool.submit(_current_device_arch)
        return future.result()
    finally:
        pool.shutdown(wait=True)


def _build_here(keys: Sequence[KernelKey]) -> Iterator[_Outcome]:
    for key in keys:
        yield _build_one(key)


def _build_in_workers(keys: Sequence[KernelKey], workers: int) -> Iterator[_Outcome]:
    from concurrent.futures import as_completed

    pool = _spawn_pool(workers)
    try:
        with _without_main_module():
            futures = {pool.submit(_build_one, key): key for key in keys}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:  # a worker died (killed, out of memory)
                why = f"worker process failed: {_describe(exc)}"
                yield futures[future], None, "failed", why, type(exc).__name__
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled or total == 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="prewarm", unit="kernel", file=sys.stderr, leave=False)


def prewarm(
    variants: Any,
    *,
    arch: str | int | Sequence[str | int] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> PrewarmReport:
    """Make every variant's kernel ready in this process: from memory, disk, or compiled.

    Args:
        variants: a TOML/JSON variant file (path: ``str`` or ``os.PathLike``), or a list
            (any iterable) of :class:`~nvrtc_engine.KernelKey`, entry dicts (list-valued
            fields expand to their cross product; an empty list is an error), canonical
            kernel names and variant files (``os.PathLike`` paths such as
            ``pathlib.Path``; a ``str`` in a list is a kernel name): several files are
            ``prewarm([Path("a.toml"), Path("b.toml")])``. See ``docs/variants.md``. A single
            variant goes in a list: ``prewarm([{"op": "gelu", ...}])``.
        arch: compile for this arch (or each of these archs), replacing the variants' own.
            Default: each variant's arch, else the current GPU's (read without initializing
            CUDA here, so fork()ed children can still use CUDA).
        workers: worker processes for the compiles, an int >= 1 (numpy's too; default:
            :func:`default_workers`).
        progress: show a progress bar (only when stderr is a terminal).

    Returns a :class:`PrewarmReport`. A variant that fails (NVRTC error, missing CUDA
    headers) is reported there and does not stop the others. Afterwards every built kernel
    is in this process's memory cache. An empty list is nothing to do (an empty report); a
    variant *file* with no variants is an error, as a file that says nothing is most likely
    a mistake (docs/variants.md).

    Raises :class:`~nvrtc_engine.variants.VariantListError` /
    :class:`~nvrtc_engine.VariantError` for a bad variant list or ``arch`` (before compiling
    anything; :class:`~nvrtc_engine.VariantTypeError` for an arch of the wrong type, as
    ``get_kernel``), :class:`~nvrtc_engine.ArgumentTypeError` for ``variants`` that are
    neither a path nor a list (``None``, bytes, a single dict) and for ``workers`` that is not
    an int (a ``TypeError``), :class:`~nvrtc_engine.ArgumentError` for ``workers`` outside 1
    to :data:`~nvrtc_engine.config.MAX_WORKERS` (1024, as the command line's; a
    ``ValueError``), :class:`~nvrtc_engine.NoDeviceError` when an arch is needed from a GPU
    and there is none.
    """
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, numbers.Integral):
            raise ArgumentTypeError("workers", f"must be an int >= 1 or None, got {workers!r}")
        if not 1 <= workers <= config.MAX_WORKERS:
            raise ArgumentError("workers", f"must be 1 to {config.MAX_WORKERS} (or None for the "
                                f"default), got {workers}")  # fmt: skip
        workers = int(workers)
    from .variants import resolve_variants  # (imported here: package import stays light)

    config.settings()  # a malformed environment variable is one ValueError, not N failures
    start = time.perf_counter()
    keys = resolve_variants(variants, arch=arch, default_arch=_default_arch)
    order = {key: i for i, key in enumerate(keys)}
    engine = default_engine()
    cached: list[KernelKey] = []
    compiled: list[KernelKey] = []
    failed: list[PrewarmFailure] = []
    todo: list[KernelKey] = []
    for key in keys:
        try:
            (cached if engine.cached(key) is not None else todo).append(key)
        except Exception as exc:  # rendering or CUDA header discovery failed
            failed.append(PrewarmFailure(key, _describe(exc), type(exc).__name__))
    count = min(workers, len(todo)) if workers is not None else default_workers(len(todo))
    in_workers = count > 1
    if in_workers and config.settings().dump_source:
        nvrtc.check_debug_dir()  # the workers do not warn: this process does, once
    outcomes = _build_in_workers(todo, count) if in_workers else _build_here(todo)
    compile_ms: list[float] = []
    bar = _progress_bar(len(todo), progress)
    try:
        for key, artifact, origin, error, exception in outcomes:
            if bar is not None:
                bar.update(1)
            if artifact is None:
                failed.append(PrewarmFailure(key, error or "", exception or ""))
                continue
            engine.adopt(key, artifact, origin)
            if origin == "compiled":
                compiled.append(key)
                compile_ms.append(artifact.compile_ms)
                if in_workers:  # count the workers' compiles as this process's
                    engine.misses += 1
                    engine.compiles += 1
            else:
                cached.append(key)
                if in_workers:
                    engine.disk_hits += 1
    finally:
        if bar is not None:
            bar.close()
    import statistics

    return PrewarmReport(
        compiled=tuple(sorted(compiled, key=order.__getitem__)),
        cached=tuple(sorted(cached, key=order.__getitem__)),
        failed=tuple(sorted(failed, key=lambda f: order[f.key])),
        wall_s=time.perf_counter() - start,
        median_compile_ms=statistics.median(compile_ms) if compile_ms else None,
        workers=count if in_workers else 0,
    )
