"""The on-disk kernel cache: verified entries in ``diskcache``, addressed by a content digest.

The digest covers everything that determines the compiled bytes: the rendered source, the
in-memory headers, the NVRTC flags, the NVRTC version, the CUDA header version (when CUDA
headers are used) and :data:`SCHEMA`; never an install path. An entry is one bytes value::

    MAGIC | u32 header length | JSON header | image

where the header records the key, symbols, digest, NVRTC version, options, compile time and
the SHA-256 of the image. Every load checks magic, lengths, schema, digest and hash; any
mismatch (truncated write, garbage, a stale format) is a miss, and the bad entry is removed.
A directory that cannot be opened or written degrades to memory-only with one warning; one
that holds a cache and can be read but not written is opened read-only (:class:`_ReadOnlyStore`):
its kernels are read, new ones are kept in memory only, with one warning.

Processes sharing a directory compile each digest once: :meth:`DiskCache.lock` is an OS file
lock (``flock``, through ``filelock``) on one of 4096 lock files picked by the digest, taken
around "look again, compile, store". The OS drops it when its holder dies, so a killed
holder blocks nobody; a live holder that keeps it past the timeout is passed over (the
waiter compiles too, and the last store wins: both are the same bytes).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CacheWarning, warn, warn_once
from .index import KeyIndex
from .kernel import Artifact

if TYPE_CHECKING:
    import sqlite3

__all__ = [
    "LOCK_STRIPE_CHARS",
    "MAGIC",
    "SCHEMA",
    "BadEntry",
    "DiskCache",
    "VerifyReport",
    "compute_digest",
    "decode_entry",
    "encode_entry",
    "target_arch",
    "warn_read_only",
    "warn_unusable",
]

SCHEMA = 1
ENTRIES_DIR = "entries"  # diskcache's directory inside the cache directory
MAGIC = b"NVRTCENGINE\x01"
# Lock files are named by the first hex digits of the digest: at most 16**3 = 4096 empty
# files however many entries come and go; two keys share a lock 1 time in 4096.
LOCK_STRIPE_CHARS = 3
_LEN = struct.Struct("<I")


@functools.lru_cache(maxsize=16)
def _header_hashes(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, hashlib.sha256(text.encode()).hexdigest()) for name, text in headers)


def compute_digest(
    source: str,
    headers: Sequence[tuple[str, str]],
    flags: Sequence[str],
    nvrtc_version: str,
    header_version: str | None,
) -> str:
    """SHA-256 (hex) over everything that determines a compiled image."""
    h = hashlib.sha256()
    h.update(json.dumps({
        "schema": SCHEMA,
        "flags": list(flags),
        "nvrtc": nvrtc_version,
        "cuda_headers": header_version,
        "headers": [list(pair) for pair in _header_hashes(tuple(headers))],
    }, sort_keys=True).encode())  # fmt: skip
    h.update(b"\0")
    h.update(source.encode())
    return h.hexdigest()


def encode_entry(key_name: str, artifact: Artifact) -> bytes:
    """Serialize an artifact into one verified cache value."""
    header = json.dumps({
        "schema": SCHEMA,
        "key": key_name,
        "symbols": list(artifact.symbols),
        "digest": artifact.digest,
        "nvrtc_version": artifact.nvrtc_version,
        "options": list(artifact.options),
        "kind": artifact.kind,
        "compile_ms": artifact.compile_ms,
        "created": time.time(),
        "size": len(artifact.image),
        "sha256": hashlib.sha256(artifact.image).hexdigest(),
    }, sort_keys=True).encode()  # fmt: skip
    return MAGIC + _LEN.pack(len(header)) + header + artifact.image


def _parse(value: Any, digest: str | None) -> tuple[dict[str, Any] | None, bytes | None, str]:
    """Split and check a cache value: ``(header, image, "")`` when it verifies, else
    ``(header or None, None, why)``; the one parser behind loads and ``verify`` reports."""
    if not isinstance(value, (bytes, bytearray)) or not value.startswith(MAGIC):
        return None, None, "not an nvrtc_engine entry (garbage or another format)"
    data = bytes(value)
    start = len(MAGIC) + _LEN.size
    if len(data) < start:
        return None, None, "truncated header"
    (hlen,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + hlen])
    except ValueError:
        return None, None, "damaged or truncated header"
    if not isinstance(header, dict):
        return None, None, "damaged header"
    image = data[start + hlen :]
    if header.get("schema") != SCHEMA:
        return header, None, f"schema {header.get('schema')!r}, this version reads {SCHEMA}"
    if digest is not None and header.get("digest") != digest:
        return header, None, "stored under another digest"
    if header.get("size") != len(image):
        return header, None, f"truncated image ({len(image)} of {header.get('size')} bytes)"
    if header.get("sha256") != hashlib.sha256(image).hexdigest():
        return header, None, "image SHA-256 mismatch (corrupted)"
    return header, image, ""


def decode_entry(value: Any, digest: str | None = None) -> tuple[dict[str, Any], Artifact] | None:
    """Parse and verify a cache value; ``None`` if it is damaged or not for ``digest``."""
    header, image, _why = _parse(value, digest)
    if header is None or image is None:
        return None
    try:
        artifact = Artifact(
            image=image,
            kind=str(header["kind"]),
            symbols=tuple(header["symbols"]),
            digest=str(header["digest"]),
            nvrtc_version=str(header["nvrtc_version"]),
            options=tuple(header["options"]),
            compile_ms=float(header["compile_ms"]),
        )
    except (KeyError, TypeError, ValueError):  # a header with fields missing: not ours
        return None
    return header, artifact


def target_arch(artifact: Artifact) -> str:
    """The ``-arch`` an entry was compiled for (``sm_90a``, or ``compute_120`` for PTX)."""
    return next((f[len("-arch=") :] for f in artifact.options if f.startswith("-arch=")), "?")


def warn_unusable(directory: Path | str, why: str) -> None:
    """Warn (:class:`CacheWarning`) that a cache directory is unusable, once per directory."""
    warn_once(
        "cache", str(directory),
        f"nvrtc_engine: disk cache at {directory} is unusable ({why}); kernels are kept in "
        "memory only. Set NVRTC_ENGINE_CACHE_DIR to a writable directory, or "
        "NVRTC_ENGINE_DISABLE_DISK_CACHE=1 to silence this.",
        CacheWarning,
    )  # fmt: skip


def warn_read_only(directory: Path | str, why: str) -> None:
    """Warn (:class:`CacheWarning`) that a cache directory is read-only, once per directory
    (the same once as :func:`warn_unusable`: a directory warns one way or the other)."""
    warn_once(
        "cache", str(directory),
        f"nvrtc_engine: disk cache at {directory} is read-only ({why}); kernels already there "
        "are read, new ones are kept in memory only. Set NVRTC_ENGINE_CACHE_DIR to a writable "
        "directory to keep them, or NVRTC_ENGINE_DISABLE_DISK_CACHE=1 to silence this.",
        CacheWarning,
    )  # fmt: skip


def _read_only_reason(directory: Path, why: str) -> str:
    """Why a cache that can be read cannot be written, in the system's words where it has
    them (a read-only file system, no write permission), then diskcache's error ``why``
    (SQLite says only "unable to open database file" on a read-only mount)."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"read-only file system; {why}"
    except (OSError, AttributeError):  # no statvfs (Windows) or no directory
        pass
    if not os.access(directory, os.W_OK):
        return f"no write permission; {why}"
    return why


