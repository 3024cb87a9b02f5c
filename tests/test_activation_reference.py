"""The activation family's float64 references: gated gradients against finite differences,
clamped SwiGLU as TransformerEngine defines it, error bounds that cover an fp32 evaluation,
and the MXFP8 output check."""

from __future__ import annotations

import decimal

import numpy as np
import pytest

from nvrtc_engine import reference as ref

GATED = [*ref.GATED_ACTIVATIONS, "clamped_swiglu"]
LIMIT = 7.0


def test_sigmoid_keeps_tiny_values():
    decimal.getcontext().prec = 50
    for x in (-8.0, -20.0, -30.0):
        d = decimal.Decimal(x)
        u = decimal.Decimal("0.7978845608028654") * (d + decimal.Decimal("0.044715") * d**3)
        exact = float(d / (1 + (-2 * u).exp()))
        assert ref.gelu(np.array([x]))[0] == pytest.approx(exact, rel=1e-12)
    assert ref.sigmoid(np.array([-50.0]))[0] == pytest.approx(np.exp(-50.0), rel=1e-12)


def _inputs(rng, n=400):
    a = rng.uniform(-9, 9, n)
    b = rng.uniform(-9, 9, n)
    keep = (np.abs(a) > 1e-3) & (np.abs(a - LIMIT) > 1e-3) & (np.abs(np.abs(b) - LIMIT) > 1e-3)
    return a[keep], b[keep], rng.standard_normal(keep.sum())


@pytest.mark.parametrize("op", GATED)
def test_gated_gradients_match_finite_differences(op):
    a, b, g = _inputs(np.random.default_rng(0))
    h = 1e-6

    def loss(a_, b_):  # sum(g * f(a, b)), elementwise
        return g * ref.op_values(op, np.stack([a_, b_], -1).reshape(-1, 2), limit=LIMIT).y[:, 0]

    da_num = (loss(a + h, b) - loss(a - h, b)) / (2 * h)
    db_num = (loss(a, b + h) - loss(a, b - h)) / (2 * h)
    x = np.stack([a, b], -1).reshape(-1, 2)  # rows of [a | b] with H = 1
    got = ref.op_values("d" + op, x, g.reshape(-1, 1), limit=LIMIT).y
    np.testing.assert_allclose(got[:, 0], da_num, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[:, 1], db_num, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", sorted(ref.ACTIVATIONS))
def test_plain_gradients_match_finite_differences(op):
    # d{op}(grad, x) = grad * act'(x), against a central difference of grad * act(x)
    rng = np.random.default_rng(1)
    x = rng.uniform(-9, 9, 400)
    x = x[np.abs(x) > 1e-3]  # relu/srelu are not differentiable at 0
    g = rng.standard_normal(x.shape)
    h = 1e-6
    num = g * (ref.op_values(op, x + h).y - ref.op_values(op, x - h).y) / (2 * h)
    got = ref.op_values("d" + op, x, g).y
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-6)


def test_clamped_swiglu_as_transformer_engine():
    # forward: min(a, L) sigmoid(alpha min(a, L)) (clamp(b, -L, L) + offset)
    a = np.array([-2.0, 0.5, LIMIT, 9.0, 1.0, 1.0, 1.0])
    b = np.array([0.5, -3.0, 1.0, 1.0, LIMIT, -LIMIT, 7.5])
    c = np.minimum(a, LIMIT)
    s = 1 / (1 + np.exp(-1.702 * c))
    lin = np.clip(b, -LIMIT, LIMIT) + 1.0
    np.testing.assert_allclose(ref.clamped_swiglu(a, b, LIMIT), c * s * lin, rtol=1e-6)
    g = np.full(a.shape, 2.0)
    da, db = ref.dclamped_swiglu(g, a, b, LIMIT)
    # d/da is kept at a == limit and 0 above; d/db is kept at |b| == limit and 0 beyond
    dact = np.where(a <= LIMIT, s + s * (1 - s) * 1.702 * c, 0.0)
    np.testing.assert_allclose(da, g * dact * lin, rtol=1e-6)
    assert da[2] != 0 and da[3] == 0
    assert db[4] != 0 and db[5] != 0 and db[6] == 0
    # the parameters are fp32 values, as the kernels get them
    y = ref.clamped_swiglu(np.array([1.0]), np.array([0.1]), LIMIT, alpha=0.1)
    assert y[0] == pytest.approx(1.0 / (1 + np.exp(-float(np.float32(0.1)))) * 1.1, rel=1e-12)


