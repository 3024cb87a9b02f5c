"""The engine: key -> kernel through the memory cache, the cache's tiers and NVRTC.

Memory: one :class:`~nvrtc_engine.kernel.Kernel` per key, one build of a key at a time (the
engine's lock guards dictionaries only). A miss takes :meth:`Engine.build_artifact`'s steps:
the key's digest (nothing rendered); each tier in order, the disk cache then the read-only
caches (every entry verified; a read-only hit is copied to the disk cache); else the digest's
file lock, the disk cache again, render, compile, store. A fork()ed child keeps the memory
cache (its kernels load again, lazily) and reopens files.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cache, config, nvrtc
from .cache import check_entry, compile_options, encode_entry
from .errors import CacheWarning, warn_once
from .kernel import Artifact, Kernel
from .key import KernelKey
from .nvrtc import compile_source, compile_target
from .render import render
from .tiers import STORE_DIR, DiskTier, ReadOnlyTier, open_readonly, remove_store

__all__ = ["CacheInfo", "Engine", "default_engine"]


@dataclass(frozen=True)
class CacheInfo:
    """Counters (this process's) and sizes of the kernel caches: ``hits`` (answered from
    memory), ``disk_hits`` (read and verified from the disk cache or a read-only cache),
    ``misses``, ``compiles`` (NVRTC runs), ``memory_entries``; the disk cache's ``entries``,
    ``bytes`` on disk, ``directory`` (None without a usable one; asking creates none: one
    holding no cache yet reports 0 and 0) and ``size_limit`` (bytes; else the configured one);
    ``readonly``: the read-only caches configured (``NVRTC_ENGINE_READONLY_CACHE``)."""

    hits: int
    disk_hits: int
    misses: int
    compiles: int
    memory_entries: int
    entries: int
    bytes: int
    directory: str | None
    size_limit: int = 0
    readonly: tuple[str, ...] = ()


_Opened = tuple[config.Settings, DiskTier | None, tuple[ReadOnlyTier, ...], str]
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """Builds and caches kernels. Most code uses the process-wide :func:`default_engine`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memory: dict[KernelKey, Kernel] = {}
        self._calls: dict[Any, Kernel] = {}  # get_kernel argument tuples -> kernel
        self._inflight: dict[KernelKey, threading.Lock] = {}
        self._opened: _Opened | None = None
        self.hits = self.disk_hits = self.misses = self.compiles = 0
        _engines.add(self)

    def tiers(self) -> _Opened:
        """``(settings, disk cache or None, read-only caches, why no disk cache)``, opened on
        first use and after a :func:`~nvrtc_engine.configure` (the old ones keep their entries)."""
        s, opened = config.settings(), self._opened
        if opened is None or opened[0] is not s:  # (threads racing here open them twice)
            disk, why = (None, "") if s.disable_disk_cache else DiskTier.open(
                _cache_dir(s), s.cache_size_limit)  # fmt: skip
            self._opened, opened = (s, disk, open_readonly(s.readonly_cache), why), self._opened
            _close(opened)
        return self._opened

    def disk(self) -> DiskTier | None:  # None when disabled or unusable (tiers()[3]: why)
        return self.tiers()[1]

    def info(self) -> CacheInfo:
        """Counters and sizes; opens the disk cache only where its directory holds one."""
        s, opened = config.settings(), self._opened
        fresh = None if opened and opened[0] is s else _not_created(s)
        disk = None if fresh or s.disable_disk_cache else self.disk()
        sizes = (0, 0, fresh, s.cache_size_limit) if disk is None else (
            len(disk), disk.volume(), str(disk.directory), disk.size_limit)  # fmt: skip
        return CacheInfo(self.hits, self.disk_hits, self.misses, self.compiles, len(self._memory),
                         *sizes, tuple(map(str, s.readonly_cache)))  # fmt: skip

    def clear(self, *, memory: bool = True, disk: bool = True) -> None:
        """Drop cached kernels, ``memory`` resetting the counters, ``disk`` the settings' directory
        (a store a full disk keeps from opening goes whole; the settings are read again)."""
        if memory:
            with self._lock:
                self._memory.clear()
                self._calls.clear()
                self.hits = self.disk_hits = self.misses = self.compiles = 0
        s = config.settings()
        directory = _cache_dir(s)
        held = directory is not None and os.path.isdir(directory / STORE_DIR)
        if disk and (held or (self._opened is not None and self._opened[0] is s)):
            _s, tier, _readonly, why = self.tiers()
            if tier is not None:
                tier.clear()
            elif why.startswith("no space") and directory:
                remove_store(directory)
        if disk:
            _close(self._opened)
            self._opened = None

    def lookup_call(self, call: Any) -> Kernel | None:  # get_kernel's, for the same arguments
        kernel = self._calls.get(call)
        self.hits += kernel is not None
        return kernel

    def remember_call(self, call: Any, kernel: Kernel) -> None:
        self._calls[call] = kernel

    def get(self, key: KernelKey) -> Kernel:
        """The kernel for ``key``: from memory, else a tier, else compiled (single-flight)."""
        kernel = self._memory.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        with self._lock:
            flight = self._inflight.setdefault(key, threading.Lock())
        with flight:  # one build of a key at a time: those waiting find its kernel in memory
            kernel = self._memory.get(key) or self.adopt(key, *self.build_artifact(key))
        self._inflight.pop(key, None)
        return kernel

    def build_artifact(self, key: KernelKey) -> tuple[Artifact, str]:
        """The artifact for ``key`` from a tier, else compiled and stored; no memory cache.
        Returns ``(artifact, origin)``, origin ``"disk"`` or ``"compiled"``. Holds the key's
        cross-process lock (never this engine's) around "look in the disk cache again,
        compile, store", so processes sharing a directory compile each key once. Touches no
        GPU (prewarm's workers call this). Raises what rendering and NVRTC raise."""
        digest = cache.digest(key)
        _s, disk, readonly, _why = self.tiers()
        artifact = self._load(key, digest, disk, readonly)
        if artifact is not None:
            return artifact, "disk"
        if disk is None or not disk.writable:
            return self._compile(key, digest, None), "compiled"
        with disk.lock(digest, config.settings().lock_timeout):
            found = self._load(key, digest, disk, ())  # another process may have stored it
            return (found, "disk") if found else (self._compile(key, digest, disk), "compiled")

    def _load(
        self, key: KernelKey, digest: str, disk: DiskTier | None, readonly: tuple[ReadOnlyTier, ...]
    ) -> Artifact | None:
        """The first entry for ``digest`` that verifies; a read-only one is copied to disk."""
        version = nvrtc.nvrtc_identity()
        for tier in (disk, *readonly) if disk is not None else readonly:
            value = tier.get(digest)
            checked = check_entry(value, digest, key, version) if value is not None else None
            if isinstance(checked, tuple):
                if tier is not disk and disk is not None:
                    disk.put(digest, value)  # type: ignore[arg-type]
                self.disk_hits += 1
                return checked[1]
            if checked is not None and tier is disk:
                disk.delete(digest)
            elif checked is not None:
                warn_once("bad read-only entry", tier.location, f"nvrtc_engine: the read-only "
                          f"cache {tier.location} holds a bad entry for {key} ({digest[:12]}: "
                          f"{checked}); it is skipped", CacheWarning)  # fmt: skip
        return None

    def _compile(self, key: KernelKey, digest: str, disk: DiskTier | None) -> Artifact:
        self.misses += 1
        expected, start = nvrtc.nvrtc_identity(), time.perf_counter()
        rendered = render(key)
        options = compile_options(compile_target(key.arch)[0])
        result = compile_source(rendered.name, rendered.source, rendered.headers, options,
                                cuda_headers=rendered.cuda_headers, key=str(key))  # fmt: skip
        self.compiles += 1
        version = nvrtc.nvrtc_version()
        if version != expected:  # the wheel found is not the NVRTC loaded: not stored
            warn_once("nvrtc", expected, f"nvrtc_engine: NVRTC {version} is loaded, not the "
                      f"NVRTC {expected} wheel: kernels are not cached", CacheWarning)  # fmt: skip
            disk = None
        artifact = Artifact(result.image, result.kind, rendered.symbols, digest, version,
                            options.flags(), (time.perf_counter() - start) * 1e3)  # fmt: skip
        if disk is not None:
            disk.put(digest, encode_entry(str(key), artifact))
        return artifact

    def cached(self, key: KernelKey) -> Kernel | None:
        """The kernel for ``key`` if memory or a tier has it (then kept in memory), or None."""
        kernel = self._memory.get(key)
        if kernel is None and (artifact := self._load(key, cache.digest(key), *self.tiers()[1:3])):
            return self.adopt(key, artifact, "disk")
        self.hits += kernel is not None
        return kernel

    def adopt(self, key: KernelKey, artifact: Artifact, origin: str) -> Kernel:
        """Keep ``artifact`` (from anywhere) as ``key``'s kernel; the one memory holds wins."""
        kernel = key.spec.kernel_class()(key, artifact, origin)
        with self._lock:
            return self._memory.setdefault(key, kernel)


