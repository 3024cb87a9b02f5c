"""The variant key: which kernel to render, compile and cache.

A :class:`KernelKey` is frozen, hashable and validated against closed sets when it is built,
so no caller string ever reaches template text. ``str(key)`` is the canonical name, e.g.
``gelu_bf16_e4m3_tensor_rowwise_h4096_sm90``; it is also the stem of the kernel's
``extern "C"`` symbol, and :meth:`KernelKey.parse` reads it back.

The key is a plain record and imports no family: what an op allows (its dtypes, scalings,
flags) comes from the op's spec, which the registry (:mod:`nvrtc_engine.core.registry`)
hands to this module once, when it is imported (:func:`use_registry`).
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .dtypes import DTYPES, DType, dtype_name
from .errors import VariantError, VariantTypeError, did_you_mean
from .record import Checked

if TYPE_CHECKING:
    from .spec import OpSpec

__all__ = [
    "KNOWN_ARCH_NUMBERS",
    "LAYOUTS",
    "MAX_HIDDEN_SIZE",
    "SCALINGS",
    "DeviceArch",
    "IntFlag",
    "KernelKey",
    "KeySpec",
    "arch_number",
    "parse_arch",
    "use_registry",
]

SCALINGS: tuple[str, ...] = ("none", "tensor", "mxfp8", "nvfp4")
LAYOUTS: tuple[str, ...] = ("rowwise", "columnwise", "both")
MAX_HIDDEN_SIZE = 1 << 20
# Compute capabilities NVRTC 13 targets (Ampere and newer): the archs a caller may name. Only
# a device newer than all of these gets a key for a newer arch (a DeviceArch; its kernel is
# PTX for the newest arch NVRTC supports, see nvrtc.py).
KNOWN_ARCH_NUMBERS: tuple[int, ...] = (80, 86, 87, 88, 89, 90, 100, 103, 107, 110, 120, 121)
# Arch-specific targets: 'a' (this exact arch) from sm_90 on, 'f' (its family) from sm_100 on.
SUFFIX_FROM = {"a": 90, "f": 100}
_ARCH_RE = re.compile(r"^sm_?(\d{2,3})([af]?)$")
_SHORT_TO_DTYPE = {d.short: d.name for d in DTYPES.values()}
_EXAMPLE_NAME = "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"


@functools.cache
def _name_pattern() -> re.Pattern[str]:
    """The shape of a kernel name (``str(key)``), ASCII only: op, dtypes, scaling, layout,
    ``h<size>`` or ``hany``, ``sm<arch>`` and the flags' short forms. Built on first use."""
    shorts = "|".join(_SHORT_TO_DTYPE)
    return re.compile(
        rf"(?P<op>[a-z0-9_]+?)_(?P<i>{shorts})_(?P<o>{shorts})_(?P<s>{'|'.join(SCALINGS)})"
        rf"_(?P<l>{'|'.join(LAYOUTS)})_h(?P<h>any|[0-9]+)_sm(?P<a>[0-9]+[af]?)"
        r"(?P<f>(?:_[a-z0-9]+)*)",
        re.ASCII,
    )


class IntFlag(NamedTuple):
    """An op flag that takes an int: ``short`` plus the value in kernel names (``v8`` for
    ``short="v"``, value 8), one of ``choices``; the ``default`` is left out of the key (as
    a bool flag's ``False`` is). A spec maps a bool flag's name to its short form (a str),
    an int flag's name to one of these."""

    short: str
    choices: tuple[int, ...]
    default: int


class KeySpec(Protocol):
    """What a key needs of its op's spec (:class:`~nvrtc_engine.core.spec.OpSpec`): the
    canonical op name, the flags (name -> short form or :class:`IntFlag`) and the check of
    the remaining fields against the op's sets."""

    name: str
    flags: Mapping[str, str | IntFlag]

    def validate(self, key: KernelKey) -> None: ...


