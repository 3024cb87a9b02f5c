"""The engine: key -> kernel through the memory cache, the disk cache and NVRTC.

Memory cache: one :class:`~nvrtc_engine.kernel.Kernel` per key. Concurrent callers of one
key wait for a single build (single-flight); the lock guards only dictionary updates, never a
render, a compile, disk I/O or a wait for another process, so builds of different keys run
in parallel. Across processes, a per-digest file lock around "look on disk again, compile,
store" (:meth:`DiskCache.lock`) makes each kernel compile once.

Disk lookups go through the key index first (:mod:`nvrtc_engine.index`): a key already
built in this environment is read from its entry file and verified without rendering, loading
NVRTC or opening diskcache. An index miss takes the full path (render, digest, disk, compile)
and records the key's digest in the index afterwards.

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

from . import config, index, nvrtc
from .cache import ENTRIES_DIR, DiskCache, compute_digest, decode_entry, target_arch, warn_unusable
from .index import KeyIndex, environment_fingerprint
from .kernel import Artifact, Kernel
from .key import KernelKey, arch_number
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
        directory: the disk cache directory, or ``None`` when memory-only. Asking creates
            no directory: one that holds no cache yet reports 0 entries and 0 bytes.
        size_limit: the disk cache's size cap in bytes (memory-only: the configured cap).
        read_only: the disk cache directory could be read but not written: its kernels are
            read, new ones are kept in memory only.
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
    read_only: bool = False


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
        self._disk_settings: config.Settings | None = None  # the settings it was opened with
        self._index: tuple[Any, KeyIndex | None] = (None, None)  # (settings, index)
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

    def _forget_stale_disk(self) -> None:
        """Close the disk cache if the settings changed since it was opened
        (:func:`~nvrtc_engine.configure`): the next use opens the configured one, and the
        old directory keeps its entries."""
        if self._disk is _UNOPENED or self._disk_settings is config.settings():
            return
        with self._lock:
            if self._disk is not _UNOPENED and self._disk_settings is not config.settings():
                if self._disk is not None:
                    self._disk.close()
                self._disk = _UNOPENED

    def disk(self) -> DiskCache | None:
        """The disk cache of the current settings, opened on first use; ``None`` when disabled
        or unusable."""
        self._forget_stale_disk()
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
                    self._disk_settings = s
                elif opened is not None:
                    opened.close()
                disk = self._disk
        return disk

    def key_index(self) -> KeyIndex | None:
        """The key index of the disk cache directory, without opening the disk cache;
        ``None`` when the disk cache is disabled or known to be unusable."""
        self._forget_stale_disk()
        disk = self._disk
        if disk is None:
            return None
        if disk is not _UNOPENED:
            return disk.index
        s = config.settings()
        known_for, found = self._index
        if known_for is not s:
            found = None
            if not s.disable_disk_cache:
                try:
                    found = KeyIndex(s.resolved_cache_dir(), ENTRIES_DIR)
                except Exception:  # no home directory: disk() will say so
                    found = None
            self._index = (s, found)
        return found

    def _disk_exists(self) -> bool:
        """Whether the configured cache directory holds a cache (opening nothing)."""
        found = self.key_index()
        return found is not None and (
            found.directory.is_dir() or (found.directory.parent / ENTRIES_DIR).is_dir()
        )

    def info(self) -> CacheInfo:
        """Counters and sizes; opens the disk cache only where its directory holds one:
        asking creates no directory (a missing one reports 0 entries and 0 bytes)."""
        counters = {
            "hits": self.hits, "disk_hits": self.disk_hits, "misses": self.misses,
            "compiles": self.compiles, "memory_entries": len(self._memory),
        }  # fmt: skip
        missing = self._missing_cache_dir()
        if missing is not None:
            return CacheInfo(
                **counters, entries=0, bytes=0, directory=missing,
                size_limit=config.settings().cache_size_limit,
            )  # fmt: skip
        disk = self.disk()
        return CacheInfo(
            **counters,
            entries=len(disk) if disk is not None else 0,
            bytes=disk.volume() if disk is not None else 0,
            directory=str(disk.directory) if disk is not None else None,
            size_limit=disk.size_limit if disk is not None else config.settings().cache_size_limit,
            read_only=disk is not None and disk.read_only,
        )

    def _missing_cache_dir(self) -> str | None:
        """The configured disk cache directory when the disk cache is not open yet and that
        directory holds no cache (``entries/`` is missing: opening would create it) but could
        be created, else ``None``: open, disabled, or unusable (no home directory, a file in
        the way, an ancestor not writable), where :meth:`disk` warns once and creates
        nothing."""
        self._forget_stale_disk()
        s = config.settings()
        if self._disk is not _UNOPENED or s.disable_disk_cache:
            return None
        try:
            directory = s.resolved_cache_dir()
        except Exception:  # no home directory
            return None
        if (directory / ENTRIES_DIR).is_dir():
            return None
        existing = directory
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
            return str(directory)
        return None

    def clear(self, *, memory: bool = True, disk: bool = True) -> None:
        """Drop cached kernels (memory, disk or both), reset counters, re-read settings.
        ``disk`` clears the directory of the current settings (not one opened before a
        :func:`~nvrtc_engine.configure`)."""
        self._forget_stale_disk()
        with self._lock:
            if memory:
                self._memory.clear()
                self._calls.clear()
                self.hits = self.disk_hits = self.misses = self.compiles = 0
            opened = self._disk
        if disk and opened is _UNOPENED and self._disk_exists():
            opened = self.disk()  # kernels may have come through the index alone
        if disk and opened is not _UNOPENED and opened is not None:
            opened.clear()
        if disk:
            index.reset()
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
        artifact = self._from_index(key)
        if artifact is not None:
            self.disk_hits += 1
            return artifact, "disk"
        rendered, options, _header_version, digest = self.artifact_digest(key)
        disk = self.disk()
        found = disk.get_located(digest) if disk is not None else None
        if found is None and (disk is None or disk.read_only):  # nowhere to store it
            return self._compile(key, rendered, options, digest), "compiled"
        assert disk is not None
        if found is None:
            with disk.lock(digest, config.settings().lock_timeout):
                found = disk.get_located(digest)  # another process may have stored it
                if found is None:
                    artifact = self._compile(key, rendered, options, digest)
                    if disk.put(str(key), artifact):
                        self.remember(disk, key, artifact, None, rendered.cuda_headers)
                    return artifact, "compiled"
        _header, artifact, file = found
        self.remember(disk, key, artifact, file, rendered.cuda_headers)
        self.disk_hits += 1
        return artifact, "disk"

    # -- the key index ----------------------------------------------------------------------

    def _from_index(self, key: KernelKey) -> Artifact | None:
        """``key``'s artifact through the key index (verified), or ``None`` (index miss)."""
        found_index = self.key_index()
        if found_index is None:
            return None
        fingerprint = environment_fingerprint()
        if fingerprint is None:
            return None
        name = str(key)
        record = found_index.lookup(name, fingerprint)
        if record is None:
            return None
        if nvrtc.loaded():  # this process's NVRTC must be the one the record names
            lib = nvrtc.library_record()
            if lib is None or lib["path"] != record.nvrtc_path:
                return None
            if _nvrtc_version() != record.nvrtc_version:
                return None
        if record.file is not None and not record.stale:
            value = found_index.read(record)
            decoded = decode_entry(value, record.digest) if value is not None else None
            if decoded is None:
                return None
            header, artifact = decoded
            return artifact if _artifact_is_for(key, header, artifact, record) else None
        # no entry file recorded, or the last counted use is old: read through diskcache,
        # which verifies, counts the use for eviction, and says where the entry is now
        disk = self.disk()
        if disk is None:
            return None
        found = disk.get_located(record.digest)
        if found is None:
            return None
        header, artifact, file = found
        if not _artifact_is_for(key, header, artifact, record):
            return None
        if not disk.read_only:
            found_index.touch(name, record, self._entry_file(disk, key, artifact, file))
        return artifact

    def _entry_file(
        self, disk: DiskCache, key: KernelKey, artifact: Artifact, file: str | None
    ) -> str | None:
        """The entry's value file; an entry kept inside SQLite (stored before values all went
        to files) is stored again, into a file."""
        if file is None and disk.put(str(key), artifact):
            found = disk.get_located(artifact.digest)
            file = found[2] if found is not None else None
        return file

    def remember(
        self,
        disk: DiskCache,
        key: KernelKey,
        artifact: Artifact,
        file: str | None,
        cuda_headers: bool,
    ) -> None:
        """Record ``key`` -> ``artifact.digest`` in the key index, after the full path found
        or built it. Records nothing unless every input of the digest can be re-checked, and
        nothing in a read-only cache."""
        fingerprint = environment_fingerprint()
        if fingerprint is None or disk.read_only:
            return
        lib = nvrtc.library_record()  # NVRTC is loaded: the digest needed its version
        if lib is None or artifact.nvrtc_version != nvrtc.nvrtc_version():
            return
        headers = None
        if cuda_headers:
            include = find_cuda_include_dir()
            if not index.headers_indexable(include):
                return
            headers = include.record
        if file is None:
            found = disk.get_located(artifact.digest)
            if found is None:
                return
            file = self._entry_file(disk, key, artifact, found[2])
        disk.index.write(
            str(key), fingerprint, artifact.digest, file, lib, artifact.nvrtc_version, headers
        )

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
        artifact = self._from_index(key)
        if artifact is None:
            disk = self.disk()
            if disk is None:
                return None
            rendered, _options, _header_version, digest = self.artifact_digest(key)
            found = disk.get_located(digest)
            if found is None:
                return None
            _header, artifact, file = found
            self.remember(disk, key, artifact, file, rendered.cuda_headers)
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


def _artifact_is_for(
    key: KernelKey, header: dict[str, Any], artifact: Artifact, record: Any
) -> bool:
    """Whether an entry reached through the index is ``key``'s: its own header names the key,
    the key's symbols, the NVRTC version the record names, and the options this installation
    compiles the key with (a cubin for the key's arch, or PTX for an older one)."""
    if header.get("key") != str(key) or artifact.nvrtc_version != record.nvrtc_version:
        return False
    if artifact.digest != record.digest or artifact.symbols != key.spec.symbols(key):
        return False
    target = target_arch(artifact)
    if artifact.kind == "cubin":
        if target != key.arch:
            return False
    elif artifact.kind == "ptx":
        number = target[len("compute_") :]
        if not (target.startswith("compute_") and number.isdigit()):
            return False
        if int(number) >= arch_number(key.arch):
            return False
    else:
        return False
    return artifact.options == CompileOptions(arch=target).flags()


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