class _ReadOnlyStore:
    """The reading part of ``diskcache.Cache``'s interface over its database opened read-only.

    ``diskcache`` 5.6 has no read-only mode: opening a ``Cache`` writes its settings, and
    every ``get`` under least-recently-used eviction counts the use in a write transaction,
    which a read-only directory or database refuses ("attempt to write a readonly
    database"). This reads the same tables with SQLite opened read-only, and leaves the value
    files' format to ``diskcache.Disk``. It has no writing methods; :class:`DiskCache` never
    calls them on a read-only cache.

    SQLite opens the database ``mode=ro`` where its writers left (or let it create) the
    ``-shm`` file of write-ahead logging, else (a read-only directory of a cache no process
    has open) ``immutable=1``, which reads the database file as it stands. Should a writer
    change it meanwhile, a read may fail or find a damaged entry: a miss, as every entry is
    verified (SHA-256) on load.
    """

    def __init__(self, directory: str) -> None:
        import diskcache
        from diskcache.core import DBNAME

        self.directory = directory
        self._disk = diskcache.Disk(directory, min_file_size=0)
        self._uri = Path(directory, DBNAME).absolute().as_uri()
        self._local = threading.local()
        self.size_limit = int(self._setting("size_limit"))  # raises if it cannot be read

    @classmethod
    def open(cls, directory: Path) -> _ReadOnlyStore | None:
        """The store of the cache in ``directory`` (diskcache's), or ``None`` where there is
        no database or it cannot be read."""
        from diskcache.core import DBNAME

        if not (directory / DBNAME).is_file():
            return None
        try:
            return cls(str(directory))
        except Exception:
            return None

    def _connect(self) -> sqlite3.Connection:
        import sqlite3  # (not imported by a warm process, which reads through the key index)

        error: Exception = sqlite3.OperationalError("unreachable")
        for flag in ("mode=ro", "immutable=1"):
            con = sqlite3.connect(f"{self._uri}?{flag}", uri=True)
            try:
                con.execute("SELECT COUNT(*) FROM Settings").fetchall()
                return con
            except sqlite3.Error as exc:
                con.close()
                error = exc
        raise error

    @property
    def _sql(self) -> Any:
        # one connection per thread and process, as diskcache keeps them
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.pid, local.con = os.getpid(), None
        if local.con is None:
            local.con = self._connect()
        return local.con.execute

    def _setting(self, name: str) -> Any:
        ((value,),) = self._sql("SELECT value FROM Settings WHERE key = ?", (name,)).fetchall()
        return value

    def _row(self, key: str) -> Any:
        db_key, raw = self._disk.put(key)
        rows = self._sql(
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = ?", (db_key, raw)
        ).fetchall()
        return rows[0] if rows else None

    def get(self, key: str, default: Any = None, read: bool = False, retry: bool = False) -> Any:
        row = self._row(key)
        return default if row is None else self._disk.fetch(*row, read)

    def __contains__(self, key: str) -> bool:
        return self._row(key) is not None

    def __len__(self) -> int:
        return int(self._setting("count"))

    def volume(self) -> int:
        ((pages,),) = self._sql("PRAGMA page_count").fetchall()
        ((page_size,),) = self._sql("PRAGMA page_size").fetchall()
        return int(pages) * int(page_size) + int(self._setting("size"))

    def iterkeys(self) -> Iterator[str]:
        rows = self._sql("SELECT key, raw FROM Cache ORDER BY key, raw").fetchall()
        for key, raw in rows:
            yield self._disk.get(key, raw)

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None and getattr(self._local, "pid", None) == os.getpid():
            con.close()
        self._local.con = None


