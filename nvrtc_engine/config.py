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
``NVRTC_ENGINE_WORKERS``            int       worker processes for parallel compiles, 1
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
==================================  ========  ===============================================

An empty path variable counts as unset (the default); :func:`configure` refuses an empty
path (``None`` selects the default). A path holding a NUL character is refused (no file
system takes one).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

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
# The most worker processes, as the command line's --workers allows.
MAX_WORKERS = 1024
_DEFAULT_LOCK_TIMEOUT = 60.0
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Settings:
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


def from_environment(env: dict[str, str] | None = None) -> Settings:
    """Build :class:`Settings` from ``env`` (default ``os.environ``).

    Raises ``ValueError`` naming the variable when a value is malformed.
    """
    e = os.environ if env is None else env
    raw_workers = e.get("NVRTC_ENGINE_WORKERS")
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


_PATHS = ("cache_dir", "cuda_include_dir", "debug_dir")
_BOOLS = ("disable_disk_cache", "dump_source", "dependent_launch")


def _checked(name: str, value: object) -> object:
    """A :func:`configure` value for field ``name``, checked as its environment variable is:
    paths (``str`` or ``os.PathLike``, not empty, no NUL, or None) made absolute; booleans
    as ``bool`` or the variable's words; ``cache_size_limit`` bytes from
    :data:`MIN_SIZE_LIMIT` to :data:`MAX_SIZE_LIMIT` (or ``"512M"``); ``workers`` from 1 to
    :data:`MAX_WORKERS` or None; ``lock_timeout`` finite seconds >= 0. Raises
    :class:`SettingsTypeError` (a ``TypeError``) or :class:`SettingsError` (a ``ValueError``)
    naming the field."""
    label = f"configure({name}={value!r})"
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
    if isinstance(value, str):  # the environment variable's spelling
        parse = {"cache_size_limit": _parse_size, "workers": _parse_int,
                 "lock_timeout": _parse_seconds}.get(
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
    if name == "lock_timeout":
        if number and 0 <= float(value) < float("inf"):  # type: ignore[arg-type]
            return float(value)  # type: ignore[arg-type]
        raise (SettingsError if number else SettingsTypeError)(
            f"{label}: expected a finite number of seconds >= 0"
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
    ``dependent_launch`` for kernels made afterwards (a kernel decides once;
    ``clear_cache(disk=False)`` drops those in memory). Raises
    :class:`~nvrtc_engine.errors.SettingsTypeError` (a ``TypeError``) for an unknown field
    or a value of the wrong type, :class:`SettingsError` (a ``ValueError``) for a value out
    of range; the settings are then unchanged.
    """
    global _current
    names = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise SettingsTypeError(f"unknown setting(s) {unknown}; known: {sorted(names)}")
    checked = {name: _checked(name, value) for name, value in overrides.items()}
    with _lock:
        base = _current if _current is not None else from_environment()
        _current = dataclasses.replace(base, **checked)  # type: ignore[arg-type]
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