def test_op_values_shapes_and_errors():
    x = np.ones((2, 3, 8))
    assert ref.op_values("gelu", x).y.shape == (2, 3, 8)
    assert ref.op_values("dgelu", x, x).y.shape == (2, 3, 8)
    assert ref.op_values("swiglu", x).y.shape == (2, 3, 4)
    assert ref.op_values("dswiglu", x, np.ones((2, 3, 4))).y.shape == (2, 3, 8)
    assert ref.op_values("dswiglu", x, np.ones((2, 3, 4))).tolerance.shape == (2, 3, 8)
    assert ref.op_kind("dclamped_swiglu") == "dgated"
    with pytest.raises(ValueError, match="needs grad"):
        ref.op_values("dsilu", x)
    with pytest.raises(ValueError, match="needs limit"):
        ref.op_values("clamped_swiglu", x, limit=None)
    with pytest.raises(ValueError, match="even last dimension"):
        ref.op_values("geglu", np.ones((2, 7)))
    with pytest.raises(KeyError):
        ref.op_kind("tanh")


# -- the error bounds cover an fp32 evaluation of the kernels' formulas ------------------------

F32 = np.float32


def _sig(z):  # the kernels' 1 / (1 + 2^(-z log2 e)), each step rounded to fp32
    with np.errstate(over="ignore"):
        t = (F32(-1.4426950408889634) * z).astype(F32)
        return (F32(1) / (F32(1) + np.exp2(t))).astype(F32)


def _fp32_act(name, x):
    if name == "gelu":
        return x * _sig(F32(2 * 0.7978845608028654) * (x + F32(0.044715) * x * x * x))
    alpha = {"qgelu": F32(1.702), "silu": F32(1), "sigmoid": F32(1)}.get(name)
    if name == "sigmoid":
        return _sig(x)
    if alpha is not None:
        return x * _sig(alpha * x)
    r = np.maximum(x, F32(0))
    return r if name == "relu" else r * r


def _fp32_dact(name, x):
    one = F32(1)
    if name == "gelu":
        s = _sig(F32(2 * 0.7978845608028654) * (x + F32(0.044715) * x * x * x))
        du = F32(0.7978845608028654) * (F32(3 * 0.044715) * x * x + one)
        return F32(2) * x * du * (s * (one - s)) + s
    if name in ("qgelu", "silu"):
        alpha = F32(1.702) if name == "qgelu" else one
        s = _sig(alpha * x)
        return alpha * x * (s * (one - s)) + s
    if name == "sigmoid":
        s = _sig(x)
        return s * (one - s)
    return (x > 0).astype(F32) if name == "relu" else F32(2) * np.maximum(x, F32(0))


def _fp32_op(op, x, g):
    kind = ref.op_kind(op)
    name = op[1:] if kind in ("dact", "dgated") else op
    if kind == "act":
        return _fp32_act(name, x)
    if kind == "dact":
        return g * _fp32_dact(name, x)
    a, b = np.split(x, 2, axis=-1)
    if name == "clamped_swiglu":
        lim, al = F32(LIMIT), F32(1.702)
        c = np.minimum(a, lim)
        s = _sig(al * c)
        lin = np.clip(b, -lim, lim) + F32(1)
        if kind == "gated":
            return c * s * lin
        dgate = np.where(a <= lim, al * c * (s * (F32(1) - s)) + s, F32(0))
        db = np.where(np.abs(b) <= lim, g * (c * s), F32(0))
        return np.concatenate([g * dgate * lin, db], -1)
    act = ref.GATED_ACTIVATIONS[name]
    if kind == "gated":
        return _fp32_act(act, a) * b
    return np.concatenate([g * _fp32_dact(act, a) * b, g * _fp32_act(act, a)], -1)