@dataclass(frozen=True)
class BadEntry:
    """A cache entry that failed verification: its ``digest``, ``key`` (``"?"`` when the
    header is unreadable) and ``reason``."""

    digest: str
    key: str
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`DiskCache.verify` found: ``checked`` entries, ``bad`` ones (removed when
    fixing) and ``problems`` (index/file inconsistencies ``diskcache`` found and repaired,
    such as a value file left behind by a writer that was killed)."""

    checked: int
    bad: tuple[BadEntry, ...]
    problems: tuple[str, ...]


class _KeyLock:
    """A held (or passed-over) per-digest file lock; ``held`` says which."""

    __slots__ = ("_lock", "held")

    def __init__(self, lock: Any, held: bool) -> None:
        self._lock = lock
        self.held = held

    def __enter__(self) -> bool:
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self.held:
            with contextlib.suppress(Exception):
                self._lock.release()
            self.held = False


def _open_store(directory: Path, size_limit: int) -> Any:
    """The ``diskcache.Cache`` of ``directory`` (made if missing); raises what opening
    raises."""
    import diskcache

    directory.mkdir(parents=True, exist_ok=True)
    # entries/ is diskcache's; locks/ beside it, so diskcache's index check (verify) never
    # takes the lock files for orphans
    # disk_min_file_size=0: every value in its own file (diskcache's default keeps values
    # under 32 KiB, most cubins, inside SQLite), so that the key index can read an entry
    # without importing diskcache or opening SQLite
    return diskcache.Cache(
        str(directory / ENTRIES_DIR),
        size_limit=size_limit,
        eviction_policy="least-recently-used",
        disk_min_file_size=0,
        timeout=60,
    )


def _damaged(exc: BaseException) -> bool:
    """Whether ``exc`` says the SQLite database itself is damaged (SQLITE_CORRUPT: "database
    disk image is malformed"; SQLITE_NOTADB: "file is not a database"), not that it could
    not be opened, written or locked."""
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return str(name).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    text = str(exc)
    return "malformed" in text or "file is not a database" in text


def _replace_damaged(directory: Path, size_limit: int, why: str) -> Any | None:
    """A new, empty store in place of a damaged one, or ``None`` where that cannot be done
    (the caller then treats the directory as unusable, as before).

    Under a lock file in ``locks/`` (so that two processes finding the same damage replace
    it once, and neither moves away the store the other has just made) the store is opened
    again: another process may have replaced it meanwhile. If it is still damaged, its
    directory is renamed aside, a new store made, and the damaged one removed; one
    :class:`CacheWarning` says so. The kernels it held are lost only as files: each is
    compiled again when it is next asked for, and key index records that pointed into it
    are misses (their reads are verified)."""
    aside = directory / f"{ENTRIES_DIR}.damaged-{os.getpid()}-{time.time_ns()}"
    try:
        import filelock

        locks = directory / "locks"
        locks.mkdir(exist_ok=True)
        with filelock.FileLock(str(locks / "replace-damaged.lock"), timeout=60):
            try:
                return _open_store(directory, size_limit)  # replaced by another process
            except Exception as again:
                if not _damaged(again):
                    return None
            os.rename(directory / ENTRIES_DIR, aside)
            store = _open_store(directory, size_limit)
    except Exception:  # no lock, no rename (permissions), or the new store fails too
        return None
    import shutil

    shutil.rmtree(aside, ignore_errors=True)
    warn_once(
        "damaged", str(directory),
        f"nvrtc_engine: the disk cache's database at {directory / ENTRIES_DIR} was damaged "
        f"({why}); it was replaced by a new, empty one: its kernels are compiled again as "
        "they are needed.",
        CacheWarning,
    )  # fmt: skip
    return store


class DiskCache:
    """Verified kernel images in a ``diskcache.Cache`` (SQLite index + files), LRU-capped.

    Use :meth:`open`, which returns ``None`` (after one warning) when the directory is
    unusable, and a ``read_only`` cache (after one warning) when it holds a cache that can be
    read but not written. Reads never raise: a damaged or unreadable entry is a miss and is
    removed (left, when read-only). A failing write disables further writes with one warning.

    ``diskcache`` writes a value of 32 KiB or more to a new, randomly named file (opened
    with ``O_EXCL``) before the SQLite transaction that points the index at it commits, and
    smaller values inside that transaction: a writer killed at any moment leaves either the
    previous entry or the new one (at worst an orphan file, which :meth:`verify` removes),
    and the hash check on every load catches what the file system lost after a crash.
    """

    def __init__(self, directory: Path, store: Any, *, read_only: bool = False) -> None:
        self.directory = directory
        self._store = store
        self.read_only = read_only  # found read-only when opened: nothing is written
        self._writable = not read_only

    @classmethod
    def open(cls, directory: Path, size_limit: int) -> DiskCache | None:
        """The cache in ``directory`` (made if missing), read-only where it cannot be
        written, or ``None`` where it cannot be used (one :class:`CacheWarning` either way).
        A damaged SQLite database (corrupt, or not a database at all) in a writable
        directory is replaced by a new, empty one (:func:`_replace_damaged`, one warning):
        its kernels are compiled again as they are needed."""
        try:
            return cls(directory, _open_store(directory, size_limit))
        except Exception as exc:  # permission, read-only FS, damaged database, missing HOME
            why = f"{type(exc).__name__}: {exc}"
            if _damaged(exc):
                store = _replace_damaged(directory, size_limit, why)
                if store is not None:
                    return cls(directory, store)
        # a cache that can be read but not written: its kernels are still worth reading
        read_only = _ReadOnlyStore.open(directory / ENTRIES_DIR)
        if read_only is not None:
            warn_read_only(directory, _read_only_reason(directory, why))
            return cls(directory, read_only, read_only=True)
        warn_unusable(directory, why)
        return None

    def get(self, digest: str) -> Artifact | None:
        """The verified artifact for ``digest``, or ``None`` (missing, damaged, unreadable)."""
        found = self.get_located(digest)
        return found[1] if found is not None else None

    def get_located(self, digest: str) -> tuple[dict[str, Any], Artifact, str | None] | None:
        """``(header, artifact, file)`` for ``digest``, verified, or ``None`` (missing, damaged,
        unreadable: a damaged entry is removed). ``file`` is the entry's value file relative to
        ``entries/`` (``None`` for a value kept inside SQLite); the key index records it."""
        file = None
        try:
            # read=True: a file handle for a value kept in a file (whose name the index
            # records), the value itself for one kept inside SQLite
            value = self._store.get(digest, default=None, read=True, retry=True)
            if value is None:
                return None
            if hasattr(value, "read"):
                with value as handle:
                    value = handle.read()
                    file = self._relative(getattr(handle, "name", None))
        except Exception:
            value = b"unreadable"
        decoded = decode_entry(value, digest)
        if decoded is None:
            self.delete(digest)
            return None
        return decoded[0], decoded[1], file

    def _relative(self, name: Any) -> str | None:
        if not isinstance(name, str):
            return None
        rel = os.path.relpath(name, self._store.directory)
        return rel.replace(os.sep, "/") if not rel.startswith(os.pardir) else None

    @property
    def index(self) -> KeyIndex:
        """The key index of this directory (:mod:`nvrtc_engine.index`)."""
        return KeyIndex(self.directory, ENTRIES_DIR)

    def put(self, key_name: str, artifact: Artifact) -> bool:
        """Store ``artifact`` under its digest; ``False`` if the cache is not writable, or if
        the entry was evicted as soon as it was stored (a size limit too small for it: one
        :class:`CacheWarning` per directory)."""
        if not self._writable:
            return False
        value = encode_entry(key_name, artifact)
        try:
            self._store.set(artifact.digest, value, retry=True)
            stored = artifact.digest in self._store
        except Exception as exc:
            self._writable = False
            warn_unusable(self.directory, f"write failed: {type(exc).__name__}: {exc}")
            return False
        if not stored:  # the store's own eviction took it in the same transaction
            warn_once(
                "evicted", str(self.directory),
                f"nvrtc_engine: {key_name} ({len(value)} bytes) was evicted as soon as it was "
                f"stored in the disk cache at {self.directory}: its size limit "
                f"({self.size_limit} bytes, NVRTC_ENGINE_CACHE_SIZE_LIMIT) does not hold it "
                f"beside the cache's own {self.volume()} bytes; such kernels are kept in "
                "memory only. Raise the limit.",
                CacheWarning,
            )  # fmt: skip
        return stored

    def lock(self, digest: str, timeout: float) -> _KeyLock:
        """The cross-process lock for compiling ``digest``; use as ``with disk.lock(d, t) as held``.

        Waits up to ``timeout`` seconds. ``held`` is ``False`` when the wait timed out (one
        :class:`CacheWarning`) or no lock file can be created (e.g. a read-only lock
        directory): the caller then compiles without it, which costs at most a duplicate
        compile, never a wrong entry.
        """
        try:
            import filelock
        except ImportError:  # pragma: no cover - a declared dependency
            return _KeyLock(None, False)
        locks = self.directory / "locks"
        path = locks / f"{digest[:LOCK_STRIPE_CHARS]}.lock"
        try:
            locks.mkdir(exist_ok=True)
            lock = filelock.FileLock(str(path))
            lock.acquire(timeout=timeout, poll_interval=0.005)
        except filelock.Timeout:
            warn(
                f"nvrtc_engine: waited {timeout:g} s for {path}, held by another process "
                "compiling the same kernel; compiling without it (NVRTC_ENGINE_LOCK_TIMEOUT "
                "sets the wait)",
                CacheWarning,
            )
            return _KeyLock(None, False)
        except OSError:
            return _KeyLock(None, False)
        return _KeyLock(lock, True)

    def delete(self, digest: str) -> None:
        if self.read_only:
            return
        with contextlib.suppress(Exception):
            self._store.delete(digest, retry=True)

    def __len__(self) -> int:
        try:
            return len(self._store)
        except Exception:
            return 0

    def __contains__(self, digest: object) -> bool:
        """Whether an entry is stored under ``digest`` (not verified: :meth:`get` does that)."""
        try:
            return digest in self._store
        except Exception:
            return False

    def volume(self) -> int:
        """Bytes used on disk (database and files)."""
        try:
            return int(self._store.volume())
        except Exception:
            return 0

    @property
    def size_limit(self) -> int:
        """The size cap in bytes (least-recently-used entries are evicted above it)."""
        try:
            return int(self._store.size_limit)
        except Exception:
            return 0

    def digests(self) -> Iterator[str]:
        try:
            yield from list(self._store.iterkeys())
        except Exception:
            return

    def raw(self, digest: str) -> Any:
        """The stored value without verification (``None`` when missing or unreadable)."""
        try:
            return self._store.get(digest, default=None, retry=True)
        except Exception:
            return None

    def _peek(self, digest: str) -> Any:
        """The stored value without marking it used (so listing does not reorder eviction);
        ``None`` when missing or unreadable."""
        store = self._store
        try:
            sql, disk = store._sql, store._disk
            db_key, raw = disk.put(digest)
            rows = sql(
                "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = ?", (db_key, raw)
            ).fetchall()
        except Exception:  # another diskcache version or a busy database: read normally
            return self.raw(digest)
        if not rows:
            return None
        ((mode, filename, value),) = rows
        try:
            return disk.fetch(mode, filename, value, False)
        except Exception:  # unreadable file (permission, removed meanwhile)
            return None

    def entries(self) -> Iterator[tuple[str, dict[str, Any] | None, Artifact | None]]:
        """Every entry as ``(digest, header, artifact)``; header and artifact are ``None`` for
        a damaged or unreadable one. Listing does not count as a use for eviction."""
        for digest in self.digests():
            value = self._peek(digest)
            decoded = decode_entry(value, digest) if value is not None else None
            if decoded is None:
                yield digest, None, None
            else:
                yield digest, decoded[0], decoded[1]

    def verify(self, *, fix: bool = True) -> VerifyReport:
        """Check every entry (and the index against the files); with ``fix``, remove bad
        entries and repair the index (orphan value files, rows whose file is gone).

        Safe while other processes use the cache: at worst a value file a writer has not
        committed yet is taken for an orphan, and that kernel is compiled once more later.
        A read-only cache is checked, never fixed, and without diskcache's index check (it
        needs a write transaction).
        """
        fix = fix and not self.read_only
        bad: list[BadEntry] = []
        checked = 0
        for digest in self.digests():
            value = self._peek(digest)
            if value is None and digest not in self._store:
                continue  # removed by another process meanwhile
            checked += 1
            if value is not None and decode_entry(value, digest) is not None:
                continue
            header, _image, why = _parse(value, digest)
            if value is None:
                why = "unreadable value (missing or permission denied)"
            elif not why:
                why = "header fields missing"
            bad.append(BadEntry(digest, str((header or {}).get("key", "?")), why))
            if fix:
                self.delete(digest)
        problems = self._check_index(fix)
        if fix and problems:  # removing orphan files can leave directories to remove
            problems += self._check_index(fix)
        problems += self.index.check(set(self.digests()), fix=fix)
        return VerifyReport(checked, tuple(bad), tuple(problems))

    def _check_index(self, fix: bool) -> list[str]:
        # diskcache returns what it found as warning records (and repairs it with fix); it
        # records them under the caller's filters, so they must not be errors or ignored
        if self.read_only:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            try:
                return [str(w.message) for w in self._store.check(fix=fix, retry=True)]
            except Exception as exc:
                return [f"index check failed: {type(exc).__name__}: {exc}"]

    def clear(self) -> int:
        """Remove every entry and the key index; returns the number of entries removed (0 for
        a read-only cache, which is left as it is)."""
        if self.read_only:
            return 0
        self.index.clear()
        try:
            return int(self._store.clear(retry=True))
        except Exception:
            return 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._store.close()
