"""The LayerNorm FP8 forward's one-pass statistics about the row's first element K (switch
``z``), emulated in fp32 (tests/norm_shift_emulation.py), against the float64 reference: the
error that cancellation adds where K is an outlier stays far below an E4M3 step (2**-4
relative), which is why ``z`` is only taken where the output is FP8; the two-pass form of the
other kernels stays at fp32 rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from norm_shift_emulation import shifted_forward_fp32, two_pass_fp32

from nvrtc_engine import reference

EPS = 1e-5


def _errors(x: np.ndarray) -> dict[str, float]:
    """Largest relative error of rsigma and largest error of mu in standard deviations of its
    row, for the shifted one pass and the two-pass form, on fp32 rows ``x``."""
    ones, zeros = np.ones(x.shape[1], np.float32), np.zeros(x.shape[1], np.float32)
    _, mu, rs, _ = shifted_forward_fp32(x, ones, zeros, EPS)
    mu2, rs2 = two_pass_fp32(x, EPS)
    ref = reference.layernorm_fwd(x, ones, zeros, EPS)

    def rel(got: np.ndarray) -> float:
        return float(np.max(np.abs(got.astype(np.float64) - ref.rsigma) / ref.rsigma))

    def sigmas(got: np.ndarray) -> float:
        return float(np.max(np.abs(got.astype(np.float64) - ref.mu) * ref.rsigma))

    return {"rs_shifted": rel(rs), "rs_two_pass": rel(rs2), "mu_shifted": sigmas(mu),
            "mu_two_pass": sigmas(mu2)}  # fmt: skip


def _rows(hidden: int, first: float | None, offset: float = 0.0, rows: int = 16) -> np.ndarray:
    """N(0, 1) rows (plus ``offset``) whose first element is ``first`` where given, rounded
    to bf16 (fp32 where there is an offset, which bf16 cannot hold to a unit)."""
    rng = np.random.default_rng(hidden + int(offset))
    x = rng.standard_normal((rows, hidden)) + offset
    if first is not None:
        x[:, 0] = first
    return x.astype(np.float32 if offset else ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("hidden, offset", [(4096, 0.0), (65536, 0.0), (4096, 1e4)])
def test_a_typical_first_element_costs_fp32_rounding(hidden, offset):
    """K as drawn (or within the spread of a row with a 1e4 mean): both forms at the level
    of fp32 rounding; mu to within two fp32 steps at its magnitude (sigma is 1)."""
    e = _errors(_rows(hidden, None, offset))
    assert e["rs_shifted"] < 1e-6 and e["rs_two_pass"] < 1e-6
    mu_bound = 1e-6 + offset * 2.0**-22
    assert e["mu_shifted"] < mu_bound and e["mu_two_pass"] < mu_bound


@pytest.mark.parametrize("hidden, first", [(65536, 256.0), (65536, 50.0), (8192, 50.0),
                                           (4096, -2000.0)])  # fmt: skip
def test_an_outlier_first_element_stays_below_an_e4m3_step(hidden, first):
    """K = 256 at H = 65536 (sqrt(H) standard deviations: a cancellation of about H / 2),
    50, and -2000 (a "massive activation" in channel 0): the shifted rsigma loses digits
    (more than the two-pass form, which shows the cancellation is exercised) but stays
    within 2**-6 relative, a quarter of an E4M3 step; mu within 1e-4 standard deviations."""
    e = _errors(_rows(hidden, first))
    assert e["rs_shifted"] < 2.0**-6
    assert e["rs_shifted"] > 10 * e["rs_two_pass"]
    assert e["mu_shifted"] < 1e-4
    assert e["rs_two_pass"] < 1e-6 and e["mu_two_pass"] < 1e-6
