"""nvrtc_engine.torch on the CPU: schemas and their mutation annotations, fake implementations
(FakeTensorMode, CUDA fakes), drop-in constructors and state_dict keys, errors before any
kernel is fetched, and, with the kernels replaced by CPU stand-ins computing the float64
references (tests/torch_standins.py), the modules' forward and backward against PyTorch's,
the modules' kept kernels, the registered autograd, opcheck of every operator, FP8 tensor
scaling, torch.func.vmap and torch.compile(fullgraph=True). The GPU tests are in
test_gpu_torch.py.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest

torch = pytest.importorskip("torch")

import torch_standins  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import nvrtc_engine as ne  # noqa: E402
import nvrtc_engine.torch as net  # noqa: E402
from nvrtc_engine.torch import _checks, _kernels  # noqa: E402

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OPS = torch.ops.nvrtc_engine


@pytest.fixture
def standins(monkeypatch):
    """The layer on CPU tensors, its kernels the stand-ins; the keys fetched, in order."""
    return torch_standins.install(monkeypatch)


@pytest.fixture
def no_fetch(monkeypatch):
    """Fail a test that fetches a kernel."""

    def load(key):
        raise AssertionError(f"fetched {key}")

    monkeypatch.setattr(_kernels, "load", load)
    monkeypatch.setattr(_kernels, "_KERNELS", {})


# -- schemas ----------------------------------------------------------------------------------


def test_every_operator_is_registered_with_its_schema():
    for name, schema in net.SCHEMAS.items():
        op = getattr(OPS, name).default
        assert op._schema == torch._C.parse_schema(f"nvrtc_engine::{name}{schema}")
        assert torch.Tag.pt2_compliant_tag in op.tags


def test_only_amax_is_mutated_and_nothing_aliases():
    for name in net.SCHEMAS:
        schema = getattr(OPS, name).default._schema
        written = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
        assert written == (["amax"] if "fp8" in name else []), name
        assert not any(r.alias_info for r in schema.returns), name


# -- fake implementations ---------------------------------------------------------------------


def _fake_cases():
    """name -> (args, the outputs' (shape, dtype)), every operator at least once."""
    x = torch.empty(4, 3, 64, device="cuda", dtype=BF16)
    m = torch.empty(12, 64, device="cuda", dtype=BF16)
    g = torch.empty(4, 3, 32, device="cuda", dtype=BF16)
    w, w32 = torch.empty(64, device="cuda", dtype=BF16), torch.empty(64, device="cuda")
    st = torch.empty(4, 3, device="cuda")
    sc, am = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")
    s = (1,)
    return {
        "activation": ((x, "swiglu"), [((4, 3, 32), BF16)]),
        "activation_backward": ((g, x, "swiglu"), [((4, 3, 64), BF16)]),
        "activation_fp8": ((x, sc, am, "gelu", E4M3), [((4, 3, 64), E4M3), (s, F32)]),
        "activation_backward_fp8": (
            (g, x, sc, am, "clamped_swiglu", E5M2, 7.0),
            [((4, 3, 64), E5M2), (s, F32)],
        ),
        "layer_norm": ((x, w32, w32, 1e-5), [((4, 3, 64), BF16), ((4, 3), F32), ((4, 3), F32)]),
        "layer_norm_backward": (
            (x, x, st, st, None),
            [((4, 3, 64), BF16), ((64,), BF16), ((64,), BF16)],
        ),
        "layer_norm_fp8": ((x, w, None, 1e-5, sc, am, E4M3), [((4, 3, 64), E4M3), (s, F32)]),
        "rms_norm": ((x, None, 1e-5), [((4, 3, 64), BF16), ((4, 3), F32)]),
        "rms_norm_backward": ((x, x, st, w32, True, x), [((4, 3, 64), BF16), ((64,), F32)]),
        "rms_norm_fp8": ((x, w, 1e-5, sc, am, E5M2), [((4, 3, 64), E5M2), (s, F32)]),
        "add_rms_norm": ((x, x, w, 1e-5), [((4, 3, 64), BF16), ((4, 3, 64), BF16), ((4, 3), F32)]),
        "add_rms_norm_fp8": (
            (x, x, w, 1e-5, sc, am, E4M3),
            [((4, 3, 64), E4M3), ((4, 3, 64), BF16), (s, F32)],
        ),
        "cast_fp8": ((x, sc, am, E4M3), [((4, 3, 64), E4M3), (s, F32)]),
        "cast_transpose_fp8": ((m, sc, am, E4M3), [((12, 64), E4M3), ((64, 12), E4M3), (s, F32)]),
        "transpose": ((m,), [((64, 12), BF16)]),
    }


def test_fake_implementations_give_shapes_and_dtypes(no_fetch):
    with FakeTensorMode(), torch.no_grad():
        cases = _fake_cases()
        assert set(cases) == set(net.SCHEMAS)
        for name, (args, want) in cases.items():
            out = getattr(OPS, name)(*args)
            out = out if isinstance(out, tuple) else (out,)
            got = [(tuple(t.shape), t.dtype) for t in out]
            assert got == want, name
            assert all(t.device == torch.device("cuda", 0) and t.is_contiguous() for t in out)


def test_modules_under_fake_tensors_take_the_operators(no_fetch):
    with FakeTensorMode(), torch.no_grad():
        x = torch.empty(2, 5, 128, device="cuda", dtype=torch.float16)
        assert net.RMSNorm(128, device="cuda", dtype=torch.float16)(x).shape == (2, 5, 128)
        y = net.LayerNorm(128, device="cuda", out_dtype=E4M3)(x)
        assert isinstance(y, net.FP8Output) and y.data.dtype == E4M3
        assert net.SwiGLU()(x).shape == (2, 5, 64)
        z, h = net.AddRMSNorm(128, device="cuda", dtype=torch.float16)(x, x)
        assert z.shape == h.shape == x.shape


def test_fake_implementations_check_the_arguments(no_fetch):
    with FakeTensorMode(), torch.no_grad():
        x = torch.empty(4, 64, device="cuda", dtype=BF16)
        with pytest.raises(ne.ArgumentTypeError, match="x: has dtype torch.float64"):
            OPS.rms_norm(x.double(), None, 1e-5)
        with pytest.raises(ne.ArgumentError, match="weight: has shape \\(32,\\)"):
            OPS.layer_norm(x, torch.empty(32, device="cuda", dtype=BF16), None, 1e-5)
        with pytest.raises(ne.ArgumentTypeError, match="weight: has dtype torch.float16"):
            OPS.rms_norm(x, torch.empty(64, device="cuda", dtype=torch.float16), 1e-5)
        with pytest.raises(ne.ArgumentError, match="x: has last dimension 63"):
            OPS.activation(torch.empty(4, 63, device="cuda", dtype=BF16), "swiglu")
        with pytest.raises(ne.ArgumentError, match="act: 'swish' is no activation"):
            OPS.activation(x, "swish")
        with pytest.raises(ne.ArgumentError, match="limit: clamped_swiglu needs"):
            OPS.activation(x, "clamped_swiglu")
        with pytest.raises(ne.ArgumentError, match="grad: has shape \\(4, 64\\)"):
            OPS.activation_backward(x, x, "geglu")
        sc = torch.ones(1, device="cuda")
        with pytest.raises(ne.ArgumentTypeError, match="out_dtype: is torch.bfloat16"):
            OPS.cast_fp8(x, sc, sc, BF16)
        with pytest.raises(ne.ArgumentTypeError, match="amax: has dtype torch.bfloat16"):
            OPS.rms_norm_fp8(x, None, 1e-5, sc, sc.to(BF16), E4M3)
        with pytest.raises(ne.ArgumentError, match="x: has shape \\(4, 1, 64\\); transpose"):
            OPS.transpose(torch.empty(4, 1, 64, device="cuda", dtype=BF16))


# -- drop-in: constructors, state_dict, parameters --------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (net.LayerNorm, torch.nn.LayerNorm),
        (net.RMSNorm, torch.nn.RMSNorm),
        (net.GELU, torch.nn.GELU),
        (net.SiLU, torch.nn.SiLU),
        (net.ReLU, torch.nn.ReLU),
        (net.Sigmoid, torch.nn.Sigmoid),
    ],
)
def test_constructor_arguments_match_pytorch(ours, theirs):
    mine = list(inspect.signature(ours).parameters.values())
    base = list(inspect.signature(theirs).parameters.values())
    if [p.kind for p in base] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        base = []  # torch.nn.Sigmoid takes nothing
    assert [p.name for p in mine[: len(base)]] == [p.name for p in base]
    for p, q in zip(mine, base, strict=False):  # the same defaults, but GELU's (tanh only)
        assert p.default == q.default or (ours is net.GELU and p.default == "tanh")
    assert all(p.kind is p.KEYWORD_ONLY for p in mine[len(base) :])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-6, "dtype": BF16}],
)
def test_layer_norm_state_dict_matches_pytorch(kwargs):
    mine, theirs = net.LayerNorm(48, **kwargs), torch.nn.LayerNorm(48, **kwargs)
    assert list(mine.state_dict()) == list(theirs.state_dict())
    mine.load_state_dict(theirs.state_dict())
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    assert mine.normalized_shape == theirs.normalized_shape == (48,)


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-6}])
def test_rms_norm_state_dict_matches_pytorch(kwargs):
    for ours in (net.RMSNorm, net.AddRMSNorm):
        mine, theirs = ours(48, **kwargs), torch.nn.RMSNorm(48, **kwargs)
        assert list(mine.state_dict()) == list(theirs.state_dict())
        mine.load_state_dict(theirs.state_dict())