@pytest.mark.parametrize("op", list(ref.ACTIVATION_OPS))
def test_error_bounds_cover_an_fp32_evaluation(op):
    rng = np.random.default_rng(1)
    gated = ref.op_kind(op) in ("gated", "dgated")
    x = ref.sample_input((64, 192 if gated else 96), "bf16", rng).astype(F32)
    x.reshape(-1)[rng.choice(x.size, 64, replace=False)] = rng.choice([-LIMIT, LIMIT], 64)
    g = None
    if ref.op_kind(op) in ("dact", "dgated"):
        g = ref.sample_input((64, 96), "bf16", rng, outliers=4.0).astype(F32)
    want = ref.op_values(op, x, g, limit=LIMIT)
    with np.errstate(over="ignore", invalid="ignore"):
        got = _fp32_op(op, x, g).astype(F32)
    ref.check_close(got, want.y, "fp32", want.tolerance, name=op)
    ref.check_close(ref.round_to(got, "bf16"), want.y, "bf16", want.tolerance, name=op)


# -- the MXFP8 check ----------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_check_mxfp8_accepts_exact_and_catches_wrong(direction):
    rng = np.random.default_rng(2)
    y = rng.standard_normal((64, 96)) * np.exp(rng.uniform(-6, 6, (64, 1)))
    data, scales, _ = ref.mxfp8_quantize(y, "fp8_e4m3", direction)
    n, ties, boundary = ref.check_mxfp8(data, scales, y, 1e-9 * np.abs(y), "fp8_e4m3", direction)
    assert (n, ties, boundary) == (y.size, 0, 0)
    bad = scales.copy()
    bad[1, 2] += 1
    with pytest.raises(
        AssertionError, match=rf"scales: 1 of {scales.size} wrong; first at \(1, 2\)"
    ):
        ref.check_mxfp8(data, bad, y, 1e-9 * np.abs(y), "fp8_e4m3", direction)
    wrong = data.astype(np.float64)
    wrong[5, 7] = -wrong[5, 7] if wrong[5, 7] != 0 else 1.0
    with pytest.raises(AssertionError, match=r"data: 1 of .* first at \(5, 7\)"):
        ref.check_mxfp8(ref.round_to(wrong, "fp8_e4m3"), scales, y, 1e-9, "fp8_e4m3", direction)


def test_check_mxfp8_accepts_either_scale_at_a_power_of_two_boundary():
    # amax * fp32(1/448) is exactly 2^-2 at amax = 112: an fp32 amax a hair above rounds
    # the exponent up; within the tolerance both exponents are right
    y = np.zeros((1, 32))
    y[0, :] = np.linspace(1, 112, 32)
    exact = ref.e8m0_scale(np.array([112.0]), "fp8_e4m3")[0]
    above = ref.e8m0_scale(np.array([112.0 * (1 + 2**-20)]), "fp8_e4m3")[0]
    assert above == exact + 1
    for e in (exact, above):
        mult = 2.0 ** (127 - int(e))
        data = ref.round_to(y * mult, "fp8_e4m3")
        scale = np.array([[e]], np.uint8)
        assert ref.check_mxfp8(data, scale, y, 1e-4, "fp8_e4m3", "rowwise")[2] == 1
    with pytest.raises(AssertionError, match="expected .* or up to"):
        ref.check_mxfp8(data, np.array([[exact + 2]], np.uint8), y, 1e-4, "fp8_e4m3", "rowwise")
