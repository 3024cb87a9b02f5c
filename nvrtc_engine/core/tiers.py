"""The cache's stores (:class:`~nvrtc_engine.core.cache.Tier`): disk, read-only and remote caches.

:class:`DiskTier`: ``diskcache.Cache`` (public API only) in ``<cache dir>/entries``, capped in
size, least recently used first with a use counted once a day (an entry read on a new day is
stored again, under diskcache's ``least-recently-stored`` policy: a warm read is one query,
no write); ``<cache dir>/locks`` holds a file lock per digest stripe. :class:`ReadOnlyTier`: a
bundle file, or a directory of its layout (``entries/<digest>``), never written.
:class:`RedisTier`: a Redis server shared by a fleet (the ``redis`` client, an optional
extra), with a compile lease per digest.
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
from typing import TYPE_CHECKING, Any

from .cache import SCHEMA, Tier, check_entry
from .config import shown_url
from .errors import CacheWarning, warn, warn_once

if TYPE_CHECKING:
    from .config import Settings

__all__ = ["BUNDLE_ENTRIES", "STORE_DIR", "DiskTier", "ReadOnlyTier", "RedisTier",
           "open_readonly", "remove_store"]  # fmt: skip

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


def _damaged(why: str) -> bool:  # SQLite's words for a database it cannot read
    return "malformed" in why or "not a database" in why


def _warn_unusable(directory: Path | str, why: str, *, opening: bool = True) -> None:
    """Warn (:class:`CacheWarning`), once per directory, that a disk cache cannot be opened
    (``opening``) or written, and how to fix it."""
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
    """Entries in ``diskcache`` (SQLite index + files) under ``directory``, at most
    ``size_limit`` bytes. It writes a large value to a new file before the transaction that
    points at it commits (a small one inside it): a writer killed at any moment leaves the old
    entry or the new. A failing write stops writes (one warning); ``refused`` says why, as for
    an entry evicted as soon as it was stored."""

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
        default one), or ``(None, why)`` after one :class:`CacheWarning`. A damaged database is
        replaced by an empty one (one warning), under a lock file: once for all processes."""
        try:
            if directory is None:
                raise OSError("no home directory for the default cache directory")
            try:
                return cls(directory, size_limit), ""
            except Exception as exc:  # permission, read-only FS, full disk, damaged database
                if not _damaged(why := _why(exc)):
                    raise
            import filelock

            (directory / "locks").mkdir(exist_ok=True)
            with filelock.FileLock(str(directory / "locks" / "damaged.lock"), timeout=60):
                try:
                    return cls(directory, size_limit), ""  # replaced by another process
                except Exception as again:
                    if not _damaged(str(again)):
                        raise
                remove_store(directory)
                warn_once("damaged", str(directory), f"nvrtc_engine: the disk cache's database "
                          f"at {directory / STORE_DIR} was damaged ({why}); it was replaced by "
                          "an empty one.", CacheWarning)  # fmt: skip
                return cls(directory, size_limit), ""
        except Exception as exc:
            why = _why(exc)
        _warn_unusable(directory or "(default cache directory)", why)
        return None, why

    def get(self, digest: str) -> bytes | None:
        try:
            value, day = self._store.get(digest, tag=True, retry=True)
        except Exception:  # an unreadable value file (another user's), a damaged row
            return b""
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

    def __contains__(self, digest: object) -> bool:
        """Whether an entry is stored under ``digest`` (no use counted, nothing verified)."""
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

    def close(self) -> None:  # (a zip file closes when its object goes; a fork()ed child
        self._root = None  # reads through a file of its own)


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


