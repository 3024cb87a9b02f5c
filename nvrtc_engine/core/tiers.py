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
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache import SCHEMA, Tier, check_entry
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


class DiskTier(Tier):
    """Entries in ``diskcache`` (SQLite index + files) under ``directory``, size-capped. It
    writes a large value to a new file before the transaction that points at it commits (a
    small one inside it): a writer killed at any moment leaves the old entry or the new. A
    failing write stops writes (one warning); ``refused`` says why, as for an entry evicted
    as soon as it was stored."""

    writable = True

    def __init__(self, directory: Path, limit: int) -> None:
        import diskcache

        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.location, self.refused = directory, str(directory), ""
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
            return cls(directory, size_limit), ""
        except Exception as exc:  # permission, read-only FS, full disk, damaged database
            why = _why(exc)
            if directory and ("malformed" in why or "file is not a database" in why):  # damaged
                try:
                    import filelock

                    (directory / "locks").mkdir(exist_ok=True)
                    with filelock.FileLock(str(directory / "locks" / "damaged.lock"), timeout=60):
                        try:
                            return cls(directory, size_limit), ""  # replaced by another process
                        except Exception as again:
                            if "malformed" not in str(again) and "not a database" not in str(again):
                                raise
                        remove_store(directory)
                        warn_once("damaged", str(directory), f"nvrtc_engine: the disk cache's "
                                  f"database at {directory / STORE_DIR} was damaged ({why}); it "
                                  "was replaced by an empty one.", CacheWarning)  # fmt: skip
                        return cls(directory, size_limit), ""
                except Exception as again:
                    why = _why(again)
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

    @staticmethod
    def _ask(call: Callable[[], Any], default: Any) -> Any:  # call's answer, or default
        try:
            return call()
        except Exception:
            return default

    def delete(self, digest: str) -> None:
        self._ask(lambda: self._store.delete(digest, retry=True), None)

    def digests(self) -> Iterator[str]:
        return iter(self._ask(lambda: list(self._store), []))

    def __contains__(self, digest: object) -> bool:
        """Whether an entry is stored under ``digest`` (no use counted, nothing verified)."""
        return bool(self._ask(lambda: digest in self._store, False))

    def __len__(self) -> int:
        return int(self._ask(lambda: len(self._store), 0))

    def volume(self) -> int:  # bytes used on disk (database and files)
        return int(self._ask(self._store.volume, 0))

    @property
    def size_limit(self) -> int:  # the size cap, bytes
        return int(getattr(self._store, "size_limit", 0))

    def check(self, fix: bool) -> list[str]:
        """diskcache's check of its index against its files (orphan files, rows without one),
        repaired with ``fix`` (twice: removed files can leave empty directories)."""
        with warnings.catch_warnings():  # it reports by warnings, under the caller's filters
            warnings.simplefilter("always")
            check = lambda: self._store.check(fix=fix, retry=True)  # noqa: E731
            return [str(w.message) for _ in range(1 + fix) for w in self._ask(check, [])]

    def clear(self) -> int:
        """Remove every entry; how many there were. Where diskcache cannot (a full disk:
        SQLite cannot journal the deletes), the store is removed whole."""
        count = len(self)
        if self._ask(lambda: self._store.clear(retry=True), None) is None:
            self.close()
            remove_store(self.directory)
        return count

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
        self._ask(self._store.close, None)