class _Registry:
    """The spec lookup the registry installs (:func:`use_registry`)."""

    spec: Callable[[str], KeySpec] | None = None
    ops: Callable[[], tuple[str, ...]] | None = None


def use_registry(spec: Callable[[str], KeySpec], ops: Callable[[], tuple[str, ...]]) -> None:
    """Install the op registry: ``spec(op)`` returns the spec of an op named in any case (or
    raises :class:`VariantError`), ``ops()`` the names of every op. Called once, by
    :mod:`nvrtc_engine.core.registry` when it is imported (``nvrtc_engine.core`` imports it)."""
    _Registry.spec, _Registry.ops = spec, ops


def _spec(op: str) -> KeySpec:
    if _Registry.spec is None:  # (nvrtc_engine.core imports the registry: never reached)
        raise RuntimeError("no op registry installed: import nvrtc_engine")
    return _Registry.spec(op)


def _ops() -> tuple[str, ...]:
    if _Registry.ops is None:
        raise RuntimeError("no op registry installed: import nvrtc_engine")
    return _Registry.ops()


def _flag_value(name: str, value: Any, kind: str | IntFlag) -> bool | int:
    """``value`` checked against a flag's kind: a bool, or an int of the flag's choices."""
    if isinstance(kind, str):
        if not isinstance(value, bool):
            raise VariantTypeError(name, value, [False, True], "not a bool")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise VariantTypeError(name, value, kind.choices, "not an int")
    if int(value) not in kind.choices:
        raise VariantError(name, value, kind.choices)
    return int(value)


def _flag_part(value: bool | int, kind: str | IntFlag) -> str:
    """A set flag's part of the kernel name: ``zcg``, ``v8``."""
    return kind if isinstance(kind, str) else f"{kind.short}{value}"


class DeviceArch(str):
    """An arch read from a GPU (``sm_90``, ``sm_130``): the one kind of arch that may be newer
    than every arch of :data:`KNOWN_ARCH_NUMBERS` (a device this library and NVRTC do not
    know yet; its kernel is PTX for the newest arch NVRTC supports). An arch a caller names
    is a plain string and must be a known one."""

    __slots__ = ()


def parse_arch(value: Any, *, newer: bool | None = None) -> str:
    """Canonical arch name (``sm_90``, ``sm_90a``, ``sm_100a``...) from a string or an int
    (90; numpy's ints too).

    Accepts the compute capabilities of :data:`KNOWN_ARCH_NUMBERS`, with an ``a`` suffix from
    sm_90 on and an ``f`` suffix from sm_100 on; a newer one only with ``newer=True``, which
    is the default for a :class:`DeviceArch` (the arch of a GPU newer than every known arch).

    Returns:
        The arch in canonical form: ``"SM90A"`` -> ``"sm_90a"``, ``90`` -> ``"sm_90"``.

    Raises:
        VariantError: ``field="arch"``, for a malformed name (``sm_5``, ``compute_90``, ``""``),
            an arch older than sm_80, one between the known archs (``sm_95``), one newer than
            all of them (``sm_900``, ``sm_130``) unless ``newer``, or a suffix the arch cannot
            take (``sm_89a``). Its message says which and lists the known archs.
            :class:`~nvrtc_engine.VariantTypeError` (also a ``TypeError``) for a value that
            is neither a string nor an int (``9.0``, ``True``).
    """
    if newer is None:
        newer = isinstance(value, DeviceArch)
    integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's too
    text = f"sm_{int(value)}" if integer else value
    if isinstance(text, str) and text.strip().isdigit():  # "90" from a command line
        text = f"sm_{text.strip()}"
    m = _ARCH_RE.match(text.strip().lower()) if isinstance(text, str) else None
    number = int(m.group(1)) if m else 0
    future = newer and number > KNOWN_ARCH_NUMBERS[-1]
    if m is None or (number not in KNOWN_ARCH_NUMBERS and not future):
        raise _arch_error(value, None if m is None else number)
    suffix = m.group(2)
    if suffix and number < SUFFIX_FROM[suffix]:
        allowed = [f"sm_{n}{suffix}" for n in KNOWN_ARCH_NUMBERS if n >= SUFFIX_FROM[suffix]]
        kind = "arch-specific 'a'" if suffix == "a" else "family-specific 'f'"
        hint = f"{kind} targets exist from sm_{SUFFIX_FROM[suffix]} on"
        detail = (f"cannot take the '{suffix}' suffix: {hint}; pass sm_{number}, or one of "
                  f"{', '.join(allowed)}")  # fmt: skip
        raise VariantError("arch", value, allowed, hint, detail=detail)
    return f"sm_{number}{suffix}"


