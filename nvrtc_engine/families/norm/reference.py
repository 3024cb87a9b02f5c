"""Float64 references for LayerNorm and RMSNorm, forward and backward, with error bounds.

Semantics (TransformerEngine), per row of ``x`` (``(N, H)``; leading dimensions flattened):

- LayerNorm: ``mu = mean(x)``, ``var = mean((x - mu)^2)`` (biased), ``rsigma =
  1/sqrt(var + eps)``, ``z = (x - mu) * rsigma * g + beta``.
- RMSNorm: ``rsigma = 1/sqrt(mean(x^2) + eps)``, ``z = x * rsigma * g``.
- ``g = gamma``, or ``gamma + 1`` with zero-centred gamma.
- Backward, with ``xhat = (x - mu) * rsigma`` (RMSNorm: ``x * rsigma``) and ``dy = dz * g``:
  ``dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))`` (RMSNorm: without
  ``mean(dy)``), plus ``add`` for ``rmsnorm_bwd_add``; ``dgamma = sum over rows of dz *
  xhat``, ``dbeta = sum over rows of dz``. The backward references take the fp32 ``mu`` and
  ``rsigma`` the kernel is given, so they measure the backward kernel alone.

Error bounds. Each result carries the absolute error an fp32 kernel (templates/norm.cu.j2)
may make before rounding to its output dtype, used as the ``tolerance`` of
:func:`~nvrtc_engine.reference.check_close`. With ``u = 2^-24`` and ``g(k) = k u / (1 - k u)``
(Higham's bound for a sum whose terms each pass through at most ``k`` additions: the error is
at most ``g(k) * sum |terms|``):

- Row sums have depth ``D = summation_depth(H)`` (see there). The mean's error is
  ``dmu = (g(D) + 3u) * mean|x|`` (the sum, then the product with fp32(1/H)).
- The sum of squared deviations from the computed mean ``m`` is a sum of positive terms, so
  it is relatively accurate: ``g(D + 5)``; it also equals ``H (var + (m - mu)^2)``, so
  ``rsigma`` has relative error ``rho = g(D + 6) / 2 + (dmu * rsigma)^2 / 2 + 4u`` (``rsqrtf``
  is within 2 ulp = 4u).
- ``z``: ``|g| rsigma dmu + |g xhat| (rho + 4u) + (|g xhat| + |beta|) 2u`` (the subtraction,
  the products, the fused multiply-add, the rounding of ``gamma + 1``).
- One-pass statistics about a per-row shift ``K`` (``shift``: the staged forward's switch
  ``z``, ``K = x[:, 0]``): ``S1 = sum(x - K)``, ``S2 = sum((x - K)^2)``, ``m = S1 / H``,
  ``var = S2 / H - m^2``. With ``A = sum|x - K|`` the computed ``m`` is within ``e = (g(D) +
  3u) A / H``, the mean within ``dmu = e + u |mu|``; ``S2`` is a sum of positive terms
  (``g(D + 3)``), so ``var`` is within ``g(D + 6) (var + m^2) + u m^2 + 2 |m| e + e^2`` and
  ``rho = that / (2 (var + eps)) + 4u``: the ``m^2 / var`` term is the cancellation, at most
  ``H`` as ``K`` is one of the row's values. ``z`` takes ``x rsigma - mu rsigma`` (one fused
  multiply-add): the bound above with these ``dmu`` and ``rho``, plus ``|g| rsigma u |mu|``.
- Backward: with ``S1 = sum|dy|`` and ``S2 = sum|dy xhat|`` over the row, the kernel's
  ``mean(dy)`` is within ``(g(D) + 4u) S1 / H`` and ``mean(dy xhat)`` within
  ``(g(D) + 7u) S2 / H``; ``dx`` within ``rsigma (3u |dy| + |xhat| d_mdyy + d_mdy +
  4u (|xhat mdyy| + |mdy|)) + u |dx|`` (plus ``u |dx + add|``). Column sums over ``N`` rows
  have depth ``2N + 16`` (a CTA's rows in sequence, its row slots, then the partial rows):
  ``dgamma`` within ``(g(2N + 16) + 3u) sum|dz xhat|``, ``dbeta`` within
  ``g(2N + 16) sum|dz|``.

Each bound is doubled to cover the second-order terms left out above (products of two
rounding errors, each far below ``u``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..shared.reference import FP32_EPS

__all__ = [
    "NormBackward",
    "NormForward",
    "layernorm_bwd",
    "layernorm_fwd",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "summation_depth",
]

_U = FP32_EPS
_SAFETY = 2.0  # covers second-order terms (see the module docstring)


def summation_depth(hidden: int) -> int:
    """The most additions any term of a row sum passes through in the norm kernels.

    A thread adds at most 64 of the row's elements in sequence (the specialized kernels hold
    at most 64 per thread; the streaming kernel gives each of up to 1024 threads
    ``ceil(H / threads)``, at most 64 up to H = 65536, ``ceil(H / 1024)`` beyond), then 5
    levels of warp shuffles, up to 32 warp partials and up to 8 cluster partials in sequence.
    Never more than ``H`` (a sum of H terms has depth H - 1 at most).
    """
    return min(hidden, max(64, math.ceil(hidden / 1024)) + 5 + 32 + 8)


def _g(k: int) -> float:
    return k * _U / (1.0 - k * _U)


def _rows(a: np.ndarray, hidden: int) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).reshape(-1, hidden)


def _weight(gamma: np.ndarray, zero_centered_gamma: bool) -> np.ndarray:
    g = np.asarray(gamma, dtype=np.float64)
    return g + 1.0 if zero_centered_gamma else g


class NormForward(NamedTuple):
    """Reference forward results (float64) and their error bounds (absolute, per element).

    ``z`` ``(N, H)`` before any FP8 scaling, ``mu`` ``(N,)`` (None for RMSNorm), ``rsigma``
    ``(N,)``; ``z_tol``, ``mu_tol``, ``rsigma_tol`` bound an fp32 kernel's errors (multiply
    ``z_tol`` by the scale for scaled output).
    """

    z: np.ndarray
    mu: np.ndarray | None
    rsigma: np.ndarray
    z_tol: np.ndarray
    mu_tol: np.ndarray | None
    rsigma_tol: np.ndarray


class NormBackward(NamedTuple):
    """Reference backward results (float64) and error bounds: ``dx`` ``(N, H)``, ``dgamma``
    ``(H,)``, ``dbeta`` ``(H,)`` (None for RMSNorm), ``dx_tol``, ``dgamma_tol``,
    ``dbeta_tol``."""

    dx: np.ndarray
    dgamma: np.ndarray
    dbeta: np.ndarray | None
    dx_tol: np.ndarray
    dgamma_tol: np.ndarray
    dbeta_tol: np.ndarray | None


def layernorm_fwd(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, *,
    zero_centered_gamma: bool = False, shift: np.ndarray | None = None,
) -> NormForward:  # fmt: skip
    """LayerNorm forward of ``x`` ``(..., H)`` (any float dtype), as in TransformerEngine.

    Returns :class:`NormForward` with ``z`` shaped ``(N, H)``. ``shift`` ``(N,)``: the
    values the kernel took its one-pass statistics about (the staged forward's switch ``z``:
    each row's first element); the error bounds are then that computation's (module
    docstring). The results do not depend on it.
    """
    hidden = np.shape(x)[-1]
    x64 = _rows(x, hidden)
    g = _weight(gamma, zero_centered_gamma)
    b = np.asarray(beta, dtype=np.float64)
    eps32 = float(np.float32(eps))
    mu = x64.mean(axis=1)
    d = x64 - mu[:, None]
    var = (d * d).mean(axis=1)
    rsigma = 1.0 / np.sqrt(var + eps32)
    xhat = d * rsigma[:, None]
    z = xhat * g + b
    depth = summation_depth(hidden)
    fold = 0.0
    if shift is None:
        dmu = (_g(depth) + 3 * _U) * np.abs(x64).mean(axis=1)
        rho = _g(depth + 6) / 2 + (dmu * rsigma) ** 2 / 2 + 4 * _U
    else:
        k = np.asarray(shift, dtype=np.float64).reshape(-1)
        m = mu - k
        e = (_g(depth) + 3 * _U) * np.abs(x64 - k[:, None]).mean(axis=1)
        dmu = e + _U * np.abs(mu)
        dvar = _g(depth + 6) * (var + m * m) + _U * m * m + 2 * np.abs(m) * e + e * e
        rho = dvar / (2 * (var + eps32)) + 4 * _U
        fold = _U * (rsigma * np.abs(mu))[:, None]  # the rounding of mu * rsigma
    gx = np.abs(g * xhat)
    z_tol = (np.abs(g) * ((rsigma * dmu)[:, None] + fold) + gx * (rho[:, None] + 4 * _U)
             + (gx + np.abs(b)) * 2 * _U)  # fmt: skip
    return NormForward(z, mu, rsigma, _SAFETY * z_tol, _SAFETY * dmu, _SAFETY * rho * rsigma)


def rmsnorm_fwd(
    x: np.ndarray, gamma: np.ndarray, eps: float, *, zero_centered_gamma: bool = False
) -> NormForward:
    """RMSNorm forward of ``x`` ``(..., H)``, as in TransformerEngine (``mu`` is None)."""
    hidden = np.shape(x)[-1]
    x64 = _rows(x, hidden)
    g = _weight(gamma, zero_centered_gamma)
    eps32 = float(np.float32(eps))
    rsigma = 1.0 / np.sqrt((x64 * x64).mean(axis=1) + eps32)
    z = x64 * rsigma[:, None] * g
    rho = _g(summation_depth(hidden) + 5) / 2 + 4 * _U
    z_tol = np.abs(z) * (rho + 3 * _U)
    return NormForward(z, None, rsigma, _SAFETY * z_tol, None,
                       _SAFETY * np.full_like(rsigma, rho) * rsigma)  # fmt: skip


def _backward(
    dz: np.ndarray, x: np.ndarray, mu: np.ndarray | None, rsigma: np.ndarray, gamma: np.ndarray,
    zero_centered_gamma: bool, add: np.ndarray | None,
) -> NormBackward:  # fmt: skip
    hidden = np.shape(x)[-1]
    x64 = _rows(x, hidden)
    dz64 = _rows(dz, hidden)
    rows = x64.shape[0]
    r = np.asarray(rsigma, dtype=np.float64).reshape(-1, 1)
    m = 0.0 if mu is None else np.asarray(mu, dtype=np.float64).reshape(-1, 1)
    g = _weight(gamma, zero_centered_gamma)
    xhat = (x64 - m) * r
    dy = dz64 * g
    mdyy = (dy * xhat).mean(axis=1, keepdims=True)
    mdy = np.zeros_like(mdyy) if mu is None else dy.mean(axis=1, keepdims=True)
    dx = r * (dy - mdy - xhat * mdyy)
    depth = summation_depth(hidden)
    d_mdyy = (_g(depth) + 7 * _U) * np.abs(dy * xhat).mean(axis=1, keepdims=True)
    d_mdy = (0.0 if mu is None else
             (_g(depth) + 4 * _U) * np.abs(dy).mean(axis=1, keepdims=True))  # fmt: skip
    dx_tol = (r * (3 * _U * np.abs(dy) + np.abs(xhat) * d_mdyy + d_mdy
                   + 4 * _U * (np.abs(xhat * mdyy) + np.abs(mdy))) + _U * np.abs(dx))  # fmt: skip
    if add is not None:
        dx = dx + _rows(add, hidden)
        dx_tol = dx_tol + _U * np.abs(dx)
    col_depth = _g(2 * rows + 16)
    dgamma = (dz64 * xhat).sum(axis=0)
    dgamma_tol = (col_depth + 3 * _U) * np.abs(dz64 * xhat).sum(axis=0)
    dbeta = dbeta_tol = None
    if mu is not None:
        dbeta = dz64.sum(axis=0)
        dbeta_tol = _SAFETY * col_depth * np.abs(dz64).sum(axis=0)
    return NormBackward(dx, dgamma, dbeta, _SAFETY * dx_tol, _SAFETY * dgamma_tol, dbeta_tol)


def layernorm_bwd(
    dz: np.ndarray, x: np.ndarray, mu: np.ndarray, rsigma: np.ndarray, gamma: np.ndarray, *,
    zero_centered_gamma: bool = False,
) -> NormBackward:  # fmt: skip
    """LayerNorm backward for ``dz``, ``x`` ``(..., H)`` given the fp32 ``mu``/``rsigma``
    ``(N,)`` the kernel reads, as in TransformerEngine."""
    return _backward(dz, x, mu, rsigma, gamma, zero_centered_gamma, None)


def rmsnorm_bwd(
    dz: np.ndarray, x: np.ndarray, rsigma: np.ndarray, gamma: np.ndarray, *,
    zero_centered_gamma: bool = False, add: np.ndarray | None = None,
) -> NormBackward:  # fmt: skip
    """RMSNorm backward (``add``: the residual gradient of ``rmsnorm_bwd_add``), as in
    TransformerEngine; ``dbeta`` is None."""
    return _backward(dz, x, None, rsigma, gamma, zero_centered_gamma, add)
