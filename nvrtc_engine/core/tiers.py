"""The cache's local stores (:class:`~nvrtc_engine.core.cache.Tier`): the disk cache
(:class:`DiskTier`) and read-only caches (:class:`ReadOnlyTier`). The remote cache is
:mod:`nvrtc_engine.core.remote`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .cache import Tier
from .errors import CacheWarning, warn, warn_once

__all__ = ["BUNDLE_ENTRIES", "STORE_DIR", "DiskTier", "ReadOnlyTier", "open_readonly",
           "remove_store"]  # fmt: skip

STORE_DIR = "entries"  # diskcache's directory inside the cache directory
BUNDLE_ENTRIES = "entries/"  # where a bundle (or a directory like one) keeps its entries
LOCK_STRIPE_CHARS = 3  # lock files named by 3 hex digits: at most 4096, shared 1 time in 4096
_SET_DIR = "set NVRTC_ENGINE_CACHE_DIR to a writable directory or NVRTC_ENGINE_DISABLE_DISK_CACHE=1"
_READ_ONLY = ("diskcache cannot open a cache it may not write: to serve a read-only cache "
              "(baked into an image, a shared mount), export it as a bundle (nvrtc-engine cache "
              "export) and name it in NVRTC_ENGINE_READONLY_CACHE; else " + _SET_DIR)  # fmt: skip


def _why(exc: BaseException) -> str:
    """``exc`` in words, a full disk (``ENOSPC``; SQLite's "database or disk is full") first."""
    full = getattr(exc, "errno", None) == errno.ENOSPC or "disk is full" in str(exc)
    return ("no space left on device (ENOSPC); " if full else "") + f"{type(exc).__name__}: {exc}"


def _warn_unusable(directory: Path | str, why: str, *, opening: bool = True) -> None:
    """One :class:`CacheWarning` per directory: its disk cache cannot be opened (``opening``)
    or written, and the fix."""
    fix = "free some space, or run `nvrtc-engine cache clear`" if why.startswith("no space") else (
        _READ_ONLY if opening else _SET_DIR)  # fmt: skip
    warn_once("cache", str(directory), f"nvrtc_engine: disk cache at {directory} "
              f"{'is unusable' if opening else 'cannot be written'} ({why}); kernels are kept "
              f"in memory only; {fix}.", CacheWarning)  # fmt: skip


def remove_store(directory: Path) -> None:
    """Remove the store in ``directory`` whole (one that cannot be opened or cleared)."""
    shutil.rmtree(directory / STORE_DIR, ignore_errors=True)


def _quiet(call: Callable[[], Any], default: Any) -> Any:  # call's answer, or default
    try:
        return call()
    except Exception:
        return default


class DiskTier(Tier):
    """``diskcache`` (public API only) in ``<directory>/entries``, at most ``size_limit`` bytes,
    least recently used first out, a use counted once a day (an entry read on a new day is
    stored again); a killed writer leaves the old entry or the new. A failing write stops writes
    (one warning); ``refused`` says why, as for an entry evicted as soon as it was stored."""

    writable = True

    def __init__(self, directory: Path, limit: int) -> None:
        import diskcache

        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.location, self.size_limit = directory, str(directory), limit
        self.refused = ""
        # sqlite_synchronous=0: SQLite never waits for fsync (an open of the cache took 25 ms
        # with it, 3 ms without); an OS crash may then damage the database: replaced on open
        settings = {"eviction_policy": "least-recently-stored", "sqlite_synchronous": 0}
        self._store = diskcache.Cache(str(directory / STORE_DIR), 60, size_limit=limit, **settings)

    @classmethod
    def open(cls, directory: Path | None, size_limit: int) -> tuple[DiskTier | None, str]:
        """The disk cache in ``directory`` (made if missing; None: no home directory for the
        default one), or ``(None, why)`` after one :class:`CacheWarning`."""
        try:
            if directory is None:
                raise OSError("no home directory for the default cache directory")
            return cls._open(directory, size_limit), ""
        except Exception as exc:  # permission, read-only FS, full disk...
            why = _why(exc)
        _warn_unusable(directory or "(default cache directory)", why)
        return None, why

    @classmethod
    def _open(cls, directory: Path, size_limit: int, locked: bool = False) -> DiskTier:
        """A damaged database replaced by an empty one (one warning) under a lock file: once
        for all processes (the next holder opens the new one)."""
        try:
            return cls(directory, size_limit)
        except Exception as exc:
            if "malformed" not in str(exc) and "not a database" not in str(exc):
                raise
            if not locked:
                import filelock

                (directory / "locks").mkdir(exist_ok=True)
                with filelock.FileLock(str(directory / "locks" / "damaged.lock"), timeout=60):
                    return cls._open(directory, size_limit, True)
            remove_store(directory)
            warn_once("damaged", str(directory), f"nvrtc_engine: the disk cache's database at "
                      f"{directory / STORE_DIR} was damaged ({_why(exc)}); it was replaced by an "
                      "empty one.", CacheWarning)  # fmt: skip
            return cls(directory, size_limit)

    def get(self, digest: str) -> bytes | None:
        try:  # (diskcache answers None for a value file it cannot read: another user's)
            value, day = self._store.get(digest, tag=True, retry=True)
        except Exception:  # a damaged row, or an error that may pass: a miss, nothing removed
            return None
        if value is not None and day != int(time.time() // 86400):  # a use on a new day
            self.put(digest, value)
        return value if value is None or isinstance(value, bytes) else b""

    def put(self, digest: str, value: bytes) -> bool:
        if not self.writable:
            return False
        try:
            self._store.set(digest, value, tag=int(time.time() // 86400), retry=True)
            if digest in self._store:
                return True
        except Exception as exc:
            self.writable, self.refused = False, _why(exc)
            _warn_unusable(self.directory, self.refused, opening=False)
            return False
        self.refused = (f"its size limit ({self.size_limit} bytes, NVRTC_ENGINE_CACHE_SIZE_LIMIT) "
                        "evicted them as soon as they were stored: raise it")  # fmt: skip
        warn_once("evicted", self.location, f"nvrtc_engine: a kernel of {len(value)} bytes was "
                  f"evicted as soon as it was stored in the disk cache at {self.directory}: "
                  f"{self.refused}; such kernels are kept in memory.", CacheWarning)  # fmt: skip
        return False

    def delete(self, digest: str) -> None:
        _quiet(lambda: self._store.delete(digest, retry=True), None)

    def digests(self) -> Iterator[str]:
        return iter(_quiet(lambda: list(self._store), []))

    def __contains__(self, digest: object) -> bool:  # stored (no use counted, nothing verified)
        return bool(_quiet(lambda: digest in self._store, False))

    def __len__(self) -> int:
        return int(_quiet(lambda: len(self._store), 0))

    def volume(self) -> int:  # bytes used on disk (database and files)
        return int(_quiet(self._store.volume, 0))

    def check(self, fix: bool) -> list[str]:
        """diskcache's check of its index against its files (orphan files, rows without one),
        repaired with ``fix`` (twice: removed files can leave empty directories)."""
        with warnings.catch_warnings():  # it reports by warnings, under the caller's filters
            warnings.simplefilter("always")
            check = lambda: self._store.check(fix=fix, retry=True)  # noqa: E731
            return [str(w.message) for _ in range(1 + fix) for w in _quiet(check, [])]

    def clear(self) -> None:
        """Remove every entry; where diskcache cannot (a full disk: SQLite cannot journal the
        deletes), the store whole."""
        if _quiet(lambda: self._store.clear(retry=True), None) is None:
            self.close()
            remove_store(self.directory)

    @contextlib.contextmanager
    def lock(self, digest: str, timeout: float) -> Iterator[bool]:
        """Hold the cross-process lock for building ``digest``; yields whether it is held:
        False past ``timeout`` seconds (one :class:`CacheWarning`) or where no lock file can be
        made, and the caller builds anyway (at worst a duplicate compile). The OS drops the lock
        (``flock``) when its holder dies."""
        import filelock

        path = self.directory / "locks" / f"{digest[:LOCK_STRIPE_CHARS]}.lock"
        held: Any = filelock.FileLock(str(path))
        try:
            path.parent.mkdir(exist_ok=True)
            held.acquire(timeout=timeout, poll_interval=0.005)
        except (filelock.Timeout, OSError) as exc:
            held = isinstance(exc, filelock.Timeout) and warn(
                f"nvrtc_engine: waited {timeout:g} s for {path}, held by another process "
                "compiling the same kernel; compiling without it (NVRTC_ENGINE_LOCK_TIMEOUT sets "
                "the wait)", CacheWarning)  # fmt: skip
        try:
            yield bool(held)
        finally:
            if held:
                held.release()

    def close(self) -> None:
        _quiet(self._store.close, None)


class ReadOnlyTier(Tier):
    """The entries of a bundle file, or a directory of its layout (``entries/<digest>``), listed
    when opened, never written; ``OSError`` or ``zipfile.BadZipFile`` where it is neither."""

    shared = True

    def __init__(self, path: Path) -> None:
        self.location, self._path, self._root = str(path), path, None
        self._digests = {p.name for p in (self._open() / BUNDLE_ENTRIES).iterdir()}

    def _open(self) -> Any:  # the directory, or the zip file as a path (zipfile.Path)
        if self._root is None:
            import zipfile

            self._root = self._path if self._path.is_dir() else zipfile.Path(self._path)
        return self._root

    def get(self, digest: str) -> bytes | None:
        if digest not in self._digests:
            return None
        try:
            return bytes((self._open() / BUNDLE_ENTRIES / digest).read_bytes())
        except Exception:  # unreadable, or gone: a bad entry
            return b""

    def digests(self) -> Iterator[str]:
        return iter(sorted(self._digests))

    def nvrtc_versions(self) -> tuple[str, ...]:
        """The NVRTC versions its manifest (``manifest.json``, as a bundle has) names."""
        try:
            manifest = json.loads((self._open() / "manifest.json").read_bytes())
            named = {manifest["nvrtc_version"], *(r["nvrtc_version"] for r in manifest["entries"])}
            return tuple(sorted(v for v in named if isinstance(v, str)))
        except Exception:  # no manifest, or a damaged one: no other version found here
            return ()

    def close(self) -> None:  # (a zip closes when its object goes; a child opens its own)
        self._root = None


def open_readonly(paths: Sequence[Path]) -> tuple[ReadOnlyTier, ...]:
    """The read-only tiers of ``paths`` that can be read; one :class:`CacheWarning` for each
    of the others, which are skipped."""
    tiers = []
    for path in paths:
        try:
            tiers.append(ReadOnlyTier(path))
        except Exception as exc:
            warn_once("read-only cache", str(path), f"nvrtc_engine: the read-only cache {path} "
                      f"cannot be read ({type(exc).__name__}: {exc}); it is skipped "
                      "(NVRTC_ENGINE_READONLY_CACHE names bundle files, and directories "
                      "holding a bundle's entries/)", CacheWarning)  # fmt: skip
    return tuple(tiers)
