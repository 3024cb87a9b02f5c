"""The software E2M1 conversion (templates/include/nve_fp4.cuh, emulated by
tests/e2m1_emulation.py) against the reference on every float32 bit pattern of the binades
where the E2M1 code varies, and on a sample of every binade. ``python tests/e2m1_emulation.py``
checks all 2**32 patterns (about 16 minutes on 2 cores)."""

from __future__ import annotations

import numpy as np
import pytest
from e2m1_emulation import check, patterns

SIGN = 1 << 31


@pytest.mark.matrix
@pytest.mark.parametrize("exponent", range(124, 130))
def test_every_pattern_of_the_binades_where_the_code_varies(exponent):
    """Magnitudes in [2**(exponent - 127), 2**(exponent - 126)), both signs: [0.125, 0.25),
    where every value rounds to 0 with 0.25 the first tie, up to [4, 8), where 5 ties to 4
    and 6 saturates; outside them every code is 0 or saturated."""
    first = exponent << 23
    bits = np.concatenate([patterns(first, 1 << 23), patterns(first | SIGN, 1 << 23)])
    with np.errstate(all="ignore"):
        assert check(bits) == 0


@pytest.mark.matrix
def test_every_binade_sampled():
    """Every exponent field (zeros and subnormals, normals, infinities and NaNs), both signs,
    the first, last and every 2048th mantissa and 256 random ones."""
    rng = np.random.default_rng(1)
    spread = [np.arange(0, 1 << 23, 2048), [1, (1 << 23) - 1], rng.integers(0, 1 << 23, 256)]
    mantissas = np.unique(np.concatenate(spread)).astype(np.uint64)
    magnitudes = (np.arange(256, dtype=np.uint64)[:, None] << 23) | mantissas[None, :]
    bits = magnitudes.ravel().astype(np.uint32)
    with np.errstate(all="ignore"):
        assert check(np.concatenate([bits, bits | np.uint32(SIGN)])) == 0
