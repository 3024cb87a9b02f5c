"""The engine: key -> kernel through the memory cache, the cache's tiers and NVRTC (the lock
guards dictionaries only). A fork()ed child keeps the memory cache (its kernels load again) and
reopens files and connections.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

from . import cache, config, nvrtc
from .cache import Tier, check_entry, encode_entry
from .errors import CacheWarning, CudaError, warn_once
from .kernel import Artifact, Kernel, try_load
from .key import KernelKey
from .nvrtc import compile_options, compile_source, compile_target
from .render import render
from .tiers import STORE_DIR, DiskTier, open_readonly, remove_store

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from .remote import RedisTier

__all__ = ["Engine", "Tiers", "cache_dir", "default_engine"]


class Tiers(NamedTuple):
    """The caches of one :class:`~nvrtc_engine.core.config.Settings`, opened: the disk cache (None
    when disabled or unusable: ``why``), the ``shared`` ones (read-only, then remote), the remote
    cache (None when not configured or unusable), the ``secret`` shared entries are signed with."""

    settings: config.Settings
    disk: DiskTier | None
    shared: tuple[Tier, ...] = ()
    remote: RedisTier | None = None
    why: str = ""
    secret: bytes | None = None

    def close(self) -> None:
        for tier in (self.disk, *self.shared):
            if tier is not None:
                tier.close()

    def store(self, digest: str, value: bytes) -> None:  # in the disk cache, if any
        if self.disk is not None:
            self.disk.put(digest, value)


_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """Builds and caches kernels. Most code uses the process-wide :func:`default_engine`;
    :func:`~nvrtc_engine.cache_info` reports its counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.memory: dict[KernelKey, Kernel] = {}  # what get_kernel returned, by key
        self.calls: dict[Any, Kernel] = {}  # get_kernel argument tuples -> kernel
        self._inflight: dict[KernelKey, threading.Lock] = {}
        self.opened: Tiers | None = None  # the caches of the settings they were opened for
        self.hits = self.disk_hits = self.remote_hits = self.misses = self.compiles = 0
        _engines.add(self)

    def tiers(self) -> Tiers:
        """The caches, opened on first use and after a :func:`~nvrtc_engine.configure`; raises
        :class:`~nvrtc_engine.SettingsError` for a signing key file that cannot be read."""
        s, opened = config.settings(), self.opened
        if opened is None or opened.settings is not s:  # (threads racing here open them twice)
            secret, remote = s.signing_key(), None
            disk, why = (None, "") if s.disable_disk_cache else DiskTier.open(
                cache_dir(s), s.cache_size_limit)  # fmt: skip
            if s.remote_cache:  # (the redis client is imported only for one)
                from .remote import RedisTier

                remote = RedisTier.open(s)
            shared = (*open_readonly(s.readonly_cache), *((remote,) if remote else ()))
            self.opened = Tiers(s, disk, shared, remote, why, secret)
            if opened is not None:
                opened.close()
        return self.opened

    def clear(self, *, memory: bool = True, disk: bool = True) -> None:
        """Drop the kernels in ``memory`` (and the counters) and in the ``disk`` cache (a store
        a full disk keeps from opening goes whole); never the read-only and remote caches."""
        if memory:
            with self._lock:
                self.memory.clear()
                self.calls.clear()
                self.hits = self.disk_hits = self.remote_hits = self.misses = self.compiles = 0
        if not disk:
            return
        directory = cache_dir(config.settings())
        if directory is not None and os.path.isdir(directory / STORE_DIR):  # (else none made)
            t = self.tiers()
            if t.disk is not None:
                t.disk.clear()
            elif t.why.startswith("no space"):
                remove_store(directory)
        if self.opened is not None:
            self.opened.close()
            self.opened = None

    def get(self, key: KernelKey) -> Kernel:
        """The kernel for ``key``: from memory, else a tier, else compiled (single-flight);
        one of another NVRTC loaded once on a GPU first (:meth:`_check`)."""
        kernel = self.memory.get(key)
        if kernel is not None and kernel.origin != "unchecked":
            self.hits += 1
            return kernel
        with self._lock:
            flight = self._inflight.setdefault(key, threading.Lock())
        with flight:  # one build of a key at a time: those waiting find its kernel in memory
            kernel = self.memory.get(key) or self.adopt(key, *self.build_artifact(key))
            if kernel.origin == "unchecked":
                kernel = self._check(key, kernel)
        self._inflight.pop(key, None)
        return kernel

    def cached(self, key: KernelKey) -> Kernel | None:
        """The kernel for ``key`` if memory or a tier has it (then kept in memory), or None."""
        kernel = self.memory.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        found = self._find(key, cache.digest(key), self.tiers())
        return self.adopt(key, *found) if found is not None else None

    def adopt(self, key: KernelKey, artifact: Artifact, origin: str, replace: bool = False
              ) -> Kernel:  # fmt: skip
        """Keep ``artifact`` as ``key``'s kernel; the one memory holds wins, unless ``replace``."""
        kernel = key.spec.kernel_class()(key, artifact, origin)
        with self._lock:
            if replace:
                self.memory[key] = kernel
            return self.memory.setdefault(key, kernel)

    def build_artifact(self, key: KernelKey) -> tuple[Artifact, str]:
        """``(artifact, origin)`` for ``key``, memory aside: from a tier (:meth:`_find`), else
        compiled (no GPU) and stored under the disk cache's file lock, then the remote lease
        (looking again under each: one compile per key for all sharing them)."""
        digest, t = cache.digest(key), self.tiers()
        found = self._find(key, digest, t)
        if found is not None:
            return found
        with contextlib.ExitStack() as held:
            s = t.settings
            for tier, wait in ((t.disk, s.lock_timeout), (t.remote, s.remote_wait)):
                if found is None and tier is not None and tier.writable:
                    held.enter_context(tier.lock(digest, wait))
                    found = self._find(key, digest, t, (tier,))  # stored meanwhile?
            return found or (self._compile(key, digest, t), "compiled")

    def _find(
        self, key: KernelKey, digest: str, t: Tiers, tiers: Iterable[Tier] | None = None
    ) -> tuple[Artifact, str] | None:
        """The first entry for ``digest`` in ``tiers`` (default: all, then with ``any_nvrtc`` one
        of another NVRTC a shared tier names, under that NVRTC's digest) that verifies, copied
        to the disk cache; origin ``"disk"`` (a read-only cache's too), ``"remote"`` or
        ``"unchecked"`` (another NVRTC's, not loaded here yet). A bad entry is removed from the
        disk cache; in a shared tier, left and said once per tier."""
        version = nvrtc.nvrtc_identity()
        looks = [(x, version) for x in tiers or (t.disk, *t.shared) if x is not None]
        if tiers is None and t.settings.any_nvrtc:  # (lazily: a remote's is a round trip)
            theirs = (
                (x, v) for x, _ in looks if x.shared for v in x.nvrtc_versions() if v != version
            )
            looks = itertools.chain(looks, theirs)  # type: ignore[assignment]
        for tier, built in looks:
            stored = digest if built == version else cache.digest(key, built)
            value = tier.get(stored)
            if value is None:
                continue
            checked = check_entry(value, stored, key, built, t.secret if tier.shared else None)
            if isinstance(checked, str):
                kind, what = ("remote", "replaced") if tier.writable else ("read-only", "skipped")
                if tier is t.disk:
                    t.disk.delete(stored)
                else:
                    warn_once("bad shared entry", tier.location, f"nvrtc_engine: the {kind} "
                              f"cache {tier.location} holds a bad entry for {key} ({stored[:12]}: "
                              f"{checked}); it is {what}", CacheWarning)  # fmt: skip
                continue
            header, artifact = checked
            if built != version:  # filed under this NVRTC's digest, saying so
                artifact = artifact._replace(digest=digest)
                value = encode_entry(str(key), artifact, adopted_for=version, checked=False)
            if tier is not t.disk:
                t.store(digest, value)
            remote = tier is t.remote
            self.remote_hits += remote
            self.disk_hits += not remote
            unchecked = built != version or header.get("checked") is False
            return artifact, "unchecked" if unchecked else "remote" if remote else "disk"
        return None

    def _compile(self, key: KernelKey, digest: str, t: Tiers) -> Artifact:
        self.misses += 1
        expected, start = nvrtc.nvrtc_identity(), time.perf_counter()
        rendered = render(key)
        options = compile_options(compile_target(key.arch)[0])
        result = compile_source(rendered.name, rendered.source, rendered.headers, options,
                                cuda_headers=rendered.cuda_headers, key=str(key))  # fmt: skip
        self.compiles += 1
        version = nvrtc.nvrtc_version()
        artifact = Artifact(result.image, result.kind, rendered.symbols, digest, version,
                            options.flags(), (time.perf_counter() - start) * 1e3)  # fmt: skip
        if version != expected:  # the wheel found is not the NVRTC loaded: not stored
            warn_once("nvrtc", expected, f"nvrtc_engine: NVRTC {version} is loaded, not the "
                      f"NVRTC {expected} wheel: kernels are not cached", CacheWarning)  # fmt: skip
            return artifact
        t.store(digest, encode_entry(str(key), artifact))
        if t.remote is not None:
            t.remote.share(str(key), artifact, t.secret)
        return artifact

    def _check(self, key: KernelKey, kernel: Kernel) -> Kernel:
        """Another NVRTC's kernel, kept (its entry marked checked) if a GPU here of its arch
        loads it, else compiled here (one warning); as it is where no such GPU is."""
        t, artifact, version = self.tiers(), kernel.artifact, nvrtc.nvrtc_identity()
        try:
            if not try_load(key, artifact):
                return kernel
        except CudaError as exc:
            warn_once("other nvrtc", str(key), f"nvrtc_engine: the cached {key}, built by "
                      f"NVRTC {artifact.nvrtc_version}, does not load here ({exc}); "
                      f"compiling it with NVRTC {version}", CacheWarning)  # fmt: skip
            if t.disk is not None:  # (a compile that fails does not try it again)
                t.disk.delete(artifact.digest)
            return self.adopt(key, self._compile(key, artifact.digest, t), "compiled", True)
        value = encode_entry(str(key), artifact, adopted_for=version, checked=True)
        t.store(artifact.digest, value)
        return self.adopt(key, artifact, "disk", True)


def cache_dir(s: config.Settings) -> Path | None:  # None: no home directory for the default
    with contextlib.suppress(OSError):
        return s.resolved_cache_dir()
    return None


_default = Engine()  # (opens nothing until its first lookup)


def default_engine() -> Engine:
    """The process-wide engine behind :func:`~nvrtc_engine.get_kernel`."""
    return _default


def _before_fork() -> None:
    for engine in list(_engines):
        if engine.opened is not None:  # SQLite and Redis connections must not cross a fork
            engine.opened.close()  # (reopened on use)


def _after_fork_in_child() -> None:
    for engine in list(_engines):
        engine._lock, engine._inflight = threading.Lock(), {}  # the parent's builds end there
        for kernel in engine.memory.values():  # modules are per process: load again here
            kernel._loaded, kernel._lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