def _arch_error(value: Any, number: int | None) -> VariantError:
    """The :class:`VariantError` for an arch that is not a known compute capability:
    ``number`` is ``None`` for a malformed name. Returns it (the caller raises)."""
    known = [f"sm_{n}" for n in KNOWN_ARCH_NUMBERS]
    tail = f"known archs: {', '.join(known)}"
    if number is None:
        hint = "not an arch name such as sm_90"
        detail = ("is not an arch name: expected sm_<major><minor> such as sm_90 (optionally "
                  f"sm_90a, sm_100f); {tail}")  # fmt: skip
    elif number < KNOWN_ARCH_NUMBERS[0]:
        hint = f"older than Ampere (sm_{KNOWN_ARCH_NUMBERS[0]})"
        detail = (
            f"is older than Ampere: the oldest arch supported is sm_{KNOWN_ARCH_NUMBERS[0]}; {tail}"
        )
    elif number > KNOWN_ARCH_NUMBERS[-1]:
        hint = f"newer than every known arch (sm_{KNOWN_ARCH_NUMBERS[-1]})"
        detail = (f"is newer than every arch this library knows (a typo?); {tail}. A GPU "
                  "newer than these gets PTX when the arch is left out (taken from the "
                  "device)")  # fmt: skip
    else:
        below = max(n for n in KNOWN_ARCH_NUMBERS if n < number)
        above = min(n for n in KNOWN_ARCH_NUMBERS if n > number)
        hint = "names no GPU"
        detail = f"names no GPU (it lies between sm_{below} and sm_{above}); {tail}"
    wrong_type = isinstance(value, bool) or not isinstance(value, (str, numbers.Integral))
    if wrong_type:  # (9.0, a tuple, None where an arch must be given)
        detail = f"is not an arch: pass a name such as 'sm_90' or an int such as 90; {tail}"
    return (VariantTypeError if wrong_type else VariantError)(
        "arch", value, known, hint, detail=detail
    )


