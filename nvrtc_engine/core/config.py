"""Every environment variable nvrtc_engine reads, declared once and typed.

Settings are read from the environment the first time :func:`settings` is called and then
kept; :func:`configure` overrides fields in code and :func:`reset` re-reads the environment.
Nothing on a launch path reads the environment.

==================================  ========  ===============================================
variable                            type      meaning
==================================  ========  ===============================================
``NVRTC_ENGINE_CACHE_DIR``          path      disk cache directory (default: the platform
                                              user cache dir, e.g. ``~/.cache/nvrtc_engine``)
``NVRTC_ENGINE_DISABLE_DISK_CACHE`` bool      ``1`` keeps kernels in memory only
``NVRTC_ENGINE_CACHE_SIZE_LIMIT``   bytes     disk cache cap, LRU eviction; accepts ``512M``,
                                              ``2G``, plain bytes (default 512 MiB, at
                                              least :data:`MIN_SIZE_LIMIT`, 1 MiB, at most
                                              :data:`MAX_SIZE_LIMIT`, 2**62 bytes)
``NVRTC_ENGINE_READONLY_CACHE``     paths     read-only caches, searched after the disk
                                              cache: bundle files, or directories holding
                                              a bundle's ``entries/``; separated by
                                              ``os.pathsep`` (``:``)
``NVRTC_ENGINE_CUDA_INCLUDE_DIR``   path      CUDA headers (``cuda_fp8.h``...) to use,
                                              overriding discovery
``NVRTC_ENGINE_DUMP_SOURCE``        bool      ``1`` writes every rendered kernel source to
                                              :attr:`Settings.debug_dir`
``NVRTC_ENGINE_DEBUG_DIR``          path      where rendered sources are written for
                                              debugging (default: a per-user temp dir)
``NVRTC_ENGINE_WORKERS``            int       prewarm's compile threads, 1
                                              to :data:`MAX_WORKERS` (1024; default: the
                                              CPUs this process may use)
``NVRTC_ENGINE_LOCK_TIMEOUT``       seconds   longest wait for another process compiling
                                              the same kernel before compiling anyway
                                              (default 60)
``NVRTC_ENGINE_DEPENDENT_LAUNCH``   bool      ``0`` launches every kernel as an ordinary
                                              launch; by default (``1``) kernels whose
                                              template waits for its grid dependency (the
                                              norms) are launched on sm_90+ with programmatic
                                              stream serialization, which hides the launch
                                              latency behind the previous kernel
``NVRTC_ENGINE_NATIVE_LAUNCH``      bool      ``0`` launches through the pure-Python path
                                              even where the wheel's compiled launcher
                                              loads (default ``1``: use it where it does;
                                              see ``nvrtc_engine.native_launch``)
``NVRTC_ENGINE_REMOTE_CACHE``       URL       a Redis server shared by a fleet, tried after
                                              the read-only caches (``redis://host:port/db``,
                                              ``rediss://``, ``unix://``; needs the ``redis``
                                              extra)
``NVRTC_ENGINE_REMOTE_PREFIX``      text      the remote cache's key prefix (default
                                              ``nvrtc_engine``)
``NVRTC_ENGINE_REMOTE_TTL``         seconds   an entry's life in the remote cache since its
                                              last use; 0: none (default 7 days)
``NVRTC_ENGINE_REMOTE_TIMEOUT``     seconds   connect and socket timeout of the remote cache
                                              (default 0.05)
``NVRTC_ENGINE_REMOTE_WAIT``        seconds   longest wait for another node compiling the
                                              same kernel, and the life of a compile lease
                                              (default 10)
``NVRTC_ENGINE_REMOTE_RETRY``       seconds   after a remote cache failure, how long to work
                                              without it before trying again (default 30)
``NVRTC_ENGINE_CACHE_KEY``          text      a secret shared by a fleet (16 characters or
                                              more): entries written to the remote cache
                                              and bundles are signed with it (HMAC-SHA256),
                                              and those read from them must be
``NVRTC_ENGINE_CACHE_KEY_FILE``     path      a file holding that secret (the variable above
                                              wins where both are set)
``NVRTC_ENGINE_ANY_NVRTC``          bool      ``1`` uses entries of read-only and remote
                                              caches built by another NVRTC version for the
                                              same key and arch, checked by loading them
==================================  ========  ===============================================

An empty path variable counts as unset (the default); :func:`configure` refuses an empty
path (``None`` selects the default). A path holding a NUL character is refused (no file
system takes one).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

from .errors import SettingsError, SettingsTypeError

__all__ = ["MAX_SIZE_LIMIT", "MAX_WORKERS", "MIN_SIZE_LIMIT", "Settings", "configure", "reset",
           "settings"]  # fmt: skip

_DEFAULT_SIZE_LIMIT = 512 * 1024 * 1024
# The smallest disk cache cap: an empty diskcache store (its SQLite database) already takes
# about 32 kB and a cubin tens of kB, so below this a store evicts entries, often the one it
# just stored, at once; 1 MiB holds a few dozen kernels.
MIN_SIZE_LIMIT = 1 << 20
# The largest disk cache cap, 4 EiB: diskcache keeps the cap in SQLite, whose INTEGER ends at
# 2**63 - 1 (a larger cap failed at the first open: "Python int too large to convert to
# SQLite INTEGER"); 2**62 leaves a factor of two of headroom and is far above any disk.
MAX_SIZE_LIMIT = 1 << 62
# The most compile threads, as the command line's --workers allows.
MAX_WORKERS = 1024
_DEFAULT_LOCK_TIMEOUT = 60.0
_DEFAULT_REMOTE_TTL = 7 * 24 * 3600.0  # refreshed at each read: unused entries leave in a week
# Tens of ms: a cache entry is tens of kB, a few ms on any network; a node waits no longer
# for a cache than a compile would take.
_DEFAULT_REMOTE_TIMEOUT = 0.05
_DEFAULT_REMOTE_WAIT = 10.0  # longer than a compile on a busy node (hundreds of ms)
_DEFAULT_REMOTE_RETRY = 30.0
MIN_CACHE_KEY_CHARS = 16  # a secret shorter than this is guessable
_URL_SCHEMES = ("redis", "rediss", "unix")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class Settings(NamedTuple):
    """The engine's configuration; see the module docstring for the variables."""

    cache_dir: Path | None = None
    disable_disk_cache: bool = False
    cache_size_limit: int = _DEFAULT_SIZE_LIMIT
    readonly_cache: tuple[Path, ...] = ()
    cuda_include_dir: Path | None = None
    dump_source: bool = False
    debug_dir: Path | None = None
    workers: int | None = None
    lock_timeout: float = _DEFAULT_LOCK_TIMEOUT
    dependent_launch: bool = True
    native_launch: bool = True
    remote_cache: str | None = None
    remote_prefix: str = "nvrtc_engine"
    remote_ttl: float = _DEFAULT_REMOTE_TTL
    remote_timeout: float = _DEFAULT_REMOTE_TIMEOUT
    remote_wait: float = _DEFAULT_REMOTE_WAIT
    remote_retry: float = _DEFAULT_REMOTE_RETRY
    cache_key: str | None = None  # a secret: repr() leaves it out
    cache_key_file: Path | None = None
    any_nvrtc: bool = False

    def __repr__(self) -> str:
        shown = (f"{k}={v!r}" for k, v in self._asdict().items() if k != "cache_key")
        return f"Settings({', '.join(shown)})"

    def resolved_cache_dir(self) -> Path:
        """The disk cache directory: the configured one, else the platform user cache dir.

        Raises ``OSError`` when there is no configured directory and no home directory to
        put the default one in (``HOME`` unset and no password-database entry): a relative
        ``~/.cache`` would otherwise be created in the working directory.
        """
        if self.cache_dir is not None:
            return self.cache_dir
        path = Path(default_cache_dir())
        if not path.is_absolute():
            raise OSError(f"no home directory for the default cache directory (got {path})")
        return path

    def signing_key(self) -> bytes | None:
        """The secret entries of shared caches are signed with: ``cache_key``, else the
        contents of ``cache_key_file`` (surrounding whitespace dropped), else None. Raises
        :class:`SettingsError` naming ``NVRTC_ENGINE_CACHE_KEY_FILE`` when that file cannot
        be read or holds fewer than :data:`MIN_CACHE_KEY_CHARS` characters."""
        if self.cache_key is not None:
            return self.cache_key.encode()
        if self.cache_key_file is None:
            return None
        name = "NVRTC_ENGINE_CACHE_KEY_FILE"
        try:
            text = self.cache_key_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{name}={str(self.cache_key_file)!r}: cannot be read "
                                f"({type(exc).__name__}: {exc})") from None  # fmt: skip
        return _parse_key(name, text, f"the file {self.cache_key_file}").encode()

    def resolved_debug_dir(self) -> Path:
        """Where rendered sources go for debugging (failed compiles, or all with dump_source)."""
        if self.debug_dir is not None:
            return self.debug_dir
        import tempfile  # (imported here: package import stays light)

        user = os.environ.get("USER") or str(os.getuid() if hasattr(os, "getuid") else "user")
        return Path(tempfile.gettempdir()) / f"nvrtc_engine-{user}"