class ReadOnlyTier(Tier):
    """The entries of a bundle file, or a directory of its layout (``entries/<digest>``), listed
    when opened, never written; ``OSError`` or ``zipfile.BadZipFile`` where it is neither."""

    shared = True

    def __init__(self, path: Path) -> None:
        self.location, self._path, self._zip, self._pid = str(path), path, None, 0
        self._dir = path / BUNDLE_ENTRIES if path.is_dir() else None
        names = os.listdir(self._dir) if self._dir else self._zipfile().namelist()
        self._digests = {n.removeprefix(BUNDLE_ENTRIES) for n in names if self._dir or (
            n.startswith(BUNDLE_ENTRIES))}  # fmt: skip

    def _zipfile(self) -> Any:
        if self._pid != os.getpid():  # a fork()ed child reads through a file of its own
            import zipfile

            self._zip, self._pid = zipfile.ZipFile(self._path), os.getpid()
        return self._zip

    def get(self, digest: str) -> bytes | None:
        if digest not in self._digests:
            return None
        try:
            if self._dir is None:
                return bytes(self._zipfile().read(BUNDLE_ENTRIES + digest))
            with open(self._dir / digest, "rb") as f:
                return f.read()
        except Exception:  # unreadable, or gone: a bad entry
            return b""

    def digests(self) -> Iterator[str]:
        return iter(sorted(self._digests))

    def nvrtc_versions(self) -> tuple[str, ...]:
        """The NVRTC versions its manifest (``manifest.json``, as a bundle has) names."""
        try:
            if self._dir is None:
                text = self._zipfile().read("manifest.json")
            else:
                text = (self._dir.parent / "manifest.json").read_bytes()
            manifest = json.loads(text)
            named = {manifest["nvrtc_version"], *(r["nvrtc_version"] for r in manifest["entries"])}
            return tuple(sorted(v for v in named if isinstance(v, str)))
        except Exception:  # no manifest, or a damaged one: no other version found here
            return ()

    def close(self) -> None:  # (the zip file closes when its object goes)
        self._zip, self._pid = None, 0


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


# Compare-and-delete: a lease is deleted by its owner only, never after it expired and
# another node took it.
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""
_HEX64 = re.compile(r"[0-9a-f]{64}")


