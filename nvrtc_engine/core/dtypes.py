"""Dtype names, aliases and their mapping to numpy/ml_dtypes, torch, CuPy and DLPack.

The engine's canonical dtype names are ``fp32``, ``fp16``, ``bf16``, ``fp8_e4m3``,
``fp8_e5m2`` and ``fp4_e2m1``. Aliases (``fp8`` = ``e4m3`` = ``fp8_e4m3``, ``e5m2``, ``e2m1``,
``float32``, ``half``, ``bfloat16``...) and dtype objects (numpy, ml_dtypes, torch) are
accepted wherever a dtype is. FP8 formats follow the OCP 8-bit floating point specification as
used by TransformerEngine: E4M3 (max finite 448, no infinities) and E5M2 (max finite 57344).
``fp4_e2m1`` is the OCP MX FP4 element type (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
negatives; no infinities or NaN), the data type of NVFP4 quantization. Its ``itemsize`` is the
size of one *unpacked* element as numpy/ml_dtypes holds it (1 byte); kernels store FP4 data
packed two per byte (the first element in the low nibble, as torch's ``float4_e2m1fn_x2``)
in ``uint8`` arrays, so a packed row of ``n`` elements takes ``ceil(n / 2)`` bytes.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

from .errors import VariantError, VariantTypeError, did_you_mean

__all__ = ["DTYPES", "DType", "dtype", "dtype_name"]


class DType(NamedTuple):
    """One element type the kernels read or write.

    Attributes: ``name`` (canonical), ``short`` (used in kernel names), ``itemsize`` (bytes),
    ``is_fp8``, ``max_finite`` (largest finite value), ``torch_name`` (attribute of ``torch``),
    ``numpy_name`` (``numpy``/``ml_dtypes`` dtype name), ``dlpack`` ((type code, bits)),
    ``typestrs`` (``__cuda_array_interface__`` typestrs that hold this type exactly) and
    ``storage_typestr`` (the unsigned-integer typestr accepted as raw storage, e.g. ``|u1``
    for FP8 data held in a uint8 CuPy array) and ``is_fp4`` (the packed FP4 type).
    ``itemsize`` is the size of one element as numpy holds it: for ``fp4_e2m1`` that is one
    unpacked element per byte, while kernels store two per byte (see the module docstring).
    """

    name: str
    short: str
    itemsize: int
    is_fp8: bool
    max_finite: float
    torch_name: str
    numpy_name: str
    dlpack: tuple[tuple[int, int], ...]
    typestrs: tuple[str, ...]
    storage_typestr: str | None
    is_fp4: bool = False

    @property
    def needs_scaling(self) -> bool:
        """Whether outputs of this type need a scaling mode (FP8 and FP4)."""
        return self.is_fp8 or self.is_fp4

    def numpy(self) -> Any:
        """The numpy dtype (from ml_dtypes for bf16 and FP8)."""
        import numpy as np

        if self.numpy_name in ("float32", "float16"):
            return np.dtype(self.numpy_name)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.numpy_name))

    def __str__(self) -> str:
        return self.name


# DLPack type codes: kDLFloat=2, kDLBfloat=4, kDLFloat8_e4m3fn=10, kDLFloat8_e5m2=12 (DLPack 1.1).
DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", "fp32", 4, False, 3.4028234663852886e38, "float32", "float32",
              ((2, 32),), ("<f4",), None),
        DType("fp16", "fp16", 2, False, 65504.0, "float16", "float16",
              ((2, 16),), ("<f2",), None),
        DType("bf16", "bf16", 2, False, 3.3895313892515355e38, "bfloat16", "bfloat16",
              ((4, 16),), (), "<u2"),
        DType("fp8_e4m3", "e4m3", 1, True, 448.0, "float8_e4m3fn", "float8_e4m3fn",
              ((10, 8),), (), "|u1"),
        DType("fp8_e5m2", "e5m2", 1, True, 57344.0, "float8_e5m2", "float8_e5m2",
              ((12, 8),), (), "|u1"),
        DType("fp4_e2m1", "e2m1", 1, False, 6.0, "float4_e2m1fn_x2", "float4_e2m1fn",
              (), (), "|u1", is_fp4=True),
    )
}  # fmt: skip

_ALIASES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
    "fp4": "fp4_e2m1", "e2m1": "fp4_e2m1", "fp4_e2m1": "fp4_e2m1", "float4_e2m1fn": "fp4_e2m1",
    "float4_e2m1fn_x2": "fp4_e2m1",
}  # fmt: skip

# Every spelling dtype_name accepts, as an error message lists it: the canonical names, then
# each alias as "alias -> name" (so "fp8 -> fp8_e4m3, e5m2 -> fp8_e5m2" cannot be read as
# e5m2 being another fp8 alias). A suggestion comes from these spellings only.
_ACCEPTED = (
    ", ".join(sorted(DTYPES))
    + "; aliases: "
    + ", ".join(f"{alias} -> {name}" for alias, name in _ALIASES.items() if alias != name)
)


def _suggestion(value: Any, text: str) -> str:
    """``"did you mean X?"`` for a misspelled dtype name, else ``""``.

    Only for strings that name no dtype at all (``bf61``, ``fp8_e4m4``, ``bfloat``): a real
    dtype the kernels do not take (``float64``, ``int8``, ``float8_e4m3fnuz``) is no typo,
    and the nearest accepted spelling would name a different format.
    """
    if not isinstance(value, str):
        return ""
    import ml_dtypes  # (an error path: numpy and ml_dtypes are not imported with the package)
    import numpy as np

    if hasattr(ml_dtypes, text):
        return ""
    try:
        np.dtype(text)
        return ""
    except TypeError:
        pass
    # a truncated name first: "bfloat" is bfloat16, not the closer-spelled "float" (fp32)
    longer = [name for name in _ALIASES if name.startswith(text)] if text else []

    def label(name: str) -> str:  # an alias with the name it stands for: "fp8 (fp8_e4m3)"
        return name if _ALIASES[name] == name else f"{name} ({_ALIASES[name]})"

    return did_you_mean(text, longer, label=label) or did_you_mean(
        text, list(_ALIASES), label=label
    )


def dtype_name(value: Any, field: str = "dtype") -> str:
    """Canonical dtype name of ``value``: a name, alias, or numpy/ml_dtypes/torch dtype.

    Raises :class:`~nvrtc_engine.VariantError` naming ``field``, the allowed names and every
    alias (``alias -> name``), with the closest of those spellings when a misspelled name
    was given; :class:`~nvrtc_engine.VariantTypeError` for a value that is neither a string
    nor a dtype object (a number, ``b"bf16"``, a list, a dict, ``object()``).
    """
    if isinstance(value, DType):
        return value.name
    if isinstance(value, numbers.Number):  # (16 for fp16, or a bool: no dtype is a number)
        raise VariantTypeError(field, value, _ACCEPTED, "a number is not a dtype")
    if isinstance(value, str):
        text = value
    else:
        # numpy.dtype and ml_dtypes scalar types have .name / __name__; torch.dtype prints
        # as "torch.bfloat16". Anything else (bytes, a container, object()) is no dtype.
        named = getattr(value, "name", None) or getattr(value, "__name__", None)
        if isinstance(named, str):
            text = named.removeprefix("torch.")
        elif str(value).startswith("torch."):
            text = str(value).removeprefix("torch.")
        else:
            hint = f"{type(value).__name__} is not a dtype: give a dtype name or dtype object"
            raise VariantTypeError(field, value, _ACCEPTED, hint)
    canonical = _ALIASES.get(text.strip().lower())
    if canonical is None:
        raise VariantError(field, value, _ACCEPTED, _suggestion(value, text.strip().lower()))
    return canonical


def dtype(value: Any, field: str = "dtype") -> DType:
    """The :class:`DType` for a name, alias or dtype object (see :func:`dtype_name`)."""
    return DTYPES[dtype_name(value, field)]