def _cache_dir(s: config.Settings) -> Path | None:  # None: no home directory for the default
    try:
        return s.resolved_cache_dir()
    except OSError:
        return None


def _not_created(s: config.Settings) -> str | None:
    """The cache directory where it has no store yet and may get one (creating nothing)."""
    directory = existing = _cache_dir(s)
    if s.disable_disk_cache or directory is None or os.path.isdir(directory / STORE_DIR):
        return None
    while not os.path.exists(existing) and existing.parent != existing:
        existing = existing.parent
    ok = os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)
    return str(directory) if ok else None


def _close(opened: _Opened | None) -> None:
    for tier in (opened[1], *opened[2]) if opened else ():
        if tier is not None:
            tier.close()


_default = Engine()  # (opens nothing until its first lookup)


def default_engine() -> Engine:
    """The process-wide engine behind :func:`~nvrtc_engine.get_kernel`."""
    return _default


def _before_fork() -> None:
    for engine in list(_engines):
        _close(engine._opened)  # SQLite connections must not cross a fork; reopened on use


def _after_fork_in_child() -> None:
    for engine in list(_engines):
        engine._lock, engine._inflight = threading.Lock(), {}  # the parent's builds end there
        for kernel in engine._memory.values():  # modules are per process: load again here
            kernel._loaded, kernel._lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
