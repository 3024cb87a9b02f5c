"""Error of the one-pass LayerNorm statistics about the row's first element (switch ``z``),
in an fp32 emulation of the kernel's arithmetic (no GPU needed).

    python bench/norm_shift_error.py [--rows 16] [--seed 5]

For bf16 rows of N(0, 1) at H = 4096, 8192 and 65536, with the first element as drawn or
set to an outlier (256 = sqrt(65536) standard deviations, where the cancellation factor of
nvrtc_engine/ops/norm_switches.py's ``FWD_SHIFTED`` reaches H / 2 of its bound H + 1; 50; -2000, a
"massive activation" in channel 0),
and for fp32 rows with a 1e4 mean offset: the largest relative error of ``rsigma`` and of
``mu`` (scaled by sigma) against the float64 reference, for the shifted one pass
(:func:`shifted_forward_fp32`) and for the two-pass form the other kernels use
(:func:`two_pass_fp32`), each as the kernels add (64 terms in sequence per thread, fused
multiply-adds for squares, then a tree). Writes bench/results/norm_shift_error.json.
tests/test_norm.py checks the same emulation against the reference's error bounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
    """The staged forward's switch ``z`` on fp32 rows ``x`` (N, H) (templates/norm.cu.j2,
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


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.abs(want)))


def _in_sigmas(mu: np.ndarray, ref: Any) -> float:
    """The largest error of ``mu`` in standard deviations of its row."""
    return float(np.max(np.abs(mu.astype(np.float64) - ref.mu) * ref.rsigma))


def measure(rows: int, seed: int) -> list[dict[str, Any]]:
    """One result row per (H, first element or offset) case."""
    import ml_dtypes

    from nvrtc_engine import reference

    rng = np.random.default_rng(seed)
    out = []
    cases = [(65536, None, 0.0), (65536, 256.0, 0.0), (65536, 50.0, 0.0), (8192, 50.0, 0.0),
             (4096, None, 0.0), (4096, -2000.0, 0.0), (4096, None, 1e4)]  # fmt: skip
    for hidden, first, offset in cases:
        x = rng.standard_normal((rows, hidden)) + offset
        if first is not None:
            x[:, 0] = first
        dtype = F32 if offset else ml_dtypes.bfloat16
        x32 = x.astype(dtype).astype(F32)
        ones, zeros = np.ones(hidden, F32), np.zeros(hidden, F32)
        _, mu, rs, _ = shifted_forward_fp32(x32, ones, zeros, 1e-5)
        mu2, rs2 = two_pass_fp32(x32, 1e-5)
        ref = reference.layernorm_fwd(x32, ones, zeros, 1e-5)

        out.append({"hidden": hidden, "first": first, "offset": offset,
                    "x": "fp32" if offset else "bf16",
                    "rsigma_rel_shifted": _rel(rs, ref.rsigma),
                    "rsigma_rel_two_pass": _rel(rs2, ref.rsigma),
                    "mu_sigma_shifted": _in_sigmas(mu, ref),
                    "mu_sigma_two_pass": _in_sigmas(mu2, ref)})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    import common

    rows = measure(args.rows, args.seed)
    print(
        f"{'H':>6} {'x':>5} {'first':>8} {'offset':>7}  rsigma rel. error: shifted  two-pass"
        "   mu error / sigma: shifted  two-pass"
    )
    for r in rows:
        first = "-" if r["first"] is None else f"{r['first']:g}"
        print(
            f"{r['hidden']:>6} {r['x']:>5} {first:>8} {r['offset']:>7g}  "
            f"{r['rsigma_rel_shifted']:>24.2e} {r['rsigma_rel_two_pass']:>9.2e}"
            f" {r['mu_sigma_shifted']:>26.2e} {r['mu_sigma_two_pass']:>9.2e}"
        )
    path = common.write_results("norm_shift_error", {"rows_per_case": args.rows,
                                                     "seed": args.seed, "rows": rows})  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