def default_cache_dir() -> str:
    """platformdirs' user cache directory for ``nvrtc_engine``.

    On Linux its rule is computed here (``$XDG_CACHE_HOME``, or ``~/.cache`` when that is
    unset, blank or relative, then the application name): importing platformdirs costs
    about 5 ms (it imports ``tempfile``), and a whole warm ``get_kernel`` in a new process is
    meant to cost less. tests/test_config.py checks the two agree. Elsewhere platformdirs
    answers.
    """
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_CACHE_HOME", "").strip()
        if not os.path.isabs(base):  # unset, blank or relative: the XDG spec ignores it
            base = os.path.expanduser("~/.cache")
        return os.path.join(base, "nvrtc_engine")
    import platformdirs

    return platformdirs.user_cache_dir("nvrtc_engine", appauthor=False)


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_size(name: str, raw: str) -> int:
    text = raw.strip().lower().removesuffix("b").removesuffix("i")
    factor = 1
    if text and text[-1] in _SUFFIX:
        factor = _SUFFIX[text[-1]]
        text = text[:-1]
    try:
        # an integer exactly (float() rounds above 2**53: 2**63 - 1 became 2**63), else a
        # decimal or exponent such as 1.5G or 1e9
        value = int(text) * factor if text.isascii() and text.isdigit() else (
            int(float(text) * factor))  # fmt: skip
    except (ValueError, OverflowError):  # not a number; nan; inf or 1e400
        raise SettingsError(
            f"{name}={raw!r}: expected a size such as 536870912, 512M or 2G"
        ) from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r}: the size must be positive")
    unit = factor > 1 or raw.strip().lower().endswith("b")
    return _at_least_minimum(name, raw, value, unit=unit)


