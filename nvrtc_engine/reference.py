"""Independent numpy references: float64 math, rounded to the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks. Nothing here shares code with the kernels.

Rounding: fp16/bf16 round to nearest even (ml_dtypes); FP8 saturates to the largest finite
value (E4M3 448, E5M2 57344) and then rounds to nearest even, as TransformerEngine's
``cvt.rn.satfinite`` casts do. NaN stays NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import DTYPES, dtype

__all__ = [
    "ActivationResult",
    "activation",
    "check_close",
    "gelu",
    "round_to",
    "sample_input",
    "to_float64",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def to_float64(x: Any, dtype_name: str | None = None) -> np.ndarray:
    """Values of ``x`` as float64; ``dtype_name`` reinterprets raw uint8/uint16 storage."""
    arr = np.asarray(x)
    if dtype_name is not None:
        want = DTYPES[dtype_name].numpy()
        if arr.dtype != want:
            arr = arr.view(want)
    return arr.astype(np.float64)


def sample_input(
    shape: tuple[int, ...], dtype_name: str, rng: np.random.Generator, *, outliers: float = 30.0
) -> np.ndarray:
    """Test data in ``dtype_name``: standard normal values, a few large outliers of both
    signs (+-``outliers``, where tanh-GELU is exactly x or -0 in fp32), and exact zeros.

    The largest positive outlier is ``outliers`` itself, so the amax of GELU over this data
    is exactly known. Never all zeros.
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


def gelu(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU, as in TransformerEngine.

    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``,

    Evaluated in float64 as ``x * sigmoid(2u)`` (the same function; no cancellation for
    negative x).
    """
    x = np.asarray(x, dtype=np.float64)
    u = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-2.0 * u))


def gelu_condition(x: np.ndarray) -> np.ndarray:
    """Relative sensitivity of GELU to fp32 rounding of its internal argument, per element.

    An fp32 evaluation of ``exp(-2u)`` carries a relative error of about ``|2u| * 2^-24``
    on top of a few ulp; tests widen their tolerance by this.
    """
    x = np.asarray(x, dtype=np.float64)
    return 1.0 + np.abs(2.0 * _SQRT_2_OVER_PI * (x + 0.044715 * x**3))


ACTIVATIONS = {"gelu": (gelu, gelu_condition)}


def round_to(y: np.ndarray, dtype_name: str) -> np.ndarray:
    """Round float64 values to ``dtype_name`` (returns that numpy/ml_dtypes dtype).

    FP8: saturate to +-max finite first (NaN kept), then round to nearest even.
    """
    d = DTYPES[dtype_name]
    y = np.asarray(y, dtype=np.float64)
    if d.is_fp8:
        y = np.where(np.isnan(y), y, np.clip(y, -d.max_finite, d.max_finite))
    return y.astype(d.numpy())


@dataclass
class ActivationResult:
    """Reference output of an activation kernel.

    ``y``: float64 values before scaling; ``out``: ``y * scale`` rounded to the output dtype;
    ``amax``: ``max|y|`` (float64); ``scale_inv``: ``1/scale`` in fp32; ``rel_error``: the
    per-element relative error an fp32 kernel may carry (for :func:`check_close`).
    """

    y: np.ndarray
    out: np.ndarray
    amax: float
    scale_inv: np.float32 | None
    rel_error: np.ndarray


def activation(
    op: str, x: np.ndarray, out_dtype: str, scale: float | None = None
) -> ActivationResult:
    """Reference for an activation kernel on input values ``x`` (any float dtype).

    ``scale`` (fp32 value) applies tensor scaling: ``out = round(y * scale)``.
    """
    fn, condition = ACTIVATIONS[op]
    x64 = np.asarray(x).astype(np.float64)
    y = fn(x64)
    scaled = y if scale is None else y * np.float64(np.float32(scale))
    amax = float(np.max(np.abs(y))) if y.size else 0.0
    scale_inv = None if scale is None else np.float32(1.0) / np.float32(scale)
    # fp32 kernel math: a few ulp, times the function's sensitivity to argument rounding
    rel_error = 8.0 * 2.0**-24 * condition(x64)
    return ActivationResult(y, round_to(scaled, out_dtype), amax, scale_inv, rel_error)


def check_close(
    got: Any,
    expected_values: np.ndarray,
    out_dtype: str,
    rel_error: np.ndarray | float,
    *,
    name: str = "out",
) -> tuple[int, int]:
    """Check a kernel output against float64 ``expected_values`` (already scaled).

    Every element must equal the rounding to ``out_dtype`` of some value within
    ``rel_error`` (relative) of the float64 value: elements differ from the plain rounding
    only at rounding ties. For fp32 outputs that is ``|got - y| <= rel_error*|y| + tiny``.
    Returns ``(elements, elements that differ from the plain rounding)``. Raises
    ``AssertionError`` naming the worst element otherwise.
    """
    d = dtype(out_dtype)
    got64 = to_float64(got, out_dtype)
    y = np.asarray(expected_values, dtype=np.float64)
    if got64.shape != y.shape:
        raise AssertionError(f"{name}: shape {got64.shape} != expected {y.shape}")
    err = np.broadcast_to(np.asarray(rel_error, dtype=np.float64), y.shape)
    slack = np.abs(y) * err + 1e-36  # plus a floor below which fp32 results may flush to 0
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
            f"got {got64[i]!r}, expected {plain[i]!r} (float64 {y[i]!r})"
        )
    same = (got64 == plain) | nan_ok
    return int(y.size), int((~same).sum())
