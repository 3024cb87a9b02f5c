"""MXFP8 block scaling reference (OCP microscaling, TransformerEngine semantics).

Blocks of 32 consecutive elements along a row (rowwise) or a column (columnwise). Each block
gets one E8M0 scale (a biased power-of-two exponent byte):
``biased = float_to_e8m0(fp32(amax) * fp32(1 / max_norm))``, where float_to_e8m0 takes the
fp32 exponent field and rounds it up when the mantissa is not zero (so the block's amax fits
the FP8 range); NaN gives 0xFF, infinity 0xFE, zero 0. The data is
``fp8_satfinite(x * 2^(127 - biased))`` (multiplier 1 when biased is 0), in the input's shape
for both directions.
"""

from __future__ import annotations

import numpy as np

from ...core.dtypes import DTYPES
from .reference import check_close, round_to

__all__ = ["MXFP8_BLOCK", "check_mxfp8", "e8m0_multiplier", "e8m0_scale", "mxfp8_quantize"]

MXFP8_BLOCK = 32


def e8m0_scale(amax: np.ndarray, out_dtype: str) -> np.ndarray:
    """E8M0 scale bytes (uint8) for block amax values, as TransformerEngine computes them.

    ``amax`` is rounded to fp32 first; the product with fp32(1/max_norm) is an fp32 product.
    """
    max_norm_rcp = np.float32(1.0 / DTYPES[out_dtype].max_finite)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(amax, dtype=np.float64).astype(np.float32) * max_norm_rcp
    bits = v.view(np.uint32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    out = (exponent + up).astype(np.uint8)
    out = np.where(v == 0, np.uint8(0), out)
    out = np.where(np.isinf(v), np.uint8(0xFE), out)
    out = np.where(np.isnan(v), np.uint8(0xFF), out)
    return out.astype(np.uint8)


def e8m0_multiplier(scale: np.ndarray) -> np.ndarray:
    """The factor the data is multiplied by before the FP8 cast: 2^(127 - biased), 1 for 0."""
    s = np.asarray(scale, dtype=np.int64)
    return np.where(s == 0, 1.0, np.exp2(127.0 - s))


def mxfp8_quantize(
    y: np.ndarray, out_dtype: str, direction: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MXFP8-quantize float64 values ``y`` of shape ``(rows, cols)``.

    ``direction`` is ``"rowwise"`` (blocks of 32 along a row; scales ``(rows,
    ceil(cols/32))``) or ``"columnwise"`` (blocks of 32 down a column; scales
    ``(ceil(rows/32), cols)``). A partial last block uses the elements it has.
    Returns ``(data, scales, multipliers)``: data in ``out_dtype`` with ``y``'s shape,
    E8M0 scale bytes, and each element's multiplier (to scale error tolerances).
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {y.shape}")
    t = y if direction == "rowwise" else y.T
    rows, cols = t.shape
    nblocks = -(-cols // MXFP8_BLOCK)
    padded = np.zeros((rows, nblocks * MXFP8_BLOCK))
    padded[:, :cols] = np.abs(t)
    amax = np.nanmax(padded.reshape(rows, nblocks, MXFP8_BLOCK), axis=2)
    scales = e8m0_scale(amax, out_dtype)
    mult = np.repeat(e8m0_multiplier(scales), MXFP8_BLOCK, axis=1)[:, :cols]
    data = round_to(t * mult, out_dtype)
    if direction == "rowwise":
        return data, scales, mult
    return data.T, scales.T, mult.T


def check_mxfp8(
    data: np.ndarray,
    scales: np.ndarray,
    y: np.ndarray,
    tolerance: np.ndarray | float,
    out_dtype: str,
    direction: str,
    *,
    name: str = "out",
) -> tuple[int, int, int]:
    """Check a kernel's MXFP8 output against float64 values ``y`` of shape ``(rows, cols)``.

    ``data``: the kernel's FP8 data (``y``'s shape); ``scales``: its E8M0 bytes, the
    unpadded region ``(rows, cols/32)`` rowwise or ``(rows/32, cols)`` columnwise;
    ``tolerance``: the absolute error an fp32 kernel may carry in each value of ``y``.

    Scales must be bit-exact, except in blocks whose amax lies within its tolerance of a
    power-of-two boundary of ``amax / max_norm``: there an fp32 amax may round either way,
    so either neighbouring exponent is accepted. The data must then be the rounding of
    ``y * 2^(127 - scale)`` with the kernel's own scale (see :func:`check_close`: only
    rounding ties may differ). Returns ``(elements, elements at ties, blocks on a
    boundary)``; raises ``AssertionError`` naming the first wrong block or element.
    """
    y = np.asarray(y, dtype=np.float64)
    tol = np.broadcast_to(np.abs(np.asarray(tolerance, dtype=np.float64)), y.shape)
    got = np.asarray(scales).view(np.uint8)
    flip = direction == "columnwise"
    if flip:  # blocks run down columns: work on the transpose, report original indices
        y, tol, got = y.T, tol.T, got.T
    rows, cols = y.shape
    if cols % MXFP8_BLOCK:
        raise ValueError(f"blocks of {MXFP8_BLOCK} need a multiple of {MXFP8_BLOCK}, got {cols}")
    if got.shape != (rows, cols // MXFP8_BLOCK):
        want = (rows, cols // MXFP8_BLOCK)
        raise AssertionError(f"{name} scales: shape {got.shape} != {want[::-1] if flip else want}")
    blocks = np.abs(y).reshape(rows, -1, MXFP8_BLOCK)
    slack = tol.reshape(rows, -1, MXFP8_BLOCK)
    lo = e8m0_scale(np.maximum(blocks - slack, 0.0).max(axis=2), out_dtype)
    hi = e8m0_scale((blocks + slack).max(axis=2), out_dtype)
    bad = (got < lo) | (got > hi)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{name} {direction} scales: {int(bad.sum())} of {got.size} wrong; first at "
            f"{i[::-1] if flip else i}: got {int(got[i])}, expected {int(lo[i])}"
            + (f" or up to {int(hi[i])}" if hi[i] != lo[i] else "")
            + f" (block amax {blocks[i].max()!r})"
        )
    mult = np.repeat(e8m0_multiplier(got), MXFP8_BLOCK, axis=1)
    expected, slack_all = y * mult, tol * mult
    if flip:
        expected, slack_all = expected.T, slack_all.T
    n, ties = check_close(data, expected, out_dtype, slack_all, name=f"{name} {direction} data")
    return n, ties, int((lo != hi).sum())
