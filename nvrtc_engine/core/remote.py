"""The remote cache: a Redis server shared by a fleet, as a :class:`~nvrtc_engine.core.cache.Tier`.

Imported only where ``NVRTC_ENGINE_REMOTE_CACHE`` names a server; it needs the ``redis`` client
(an optional extra).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .cache import SCHEMA, Tier, check_entry, encode_entry, sign_entry
from .config import Settings, shown_url
from .errors import CacheWarning, warn_once
from .kernel import Artifact
from .nvrtc import nvrtc_identity

if TYPE_CHECKING:
    from .engine import Engine
    from .key import KernelKey

__all__ = ["RedisTier", "publish"]


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

    def share(self, key_name: str, artifact: Artifact, secret: bytes | None) -> bool:
        """Write the entry of ``artifact`` (kernel ``key_name``), signed with ``secret`` (if
        any); whether it is stored now."""
        value = encode_entry(key_name, artifact)
        return self.put(artifact.digest, sign_entry(value, secret) if secret else value)

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
                with contextlib.suppress(Exception):
                    lease.release()

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
        with contextlib.suppress(Exception):
            self._client.close()


def publish(engine: Engine, keys: Iterable[KernelKey]) -> list[KernelKey]:
    """Write the entries of ``keys`` (kernels ``engine`` holds, as :func:`~nvrtc_engine.prewarm`
    leaves them in memory) to its remote cache, signed where a secret is configured; the keys
    not written: not held, built by another NVRTC (never shared), no remote cache, or the
    server refused or failed."""
    t, version = engine.tiers(), nvrtc_identity()
    kernels = [(key, engine.cached(key)) for key in keys]
    return [key for key, k in kernels if k is None or t.remote is None
            or k.artifact.nvrtc_version != version
            or not t.remote.share(str(key), k.artifact, t.secret)]  # fmt: skip