def test_reset_parameters_and_zero_centered_gamma():
    m = net.LayerNorm(16)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(16)) and torch.equal(m.bias, torch.zeros(16))
    z = net.RMSNorm(16, zero_centered_gamma=True)
    assert torch.equal(z.weight, torch.zeros(16))  # the weight applied is weight + 1
    assert "zero_centered_gamma=True" in repr(z)


def test_fp8_buffers_follow_the_device_and_keep_float32():
    m = net.RMSNorm(16, out_dtype=E4M3).to(BF16)
    assert m.weight.dtype == BF16
    assert m.scale.dtype == m.amax.dtype == F32 and m.scale.item() == 1.0
    assert list(m.state_dict()) == ["weight"]  # PyTorch's checkpoints load
    assert net.SwiGLU(out_dtype=E5M2).half().amax.dtype == F32


# -- bad input: errors before any kernel is fetched -------------------------------------------


def test_cpu_tensors_are_refused_before_any_fetch(no_fetch):
    x = torch.randn(4, 32)
    calls = [
        (net.RMSNorm(32), (x,)),
        (net.LayerNorm(32), (x,)),
        (net.GELU(), (x,)),
        (net.SwiGLU(), (x,)),
        (net.AddRMSNorm(32), (x, x)),
    ]
    for module, args in calls:
        with pytest.raises(ne.ArgumentError, match="x: is a cpu tensor; .* runs on cuda tensors"):
            module(*args)
    with pytest.raises(ne.ArgumentError, match="x: is a cpu tensor"):
        OPS.rms_norm(x, None, 1e-5)  # the operators' CPU implementation: the same check
    assert _kernels._KERNELS == {}


