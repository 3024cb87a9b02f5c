"""The device helper headers compile for every arch, and the float64 references they are
checked against are right (derivatives against finite differences, E8M0 scales)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from nvrtc_engine import reference as ref
from nvrtc_engine.core.nvrtc import CompileOptions, compile_source
from nvrtc_engine.core.render import helper_headers

FUNCS = ["identity", "gelu", "qgelu", "silu", "relu", "srelu", "sigmoid"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90", "sm_100a"])
def test_every_helper_compiles(arch):
    calls = " + ".join(f"nve::{f}(v) + nve::d{f}(v)" for f in FUNCS)
    soft = arch == "sm_80"
    source = (
        ("#define NVE_SOFT_FP8 1\n#include <cuda_fp8.h>\n" if soft else "")
        + "".join(f'#include "{name}"\n' for name, _ in helper_headers())
        + 'extern "C" __global__ void k(const float* x, float* y, unsigned char* e) {\n'
        "  const float v = x[threadIdx.x];\n"
        f"  y[threadIdx.x] = {calls};\n"
        "  e[threadIdx.x] = nve::e8m0_from_amax(v, 1.f / 448.f) + nve::e4m3::store(v)"
        " + static_cast<unsigned char>(nve::e8m0_multiplier(e[0]));\n"
        "  y[0] = nve::block_max<128>(v);\n}\n"
    )
    result = compile_source(
        "helpers.cu", source, helper_headers(), CompileOptions(arch=arch), cuda_headers=soft
    )
    assert result.image[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", list(ref.ACTIVATIONS))
def test_derivatives_match_finite_differences(name):
    act = ref.ACTIVATIONS[name]
    x = np.concatenate([np.linspace(-8, 8, 1601), [-0.3, 0.3, 2.5]])
    x = x[np.abs(x) > 1e-3]  # relu/srelu have a kink at 0
    h = 1e-6
    numeric = (act.fn(x + h) - act.fn(x - h)) / (2 * h)
    np.testing.assert_allclose(act.dfn(x), numeric, rtol=1e-6, atol=1e-7)


def test_gelu_matches_transformer_engine_tanh_form_and_derivative():
    x = np.linspace(-6, 6, 999)
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    # the tanh form cancels for negative x (1 + tanh(u) -> 0): agreement to its rounding
    np.testing.assert_allclose(ref.gelu(x), 0.5 * x * (1 + np.tanh(u)), rtol=1e-12, atol=1e-14)
    du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x**2)
    te = 0.5 * (1 + np.tanh(u)) + 0.5 * x * (1 - np.tanh(u) ** 2) * du
    np.testing.assert_allclose(ref.dgelu(x), te, rtol=1e-12, atol=1e-14)


def test_activation_values():
    assert ref.qgelu(np.array([1.0]))[0] == pytest.approx(1 / (1 + math.exp(-1.702)))
    assert ref.srelu(np.array([-2.0, 3.0])).tolist() == [0.0, 9.0]
    assert ref.drelu(np.array([-1.0, 0.0, 1.0])).tolist() == [0.0, 0.0, 1.0]
    assert ref.sigmoid(np.array([-1000.0, 1000.0])).tolist() == [0.0, 1.0]


def test_e8m0_scale_semantics():
    e = ref.e8m0_scale(np.array([0.0, 448.0, 449.0, 1.0, 896.0, np.inf, np.nan]), "fp8_e4m3")
    # 448/448 = 1 = 2^0 -> 127; a hair more rounds the exponent up; 0, inf, NaN special
    assert e.tolist() == [0, 127, 128, 119, 128, 254, 255]
    assert ref.e8m0_scale(np.array([57344.0]), "fp8_e5m2").tolist() == [127]


@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_mxfp8_quantize_blocks_fit_the_range(direction):
    rng = np.random.default_rng(0)
    # magnitudes vary across blocks (between rows for rowwise, columns for columnwise)
    spread = (64, 1) if direction == "rowwise" else (1, 96)
    y = rng.standard_normal((64, 96)) * np.exp(rng.uniform(-10, 10, spread))
    y[np.abs(y) < 1e-2 * np.abs(y).max(axis=1 if direction == "rowwise" else 0, keepdims=True)] = 0
    data, scales, mult = ref.mxfp8_quantize(y, "fp8_e4m3", direction)
    assert data.shape == y.shape and data.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert scales.shape == ((64, 3) if direction == "rowwise" else (2, 96))
    assert np.all(np.abs(y * mult) <= 448.0)  # amax fits, so no block saturates
    back = data.astype(np.float64) / mult
    np.testing.assert_allclose(back, y, rtol=2**-3, atol=0)  # E4M3 keeps 3 mantissa bits
