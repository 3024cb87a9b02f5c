"""Edge-value test data for the cast family's block-scaled quantization (emulated and GPU
tests)."""

from __future__ import annotations

import numpy as np

import nvrtc_engine as ne
from nvrtc_engine import reference

# E2M1 midpoints and values, 6 * 1.03 (above 6 once a block scale rounds down), values near
# the fp32 minimum normal, the E4M3 maximum and a large value; each with either sign.
PICKS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 6.1875, 1e-38, 3e-39, 448.0, 1e6]


def edge_input(shape: tuple[int, int], rng: np.random.Generator, sixes: bool = False) -> np.ndarray:
    """bf16 data (numpy, ml_dtypes) with MXFP8 / NVFP4 edge cases: an all-zero 32 x 32
    block, -0, up to 400 values from :data:`PICKS` of random sign, the rest
    :func:`~nvrtc_engine.reference.sample_input`. ``sixes``: also 6.0 wherever
    ``row % 16 == col % 16``, so that every 16-element block along rows and down columns
    holds a 6 (with tensor amax 2688, S_enc is 1 and such a block's multiplier 1, so the
    E2M1 midpoints stay exact)."""
    x = reference.sample_input(shape, "fp32", rng).astype(np.float64)
    m, k = shape
    x[: min(m, 32), : min(k, 32)] = 0.0
    x[min(m, 32) - 1, 1 % k] = -0.0
    flat = x.reshape(-1)
    at = rng.choice(flat.size, size=min(flat.size, 400), replace=False)
    flat[at] = rng.choice(PICKS, size=at.size) * rng.choice([-1.0, 1.0], size=at.size)
    if sixes:
        i, j = np.indices(shape)
        x[(i % 16) == (j % 16)] = 6.0
    return x.astype(ne.DTYPES["bf16"].numpy())


# bf16 bit patterns for NVFP4's non-finite cases: NaN of both signs (quiet and signaling),
# +-inf. E2M1 has no NaN: every NaN gives 0x7 (+6, the sign dropped), inf saturates to +-6.
NON_FINITE_BF16 = [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0xFFFF, 0x7F80, 0xFF80]


def nvfp4_non_finite_input(
    shape: tuple[int, int], rng: np.random.Generator, signaling: bool = True
) -> np.ndarray:
    """:func:`edge_input` (with ``sixes``) plus up to 60 entries of :data:`NON_FINITE_BF16`
    (without the signaling NaNs unless ``signaling``: the host emulation's fmaxf, glibc's,
    returns NaN for those, the GPU's drops them as any NaN)."""
    x = edge_input(shape, rng, sixes=True).view(np.uint16)
    flat = x.reshape(-1)
    at = rng.choice(flat.size, size=min(flat.size // 16, 60), replace=False)
    picks = [b for b in NON_FINITE_BF16 if signaling or b & 0x7FC0 == 0x7FC0 or b & 0x7F == 0]
    flat[at] = rng.choice(picks, size=at.size)
    return x.view(ne.DTYPES["bf16"].numpy())


def nvfp4_reference_with_nan(x: np.ndarray, amax: float, direction: str) -> reference.NVFP4Result:
    """:func:`~nvrtc_engine.reference.nvfp4_quantize` of ``x`` whose NaNs count as 0 in the
    block maxima (as fmaxf drops them) and give the code 0x7."""
    with np.errstate(invalid="ignore"):
        x = x.astype(np.float64)
    nan = np.isnan(x)
    want = reference.nvfp4_quantize(np.where(nan, 0.0, x), amax, direction)
    codes = want.codes.copy()
    codes[nan if direction == "rowwise" else nan.T] = 0x7
    return want._replace(codes=codes, data=reference.pack_e2m1(codes))