def _at_least_minimum(name: str, raw: object, value: int, *, unit: bool) -> int:
    """``value`` (bytes), or a :class:`SettingsError` naming ``name`` when it is below
    :data:`MIN_SIZE_LIMIT` or above :data:`MAX_SIZE_LIMIT`; ``unit`` says whether the value
    was given with a unit (without one, a small number was most likely meant as megabytes:
    the message says so)."""
    if value > MAX_SIZE_LIMIT:
        raise SettingsError(
            f"{name}={raw!r}: {value} bytes is above the maximum of 4 EiB (2**62 = "
            f"{MAX_SIZE_LIMIT} bytes): the cache's SQLite index cannot hold a larger limit"
        )
    if value >= MIN_SIZE_LIMIT:
        return value
    hint = ""
    if not unit and value <= 1 << 16:
        hint = f"; a number without a unit is bytes (did you mean {value}M?)"
    raise SettingsError(
        f"{name}={raw!r}: {value} bytes is below the minimum of 1 MiB ({MIN_SIZE_LIMIT} "
        "bytes): an empty cache already takes about 32 kB, and entries stored over the cap "
        f"are evicted at once{hint}"
    )


def _parse_int(name: str, raw: str) -> int:
    """``NVRTC_ENGINE_WORKERS``: an integer from 1 to :data:`MAX_WORKERS`, as the command
    line's ``--workers`` takes it."""
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    return _workers_in_range(name, raw, value)


