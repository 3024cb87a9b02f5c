"""Float64 references for the cast / transpose family and NVFP4 quantization.

Independent of the kernels: values in float64 (or, for NVFP4's scale arithmetic, the exact
fp32 operations TransformerEngine specifies, done with numpy float32 scalars and arrays,
which round each operation to nearest even like the GPU does), rounded to output dtypes with
ml_dtypes or an explicit nearest-value search.

- :func:`cast_transpose` covers ``cast_transpose``, ``cast_transpose_dbias``, the
  ``cast_transpose_dbias_d<act>`` ops and the gated ``d<act>glu_cast_transpose`` ops: the
  values written, their fp32 error bound, amax, scale_inv and dbias with its bound.
- :func:`e2m1_encode` / :func:`e2m1_decode` / :func:`pack_e2m1` / :func:`unpack_e2m1`: FP4.
- :func:`nvfp4_quantize`: NVFP4 block scaling (TransformerEngine's ``core_nvfp4.cuh``):

  ``S_enc = fp32(448 * 6) / amax`` (fp32 division; at most FLT_MAX; 1 when amax is 0 or
  S_enc is 0), ``S_dec = 1 / S_enc``; per 16-element block ``scale = e4m3_satfinite(
  fp32(block_amax * fp32(S_enc * fp32(1/6))))``, ``mult = min(1 / fp32(float(scale) *
  S_dec), FLT_MAX)`` and data ``e2m1(fp32(x * mult))``.

MXFP8 is :func:`nvrtc_engine.families.shared.mx_reference.mxfp8_quantize`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..shared.act_reference import ACTIVATIONS
from ..shared.reference import FP32_EPS, round_to

__all__ = [
    "E2M1_VALUES",
    "GATED_ACTIVATIONS",
    "CastTransposeResult",
    "NVFP4Result",
    "cast_transpose",
    "dbias_tolerance",
    "e2m1_decode",
    "e2m1_encode",
    "nvfp4_encode_scale",
    "nvfp4_quantize",
    "pack_e2m1",
    "unpack_e2m1",
]

# Magnitudes of E2M1 codes 0..7 (bit 3 is the sign).
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
NVFP4_BLOCK = 16
FLT_MAX = np.float32(np.finfo(np.float32).max)
# gated backward op -> forward activation of its first half
GATED_ACTIVATIONS = {
    "dgeglu_cast_transpose": "gelu",
    "dswiglu_cast_transpose": "silu",
    "dreglu_cast_transpose": "relu",
    "dqgeglu_cast_transpose": "qgelu",
    "dsreglu_cast_transpose": "srelu",
}
_DACT_PREFIX = "cast_transpose_dbias_d"


def e2m1_encode(v: np.ndarray) -> np.ndarray:
    """E2M1 codes (uint8, 0..15) of values ``v``: round to the nearest E2M1 value, ties to the
    even code, saturating to +-6; the sign bit follows the sign of ``v`` (``-0.2`` gives 0x8);
    NaN gives 0x7, as CUDA's ``cuda_fp4.h``.

    Found by searching all eight magnitudes (independent of the kernels' comparisons).
    """
    v = np.asarray(v, dtype=np.float64)
    nan = np.isnan(v)
    a = np.minimum(np.abs(np.where(nan, 0.0, v)), E2M1_VALUES[-1])
    dist = np.abs(a[..., None] - E2M1_VALUES)
    nearest = dist == dist.min(axis=-1, keepdims=True)
    even_first = nearest * (2 - (np.arange(8) & 1))  # prefer an even code among ties
    code = np.argmax(even_first, axis=-1).astype(np.uint8)
    sign = np.where(np.signbit(v) & ~nan, 8, 0).astype(np.uint8)
    return np.where(nan, np.uint8(7), code | sign).astype(np.uint8)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """Values (float64) of E2M1 codes."""
    c = np.asarray(codes, dtype=np.uint8)
    mag = E2M1_VALUES[c & 7]
    return np.where(c & 8, -mag, mag)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Pack codes ``(rows, cols)`` two per byte along the row, the first in the low nibble:
    ``(rows, ceil(cols / 2))`` uint8; an odd last element gets a zero high nibble."""
    c = np.asarray(codes, dtype=np.uint8)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros((*c.shape[:-1], 1), np.uint8)], axis=-1)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray, cols: int) -> np.ndarray:
    """Codes ``(rows, cols)`` from bytes packed by :func:`pack_e2m1`."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty((*p.shape[:-1], 2 * p.shape[-1]), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out[..., :cols]


def nvfp4_encode_scale(amax: float) -> tuple[np.float32, np.float32]:
    """``(S_enc, S_dec)`` in fp32 for the tensor's ``amax`` (see the module docstring)."""
    amax32 = np.float32(amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.minimum(np.float32(2688.0) / amax32, FLT_MAX)
    if amax32 == 0 or s_enc == 0:
        s_enc = np.float32(1.0)
    return np.float32(s_enc), np.float32(np.float32(1.0) / np.float32(s_enc))


class NVFP4Result(NamedTuple):
    """NVFP4 reference output for one direction.

    ``data``: packed E2M1 bytes, ``(rows, ceil(cols/2))`` for rowwise and ``(cols,
    ceil(rows/2))`` for columnwise; ``scales``: E4M3 bytes, unpadded (``(rows, ceil(cols/16))``
    / ``(cols, ceil(rows/16))``); ``codes``: unpacked E2M1 codes; ``s_enc`` / ``s_dec``.
    """

    data: np.ndarray
    scales: np.ndarray
    codes: np.ndarray
    s_enc: np.float32
    s_dec: np.float32


def nvfp4_quantize(x: np.ndarray, amax: float, direction: str) -> NVFP4Result:
    """NVFP4-quantize ``x (rows, cols)`` (values exact in fp32) with tensor amax ``amax``.

    ``direction``: ``"rowwise"`` (16-element blocks along rows) or ``"columnwise"`` (down
    columns; the data and scales are those of ``x.T`` quantized rowwise). A partial last
    block uses the elements it has.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {x.shape}")
    if direction not in ("rowwise", "columnwise"):
        raise ValueError(f"direction must be 'rowwise' or 'columnwise', got {direction!r}")
    t = (x if direction == "rowwise" else x.T).astype(np.float32)
    rows, cols = t.shape
    nblocks = -(-cols // NVFP4_BLOCK)
    padded = np.zeros((rows, nblocks * NVFP4_BLOCK), np.float32)
    padded[:, :cols] = t
    block_amax = np.abs(padded).reshape(rows, nblocks, NVFP4_BLOCK).max(axis=2)
    s_enc, s_dec = nvfp4_encode_scale(amax)
    enc6 = np.float32(s_enc * np.float32(1.0 / 6.0))
    scale_values = (block_amax * enc6).astype(np.float32)
    scales = round_to(scale_values.astype(np.float64), "fp8_e4m3")
    decoded = scales.astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        mult = np.minimum(np.float32(1.0) / (decoded * s_dec), FLT_MAX).astype(np.float32)
    per_elem = np.repeat(mult, NVFP4_BLOCK, axis=1)[:, :cols]
    codes = e2m1_encode((t * per_elem).astype(np.float32))
    return NVFP4Result(pack_e2m1(codes), scales.view(np.uint8), codes, s_enc, s_dec)


class CastTransposeResult(NamedTuple):
    """Reference of a cast-transpose kernel.

    ``values``: float64 values written, before scaling, ``(M, W)`` (``W = 2H`` for gated
    ops); ``tolerance``: the absolute error an fp32 kernel may carry in them (including the
    rounding of the product with the scale, in value units: multiply by the scale);
    ``out``: ``values * scale`` rounded to the output dtype (``out.T`` is the transposed
    output); ``amax``: ``max |values|``; ``scale_inv``: fp32 ``1/scale`` (or None);
    ``dbias``: float64 column sums of the values (dbias ops) or None.
    """

    values: np.ndarray
    tolerance: np.ndarray
    out: np.ndarray
    amax: float
    scale_inv: np.float32 | None
    dbias: np.ndarray | None


def cast_transpose(
    op: str,
    x: np.ndarray,
    out_dtype: str,
    scale: float | None = None,
    act_input: np.ndarray | None = None,
) -> CastTransposeResult:
    """Reference for ``op`` (``cast_transpose``, ``cast_transpose_dbias``,
    ``cast_transpose_dbias_d<act>``, ``d<act>glu_cast_transpose``) on input values ``x``
    (the gradient for backward ops) and ``act_input``.

    Gated ops: ``a, b = act_input[:, :H], act_input[:, H:]``; values
    ``[x * act'(a) * b, x * act(a)]`` (TransformerEngine's dgated_act_cast_transpose).
    """
    g = np.asarray(x).astype(np.float64)
    if op in GATED_ACTIVATIONS:
        act = ACTIVATIONS[GATED_ACTIVATIONS[op]]
        ai = np.asarray(act_input).astype(np.float64)
        h = g.shape[1]
        a, b = ai[:, :h], ai[:, h:]
        first = g * act.dfn(a) * b
        second = g * act.fn(a)
        values = np.concatenate([first, second], axis=1)
        tolerance = np.concatenate(
            [np.abs(g * b) * act.dfn_tol(a) + 3 * FP32_EPS * np.abs(first),
             np.abs(g) * act.fn_tol(a) + 2 * FP32_EPS * np.abs(second)], axis=1,
        )  # fmt: skip
    elif op.startswith(_DACT_PREFIX):
        act = ACTIVATIONS[op[len(_DACT_PREFIX) :]]
        a = np.asarray(act_input).astype(np.float64)
        values = g * act.dfn(a)
        tolerance = np.abs(g) * act.dfn_tol(a) + 2 * FP32_EPS * np.abs(values)
    elif op in ("cast_transpose", "cast_transpose_dbias", "multi_cast_transpose"):
        values = g
        tolerance = FP32_EPS * np.abs(values)
    else:
        raise ValueError(f"no cast_transpose reference for op {op!r}")
    scaled = values if scale is None else values * np.float64(np.float32(scale))
    amax = float(np.max(np.abs(values))) if values.size else 0.0
    scale_inv = None if scale is None else np.float32(1.0) / np.float32(scale)
    dbias = values.sum(axis=0) if "dbias" in op else None
    return CastTransposeResult(values, tolerance, round_to(scaled, out_dtype), amax, scale_inv,
                               dbias)  # fmt: skip


def dbias_tolerance(values: np.ndarray, tolerance: np.ndarray, depth: int) -> np.ndarray:
    """Absolute error bound of fp32 column sums of ``values`` (float64 ``(M, K)``) computed
    by any summation order in which no term passes through more than ``depth`` additions:
    ``gamma_depth * sum |v|`` (each addition rounds with relative error at most 2^-24; Higham,
    *Accuracy and Stability of Numerical Algorithms*, 4.2) plus the terms' own errors."""
    u = FP32_EPS
    gamma = depth * u / (1 - depth * u)
    return gamma * np.abs(values).sum(axis=0) + np.asarray(tolerance).sum(axis=0)