def test_bad_arguments_are_typed_errors_naming_them(no_fetch):
    with pytest.raises(
        ne.ArgumentError,
        match="x: has shape \\(4, 32\\); RMSNorm with "
        "normalized_shape=\\(64,\\) takes \\(..., 64\\)",
    ):
        net.RMSNorm(64)(torch.randn(4, 32))
    with pytest.raises(ne.ArgumentTypeError, match="x: expected a torch.Tensor, got list"):
        net.LayerNorm(64)([1.0] * 64)
    with pytest.raises(ne.ArgumentTypeError, match="x: expected a torch.Tensor, got ndarray"):
        net.SiLU()(torch.randn(3).numpy())
    with pytest.raises(ne.ArgumentError, match="normalized_shape: is \\(4, 8\\)"):
        net.LayerNorm((4, 8))
    with pytest.raises(ne.ArgumentError, match="approximate: is 'none'"):
        net.GELU(approximate="none")
    with pytest.raises(ne.ArgumentError, match="limit: must be finite and > 0, got -1.0"):
        net.ClampedSwiGLU(-1.0)
    with pytest.raises(ne.ArgumentTypeError, match="alpha: must be a real number, got '1'"):
        net.ClampedSwiGLU(7.0, alpha="1")
    with pytest.raises(ne.ArgumentError, match="inplace: must be False"):
        net.ReLU(inplace=True)
    with pytest.raises(ne.ArgumentTypeError, match="out_dtype: is torch.float16"):
        net.RMSNorm(8, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="normalized_shape: is 0; the size must be >= 1") as e:
        net.RMSNorm(0)
    assert isinstance(e.value, ne.ArgumentError)


def test_bad_dtypes_and_shapes_on_the_eager_path(standins):
    x = torch.randn(4, 64, dtype=F64)
    with pytest.raises(ne.ArgumentTypeError, match="x: has dtype torch.float64"):
        net.rms_norm(x)
    with pytest.raises(
        ne.ArgumentTypeError, match="weight: has dtype torch.float16; for x of torch.float32"
    ):
        net.layer_norm(x.float(), torch.ones(64, dtype=torch.float16))
    with pytest.raises(ne.ArgumentError, match="residual: has shape \\(4, 32\\)"):
        net.add_rms_norm(x.float(), torch.randn(4, 32))
    with pytest.raises(ne.ArgumentError, match="x: has shape \\(4, 3, 64\\); transpose takes"):
        net.transpose(torch.randn(4, 3, 64))
    assert standins == []


