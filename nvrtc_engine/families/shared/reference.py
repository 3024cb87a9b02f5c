"""Shared reference helpers: float64 views, rounding to output dtypes, test inputs, and the
output check that allows differences only at rounding ties.

Rounding: fp16/bf16 round to nearest even (ml_dtypes); FP8 saturates to the largest finite
value (E4M3 448, E5M2 57344) and then rounds to nearest even, as TransformerEngine's
``cvt.rn.satfinite`` casts do. NaN stays NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.dtypes import DTYPES, dtype

__all__ = ["FP32_EPS", "check_close", "round_to", "sample_input", "to_float64"]

FP32_EPS = 2.0**-24  # unit roundoff of fp32
# Results below this may come out as zero: the special-function unit (ex2/rcp .ftz) flushes
# denormals, and products of such intermediates can lose what is left.
_FLOOR = 1e-30


def to_float64(x: Any, dtype_name: str | None = None) -> np.ndarray:
    """Values of ``x`` as float64; ``dtype_name`` reinterprets raw uint8/uint16 storage."""
    arr = np.asarray(x)
    if dtype_name is not None:
        want = DTYPES[dtype_name].numpy()
        if arr.dtype != want:
            arr = arr.view(want)
    return arr.astype(np.float64)


def round_to(y: np.ndarray, dtype_name: str) -> np.ndarray:
    """Round float64 values to ``dtype_name`` (returns that numpy/ml_dtypes dtype).

    FP8: saturate to +-max finite first (NaN kept), then round to nearest even.
    """
    d = DTYPES[dtype_name]
    y = np.asarray(y, dtype=np.float64)
    if d.is_fp8:
        y = np.where(np.isnan(y), y, np.clip(y, -d.max_finite, d.max_finite))
    return y.astype(d.numpy())


def sample_input(
    shape: tuple[int, ...], dtype_name: str, rng: np.random.Generator, *, outliers: float = 30.0
) -> np.ndarray:
    """Test data in ``dtype_name``: standard normal values, a few large outliers of both
    signs (up to +-``outliers``) and exact zeros.

    The largest positive value is ``outliers`` itself (for >= 4 elements), so amax over
    functions that are exactly x for large x (GELU, SiLU, ReLU in fp32) is known exactly.
    Never all zeros.
    """
    n = int(np.prod(shape)) if shape else 1
    x = rng.standard_normal(n)
    if n >= 4:
        picks = rng.choice(n, size=max(2, n // 1000), replace=False)
        x[picks[: len(picks) // 2]] = 0.0
        outlier_at = picks[len(picks) // 2 :]
        x[outlier_at] = rng.uniform(-outliers, outliers, size=outlier_at.size)
        x[outlier_at[0]] = outliers
    return x.reshape(shape).astype(DTYPES[dtype_name].numpy())


def check_close(
    got: Any,
    expected: np.ndarray,
    out_dtype: str,
    tolerance: np.ndarray | float,
    *,
    name: str = "out",
) -> tuple[int, int]:
    """Check a kernel output against float64 ``expected`` (already scaled).

    ``tolerance`` is the absolute error (per element, or one number) an fp32 kernel may
    carry before rounding to ``out_dtype``. Every element must equal the rounding of some
    value within ``tolerance`` of ``expected``: so it differs from the plain rounding only
    at rounding ties. fp32 outputs must be within ``tolerance``. Returns ``(elements,
    elements that differ from the plain rounding)``; raises ``AssertionError`` naming the
    first wrong element otherwise.
    """
    d = dtype(out_dtype)
    got64 = to_float64(got, out_dtype)
    y = np.asarray(expected, dtype=np.float64)
    if got64.shape != y.shape:
        raise AssertionError(f"{name}: shape {got64.shape} != expected {y.shape}")
    slack = np.broadcast_to(np.abs(np.asarray(tolerance, dtype=np.float64)), y.shape) + _FLOOR
    lo = round_to(y - slack, out_dtype).astype(np.float64)
    hi = round_to(y + slack, out_dtype).astype(np.float64)
    plain = round_to(y, out_dtype).astype(np.float64)
    nan_ok = np.isnan(y) & np.isnan(got64)
    ok = ((got64 >= lo) & (got64 <= hi)) | nan_ok
    if d.name == "fp32":
        ok |= np.abs(got64 - y) <= slack
    if not ok.all():
        bad = np.flatnonzero(~ok)
        i = np.unravel_index(bad[0], y.shape)
        raise AssertionError(
            f"{name}: {bad.size} of {y.size} elements wrong; first at {tuple(map(int, i))}: "
            f"got {got64[i]!r}, expected {plain[i]!r} (float64 {y[i]!r}, tolerance {slack[i]!r})"
        )
    same = (got64 == plain) | nan_ok
    return int(y.size), int((~same).sum())
