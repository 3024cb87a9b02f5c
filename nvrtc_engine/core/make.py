"""make_key: a validated :class:`~nvrtc_engine.KernelKey` from get_kernel's keyword fields,
with their defaults (the output dtype's input dtype and scaling, the current device's arch).

Its own module, below the API, so that what makes keys (variant files, the command line)
imports only the families it names; :mod:`nvrtc_engine.api` re-exports it."""

from __future__ import annotations

from typing import Any

from . import driver
from .dtypes import DTYPES, dtype_name
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    NoDeviceError,
    VariantError,
    VariantTypeError,
    did_you_mean,
)
from .key import KNOWN_ARCH_NUMBERS, DeviceArch, KernelKey, arch_number, parse_arch

__all__ = ["NO_GPU_HINT", "device_arch", "device_ordinal", "make_key"]


# The hint of a NoDeviceError for a missing arch, in Python syntax; the command line shows
# its own (--arch sm_90) in its place (cli.py).
NO_GPU_HINT = "pass arch='sm_90' (or another arch) to compile without a GPU"


def device_ordinal(device: Any) -> int | None:
    """``device`` checked: None, or a CUDA device ordinal (:func:`driver.checked_ordinal`:
    an int from 0 to 2**31 - 1, numpy's too, never a bool) returned as an int. Raises
    :class:`~nvrtc_engine.VariantError` otherwise (:class:`~nvrtc_engine.VariantTypeError`
    for a value that is not an int)."""
    if device is None:
        return None
    allowed = "None or a CUDA device ordinal (an int from 0 to 2147483647)"
    try:
        return driver.checked_ordinal(device)
    except ArgumentTypeError:
        raise VariantTypeError("device", device, allowed, "not an int") from None
    except ArgumentError:
        raise VariantError("device", device, allowed) from None


def device_arch(device: int | None) -> DeviceArch:
    """The arch of ``device`` (default: the current device), which may be newer than every
    known arch. Raises :class:`~nvrtc_engine.NoDeviceError` naming the fix."""
    try:
        ordinal = driver.current_device() if device is None else device
        return DeviceArch(driver.get_device(ordinal).arch)
    except NoDeviceError as exc:
        source = "no GPU" if device is None else f"no GPU {device}"
        raise NoDeviceError(
            f"no arch given, and {source} to take it from: {NO_GPU_HINT} "
            f"(the driver said: {str(exc).rstrip('. ')})"
        ) from None


def check_arch(key: KernelKey) -> KernelKey:
    """``key``, if its arch is a known one or that of a GPU here (one newer than every known
    arch, whose kernel is PTX); a key holds any newer arch it is given, but a caller's key
    must not make PTX for an arch no GPU here has. Raises the
    :class:`~nvrtc_engine.VariantError` :func:`~nvrtc_engine.core.key.parse_arch` raises
    for an unknown arch."""
    if arch_number(key.arch) <= KNOWN_ARCH_NUMBERS[-1]:
        return key
    try:
        here = str(device_arch(None))
    except NoDeviceError:
        here = None
    if key.arch != here:
        parse_arch(key.arch)  # (raises: newer than every known arch)
    return key