def test_a_module_checks_each_new_input_then_looks_its_kernel_up(standins, monkeypatch):
    """A module's eager call: the first call of an input's (dtype, hidden size, device) runs
    every check and finds its kernel (fetched once per process); later calls of the same
    find it with one lookup (no check); an input that differs is checked again, with the
    module's errors."""
    m = net.RMSNorm(64)
    x = torch.randn(4, 64, requires_grad=True)
    m(x)
    with pytest.raises(ne.ArgumentError, match="x: has shape \\(4, 32\\); RMSNorm with"):
        m(torch.randn(4, 32))
    with pytest.raises(ne.ArgumentTypeError, match="x: has dtype torch.float64; rms_norm takes"):
        m(torch.randn(4, 64, dtype=F64))
    with pytest.raises(ne.ArgumentError, match="x: is a 0-dimensional tensor"):
        net.SwiGLU()(torch.tensor(1.0))
    with pytest.raises(ne.ArgumentTypeError, match="weight: has dtype torch.float16; for x of"):
        net.RMSNorm(64, dtype=torch.float16)(torch.randn(4, 64, dtype=BF16))
    checked = []
    for name in ("norm_weights", "activation"):
        monkeypatch.setattr(_checks, name, lambda *args: checked.append(args))
    act = net.SwiGLU()
    act(torch.randn(2, 64))
    assert len(checked) == 1 and len(standins) == 2
    for _ in range(3):
        m(x)
        with torch.no_grad():
            m(torch.randn(9, 64))  # another number of rows: the same kernel
        act(torch.randn(5, 64, requires_grad=True))
    assert len(checked) == 1 and [k[0] for k in standins] == ["rmsnorm_fwd", "swiglu"]
    m(torch.randn(4, 64, dtype=BF16))
    assert len(checked) == 2 and standins[-1][:2] == ("rmsnorm_fwd", BF16)
    net.RMSNorm(64)(x)  # another module: its first call is checked; the kernel is kept
    assert len(checked) == 3 and len(standins) == 3


def test_a_modules_kept_kernels_are_its_process_own(standins):
    """A module's kernels are not copied or pickled with it (they are loaded in one process),
    and clear_kernels() forgets them."""
    m = net.LayerNorm(64)
    m(torch.randn(2, 64))
    assert len(m._kernel_cache) == 1
    assert len(copy.deepcopy(m)._kernel_cache) == 0
    again = pickle.loads(pickle.dumps(m))
    assert len(again._kernel_cache) == 0 and torch.equal(again.weight, m.weight)
    again(torch.randn(2, 64))
    net.clear_kernels()
    assert len(m._kernel_cache) == len(again._kernel_cache) == 0


def test_a_parametrized_weight_is_the_weight_applied(standins):
    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    mine, theirs = net.RMSNorm(32, eps=1e-6), torch.nn.RMSNorm(32, eps=1e-6, dtype=F64)
    torch.nn.utils.parametrize.register_parametrization(mine, "weight", Doubled())
    original = mine.parametrizations.weight.original
    with torch.no_grad():
        original.normal_()
        theirs.weight.copy_(2 * original)
    x = torch.randn(5, 32, dtype=F64)
    _check_against(mine, theirs, x, [], [])
    (got,) = _grads(mine(x.float()), [original])
    (want,) = _grads(theirs(x), [theirs.weight])
    _close(got, 2 * want, rtol=1e-4, atol=1e-5)  # (d/d original = 2 d/d weight)


def test_vmap_goes_through_the_operators(standins):
    """Under torch.func transforms (whose tensors have no storage) calls take the operators;
    vmap then runs them per sample (PyTorch's fallback)."""
    norm, act = net.RMSNorm(32), net.SwiGLU()
    x = torch.randn(3, 4, 64)
    with torch.no_grad():
        torch.testing.assert_close(torch.func.vmap(act)(x), act(x), rtol=0, atol=0)
        y = x[..., :32]
        torch.testing.assert_close(torch.func.vmap(norm)(y), norm(y), rtol=0, atol=0)


