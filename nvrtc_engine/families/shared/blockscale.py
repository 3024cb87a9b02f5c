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

__all__ = ["MXFP8_BLOCK", "NVFP4_BLOCK", "mxfp8_scale_shape", "nvfp4_scale_shape", "roundup"]

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