class RedisTier(Tier):
    """Entries in a Redis server shared by a fleet, under ``{prefix}:{schema}:{digest}``; a
    compile lease under ``...:{digest}:lease``; the NVRTC versions that wrote entries in the
    set ``{prefix}:{schema}:nvrtc``.

    Every call is bounded by ``timeout`` (connect and socket, one immediate retry on a fresh
    connection: a restarted server's old connections fail once). A failure makes the tier
    answer "absent" for ``retry`` seconds, then it is tried again; one :class:`CacheWarning`
    per process. A full server (``maxmemory`` with ``noeviction``) refuses writes, reads go on
    (one warning). An entry's TTL is renewed at each read."""

    writable = shared = True

    def __init__(self, s: Settings) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        url, timeout = s.remote_cache or "", s.remote_timeout
        self.location, self.refused, self._retry = shown_url(url), "", s.remote_retry
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1), health_check_interval=0,
        )  # fmt: skip
        self._errors = redis.exceptions
        self._prefix, self._ttl_ms = f"{s.remote_prefix}:{SCHEMA}:", int(s.remote_ttl * 1e3) or None
        self._down_until = 0.0  # time.monotonic() before which the server is not asked

    @classmethod
    def open(cls, s: Settings) -> RedisTier | None:
        """The remote cache the settings name, or None: none named, or (one warning) the
        ``redis`` package is missing or refuses the URL."""
        if not s.remote_cache:
            return None
        try:
            return cls(s)
        except ImportError:
            why = "the redis package is not installed (pip install 'nvrtc-engine[redis]')"
        except Exception as exc:  # a URL redis-py refuses
            why = f"{type(exc).__name__}: {exc}"
        warn_once("remote", s.remote_cache, f"nvrtc_engine: NVRTC_ENGINE_REMOTE_CACHE is "
                  f"{shown_url(s.remote_cache)} but {why}; working without the remote "
                  "cache", CacheWarning)  # fmt: skip
        return None

    def _ask(self, call: Callable[[], Any], default: Any) -> Any:
        """``call()``'s answer, or ``default`` when the server is backed off, fails or refuses
        a write (full, or a read-only replica); never raises."""
        if time.monotonic() < self._down_until:
            return default
        try:
            return call()
        except (self._errors.OutOfMemoryError, self._errors.ReadOnlyError) as exc:
            self.refused = f"{type(exc).__name__}: {exc}"
            warn_once("remote full", self.location, f"nvrtc_engine: the remote cache at "
                      f"{self.location} refuses writes ({self.refused}): kernels are not "
                      "stored there; reading it goes on (give the server more maxmemory, or "
                      "an eviction policy such as allkeys-lru)", CacheWarning)  # fmt: skip
            return default
        except Exception as exc:  # unreachable, timed out, restarting, refused, NOAUTH...
            self._down_until = time.monotonic() + self._retry
            warn_once("remote", self.location, f"nvrtc_engine: the remote cache at "
                      f"{self.location} failed ({type(exc).__name__}: {exc}); working from "
                      f"the disk cache and NVRTC, asking it again every {self._retry:g} s "
                      "(NVRTC_ENGINE_REMOTE_RETRY)", CacheWarning)  # fmt: skip
            return default

    def get(self, digest: str) -> bytes | None:
        def read() -> bytes | None:  # (a pipeline: one round trip, on every Redis version)
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self._prefix + digest)
            if self._ttl_ms:
                pipe.pexpire(self._prefix + digest, self._ttl_ms)
            value = pipe.execute(raise_on_error=False)[0]
            if isinstance(value, Exception) and "WRONGTYPE" not in str(value):
                raise value  # (WRONGTYPE: another program's key, a bad entry)
            return value if value is None or isinstance(value, bytes) else b""

        return self._ask(read, None)

    def put(self, digest: str, value: bytes) -> bool:
        checked = check_entry(value, digest)
        if isinstance(checked, str):  # never share a bad entry
            return False

        def write() -> bool:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(self._prefix + digest, value, px=self._ttl_ms)
            pipe.sadd(f"{self._prefix}nvrtc", checked[1].nvrtc_version)
            return bool(pipe.execute()[0])

        return bool(self._ask(write, False))

    def _scan(self) -> list[str]:  # the digests of the entries under the prefix (may raise)
        names = self._client.scan_iter(self._prefix + "?" * 64, 1000)  # (not leases, nor nvrtc)
        return [name.decode(errors="replace")[len(self._prefix) :] for name in names]

    def digests(self) -> Iterator[str]:
        return iter(self._ask(self._scan, []))

    def _members(self) -> list[str]:  # the NVRTC versions that wrote entries here (may raise)
        return sorted(
            v.decode(errors="replace") for v in self._client.smembers(self._prefix + "nvrtc")
        )

    def nvrtc_versions(self) -> tuple[str, ...]:
        return tuple(self._ask(self._members, ()))

    @contextlib.contextmanager
    def lock(self, digest: str, wait: float) -> Iterator[bool]:
        """Hold the lease for compiling ``digest`` (redis-py's ``Lock``: ``SET NX PX``, given
        back by its owner only), ``wait`` seconds long, so that a killed holder's expires;
        yields whether it is held: False where the server cannot say (down or full), or after
        waiting ``wait`` seconds for another node (one :class:`CacheWarning`); the caller then
        compiles anyway."""
        life = max(wait, 0.001)  # (and redis-py's polling never longer than the lease)
        name = f"{self._prefix}{digest}:lease"
        lease = self._client.lock(name, life, sleep=min(life, 0.01), blocking_timeout=wait)
        held = self._ask(lease.acquire, None)
        if held is False:
            warn_once("remote wait", self.location, f"nvrtc_engine: waited {wait:g} s for "
                      f"another node compiling the same kernel (its lease {name} in the "
                      f"remote cache at {self.location}); compiling it here "
                      "(NVRTC_ENGINE_REMOTE_WAIT sets the wait)", CacheWarning)  # fmt: skip
        try:
            yield bool(held)
        finally:
            if held:  # (refused once it expired and is another's; failing, it expires)
                _quiet(lease.release, None)

    def state(self) -> dict[str, Any]:
        """For ``cache info``: ``reachable`` (now, ignoring the back-off), ``error``,
        ``entries`` under this prefix (None where the server cannot tell) and the
        ``nvrtc_versions`` that wrote them."""
        try:
            self._client.ping()
            return {
                "reachable": True,
                "error": None,
                "entries": len(self._scan()),
                "nvrtc_versions": self._members(),
            }
        except Exception as exc:
            return {"reachable": False, "error": f"{type(exc).__name__}: {exc}",
                    "entries": None, "nvrtc_versions": []}  # fmt: skip

    def close(self) -> None:
        _quiet(self._client.close, None)
