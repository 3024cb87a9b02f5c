"""The key index: a warm lookup finds a kernel's cache entry without rendering or NVRTC.

The cache digest (:func:`nvrtc_engine.cache.compute_digest`) needs the rendered source, the
NVRTC version and the CUDA header version: in a fresh process that means importing Jinja2,
compiling a template and loading libnvrtc, about 100 ms before the first disk hit. The index
remembers, for each canonical key name and **environment fingerprint**, the digest that this
computation gave and the file that holds the entry, so that a fresh process reads and verifies
the entry directly.

One small JSON file per key, ``<cache dir>/index/<key>.json``, written atomically (a new file
renamed over the old one), holding up to :data:`KEEP` records (the most recent first; one
per fingerprint and NVRTC/CUDA header record), each::

    fingerprint   see environment_fingerprint()
    digest        the cache digest the slow path computed
    file          the entry's value file under <cache dir>/entries/ (diskcache's name)
    nvrtc         the libnvrtc that computed it: path, [size, mtime_ns], how cuda.pathfinder
                  found it, the environment variables that steer the library search and,
                  unless it came from a site-packages wheel (the first search step),
                  /etc/ld.so.cache's [size, mtime_ns]
    cuda_headers  for kernels that include CUDA headers: the version file's path and
                  [size, mtime_ns], the settings/variables that steer the header search
    nvrtc_version the NVRTC version (the loaded library's, which must be the entry's)
    used          when the disk cache last counted a use of the entry (epoch seconds)

A record is used only when its fingerprint equals this process's, and every recorded file
still has its recorded size and mtime, and every recorded variable its recorded value. The
entry is then read and verified like any load (magic, schema, digest, size, SHA-256), and its
own header must name the key, the key's symbols and the NVRTC options this installation uses
for it. Anything else (no file, damaged JSON, another fingerprint, a changed file, a failed
check) is an index miss: the engine renders, digests and looks up as without an index, and
then writes the record again. An index record can make a lookup slower, never wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "INDEX_DIR",
    "KEEP",
    "REFRESH_S",
    "KeyIndex",
    "environment_fingerprint",
    "reset",
]

INDEX_DIR = "index"
FORMAT = 1
KEEP = 4  # records per key: environments sharing a directory do not evict each other
# A load through the index does not touch diskcache (that costs its import and a write
# transaction); once a record's last counted use is older than this, the next load goes through
# diskcache, which counts it for least-recently-used eviction, and the record is rewritten.
REFRESH_S = 24 * 3600.0
# A file modified this close to (or after) the moment the package was imported may not be the
# code this process runs, or may change again within the file system's timestamp granularity:
# no fingerprint then (no index use, no index writes), recomputed on the next call.
RACY_S = 2.0
# diskcache's value file names: two levels of two hex digits, 28 hex digits, ".val"
_FILE_RE = re.compile(r"^[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val$")

# Per process; plain assignments (no lock): two threads racing compute the same value twice.
_fingerprint: str | None = None
_stats: dict[str, list[int] | None] = {}


def reset() -> None:
    """Forget this process's fingerprint and file stats (tests; :func:`clear_cache`)."""
    global _fingerprint
    _fingerprint = None
    _stats.clear()


def _stat(path: str) -> list[int] | None:
    """``[size, mtime_ns]`` of ``path`` (``None``: missing), once per process."""
    try:
        return _stats[path]
    except KeyError:
        pass
    from .nvrtc import file_stat

    got = _stats[path] = file_stat(path)
    return got


def _site_dirs() -> list[str]:
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]


def _jinja2_init() -> str | None:
    """The ``__init__.py`` of the jinja2 that rendering will import (not importing it)."""
    module = sys.modules.get("jinja2")
    if module is not None:
        return getattr(module, "__file__", None)
    import importlib.util

    try:
        spec = importlib.util.find_spec("jinja2")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _compute() -> str | None:
    import hashlib

    from . import _loaded, render
    from ._version import __version__

    newest = _loaded.IMPORTED_AT - RACY_S
    package = Path(__file__).resolve().parent
    code: list[Any] = []
    for folder in (package, package / "ops"):
        with os.scandir(folder) as it:
            names = sorted(e.name for e in it if e.name.endswith(".py") and e.is_file())
        for name in names:
            st = os.stat(folder / name)
            if st.st_mtime_ns / 1e9 > newest:
                return None  # edited after (or just before) this process imported it
            code.append([f"{folder.name}/{name}", st.st_size, st.st_mtime_ns])
    stamps: list[Any] = []
    jinja = _jinja2_init()
    conda = os.environ.get("CONDA_PREFIX")
    watched = [*_site_dirs(), jinja, os.path.join(conda, "conda-meta") if conda else None]
    for path in watched:
        if path is None:
            stamps.append(None)
            continue
        try:
            st = os.stat(path)
        except OSError:
            stamps.append([path, None])
            continue
        if st.st_mtime_ns / 1e9 > newest:
            return None  # a package installed or removed while this process runs
        stamps.append([path, st.st_size if path == jinja else 0, st.st_mtime_ns])
    blob = json.dumps({
        "format": FORMAT,
        "nvrtc_engine": __version__,
        "python": sys.version,
        "platform": sys.platform,
        "prefix": sys.prefix,
        "code": code,
        "templates": render.templates_digest(),
        "stamps": stamps,
    }, sort_keys=True)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()


