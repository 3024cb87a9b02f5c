"""Cache entries, the digest that addresses them, and the interface of the tiers that hold them.

The **digest** (:func:`digest`) comes from a kernel's inputs, never its rendered source. An
**entry** is one bytes value, ``MAGIC | u32 header length | JSON header | image``
(:func:`encode_entry`); :func:`check_entry` is the one check of every load from every **tier**
(:class:`Tier`: entries by digest, bytes in and bytes out), signatures included.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import nvrtc, render
from .kernel import Artifact
from .key import arch_number

if TYPE_CHECKING:
    from .key import KernelKey

__all__ = ["MAGIC", "SCHEMA", "Tier", "check_entry", "digest", "encode_entry", "entries",
           "sign_entry"]  # fmt: skip

SCHEMA = 2
MAGIC = b"NVRTCENGINE\x01"
_LEN = struct.Struct("<I")
Checked = tuple[dict[str, Any], Artifact]


def digest(key: KernelKey, nvrtc_version: str | None = None) -> str:
    """SHA-256 (hex) over :data:`SCHEMA`, ``key``, its symbols, the code fingerprint
    (:func:`~nvrtc_engine.core.render.code_fingerprint`), the NVRTC version (this process's, or
    ``nvrtc_version``), the CUDA headers' version (for a kernel that includes them; what finding
    them raises) and the options; no path. Renders nothing; loads no NVRTC where its wheel
    names its version."""
    spec = key.spec
    headers = nvrtc.find_cuda_include_dir().version if spec.cuda_headers(key) else ""
    code = render.code_fingerprint()
    if spec.templates is not None:  # a family outside the package: its own files too
        code += " " + render.templates_digest(spec.templates)
    fields = [f"schema {SCHEMA}", str(key), " ".join(spec.symbols(key)), code,
              nvrtc_version or nvrtc.nvrtc_identity(), headers,
              *nvrtc.compile_options(key.arch).flags()]  # fmt: skip
    return hashlib.sha256("\n".join(fields).encode()).hexdigest()


def encode_entry(key_name: str, artifact: Artifact, **extra: Any) -> bytes:
    """The entry of ``artifact`` for kernel ``key_name``: a header with the key, digest,
    symbols, NVRTC version, options, kind, compile and creation times, the image's size and
    SHA-256, ``signature`` (:func:`sign_entry`) and ``extra`` (another NVRTC's entry filed
    under this NVRTC's digest says ``adopted_for`` this NVRTC and ``checked``: loaded here)."""
    return _join({
        "schema": SCHEMA, "key": key_name, "digest": artifact.digest,
        "symbols": list(artifact.symbols), "nvrtc_version": artifact.nvrtc_version,
        "options": list(artifact.options), "kind": artifact.kind,
        "compile_ms": artifact.compile_ms, "created": time.time(), "size": len(artifact.image),
        "sha256": hashlib.sha256(artifact.image).hexdigest(), "signature": None, **extra,
    }, artifact.image)  # fmt: skip


def _join(header: dict[str, Any], image: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LEN.pack(len(text)) + text + image


def sign_entry(value: bytes, secret: bytes) -> bytes:
    """``value`` (a verified entry) signed by ``secret`` (:mod:`~nvrtc_engine.core.signing`)."""
    from .signing import signature

    header, artifact = check_entry(value, None)  # type: ignore[misc]
    return _join({**header, "signature": signature(header, secret)}, artifact.image)


@functools.lru_cache(maxsize=256)
def _for_arch(kind: str, options: tuple[str, ...], arch: str) -> bool:
    """Whether our ``options`` make ``arch``'s kernel: a cubin for it, or PTX for an older arch."""
    target = nvrtc.target_arch(options)
    number = target.removeprefix("compute_")
    older = kind == "ptx" and number.isdigit() and int(number) < arch_number(arch)
    ok = target == arch if kind == "cubin" else older
    return ok and options == nvrtc.compile_options(target).flags()


def check_entry(
    value: Any,
    digest: str | None,
    key: KernelKey | None = None,
    nvrtc_version: str | None = None,
    secret: bytes | None = None,
) -> Checked | str:
    """``(header, artifact)`` of a cache value, or why it is bad: magic, lengths, schema, the
    ``digest`` it is stored under (unless None), the image's size and SHA-256; with ``secret``
    a signature by it (:func:`sign_entry`); with ``key`` that key, and an image for its arch;
    with ``nvrtc_version`` built by that NVRTC, or adopted for it (:func:`encode_entry`)."""
    if not isinstance(value, (bytes, bytearray)) or not value.startswith(MAGIC):
        return "not an nvrtc_engine entry (garbage or another format)"
    try:
        (length,) = _LEN.unpack_from(value, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(value[start : start + length])
        image, schema = bytes(value[start + length :]), header.get("schema")
    except (struct.error, ValueError, AttributeError):  # (AttributeError: no JSON object)
        return "damaged or truncated header"
    if schema != SCHEMA:
        return f"schema {schema!r}, this version reads {SCHEMA}"
    if digest is not None and header.get("digest") != digest:
        return "stored under another digest"
    if header.get("size") != len(image):
        return f"truncated image ({len(image)} of {header.get('size')} bytes)"
    if header.get("sha256") != hashlib.sha256(image).hexdigest():
        return "image SHA-256 mismatch (corrupted)"
    if secret is not None:
        from .signing import problem

        if unsigned := problem(header, secret):
            return unsigned
    try:
        artifact = Artifact(
            image=image, kind=str(header["kind"]), symbols=tuple(header["symbols"]),
            digest=str(header["digest"]), nvrtc_version=str(header["nvrtc_version"]),
            options=tuple(header["options"]), compile_ms=float(header["compile_ms"]),
        )  # fmt: skip
        name = str(header["key"])
    except (KeyError, TypeError, ValueError):
        return "header fields missing"
    if key is not None and name != str(key):  # (its symbols are in the digest)
        return f"the entry of {name}, not of {key}"
    if key is not None and not _for_arch(artifact.kind, artifact.options, key.arch):
        built = nvrtc.target_arch(artifact.options)
        return f"compiled for {built} ({artifact.kind}), not for {key.arch}"
    if nvrtc_version not in (None, artifact.nvrtc_version, header.get("adopted_for")):
        return f"built by NVRTC {artifact.nvrtc_version}; this is NVRTC {nvrtc_version}"
    return header, artifact


def entries(tier: Tier) -> Iterator[tuple[str, Checked | str]]:
    """Every entry of ``tier`` still there as ``(digest, check_entry's answer)``."""
    for stored in tier.digests():
        value = tier.get(stored)
        if value is not None:
            yield stored, check_entry(value, stored)


class Tier:
    """A store of cache entries by digest, bytes in and bytes out, verified by the engine. No
    method raises: an unreachable, slow or failing tier answers "absent" (``get`` None, ``put``
    False) with one :class:`CacheWarning`; an unreadable value is ``b""``, a bad entry."""

    location = ""  # a directory, file or address, for messages
    writable = False  # whether put() can change it (a failing tier stops)
    shared = False  # entries come from other machines: signed where a secret is configured

    def get(self, digest: str) -> bytes | None:  # the value, or None: none (or no answer)
        raise NotImplementedError

    def put(self, digest: str, value: bytes) -> bool:  # whether it is stored now
        return False

    def digests(self) -> Iterator[str]:  # every digest stored
        raise NotImplementedError

    def close(self) -> None:  # files and connections, reopened on the next use
        pass

    def nvrtc_versions(self) -> tuple[str, ...]:  # the NVRTC versions of its entries, if cheap
        return ()