class RedisTier(Tier):
    """Entries in a Redis server shared by a fleet, under ``{prefix}:{schema}:{digest}``; a
    compile lease under ``...:{digest}:lease``; the NVRTC versions that wrote entries in the
    set ``{prefix}:{schema}:nvrtc``.

    Every call is bounded by ``timeout`` (connect and socket, one immediate retry on a fresh
    connection: a restarted server's old connections fail once). A failure makes the tier
    answer "absent" for ``retry`` seconds, then it is tried again; one :class:`CacheWarning`
    per process. A full server (``maxmemory`` with ``noeviction``) refuses writes, reads go on
    (one warning). An entry's TTL is renewed at each read (``GETEX``)."""

    writable = shared = True

    def __init__(self, url: str, prefix: str, ttl: float, timeout: float, retry: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from .config import shown_url

        self.location, self.refused, self._retry = shown_url(url), "", retry
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1), health_check_interval=0,
        )  # fmt: skip
        self._errors = redis.exceptions
        self._prefix, self._ttl_ms = f"{prefix}:{SCHEMA}:", int(ttl * 1000) or None
        self._down_until = 0.0  # time.monotonic() before which the server is not asked
        self._getex = True  # GETEX (Redis 6.2+), else GET
        self._versions: tuple[tuple[str, ...], float] = ((), 0.0)
        self._release = self._client.register_script(_RELEASE)

    @classmethod
    def open(cls, s: Settings) -> RedisTier | None:
        """The remote cache the settings name, or None: none named, or (one warning) the
        ``redis`` package is missing."""
        if not s.remote_cache:
            return None
        try:
            return cls(s.remote_cache, s.remote_prefix, s.remote_ttl, s.remote_timeout,
                       s.remote_retry)  # fmt: skip
        except ImportError:
            why = "the redis package is not installed (pip install 'nvrtc-engine[redis]')"
        except Exception as exc:  # a URL redis-py refuses
            why = f"{type(exc).__name__}: {exc}"
        from .config import shown_url

        warn_once("remote", s.remote_cache, f"nvrtc_engine: NVRTC_ENGINE_REMOTE_CACHE is "
                  f"{shown_url(s.remote_cache)} but {why}; working without the remote "
                  "cache", CacheWarning)  # fmt: skip
        return None

    def _key(self, digest: str, suffix: str = "") -> str:
        return f"{self._prefix}{digest}{suffix}"

    def _ask(self, call: Callable[[], Any], default: Any, *, writing: bool = False) -> Any:
        """``call()``'s answer, or ``default`` when the server is backed off, fails or (for a
        write) is full; never raises."""
        if time.monotonic() < self._down_until:
            return default
        errors = self._errors
        try:
            return call()
        except (errors.OutOfMemoryError, errors.ReadOnlyError) as exc:
            if not writing:
                return default
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

    def _get(self, name: str) -> Any:
        if self._getex and self._ttl_ms:
            try:
                return self._client.getex(name, px=self._ttl_ms)
            except self._errors.ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._getex = False  # a server older than Redis 6.2
        return self._client.get(name)

    def get(self, digest: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                value = self._get(self._key(digest))
            except self._errors.ResponseError as exc:  # WRONGTYPE: another program's key
                if "WRONGTYPE" not in str(exc):
                    raise
                return b""
            return value if value is None or isinstance(value, bytes) else b""

        return self._ask(read, None)

    def put(self, digest: str, value: bytes) -> bool:
        checked = check_entry(value, digest)
        if isinstance(checked, str):  # never share a bad entry
            return False

        def write() -> bool:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(self._key(digest), value, px=self._ttl_ms)
            pipe.sadd(f"{self._prefix}nvrtc", checked[1].nvrtc_version)
            return bool(pipe.execute()[0])

        return bool(self._ask(write, False, writing=True))

    def delete(self, digest: str) -> None:
        self._ask(lambda: self._client.delete(self._key(digest)), None, writing=True)

    def _scan(self) -> list[str]:  # the digests of the entries under the prefix (may raise)
        start = len(self._prefix)
        names = (n.decode(errors="replace")[start:] for n in self._client.scan_iter(
            self._prefix + "*", 1000))  # fmt: skip
        return [d for d in names if _HEX64.fullmatch(d)]

    def digests(self) -> Iterator[str]:
        return iter(self._ask(self._scan, []))

    def nvrtc_versions(self) -> tuple[str, ...]:
        """The NVRTC versions that wrote entries here (asked again after ``retry`` seconds)."""
        versions, asked = self._versions
        if time.monotonic() - asked > max(self._retry, 1.0):
            found = self._ask(lambda: self._client.smembers(f"{self._prefix}nvrtc"), None)
            if found is not None:
                versions = tuple(sorted(v.decode(errors="replace") for v in found))
            self._versions = (versions, time.monotonic())
        return versions

    def take_lease(self, digest: str, seconds: float) -> str | None:
        """Claim the right to compile ``digest`` for ``seconds`` (``SET NX PX``): a token to
        give back with :meth:`drop_lease`; None while another node holds it; ``""`` where the
        server cannot say (down or full: compile without a lease)."""
        import socket  # (not at import: it costs milliseconds a warm start never needs)

        token = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(8).hex()}"
        claim = lambda: self._client.set(  # noqa: E731
            self._key(digest, ":lease"), token, nx=True, px=max(1, int(seconds * 1000))
        )
        taken = self._ask(claim, "", writing=True)
        return "" if taken == "" else token if taken else None

    def drop_lease(self, digest: str, token: str) -> None:
        """Give a lease back, if it is still ``token``'s (else it expired and is another's)."""
        if token:
            self._ask(lambda: self._release(keys=[self._key(digest, ":lease")], args=[token]), None)

    def state(self) -> dict[str, Any]:
        """For ``cache info``: ``reachable`` (now, ignoring the back-off), ``error`` and
        ``entries`` under this prefix (None where the server cannot tell)."""
        try:
            self._client.ping()
            count = len(self._scan())
            versions = self._client.smembers(f"{self._prefix}nvrtc")
            return {
                "reachable": True,
                "error": None,
                "entries": count,
                "nvrtc_versions": sorted(v.decode(errors="replace") for v in versions),
            }
        except Exception as exc:
            return {"reachable": False, "error": f"{type(exc).__name__}: {exc}",
                    "entries": None, "nvrtc_versions": []}  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()