def environment_fingerprint() -> str | None:
    """SHA-256 (hex) over what, besides the key, decides rendering, in this process.

    Covers: the package version, entry schema (:data:`nvrtc_engine.cache.SCHEMA`), Python
    version, platform and ``sys.prefix``; the size and mtime of every ``nvrtc_engine/*.py`` and
    ``nvrtc_engine/ops/*.py`` (what Python itself checks before it reuses bytecode); the
    **contents** of every template and device header (the snapshot rendering uses); the jinja2
    that rendering imports (its ``__init__.py`` path, size and mtime); the mtime of every
    ``site-packages``/``dist-packages`` directory on ``sys.path`` (any package installed,
    upgraded or removed there, jinja2, cuda-bindings, cuda-pathfinder or an NVIDIA wheel,
    changes it) and of ``$CONDA_PREFIX/conda-meta``. NVRTC and the CUDA headers are
    checked per record (see the module docstring). Computed once per process; ``None`` (no
    index) while any of those files is newer than the package's import.
    """
    global _fingerprint
    from .cache import SCHEMA

    fp = _fingerprint
    if fp is None:
        fp = _compute()
        if fp is None:
            return None
        _fingerprint = fp
    return f"{fp[:48]}-s{SCHEMA}"


def _env_matches(recorded: Any, current: dict[str, str | None]) -> bool:
    return isinstance(recorded, dict) and recorded == current


def _nvrtc_current(record: Any) -> bool:
    from .nvrtc import LIBRARY_ENV, environment_values

    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        return False
    return (
        _env_matches(record.get("env"), environment_values(LIBRARY_ENV))
        and record.get("stat") is not None
        and _stat(record["path"]) == record.get("stat")
        and (
            record.get("found_via") == "site-packages"  # the first search step
            or _stat("/etc/ld.so.cache") == record.get("ld_so_cache")
        )
    )


def _headers_current(record: Any) -> bool:
    from . import config
    from .nvrtc import HEADER_ENV, environment_values

    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        return False
    override = config.settings().cuda_include_dir
    env = {
        "NVRTC_ENGINE_CUDA_INCLUDE_DIR": str(override) if override is not None else None,
        **environment_values(HEADER_ENV),
    }
    return _env_matches(record.get("env"), env) and _stat(record["path"]) == record.get("stat")


def headers_indexable(include: Any) -> bool:
    """Whether a kernel compiled with CUDA headers from ``include``
    (:class:`~nvrtc_engine.nvrtc.CudaIncludeDir`) may be indexed: only headers named by
    ``NVRTC_ENGINE_CUDA_INCLUDE_DIR`` or found in a ``site-packages`` wheel (the first search
    step, so nothing installed elsewhere later can take its place unseen)."""
    if include.record is None:
        return False
    if include.origin == "NVRTC_ENGINE_CUDA_INCLUDE_DIR":
        return True
    path = str(include.path)
    return include.origin.startswith("cuda.pathfinder") and any(
        path.startswith(os.path.join(site, "")) for site in _site_dirs()
    )


class Record:
    """One usable index record: ``digest``, ``file`` (relative to ``entries/``, or ``None``),
    ``nvrtc_path`` and ``nvrtc_version`` (the library that computed the digest) and ``stale``
    (its last counted use is older than :data:`REFRESH_S`)."""

    __slots__ = ("digest", "file", "fingerprint", "nvrtc_path", "nvrtc_version", "stale")

    def __init__(
        self,
        fingerprint: str,
        digest: str,
        file: str | None,
        nvrtc_path: str,
        nvrtc_version: str,
        stale: bool,
    ) -> None:
        self.fingerprint = fingerprint
        self.digest = digest
        self.file = file
        self.nvrtc_path = nvrtc_path
        self.nvrtc_version = nvrtc_version
        self.stale = stale


