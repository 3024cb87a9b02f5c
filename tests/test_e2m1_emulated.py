"""The software E2M1 conversion (templates/include/nve_fp4.cuh), emulated operation by
operation in numpy (bench/e2m1_exhaustive.py), equals the previous conversion and the
reference on a dense sample of float32 bit patterns; the script itself checks all 2**32."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    "e2m1_exhaustive", Path(__file__).resolve().parent.parent / "bench" / "e2m1_exhaustive.py"
)
e2m1 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(e2m1)


def test_sample_matches_previous_conversion_and_reference():
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
    from nvrtc_engine.cache import compile_options

    key = ne.make_key("quantize", in_dtype="bf16", out_dtype="fp4_e2m1", arch="sm_90")
    flags = " ".join(compile_options(key.arch).flags())
    assert "ftz=true" not in flags and "fast_math" not in flags and "fast-math" not in flags
