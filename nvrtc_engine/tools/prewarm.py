"""Prewarm: make a model's kernels ready at start-up, compiling the missing ones in parallel.

    >>> from nvrtc_engine import prewarm
    >>> report = prewarm("llama3_8b_fp8_mlp.toml", arch="sm_90")
    >>> print(report.summary())

Kernels already in memory or in a cache tier are loaded here (verified) and kept in memory. The
others compile on a pool of *threads* of this process, each building a kernel as
:func:`~nvrtc_engine.get_kernel` does (:meth:`~nvrtc_engine.core.engine.Engine.get`: tiers, the
per-digest file lock, render, NVRTC, store), so every kernel ends in this process's memory
cache; with ``memory=False`` (the command line's) as
:meth:`~nvrtc_engine.core.engine.Engine.build_artifact` does, keeping none. NVRTC compiles
without Python's GIL and its compiles run in parallel across threads; the threads share one
interpreter, one NVRTC initialization and one set of parsed templates, each of which a worker
process paid for again (``bench/prewarm.py`` measures both; the figures are in
docs/performance.md). NVRTC loads and initializes the CUDA driver in the process that compiles:
worker processes that use CUDA after a prewarm start with ``spawn``.

The number of threads defaults to the number of kernels to compile, capped by the CPUs this
process may use (:func:`~nvrtc_engine.core.cpus.available_cpus`: affinity mask and cgroup quota);
``NVRTC_ENGINE_WORKERS`` or ``workers=`` override it. With one, the compiles run in the
calling thread. With more kernels than threads, the longest compiles start first (estimated
by the length of the rendered source), so that no long compile starts last.
"""

from __future__ import annotations

import numbers
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core import cache, config
from ..core.cpus import available_cpus
from ..core.engine import default_engine
from ..core.errors import ArgumentError, ArgumentTypeError, CompileError, counted
from ..core.key import KernelKey, arch_number

if TYPE_CHECKING:
    from ..core.engine import Engine
    from ..core.kernel import Artifact

__all__ = ["PrewarmFailure", "PrewarmReport", "default_workers", "prewarm"]


class PrewarmFailure(NamedTuple):
    """A variant that could not be built: its ``key``, ``error`` (the first NVRTC error line
    for a compile error, else ``"ExceptionName: message"``) and ``exception`` (class name)."""

    key: KernelKey
    error: str
    exception: str


class PrewarmReport(NamedTuple):
    """What :func:`prewarm` did.

    Attributes:
        compiled: keys compiled by this call, in input order.
        cached: keys that were already in memory or on disk (or that another process
            compiled meanwhile), in input order.
        failed: :class:`PrewarmFailure` for each key that could not be built.
        wall_s: wall-clock seconds of the whole call.
        median_compile_ms: median NVRTC time of the compiled keys (``None`` if none).
        workers: compile threads started (0: none needed, or compiled in the calling thread).
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
        how: list[str] = []
        if self.median_compile_ms is not None:  # (something was compiled)
            how += [counted(self.workers, "thread") if self.workers else "in the calling thread",
                    f"median compile {self.median_compile_ms:.1f} ms"]  # fmt: skip
        archs = {k.arch for k in (*self.compiled, *self.cached)}
        if archs:  # (--arch replaces a file's archs: say which were built)
            how.append(", ".join(sorted(archs, key=lambda a: (arch_number(a), a))))
        lines = [
            f"prewarm: {counted(self.total, 'variant')}: {len(self.compiled)} compiled, "
            f"{len(self.cached)} already cached, {len(self.failed)} failed in "
            f"{self.wall_s:.2f} s" + (f" ({'; '.join(how)})" if how else "")
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
    """Compile threads for ``to_compile`` kernels: ``NVRTC_ENGINE_WORKERS`` if set, else
    the CPUs this process may use; never more than ``to_compile``."""
    if to_compile <= 0:
        return 0
    configured = config.settings().workers
    return min(to_compile, configured if configured is not None else available_cpus())


# a key; its artifact and origin ("compiled", "disk"...), or why it failed (error, exception)
_Outcome = tuple[KernelKey, "Artifact | None", str, str | None, str | None]


def _build(engine: Engine, key: KernelKey, memory: bool) -> _Outcome:
    """``key``'s kernel as get_kernel builds it (into ``engine``'s memory cache), or without
    ``memory`` its artifact (from a tier, else compiled and stored: no kernel object), or the
    reason it failed; never raises. Runs in a compile thread, or in the caller's."""
    try:
        if memory:
            kernel = engine.get(key)
            return key, kernel.artifact, kernel.origin, None, None
        return key, *engine.build_artifact(key), None, None
    except Exception as exc:
        return key, None, "", _describe(exc), type(exc).__name__


def _stored(engine: Engine, key: KernelKey) -> bool:
    """Whether the disk cache holds an entry for ``key`` (not yet verified: its build
    does that, and compiles a bad one again)."""
    disk = engine.tiers().disk
    return disk is not None and cache.digest(key) in disk


def _render_size(key: KernelKey) -> int:
    from ..core.render import render

    try:
        return len(render(key).source)
    except Exception:  # the build reports it
        return 0


def _longest_first(keys: Sequence[KernelKey]) -> list[KernelKey]:
    """``keys`` ordered by estimated compile time, longest first: by the length of the
    rendered source, which NVRTC's time follows (on the 2-core machine 0.1 s for a 7.4 kB
    activation backward, 0.3 s for a 19.6 kB MXFP8 quantize). Each template is parsed here
    once; the builds' own renders find it parsed (0.1 ms)."""
    sizes = {key: _render_size(key) for key in keys}
    return sorted(keys, key=lambda k: -sizes[k])