def test_fp8_outputs_refuse_gradients(standins):
    x = torch.randn(4, 64, requires_grad=True)
    sc, am = torch.ones(1), torch.zeros(1)
    with pytest.raises(RuntimeError, match="rms_norm_fp8: an FP8 output has no backward"):
        net.rms_norm_fp8(x, None, 1e-5, sc, am)
    with torch.no_grad():
        assert net.rms_norm_fp8(x, None, 1e-5, sc, am).data.dtype == E4M3


# -- with the CPU stand-ins: values and gradients against PyTorch ------------------------------


def _close(got, want, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(got.to(F64), want.to(F64), rtol=rtol, atol=atol)


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return torch.autograd.grad(out, inputs, g.to(out.dtype))


def _check_against(mine, theirs, x, params_mine, params_theirs):
    """Forward and backward of ``mine`` (float32, stand-ins) and ``theirs`` (float64)."""
    x32 = x.float().requires_grad_()
    x64 = x.double().requires_grad_()
    y, y64 = mine(x32), theirs(x64)
    _close(y, y64)
    for a, b in zip(
        _grads(y, [x32, *params_mine]), _grads(y64, [x64, *params_theirs]), strict=True
    ):
        _close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_pytorch(standins, bias):
    mine = net.LayerNorm(64, eps=1e-4, bias=bias)
    theirs = torch.nn.LayerNorm(64, eps=1e-4, bias=bias, dtype=F64)
    with torch.no_grad():
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            p.normal_()
            q.copy_(p)
    x = torch.randn(3, 5, 64, dtype=F64) * 3 + 1
    _check_against(mine, theirs, x, list(mine.parameters()), list(theirs.parameters()))
    assert [k[0] for k in standins] == ["layernorm_fwd", "layernorm_bwd"]


def test_rms_norm_matches_pytorch_and_fetches_once(standins):
    mine, theirs = net.RMSNorm(64, eps=1e-6), torch.nn.RMSNorm(64, eps=1e-6, dtype=F64)
    with torch.no_grad():
        mine.weight.normal_()
        theirs.weight.copy_(mine.weight)
    for _ in range(3):
        _check_against(mine, theirs, torch.randn(7, 64, dtype=F64), [mine.weight], [theirs.weight])
    assert standins == [
        ("rmsnorm_fwd", F32, None, 64, -1, ()),
        ("rmsnorm_bwd", F32, None, 64, -1, ()),
    ]
    assert _kernels._KERNELS[standins[0]].calls == 3


def test_rms_norm_defaults_zero_centered_gamma_and_no_weight(standins):
    x = torch.randn(6, 32, dtype=F64)
    mine = net.RMSNorm(32, zero_centered_gamma=True)
    with torch.no_grad():
        mine.weight.normal_()
    theirs = torch.nn.RMSNorm(32, dtype=F64)  # eps=None: finfo(float32).eps in both
    with torch.no_grad():
        theirs.weight.copy_(mine.weight + 1)
    mine.eps, theirs.eps = None, torch.finfo(F32).eps
    _check_against(mine, theirs, x, [mine.weight], [theirs.weight])
    plain = net.RMSNorm(32, elementwise_affine=False)
    _check_against(
        plain, torch.nn.RMSNorm(32, eps=torch.finfo(F32).eps, elementwise_affine=False), x, [], []
    )
    assert ("zero_centered_gamma", True) in standins[0][-1]


def test_fp32_weights_with_16_bit_input_keep_the_input_dtype(standins):
    m = net.LayerNorm(64)  # float32 parameters
    x = torch.randn(4, 64, dtype=BF16, requires_grad=True)
    y = m(x)
    assert y.dtype == BF16
    y.float().sum().backward()
    assert m.weight.grad.dtype == F32 and x.grad.dtype == BF16
    assert standins[0] == ("layernorm_fwd", BF16, None, 64, -1, (("fp32_gamma", True),))


ACTIVATIONS = {
    "gelu": (net.GELU, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    "silu": (net.SiLU, torch.nn.functional.silu),
    "relu": (net.ReLU, torch.relu),
    "sigmoid": (net.Sigmoid, torch.sigmoid),
    "qgelu": (net.QuickGELU, lambda x: x * torch.sigmoid(1.702 * x)),
    "srelu": (net.SquaredReLU, lambda x: torch.relu(x) ** 2),
}
GATED = {
    "glu": (net.GLU, torch.sigmoid),
    "geglu": (net.GEGLU, ACTIVATIONS["gelu"][1]),
    "qgeglu": (net.QuickGEGLU, ACTIVATIONS["qgelu"][1]),
    "swiglu": (net.SwiGLU, torch.nn.functional.silu),
    "reglu": (net.ReGLU, torch.relu),
    "sreglu": (net.SquaredReGLU, ACTIVATIONS["srelu"][1]),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_match_pytorch(standins, name):
    module, fn = ACTIVATIONS[name]
    x = torch.randn(4, 3, 40, dtype=F64) * 2
    _check_against(module(), fn, x, [], [])
    assert [k[0] for k in standins] == [name, "d" + name]


@pytest.mark.parametrize("name", sorted(GATED))
def test_gated_activations_match_pytorch(standins, name):
    module, fn = GATED[name]
    x = torch.randn(4, 3, 80, dtype=F64) * 2
    _check_against(module(), lambda x: fn(x[..., :40]) * x[..., 40:], x, [], [])
    assert [k[:4] for k in standins] == [(name, F32, None, 40), ("d" + name, F32, None, 40)]


def test_clamped_swiglu_matches_its_formula(standins):
    def clamped(x, limit=3.0, alpha=1.5, offset=0.5):
        a = x[..., :16].clamp(max=limit)
        return a * torch.sigmoid(alpha * a) * (x[..., 16:].clamp(-limit, limit) + offset)

    x = torch.randn(5, 32, dtype=F64) * 3
    _check_against(net.ClampedSwiGLU(3.0, 1.5, 0.5), clamped, x, [], [])


def test_torch_nn_glu_is_the_other_half():
    x = torch.randn(3, 8)
    a, b = x[:, :4], x[:, 4:]
    torch.testing.assert_close(torch.nn.GLU()(torch.cat([b, a], -1)), torch.sigmoid(a) * b)


def test_add_rms_norm_matches_the_residual_add_and_norm(standins):
    m = net.AddRMSNorm(32, eps=1e-5)
    with torch.no_grad():
        m.weight.normal_()
    ref = torch.nn.RMSNorm(32, eps=1e-5, dtype=F64)
    with torch.no_grad():
        ref.weight.copy_(m.weight)
    x, r = torch.randn(2, 6, 32, dtype=F64), torch.randn(2, 6, 32, dtype=F64)
    xs = [x.float().requires_grad_(), r.float().requires_grad_()]
    xd = [x.clone().requires_grad_(), r.clone().requires_grad_()]
    z, h = m(*xs)
    h64 = xd[0] + xd[1]
    z64 = ref(h64)
    _close(z, z64)
    _close(h, h64)
    # a loss through both outputs: h's gradient is added into the norm's (rmsnorm_bwd_add)
    mine = _grads(z.sum() * 0 + (z * 2).sum() + (h**2).sum(), [*xs, m.weight])
    theirs = _grads((z64 * 2).sum() + (h64**2).sum(), [*xd, ref.weight])
    for a, b in zip(mine, theirs, strict=True):
        _close(a, b, rtol=1e-4, atol=1e-5)
    assert [k[0] for k in standins] == ["rmsnorm_fwd", "rmsnorm_bwd_add"]
    # only z used: the plain backward
    z, _ = m(*xs)
    _grads(z, xs)
    assert standins[-1][0] == "rmsnorm_bwd"


def test_registered_autograd_matches_the_eager_path(standins):
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    r = torch.randn(4, 64, requires_grad=True)
    cases = [
        (
            lambda: OPS.layer_norm(x, w, b, 1e-5, True)[0],
            lambda: net.layer_norm(x, w, b, 1e-5, zero_centered_gamma=True),
            [x, w, b],
        ),
        (lambda: OPS.rms_norm(x, w, 1e-5)[0], lambda: net.rms_norm(x, w, 1e-5), [x, w]),
        (
            lambda: sum(OPS.add_rms_norm(x, r, w, 1e-5)[:2]),
            lambda: sum(net.add_rms_norm(x, r, w, 1e-5)),
            [x, r, w],
        ),
        (lambda: OPS.activation(x, "geglu"), lambda: net.activation(x, "geglu"), [x]),
        (
            lambda: OPS.activation(x, "clamped_swiglu", 2.0),
            lambda: net.activation(x, "clamped_swiglu", limit=2.0),
            [x],
        ),
        (lambda: OPS.transpose(x), lambda: net.transpose(x), [x]),
    ]
    for through_op, eager, inputs in cases:
        a, b_ = through_op(), eager()
        torch.testing.assert_close(a, b_, rtol=0, atol=0)
        for ga, gb in zip(_grads(a, inputs), _grads(b_, inputs), strict=True):
            torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_the_c_apply_makes_the_public_applys_node_and_gradients(standins):
    """The eager path's C apply (_eager._direct) against each Function's public apply: the
    same node type, inputs' edges, outputs and gradients."""
    from nvrtc_engine.torch import _eager

    x = torch.randn(4, 64, requires_grad=True)
    w, b = torch.randn(64, requires_grad=True), torch.randn(64, requires_grad=True)
    r = torch.randn(4, 64, requires_grad=True)
    cases = [
        (_eager._LayerNorm, (x, w, b, 1e-5, True, None), [x, w, b]),
        (_eager._RMSNorm, (x, w, 1e-5, False, None), [x, w]),
        (_eager._AddRMSNorm, (x, r, w, 1e-5, False, None), [x, r, w]),
        (_eager._Activation, (x, "geglu", None, 1.702, 1.0, None), [x]),
        (_eager._Transpose, (x,), [x]),
    ]
    for fn, args, inputs in cases:
        direct = _eager._direct(fn)
        assert direct is not fn.apply  # (this PyTorch has the C apply)
        got, want = direct(*args), fn.apply(*args)
        got1, want1 = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, e in zip(got1, want1, strict=True):
            assert type(g.grad_fn) is type(e.grad_fn) and g.grad_fn.name() == e.grad_fn.name()
            assert g.grad_fn.next_functions == e.grad_fn.next_functions
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        out_g, out_e = sum(t.sum() for t in got1), sum(t.sum() for t in want1)
        for ga, ge in zip(_grads(out_g, inputs), _grads(out_e, inputs), strict=True):
            torch.testing.assert_close(ga, ge, rtol=0, atol=0)


def test_torch_func_transforms_never_reach_the_c_apply(standins, monkeypatch):
    """Under a torch.func transform (vmap here) no eager Function is applied (their C apply
    skips functorch's wrapping): the registered operators run."""
    from nvrtc_engine.torch import _eager

    def refuse(*args):
        raise AssertionError("an eager Function under a torch.func transform")

    for name in ("_layer_norm", "_rms_norm", "_add_rms_norm", "_activation", "_transpose"):
        monkeypatch.setattr(_eager, name, refuse)
    norm, act = net.RMSNorm(32), net.SwiGLU()
    x = torch.randn(3, 4, 64, requires_grad=True)
    with torch.no_grad():
        want = act(x), norm(x[..., :32])
    torch.testing.assert_close(torch.func.vmap(act)(x), want[0], rtol=0, atol=0)
    torch.testing.assert_close(torch.func.vmap(norm)(x[..., :32]), want[1], rtol=0, atol=0)


def test_no_grad_path_and_non_contiguous_input(standins):
    x = torch.randn(64, 8).t()  # (8, 64), not contiguous
    with torch.no_grad():
        y = net.RMSNorm(64)(x)
    assert y.grad_fn is None
    _close(y, torch.nn.RMSNorm(64)(x))
    assert [k[0] for k in standins] == ["rmsnorm_fwd"]  # no backward kernel fetched


def test_fp8_tensor_scaling(standins):
    x = torch.randn(8, 64) * 4
    m = net.RMSNorm(64, eps=1e-6, out_dtype=E4M3)
    m.scale.fill_(8.0)
    with torch.no_grad():
        out = m(x)
    y = torch.nn.RMSNorm(64, eps=1e-6)(x)
    assert out.data.dtype == E4M3 and out.scale_inv.item() == 1 / 8
    assert m.amax.item() == pytest.approx(y.abs().max().item(), rel=1e-6)
    torch.testing.assert_close(out.data.float() * out.scale_inv, y, rtol=2**-3, atol=2**-9)
    before = m.amax.clone()
    with torch.no_grad():
        m(x / 2)  # a smaller amax leaves the running max
    assert torch.equal(m.amax, before)
    q, h = net.AddRMSNorm(64, out_dtype=E5M2).requires_grad_(False)(x, x)
    assert q.data.dtype == E5M2 and torch.equal(h, x + x)
    with torch.no_grad():
        g = net.SwiGLU(out_dtype=E4M3)(torch.randn(8, 128))
    assert g.data.shape == (8, 64)
    am = torch.zeros(1)
    (q, scale_inv), qt = net.cast_transpose_fp8(x, torch.full((1,), 2.0), am)
    assert torch.equal(qt, q.t().contiguous()) and scale_inv.item() == 0.5
    assert am.item() == x.abs().max().item()


def test_a_kernel_fetched_for_one_device_never_gets_another_devices_tensors(standins, monkeypatch):
    """The layer keeps a kernel per device: the same modules and calls on device 0's tensors,
    then on device 1's (every CPU tensor saying it is on that device), fetch every kernel
    again for device 1 (a module keeps its kernels per device), and each stand-in checks that
    the tensors it is given are on its device; a second round fetches nothing."""
    device = [0]
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: device[0])
    modules = [net.LayerNorm(64), net.RMSNorm(64), net.AddRMSNorm(64), net.SwiGLU(), net.GELU()]
    rms_fp8 = net.RMSNorm(64, out_dtype=E4M3)
    ln, rms, add, swiglu, gelu = modules
    params = [p for m in modules for p in m.parameters()]
    counts = []
    for device[0] in (0, 1, 0, 1):
        x, h, r = (torch.randn(4, n, requires_grad=True) for n in (64, 128, 64))
        outs = [ln(x), rms(x), *add(x, r), swiglu(h), gelu(x), net.transpose(x)]
        torch.autograd.grad(sum(o.sum() for o in outs), [x, h, r, *params])
        with torch.no_grad():
            scale, amax = torch.full((1,), 2.0), torch.zeros(1)
            rms_fp8(x)
            net.layer_norm_fp8(x, ln.weight, ln.bias, 1e-5, scale, amax, E5M2)
            net.activation_fp8(h, "swiglu", scale, amax, E4M3)
            net.cast_transpose_fp8(x, scale, amax)
        counts.append(len(standins))
    fetched = {d: sorted((k[:4] + k[5:] for k in standins if k[4] == d), key=str) for d in (0, 1)}
    assert {k[4] for k in standins} == {0, 1} and counts[1:] == [2 * counts[0]] * 3
    assert fetched[0] == fetched[1] and len(fetched[0]) == counts[0] >= 12, fetched


def test_every_operator_passes_opcheck(standins):
    x, g = torch.randn(6, 64, requires_grad=True), torch.randn(6, 32)
    w, st = torch.randn(64, requires_grad=True), torch.rand(6) + 0.5
    sc, am = torch.full((1,), 2.0), torch.zeros(1)
    cases = {
        "activation": [(x, "swiglu"), (x, "gelu"), (x, "clamped_swiglu", 3.0, 1.0, 0.5)],
        "activation_backward": [(g, x.detach(), "swiglu"), (x.detach(), x.detach(), "srelu")],
        "activation_fp8": [(x.detach(), sc, am, "reglu", E4M3)],
        "activation_backward_fp8": [(g, x.detach(), sc, am, "geglu", E5M2)],
        "layer_norm": [(x, w, w, 1e-5), (x, None, None, 1e-3, True)],
        "layer_norm_backward": [(x.detach(), x.detach(), st, st, w.detach())],
        "layer_norm_fp8": [(x.detach(), w.detach(), None, 1e-5, sc, am, E4M3)],
        "rms_norm": [(x, w, 1e-5, True), (x, None, 1e-5)],
        "rms_norm_backward": [(x.detach(), x.detach(), st, w.detach(), False, x.detach())],
        "rms_norm_fp8": [(x.detach(), None, 1e-5, sc, am, E5M2)],
        "add_rms_norm": [(x, x.detach() * 2, w, 1e-5)],
        "add_rms_norm_fp8": [(x.detach(), x.detach(), w.detach(), 1e-5, sc, am, E4M3)],
        "cast_fp8": [(x.detach(), sc, am, E4M3)],
        "cast_transpose_fp8": [(x.detach(), sc, am, E5M2)],
        "transpose": [(x,)],
    }
    assert set(cases) == set(net.SCHEMAS)
    for name, calls in cases.items():
        for args in calls:
            torch.library.opcheck(getattr(OPS, name).default, args)


def test_compile_fullgraph_without_graph_breaks(standins):
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = net.RMSNorm(32, eps=1e-6)
            self.up = torch.nn.Linear(32, 96, bias=False)
            self.act = net.SwiGLU()
            self.down = torch.nn.Linear(48, 32, bias=False)
            self.ln = net.LayerNorm(32)
            self.add = net.AddRMSNorm(32)

        def forward(self, x):
            y = x + self.down(self.act(self.up(self.norm(x))))
            z, h = self.add(self.ln(y), x)
            return net.transpose(z + h)

    torch.manual_seed(0)
    block = Block()
    x = torch.randn(8, 32, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        y = compiled(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
    y0 = block(x)
    (gx0,) = torch.autograd.grad(y0.square().sum(), x)
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    torch.testing.assert_close(gx, gx0, rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
