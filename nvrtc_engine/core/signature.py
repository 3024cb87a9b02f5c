"""Kernel signatures: one declaration of a kernel's parameters, from which both the template's
C parameter list and each launch's packed parameters are made.

A :class:`Signature` is a tuple of :class:`Param` (name, kind, C type). The family's spec puts
:meth:`Signature.c_params` into the render context, and the template writes it between the
kernel's parentheses, so the order the kernel reads its parameters in is the order they are
packed in. A launch binds every parameter by name (:meth:`Signature.bind`); nothing numbers
parameter slots by hand.

A bound value is a plain number (constant for the call) or a reference to something a call
passes each time: :class:`Ref`, the address of one of the call's array arguments (plus an
offset in bytes), or :class:`FloatRef`, one of its float arguments. A family names its array
and float arguments once, in the order its ``__call__`` passes them (:class:`CallArgs`), and
refers to them by name (``A.out``, ``A.workspace + 16``, ``A.eps``). Packing resolves the
references with the call's values (:meth:`Signature.pack`); a prepared launch
(:mod:`nvrtc_engine.core.launch`) packs the constants once and points the referenced parameters
at the values each call writes (:meth:`Signature.prepare`), so both give the same bytes.

Layout: every parameter takes an 8-byte slot (an int32 or float32 in its first four bytes,
the rest zero); the ``void*[]`` that ``cuLaunchKernel`` takes points at each slot.
"""

from __future__ import annotations

import struct
import threading
from typing import Any, NamedTuple

__all__ = [
    "CallArgs",
    "FloatRef",
    "Param",
    "Ref",
    "Signature",
    "f32",
    "i32",
    "i64",
    "ptr",
]

# kind -> (struct format of its 8-byte slot, C type of a value parameter)
_KINDS = {"ptr": ("Q", ""), "i64": ("q", "long long"), "i32": ("i4x", "int"),
          "f32": ("f4x", "float")}  # fmt: skip


class Param(NamedTuple):
    """One kernel parameter: ``name`` (as the template's code uses it), ``kind`` (``ptr``: a
    device address; ``i64``, ``i32``, ``f32``: a value of C type ``long long``, ``int``,
    ``float``), and for a pointer its pointee type as the template spells it (``dtype``,
    e.g. ``In::storage``), whether it points to ``const`` data and whether it is declared
    ``__restrict__`` (not where the kernel may be handed one buffer twice, e.g. in place).
    Made by :func:`ptr`, :func:`i64`, :func:`i32` and :func:`f32`."""

    name: str
    kind: str
    dtype: str = ""
    const: bool = False
    restrict: bool = True

    def c_type(self) -> str:
        """The C type, e.g. ``const In::storage*`` or ``long long``."""
        if self.kind != "ptr":
            return _KINDS[self.kind][1]
        return f"{'const ' if self.const else ''}{self.dtype}*"

    def c_decl(self) -> str:
        """The C declaration, e.g. ``const In::storage* __restrict__ x`` or ``long long n``."""
        restrict = "__restrict__ " if self.kind == "ptr" and self.restrict else ""
        return f"{self.c_type()} {restrict}{self.name}"


def ptr(name: str, dtype: str, *, const: bool = False, restrict: bool = True) -> Param:
    """A device-pointer parameter (see :class:`Param`); ``dtype`` names the pointee type.
    Raises ``ValueError`` for an empty ``dtype``."""
    if not dtype:
        raise ValueError(f"{name}: a pointer names its dtype")
    return Param(name, "ptr", dtype, const, restrict)


def i64(name: str) -> Param:
    """A ``long long`` parameter."""
    return Param(name, "i64")


def i32(name: str) -> Param:
    """An ``int`` parameter."""
    return Param(name, "i32")


def f32(name: str) -> Param:
    """A ``float`` parameter."""
    return Param(name, "f32")


class Ref:
    """The address of the call's array argument number ``index`` (its place in the family's
    :class:`CallArgs`) plus ``offset`` bytes; 0 when the argument is None."""

    __slots__ = ("index", "name", "offset")

    def __init__(self, index: int, name: str, offset: int = 0) -> None:
        self.index = index
        self.name = name
        self.offset = offset

    def __add__(self, offset: int) -> Ref:
        return Ref(self.index, self.name, self.offset + offset)

    def __repr__(self) -> str:
        return f"Ref({self.name}{f' + {self.offset}' if self.offset else ''})"


class FloatRef:
    """The call's float argument number ``index`` (its place in the family's :class:`CallArgs`)."""

    __slots__ = ("index", "name")

    def __init__(self, index: int, name: str) -> None:
        self.index = index
        self.name = name

    def __repr__(self) -> str:
        return f"FloatRef({self.name})"


class CallArgs:
    """The names of a family's array arguments and float arguments, in the order its
    ``__call__`` hands them to the launch (``Kernel._fast1``..., ``Kernel._submit``); each
    name is an attribute: a :class:`Ref` (arrays) or :class:`FloatRef` (floats);
    :meth:`mask` gives the call key's tag of a set of given arrays."""

    def __init__(self, arrays: tuple[str, ...], floats: tuple[str, ...] = ()) -> None:
        self.arrays = arrays
        self.floats = floats
        refs: dict[str, Ref | FloatRef] = {n: Ref(i, n) for i, n in enumerate(arrays)}
        refs.update({n: FloatRef(i, n) for i, n in enumerate(floats)})
        if len(refs) != len(arrays) + len(floats):
            raise ValueError(f"argument names repeat: {arrays} {floats}")
        self._refs = refs

    def mask(self, *names: str) -> int:
        """The bit mask of the array arguments ``names`` (bit i: argument i is given): a
        call key's tag (:func:`nvrtc_engine.core.launch.call_key`). Raises ``KeyError`` for a
        name that is no array argument."""
        index = {n: i for i, n in enumerate(self.arrays)}
        return sum(1 << index[n] for n in set(names))

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_refs"][name]
        except KeyError:
            raise AttributeError(name) from None