def _workers_in_range(name: str, raw: object, value: int) -> int:
    """``value``, or a :class:`SettingsError` naming ``name`` unless 1 <= value <=
    :data:`MAX_WORKERS`."""
    if not 1 <= value <= MAX_WORKERS:
        raise SettingsError(f"{name}={raw!r}: expected a positive integer up to {MAX_WORKERS}")
    return value


def _parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise SettingsError(f"{name}={raw!r}: expected a finite number of seconds >= 0")
    return value


def _parse_positive_seconds(name: str, raw: str) -> float:
    value = _parse_seconds(name, raw)
    if value <= 0:
        raise SettingsError(f"{name}={raw!r}: expected a finite number of seconds > 0")
    return value


def _parse_url(name: str, raw: str) -> str | None:
    """A remote cache URL (``redis://[user:password@]host[:port][/db]``, ``rediss://``,
    ``unix:///path``), or None for an empty value."""
    from urllib.parse import urlsplit

    text = raw.strip()
    if not text:
        return None
    try:
        parts = urlsplit(text)
        port, db = parts.port, parts.path.strip("/")
    except ValueError:  # a port that is no number
        parts, port, db = None, None, "x"
    ok = parts is not None and parts.scheme in _URL_SCHEMES and "\0" not in text
    if ok and parts is not None and parts.scheme != "unix":
        ok = bool(parts.hostname) and (not db or db.isdigit())
    if not ok or (port is not None and not 0 < port < 65536):
        raise SettingsError(f"{name}={shown_url(text)!r}: expected redis://host:port/db "
                            "(or rediss://..., unix:///path/to/socket)")  # fmt: skip
    return text


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = f"{parts.username}:" if parts.username else ":"
        netloc = f"{user}***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return parts._replace(netloc=netloc).geturl()
    except ValueError:
        return "(a URL that does not parse)"


def _parse_prefix(name: str, raw: str) -> str:
    text = raw.strip()
    if not text or any(c.isspace() or c == "\0" for c in text):
        raise SettingsError(f"{name}={raw!r}: expected a key prefix without blanks")
    return text


def _parse_key(name: str, raw: str, what: str = "") -> str:
    """A signing secret: at least :data:`MIN_CACHE_KEY_CHARS` characters once stripped."""
    text = raw.strip()
    if len(text) < MIN_CACHE_KEY_CHARS:
        where = what or "the value"  # (the secret itself is never repeated in a message)
        raise SettingsError(
            f"{name}: {where} holds {len(text)} characters; a signing key needs "
            f"{MIN_CACHE_KEY_CHARS} or more (e.g. `openssl rand -hex 32`)"
        )
    return text


def _path(name: str, raw: str | None) -> Path | None:
    """``~`` expanded and made absolute (a relative path would follow the working directory);
    ``None`` for an empty or missing value. A NUL character, which no file system takes and
    which made every later use fail, is a :class:`SettingsError` naming ``name``."""
    if not raw:
        return None
    if "\0" in raw:
        raise SettingsError(f"{name}={raw!r}: a path cannot contain a NUL character")
    return Path(raw).expanduser().absolute()


def _paths(name: str, raw: str | None) -> tuple[Path, ...]:
    """``raw`` split at ``os.pathsep``, each part as :func:`_path` makes it (empty ones
    skipped)."""
    return tuple(p for part in (raw or "").split(os.pathsep) if (p := _path(name, part)))