class KeyIndex:
    """The index files of one cache directory (see the module docstring)."""

    def __init__(self, cache_dir: Path | str, entries_dir: str = "entries") -> None:
        self.directory = Path(cache_dir) / INDEX_DIR
        self._dir = str(self.directory)
        self._entries = str(Path(cache_dir) / entries_dir)

    def _path(self, key_name: str) -> str:
        return os.path.join(self._dir, key_name + ".json")

    def _records(self, key_name: str) -> list[dict[str, Any]]:
        try:
            with open(self._path(key_name), "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return []
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return []
        if data.get("key") != key_name or not isinstance(data.get("records"), list):
            return []
        return [r for r in data["records"] if isinstance(r, dict)]

    def lookup(self, key_name: str, fingerprint: str) -> Record | None:
        """The record for ``key_name`` under ``fingerprint`` whose files and environment are
        unchanged, or ``None``."""
        for r in self._records(key_name):
            if r.get("fingerprint") != fingerprint or not _well_formed(r):
                continue
            if not _nvrtc_current(r["nvrtc"]):
                continue
            headers = r.get("cuda_headers")
            if headers is not None and not _headers_current(headers):
                continue
            used = r.get("used")
            stale = not isinstance(used, (int, float)) or not 0 <= time.time() - used < REFRESH_S
            return Record(
                fingerprint, r["digest"], r["file"], r["nvrtc"]["path"], r["nvrtc_version"], stale
            )
        return None

    def read(self, record: Record) -> bytes | None:
        """The bytes of the value file ``record`` names (``None``: missing, unreadable)."""
        if record.file is None:
            return None
        try:
            with open(os.path.join(self._entries, record.file), "rb") as f:
                return f.read()
        except OSError:
            return None

    def write(
        self,
        key_name: str,
        fingerprint: str,
        digest: str,
        file: str | None,
        nvrtc: dict[str, Any],
        nvrtc_version: str,
        cuda_headers: dict[str, Any] | None,
    ) -> bool:
        """Record ``digest`` for ``key_name`` under ``fingerprint`` (keeping other
        fingerprints' records, at most :data:`KEEP`); ``False`` if it cannot be written."""
        record = {
            "fingerprint": fingerprint,
            "digest": digest,
            "file": file,
            "nvrtc": nvrtc,
            "nvrtc_version": nvrtc_version,
            "cuda_headers": cuda_headers,
            "used": time.time(),
        }
        others = [
            r
            for r in self._records(key_name)
            if _well_formed(r) and not _same_environment(r, record)
        ]
        data = {"format": FORMAT, "key": key_name, "records": [record, *others][:KEEP]}
        return self._replace(self._path(key_name), json.dumps(data).encode())

    def touch(self, key_name: str, record: Record, file: str | None) -> None:
        """Mark the index record ``record`` as used now, its entry in ``file``."""
        records = self._records(key_name)
        for r in records:
            if r.get("fingerprint") == record.fingerprint and r.get("digest") == record.digest:
                r["used"] = time.time()
                r["file"] = file
                data = {"format": FORMAT, "key": key_name, "records": records[:KEEP]}
                self._replace(self._path(key_name), json.dumps(data).encode())
                return

    def _replace(self, path: str, data: bytes) -> bool:
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            os.makedirs(self._dir, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False

    def drop(self, key_name: str) -> None:
        """Forget every record of ``key_name``."""
        with contextlib.suppress(OSError):
            os.unlink(self._path(key_name))

    def clear(self) -> None:
        """Remove every index file."""
        for name in self._names():
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._dir, name))

    def _names(self) -> list[str]:
        try:
            with os.scandir(self._dir) as it:
                return sorted(e.name for e in it if e.is_file())
        except OSError:
            return []

    def check(self, digests: set[str], *, fix: bool = True) -> list[str]:
        """Problems of the index against the entries' ``digests``: unreadable files, records
        pointing to digests the cache no longer holds or to missing value files. With
        ``fix``, such records (and leftover temporary files) are removed."""
        problems: list[str] = []
        entries = Path(self._entries)
        for name in self._names():
            path = os.path.join(self._dir, name)
            if not name.endswith(".json"):  # a writer's temporary file
                if fix and name.endswith(".tmp") and _older_than(path, 60.0):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                continue
            key_name = name[: -len(".json")]
            records = self._records(key_name)
            keep = [
                r for r in records
                if r.get("digest") in digests
                and (r.get("file") is None or (
                    isinstance(r.get("file"), str) and _FILE_RE.match(r["file"])
                    and (entries / r["file"]).is_file()))
            ]  # fmt: skip
            if not records:
                problems.append(f"index: unreadable index file {name}")
            elif len(keep) < len(records):
                problems.append(
                    f"index: {key_name}: {len(records) - len(keep)} record(s) pointing to a "
                    "missing entry"
                )
            else:
                continue
            if fix:
                if keep:
                    data = {"format": FORMAT, "key": key_name, "records": keep}
                    self._replace(path, json.dumps(data).encode())
                else:
                    self.drop(key_name)
        return problems


def _well_formed(r: dict[str, Any]) -> bool:
    """Whether a record has every field, of the right type (else it is ignored, and dropped
    on the next write)."""
    digest, file, nvrtc = r.get("digest"), r.get("file"), r.get("nvrtc")
    return (
        isinstance(r.get("fingerprint"), str)
        and isinstance(digest, str)
        and len(digest) == 64
        and isinstance(r.get("nvrtc_version"), str)
        and (file is None or (isinstance(file, str) and _FILE_RE.match(file) is not None))
        and isinstance(nvrtc, dict)
        and isinstance(nvrtc.get("path"), str)
        and "cuda_headers" in r
    )


def _same_environment(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records describe the same environment (one replaces the other)."""
    return all(a.get(f) == b.get(f) for f in ("fingerprint", "nvrtc", "cuda_headers"))


def _older_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > seconds
    except OSError:
        return False