def make_key(
    op: str,
    *,
    dtype: Any = None,
    in_dtype: Any = None,
    out_dtype: Any = None,
    scaling: str | None = None,
    layout: str = "rowwise",
    hidden_size: int | None = None,
    arch: str | int | None = None,
    device: int | None = None,
    **flags: bool | int,
) -> KernelKey:
    """Build and validate a :class:`KernelKey` with ``get_kernel``'s defaults; compiles nothing.

    ``op`` is matched in any case (``"GELU"`` is ``"gelu"``); the key holds the lower-case
    name, so both spellings give the same key, kernel and cache entry. ``flags`` are the op's
    flags by name (``zero_centered_gamma=True``; an int for an int flag), or as
    ``flags={name: value}``.

    ``dtype`` names the output dtype. The input dtype defaults to ``dtype`` when that is a
    high-precision type, else (FP8, FP4) to ``bf16``; so ``make_key("gelu", dtype="fp8")`` is
    bf16 in, fp8_e4m3 out, tensor scaling. With neither, bf16 in and out. ``scaling`` defaults
    to the op's default for the output dtype (``tensor`` for FP8 outputs of most ops, ``none``
    for high-precision outputs). ``arch`` defaults to the arch of
    ``device`` (default: the current device). A named ``arch`` must be one this library
    knows (``sm_80`` to ``sm_121``, see :func:`~nvrtc_engine.core.key.parse_arch`): ``sm_900`` is
    an error, not a kernel. Only a device newer than every known arch, with ``arch`` left
    out, gets a key for its own arch, whose kernel is PTX for the newest arch NVRTC supports.

    ``device`` is a CUDA device ordinal (an int >= 0) or None; it is read only when ``arch``
    is omitted, but checked always.

    Raises :class:`~nvrtc_engine.VariantError` for a bad field (``device`` and an unknown
    ``arch`` included),
    :class:`~nvrtc_engine.ArgumentTypeError` (a ``TypeError``) for ``dtype`` together with
    ``out_dtype``, :class:`~nvrtc_engine.NoDeviceError` when ``arch`` is omitted and there is
    no GPU.
    """
    if dtype is not None and out_dtype is not None:
        raise ArgumentTypeError("out_dtype", "give dtype (the output dtype) or out_dtype, not both")
    device = device_ordinal(device)
    from .registry import get_spec

    spec = get_spec(op)
    # the caller's argument and spelling behind each dtype field, for the errors
    given: dict[str, tuple[str, Any]] = {}
    if out_dtype is not None or dtype is not None:
        arg = "out_dtype" if out_dtype is not None else "dtype"
        given["out_dtype"] = (arg, out_dtype if out_dtype is not None else dtype)
        out: str | None = _dtype_field(given["out_dtype"][1], arg, spec.out_dtypes, spec.name)
    else:
        out = None
    if in_dtype is not None:
        given["in_dtype"] = ("in_dtype", in_dtype)
        inp = _dtype_field(in_dtype, "in_dtype", spec.in_dtypes, spec.name)
    elif out is not None and not DTYPES[out].needs_scaling:
        given["in_dtype"] = given["out_dtype"]
        inp = out
    else:
        inp = "bf16"
    if out is None:
        out = inp
    if isinstance(flags.get("flags"), dict):  # flags={"zero_centered_gamma": True}, as in files
        table = flags.pop("flags")
        for name in table.keys() & flags.keys():
            given = (type(table[name]), table[name]), (type(flags[name]), flags[name])
            if given[0] != given[1]:  # (True and 1 differ: one is no bool flag's value)
                raise ArgumentTypeError(
                    name, f"given as {name}={flags[name]!r} and as flags={{{name!r}: "
                    f"{table[name]!r}}}: give it once",
                )  # fmt: skip
        flags = {**table, **flags}
    for name in flags:
        if name not in spec.flags:
            fields = ["dtype", "in_dtype", "out_dtype", "scaling", "layout", "hidden_size",
                      "arch", "device"]  # fmt: skip
            long_names = {short: long for long, short in spec.flags.items()}
            close = (f"did you mean {long_names[name]}? ({name} is its short form in kernel "
                     "names)" if name in long_names
                     else did_you_mean(name, fields + list(spec.flags)))  # fmt: skip
            raise VariantError(
                name, flags[name], fields + sorted(spec.flags),
                f"not a key field or a flag of {spec.name!r}" + (f"; {close}" if close else ""),
            )  # fmt: skip
    fields = dict(op=spec.name, in_dtype=inp, out_dtype=out,
                  scaling=scaling if scaling is not None else spec.default_scaling(out),
                  layout=layout, hidden_size=hidden_size, flags=tuple(flags.items()))  # fmt: skip

    def build(arch: str | int) -> KernelKey:
        try:
            return KernelKey(arch=arch, **fields)
        except VariantError as exc:
            raise _as_given(exc, given, fields) from None

    if arch is None:
        try:
            arch = device_arch(device)
        except NoDeviceError as exc:
            missing = exc
        else:
            return build(arch)
        # a bad field is the caller's first problem: report it before the missing GPU, outside
        # the handler so that its traceback is not chained to this one (no op's checks depend
        # on the arch, so any arch validates the other fields)
        build("sm_90")
        raise missing
    key = build(arch)  # every field checked, the arch's form included
    parse_arch(arch)  # a named arch must be a known one (a DeviceArch may be newer)
    return key


def _dtype_field(value: Any, field: str, allowed: tuple[str, ...], op: str) -> str:
    """The canonical name of the dtype ``value`` given as ``field`` for ``op``. For a value
    that names no dtype the :class:`~nvrtc_engine.VariantError` lists the op's ``allowed``
    names (any alias of them works too), not every dtype of the library."""
    try:
        return dtype_name(value, field)
    except VariantError as exc:
        hint = f"for op {op!r}" + (f"; {exc.hint}" if exc.hint else "")
        raise type(exc)(field, value, allowed, hint) from None  # (VariantTypeError stays one)


def _as_given(
    exc: VariantError, given: dict[str, tuple[str, Any]], fields: dict[str, Any]
) -> VariantError:
    """``exc`` about a dtype field restated with the caller's own argument and spelling
    (``given``: field -> (argument, value)), the resolved name (in ``fields``, the key's)
    after it where they differ: ``dtype='fp4' (fp4_e2m1) is not allowed ...`` rather than
    ``out_dtype='fp4_e2m1' ...``."""
    if exc.field not in given:
        return exc
    arg, value = given[exc.field]
    resolved = fields[exc.field]
    shown = "" if isinstance(value, str) and value == resolved else f"({resolved}) "
    return type(exc)(arg, value, exc.allowed, exc.hint, detail=shown + exc.detail)