def _env_seconds(e: Any, field: str) -> float:
    """The duration setting ``field`` from environment ``e`` (see :data:`_SECONDS`)."""
    parse, default = _SECONDS[field]
    name = f"NVRTC_ENGINE_{field.upper()}"
    return parse(name, e.get(name, str(default)))


def from_environment(env: dict[str, str] | None = None) -> Settings:
    """Build :class:`Settings` from ``env`` (default ``os.environ``).

    Raises ``ValueError`` naming the variable when a value is malformed.
    """
    e = os.environ if env is None else env
    raw_workers = e.get("NVRTC_ENGINE_WORKERS")
    raw_key = e.get("NVRTC_ENGINE_CACHE_KEY", "").strip()
    return Settings(
        cache_dir=_path("NVRTC_ENGINE_CACHE_DIR", e.get("NVRTC_ENGINE_CACHE_DIR")),
        disable_disk_cache=_parse_bool(
            "NVRTC_ENGINE_DISABLE_DISK_CACHE", e.get("NVRTC_ENGINE_DISABLE_DISK_CACHE", "0")
        ),
        cache_size_limit=_parse_size(
            "NVRTC_ENGINE_CACHE_SIZE_LIMIT",
            e.get("NVRTC_ENGINE_CACHE_SIZE_LIMIT", str(_DEFAULT_SIZE_LIMIT)),
        ),
        readonly_cache=_paths("NVRTC_ENGINE_READONLY_CACHE", e.get("NVRTC_ENGINE_READONLY_CACHE")),
        cuda_include_dir=_path(
            "NVRTC_ENGINE_CUDA_INCLUDE_DIR", e.get("NVRTC_ENGINE_CUDA_INCLUDE_DIR")
        ),
        dump_source=_parse_bool("NVRTC_ENGINE_DUMP_SOURCE", e.get("NVRTC_ENGINE_DUMP_SOURCE", "0")),
        debug_dir=_path("NVRTC_ENGINE_DEBUG_DIR", e.get("NVRTC_ENGINE_DEBUG_DIR")),
        workers=_parse_int("NVRTC_ENGINE_WORKERS", raw_workers) if raw_workers else None,
        lock_timeout=_parse_seconds(
            "NVRTC_ENGINE_LOCK_TIMEOUT",
            e.get("NVRTC_ENGINE_LOCK_TIMEOUT", str(_DEFAULT_LOCK_TIMEOUT)),
        ),
        dependent_launch=_parse_bool(
            "NVRTC_ENGINE_DEPENDENT_LAUNCH", e.get("NVRTC_ENGINE_DEPENDENT_LAUNCH", "1")
        ),
        native_launch=_parse_bool(
            "NVRTC_ENGINE_NATIVE_LAUNCH", e.get("NVRTC_ENGINE_NATIVE_LAUNCH", "1")
        ),
        remote_cache=_parse_url(
            "NVRTC_ENGINE_REMOTE_CACHE", e.get("NVRTC_ENGINE_REMOTE_CACHE", "")
        ),
        remote_prefix=_parse_prefix(
            "NVRTC_ENGINE_REMOTE_PREFIX", e.get("NVRTC_ENGINE_REMOTE_PREFIX", "nvrtc_engine")
        ),
        remote_ttl=_env_seconds(e, "remote_ttl"),
        remote_timeout=_env_seconds(e, "remote_timeout"),
        remote_wait=_env_seconds(e, "remote_wait"),
        remote_retry=_env_seconds(e, "remote_retry"),
        cache_key=_parse_key("NVRTC_ENGINE_CACHE_KEY", raw_key) if raw_key else None,
        cache_key_file=_path("NVRTC_ENGINE_CACHE_KEY_FILE", e.get("NVRTC_ENGINE_CACHE_KEY_FILE")),
        any_nvrtc=_parse_bool("NVRTC_ENGINE_ANY_NVRTC", e.get("NVRTC_ENGINE_ANY_NVRTC", "0")),
    )


