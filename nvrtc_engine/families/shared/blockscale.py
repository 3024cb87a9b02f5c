"""Block-scale tensor layouts shared by every family that writes MXFP8 (or NVFP4) output.

MXFP8 scale tensors are E8M0 bytes (``uint8``), row-major, in TransformerEngine's compact
(unswizzled) layout, padded as TransformerEngine allocates them so they can be handed to its
GEMMs (which swizzle them): for data of shape ``(rows, cols)`` (leading dims flattened)

- rowwise (32-element blocks along a row): ``(roundup(rows, 128), roundup(cols/32, 4))``,
- columnwise (32-element blocks down a column): ``(roundup(rows/32, 4), roundup(cols, 128))``.

Entry ``[i, j]`` of the unpadded region ``(rows, cols/32)`` / ``(rows/32, cols)`` is the
scale of that block. Kernels write only the unpadded region; scale tensors the engine
allocates are zero-filled, so the padding holds zeros.

NVFP4 scale tensors are E4M3 bytes (``uint8``), 16-element blocks, in the same compact
layout as TransformerEngine allocates them. Columnwise NVFP4 data is stored transposed
(``(cols, rows)``), so its scales are the rowwise layout of the transposed data:

- rowwise: ``(roundup(rows, 128), roundup(cols/16, 4))``,
- columnwise: ``(roundup(cols, 128), roundup(rows/16, 4))``.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["MXFP8_BLOCK", "NVFP4_BLOCK", "BlockScaledOutput", "mxfp8_scale_shape",
           "nvfp4_scale_shape", "roundup"]  # fmt: skip

MXFP8_BLOCK = 32
NVFP4_BLOCK = 16


def roundup(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def mxfp8_scale_shape(
    rows: int, cols: int, direction: str, *, padded: bool = True
) -> tuple[int, int]:
    """Shape of the MXFP8 scale tensor for ``(rows, cols)`` data in ``direction``.

    ``direction`` is ``"rowwise"`` or ``"columnwise"``; ``padded=False`` gives the region
    that holds real scales. Raises ``ValueError`` for another direction.
    """
    if direction == "rowwise":
        shape = (rows, -(-cols // MXFP8_BLOCK))
        return (roundup(shape[0], 128), roundup(shape[1], 4)) if padded else shape
    if direction == "columnwise":
        shape = (-(-rows // MXFP8_BLOCK), cols)
        return (roundup(shape[0], 4), roundup(shape[1], 128)) if padded else shape
    raise ValueError(f"direction must be 'rowwise' or 'columnwise', got {direction!r}")


def nvfp4_scale_shape(
    rows: int, cols: int, direction: str, *, padded: bool = True
) -> tuple[int, int]:
    """Shape of the NVFP4 block-scale tensor for ``(rows, cols)`` data in ``direction``.

    ``"rowwise"``: blocks of 16 along a row, ``(rows, ceil(cols/16))`` scales;
    ``"columnwise"``: blocks of 16 down a column, stored for the transposed data as
    ``(cols, ceil(rows/16))``. ``padded=False`` gives the region that holds real scales.
    Raises ``ValueError`` for another direction.
    """
    if direction == "rowwise":
        shape = (rows, -(-cols // NVFP4_BLOCK))
    elif direction == "columnwise":
        shape = (cols, -(-rows // NVFP4_BLOCK))
    else:
        raise ValueError(f"direction must be 'rowwise' or 'columnwise', got {direction!r}")
    return (roundup(shape[0], 128), roundup(shape[1], 4)) if padded else shape


# Spellings of the fields before one type served every family (MXFP8 activations' outputs).
_OLD_NAMES = {
    "rowwise": "rowwise_data",
    "rowwise_scale": "rowwise_scale_inv",
    "columnwise": "columnwise_data",
    "columnwise_scale": "columnwise_scale_inv",
}
_FIELDS = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv",
           "amax", "scale_inv")  # fmt: skip


def _renamed(old: str) -> str:
    new = _OLD_NAMES[old]
    warnings.warn(f"BlockScaledOutput.{old} is deprecated: use .{new} (TransformerEngine's "
                  "name); the old name goes in the next release", DeprecationWarning,
                  stacklevel=3)  # fmt: skip
    return new


class BlockScaledOutput:
    """Block-scaled data and its scales, as every family returns them (an MXFP8 activation,
    an MXFP8 norm forward's ``z``, ``quantize``), with TransformerEngine's names; a direction
    not computed is None. Also named :data:`MXFP8Output` and ``QuantizeResult``.

    For data of shape ``(..., cols)`` with ``rows`` the product of the leading dims:

    Attributes:
        rowwise_data: data scaled per block along each row: MXFP8 the output's shape (torch
            ``float8_e4m3fn``/``float8_e5m2``, or ``uint8`` storage); NVFP4 ``(rows,
            ceil(cols / 2))`` ``uint8``, two E2M1 values a byte.
        rowwise_scale_inv: ``uint8`` block scales in TransformerEngine's padded layout:
            MXFP8 E8M0 ``(roundup(rows, 128), roundup(cols / 32, 4))``, entry ``[r, k]``
            scaling ``rowwise_data[r, 32k:32k+32]``; NVFP4 E4M3 (:func:`nvfp4_scale_shape`).
        columnwise_data: data scaled per block down each column: MXFP8 the output's shape;
            NVFP4 transposed, ``(cols, ceil(rows / 2))``.
        columnwise_scale_inv: ``uint8`` block scales: MXFP8 E8M0
            ``(roundup(rows / 32, 4), roundup(cols, 128))``, entry ``[k, c]`` scaling
            ``columnwise_data[32k:32k+32, c]``; NVFP4 E4M3 (:func:`nvfp4_scale_shape`).
        amax: NVFP4 ``quantize``: fp32 ``(1,)``, the tensor's ``max |x|``; else None.
        scale_inv: NVFP4 ``quantize``: fp32 ``(1,)`` ``1 / S_enc`` (the tensor-level decode
            scale) if asked for; else None.

    An E8M0 byte ``e`` stands for ``2^(e - 127)``: data times that is the value. Iterating
    gives the first four fields (``data, scales, data_t, scales_t = out``). The names
    ``rowwise``, ``rowwise_scale``, ``columnwise`` and ``columnwise_scale`` (as attributes
    and as constructor arguments) still work, with a ``DeprecationWarning``.
    """

    __slots__ = _FIELDS

    def __init__(
        self, rowwise_data: Any = None, rowwise_scale_inv: Any = None,
        columnwise_data: Any = None, columnwise_scale_inv: Any = None, amax: Any = None,
        scale_inv: Any = None, **old: Any,
    ) -> None:  # fmt: skip
        given = (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax,
                 scale_inv)  # fmt: skip
        values = dict(zip(_FIELDS, given, strict=True))
        for name, value in old.items():
            if name not in _OLD_NAMES:
                raise TypeError(f"BlockScaledOutput() got an unexpected keyword argument {name!r}")
            new = _renamed(name)
            if values[new] is not None:
                raise TypeError(f"BlockScaledOutput() got {new} twice (also as {name})")
            values[new] = value
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # (only for names that are no field)
        if name in _OLD_NAMES:
            return getattr(self, _renamed(name))
        raise AttributeError(f"'BlockScaledOutput' object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, _renamed(name) if name in _OLD_NAMES else name, value)

    def __iter__(self) -> Any:
        return iter((self.rowwise_data, self.rowwise_scale_inv, self.columnwise_data,
                     self.columnwise_scale_inv))  # fmt: skip

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        return tuple(self)[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockScaledOutput):
            return NotImplemented
        return all(getattr(self, f) is getattr(other, f) for f in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # (mutable, as its fields are)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={_describe(getattr(self, f))}" for f in _FIELDS
                          if getattr(self, f) is not None)  # fmt: skip
        return f"BlockScaledOutput({shown})"


def _describe(value: Any) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None:
        return repr(value)
    return f"<{type(value).__name__} {tuple(shape)} {dtype}>"
