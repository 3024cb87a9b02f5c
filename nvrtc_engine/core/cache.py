"""Cache entries, the digest that addresses them, and the interface of the tiers that hold them.

The **digest** is computed from a kernel's inputs, never from its rendered source (a lookup
renders nothing): SHA-256 over :data:`SCHEMA`, the canonical key, its kernel symbols,
:func:`code_fingerprint`, the NVRTC version (:func:`~nvrtc_engine.core.nvrtc.nvrtc_identity`), the
CUDA header version for kernels that include CUDA headers, and the NVRTC options; no path.
An **entry** is one bytes value, ``MAGIC | u32 header length | JSON header | image``
(:func:`encode_entry`); :func:`check_entry` is the one check of every load from every tier.
A **tier** (:class:`Tier`) stores entries by digest, bytes in and bytes out
(:mod:`nvrtc_engine.core.tiers`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import nvrtc, render
from .kernel import Artifact
from .key import arch_number

if TYPE_CHECKING:
    from .key import KernelKey

__all__ = ["MAGIC", "SCHEMA", "SIGNED", "Tier", "check_entry", "code_fingerprint",
           "compile_options", "digest", "encode_entry", "entries", "sign_entry",
           "target_arch"]  # fmt: skip

SCHEMA = 2
MAGIC = b"NVRTCENGINE\x01"
_LEN = struct.Struct("<I")
# The core's Python that decides what the templates render (with every file of families/).
_CODE = ("dtypes.py", "key.py", "nvrtc.py", "render.py", "signature.py", "spec.py")
Checked = tuple[dict[str, Any], Artifact]
# The header fields an entry's HMAC covers: what it is (key, symbols, kind), what built it
# (NVRTC version, options, so arch), where it is filed (schema, digest) and its image (size,
# SHA-256); not the compile and creation times, which change nothing loaded.
SIGNED = ("schema", "key", "digest", "symbols", "nvrtc_version", "options", "kind", "size",
          "sha256")  # fmt: skip
_HMAC = "hmac-sha256:"


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 (hex) of what in the package shapes generated code: the templates and device
    headers, the core modules in :data:`_CODE`, every file of ``families/`` but the float64
    references and the jinja2 that renders (its ``__init__.py`` names its version); contents
    only, read once per process."""
    import importlib.util

    core = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256(render.templates_digest().encode())
    for name in _CODE:
        with open(os.path.join(core, name), "rb") as f:
            h.update(f"\0{name}\0".encode() + f.read())
    for name, data in render.folder_files(os.path.join(os.path.dirname(core), "families")).items():
        if not name.endswith("reference.py"):  # (the float64 references render nothing)
            h.update(f"\0families/{name}\0".encode() + data)
    jinja2 = importlib.util.find_spec("jinja2")
    with open(jinja2.origin if jinja2 and jinja2.origin else os.devnull, "rb") as f:
        h.update(b"\0jinja2\0" + f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def compile_options(arch: str) -> nvrtc.CompileOptions:
    """The NVRTC options kernels are compiled with for ``-arch=arch`` (the one place)."""
    return nvrtc.CompileOptions(arch=arch)


def digest(key: KernelKey, nvrtc_version: str | None = None) -> str:
    """The cache digest of ``key`` in this process (see the module docstring), or the one a
    process with NVRTC ``nvrtc_version`` and otherwise this installation computes; renders
    nothing and loads no NVRTC where its wheel names its version. Raises what finding CUDA
    headers raises, for a kernel that includes them."""
    spec = key.spec
    headers = nvrtc.find_cuda_include_dir().version if spec.cuda_headers(key) else ""
    code = code_fingerprint()
    if spec.templates is not None:  # a family outside the package: its own files too
        code += " " + render.templates_digest(spec.templates)
    fields = [f"schema {SCHEMA}", str(key), " ".join(spec.symbols(key)), code,
              nvrtc_version or nvrtc.nvrtc_identity(), headers,
              *compile_options(key.arch).flags()]  # fmt: skip
    return hashlib.sha256("\n".join(fields).encode()).hexdigest()


def encode_entry(key_name: str, artifact: Artifact, **extra: Any) -> bytes:
    """One cache value holding ``artifact`` for the kernel named ``key_name``. Its header
    records the key, digest, symbols, NVRTC version, options, kind, compile and creation
    times, the image's size and SHA-256, ``signature`` (null; :func:`sign_entry`) and
    ``extra``: an entry of another NVRTC taken on request (``any_nvrtc``) is filed under this
    NVRTC's digest saying ``adopted_for`` (this NVRTC) and ``checked`` (loaded on a GPU here)."""
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


def _signature(header: dict[str, Any], secret: bytes) -> str:
    import hmac  # (only where a secret is configured)

    fields = json.dumps({f: header.get(f) for f in SIGNED}, sort_keys=True, separators=(",", ":"))
    message = b"nvrtc_engine entry\0" + fields.encode()
    return _HMAC + hmac.new(secret, message, "sha256").hexdigest()


def sign_entry(value: bytes, secret: bytes) -> bytes:
    """``value`` (a verified entry) with its ``signature`` set: an HMAC-SHA256 with
    ``secret`` over the header fields in :data:`SIGNED` (the image through its SHA-256)."""
    header, artifact = check_entry(value, None)  # type: ignore[misc]
    return _join({**header, "signature": _signature(header, secret)}, artifact.image)


def target_arch(artifact: Artifact | tuple[str, ...]) -> str:
    """The ``-arch`` an entry (or its options) was compiled for (``sm_90a``, ``compute_120``)."""
    options = artifact if isinstance(artifact, tuple) else artifact.options
    return next((f[len("-arch=") :] for f in options if f.startswith("-arch=")), "?")


@functools.lru_cache(maxsize=256)
def _for_arch(kind: str, options: tuple[str, ...], arch: str) -> bool:
    """Whether an image of ``kind`` built with ``options`` runs ``arch``'s kernel: a cubin for
    it, or PTX for an older arch (NVRTC's for an arch newer than it knows); our options."""
    target = target_arch(options)
    number = target.removeprefix("compute_")
    older = number.isdigit() and int(number) < arch_number(arch)
    ok = target == arch if kind == "cubin" else kind == "ptx" and older
    return ok and options == compile_options(target).flags()


def check_entry(
    value: Any,
    digest: str | None,
    key: KernelKey | None = None,
    nvrtc_version: str | None = None,
    secret: bytes | None = None,
) -> Checked | str:
    """Verify a cache value: ``(header, artifact)``, or why it is bad. Always checked: magic,
    lengths, schema, the digest it is stored under (unless ``digest`` is None), the image's
    size and SHA-256; with ``secret``: its signature (:func:`sign_entry`), refused when
    missing or made with another key; with ``key``: it names that key and its image is for
    the key's arch; with ``nvrtc_version``: that NVRTC built it, or it was adopted for it
    (:func:`encode_entry`)."""
    if not isinstance(value, (bytes, bytearray)) or not value.startswith(MAGIC):
        return "not an nvrtc_engine entry (garbage or another format)"
    try:
        (length,) = _LEN.unpack_from(value, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(value[start : start + length].decode())
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
        import hmac  # (compare_digest: a signature is not guessed bytewise)

        signature = header.get("signature")
        if not isinstance(signature, str) or not signature.startswith(_HMAC):
            return "unsigned, and a signing key is configured (NVRTC_ENGINE_CACHE_KEY)"
        if not hmac.compare_digest(signature, _signature(header, secret)):
            return "signed with another key, or altered after signing"
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
        return f"compiled for {target_arch(artifact)} ({artifact.kind}), not for {key.arch}"
    if nvrtc_version not in (None, artifact.nvrtc_version, header.get("adopted_for")):
        return f"built by NVRTC {artifact.nvrtc_version}; this is NVRTC {nvrtc_version}"
    return header, artifact


def entries(tier: Tier) -> Iterator[tuple[str, Checked | str]]:
    """Every entry of ``tier`` as ``(digest, check_entry's answer)``, for listing, verifying
    and exporting (an entry removed meanwhile is left out)."""
    for stored in tier.digests():
        value = tier.get(stored)
        if value is not None:
            yield stored, check_entry(value, stored)


class Tier:
    """A store of cache entries by digest: bytes in, bytes out.

    The engine tries its tiers in order and verifies what one returns (:func:`check_entry`).
    No method raises: a tier that is unreachable, slower than its own timeout or failing
    answers "absent" (``get`` None, ``put`` False) and warns once (:class:`CacheWarning`); an
    unreadable value is ``b""``, a bad entry.
    """

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
        raise NotImplementedError

    def nvrtc_versions(self) -> tuple[str, ...]:  # the NVRTC versions of its entries, if cheap
        return ()
