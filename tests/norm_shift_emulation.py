"""An fp32 emulation of the norm forwards' row statistics, operation by operation: the one-pass
statistics about the row's first element K of the LayerNorm FP8 forward (``stats="shifted"``;
templates/norm_fwd.j2, ``shifted_stats``) and the two-pass form of the other kernels, each
summed as the kernels add (64 terms in sequence per thread, fused multiply-adds for squares,
then a tree of the partials). tests/test_norm_shift_error.py bounds their errors against the
float64 reference.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fp32_sum(t: np.ndarray, squares: bool = False) -> np.ndarray:
    """Row sums of ``t`` (N, H) in fp32 as the norm kernels add: 64 terms in sequence per
    thread (squares by fused multiply-add: one rounding each), then a tree of the partials."""
    n, h = t.shape
    per = min(64, h)
    t = np.concatenate([t, np.zeros((n, (-h) % per), F32)], axis=1).reshape(n, -1, per)
    acc = np.zeros(t.shape[:2], F32)
    for i in range(per):
        v = t[:, :, i].astype(np.float64)
        acc = (acc + (v * v if squares else v)).astype(F32)
    while acc.shape[1] > 1:
        acc = np.concatenate([acc, np.zeros((n, acc.shape[1] % 2), F32)], axis=1)
        acc = (acc[:, 0::2] + acc[:, 1::2]).astype(F32)
    return acc[:, 0]


def _rsigma(var: np.ndarray, eps: float) -> np.ndarray:
    return (1.0 / np.sqrt(np.maximum(var, 0).astype(np.float64) + F32(eps))).astype(F32)


def shifted_forward_fp32(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The staged forward's shifted statistics on fp32 rows ``x`` (N, H) (templates/norm_fwd.j2,
    ``shifted_stats``): sums of x - K and (x - K)^2 about K = x[:, 0], mu = K + S1 / H,
    var = S2 / H - (S1 / H)^2 (a fused multiply-add), then z = (x rsigma - mu rsigma) gamma +
    beta by fused multiply-adds. Returns (K, mu, rsigma, z), fp32."""
    k = x[:, 0].copy()
    d = (x - k[:, None]).astype(F32)
    inv = F32(1.0 / x.shape[1])
    m = (fp32_sum(d) * inv).astype(F32)
    mu = (k + m).astype(F32)
    var = (fp32_sum(d, squares=True).astype(np.float64) * inv - (m * m).astype(F32)).astype(F32)
    rs = _rsigma(var, eps)
    nmr = (-mu * rs).astype(F32)
    inner = (x.astype(np.float64) * rs[:, None] + nmr[:, None]).astype(F32)
    return k, mu, rs, (inner.astype(np.float64) * gamma + beta).astype(F32)


def two_pass_fp32(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The two-pass statistics of the other kernels on fp32 rows ``x``: (mu, rsigma)."""
    inv = F32(1.0 / x.shape[1])
    mu = (fp32_sum(x) * inv).astype(F32)
    d = (x - mu[:, None]).astype(F32)
    return mu, _rsigma((fp32_sum(d, squares=True) * inv).astype(F32), eps)
