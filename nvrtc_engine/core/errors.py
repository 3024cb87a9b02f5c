"""Exceptions raised by nvrtc_engine.

Every exception the package raises on purpose derives from :class:`NvrtcEngineError`, and
also from the builtin a caller would naturally catch (``ValueError`` for a bad key or argument,
``TypeError`` for an argument of the wrong kind, ``RuntimeError`` for compile and CUDA
failures). All of them survive pickling, so they cross process pools intact::

    NvrtcEngineError
    ├── VariantError            (ValueError)   a key field outside its allowed set
    │   └── VariantTypeError    (TypeError)    a key field of the wrong type
    ├── NoDeviceError           (RuntimeError) no GPU where one is needed (e.g. arch unknown)
    ├── HeaderNotFoundError     (RuntimeError) CUDA headers needed but not found
    ├── CompileError            (RuntimeError) NVRTC rejected a rendered kernel
    ├── CudaError               (RuntimeError) a CUDA driver call failed
    ├── SettingsError           (ValueError)   a malformed NVRTC_ENGINE_* variable or configure()
    │   │                                      value
    │   └── SettingsTypeError   (TypeError)    a configure() value of the wrong type, or an
    │                                          unknown setting
    ├── ArgumentError           (ValueError)   an argument with the wrong shape/dtype/device/...
    ├── ArgumentTypeError       (TypeError)    an argument that is not an array/stream at all,
    │                                          or key fields that do not go together
    ├── VariantListError        (ValueError)   a variant file or list that cannot be read or
    │                                          expanded (names the file and entry)
    └── BundleError             (ValueError)   a bundle that cannot be written or is refused on
                                               import (nvrtc_engine.tools.bundle)

    CacheWarning                (UserWarning)  the disk cache degraded to memory-only
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BundleError",
    "CacheWarning",
    "CompileError",
    "CudaError",
    "HeaderNotFoundError",
    "NoDeviceError",
    "NvrtcEngineError",
    "SettingsError",
    "SettingsTypeError",
    "VariantError",
    "VariantListError",
    "VariantTypeError",
]


def _rebuild(cls: type[NvrtcEngineError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class NvrtcEngineError(Exception):
    """Base class of every error raised by nvrtc_engine."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def did_you_mean(
    value: object, choices: Sequence[str], n: int = 1, label: Callable[[str], str] = str
) -> str:
    """``"did you mean X?"`` for the closest of ``choices`` to ``value`` (``"did you mean X
    or Y?"`` for the ``n`` closest, closest first), or ``""`` when none is close. ``label``
    gives the text shown for a choice (e.g. an alias with the name it stands for)."""
    if not isinstance(value, str):
        return ""
    import difflib  # (an error path: not imported with the package)

    close = difflib.get_close_matches(value, list(choices), n=n)
    return f"did you mean {' or '.join(map(label, close))}?" if close else ""


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` with its noun for messages: ``counted(1, "variant")`` is ``"1 variant"``,
    ``counted(2, "entry", "entries")`` is ``"2 entries"`` (default plural: noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class VariantError(NvrtcEngineError, ValueError):
    """A kernel variant key field is outside its closed set of allowed values.

    The message is ``field=value`` followed by ``detail``: by default ``is not allowed
    (hint); allowed: ...``; a caller with a clearer sentence passes its own ``detail``
    (:func:`nvrtc_engine.core.key.parse_arch` does, for a bad arch).

    Attributes: ``field`` (the key field at fault), ``value`` (what was given, as text),
    ``allowed`` (the allowed values, as text), ``hint`` (why, or a suggestion; may be
    ``""``) and ``detail`` (the message after ``field=value``, so that another front end,
    such as the command line's ``--arch``, can put its own name for the value before it).
    """

    def __init__(
        self, field: str, value: object, allowed: object, hint: str = "", *, detail: str = ""
    ) -> None:
        allowed_text = (
            ", ".join(map(str, allowed)) if isinstance(allowed, (list, tuple)) else str(allowed)
        )
        if not detail:
            # the hint first: the list of allowed values can be long (every op)
            detail = "is not allowed" + (f" ({hint})" if hint else "")
            detail += f"; allowed: {allowed_text}"
        super().__init__(f"{field}={value!r} {detail}")
        self.field = field
        self.value = repr(value)
        self.allowed = allowed_text
        self.hint = hint
        self.detail = detail


class VariantTypeError(VariantError, TypeError):
    """A key field of the wrong type: ``hidden_size="4096"``, a flag given as ``1``, an arch
    or scaling that is neither a string nor (arch) an int. A :class:`VariantError` too, so
    ``except VariantError`` and ``except TypeError`` both catch it."""


class NoDeviceError(NvrtcEngineError, RuntimeError):
    """No usable CUDA device, where the call needs one (a launch, or the arch of the device)."""


class HeaderNotFoundError(NvrtcEngineError, RuntimeError):
    """The CUDA headers a kernel needs could not be found.

    Attributes: ``searched`` (the directories tried, in order) and ``nvrtc_version``.
    """

    def __init__(self, message: str, searched: tuple[str, ...], nvrtc_version: str) -> None:
        super().__init__(message)
        self.searched = searched
        self.nvrtc_version = nvrtc_version


class CompileError(NvrtcEngineError, RuntimeError):
    """NVRTC failed to compile a rendered kernel.

    Attributes: ``key`` (the variant name, or ``None``), ``log`` (the whole NVRTC log),
    ``options`` (the NVRTC flags), ``nvrtc_version``, ``header_version`` (the CUDA header
    version used, or ``None`` when no CUDA header was needed), ``source_path`` (where the
    rendered source was written for debugging, or ``None`` if it could not be written).
    """

    def __init__(
        self,
        *,
        key: str | None,
        log: str,
        options: tuple[str, ...],
        nvrtc_version: str,
        header_version: str | None,
        source_path: str | None,
    ) -> None:
        first = next((line for line in log.splitlines() if "error" in line), log.strip()[:200])
        where = f" (source written to {source_path})" if source_path else ""
        super().__init__(
            f"NVRTC {nvrtc_version} failed to compile {key or 'a kernel'}: {first}{where}\n"
            f"options: {' '.join(options)}\nfull log:\n{log}"
        )
        self.key = key
        self.log = log
        self.options = options
        self.nvrtc_version = nvrtc_version
        self.header_version = header_version
        self.source_path = source_path

    @property
    def first_error(self) -> str:
        """The first line of the NVRTC log that reports an error."""
        for line in self.log.splitlines():
            if "error" in line:
                return line.strip()
        return self.log.strip().splitlines()[0] if self.log.strip() else ""


class CudaError(NvrtcEngineError, RuntimeError):
    """A CUDA driver API call failed.

    Attributes: ``call`` (the driver function), ``code`` (the ``CUresult`` value) and
    ``name`` (its symbolic name, e.g. ``CUDA_ERROR_INVALID_VALUE``).
    """

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        super().__init__(f"{call} failed with {name} ({code}){': ' + detail if detail else ''}")
        self.call = call
        self.code = code
        self.name = name


class SettingsError(NvrtcEngineError, ValueError):
    """A setting has a malformed value: an ``NVRTC_ENGINE_*`` environment variable (the
    message names it and the value) or a :func:`nvrtc_engine.configure` argument. A value of
    the wrong type passed to ``configure`` raises :class:`SettingsTypeError`."""


class SettingsTypeError(SettingsError, TypeError):
    """A :func:`nvrtc_engine.configure` argument of the wrong type (``workers=True``,
    ``cache_size_limit=1.5``, ``cache_dir=3``) or an unknown setting's name. A
    :class:`SettingsError` too, so ``except SettingsError`` and ``except TypeError`` both
    catch it."""


class ArgumentError(NvrtcEngineError, ValueError):
    """A kernel argument has the wrong shape, dtype, device, layout or alignment.

    Attribute ``argument`` names the argument at fault.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class ArgumentTypeError(NvrtcEngineError, TypeError):
    """A kernel argument is not an array, stream or scalar of an accepted kind; or a call's
    key fields do not go together (``dtype`` with ``out_dtype``; ``get_kernel(key)`` with
    fields), as Python's own ``TypeError`` for a call's arguments.

    Attribute ``argument`` names the argument at fault.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class BundleError(NvrtcEngineError, ValueError):
    """A bundle that cannot be written or is refused on import.

    Attributes: ``path`` (the bundle), ``entry`` (the key of the entry at fault, or ``None``
    for the bundle as a whole) and ``reason``.
    """

    def __init__(self, path: str, entry: str | None, reason: str) -> None:
        where = f"{path}: entry {entry}" if entry else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.entry = entry
        self.reason = reason


class VariantListError(NvrtcEngineError, ValueError):
    """A variant list (file or entries) that cannot be read or expanded
    (:mod:`nvrtc_engine.tools.variants`, :func:`nvrtc_engine.prewarm`).

    Attributes: ``source`` (the file, or ``"<list>"``), ``entry`` (the 0-based entry index,
    or ``None`` for the file as a whole) and ``reason``.
    """

    def __init__(self, source: str, entry: int | None, reason: str) -> None:
        where = source if entry is None else f"{source}, entry {entry}"
        super().__init__(f"{where}: {reason}")
        self.source = source
        self.entry = entry
        self.reason = reason


class CacheWarning(UserWarning):
    """The on-disk kernel cache is unusable; kernels are kept in memory only."""


_warned_once: set[tuple[str, str]] = set()
_warned_once_lock = threading.Lock()


def _reinit_after_fork() -> None:
    global _warned_once_lock
    _warned_once_lock = threading.Lock()  # a lock held by another thread at fork stays held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


# The package's own frames: its modules' code objects carry paths under this directory, in
# the form the import system gave them (absolute, or relative to a relative sys.path entry).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # (nvrtc_engine/, not core/)


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside this
    package: the caller's line that called ``get_kernel``, ``prewarm``, a kernel..., however
    deep in the engine the warning arose (Python 3.12's ``skip_file_prefixes``, for every
    supported Python). With no such frame, the outermost one."""
    frame = sys._getframe(1)
    level = 2  # warnings.warn's stacklevel of ``frame``: 1 is this function
    while frame.f_code.co_filename.startswith(_PACKAGE_DIR) and frame.f_back is not None:
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def warn_once(kind: str, subject: str, message: str, category: type[Warning]) -> None:
    """:func:`warn` the first time this process sees ``(kind, subject)`` (e.g. an unusable
    cache directory), thread-safe."""
    with _warned_once_lock:
        if (kind, subject) in _warned_once:
            return
        _warned_once.add((kind, subject))
    warn(message, category)
