"""nvrtc_engine.torch on a real GPU: every module's forward and backward against PyTorch's
own modules in float64 (bf16 and fp16 inputs), FP8 outputs against a float64 reference,
``torch.library.opcheck`` of every operator, a CUDA graph replay, a kernel first needed
inside a capture (a clear error, the capture intact), ``torch.compile(fullgraph=True,
mode="reduce-overhead")`` of a block, and a Llama-style MLP block trained for 50 steps with
the engine's modules against the pure-PyTorch block.

Kernels are kept by nvrtc_engine.torch across the tests of this file (the engine's caches
are emptied per test), so each compiles once per process.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import nvrtc_engine.torch as net  # noqa: E402  (needs torch, skipped above without)

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OPS = torch.ops.nvrtc_engine
# One rounding of the output (2^-8 bf16, 2^-11 fp16) plus fp32 compute: per element
# |got - ref| <= RTOL |ref| + ATOL max|ref|
TOL = {BF16: (2**-7, 2**-8), F16: (2**-9, 2**-11)}
H = 1024


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _close(got, ref, dtype, name=""):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(
        got.double(),
        ref,
        rtol=rtol,
        atol=atol * ref.abs().max().item(),
        msg=lambda m: f"{name}: {m}",
    )


def _compare(mine, theirs, x, dtype, mine_params=(), their_params=()):
    """Forward and backward of ``mine`` on x in ``dtype`` against ``theirs`` on the same
    values in float64 (``*_params``: the parameters whose gradients are compared too)."""
    xm = x.to(dtype).requires_grad_()
    x64 = xm.detach().double().requires_grad_()
    y, y64 = mine(xm), theirs(x64)
    assert y.dtype == dtype and y.shape == y64.shape
    _close(y, y64, dtype, "forward")
    g = torch.randn_like(y64).to(dtype)
    got = torch.autograd.grad(y, [xm, *mine_params], g)
    want = torch.autograd.grad(y64, [x64, *their_params], g.double())
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        _close(a, b, dtype, f"gradient {i}")


def _copy_params(mine, theirs):
    with torch.no_grad():
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            p.normal_(1.0, 0.5)
            q.copy_(p)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize(
    "kind", ["layer_norm", "layer_norm_no_bias", "rms_norm", "rms_norm_zcg", "rms_norm_fp32_weight"]
)
def test_norms_match_pytorch_in_float64(kind, dtype):
    x = torch.randn(4, 64, H, device="cuda") * 2 + 0.5
    wd = F32 if kind == "rms_norm_fp32_weight" else dtype
    if kind.startswith("layer_norm"):
        bias = kind == "layer_norm"
        mine = net.LayerNorm(H, eps=1e-5, bias=bias, device="cuda", dtype=wd)
        theirs = torch.nn.LayerNorm(H, eps=1e-5, bias=bias, device="cuda", dtype=F64)
    else:
        zcg = kind == "rms_norm_zcg"
        mine = net.RMSNorm(H, eps=1e-6, device="cuda", dtype=wd, zero_centered_gamma=zcg)
        theirs = torch.nn.RMSNorm(H, eps=1e-6, device="cuda", dtype=F64)
    _copy_params(mine, theirs)
    if kind == "rms_norm_zcg":
        with torch.no_grad():
            theirs.weight += 1
    _compare(mine, theirs, x, dtype, list(mine.parameters()), list(theirs.parameters()))


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_add_rms_norm_matches_pytorch_in_float64(dtype):
    mine = net.AddRMSNorm(H, eps=1e-6, device="cuda", dtype=dtype)
    theirs = torch.nn.RMSNorm(H, eps=1e-6, device="cuda", dtype=F64)
    _copy_params(mine, theirs)
    r = torch.randn(256, H, device="cuda").to(dtype)

    def ours(x):
        z, h = mine(x, r)
        return torch.cat([z, h], -1)

    def ref(x):
        h = x + r.double()
        return torch.cat([theirs(h), h], -1)

    _compare(ours, ref, torch.randn(256, H, device="cuda"), dtype, [mine.weight], [theirs.weight])


ACTIVATIONS = {
    net.GELU: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    net.SiLU: torch.nn.functional.silu,
    net.ReLU: torch.relu,
    net.Sigmoid: torch.sigmoid,
    net.QuickGELU: lambda x: x * torch.sigmoid(1.702 * x),
    net.SquaredReLU: lambda x: torch.relu(x) ** 2,
}
GATED = {
    net.GLU: torch.sigmoid,
    net.GEGLU: ACTIVATIONS[net.GELU],
    net.QuickGEGLU: ACTIVATIONS[net.QuickGELU],
    net.SwiGLU: torch.nn.functional.silu,
    net.ReGLU: torch.relu,
    net.SquaredReGLU: ACTIVATIONS[net.SquaredReLU],
}


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("module", list(ACTIVATIONS), ids=lambda m: m.__name__)
def test_activations_match_pytorch_in_float64(module, dtype):
    _compare(module(), ACTIVATIONS[module], torch.randn(8, 32, 512, device="cuda") * 3, dtype)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("module", [*GATED, net.ClampedSwiGLU], ids=lambda m: m.__name__)
def test_gated_activations_match_pytorch_in_float64(module, dtype):
    if module is net.ClampedSwiGLU:
        mine = net.ClampedSwiGLU(limit=4.0)

        def theirs(x):
            a = x[..., :512].clamp(max=4.0)
            return a * torch.sigmoid(1.702 * a) * (x[..., 512:].clamp(-4.0, 4.0) + 1.0)
    else:
        mine, act = module(), GATED[module]

        def theirs(x):
            return act(x[..., :512]) * x[..., 512:]

    _compare(mine, theirs, torch.randn(8, 32, 1024, device="cuda") * 3, dtype)


# -- FP8 outputs ------------------------------------------------------------------------------


def _check_fp8(out, ref, scale, amax, dtype, name):
    """``out`` (an FP8Output) holds ``ref * scale`` rounded to ``dtype`` (within one rounding
    of the fp32 value: half an FP8 step, 2^-4 (E4M3) or 2^-3 (E5M2) relative, or the
    smallest subnormal), ``amax`` is max |ref|, ``scale_inv`` is 1/scale exactly."""
    assert out.data.dtype == dtype and out.data.shape == ref.shape, name
    assert out.scale_inv.item() == 1 / scale, name
    rel = 2**-4 if dtype == E4M3 else 2**-3
    tiny = 2**-9 if dtype == E4M3 else 2**-16
    got = out.data.double() / scale
    bound = (rel * 1.01) * ref.abs() + tiny / scale + 2**-7 * ref.abs()  # + the 16-bit input
    assert ((got - ref).abs() <= bound).all(), f"{name}: {(got - ref).abs().max()}"
    assert amax.item() == pytest.approx(ref.abs().max().item(), rel=2**-7), name


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_fp8_outputs_against_float64(dtype):
    x = torch.randn(512, H, device="cuda").to(BF16)
    x64 = x.double()
    w = torch.randn(H, device="cuda").to(BF16)
    scale = 4.0
    sc = torch.full((1,), scale, device="cuda")
    with torch.no_grad():
        amax = torch.zeros(1, device="cuda")
        out = net.rms_norm_fp8(x, w, 1e-6, sc, amax, dtype)
        ref = torch.nn.functional.rms_norm(x64, (H,), w.double(), 1e-6)
        _check_fp8(out, ref, scale, amax, dtype, "rms_norm_fp8")
        amax = torch.zeros(1, device="cuda")
        out = net.layer_norm_fp8(x, w, w, 1e-5, sc, amax, dtype)
        ref = torch.nn.functional.layer_norm(x64, (H,), w.double(), w.double(), 1e-5)
        _check_fp8(out, ref, scale, amax, dtype, "layer_norm_fp8")
        amax = torch.zeros(1, device="cuda")
        out = net.activation_fp8(x, "swiglu", sc, amax, dtype)
        ref = torch.nn.functional.silu(x64[:, : H // 2]) * x64[:, H // 2 :]
        _check_fp8(out, ref, scale, amax, dtype, "swiglu fp8")
        g = torch.randn(512, H // 2, device="cuda").to(BF16)
        amax = torch.zeros(1, device="cuda")
        out = net.activation_backward_fp8(g, x, "swiglu", sc, amax, dtype)
        a, b = x64[:, : H // 2], x64[:, H // 2 :]
        s = torch.sigmoid(a)
        ref = torch.cat([g.double() * b * s * (1 + a * (1 - s)), g.double() * a * s], -1)
        _check_fp8(out, ref, scale, amax, dtype, "dswiglu fp8")
        amax = torch.zeros(1, device="cuda")
        out, data_t = net.cast_transpose_fp8(x, sc, amax, dtype)
        _check_fp8(out, x64, scale, amax, dtype, "cast_transpose_fp8")
        assert torch.equal(data_t.view(torch.uint8), out.data.t().contiguous().view(torch.uint8))
        mod = net.RMSNorm(H, eps=1e-6, device="cuda", dtype=BF16, out_dtype=dtype)
        mod.scale.fill_(scale)
        out = mod(x)
        ref = torch.nn.functional.rms_norm(x64, (H,), None, 1e-6)
        _check_fp8(out, ref, scale, mod.amax, dtype, "RMSNorm(out_dtype)")


def test_fp8_output_feeds_scaled_mm():
    x = torch.randn(256, H, device="cuda").to(BF16)
    w = (torch.randn(512, H, device="cuda") / H**0.5).to(BF16)
    one = torch.ones(1, device="cuda")
    with torch.no_grad():
        wq = net.cast_fp8(w, one, torch.zeros(1, device="cuda"))
        norm = net.RMSNorm(H, eps=1e-6, device="cuda", dtype=BF16, out_dtype=E4M3)
        q = norm(x)
        y = torch._scaled_mm(
            q.data, wq.data.t(), scale_a=q.scale_inv, scale_b=wq.scale_inv, out_dtype=BF16
        )
    ref = torch.nn.functional.rms_norm(x.double(), (H,), None, 1e-6) @ w.double().t()
    assert (y.double() - ref).abs().max() <= 0.1 * ref.abs().max()


# -- operators, CUDA graphs, torch.compile ----------------------------------------------------


def test_every_operator_passes_opcheck():
    x = torch.randn(64, 256, device="cuda", dtype=BF16, requires_grad=True)
    xd, g = x.detach(), torch.randn(64, 128, device="cuda", dtype=BF16)
    w = torch.randn(256, device="cuda", dtype=BF16, requires_grad=True)
    w32 = torch.randn(256, device="cuda", requires_grad=True)
    st = torch.rand(64, device="cuda") + 0.5
    sc, am = torch.full((1,), 2.0, device="cuda"), torch.zeros(1, device="cuda")
    cases = {
        "activation": [(x, "swiglu"), (x, "gelu"), (x, "clamped_swiglu", 3.0)],
        "activation_backward": [(g, xd, "swiglu"), (xd, xd, "silu")],
        "activation_fp8": [(xd, sc, am, "geglu", E4M3)],
        "activation_backward_fp8": [(g, xd, sc, am, "swiglu", E4M3)],
        "layer_norm": [(x, w, w, 1e-5), (x, w32, None, 1e-5, True)],
        "layer_norm_backward": [(xd, xd, st, st, w.detach())],
        "layer_norm_fp8": [(xd, w.detach(), None, 1e-5, sc, am, E4M3)],
        "rms_norm": [(x, w, 1e-6), (x, None, 1e-6)],
        "rms_norm_backward": [(xd, xd, st, w.detach(), False, xd)],
        "rms_norm_fp8": [(xd, w.detach(), 1e-6, sc, am, E5M2)],
        "add_rms_norm": [(x, xd * 2, w, 1e-6)],
        "add_rms_norm_fp8": [(xd, xd, w.detach(), 1e-6, sc, am, E4M3)],
        "cast_fp8": [(xd, sc, am, E4M3)],
        "cast_transpose_fp8": [(xd, sc, am, E4M3)],
        "transpose": [(x,)],
    }
    assert set(cases) == set(net.SCHEMAS)
    for name, calls in cases.items():
        for args in calls:
            torch.library.opcheck(getattr(OPS, name).default, args)


class Block(torch.nn.Module):
    """RMSNorm -> Linear -> SwiGLU -> Linear, residual (Llama's MLP block); ``engine``: with
    nvrtc_engine's RMSNorm and SwiGLU, else PyTorch's."""

    def __init__(self, hidden: int, inter: int, engine: bool, dtype=BF16) -> None:
        super().__init__()
        kw = dict(device="cuda", dtype=dtype)
        self.engine = engine
        self.norm = (net.RMSNorm if engine else torch.nn.RMSNorm)(hidden, eps=1e-6, **kw)
        self.up = torch.nn.Linear(hidden, 2 * inter, bias=False, **kw)
        self.down = torch.nn.Linear(inter, hidden, bias=False, **kw)
        self.act = net.SwiGLU() if engine else None
        self.inter = inter

    def forward(self, x):
        h = self.up(self.norm(x))
        a = (
            self.act(h)
            if self.engine
            else torch.nn.functional.silu(h[..., : self.inter]) * h[..., self.inter :]
        )
        return x + self.down(a)


def _train_step(model, x):
    y = model(x)
    loss = y.float().square().mean()
    grads = torch.autograd.grad(loss, [x, *model.parameters()])
    return y, grads


# torch warns that the parameters' AccumulateGrad nodes, made by the warm-up on the side stream,
# meet the capture stream: the recipe of torch.cuda.graphs' own documentation does the same
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream:UserWarning")
def test_cuda_graph_replay_of_forward_and_backward():
    model = Block(512, 768, engine=True)
    x = torch.randn(128, 512, device="cuda", dtype=BF16, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: fetches and loads every kernel
        for _ in range(2):
            _train_step(model, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, grads = _train_step(model, x)
    new = torch.randn(128, 512, device="cuda", dtype=BF16)
    with torch.no_grad():
        x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    y0, grads0 = _train_step(model, new.clone().requires_grad_())
    # (cuBLAS may pick another algorithm outside the graph: one bf16 rounding apart)
    torch.testing.assert_close(y, y0, rtol=2**-7, atol=2**-7)
    for a, b in zip(grads, grads0, strict=True):
        torch.testing.assert_close(a, b, rtol=2**-6, atol=2**-6 * b.abs().max().item())


def test_a_kernel_first_needed_inside_a_capture_is_a_clear_error():
    net.clear_kernels()
    norm = net.RMSNorm(768, device="cuda", dtype=BF16)
    x = torch.randn(32, 768, device="cuda", dtype=BF16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(RuntimeError, match="first needed while the current stream captures"),
        torch.cuda.graph(graph),
    ):
        x.mul(2)  # (a graph with no node would warn)
        norm(x)
    assert not torch.cuda.is_current_stream_capturing()
    want = torch.nn.functional.rms_norm(x.double(), (768,), norm.weight.double(), 1e-6)
    norm.eps = 1e-6
    with torch.no_grad():
        _close(norm(x), want, BF16)  # loaded now, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = norm(x)
        graph.replay()
    torch.cuda.synchronize()
    _close(y, want, BF16)


# torch.compile's inductor backend itself warns (torch.jit.script_method is deprecated, in
# torch 2.13; CUDA graph trees' performance hints): none of these tests' business
compile_warnings = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)


@compile_warnings
def test_compile_fullgraph_reduce_overhead_matches_eager():
    torch._dynamo.reset()
    model = Block(512, 768, engine=True)
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    for step in range(4):  # warm-up, CUDA graph recording, replays
        x = torch.randn(256, 512, device="cuda", dtype=BF16, requires_grad=True)
        y, grads = _train_step(compiled, x)
        y = y.clone()
        grads = [g.clone() for g in grads]
        y0, grads0 = _train_step(model, x)
        torch.testing.assert_close(y, y0, rtol=2**-7, atol=2**-6, msg=f"step {step}")
        for a, b in zip(grads, grads0, strict=True):
            torch.testing.assert_close(a, b, rtol=2**-6, atol=2**-6 * b.abs().max().item())
    torch._dynamo.reset()


@compile_warnings
def test_compile_fullgraph_fp8_inference_updates_amax():
    torch._dynamo.reset()
    norm = net.RMSNorm(512, eps=1e-6, device="cuda", dtype=BF16, out_dtype=E4M3)
    act = net.SwiGLU(out_dtype=E4M3, device="cuda")

    def f(x):
        q = norm(x)
        return q, act(q.data.to(BF16) * q.scale_inv)

    x = torch.randn(64, 512, device="cuda", dtype=BF16) * 3
    with torch.no_grad():
        eager = f(x)
        amax = (norm.amax.clone(), act.amax.clone())
        norm.amax.zero_()
        act.amax.zero_()
        compiled = torch.compile(f, fullgraph=True)(x)
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        assert torch.equal(a.scale_inv, b.scale_inv)
    assert torch.equal(norm.amax, amax[0]) and torch.equal(act.amax, amax[1])
    torch._dynamo.reset()


def test_llama_mlp_block_trains_like_pytorch():
    """50 AdamW steps of the block with the engine's modules and with PyTorch's, from the same
    weights on the same batches, fitting a random teacher block: the loss curves agree within
    bf16 tolerance (2%; on the CPU stand-ins computing in float64 they agree within 0.03%)."""
    ours, theirs = Block(256, 512, engine=True), Block(256, 512, engine=False)
    theirs.load_state_dict(ours.state_dict())
    teacher = Block(256, 512, engine=False)
    gen = torch.Generator(device="cuda")
    curves = []
    for model in (ours, theirs):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen.manual_seed(2)
        losses = []
        for _ in range(50):
            x = torch.randn(256, 256, device="cuda", generator=gen).to(BF16)
            with torch.no_grad():
                target = teacher(x)
            loss = (model(x).float() - target.float()).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    mine, ref = curves
    assert ref[-1] < 0.8 * ref[0]  # it learns
    worst = max(abs(a - b) / b for a, b in zip(mine, ref, strict=True))
    assert worst <= 0.02, (worst, mine, ref)