_lock = threading.Lock()
_current: Settings | None = None


def settings() -> Settings:
    """The current settings, read from the environment on first use."""
    global _current
    current = _current
    if current is None:
        with _lock:
            if _current is None:
                _current = from_environment()
            current = _current
    return current


_PATHS = ("cache_dir", "cuda_include_dir", "debug_dir", "cache_key_file")
_BOOLS = ("disable_disk_cache", "dump_source", "dependent_launch", "native_launch", "any_nvrtc")
# The remote cache's durations: (parser, default); remote_timeout must be above 0.
_SECONDS = {"remote_ttl": (_parse_seconds, _DEFAULT_REMOTE_TTL),
            "remote_timeout": (_parse_positive_seconds, _DEFAULT_REMOTE_TIMEOUT),
            "remote_wait": (_parse_seconds, _DEFAULT_REMOTE_WAIT),
            "remote_retry": (_parse_seconds, _DEFAULT_REMOTE_RETRY)}  # fmt: skip
# Text settings, None allowed where the parser gives None for nothing
_TEXTS = {"remote_cache": _parse_url, "remote_prefix": _parse_prefix, "cache_key": _parse_key}


def _checked(name: str, value: object) -> object:
    """A :func:`configure` value for field ``name``, checked as its environment variable is:
    paths (``str`` or ``os.PathLike``, not empty, no NUL, or None) made absolute; booleans
    as ``bool`` or the variable's words; ``cache_size_limit`` bytes from
    :data:`MIN_SIZE_LIMIT` to :data:`MAX_SIZE_LIMIT` (or ``"512M"``); ``workers`` from 1 to
    :data:`MAX_WORKERS` or None; ``lock_timeout`` and the ``remote_*`` durations finite
    seconds >= 0 (``remote_timeout`` > 0); ``remote_cache``, ``cache_key`` text or None,
    ``remote_prefix`` text. Raises :class:`SettingsTypeError` (a ``TypeError``) or
    :class:`SettingsError` (a ``ValueError``) naming the field (never showing a secret: the
    key, a URL's password)."""
    shown = shown_url(value) if name == "remote_cache" and isinstance(value, str) else value
    label = f"configure({name}={'...' if name == 'cache_key' else repr(shown)})"
    if name == "readonly_cache":
        parts = [value] if isinstance(value, (str, os.PathLike)) else value
        if not isinstance(parts, (list, tuple)):
            raise SettingsTypeError(f"{label}: expected paths (a str, os.PathLike or a list)")
        checked: list[Path] = []
        for part in parts:
            text = os.fspath(part) if isinstance(part, (str, os.PathLike)) else None
            if not isinstance(text, str):
                raise SettingsTypeError(f"{label}: expected paths (a str, os.PathLike or a list)")
            if not text:
                raise SettingsError(f"{label}: an empty path; pass () for none")
            try:
                checked += _paths(name, text) if isinstance(part, str) else [_path(name, text)]
            except SettingsError as exc:
                raise SettingsError(f"{label}: {str(exc).split(': ', 1)[-1]}") from None
        return tuple(checked)
    if name in _PATHS:
        if value is None:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise SettingsTypeError(f"{label}: expected a path (str or os.PathLike) or None")
        path = os.fspath(value)
        if not isinstance(path, str):  # a bytes PathLike
            raise SettingsTypeError(f"{label}: expected a path (str or os.PathLike) or None")
        if not path:  # Path("") is the working directory: never what was meant
            raise SettingsError(f"{label}: an empty path; pass None for the default")
        try:
            return _path(name, path)
        except SettingsError as exc:  # "name='raw': reason" -> "configure(name='raw'): reason"
            raise SettingsError(f"{label}: {str(exc).split(': ', 1)[-1]}") from None
    if name in _TEXTS:
        if value is None and name != "remote_prefix":
            return None
        if not isinstance(value, str):
            raise SettingsTypeError(f"{label}: expected text"
                                    + (" or None" if name != "remote_prefix" else ""))  # fmt: skip
        if name == "cache_key":  # (its messages never repeat the secret)
            return _parse_key(label, value)
    if isinstance(value, str):  # the environment variable's spelling
        parse = {"cache_size_limit": _parse_size, "workers": _parse_int,
                 "lock_timeout": _parse_seconds, **_TEXTS,
                 **{field: parse for field, (parse, _) in _SECONDS.items()}}.get(
            name, _parse_bool)  # fmt: skip
        try:
            return parse(name, value)
        except ValueError as exc:  # "name='raw': reason" -> "configure(name='raw'): reason"
            raise SettingsError(f"{label}: {str(exc).split(': ', 1)[-1]}") from None
    if name in _BOOLS:
        if isinstance(value, bool):
            return value
        raise SettingsTypeError(f"{label}: expected True or False (or the variable's words: "
                                "'1'/'0', 'true'/'false', 'yes'/'no', 'on'/'off')")  # fmt: skip
    if name == "workers" and value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "lock_timeout" or name in _SECONDS:
        low = ">" if name == "remote_timeout" else ">="
        seconds = float(value) if number else -1.0  # type: ignore[arg-type]
        if (seconds > 0 or (seconds == 0 and low == ">=")) and seconds < float("inf"):
            return seconds
        raise (SettingsError if number else SettingsTypeError)(
            f"{label}: expected a finite number of seconds {low} 0"
        )
    if name == "cache_size_limit":
        if not isinstance(value, int) or isinstance(value, bool):
            raise SettingsTypeError(f"{label}: expected a number of bytes (an int) or a size "
                                    "such as '512M'")  # fmt: skip
        if value <= 0:
            raise SettingsError(f"{label}: the size must be positive")
        try:
            return _at_least_minimum(name, value, value, unit=False)
        except SettingsError as exc:  # "name=raw: reason" -> "configure(name=raw): reason"
            raise SettingsError(f"{label}: {str(exc).split(': ', 1)[-1]}") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise SettingsTypeError(f"{label}: expected a positive integer")
    try:
        return _workers_in_range(name, value, value)
    except SettingsError as exc:  # "name=raw: reason" -> "configure(name=raw): reason"
        raise SettingsError(f"{label}: {str(exc).split(': ', 1)[-1]}") from None


