"""The software E2M1 conversion (templates/include/nve_fp4.cuh), emulated operation by
operation in numpy (tests/e2m1_emulation.py), equals the reference on a dense sample of float32
bit patterns (the default tier's quick check; test_e2m1_exhaustive.py, marked ``matrix``,
covers every pattern of the binades where the code varies)."""

from __future__ import annotations

import e2m1_emulation as e2m1
import numpy as np


def test_sample_matches_the_reference():
    bits = e2m1.sample()
    assert bits.size > 40000
    with np.errstate(invalid="ignore"):
        assert e2m1.check(bits) == 0


def test_named_cases():
    v = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, -0.0, -0.1, np.inf, -np.inf,
                  5.000001, 0.2500001], np.float32)  # fmt: skip
    nan = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001], np.uint32).view(np.float32)
    want = [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 8, 7, 15, 7, 1, 7, 7, 7, 7]
    assert e2m1.new_e2m1(np.concatenate([v, nan])).tolist() == want


def test_nvrtc_options_keep_subnormals():
    """The software path reads E2M1 codes from subnormal fp32 results (0.5 is 2^-127): the
    options an NVFP4 kernel compiles with must not flush them (no -ftz=true, no fast math)."""
    import nvrtc_engine as ne
    from nvrtc_engine.core.nvrtc import compile_options

    key = ne.make_key("quantize", in_dtype="bf16", out_dtype="fp4_e2m1", arch="sm_90")
    flags = " ".join(compile_options(key.arch).flags())
    assert "ftz=true" not in flags and "fast_math" not in flags and "fast-math" not in flags
