"""The engine: key -> kernel through the memory cache, the disk cache and NVRTC.

Memory cache: one :class:`~nvrtc_engine.kernel.Kernel` per key. Concurrent callers of one
key wait for a single build (single-flight); the lock guards only dictionary updates, never a
render, a compile, disk I/O or a wait for another process, so builds of different keys run
in parallel. Across processes, a per-digest file lock around "look on disk again, compile,
store" (:meth:`DiskCache.lock`) makes each kernel compile once.

Fork: a child inherits the memory cache (its kernels load lazily, per process), gets fresh
locks, and opens its own connection to the disk cache (SQLite connections must not cross a
fork; the parent's is closed before forking and reopens by itself on next use).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from . import config
from .cache import DiskCache, compute_digest, warn_unusable
from .kernel import Artifact, Kernel
from .key import KernelKey
from .nvrtc import CompileOptions, compile_source, compile_target, find_cuda_include_dir
from .nvrtc import nvrtc_version as _nvrtc_version
from .render import render

__all__ = ["CacheInfo", "Engine", "default_engine"]


@dataclass(frozen=True)
class CacheInfo:
    """Counters and sizes of the kernel caches (this process's counters).

    Attributes:
        hits: ``get_kernel`` calls answered from memory.
        disk_hits: kernels read (and verified) from the disk cache.
        misses: kernels found in neither cache.
        compiles: NVRTC compilations this process ran.
        memory_entries: kernels held in memory.
        entries: entries in the disk cache (0 when it is disabled).
        bytes: bytes the disk cache uses on disk.
        directory: the disk cache directory, or ``None`` when memory-only.
        size_limit: the disk cache's size cap in bytes (0 when memory-only).
    """

    hits: int
    disk_hits: int
    misses: int
    compiles: int
    memory_entries: int
    entries: int
    bytes: int
    directory: str | None
    size_limit: int = 0


class _Flight:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Kernel | None = None
        self.error: BaseException | None = None


_UNOPENED: Any = object()
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """Builds and caches kernels. Most code uses the process-wide :func:`default_engine`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memory: dict[KernelKey, Kernel] = {}
        self._calls: dict[Any, Kernel] = {}  # get_kernel argument tuples -> kernel
        self._inflight: dict[KernelKey, _Flight] = {}
        self._disk: DiskCache | None = _UNOPENED
        self.hits = self.disk_hits = self.misses = self.compiles = 0
        _engines.add(self)

    def _before_fork(self) -> None:
        disk = self._disk
        if disk is not _UNOPENED and disk is not None:
            disk.close()  # this thread's SQLite connection; reopens by itself on next use

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._inflight = {}  # builds in the parent's other threads never finish here
        self._disk = _UNOPENED
        for kernel in self._memory.values():  # modules are per process: load again here
            kernel._loaded = {}
            kernel._lock = threading.Lock()

    # -- caches ---------------------------------------------------------------------------

    def disk(self) -> DiskCache | None:
        """The disk cache, opened on first use; ``None`` when disabled or unusable."""
        disk = self._disk
        if disk is _UNOPENED:
            s = config.settings()
            opened = None
            if not s.disable_disk_cache:
                try:
                    directory = s.resolved_cache_dir()
                except Exception as exc:  # no home directory, platformdirs failure
                    warn_unusable("(default cache directory)", f"{type(exc).__name__}: {exc}")
                else:
                    opened = DiskCache.open(directory, s.cache_size_limit)
            with self._lock:
                if self._disk is _UNOPENED:
                    self._disk = opened
                elif opened is not None:
                    opened.close()
                disk = self._disk
        return disk

    def info(self) -> CacheInfo:
        disk = self.disk()
        return CacheInfo(
            hits=self.hits,
            disk_hits=self.disk_hits,
            misses=self.misses,
            compiles=self.compiles,
            memory_entries=len(self._memory),
            entries=len(disk) if disk is not None else 0,
            bytes=disk.volume() if disk is not None else 0,
            directory=str(disk.directory) if disk is not None else None,
            size_limit=disk.size_limit if disk is not None else 0,
        )

    def clear(self, *, memory: bool = True, disk: bool = True) -> None:
        """Drop cached kernels (memory, disk or both), reset counters, re-read settings."""
        with self._lock:
            if memory:
                self._memory.clear()
                self._calls.clear()
                self.hits = self.disk_hits = self.misses = self.compiles = 0
            opened = self._disk
        if disk and opened is not _UNOPENED and opened is not None:
            opened.clear()
        if disk:
            with self._lock:
                if self._disk is not _UNOPENED and self._disk is not None:
                    self._disk.close()
                self._disk = _UNOPENED

    # -- lookups --------------------------------------------------------------------------

    def lookup_call(self, call: Any) -> Kernel | None:
        """The kernel a previous ``get_kernel`` with these exact arguments returned."""
        kernel = self._calls.get(call)
        if kernel is not None:
            self.hits += 1
        return kernel

    def remember_call(self, call: Any, kernel: Kernel) -> None:
        self._calls[call] = kernel

    def get(self, key: KernelKey) -> Kernel:
        """The kernel for ``key``: from memory, else disk, else compiled (single-flight)."""
        kernel = self._memory.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        with self._lock:
            kernel = self._memory.get(key)
            if kernel is not None:
                self.hits += 1
                return kernel
            flight = self._inflight.get(key)
            owner = flight is None
            if owner:
                flight = self._inflight[key] = _Flight()
        assert flight is not None
        if not owner:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.result is not None
            return flight.result
        try:
            kernel = self._build(key)
            with self._lock:  # prewarm may have adopted one meanwhile: hand out one object
                kernel = self._memory.setdefault(key, kernel)
            flight.result = kernel
            return kernel
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._inflight[key]
            flight.done.set()

    def artifact_digest(self, key: KernelKey) -> tuple[Any, CompileOptions, str | None, str]:
        """Render ``key`` and compute its options, header version and cache digest."""
        rendered = render(key)
        target, _kind = compile_target(key.arch)
        options = CompileOptions(arch=target)
        header_version = find_cuda_include_dir().version if rendered.cuda_headers else None
        digest = compute_digest(
            rendered.source, rendered.headers, options.flags(), _nvrtc_version(), header_version
        )
        return rendered, options, header_version, digest

    def _build(self, key: KernelKey) -> Kernel:
        artifact, origin = self.build_artifact(key)
        return key.spec.kernel_class()(key, artifact, origin)

    def build_artifact(self, key: KernelKey) -> tuple[Artifact, str]:
        """The artifact for ``key`` from disk, else compiled and stored; no memory cache.

        Returns ``(artifact, origin)`` with origin ``"disk"`` or ``"compiled"``. Holds the
        key's cross-process lock (never this engine's lock) around "look on disk again,
        compile, store", so processes sharing a cache directory compile each key once.
        Touches no GPU: prewarm's worker processes call this.
        """
        rendered, options, _header_version, digest = self.artifact_digest(key)
        disk = self.disk()
        if disk is None:
            return self._compile(key, rendered, options, digest), "compiled"
        artifact = disk.get(digest)
        if artifact is None:
            with disk.lock(digest, config.settings().lock_timeout):
                artifact = disk.get(digest)  # another process may have stored it meanwhile
                if artifact is None:
                    artifact = self._compile(key, rendered, options, digest)
                    disk.put(str(key), artifact)
                    return artifact, "compiled"
        self.disk_hits += 1
        return artifact, "disk"

    def _compile(
        self, key: KernelKey, rendered: Any, options: CompileOptions, digest: str
    ) -> Artifact:
        self.misses += 1
        start = time.perf_counter()
        result = compile_source(
            rendered.name, rendered.source, rendered.headers, options,
            cuda_headers=rendered.cuda_headers, key=str(key),
        )  # fmt: skip
        self.compiles += 1
        return Artifact(
            image=result.image,
            kind=result.kind,
            symbols=rendered.symbols,
            digest=digest,
            nvrtc_version=_nvrtc_version(),
            options=options.flags(),
            compile_ms=(time.perf_counter() - start) * 1e3,
        )

    def cached(self, key: KernelKey) -> Kernel | None:
        """The kernel for ``key`` if memory or disk has it (disk: verified, then kept in
        memory); ``None`` otherwise. Never compiles."""
        kernel = self._memory.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        disk = self.disk()
        if disk is None:
            return None
        artifact = disk.get(self.artifact_digest(key)[3])
        if artifact is None:
            return None
        self.disk_hits += 1
        return self.adopt(key, artifact, "disk")

    def adopt(self, key: KernelKey, artifact: Artifact, origin: str) -> Kernel:
        """Keep ``artifact`` (built elsewhere, e.g. by a worker process) as ``key``'s kernel
        in memory; returns the kernel memory holds (an earlier one wins)."""
        kernel = key.spec.kernel_class()(key, artifact, origin)
        with self._lock:
            return self._memory.setdefault(key, kernel)

    def in_memory(self, key: KernelKey) -> bool:
        """Whether the memory cache holds ``key`` (counts nothing)."""
        return key in self._memory


_default: Engine | None = None
_default_lock = threading.Lock()


def default_engine() -> Engine:
    """The process-wide engine behind :func:`~nvrtc_engine.get_kernel`."""
    global _default
    engine = _default
    if engine is None:
        with _default_lock:
            if _default is None:
                _default = Engine()
            engine = _default
    return engine


def _before_fork() -> None:
    for engine in list(_engines):
        engine._before_fork()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for engine in list(_engines):
        engine._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