def configure(**overrides: object) -> Settings:
    """Override settings in code, e.g. ``configure(cache_dir=Path("/scratch/k"))``.

    Values are checked as the environment variables are (``cache_size_limit="2G"`` and
    ``workers="4"`` are accepted; ``cache_size_limit=0``, limits below 1 MiB or above
    :data:`MAX_SIZE_LIMIT` and ``workers`` above :data:`MAX_WORKERS` are not; nor is an
    empty path, where ``None`` selects the default, or one with a NUL character). Takes
    effect for caches opened afterwards (see :func:`nvrtc_engine.clear_cache`);
    ``dependent_launch`` and ``native_launch`` for kernels made afterwards (a kernel decides
    once; ``clear_cache(disk=False)`` drops those in memory). Raises
    :class:`~nvrtc_engine.core.errors.SettingsTypeError` (a ``TypeError``) for an unknown field
    or a value of the wrong type, :class:`SettingsError` (a ``ValueError``) for a value out
    of range; the settings are then unchanged.
    """
    global _current
    names = set(Settings._fields)
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise SettingsTypeError(f"unknown setting(s) {unknown}; known: {sorted(names)}")
    checked = {name: _checked(name, value) for name, value in overrides.items()}
    with _lock:
        base = _current if _current is not None else from_environment()
        _current = base._replace(**checked)
        current = _current
    return current


def _reinit_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


def reset() -> Settings:
    """Forget overrides and re-read the environment."""
    global _current
    with _lock:
        _current = current = from_environment()
    return current
