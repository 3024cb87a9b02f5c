"""The on-disk kernel cache: verified entries in ``diskcache``, addressed by a content digest.

The digest covers everything that determines the compiled bytes: the rendered source, the
in-memory headers, the NVRTC flags, the NVRTC version, the CUDA header version (when CUDA
headers are used) and :data:`SCHEMA`. An entry is one bytes value::

    MAGIC | u32 header length | JSON header | image

where the header records the key, symbols, digest, NVRTC version, options, compile time and
the SHA-256 of the image. Every load checks magic, lengths, schema, digest and hash; any
mismatch (truncated write, garbage, a stale format) is a miss, and the bad entry is removed.
A directory that cannot be opened or written degrades to memory-only with one warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import CacheWarning
from .kernel import Artifact

__all__ = ["MAGIC", "SCHEMA", "DiskCache", "compute_digest", "decode_entry", "encode_entry"]

SCHEMA = 1
MAGIC = b"NVRTCENGINE\x01"
_LEN = struct.Struct("<I")
_warned: set[str] = set()
_warn_lock = threading.Lock()


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
        "headers": [[name, hashlib.sha256(text.encode()).hexdigest()] for name, text in headers],
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


def decode_entry(value: Any, digest: str | None = None) -> tuple[dict[str, Any], Artifact] | None:
    """Parse and verify a cache value; ``None`` if it is damaged or not for ``digest``."""
    if not isinstance(value, (bytes, bytearray)) or not value.startswith(MAGIC):
        return None
    data = bytes(value)
    start = len(MAGIC) + _LEN.size
    if len(data) < start:
        return None
    (hlen,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + hlen])
    except ValueError:
        return None
    image = data[start + hlen :]
    if (
        not isinstance(header, dict)
        or header.get("schema") != SCHEMA
        or (digest is not None and header.get("digest") != digest)
        or header.get("size") != len(image)
        or header.get("sha256") != hashlib.sha256(image).hexdigest()
    ):
        return None
    artifact = Artifact(
        image=image,
        kind=header["kind"],
        symbols=tuple(header["symbols"]),
        digest=header["digest"],
        nvrtc_version=header["nvrtc_version"],
        options=tuple(header["options"]),
        compile_ms=float(header["compile_ms"]),
    )
    return header, artifact


def _warn_once(directory: Path, why: str) -> None:
    with _warn_lock:
        if str(directory) in _warned:
            return
        _warned.add(str(directory))
    warnings.warn(
        f"nvrtc_engine: disk cache at {directory} is unusable ({why}); kernels are kept in "
        "memory only. Set NVRTC_ENGINE_CACHE_DIR to a writable directory, or "
        "NVRTC_ENGINE_DISABLE_DISK_CACHE=1 to silence this.",
        CacheWarning,
        stacklevel=4,
    )


class DiskCache:
    """Verified kernel images in a ``diskcache.Cache`` (SQLite index + files), LRU-capped.

    Use :meth:`open`, which returns ``None`` (after one warning) when the directory is
    unusable. Reads never raise: a damaged or unreadable entry is a miss and is removed.
    A failing write disables further writes with one warning.
    """

    def __init__(self, directory: Path, store: Any) -> None:
        self.directory = directory
        self._store = store
        self._writable = True

    @classmethod
    def open(cls, directory: Path, size_limit: int) -> DiskCache | None:
        try:
            import diskcache

            directory.mkdir(parents=True, exist_ok=True)
            store = diskcache.Cache(
                str(directory),
                size_limit=size_limit,
                eviction_policy="least-recently-used",
                timeout=60,
            )
            return cls(directory, store)
        except Exception as exc:  # permission, read-only FS, damaged database, missing HOME
            _warn_once(directory, f"{type(exc).__name__}: {exc}")
            return None

    def get(self, digest: str) -> Artifact | None:
        """The verified artifact for ``digest``, or ``None`` (missing, damaged, unreadable)."""
        try:
            value = self._store.get(digest, default=None, retry=True)
        except Exception:
            value = b"unreadable"
        if value is None:
            return None
        decoded = decode_entry(value, digest)
        if decoded is None:
            self.delete(digest)
            return None
        return decoded[1]

    def put(self, key_name: str, artifact: Artifact) -> bool:
        """Store ``artifact`` under its digest; ``False`` if the cache is not writable."""
        if not self._writable:
            return False
        try:
            self._store.set(artifact.digest, encode_entry(key_name, artifact), retry=True)
            return True
        except Exception as exc:
            self._writable = False
            _warn_once(self.directory, f"write failed: {type(exc).__name__}: {exc}")
            return False

    def delete(self, digest: str) -> None:
        with contextlib.suppress(Exception):
            self._store.delete(digest, retry=True)

    def __len__(self) -> int:
        try:
            return len(self._store)
        except Exception:
            return 0

    def volume(self) -> int:
        """Bytes used on disk (database and files)."""
        try:
            return int(self._store.volume())
        except Exception:
            return 0

    def digests(self) -> Iterator[str]:
        try:
            yield from list(self._store.iterkeys())
        except Exception:
            return

    def raw(self, digest: str) -> Any:
        """The stored value without verification (for ``verify`` and tests)."""
        return self._store.get(digest, default=None)

    def clear(self) -> int:
        try:
            return int(self._store.clear(retry=True))
        except Exception:
            return 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._store.close()
