"""The software E2M1 conversion of templates/include/nve_fp4.cuh, emulated in numpy operation by
operation, and its check against the reference (``nvrtc_engine.reference.e2m1_encode``).

    python tests/e2m1_emulation.py          # every float32 bit pattern: about 16 min on 2 cores
    python tests/e2m1_emulation.py --sample # the sample tests/test_e2m1_emulated.py checks

tests/test_e2m1_exhaustive.py (``matrix``) checks every pattern of the binades where the code
varies. The emulation follows the CUDA code: fminf / fmaxf return the non-NaN operand, for
signaling NaNs too; float32 arithmetic rounds to nearest even and keeps subnormals, as NVRTC
compiles without -ftz; integer arithmetic is modulo 2**32. ``a = fminf(|v|, 6)`` (NaN gives
6); ``c`` = 2**(E - 104) for the binade 2**E (E = 0, 1, 2) of ``max(a, 1)``, built from its
exponent bits by one bitwise operation; ``z = fmaf(a, 2**-126, c) - c``: the fused
multiply-add rounds a * 2**-126 once onto the float32 grid of c's binade, 2**(E - 127), which
is the E2M1 grid (step 2**(E - 1)) scaled by 2**-126, ties to the even multiple, that is, the
even code; the subtraction is exact, and z = q * 2**-126 for the rounded E2M1 value q, whose
bits are ``code << 22`` (1.0 maps to the smallest normal float32, 0.5 to the subnormal
2**-127). The sign comes from ``fminf(v, 6)``, which maps NaN to +6 and keeps every other
sign (-0 included). ``fmaf`` is emulated exactly: a * 2**-126 + c lies in [c, 2c) (a <= 6),
so its rounding is that of a / 2**(E - 1) to an integer, ties to even, which float64 ``rint``
of the exactly scaled value computes.
"""

from __future__ import annotations

import multiprocessing
import sys
import time

import numpy as np

from nvrtc_engine.reference import e2m1_encode

U32 = np.uint32


def f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(U32).view(np.float32)


def u32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(U32)


def fminf(x: np.ndarray, y: np.float32) -> np.ndarray:
    """CUDA's fminf with a non-NaN y: y when x is NaN, quiet or signaling (numpy's fmin gives
    NaN for a signaling one); -0 < +0 does not arise (y is 6 or 1)."""
    return np.where(np.isnan(x), y, np.minimum(x, y)).astype(np.float32)


def fmaxf(x: np.ndarray, y: np.float32) -> np.ndarray:
    """CUDA's fmaxf with a non-NaN y (see :func:`fminf`)."""
    return np.where(np.isnan(x), y, np.maximum(x, y)).astype(np.float32)


def new_mag22(v: np.ndarray) -> np.ndarray:
    """``e2m1_mag22`` of nve_fp4.cuh: the magnitude code << 22 (bits of z)."""
    with np.errstate(invalid="ignore"):
        a = fminf(np.abs(v), np.float32(6.0))
        m = u32(fmaxf(a, np.float32(1.0)))
    cbits = (m & U32(0x07800000)) ^ U32(0x0C000000)
    c = f32(cbits).astype(np.float64)
    e = (m >> U32(23)).astype(np.int64) - 127  # 0, 1, 2: the binade of max(a, 1)
    # fmaf(a, 2^-126, c): a * 2^-126 + c in [c, 2c), rounded to c's ulp 2^(e - 127)
    n = np.rint(a.astype(np.float64) * np.exp2(1.0 - e))  # exact scaling; rint: ties to even
    r = (c + n * np.exp2(e - 127.0)).astype(np.float32)  # exact: c plus n ulps, n < 2^23
    assert np.all(r.astype(np.float64) == c + n * np.exp2(e - 127.0))
    z = (r.astype(np.float64) - c).astype(np.float32)  # r - c, exact in float32
    return u32(z)


def new_e2m1(v: np.ndarray) -> np.ndarray:
    """The current conversion: magnitude code from z, sign from fminf(v, 6)."""
    with np.errstate(invalid="ignore"):
        s = u32(fminf(v, np.float32(6.0)))
    return ((new_mag22(v) >> U32(22)) | ((s >> U32(28)) & U32(8))).astype(np.uint8)


def sample() -> np.ndarray:
    """Bit patterns where a conversion can go wrong: each E2M1 value and midpoint (times
    powers of two near 1) and a few ulps either side, both signs; zeros, subnormals, the
    smallest and largest normals, infinities, NaNs of both signs (quiet and signaling),
    powers of two, and random patterns."""
    points = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8])
    scaled = np.concatenate([points * 2.0**k for k in range(-3, 4)]).astype(np.float32)
    base = u32(scaled).astype(np.int64)
    near = (base[:, None] + np.arange(-4, 5)[None, :]).ravel()
    special = np.array(
        [0, 1, 2, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F800000, 0x7F800001,
         0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0x3E7FFFFF, 0x3E800001],
        dtype=np.int64,
    )  # fmt: skip
    pow2 = np.arange(1, 255, dtype=np.int64) << 23
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 31, 20000, dtype=np.int64)
    mags = np.concatenate([near, special, pow2, random]) & 0x7FFFFFFF
    return np.concatenate([mags, mags | (1 << 31)]).astype(U32)


def check(bits: np.ndarray) -> int:
    """Number of the float32 bit patterns ``bits`` whose emulated code differs from the
    reference's, in slices of 2**20 (the reference holds 8 float64 distances per value)."""
    bad = 0
    for start in range(0, bits.size, 1 << 20):
        v = f32(bits[start : start + (1 << 20)])
        bad += int(np.count_nonzero(new_e2m1(v) != e2m1_encode(v)))
    return bad


def patterns(first: int, count: int) -> np.ndarray:
    """The ``count`` float32 bit patterns from ``first`` on."""
    return np.arange(first, first + count, dtype=np.uint64).astype(U32)


def _chunk(i: int) -> int:
    with np.errstate(all="ignore"):
        return check(patterns(i << 24, 1 << 24))


def main() -> int:
    if "--sample" in sys.argv:
        bits = sample()
        with np.errstate(all="ignore"):
            bad = check(bits)
        print(f"{bits.size} sampled patterns, {bad} mismatches")
        return 1 if bad else 0
    start, bad = time.time(), 0
    with multiprocessing.Pool() as pool:  # chunks of 2**24 patterns, one per task
        for done, n in enumerate(pool.imap_unordered(_chunk, range(256)), 1):
            bad += n
            if done % 16 == 0:
                print(f"{done << 24:>11} patterns, {bad} mismatches, {time.time() - start:.0f} s",
                      flush=True)  # fmt: skip
    print(f"all 2**32 patterns: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