def _one_of(field: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` as one of ``choices`` (lower-case names), matched in any case and without
    surrounding blanks: ``"MXFP8"`` -> ``"mxfp8"``. Raises :class:`VariantError` naming
    ``field`` and ``choices``, with the closest one for a misspelled name."""
    if not isinstance(value, str):
        raise VariantTypeError(field, value, choices, "not a string")
    text = value.strip().lower()
    if text in choices:
        return text
    raise VariantError(field, value, choices, did_you_mean(text, choices))


def arch_number(arch: str) -> int:
    """The compute capability as an int: ``sm_90a`` -> 90."""
    return int(arch[3:].rstrip("af"))


class _KeyFields(NamedTuple):
    op: str
    in_dtype: str
    out_dtype: str
    scaling: str
    layout: str
    hidden_size: int | None
    arch: str
    flags: tuple[tuple[str, bool | int], ...] = ()


class KernelKey(Checked, _KeyFields):
    """A validated, canonical kernel variant: a NamedTuple of the fields below, checked and
    made canonical whenever one is built (``key._replace(arch="sm_100a")`` too).

    Fields:
        op: kernel name, one of the registry's ops (``gelu``, ...), given in any case and
            stored lower-case (``GELU`` -> ``gelu``).
        in_dtype / out_dtype: canonical dtype names (aliases and dtype objects accepted).
        scaling: ``none`` (high-precision output), ``tensor`` (per-tensor FP8 scale, amax and
            scale_inv), ``mxfp8`` or ``nvfp4``; given in any case and stored lower-case.
        layout: ``rowwise``, ``columnwise`` or ``both``, in any case (stored lower-case).
        hidden_size: the size of the last dimension compiled into the kernel, or ``None`` for
            the general kernel that takes it at run time.
        arch: compile target, ``sm_90``, ``sm_90a``, ``sm_100a``...: a known arch, or the
            arch of a GPU newer than every known one (its kernel is PTX). A key holds what
            it is given; the functions that take an arch from a caller
            (:func:`~nvrtc_engine.make_key`, ``get_kernel``, ``prewarm``, the command line)
            accept known archs only (see :func:`parse_arch`).
        flags: op flags that change code, as sorted ``(name, value)`` pairs; each value a
            bool, or an int for a flag the spec declares as an :class:`IntFlag`. Only flags
            that differ from their default are kept: a bool flag given ``False`` (an int flag
            given its default) is the op's default, so the key equals (and is named, hashed
            and cached as) the same key without it.

    Raises :class:`~nvrtc_engine.VariantError` naming the field and its allowed values.
    """

    # (no __slots__: a key keeps its name, made once by str(), in its __dict__)

    def _checked(self) -> KernelKey:
        spec = _spec(self.op)
        in_dtype = dtype_name(self.in_dtype, "in_dtype")
        out_dtype = dtype_name(self.out_dtype, "out_dtype")
        scaling = _one_of("scaling", self.scaling, SCALINGS)
        layout = _one_of("layout", self.layout, LAYOUTS)
        hs = self.hidden_size
        if hs is not None:  # an int, numpy's too (a shape entry); never a bool
            allowed = f"None or an int in [1, {MAX_HIDDEN_SIZE}]"
            if isinstance(hs, bool) or not isinstance(hs, numbers.Integral):
                raise VariantTypeError("hidden_size", hs, allowed, "not an int")
            if not 1 <= hs <= MAX_HIDDEN_SIZE:
                raise VariantError("hidden_size", hs, allowed)
            hs = int(hs)
        arch = parse_arch(self.arch, newer=True)
        kept = []
        try:
            given = dict(self.flags)
        except (TypeError, ValueError):
            pairs = "(name, value) pairs, e.g. (('zero_centered_gamma', True),)"
            raise VariantTypeError("flags", self.flags, pairs, "not pairs") from None
        for name, value in given.items():
            if name not in spec.flags:
                raise VariantError("flags", name, sorted(spec.flags) or ["(none for this op)"])
            kind = spec.flags[name]
            value = _flag_value(name, value, kind)
            if value != (False if isinstance(kind, str) else kind.default):
                kept.append((name, value))
        # spec.name: "GELU" -> "gelu", the name the key, symbol and cache use
        fields = (spec.name, in_dtype, out_dtype, scaling, layout, hs, arch, tuple(sorted(kept)))
        key = tuple.__new__(type(self), fields)
        spec.validate(key)
        return key

    @property
    def spec(self) -> OpSpec:
        """The op's spec (validation, template, launch binding), from the registry."""
        return _spec(self.op)  # type: ignore[return-value]

    @property
    def input(self) -> DType:
        return DTYPES[self.in_dtype]

    @property
    def output(self) -> DType:
        return DTYPES[self.out_dtype]

    def flag(self, name: str) -> bool | int:
        """The value of op flag ``name`` (its default when not set: False for a bool flag)."""
        kind = _spec(self.op).flags.get(name, "")
        return dict(self.flags).get(name, False if isinstance(kind, str) else kind.default)

    def __str__(self) -> str:
        name: str | None = self.__dict__.get("_name")  # made once: the caches ask often
        if name is None:
            spec = _spec(self.op)
            hidden = "hany" if self.hidden_size is None else f"h{self.hidden_size}"
            parts = [
                self.op, self.input.short, self.output.short, self.scaling, self.layout, hidden,
                self.arch.replace("_", ""),
            ]  # fmt: skip
            parts += [_flag_part(value, spec.flags[flag]) for flag, value in self.flags]
            name = "_".join(parts)
            self.__dict__["_name"] = name
        return name

    @classmethod
    def parse(cls, name: str) -> KernelKey:
        """Read a canonical name (``str(key)``) back into a key.

        Accepts exactly the names ``str(key)`` writes: lower case, ASCII digits, no leading
        zeros, the flags' short forms once each in the order ``str(key)`` puts them
        (``KernelKey.parse(str(key)) == key`` and ``str(KernelKey.parse(name)) == name``).

        Raises:
            VariantError: ``field="name"`` if ``name`` is not a canonical kernel name (the
                message shows the canonical spelling when the name only spells a key
                another way, e.g. ``h04096``); or the field at fault (``flags``, ``arch``,
                ``scaling``...) for a well-formed name whose fields do not make a key.
            VariantTypeError: ``field="name"`` (also a ``TypeError``) if ``name`` is not a
                ``str`` (``None``, ``3``, ``bytes``).
        """
        if not isinstance(name, str):
            hint = "decode it first" if isinstance(name, (bytes, bytearray)) else "not a str"
            raise VariantTypeError(
                "name", name, f"a canonical kernel name (a str) such as {_EXAMPLE_NAME}", hint,
                detail=f"is not a kernel name ({hint}): pass a canonical kernel name, a str "
                f"such as {_EXAMPLE_NAME!r}",
            )  # fmt: skip
        m = _name_pattern().fullmatch(name)
        if m is None or m.group("op") not in _ops():
            raise VariantError("name", name, f"a canonical kernel name such as {_EXAMPLE_NAME}")
        spec = _spec(m.group("op"))
        flags = [_parse_flag(part, spec) for part in filter(None, m.group("f").split("_"))]
        h = m.group("h")
        key = cls(
            op=m.group("op"), in_dtype=_SHORT_TO_DTYPE[m.group("i")],
            out_dtype=_SHORT_TO_DTYPE[m.group("o")], scaling=m.group("s"), layout=m.group("l"),
            hidden_size=None if h == "any" else int(h), arch=f"sm_{m.group('a')}",
            flags=tuple(flags),
        )  # fmt: skip
        canonical = str(key)
        if canonical != name:  # h04096, a flag twice or out of order: one key, one name
            raise VariantError(
                "name", name, canonical,
                detail=f"is not a canonical kernel name: the key it spells is named {canonical!r}",
            )  # fmt: skip
        return key

    def to_dict(self) -> dict[str, Any]:
        """The key as plain JSON-able fields (flags as a dict)."""
        return {
            "op": self.op, "in_dtype": self.in_dtype, "out_dtype": self.out_dtype,
            "scaling": self.scaling, "layout": self.layout, "hidden_size": self.hidden_size,
            "arch": self.arch, "flags": dict(self.flags),
        }  # fmt: skip


def _parse_flag(part: str, spec: KeySpec) -> tuple[str, bool | int]:
    """A flag's ``(name, value)`` from its part of a kernel name (``zcg``, ``v8``); the
    caller checks that the name it makes is canonical (no ``v08``)."""
    for name, kind in spec.flags.items():
        if isinstance(kind, str) and part == kind:
            return name, True
        if isinstance(kind, IntFlag) and part.startswith(kind.short):
            digits = part[len(kind.short) :]
            if digits.isdigit() and digits.isascii():
                return name, int(digits)
    shorts = sorted(k if isinstance(k, str) else f"{k.short}<int>" for k in spec.flags.values())
    raise VariantError("flags", part, shorts or ["(none for this op)"])
