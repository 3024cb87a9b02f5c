"""The public entry points: :func:`get_kernel`, :func:`make_key` (from
:mod:`~nvrtc_engine.core.make`), :func:`cache_info`, :func:`clear_cache`.

Importing this module (``from nvrtc_engine import get_kernel``) imports what lookups use:
the engine, the disk store's library, the compiled launcher and every registered family's
spec (the ops, fields and rules a key is checked against), so that making a key or looking
one up imports nothing more than a family's kernel classes, at its first lookup. Nothing
starts: no CUDA, no NVRTC, no cache directory."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from .core import config, make
from .core.engine import cache_dir, default_engine
from .core.errors import ArgumentTypeError, NoDeviceError
from .core.kernel import Kernel
from .core.key import KernelKey
from .core.make import make_key
from .core.registry import load_families

__all__ = ["CacheInfo", "cache_info", "clear_cache", "get_kernel", "make_key"]

load_families()


def get_kernel(op: str | KernelKey, **fields: Any) -> Kernel:
    """The compiled kernel for a variant: from memory, the disk cache, or NVRTC.

    ``get_kernel("gelu", dtype="fp8")`` is the tanh-GELU kernel with bf16 input and
    tensor-scaled fp8_e4m3 output for the current device's arch. Takes a
    :class:`KernelKey`, or an op name and :func:`make_key`'s keyword fields (``dtype``,
    ``in_dtype``, ``out_dtype``, ``scaling``, ``layout``, ``hidden_size``, ``arch``,
    ``device``, op flags). Repeated calls with the same arguments return the same object
    from a dictionary lookup; the lookup tells values of different types apart
    (``hidden_size=4096.0`` after ``4096``, ``device=False`` after ``0``), so a call raises
    the same error whatever was called before it.

    Raises :class:`~nvrtc_engine.VariantError` (bad field),
    :class:`~nvrtc_engine.ArgumentTypeError` (fields that do not go together: ``dtype`` and
    ``out_dtype``, a key and fields), :class:`~nvrtc_engine.NoDeviceError` (no ``arch`` and
    no GPU), :class:`~nvrtc_engine.CompileError` (NVRTC failure, with log),
    :class:`~nvrtc_engine.HeaderNotFoundError` (CUDA headers needed and missing).
    """
    engine = default_engine()
    if isinstance(op, KernelKey):
        if fields:
            raise ArgumentTypeError(
                next(iter(fields)),
                "get_kernel(key) takes no other fields: the key fixes them all "
                "(key._replace(...) changes one)",
            )
        # (checked when not yet held: a GPU newer than every known arch is asked for once)
        return engine.get(op if op in engine.memory else make.check_arch(op))
    # The memo's key is the fields as given, with each value's type: 4096.0 == 4096 and
    # True == 1, but a float hidden_size or a bool device is an error where the int is not,
    # so an equal value of another type must miss the memo and be validated. (The fields
    # in call order, not sorted: as cheap as the plain items; another order of the same
    # keywords is one more entry for the same kernel.)
    arch = fields.get("arch")
    if arch is None:
        # the memo must not outlive a device switch: add the resolved arch to it
        try:
            device_arch = make.device_arch(make.device_ordinal(fields.get("device")))
        except NoDeviceError:
            device_arch = None  # (never memoized: make_key below raises, a bad field first)
        call: Any = (op, device_arch, *fields.items(), *map(type, fields.values()))
    else:
        call = (op, *fields.items(), *map(type, fields.values()))
    try:
        kernel = engine.calls.get(call)
    except TypeError:  # unhashable field value: skip the memo, validation will explain
        kernel, call = None, None
    if kernel is not None:
        engine.hits += 1  # (a memory hit, as the key's lookup would have been)
        return kernel
    kernel = engine.get(make_key(op, **fields))
    if call is not None:
        engine.calls[call] = kernel
    return kernel


class CacheInfo(NamedTuple):
    """This process's counters: ``hits`` (from memory), ``disk_hits`` (from the disk or a
    read-only cache), ``remote_hits``, ``misses``, ``compiles`` (NVRTC runs), ``memory_entries``;
    the disk cache's ``entries``, ``bytes`` on disk, ``directory`` (None without a usable one;
    one holding no cache yet reports 0 and 0: asking creates none) and ``size_limit`` (bytes);
    the ``readonly`` caches and the ``remote`` one's URL without its password, or None."""

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
    remote_hits: int = 0
    remote: str | None = None


def cache_info() -> CacheInfo:
    """Counters (hits, disk_hits, misses, compiles) and sizes (entries, bytes) of the caches;
    opens the disk cache only where its directory holds one."""
    engine, s = default_engine(), config.settings()
    fresh = None if engine.opened and engine.opened.settings is s else _not_created(s)
    disk = None if fresh or s.disable_disk_cache else engine.tiers().disk
    sizes = (0, 0, fresh, s.cache_size_limit) if disk is None else (
        len(disk), disk.volume(), str(disk.directory), disk.size_limit)  # fmt: skip
    remote = config.shown_url(s.remote_cache) if s.remote_cache else None
    return CacheInfo(engine.hits, engine.disk_hits, engine.misses, engine.compiles,
                     len(engine.memory), *sizes, tuple(map(str, s.readonly_cache)),
                     engine.remote_hits, remote)  # fmt: skip


def _not_created(s: config.Settings) -> str | None:
    """The cache directory where it has no store yet and may get one (creating nothing)."""
    from .core.tiers import STORE_DIR

    directory = existing = cache_dir(s)
    if s.disable_disk_cache or directory is None or os.path.isdir(directory / STORE_DIR):
        return None
    while not os.path.exists(existing) and existing.parent != existing:
        existing = existing.parent
    ok = os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)
    return str(directory) if ok else None


def clear_cache(*, memory: bool = True, disk: bool = True) -> None:
    """Empty the memory cache and/or the disk cache; settings are re-read on next use.

    With ``memory`` (the default) this process's counters that :func:`cache_info` reports
    (``hits``, ``disk_hits``, ``misses``, ``compiles``) are reset to 0 too;
    ``clear_cache(memory=False)`` empties the disk cache and keeps them.

    Both arguments must be ``True`` or ``False``: anything else (``disk="no"``, a truthy
    string that would delete every disk entry; ``disk=None``) raises
    :class:`~nvrtc_engine.ArgumentTypeError` naming the argument, and nothing is cleared.
    """
    for name, value in (("memory", memory), ("disk", disk)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(name, f"expected True or False, got {value!r}")
    default_engine().clear(memory=memory, disk=disk)


def _import_what_lookups_use() -> None:
    """Import now, with the API, what every process's first :func:`get_kernel` would import
    whatever the family: the disk store's library and the compiled launcher. Nothing starts (no
    CUDA, no NVRTC, no cache directory; tests/test_cache.py)."""
    import diskcache  # noqa: F401  (the disk tier's)

    from .core import native_launch  # noqa: F401


_import_what_lookups_use()