def _build_in_threads(
    engine: Engine, keys: Sequence[KernelKey], threads: int, memory: bool
) -> Iterator[_Outcome]:
    """The outcomes of ``keys`` built by ``threads`` threads, each taking the next key (longest
    first) until none is left, in the order they finish."""
    import collections
    import queue

    todo = collections.deque(_longest_first(keys) if len(keys) > threads else keys)
    done: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()

    def work() -> None:
        try:
            while True:
                try:
                    key = todo.popleft()
                except IndexError:  # none left
                    return
                done.put(_build(engine, key, memory))
        finally:  # a connection left to the garbage collector would cross a later fork()
            disk = engine.tiers().disk
            if disk is not None:
                disk.close()

    workers = [threading.Thread(target=work, name=f"nvrtc-engine-prewarm-{i}")
               for i in range(threads)]  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        for _ in keys:
            yield done.get()
    except BaseException:  # Ctrl-C: no new compile starts; those running end on their own
        todo.clear()
        raise
    for worker in workers:  # no thread outlives the call
        worker.join()


def _default_arch() -> str:
    """The current GPU's arch (this initializes CUDA here, as NVRTC's compile does anyway)."""
    from ..core.make import device_arch

    return device_arch(None)


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
    memory: bool = True,
) -> PrewarmReport:
    """Make every variant's kernel ready in this process: from memory, a cache tier, or
    compiled.

    Args:
        variants: a TOML/JSON variant file (path: ``str`` or ``os.PathLike``), or a list
            (any iterable) of :class:`~nvrtc_engine.KernelKey`, entry dicts (list-valued
            fields expand to their cross product; an empty list is an error), canonical
            kernel names and variant files (``os.PathLike`` paths such as
            ``pathlib.Path``; a ``str`` in a list is a kernel name): several files are
            ``prewarm([Path("a.toml"), Path("b.toml")])``. See ``docs/variants.md``. A single
            variant goes in a list: ``prewarm([{"op": "gelu", ...}])``.
        arch: compile for this arch (or each of these archs), replacing the variants' own.
            Default: each variant's arch, else the current GPU's.
        workers: compile threads, an int >= 1 (numpy's too; default:
            :func:`default_workers`).
        progress: show a progress bar (only when stderr is a terminal).
        memory: leave every kernel in this process's memory cache (the default). ``False``:
            only make sure that a cache tier holds each (found there and verified, or
            compiled and stored), making no kernel object, for a process that ends next
            (the command line's ``prewarm``); a lookup needs no family's launch code then.

    Returns a :class:`PrewarmReport`. A variant that fails (NVRTC error, missing CUDA
    headers) is reported there and does not stop the others. Afterwards every built kernel
    is in this process's memory cache (with ``memory``): a later
    :func:`~nvrtc_engine.get_kernel` for it is a dictionary lookup, with no second read of
    the disk cache. An empty list is nothing to
    do (an empty report); a variant *file* with no variants is an error, as a file that says
    nothing is most likely a mistake (docs/variants.md).

    Raises :class:`~nvrtc_engine.tools.variants.VariantListError` /
    :class:`~nvrtc_engine.VariantError` for a bad variant list or ``arch`` (before compiling
    anything; :class:`~nvrtc_engine.VariantTypeError` for an arch of the wrong type, as
    ``get_kernel``), :class:`~nvrtc_engine.ArgumentTypeError` for ``variants`` that are
    neither a path nor a list (``None``, bytes, a single dict) and for ``workers`` that is not
    an int (a ``TypeError``), :class:`~nvrtc_engine.ArgumentError` for ``workers`` outside 1
    to :data:`~nvrtc_engine.core.config.MAX_WORKERS` (1024, as the command line's; a
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
    compile_ms: list[float] = []

    def record(outcome: _Outcome) -> None:
        key, artifact, origin, error, exception = outcome
        if artifact is None:
            failed.append(PrewarmFailure(key, error or "", exception or ""))
        elif origin == "compiled":
            compiled.append(key)
            compile_ms.append(artifact.compile_ms)
        else:  # from a tier (another process may have compiled it meanwhile)
            cached.append(key)

    for key in keys:
        try:
            if memory:
                (cached if engine.cached(key) is not None else todo).append(key)
            elif _stored(engine, key):  # verified (a bad entry compiled again) here
                record(_build(engine, key, memory))
            else:
                todo.append(key)
        except Exception as exc:  # CUDA header discovery failed
            failed.append(PrewarmFailure(key, _describe(exc), type(exc).__name__))
    count = min(workers, len(todo)) if workers is not None else default_workers(len(todo))
    threads = count if count > 1 else 0
    warm_up = None
    if threads and threads < available_cpus():  # on a free CPU, NVRTC's start-up meets the renders
        from ..core import nvrtc

        warm_up = threading.Thread(target=nvrtc.warm_up, name="nvrtc-engine-warm-up")
        warm_up.start()
    outcomes = (_build_in_threads(engine, todo, threads, memory) if threads
                else (_build(engine, key, memory) for key in todo))  # fmt: skip
    bar = _progress_bar(len(todo), progress)
    try:
        for outcome in outcomes:
            if bar is not None:
                bar.update(1)
            record(outcome)
    finally:
        if bar is not None:
            bar.close()
        if warm_up is not None:
            warm_up.join()  # no thread outlives the call
    compile_ms.sort()
    half = len(compile_ms) // 2
    median = (compile_ms[half] + compile_ms[~half]) / 2 if compile_ms else None
    return PrewarmReport(
        compiled=tuple(sorted(compiled, key=order.__getitem__)),
        cached=tuple(sorted(cached, key=order.__getitem__)),
        failed=tuple(sorted(failed, key=lambda f: order[f.key])),
        wall_s=time.perf_counter() - start,
        median_compile_ms=median,
        workers=threads,
    )
