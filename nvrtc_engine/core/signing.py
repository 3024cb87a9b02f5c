"""Signatures of cache entries shared between machines (the remote cache, bundles).

An entry's ``signature`` header field is an HMAC-SHA256 with the configured secret
(``NVRTC_ENGINE_CACHE_KEY``) over the header fields in :data:`SIGNED`, so over the image through
its SHA-256. :func:`~nvrtc_engine.core.cache.sign_entry` sets it; where a secret is configured,
:func:`~nvrtc_engine.core.cache.check_entry` asks :func:`problem` on every load from a shared
tier. Imported only where a secret is configured.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

__all__ = ["SIGNED", "problem", "signature"]

# What the entry is (key, symbols, kind), what built it (NVRTC version, options, so arch),
# where it is filed (schema, digest) and its image (size, SHA-256); not the compile and
# creation times, which change nothing loaded.
SIGNED = ("schema", "key", "digest", "symbols", "nvrtc_version", "options", "kind", "size",
          "sha256")  # fmt: skip
_PREFIX = "hmac-sha256:"


def signature(header: dict[str, Any], secret: bytes) -> str:
    """The signature of the entry of ``header`` by ``secret``."""
    fields = json.dumps({f: header.get(f) for f in SIGNED}, sort_keys=True, separators=(",", ":"))
    message = b"nvrtc_engine entry\0" + fields.encode()
    return _PREFIX + hmac.new(secret, message, "sha256").hexdigest()


def problem(header: dict[str, Any], secret: bytes) -> str | None:
    """Why the entry of ``header`` is not signed by ``secret``, or None where it is."""
    signed = header.get("signature")
    if not isinstance(signed, str) or not signed.startswith(_PREFIX):
        return "unsigned, and a signing key is configured (NVRTC_ENGINE_CACHE_KEY)"
    if not hmac.compare_digest(signed, signature(header, secret)):  # (not guessed bytewise)
        return "signed with another key, or altered after signing"
    return None
