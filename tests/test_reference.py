"""The numpy references are right, and the output check catches wrong elements."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from nvrtc_engine import reference as ref


def test_gelu_matches_the_tanh_form():
    x = np.linspace(-6, 6, 2001)
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(ref.gelu(x), tanh_form, rtol=1e-12, atol=1e-15)
    assert ref.gelu(np.array([30.0]))[0] == 30.0
    assert ref.gelu(np.array([-30.0]))[0] == 0.0


def test_round_to_saturates_fp8_and_keeps_nan():
    y = np.array([1000.0, -1000.0, 448.0, 449.0, np.nan, 1e6])
    e4m3 = ref.round_to(y, "fp8_e4m3").astype(np.float64)
    assert list(e4m3[:4]) == [448.0, -448.0, 448.0, 448.0] and np.isnan(e4m3[4])
    assert ref.round_to(np.array([1e6]), "fp8_e5m2").astype(np.float64)[0] == 57344.0
    assert ref.round_to(np.array([1.0 + 2**-9]), "bf16").astype(np.float64)[0] == 1.0  # tie->even


def test_sample_input_has_outliers_zeros_and_known_max():
    x = ref.sample_input((64, 128), "bf16", np.random.default_rng(0)).astype(np.float64)
    assert (x == 0).any() and x.max() == 30.0 and (np.abs(x) > 5).sum() >= 2
    assert np.count_nonzero(x) > 0.9 * x.size


def test_activation_reference_scaling_and_amax():
    x = np.array([1.0, -2.0, 30.0, 0.0], dtype=ml_dtypes.bfloat16)
    r = ref.activation("gelu", x, "fp8_e4m3", scale=4.0)
    assert r.amax == 30.0 and r.scale_inv == np.float32(0.25)
    assert r.out.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert float(r.out[2]) == 120.0  # 30 * 4


@pytest.mark.parametrize("out_dtype", ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_check_close_accepts_correct_and_catches_wrong(out_dtype):
    rng = np.random.default_rng(1)
    y = rng.standard_normal(1000) * 3
    rounded = ref.round_to(y, out_dtype)
    elements, at_ties = ref.check_close(rounded, y, out_dtype, 1e-7)
    assert elements == 1000 and at_ties == 0
    wrong = rounded.astype(np.float64)
    wrong[17] = wrong[17] * 1.5 + 1.0
    with pytest.raises(AssertionError, match="first at \\(17,\\)"):
        ref.check_close(ref.round_to(wrong, out_dtype), y, out_dtype, 1e-7)


def test_check_close_allows_only_ties():
    # bf16 spacing at 1.0 is 2^-7; the midpoint 1 + 2^-8 may round either way
    y = np.array([1.0 + 2**-8])
    up = np.array([1.0 + 2**-7], dtype=ml_dtypes.bfloat16)
    assert ref.check_close(up, y, "bf16", 1e-6) == (1, 1)
    far = np.array([1.0 + 2**-6], dtype=ml_dtypes.bfloat16)
    with pytest.raises(AssertionError):
        ref.check_close(far, y, "bf16", 1e-6)