_Value = int | float | Ref | FloatRef


class Signature:
    """A kernel's parameter list (a tuple of :class:`Param`, in the kernel's order).

    ``c_params()`` is the C list for the template; ``bind(**values)`` checks that every
    parameter is given exactly once; ``pack`` and ``prepare`` pack bound values."""

    def __init__(self, *params: Param) -> None:
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names repeat: {names}")
        self.params = params
        self.names = tuple(names)
        self.slots = {p.name: i for i, p in enumerate(params)}
        self.kinds = tuple(p.kind for p in params)
        self.struct = struct.Struct("<" + "".join(_KINDS[p.kind][0] for p in params))
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"Signature({', '.join(self.names)})"

    def extend(self, *more: Param) -> Signature:
        """This signature with ``more`` parameters after its own."""
        return Signature(*self.params, *more)

    def c_params(self) -> str:
        """The C parameter list, e.g. ``const In::storage* __restrict__ x, long long n``."""
        return ", ".join(p.c_decl() for p in self.params)

    def bind(self, **values: _Value) -> dict[str, _Value]:
        """``values`` by parameter name, checked: every parameter given, no other name, a
        :class:`Ref` only for a pointer and a :class:`FloatRef` only for a float. Raises
        ``TypeError`` naming what is wrong (a bug in the family, not a user error)."""
        if values.keys() != self.slots.keys():
            missing = [n for n in self.names if n not in values]
            extra = [n for n in values if n not in self.slots]
            raise TypeError(f"{self}: missing {missing}, unknown {extra}")
        for name, kind in zip(self.names, self.kinds, strict=True):
            v = values[name]
            if (type(v) is Ref and kind != "ptr") or (type(v) is FloatRef and kind != "f32"):
                raise TypeError(f"{self}: {name} ({kind}) cannot take {v!r}")
        return values

    def values(self, bound: dict[str, _Value], ptrs: Any, floats: Any) -> list[int | float]:
        """The bound values in parameter order, references resolved with a call's array
        addresses ``ptrs`` and floats ``floats``."""
        out: list[int | float] = []
        for name in self.names:
            v = bound[name]
            if type(v) is Ref:
                p = ptrs[v.index]
                v = p + v.offset if p else 0
            elif type(v) is FloatRef:
                v = floats[v.index]
            out.append(v)
        return out

    def pack(self, bound: dict[str, _Value], ptrs: Any, floats: Any) -> int:
        """Pack ``bound`` (references resolved with ``ptrs`` and ``floats``) into this
        thread's buffer for the signature and return the ``void*[]`` address
        ``cuLaunchKernel`` takes. The driver copies the values at launch, so the buffer is
        free again once the launch returns; threads never share one."""
        try:
            data, address = self._local.buffer
        except AttributeError:
            data, _, _, address = param_buffer(self.struct.size, b"")
            self._local.buffer = (data, address)
        self.struct.pack_into(data, 0, *self.values(bound, ptrs, floats))
        return address

    def prepare(
        self, bound: dict[str, _Value], present: Any
    ) -> tuple[bytes, tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]] | None:
        """``bound`` for repeated calls in which the array arguments ``present`` (a sequence
        of bools, in :class:`CallArgs` order) are given and the others are None: ``(image,
        refs, floats)``, the constants packed once (0 where a call supplies the value), the
        parameters a call's addresses go to, ``(slot, array index, offset)``, and those its
        floats go to, ``(slot, float index)``. None when a pointer parameter is bound to a
        non-zero number: an address no later call could share, so the launch cannot be
        prepared (a family passes addresses it allocates itself that way)."""
        values: list[int | float] = []
        refs, floats = [], []
        for slot, (name, kind) in enumerate(zip(self.names, self.kinds, strict=True)):
            v = bound[name]
            if type(v) is Ref:
                if present[v.index]:
                    refs.append((slot, v.index, v.offset))
                v = 0
            elif type(v) is FloatRef:
                floats.append((slot, v.index))
                v = 0.0
            elif kind == "ptr" and v:
                return None
            values.append(v)
        return self.struct.pack(*values), tuple(refs), tuple(floats)

    def unpack(self, data: bytes) -> dict[str, int | float]:
        """Packed parameters (as :meth:`pack` writes them) by name (tests, tools)."""
        return dict(zip(self.names, self.struct.unpack(data[: self.struct.size]), strict=True))


def param_buffer(size: int, image: bytes) -> tuple[Any, memoryview, memoryview, int]:
    """A ctypes buffer of ``size`` bytes of 8-byte slots (starting as ``image``) followed by
    the ``void*[]`` pointing at each slot: the buffer, its uint64 and float32 views (which
    keep it alive) and the address of the ``void*[]``."""
    import ctypes

    count = max(1, size // 8)
    data = (ctypes.c_uint64 * (2 * count))()
    ctypes.memmove(data, image, len(image))
    base = ctypes.addressof(data)
    for i in range(count):
        data[count + i] = base + 8 * i
    raw = memoryview(data).cast("B")
    return data, raw.cast("Q"), raw.cast("f"), base + 8 * count
