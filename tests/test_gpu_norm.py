"""LayerNorm/RMSNorm on a real GPU against the float64 references: every dtype and output mode
(FP8 tensor-scaled, MXFP8), zero-centred and fp32 gamma, odd hidden sizes, large mean offsets,
N = 1, H = 65536 (thread block clusters on sm_90), specialized vs general kernels, backward
determinism, unaligned pointers, and errors raised before launch.

Tolerances are the per-element error bounds of :mod:`nvrtc_engine.reference.norm`; outputs
must equal the rounding of a value within that bound of the float64 result.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from test_gpu_gelu import poisoned, to_host, to_torch

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, reference
from nvrtc_engine.ops.blockscale import mxfp8_scale_shape
from nvrtc_engine.ops.norm import gamma_dtype, launch_config
from nvrtc_engine.ops.norm_switches import TUNED
from nvrtc_engine.reference.mx import e8m0_multiplier, e8m0_scale

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

DTYPES = ["fp32", "fp16", "bf16"]
MODES = [("same", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor"),
         ("fp8_e4m3", "mxfp8"), ("fp8_e5m2", "mxfp8")]  # fmt: skip
EPS = 1e-5


def seed(*parts) -> np.random.Generator:
    """A generator seeded from ``parts`` the same way in every process."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def params(rng, hidden, w_dtype, zcg):
    """gamma near 1 (near 0 when zero-centred) and beta, in gamma's dtype."""
    gamma = rng.standard_normal(hidden) * 0.5 + (0.0 if zcg else 1.0)
    beta = rng.standard_normal(hidden) * 0.5
    d = ne.DTYPES[w_dtype].numpy()
    return gamma.astype(d), beta.astype(d)


def check(got, expected, dtype, tolerance, name, max_ties=1 / 50):
    """``got`` within ``tolerance`` of ``expected`` rounded to ``dtype``; at most a fraction
    ``max_ties`` of the elements (or 4) have a bound that straddles a rounding boundary."""
    n, at_ties = reference.check_close(got, expected, dtype, tolerance, name=name)
    if dtype != "fp32":  # ties: elements whose bound straddles a rounding boundary
        assert at_ties <= max(4, int(n * max_ties)), f"{name}: {at_ties} of {n} elements at ties"


def check_mxfp8(data, scales, z, z_tol, out_dtype, max_ties=1 / 50):
    """MXFP8 rowwise: E8M0 scales equal the reference's except where the block amax is within
    its error bound of a power-of-two boundary; data checked with the kernel's own scales;
    scale padding zero."""
    rows, hidden = z.shape
    nb = -(-hidden // 32)
    assert scales.shape == mxfp8_scale_shape(rows, hidden, "rowwise")
    got = scales[:rows, :nb]
    _, want, _ = reference.mxfp8_quantize(z, out_dtype, "rowwise")
    pad = np.zeros((rows, nb * 32))
    pad[:, :hidden] = np.abs(z)
    amax = pad.reshape(rows, nb, 32).max(axis=2)
    tpad = np.zeros((rows, nb * 32))
    tpad[:, :hidden] = z_tol
    amax_tol = tpad.reshape(rows, nb, 32).max(axis=2)
    differ = got != want
    if differ.any():
        lo = e8m0_scale(np.maximum(amax - amax_tol, 0.0), out_dtype)
        hi = e8m0_scale(amax + amax_tol, out_dtype)
        assert np.all((got[differ] >= lo[differ]) & (got[differ] <= hi[differ])), (
            f"{int(differ.sum())} MXFP8 scales differ from the reference beyond the boundary case"
        )
    assert not scales[rows:].any() and not scales[:, nb:].any(), "scale padding not zero"
    mult = np.repeat(e8m0_multiplier(got), 32, axis=1)[:, :hidden]
    check(data, z * mult, out_dtype, z_tol * mult, "z (mxfp8)", max_ties)


def run_forward(
    kernel, x_host, *, zcg=None, scale=3.0, x=None, eps=EPS, max_ties=1 / 50, stats=False
):
    """Launch a forward kernel on poisoned outputs and check every output (``max_ties``: see
    :func:`check`, for z); returns z and the reference, and with ``stats`` also mu (None for
    RMSNorm) and rsigma as the kernel wrote them."""
    key = kernel.key
    rms = key.op == "rmsnorm_fwd"
    zcg = key.flag("zero_centered_gamma") if zcg is None else zcg
    rows, hidden = x_host.shape
    w_dtype = gamma_dtype(key)
    gamma_host, beta_host = params(seed(key.op, hidden, w_dtype), hidden, w_dtype, zcg)
    x = to_torch(x_host, key.in_dtype) if x is None else x
    gamma, beta = to_torch(gamma_host, w_dtype), to_torch(beta_host, w_dtype)
    out = poisoned((rows, hidden), key.out_dtype)
    mu, rsigma = poisoned((rows,), "fp32"), poisoned((rows,), "fp32")
    kwargs = {}
    if key.scaling == "tensor":
        kwargs = {"scale": torch.full((1,), scale, device="cuda"),
                  "amax": torch.zeros(1, device="cuda"),
                  "scale_inv": torch.full((1,), float("nan"), device="cuda")}  # fmt: skip
    elif key.scaling == "mxfp8":
        shape = mxfp8_scale_shape(rows, hidden, "rowwise")
        kwargs = {"scale_inv": torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda")}
    if rms:
        res = kernel(x, gamma, eps, out, rsigma, **kwargs)
        assert res.z is out and res.rsigma is rsigma
        ref = reference.rmsnorm_fwd(x_host, gamma_host, eps, zero_centered_gamma=zcg)
    else:
        res = kernel(x, gamma, beta, eps, out, mu, rsigma, **kwargs)
        assert res.z is out and res.mu is mu and res.rsigma is rsigma
        shift = np.asarray(x_host, np.float64)[:, 0] if kernel.config.shifted else None
        ref = reference.layernorm_fwd(x_host, gamma_host, beta_host, eps, zero_centered_gamma=zcg,
                                      shift=shift)  # fmt: skip
    torch.cuda.synchronize()
    check(to_host(rsigma, "fp32"), ref.rsigma, "fp32", ref.rsigma_tol, "rsigma")
    if not rms:
        check(to_host(mu, "fp32"), ref.mu, "fp32", ref.mu_tol, "mu")
    z_got = to_host(out, key.out_dtype)
    if key.scaling == "none":
        check(z_got, ref.z, key.out_dtype, ref.z_tol, "z", max_ties)
    elif key.scaling == "tensor":
        s = np.float64(np.float32(scale))
        check(z_got, ref.z * s, key.out_dtype, ref.z_tol * s, "z (tensor-scaled)", max_ties)
        amax = np.abs(ref.z).max()
        assert abs(kwargs["amax"].item() - amax) <= ref.z_tol.max(), "amax"
        assert kwargs["scale_inv"].item() == float(np.float32(1.0) / np.float32(scale))
    else:
        assert res.scale_inv is kwargs["scale_inv"]
        check_mxfp8(z_got, kwargs["scale_inv"].cpu().numpy(), ref.z, ref.z_tol, key.out_dtype,
                    max_ties)  # fmt: skip
    return (out, ref, None if rms else mu, rsigma) if stats else (out, ref)


def unaligned_bf16(x_host):
    """x_host as a bf16 CUDA tensor one element past a 16-byte boundary (the kernels'
    element-by-element path)."""
    rows, hidden = x_host.shape
    flat = torch.empty(rows * hidden + 1, dtype=torch.bfloat16, device="cuda")
    x = flat[1:].view(rows, hidden)
    x.copy_(to_torch(x_host, "bf16"))
    return x


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.mark.parametrize("hidden", [1000, None], ids=["h1000", "general"])
@pytest.mark.parametrize(("out", "scaling"), MODES, ids=lambda v: str(v))
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_every_dtype_and_output_mode(op, in_dtype, out, scaling, hidden):
    out_dtype = in_dtype if out == "same" else out
    kernel = ne.get_kernel(op, in_dtype=in_dtype, out_dtype=out_dtype, scaling=scaling,
                           hidden_size=hidden)  # fmt: skip
    x_host = reference.sample_input((37, 1000), in_dtype, seed(op, in_dtype, out, scaling))
    run_forward(kernel, x_host)


HIDDEN = [64, 100, 768, 1001, 4096, 5120, 8192, 14336, 16384, 65536]


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_hidden_sizes_specialized_and_general(op, hidden):
    rows = 8 if hidden >= 16384 else 67
    x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden))
    special = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
    general = ne.get_kernel(op, in_dtype="bf16")
    a, _ = run_forward(special, x_host)
    b, _ = run_forward(general, x_host)
    # both within the bound of the reference; they may differ only where it allows
    diff = to_host(a, "bf16").astype(np.float64) - to_host(b, "bf16").astype(np.float64)
    assert np.mean(diff != 0) <= 0.02


@pytest.mark.parametrize("hidden", [1000, 65536])
def test_forward_fp8_from_fp32_at_large_hidden(hidden):
    for out, scaling in MODES[1:]:
        kernel = ne.get_kernel("layernorm_fwd", in_dtype="fp32", out_dtype=out, scaling=scaling,
                               hidden_size=hidden)  # fmt: skip
        run_forward(kernel, reference.sample_input((5, hidden), "fp32", seed(hidden, out)))


@pytest.mark.parametrize("hidden", [4096, 1001, None])
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_zero_centered_and_fp32_gamma(op, hidden):
    x_host = reference.sample_input((19, 1001 if hidden is None else hidden), "bf16", seed(op))
    for flags in ({"zero_centered_gamma": True}, {"fp32_gamma": True},
                  {"zero_centered_gamma": True, "fp32_gamma": True}):  # fmt: skip
        for out, scaling in (("bf16", "none"), ("fp8_e4m3", "mxfp8")):
            kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                   hidden_size=hidden, **flags)  # fmt: skip
            run_forward(kernel, x_host)


@pytest.mark.parametrize("hidden", [4096, 65536, None])
def test_large_mean_offset(hidden):
    """Rows with mean 1e4 and standard deviation 1: one-pass E[x^2] - E[x]^2 fails here."""
    h = 5000 if hidden is None else hidden
    rng = seed("offset", h)
    x_host = (1e4 + rng.standard_normal((9, h))).astype(np.float32)
    for op in ("layernorm_fwd", "rmsnorm_fwd"):
        _, ref = run_forward(ne.get_kernel(op, in_dtype="fp32", hidden_size=hidden), x_host)
        if op == "layernorm_fwd":
            assert np.all(np.abs(ref.rsigma - 1.0) < 0.1)  # std 1 around the large mean
    bf = (1e4 + 64 * rng.standard_normal((9, h))).astype(ne.DTYPES["bf16"].numpy())
    run_forward(ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=hidden), bf)


@pytest.mark.parametrize("hidden", [64, 1001, 4096, 65536, None])
def test_single_row(hidden):
    h = 3000 if hidden is None else hidden
    x_host = reference.sample_input((1, h), "bf16", seed("one", h))
    run_forward(ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=hidden), x_host)
    run_forward(ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8",
                              scaling="mxfp8", hidden_size=hidden), x_host)  # fmt: skip
    for op in ("layernorm_bwd", "rmsnorm_bwd"):
        run_backward(ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden), x_host)


def test_unaligned_pointers_take_the_scalar_path():
    kernel = ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=1024)
    general = ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8")
    x_host = reference.sample_input((6, 1024), "bf16", seed("unaligned"))
    base = torch.empty(6 * 1024 + 1, dtype=torch.bfloat16, device="cuda")
    x = base[1:].view(6, 1024)
    x.copy_(to_torch(x_host, "bf16"))
    assert x.data_ptr() % 16 != 0
    run_forward(kernel, x_host, x=x)
    run_forward(general, x_host, x=x)
    for op in ("layernorm_bwd", "rmsnorm_bwd_add"):
        run_backward(ne.get_kernel(op, in_dtype="bf16", hidden_size=1024), x_host, x=x)
        run_backward(ne.get_kernel(op, in_dtype="bf16"), x_host, x=x)


def test_amax_accumulates_and_outputs_are_allocated():
    kernel = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=512)
    x = torch.randn(16, 512, device="cuda").to(torch.bfloat16)
    gamma = torch.ones(512, dtype=torch.bfloat16, device="cuda")
    amax = torch.full((1,), 1e6, device="cuda")
    res = kernel(x, gamma, scale=torch.ones(1, device="cuda"), amax=amax)
    torch.cuda.synchronize()
    assert amax.item() == 1e6  # max-reduced, never overwritten
    assert res.z.dtype == torch.float8_e4m3fn and res.z.shape == x.shape
    assert res.rsigma.dtype == torch.float32 and res.rsigma.shape == (16,)
    mx = ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", scaling="mxfp8")
    out = mx(x.view(2, 8, 512), gamma, gamma)
    torch.cuda.synchronize()
    assert out.z.shape == (2, 8, 512) and out.mu.shape == (2, 8)
    assert out.scale_inv.dtype == torch.uint8
    assert tuple(out.scale_inv.shape) == mxfp8_scale_shape(16, 512, "rowwise")
    assert not out.scale_inv[16:].any() and not out.scale_inv[:, 16:].any()


# ---- backward ---------------------------------------------------------------------------


def run_backward(kernel, x_host, *, x=None, dz_host=None, in_place=False, check_result=True):
    """Backward on poisoned outputs, given fp32 mu/rsigma from the float64 forward."""
    key = kernel.key
    op = key.op
    rms = op.startswith("rmsnorm")
    zcg = key.flag("zero_centered_gamma")
    rows, hidden = x_host.shape
    w_dtype = gamma_dtype(key)
    rng = seed(op, hidden, w_dtype, "bwd")
    gamma_host, beta_host = params(rng, hidden, w_dtype, zcg)
    if dz_host is None:
        dz_host = reference.sample_input((rows, hidden), key.in_dtype, rng, outliers=4.0)
    if rms:
        fwd = reference.rmsnorm_fwd(x_host, gamma_host, EPS, zero_centered_gamma=zcg)
    else:
        fwd = reference.layernorm_fwd(x_host, gamma_host, beta_host, EPS, zero_centered_gamma=zcg)
    rs32 = fwd.rsigma.astype(np.float32)
    rsigma = to_torch(rs32, "fp32")
    x = to_torch(x_host, key.in_dtype) if x is None else x
    dz, gamma = to_torch(dz_host, key.in_dtype), to_torch(gamma_host, w_dtype)
    dx = poisoned((rows, hidden), key.in_dtype)
    dgamma, dbeta = poisoned((hidden,), w_dtype), poisoned((hidden,), w_dtype)
    add_host = None
    if op == "layernorm_bwd":
        mu32 = fwd.mu.astype(np.float32)
        res = kernel(dz, x, to_torch(mu32, "fp32"), rsigma, gamma, dx, dgamma, dbeta)
        assert res.dx is dx and res.dgamma is dgamma and res.dbeta is dbeta
        ref = reference.layernorm_bwd(dz_host, x_host, mu32, rs32, gamma_host,
                                      zero_centered_gamma=zcg)  # fmt: skip
    elif op == "rmsnorm_bwd":
        res = kernel(dz, x, rsigma, gamma, dx, dgamma)
        ref = reference.rmsnorm_bwd(dz_host, x_host, rs32, gamma_host, zero_centered_gamma=zcg)
    else:
        add_host = reference.sample_input((rows, hidden), key.in_dtype, rng, outliers=4.0)
        add = to_torch(add_host, key.in_dtype)
        if in_place:
            dx = add
        res = kernel(dz, x, rsigma, gamma, add, dx, dgamma)
        ref = reference.rmsnorm_bwd(dz_host, x_host, rs32, gamma_host, zero_centered_gamma=zcg,
                                    add=add_host)  # fmt: skip
    assert res.dx is dx and res.dgamma is dgamma
    torch.cuda.synchronize()
    if check_result:
        check(to_host(dx, key.in_dtype), ref.dx, key.in_dtype, ref.dx_tol, "dx")
        check(to_host(dgamma, w_dtype), ref.dgamma, w_dtype, ref.dgamma_tol, "dgamma")
        if not rms:
            check(to_host(dbeta, w_dtype), ref.dbeta, w_dtype, ref.dbeta_tol, "dbeta")
    return res


BWD = ["layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"]


@pytest.mark.parametrize("hidden", [1000, 4096, None], ids=["h1000", "h4096", "general"])
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("op", BWD)
def test_backward_every_dtype(op, in_dtype, hidden):
    kernel = ne.get_kernel(op, in_dtype=in_dtype, hidden_size=hidden)
    h = 1000 if hidden is None else hidden
    run_backward(kernel, reference.sample_input((93, h), in_dtype, seed(op, in_dtype, h)))


@pytest.mark.parametrize("hidden", [64, 768, 1001, 5120, 8192, 14336, 16384, 65536])
@pytest.mark.parametrize("op", BWD)
def test_backward_hidden_sizes_specialized_and_general(op, hidden):
    rows = 16 if hidden >= 16384 else 129
    x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, "b"))
    run_backward(ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden), x_host)
    run_backward(ne.get_kernel(op, in_dtype="bf16"), x_host)


@pytest.mark.parametrize("hidden", [4096, 1001, None])
@pytest.mark.parametrize("op", BWD)
def test_backward_zero_centered_and_fp32_gamma(op, hidden):
    x_host = reference.sample_input((41, 1001 if hidden is None else hidden), "bf16", seed(op))
    for flags in ({"zero_centered_gamma": True}, {"fp32_gamma": True},
                  {"zero_centered_gamma": True, "fp32_gamma": True}):  # fmt: skip
        run_backward(ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden, **flags), x_host)


def test_backward_large_mean_offset():
    x_host = (1e4 + seed("bwd offset").standard_normal((17, 4096))).astype(np.float32)
    for hidden in (4096, None):
        run_backward(ne.get_kernel("layernorm_bwd", in_dtype="fp32", hidden_size=hidden), x_host)


def test_rmsnorm_bwd_add_in_place():
    kernel = ne.get_kernel("rmsnorm_bwd_add", in_dtype="bf16", hidden_size=2048)
    run_backward(kernel, reference.sample_input((33, 2048), "bf16", seed("inplace")),
                 in_place=True)  # fmt: skip


def assert_backward_repeats(kernel, x_host, dz_host):
    """The backward against the reference, then again on the same inputs: dx, dgamma (and
    dbeta) the same bytes (deterministic for a fixed shape)."""
    first = run_backward(kernel, x_host, dz_host=dz_host)
    got = [t.clone() for t in first if t is not None]
    again = run_backward(kernel, x_host, dz_host=dz_host, check_result=False)
    for a, b in zip(got, [t for t in again if t is not None], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize(("hidden", "rows"), [(4096, 4096), (65536, 96), (None, 3000)])
def test_backward_is_deterministic(hidden, rows):
    h = 1536 if hidden is None else hidden
    x_host = reference.sample_input((rows, h), "bf16", seed("det", h))
    dz_host = reference.sample_input((rows, h), "bf16", seed("det dz", h))
    for op in ("layernorm_bwd", "rmsnorm_bwd"):
        kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
        assert_backward_repeats(kernel, x_host, dz_host)


def test_general_kernel_beyond_65536_and_loop_specialization():
    hidden = 1 << 19
    key = ne.make_key("layernorm_fwd", in_dtype="bf16", hidden_size=hidden)
    assert launch_config(key).mode == "loop"  # no register layout: streamed, H compiled in
    x_host = reference.sample_input((3, hidden), "bf16", seed("huge"))
    run_forward(ne.get_kernel(key), x_host)
    run_forward(ne.get_kernel("layernorm_fwd", in_dtype="bf16"), x_host)
    run_backward(ne.get_kernel("layernorm_bwd", in_dtype="bf16"), x_host)


def test_empty_input():
    fwd = ne.get_kernel("layernorm_fwd", in_dtype="bf16")
    x = torch.empty(0, 256, dtype=torch.bfloat16, device="cuda")
    g = torch.ones(256, dtype=torch.bfloat16, device="cuda")
    res = fwd(x, g, g)
    assert res.z.shape == (0, 256) and res.mu.shape == (0,)
    bwd = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=256)
    stats = torch.empty(0, device="cuda")
    grads = bwd(x, x, stats, stats, g, dgamma=torch.full_like(g, float("nan")))
    torch.cuda.synchronize()
    assert not grads.dgamma.float().abs().sum().item() and not grads.dbeta.float().any()


def test_errors_before_launch_with_real_tensors():
    kernel = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=1024)
    x = torch.randn(64, 1024, device="cuda").to(torch.bfloat16)
    stats = torch.ones(64, device="cuda")
    g = torch.ones(1024, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ArgumentError, match="hidden_size=1024"):
        kernel(x[:, :1000].contiguous(), x[:, :1000].contiguous(), stats, stats, g[:1000])
    need = kernel.workspace_elements(64, device=torch.cuda.current_device())
    assert need > 0
    with pytest.raises(ArgumentError, match="workspace: has"):
        kernel(x, x, stats, stats, g, workspace=torch.empty(need - 1, device="cuda"))
    grads = kernel(x, x, stats, stats, g, workspace=torch.empty(need, device="cuda"))
    torch.cuda.synchronize()
    assert grads.dx.shape == x.shape and grads.dgamma.shape == (1024,)
    buf = torch.empty(65 * 1024, dtype=torch.bfloat16, device="cuda")
    dz = buf[: 64 * 1024].view(64, 1024)
    dz.copy_(x)
    kernel(dz, x, stats, stats, g, torch.empty_like(x))  # the call's plan is made here
    inside = buf[8 : 8 + 64 * 1024].view(64, 1024)  # 16 bytes into dz: the plan's key
    for dx, name in ((x, "x"), (dz, "dz"), (inside, "dz")):  # checked before the plan
        with pytest.raises(ArgumentError, match=f"dx: overlaps {name}'s memory"):
            kernel(dz, x, stats, stats, g, dx)
    grads = kernel(dz, x, stats, stats, g, torch.empty_like(x))  # the plan still runs
    torch.cuda.synchronize()
    assert grads.dx.shape == x.shape
    fwd = ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=1024)
    with pytest.raises(ArgumentError, match="gamma: has dtype torch.float32"):
        fwd(x, g.float(), g)
    with pytest.raises(ArgumentError, match="eps: must be"):
        fwd(x, g, g, -1.0)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    kernel = ne.get_kernel("rmsnorm_fwd", in_dtype="fp16", out_dtype="fp8", scaling="mxfp8",
                           hidden_size=640)  # fmt: skip
    x_host = reference.sample_input((10, 640), "fp16", seed("cupy"))
    gamma_host, _ = params(seed("cupy g"), 640, "fp16", False)
    res = kernel(cupy.asarray(x_host), cupy.asarray(gamma_host))
    cupy.cuda.get_current_stream().synchronize()
    ref = reference.rmsnorm_fwd(x_host, gamma_host, EPS)
    z = cupy.asnumpy(res.z).view(ne.DTYPES["fp8_e4m3"].numpy())
    check_mxfp8(z, cupy.asnumpy(res.scale_inv), ref.z, ref.z_tol, "fp8_e4m3")
    bwd = ne.get_kernel("rmsnorm_bwd", in_dtype="fp16")
    dz = cupy.asarray(x_host)
    grads = bwd(dz, cupy.asarray(x_host), cupy.asarray(ref.rsigma.astype(np.float32)),
                cupy.asarray(gamma_host))  # fmt: skip
    cupy.cuda.get_current_stream().synchronize()
    want = reference.rmsnorm_bwd(x_host, x_host, ref.rsigma.astype(np.float32), gamma_host)
    check(cupy.asnumpy(grads.dx), want.dx, "fp16", want.dx_tol, "dx")
    check(cupy.asnumpy(grads.dgamma), want.dgamma, "fp16", want.dgamma_tol, "dgamma")


def test_cuda_graph_capture():
    kernel = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=2048)
    x_host = reference.sample_input((128, 2048), "bf16", seed("graph"))
    first = run_backward(kernel, x_host)  # loads the module before capture
    x = to_torch(x_host, "bf16")
    dz = torch.randn_like(x)
    mu, rs = torch.zeros(128, device="cuda"), torch.ones(128, device="cuda")
    g = torch.ones(2048, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(kernel.workspace_elements(128, device=torch.cuda.current_device()),
                     device="cuda")  # fmt: skip
    out = [torch.empty_like(x), torch.empty_like(g), torch.empty_like(g)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(dz, x, mu, rs, g, *out, workspace=ws)
    graph.replay()
    torch.cuda.synchronize()
    eager = kernel(dz, x, mu, rs, g)
    torch.cuda.synchronize()
    for a, b in zip(out, eager, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert first.dx.shape == x.shape


def _chain_kernels(dependent: bool) -> dict[str, ne.Kernel]:
    """The kernels of :func:`test_dependent_launch_chain`, made with programmatic dependent
    launches on or off (kernels decide when made: the memory cache is cleared around)."""
    ne.configure(dependent_launch=dependent)
    try:
        ne.clear_cache(disk=False)
        h = 4096
        return {
            "rms": ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=h),
            "ln": ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=h),
            "ln8": ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=h),
            "bwd": ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=h),
            "general": ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=None),
        }
    finally:
        ne.configure(dependent_launch=True)
        ne.clear_cache(disk=False)


def _run_chain(k: dict[str, ne.Kernel], x0, rounds: int) -> list:
    """Kernels that each read what the one before wrote (and overwrite what an earlier one
    read), launched back to back on one stream with no synchronization, ``rounds`` times."""
    rows, h = x0.shape
    dev = x0.device
    g = (torch.arange(h, device=dev) % 7 * 0.1 + 0.7).to(torch.bfloat16)
    b = (torch.arange(h, device=dev) % 5 * 0.05).to(torch.bfloat16)
    a, c, z = (torch.empty_like(x0) for _ in range(3))
    z8 = torch.empty(rows, h, dtype=torch.float8_e4m3fn, device=dev)
    mu, rs, rs2 = (torch.empty(rows, device=dev) for _ in range(3))
    scale, amax = torch.full((1,), 2.0, device=dev), torch.zeros(1, device=dev)
    si = torch.empty(1, device=dev)
    dx, dg, db = torch.empty_like(x0), torch.empty_like(g), torch.empty_like(g)
    ws = torch.empty(k["bwd"].workspace_elements(rows, h, device=dev.index), device=dev)
    x = x0.clone()
    torch.cuda.synchronize()
    for _ in range(rounds):
        k["rms"](x, g, EPS, a, rs2)  # a = rmsnorm(x)
        k["ln"](a, g, b, EPS, c, mu, rs)  # c = layernorm(a): mu, rs
        k["ln8"](c, g, b, EPS, z8, scale=scale, amax=amax, scale_inv=si)
        k["bwd"](c, a, mu, rs, g, dx, dg, db, workspace=ws)  # dz = c, x = a
        k["general"](dx, g, EPS, z)  # z = rmsnorm(dx), the general kernel
        x.add_(z)  # a torch kernel between them, then the next round overwrites a, c, ...
    torch.cuda.synchronize()
    return [x, a, c, z8.view(torch.uint8), amax, dx, dg, db, z]


def test_dependent_launch_chain():
    """Programmatic dependent launches (sm_90+) give the same bits as ordinary ones in a chain
    where each kernel reads the previous one's output: each waits for its predecessor before
    it touches memory. The kernels run long enough (4096 x 4096) for an early start to show."""
    on, off = _chain_kernels(True), _chain_kernels(False)
    major = torch.cuda.get_device_capability()[0]
    assert all(k._dependent == (major >= 9) for k in on.values())
    assert not any(k._dependent for k in off.values())
    x0 = to_torch(reference.sample_input((4096, 4096), "bf16", seed("chain")), "bf16")
    want = _run_chain(off, x0, 8)
    for _ in range(3):
        got = _run_chain(on, x0, 8)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"output {i} differs"


# ---- code switches of the specialized kernels (nvrtc_engine.ops.norm module defaults) ----


@pytest.fixture
def switches():
    """Set norm switches for one test: ``switches(BWD_PREFETCH=True, ...)``; every kernel
    got afterwards is built with them (each test has its own cache and engine)."""
    import nvrtc_engine.ops.norm_switches as norm_switches

    with pytest.MonkeyPatch.context() as mp:  # not the test's: that one holds the cache env
        mp.setattr(norm_switches, "TUNED", {})  # the rules alone, so the switches decide

        def apply(**values):
            for name, value in values.items():
                if name == "FWD_HOLD_WEIGHTS":
                    value = dict.fromkeys(norm_switches.FWD_HOLD_WEIGHTS, value)
                mp.setattr(norm_switches, name, value)
            launch_config.cache_clear()
            ne.clear_cache(disk=False)

        yield apply
    launch_config.cache_clear()
    ne.clear_cache(disk=False)


BWD_SWITCHES = [
    {"BWD_PREFETCH": True, "BWD_PACKED": False},  # the former code
    {"BWD_PREFETCH": True, "BWD_PACKED": True},
    {"BWD_PREFETCH": False, "BWD_PACKED": True},
    {"BWD_PREFETCH": False, "BWD_PACKED": False, "BWD_CLUSTERS": True, "BWD_CTAS_PER_SM": 2},
]


@pytest.mark.parametrize(
    "values", BWD_SWITCHES, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", BWD)
def test_backward_code_switches(switches, op, values):
    """Prefetch, packed rows, clusters, several rows per CTA, H not a multiple of the vector
    width, rows that do not fill the last row group, N = 1, a large mean offset (fp32)."""
    switches(**values)
    for hidden, rows in ((1024, 1), (1024, 1003), (1001, 37), (4096, 300), (14336, 5)):
        kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
        cfg = kernel.config
        assert cfg.mode == "loop" or cfg.prefetch == values["BWD_PREFETCH"]
        assert kernel.artifact.symbols[0].endswith(cfg.tag)
        x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "sw"))
        run_backward(kernel, x_host)
    if values.get("BWD_CLUSTERS") and arch() in ("sm_90", "sm_100"):
        assert ne.get_kernel(op, in_dtype="bf16", hidden_size=65536).config.cluster > 1
    x_host = (1e4 + seed("sw offset").standard_normal((13, 4096))).astype(np.float32)
    run_backward(ne.get_kernel(op, in_dtype="fp32", hidden_size=4096), x_host)


@pytest.mark.parametrize("hold", [True, False], ids=["held", "reloaded"])
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_weights_held_in_registers(switches, op, hold):
    """gamma/beta held across row groups (FWD_HOLD_WEIGHTS; 4 row groups per CTA): several
    rows per CTA, more row groups than CTAs, H odd, N = 1, fp32 gamma, a large mean offset."""
    switches(FWD_HOLD_WEIGHTS=hold, FWD_GROUPS_PER_CTA=4)
    cases = [(1024, 1), (1024, 9001), (1001, 4099), (4096, 3000), (14336, 7), (65536, 3)]
    for hidden, rows in cases:
        for out, scaling in (("bf16", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "mxfp8")):
            kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                   hidden_size=hidden)  # fmt: skip
            assert kernel.artifact.symbols[0].endswith(kernel.config.tag)
            x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows))
            run_forward(kernel, x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor",
                           hidden_size=4096, fp32_gamma=True, zero_centered_gamma=True)  # fmt: skip
    run_forward(kernel, reference.sample_input((513, 4096), "bf16", seed(op, "wf32")))
    x_host = (1e4 + seed("held offset").standard_normal((600, 4096))).astype(np.float32)
    run_forward(ne.get_kernel(op, in_dtype="fp32", out_dtype="fp8_e4m3", scaling="tensor",
                              hidden_size=4096), x_host)  # fmt: skip


@pytest.mark.parametrize("entry", sorted(TUNED), ids=lambda e: f"{e[0]}-h{e[1]}-{e[2]}")
def test_tuned_defaults(entry):
    """Each measured winner (norm_switches.TUNED: held weights with 8 row groups per CTA, the LN
    backward prefetch): rows that do not fill the last group, more groups than CTAs, N = 1,
    a large mean offset, zero-centred gamma."""
    op, hidden, scaling = entry
    fwd = op.endswith("_fwd")
    out = "fp8_e4m3" if scaling != "none" else "bf16"
    fields = {"out_dtype": out, "scaling": scaling} if fwd else {}
    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden, **fields)
    assert kernel.artifact.symbols[0].endswith(kernel.config.tag)
    run = run_forward if fwd else run_backward
    # H = 65536: 600 rows, so the held layouts' clusters take several row groups each
    many = 4 * 132 * 8 + 3 if hidden <= 8192 else (700 if hidden < 65536 else 600)
    for rows in (1, 5, many):
        run(kernel, reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "t")))
    rng = seed(op, hidden, "tuned offset")
    run(kernel, (1e4 + 64 * rng.standard_normal((9, hidden))).astype(ne.DTYPES["bf16"].numpy()))
    zcg = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden, zero_centered_gamma=True,
                        **fields)  # fmt: skip
    assert zcg.config.tag == kernel.config.tag
    run(zcg, reference.sample_input((33, hidden), "bf16", seed(op, hidden, "zcg")))


@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
@pytest.mark.parametrize("tag", ["w8r1v8j8c4p", "w8r1v8j8c4hp"])
def test_next_row_copies_for_bf16_output(op, tag):
    """``p`` with bf16 output (the bench/norm_tuning.py --candidates big layouts at H = 65536,
    a cluster of 4, with and without held weights) against the float64 reference: N = 1, rows
    that leave clusters without a row group, and 600 rows at 16 row groups per CTA (each
    cluster copies several rows ahead)."""
    import nvrtc_engine.ops.norm_switches as norm_switches

    tuned = {**norm_switches.TUNED, (op, 65536, "none"): tag}
    kernel = _kernel_with(op, {"in_dtype": "bf16", "hidden_size": 65536}, tuned, {})
    assert kernel.config.next_row and kernel.artifact.symbols[0].endswith(tag)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(norm_switches, "FWD_GROUPS_PER_CTA", 16)
        for rows in (1, 37, 600):
            x = reference.sample_input((rows, 65536), "bf16", seed(op, tag, rows, "p16"))
            run_forward(kernel, x)


# Round-3 switches: early weight loads, one (count, mean, M2) reduction, split sums (forward);
# column sums in shared memory, with and without a register cap (backward).
FWD_ROUND3 = [
    {"FWD_ACCUMULATORS": 2},
    {"FWD_ACCUMULATORS": 4},
    {"FWD_ONE_REDUCTION": True},
    {"FWD_ONE_REDUCTION": True, "FWD_ACCUMULATORS": 4},
    {"FWD_EARLY_WEIGHTS": True},
    {"FWD_EARLY_WEIGHTS": True, "FWD_ONE_REDUCTION": True, "FWD_ACCUMULATORS": 2},
]


@pytest.mark.parametrize(
    "values", FWD_ROUND3, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_round3_switches(switches, op, values):
    """Each forward switch against the float64 reference: several rows per CTA, H odd (the
    last access of some threads past the row), N = 1, clusters (H = 65536), bf16 and FP8
    (tensor, MXFP8) outputs, fp32 and zero-centred gamma, rows with a 1e4 mean offset."""
    switches(**values)
    cases = [(1024, 1), (1024, 1003), (1000, 37), (1001, 5), (4096, 300), (8192, 17),
             (14336, 5), (65536, 2)]  # fmt: skip
    for hidden, rows in cases:
        for out, scaling in (("bf16", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "mxfp8")):
            if scaling == "mxfp8" and hidden % 32:
                continue
            kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                   hidden_size=hidden)  # fmt: skip
            cfg = kernel.config
            assert kernel.artifact.symbols[0].endswith(cfg.tag)
            if cfg.mode == "regs":
                assert cfg.accumulators == values.get("FWD_ACCUMULATORS", 1)
            x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "r3"))
            run_forward(kernel, x_host)
    for hidden in (1000, 4096, 8192):
        kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor",
                               hidden_size=hidden, fp32_gamma=True,
                               zero_centered_gamma=True)  # fmt: skip
        run_forward(kernel, reference.sample_input((65, hidden), "bf16", seed(op, hidden, "z3")))
        rng = seed(op, hidden, "r3 offset")
        x_host = (1e4 + rng.standard_normal((600, hidden))).astype(np.float32)
        run_forward(ne.get_kernel(op, in_dtype="fp32", hidden_size=hidden), x_host)
        bf = (1e4 + 64 * rng.standard_normal((9, hidden))).astype(ne.DTYPES["bf16"].numpy())
        run_forward(ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden), bf)


@pytest.mark.parametrize("cap", [False, True], ids=["uncapped", "capped"])
@pytest.mark.parametrize("shared", [1, 2])
@pytest.mark.parametrize("op", BWD)
def test_backward_shared_sums(switches, op, shared, cap):
    """Column sums in shared memory (BWD_SHARED_SUMS), with BWD_CAP's register cap or not:
    several rows per CTA (H = 1024), H odd, N = 1, zero-centred and fp32 gamma, a large mean
    offset, and bit-identical results from two calls."""
    switches(BWD_SHARED_SUMS=shared, BWD_CAP=cap)
    for hidden, rows in ((1024, 1), (1024, 1003), (1000, 37), (1001, 5), (4096, 300),
                         (8192, 9)):  # fmt: skip
        kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
        cfg = kernel.config
        assert kernel.artifact.symbols[0].endswith(cfg.tag)
        if cfg.mode == "regs":  # as many arrays as fit in 48 KB of static shared memory
            fits = (48 * 1024 - 1024) // (cfg.threads * cfg.vec * cfg.iters * 4)
            assert cfg.shared_sums == min(shared, kernel.spec.accumulators, fits)
        x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "s3"))
        run_backward(kernel, x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=4096, zero_centered_gamma=True,
                           fp32_gamma=True)  # fmt: skip
    run_backward(kernel, reference.sample_input((77, 4096), "bf16", seed(op, "s3 zcg")))
    x_host = (1e4 + seed(op, "s3 offset").standard_normal((13, 4096))).astype(np.float32)
    run_backward(ne.get_kernel(op, in_dtype="fp32", hidden_size=4096), x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=4096)
    x_host = reference.sample_input((700, 4096), "bf16", seed(op, "s3 det"))
    dz_host = reference.sample_input((700, 4096), "bf16", seed(op, "s3 det dz"))
    assert_backward_repeats(kernel, x_host, dz_host)


# Round-4 FP8 forward candidates (tensor scaling): the batched output stage (FWD_FP8_BATCHED,
# ``o``) and warp-level amax atomics guarded by a read at the start (FWD_FP8_WARP_AMAX, ``g``).
FP8_CANDIDATES = [
    {"FWD_FP8_BATCHED": True, "FWD_FP8_WARP_AMAX": True},
    {"FWD_FP8_BATCHED": True},
    {"FWD_FP8_WARP_AMAX": True},
]


def _without_fp8_switches(key, tag):
    """A TUNED tag with the FP8 forward switches (o, g, q, p), the row-group count (x) and the
    staged forward (t, f, b, i: the register kernel of the same layout) taken out: the layout
    the switch tests start from."""
    import dataclasses

    import nvrtc_engine.ops.norm as norm

    cfg = norm.parse_tag(tag)
    if key[0].endswith("_fwd"):  # TUNED's key: (op, hidden size, scaling)
        cfg = dataclasses.replace(cfg, stages=0, gamma32=False, ctas_per_sm=0, deferred=False,
                                  shifted=False)  # fmt: skip
    return dataclasses.replace(cfg, batched=False, warp_amax=False, words=False,
                               next_row=False, groups=0).tag  # fmt: skip


def _fp8_outputs(kernel, x, gamma, beta, scale, amax_start=0.0):
    """z bytes, mu, rsigma, amax and scale_inv of one tensor-scaling call (poisoned first)."""
    rows, hidden = x.shape
    out = poisoned((rows, hidden), kernel.key.out_dtype)
    mu, rsigma = poisoned((rows,), "fp32"), poisoned((rows,), "fp32")
    amax = torch.full((1,), amax_start, device="cuda")
    scale_inv = torch.full((1,), float("nan"), device="cuda")
    kw = {"scale": torch.full((1,), scale, device="cuda"), "amax": amax, "scale_inv": scale_inv}
    if kernel.key.op == "rmsnorm_fwd":
        kernel(x, gamma, EPS, out, rsigma, **kw)
        mu = None
    else:
        kernel(x, gamma, beta, EPS, out, mu, rsigma, **kw)
    torch.cuda.synchronize()
    return out.view(torch.uint8), mu, rsigma, amax, scale_inv


def _assert_same_fp8(kernel, other, rows, label):
    """Two tensor-scaled forward kernels of one key give the same bits (z bytes, mu, rsigma,
    amax, scale_inv) on ``rows`` rows of bf16 x."""
    key = kernel.key
    hidden = key.hidden_size
    x_host = reference.sample_input((rows, hidden), "bf16", seed(key.op, hidden, label))
    g_host, b_host = params(seed(key.op, hidden, "bf16"), hidden, "bf16", False)
    x = to_torch(x_host, "bf16")
    gamma, beta = to_torch(g_host, "bf16"), to_torch(b_host, "bf16")
    got = _fp8_outputs(kernel, x, gamma, beta, 3.0)
    want = _fp8_outputs(other, x, gamma, beta, 3.0)
    for a, b, name in zip(got, want, ("z", "mu", "rsigma", "amax", "scale_inv"), strict=True):
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (kernel.name, name)


@pytest.mark.parametrize(
    "values", FP8_CANDIDATES, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_fp8_candidates(op, values):
    """Each FP8 candidate, with the measured table's layouts (TUNED, its o/g/q/p/x letters
    taken out so that only the module switches set them) in force, against the float64
    reference (z bytes except at rounding ties, mu/rsigma, amax, scale_inv) and bit for bit
    against the kernel of the same layout without the switches (the same fp32 arithmetic: z
    bytes, mu, rsigma and amax identical): N = 1, N not a multiple of the rows per CTA (H =
    1024: 4 rows per CTA), H odd (a partial last access), the TUNED FP8 layouts at
    4096-14336 (RMSNorm 14336: held weights, several row groups per CTA at N = 700), a
    cluster (H = 65536), e5m2, zero-centred and fp32 gamma, a large mean offset (fp32 x),
    and an amax word that already holds more than this call's maximum (left unchanged). Each
    switch alone: H = 1001, 4096 and 14336 only."""

    import nvrtc_engine.ops.norm_switches as norm_switches

    layouts = {key: _without_fp8_switches(key, tag) for key, tag in norm_switches.TUNED.items()}
    cases = [(1024, 1), (1024, 1003), (1001, 37), (4096, 1), (4096, 513), (8192, 1),
             (8192, 67), (14336, 1), (14336, 700), (65536, 2)]  # fmt: skip
    if len(values) == 1:
        cases = [(1001, 37), (4096, 513), (14336, 700)]
    variants = [("bf16", "fp8_e4m3", {}), ("bf16", "fp8_e5m2", {}),
                ("bf16", "fp8_e4m3", {"zero_centered_gamma": True, "fp32_gamma": True}),
                ("fp32", "fp8_e4m3", {})]  # fmt: skip
    for hidden, rows in cases:
        more = hidden == 4096 and rows > 1 and len(values) == 2
        for in_dtype, out, flags in variants if more else variants[:1]:
            fields = dict(in_dtype=in_dtype, out_dtype=out, scaling="tensor", hidden_size=hidden,
                          **flags)  # fmt: skip
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(norm_switches, "TUNED", layouts)
                launch_config.cache_clear()
                ne.clear_cache(disk=False)
                default = ne.get_kernel(op, **fields)
                for name, value in values.items():
                    mp.setattr(norm_switches, name, value)
                launch_config.cache_clear()
                ne.clear_cache(disk=False)
                try:
                    kernel = ne.get_kernel(op, **fields)
                finally:
                    launch_config.cache_clear()
                    ne.clear_cache(disk=False)
            cfg = kernel.config
            assert kernel.artifact.symbols[0].endswith(cfg.tag)
            if cfg.mode == "regs":
                assert cfg.batched == values.get("FWD_FP8_BATCHED", False)
                assert cfg.warp_amax == values.get("FWD_FP8_WARP_AMAX", False)
                assert cfg.tag != default.config.tag
            rng = seed(op, hidden, rows, in_dtype, out, sorted(flags), "fp8c")
            if in_dtype == "fp32":
                x_host = (1e4 + rng.standard_normal((rows, hidden))).astype(np.float32)
            else:
                x_host = reference.sample_input((rows, hidden), in_dtype, rng)
            run_forward(kernel, x_host, scale=3.0)
            w_dtype = gamma_dtype(kernel.key)
            zcg = kernel.key.flag("zero_centered_gamma")
            g_host, b_host = params(seed(op, hidden, w_dtype), hidden, w_dtype, zcg)
            x = to_torch(x_host, in_dtype)
            gamma, beta = to_torch(g_host, w_dtype), to_torch(b_host, w_dtype)
            got = _fp8_outputs(kernel, x, gamma, beta, 3.0)
            want = _fp8_outputs(default, x, gamma, beta, 3.0)
            for a, b, name in zip(got, want, ("z", "mu", "rsigma", "amax", "scale_inv"),
                                  strict=True):  # fmt: skip
                if a is not None:
                    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
            # an amax word above this call's maximum stays as it is
            high = float(got[3].item()) * 2 + 1
            again = _fp8_outputs(kernel, x, gamma, beta, 3.0, amax_start=high)
            assert again[3].item() == np.float32(high)
            assert torch.equal(again[0], got[0])


# Round-5 candidate: the staged backward (BWD_STAGED, tag letter ``t{stages}``): x and dz
# copied into shared memory by cp.async, ``stages`` rows deep, dynamic shared memory above
# 48 KB (H = 65536: a cluster of 4 CTAs per row).
STAGED_CASES = [(4096, 1), (4096, 4099), (8192, 1), (8192, 2053), (14336, 1), (14336, 1001),
                (65536, 1), (65536, 263), (1001, 37), (1000, 5)]  # fmt: skip


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("op", BWD)
def test_backward_staged(switches, op, stages):
    """The staged layout against the float64 reference: H = 4096, 8192, 14336 and 65536,
    N = 1 (the prologue issues rows past the end) and odd N of several rows per CTA (the
    stages wrap around), H odd (2-byte accesses: copied element by element) and H = 1000
    (a partial last access); LayerNorm at H = 65536 also with N = 2048; unaligned pointers
    (the element-by-element path); zero-centred and fp32 gamma; a large mean offset (fp32
    x); bit-identical results from two calls."""
    switches(BWD_STAGED=stages)
    for hidden, rows in STAGED_CASES + ([(65536, 2048)] if op == "layernorm_bwd" else []):
        kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden)
        cfg = kernel.config
        assert 2 <= cfg.stages <= stages and kernel.artifact.symbols[0].endswith(cfg.tag)
        if hidden == 65536 and arch() in ("sm_90", "sm_100"):
            assert cfg.cluster == 4
        x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "t"))
        run_backward(kernel, x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=4096)
    x_host = reference.sample_input((300, 4096), "bf16", seed(op, "t unaligned"))
    x = unaligned_bf16(x_host)
    run_backward(kernel, x_host, x=x)
    for hidden in (4096, 14336):
        kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden,
                               zero_centered_gamma=True, fp32_gamma=True)  # fmt: skip
        assert kernel.config.stages >= 2
        run_backward(kernel, reference.sample_input((77, hidden), "bf16", seed(op, hidden, "tz")))
    x_host = (1e4 + seed(op, "t offset").standard_normal((13, 4096))).astype(np.float32)
    kernel = ne.get_kernel(op, in_dtype="fp32", hidden_size=4096)
    assert kernel.config.stages >= 2
    run_backward(kernel, x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=14336)
    x_host = reference.sample_input((700, 14336), "bf16", seed(op, "t det"))
    dz_host = reference.sample_input((700, 14336), "bf16", seed(op, "t det dz"))
    assert_backward_repeats(kernel, x_host, dz_host)


# Round-5 FP8 forward candidates (tensor scaling): bf16 unpacked and FP8 packed as 32-bit
# words (FWD_FP8_WORDS, ``q``), the next row group's x copied ahead into shared memory
# (FWD_FP8_NEXT_ROW, ``p``; several row groups per CTA).
FP8_ROUND5 = [
    {"FWD_FP8_WORDS": True},
    {"FWD_FP8_NEXT_ROW": True},
    {"FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True},
    {"FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True, "FWD_FP8_BATCHED": True,
     "FWD_FP8_WARP_AMAX": True},
]  # fmt: skip


def _kernel_with(op, fields, tuned, values):
    """``op``'s kernel for ``fields`` with ``norm_switches.TUNED = tuned`` and the module switches
    ``values``, compiled afresh (neither cache sees the monkeypatched switches)."""
    return _kernel_patched(op, fields, {"TUNED": tuned, **values})


def _kernel_patched(op, fields, attrs):
    """``op``'s kernel for ``fields`` with ``attrs`` set (names to values: settings of
    ``norm_switches``, or ``norm_layout``'s functions such as ``_tuned``), compiled afresh."""
    import nvrtc_engine.ops.norm_layout as norm_layout
    import nvrtc_engine.ops.norm_switches as norm_switches

    with pytest.MonkeyPatch.context() as mp:
        for name, value in attrs.items():
            module = norm_switches if hasattr(norm_switches, name) else norm_layout
            mp.setattr(module, name, value)  # (raises for a name neither module has)
        launch_config.cache_clear()
        ne.clear_cache(disk=False)
        try:
            return ne.get_kernel(op, **fields)
        finally:
            launch_config.cache_clear()
            ne.clear_cache(disk=False)


@pytest.mark.parametrize(
    "values", FP8_ROUND5, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_fp8_round5_candidates(op, values):
    """Each round-5 candidate against the float64 reference and bit for bit (z bytes, mu,
    rsigma, amax, scale_inv) against the kernel of the same layout without the switches, over
    TUNED's layouts with their o/g/q/p/x letters taken out, and (all four switches on) against the
    TUNED kernel itself (without ``z``): N = 1, N not a multiple of the rows per CTA (H = 1024:
    4 rows per CTA),
    H odd (no ``p``: 2-byte accesses), N large enough that CTAs take several row groups (``p``:
    4096 x 5000, 1024 x 9001, 14336 x 700, 8192 x 3001; the float64 reference up to 12 Mi
    elements, bits only beyond), a cluster (H = 65536), e5m2, fp16 and
    fp32 x (a 1e4 mean offset), zero-centred fp32 gamma, unaligned x (the scalar path), and an
    amax word above this call's maximum (left unchanged)."""

    import nvrtc_engine.ops.norm_switches as norm_switches

    stripped = {key: _without_fp8_switches(key, tag) for key, tag in norm_switches.TUNED.items()}
    # the TUNED kernels without z (one-pass statistics round differently: test_forward_shifted)
    unshifted = {key: tag.replace("z", "") for key, tag in norm_switches.TUNED.items()}
    cases = [(1024, 1), (1024, 9001), (1001, 37), (4096, 1), (4096, 5000), (8192, 3001),
             (14336, 1), (14336, 700), (65536, 2)]  # fmt: skip
    if len(values) < 4:
        cases = [(1001, 37), (1024, 9001), (4096, 5000), (14336, 700)]
    variants = [("bf16", "fp8_e4m3", {}), ("bf16", "fp8_e5m2", {}), ("fp16", "fp8_e4m3", {}),
                ("bf16", "fp8_e4m3", {"zero_centered_gamma": True, "fp32_gamma": True}),
                ("fp32", "fp8_e4m3", {})]  # fmt: skip
    for hidden, rows in cases:
        more = hidden == 4096 and rows > 1
        for in_dtype, out, flags in variants if more else variants[:1]:
            fields = dict(in_dtype=in_dtype, out_dtype=out, scaling="tensor", hidden_size=hidden,
                          **flags)  # fmt: skip
            default = _kernel_with(op, fields, stripped, {})
            kernel = _kernel_with(op, fields, stripped, values)
            cfg = kernel.config
            assert kernel.artifact.symbols[0].endswith(cfg.tag)
            if cfg.mode == "regs":
                assert cfg.words == values.get("FWD_FP8_WORDS", False)
                assert cfg.next_row <= values.get("FWD_FP8_NEXT_ROW", False)
            rng = seed(op, hidden, rows, in_dtype, out, sorted(flags), "fp8r5")
            if in_dtype == "fp32":
                x_host = (1e4 + rng.standard_normal((rows, hidden))).astype(np.float32)
            else:
                x_host = reference.sample_input((rows, hidden), in_dtype, rng)
            if rows * hidden <= 12 * 2**20:  # the float64 reference (larger: bits only)
                run_forward(kernel, x_host, scale=3.0)
            w_dtype = gamma_dtype(kernel.key)
            zcg = kernel.key.flag("zero_centered_gamma")
            g_host, b_host = params(seed(op, hidden, w_dtype), hidden, w_dtype, zcg)
            x = to_torch(x_host, in_dtype)
            gamma, beta = to_torch(g_host, w_dtype), to_torch(b_host, w_dtype)
            references = [default]
            if len(values) == 4:
                references.append(_kernel_with(op, fields, unshifted, {}))
            got = _fp8_outputs(kernel, x, gamma, beta, 3.0)
            for other in references:
                want = _fp8_outputs(other, x, gamma, beta, 3.0)
                for a, b, name in zip(got, want, ("z", "mu", "rsigma", "amax", "scale_inv"),
                                      strict=True):  # fmt: skip
                    if a is not None:
                        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
            high = float(got[3].item()) * 2 + 1
            again = _fp8_outputs(kernel, x, gamma, beta, 3.0, amax_start=high)
            assert again[3].item() == np.float32(high)
            assert torch.equal(again[0], got[0])
            if in_dtype == "bf16" and not flags and rows > 1:  # unaligned x: the scalar path
                base = torch.empty(rows * hidden + 1, dtype=x.dtype, device="cuda")
                xu = base[1:].view(rows, hidden)
                xu.copy_(x)
                assert xu.data_ptr() % 16 != 0
                bad = _fp8_outputs(kernel, xu, gamma, beta, 3.0)
                want = _fp8_outputs(default, xu, gamma, beta, 3.0)
                for a, b, name in zip(bad, want, ("z", "mu", "rsigma", "amax", "scale_inv"),
                                      strict=True):  # fmt: skip
                    if a is not None:
                        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


# Round-8 candidates: a row sum's per-warp values added across lanes by shuffles
# (ROW_SUM_LANES, ``l``); the staged backward's shared-memory reads as 32-bit words
# (BWD_STAGED_WORDS, ``q``), its gamma in shared memory as fp32 (BWD_GAMMA32, ``f``) and its
# dx from the row's constants (BWD_FOLDED, ``d``).
ROUND8_FWD = [{"ROW_SUM_LANES": True}]
ROUND8_BWD = [{"ROW_SUM_LANES": True}, {"BWD_STAGED_WORDS": True},
              {"ROW_SUM_LANES": True, "BWD_STAGED_WORDS": True}, {"BWD_GAMMA32": True},
              {"BWD_FOLDED": True}, {"BWD_GAMMA32": True, "BWD_FOLDED": True},
              {"ROW_SUM_LANES": False, "BWD_STAGED_WORDS": True, "BWD_GAMMA32": True,
               "BWD_FOLDED": True}]  # fmt: skip
# the switches that keep the arithmetic (and so the bytes) of the kernel without them
SAME_BITS = {"BWD_STAGED_WORDS", "BWD_GAMMA32"}
ROUND8_CASES = [(1001, 37), (4096, 1), (4096, 513), (8192, 67), (14336, 1), (14336, 700),
                (65536, 3)]  # fmt: skip


def _round8_kernel(op, fields, values):
    """``op``'s kernel for ``fields`` with TUNED as it is and the round-8 ``values``, and the
    letters they must have added to the tag (the reference kernel: the same without them)."""
    import nvrtc_engine.ops.norm_switches as norm_switches

    default = _kernel_with(op, fields, norm_switches.TUNED, {})
    kernel = _kernel_with(op, fields, norm_switches.TUNED, values)
    cfg, base = kernel.config, default.config
    assert kernel.artifact.symbols[0].endswith(cfg.tag)
    if cfg.mode == "regs":
        assert cfg.lanes == (base.lanes or (values.get("ROW_SUM_LANES", False) and cfg.warps > 1))
        staged = cfg.stages > 0
        for field, name in (("words", "BWD_STAGED_WORDS"), ("gamma32", "BWD_GAMMA32"),
                            ("folded", "BWD_FOLDED")):  # fmt: skip
            assert getattr(cfg, field) == (getattr(base, field)
                                           or (values.get(name, False) and staged))  # fmt: skip
    return kernel, default


@pytest.mark.parametrize(
    "values", ROUND8_FWD, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_round8_candidates(op, values):
    """``l`` on the forward against the float64 reference, over TUNED's layouts (bf16 and FP8
    tensor-scaled z at 4096-65536: one CTA of 4-14 warps per row, and clusters at 65536) and
    the rules' (H = 1001, MXFP8 z; fp32 x with a 1e4 mean offset), N = 1 and several rows per
    CTA; two calls give the same bytes."""
    outputs = [("bf16", {}), ("fp8_e4m3", {"scaling": "tensor"}),
               ("fp8_e4m3", {"scaling": "mxfp8"})]  # fmt: skip
    for hidden, rows in ROUND8_CASES:
        for out, extra in outputs if hidden in (4096, 14336) else outputs[:2]:
            fields = dict(in_dtype="bf16", out_dtype=out, hidden_size=hidden, **extra)
            kernel, _ = _round8_kernel(op, fields, values)
            x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "r6"))
            z, _ = run_forward(kernel, x_host)
            first = z.clone()
            again, _ = run_forward(kernel, x_host)
            assert torch.equal(first.view(torch.uint8), again.view(torch.uint8))
    fields = dict(in_dtype="fp32", hidden_size=4096)
    kernel, _ = _round8_kernel(op, fields, values)
    x_host = (1e4 + seed(op, "r6 offset").standard_normal((33, 4096))).astype(np.float32)
    run_forward(kernel, x_host)


@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_bf16_words(op):
    """``q`` on the bf16-output forward (x, gamma and beta loaded as 32-bit words; TUNED
    entries only, sm_90): z the same bytes as without it, and within the float64 bound, on
    TUNED's and the rules' layouts at 4096-65536, each with and without q (at 65536 the staged
    forward with held weights), N = 1 and odd N, unaligned x (the element-by-element path)."""
    import dataclasses

    import nvrtc_engine.ops.norm_switches as norm_switches

    if arch() != "sm_90":
        pytest.skip("TUNED applies on sm_90 only")
    for hidden, rows in ROUND8_CASES[1:]:
        fields = dict(in_dtype="bf16", hidden_size=hidden)
        base = launch_config(ne.make_key(op, **fields))
        twins = []  # the layout with q, then without (a staged entry may have it already)
        for words in (True, False):
            tuned = dict(norm_switches.TUNED)
            tuned[(op, hidden, "none")] = dataclasses.replace(base, words=words).tag
            twins.append(_kernel_with(op, fields, tuned, {}))
        kernel, default = twins
        assert kernel.config.words and kernel.artifact.symbols[0].endswith(kernel.config.tag)
        assert not default.config.words
        x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, rows, "q16"))
        views = [None] + ([unaligned_bf16(x_host)] if rows > 1 else [])
        for x in views:
            got, _ = run_forward(kernel, x_host, x=x)
            got = got.clone()
            want, _ = run_forward(default, x_host, x=x)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize(
    "values", ROUND8_BWD, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("op", BWD)
def test_backward_round8_candidates(op, values):
    """``l``, ``q``, ``f`` and ``d`` on the backward (TUNED's staged layouts at 4096-65536,
    the rules' elsewhere) against the float64 reference: N = 1 and odd N, H = 1001,
    zero-centred fp32 gamma, fp32 x with a 1e4 mean offset, unaligned x (the element-by-element
    copies). With ``q`` and ``f`` alone dx, dgamma and dbeta are the same bytes as without
    them (the same arithmetic); with ``l`` or ``d`` two calls give the same bytes."""
    cases = [(h, r, "bf16", {}) for h, r in ROUND8_CASES]
    cases += [(4096, 77, "bf16", {"zero_centered_gamma": True, "fp32_gamma": True}),
              (4096, 13, "fp32", {})]  # fmt: skip
    for hidden, rows, in_dtype, flags in cases:
        fields = dict(in_dtype=in_dtype, hidden_size=hidden, **flags)
        kernel, default = _round8_kernel(op, fields, values)
        rng = seed(op, hidden, rows, in_dtype, sorted(flags), "r6")
        if in_dtype == "fp32":
            x_host = (1e4 + rng.standard_normal((rows, hidden))).astype(np.float32)
        else:
            x_host = reference.sample_input((rows, hidden), in_dtype, rng)
        dz_host = reference.sample_input((rows, hidden), in_dtype, rng, outliers=4.0)
        got = [t.clone() for t in run_backward(kernel, x_host, dz_host=dz_host) if t is not None]
        if {name for name, on in values.items() if on} <= SAME_BITS:
            want = [t for t in run_backward(default, x_host, dz_host=dz_host) if t is not None]
        else:
            again = run_backward(kernel, x_host, dz_host=dz_host, check_result=False)
            want = [t for t in again if t is not None]
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    kernel, _ = _round8_kernel(op, dict(in_dtype="bf16", hidden_size=4096), values)
    x_host = reference.sample_input((300, 4096), "bf16", seed(op, "r6 unaligned"))
    x = unaligned_bf16(x_host)
    run_backward(kernel, x_host, x=x)


# Round-9 candidate: the staged forward (FWD_STAGED, ``t{stages}`` on a forward key): x copied
# into shared memory by cp.async, ``stages`` rows deep, a persistent grid; FWD_GAMMA32 (``f``):
# the weights in shared memory as fp32.
@pytest.mark.parametrize("f32", [False, True], ids=["stored", "fp32"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_staged(switches, op, stages, f32):
    """The staged forward against the float64 reference: bf16 x to bf16, FP8 (tensor, e4m3)
    and MXFP8 (e5m2) z at STAGED_CASES (N = 1: the prologue issues rows past the end; more
    rows than CTAs: the stages wrap around; H odd: 2-byte accesses, copied element by
    element; H = 1000: a partial last access; H = 65536: a cluster), unaligned x (the
    element-by-element copies), fp16 x, zero-centred fp32 gamma, a large mean offset (fp32
    x); and bit for bit (z bytes, mu, rsigma, amax) against the register kernel of the same
    layout, whose arithmetic it keeps."""
    import dataclasses

    import nvrtc_engine.ops.norm as norm

    switches(FWD_STAGED=stages, FWD_GAMMA32=f32)
    modes = (("bf16", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "mxfp8"))
    for hidden, rows in STAGED_CASES:
        for out, scaling in modes:
            kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                   hidden_size=hidden)  # fmt: skip
            cfg = kernel.config
            if norm.staged_layout(kernel.key, stages) is not None:
                assert 2 <= cfg.stages <= stages and kernel.artifact.symbols[0].endswith(cfg.tag)
            x_host = reference.sample_input((rows, hidden), "bf16",
                                            seed(op, hidden, rows, out, "tf"))  # fmt: skip
            run_forward(kernel, x_host)
    kernel = ne.get_kernel(op, in_dtype="bf16", out_dtype="fp8_e4m3", hidden_size=4096)
    assert kernel.config.stages >= 2
    x_host = reference.sample_input((300, 4096), "bf16", seed(op, "tf unaligned"))
    x = unaligned_bf16(x_host)
    run_forward(kernel, x_host, x=x)
    for in_dtype, flags in (("fp16", {}), ("bf16", {"zero_centered_gamma": True,
                                                    "fp32_gamma": True})):  # fmt: skip
        kernel = ne.get_kernel(op, in_dtype=in_dtype, out_dtype="fp8_e4m3", hidden_size=4096,
                               **flags)  # fmt: skip
        assert kernel.config.stages >= 2
        x_host = reference.sample_input((77, 4096), in_dtype, seed(op, in_dtype, "tf flags"))
        run_forward(kernel, x_host)
    x_host = (1e4 + seed(op, "tf offset").standard_normal((13, 4096))).astype(np.float32)
    kernel = ne.get_kernel(op, in_dtype="fp32", hidden_size=4096)
    assert kernel.config.stages >= 2
    run_forward(kernel, x_host)
    # bit for bit against the register kernel of the same layout (persistent grid or not)
    for hidden, rows in ((4096, 2000), (14336, 700), (65536, 64)):
        fields = dict(in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor",
                      hidden_size=hidden)  # fmt: skip
        staged = ne.get_kernel(op, **fields)
        if not staged.config.stages:
            continue
        plain = dataclasses.replace(staged.config, stages=0, gamma32=False, deferred=False).tag
        register = _kernel_with(op, fields, {(op, hidden, "tensor"): plain}, {})
        assert register.config.tag == plain
        _assert_same_fp8(staged, register, rows, "tf bits")


@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd", *BWD])
def test_balanced_persistent_grid(monkeypatch, op):
    """PERSISTENT_BALANCED (a round-10 candidate, host side): TUNED's kernels on the balanced
    persistent grid against the float64 reference (2053 rows at H = 4096: 514 CTAs where the
    plain grid has 528; 263 rows at 65536 over clusters), and the forward bit for bit against
    the plain grid (a row's arithmetic does not depend on the CTA that takes it)."""
    import nvrtc_engine.ops.norm_switches as norm_switches

    def balanced(kernel, on):
        monkeypatch.setattr(norm_switches, "PERSISTENT_BALANCED", on)
        kernel._prepared.clear()  # the grid is part of a prepared launch

    for hidden, rows in ((4096, 2053), (65536, 263)):
        fields = dict(in_dtype="bf16", hidden_size=hidden)
        if op.endswith("fwd"):
            fields.update(out_dtype="fp8_e4m3", scaling="tensor")
        kernel = ne.get_kernel(op, **fields)
        x_host = reference.sample_input((rows, hidden), "bf16", seed(op, hidden, "balanced"))
        if op.endswith("fwd"):
            want = run_forward(kernel, x_host)[0].clone()
            balanced(kernel, True)
            got = run_forward(kernel, x_host)[0]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        else:
            balanced(kernel, True)
            run_backward(kernel, x_host)
        balanced(kernel, False)


def _kernel_tagged(op, fields, tag):
    """``op``'s kernel for ``fields`` with the layout ``tag`` whatever the key (norm_layout._tuned
    answering it for every key), compiled afresh."""
    import nvrtc_engine.ops.norm as norm

    cfg = norm.parse_tag(tag)
    kernel = _kernel_patched(op, fields, {"_tuned": lambda key: cfg})
    assert kernel.config == cfg
    return kernel


# Round-10 candidate: the staged forward with several rows per CTA (``r2``/``r4`` with ``t``),
# a stage area per row slot and the weights shared.
STAGED_ROWS = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w4r2v8j4c1qt2", "bf16", 4096, "bf16", "none", {}, (1, 3, 4099)),
    ("w2r4v8j8c1ogqft3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (2, 5, 4099)),
    ("w4r2v8j8c1qft2", "bf16", 8192, "fp8_e5m2", "mxfp8", {}, (1, 2053)),
    ("w1r4v8j4c1t2", "fp16", 1000, "fp8_e4m3", "tensor", {"zero_centered_gamma": True}, (7, 301)),
    ("w2r2v4j8c1ft2", "fp32", 2048, "fp32", "none", {}, (9,)),
    ("w1r2v1j32c1t3", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    # the weights in registers: held once (h) or loaded per row (e)
    ("w4r1v8j8c8hogqt2", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 37)),
    ("w4r2v8j4c1eqt3", "bf16", 4096, "bf16", "none", {}, (3, 4099)),
    ("w1r2v8j4c1ht2", "fp16", 1000, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
]


@pytest.mark.parametrize("case", STAGED_ROWS, ids=lambda c: c[0] + "-" + c[1] + "-" + str(c[2]))
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_staged_rows(op, case):
    """The staged forward with 2 and 4 rows per CTA, and with its weights in registers (held,
    ``h``, over a cluster at 65536; loaded per row, ``e``), against the float64 reference: N = 1
    and N not a multiple of the rows per CTA (a row slot without a row in the last group),
    more rows than CTAs (the stages wrap), H = 1000 (a partial last access), H odd (2-byte
    accesses, copied element by element), fp16 x with zero-centred gamma, fp32 x with a 1e4
    mean offset, fp32 gamma, bf16, FP8 and MXFP8 z; unaligned x at 4096; and bit for bit
    (z bytes, mu, rsigma, amax) against the register kernel of the same layout."""
    import dataclasses

    tag, in_dtype, hidden, out, scaling, flags, counts = case
    fields = dict(in_dtype=in_dtype, out_dtype=out, scaling=scaling, hidden_size=hidden, **flags)
    kernel = _kernel_tagged(op, fields, tag)
    for rows in counts:
        run_forward(kernel, _sample_x(seed(op, tag, rows, "tr"), rows, hidden, in_dtype))
    if hidden == 4096:
        x_host = reference.sample_input((301, 4096), "bf16", seed(op, tag, "tr unaligned"))
        x = unaligned_bf16(x_host)
        run_forward(kernel, x_host, x=x)
    if scaling == "tensor" and in_dtype == "bf16" and not flags:
        plain = dataclasses.replace(kernel.config, stages=0, gamma32=False).tag
        register = _kernel_tagged(op, fields, plain)
        _assert_same_fp8(kernel, register, 3001, "tr bits")


def _sample_x(rng, rows, hidden, in_dtype):
    """x of ``rows`` x ``hidden`` for a test: fp32 with a 1e4 mean offset (catches one-pass
    variance), other dtypes the reference's sample."""
    if in_dtype == "fp32":
        return (1e4 + rng.standard_normal((rows, hidden))).astype(np.float32)
    return reference.sample_input((rows, hidden), in_dtype, rng)


def _switch_pair(op, fields, tag, switch="deferred"):
    """``op``'s kernel for ``fields`` with the layout ``tag`` (with ``switch`` on: ``i`` by
    default) and with the same layout without it."""
    import dataclasses

    kernel = _kernel_tagged(op, fields, tag)
    plain = _kernel_tagged(op, fields, dataclasses.replace(kernel.config, **{switch: False}).tag)
    return kernel, plain


# Round-11 candidate: the staged backward with each row's dx written a row later (``i``).
DEFERRED = [  # (tag, in dtype, H, flags, row counts)
    ("w8r1v8j4c8qlit3b2", "bf16", 65536, {}, (1, 5, 263, 2048)),
    ("w4r1v8j8c8it4b1", "bf16", 65536, {"zero_centered_gamma": True}, (37,)),
    ("w7r1v8j4c2qit3", "fp16", 14336, {"fp32_gamma": True}, (1, 1001)),
    ("w1r1v8j4c4qdit4", "bf16", 4096, {}, (2, 4099)),
    ("w8r1v8j2c1it5", "bf16", 4096, {}, (1, 3, 4099)),
    ("w1r1v1j32c1fdit3", "bf16", 1001, {}, (37,)),
    ("w2r1v4j8c1it3", "fp32", 2048, {}, (13,)),
]


@pytest.mark.parametrize("case", DEFERRED, ids=lambda c: c[0] + "-" + c[1] + "-" + str(c[2]))
@pytest.mark.parametrize("op", BWD)
def test_backward_deferred(op, case):
    """``i`` on the staged backward against the float64 reference: over clusters of 8, 4 and
    2 CTAs and one CTA, N = 1, N below and above the number of CTAs (clusters) in the
    persistent grid (a CTA with no row, one row, many: the last row's dx after the loop),
    N = 2048 at H = 65536, H odd (copied element by element), fp16 x with fp32 gamma,
    zero-centred gamma, fp32 x with a 1e4 mean offset, unaligned x at 4096; and bit for bit
    (dx, dgamma, dbeta) against the same layout without ``i``."""
    _check_backward_switch(op, case, "deferred", "defer")


def _check_backward_switch(op, case, switch, name):
    """A staged backward layout with ``switch`` on against the float64 reference and bit for
    bit (dx, dgamma, dbeta) against the same layout without it; unaligned bf16 x at 4096.
    ``case``: (tag, in dtype, H, flags, row counts); ``name`` seeds the inputs."""
    tag, in_dtype, hidden, flags, counts = case
    fields = dict(in_dtype=in_dtype, hidden_size=hidden, **flags)
    kernel, plain = _switch_pair(op, fields, tag, switch)
    for rows in counts:
        rng = seed(op, tag, rows, name)
        x_host = _sample_x(rng, rows, hidden, in_dtype)
        dz_host = reference.sample_input((rows, hidden), in_dtype, rng, outliers=4.0)
        got = [t.clone() for t in run_backward(kernel, x_host, dz_host=dz_host) if t is not None]
        want = run_backward(plain, x_host, dz_host=dz_host, check_result=False)
        for a, b in zip(got, [t for t in want if t is not None], strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if hidden == 4096:
        x_host = reference.sample_input((301, 4096), "bf16", seed(op, tag, f"{name} unaligned"))
        run_backward(kernel, x_host, x=unaligned_bf16(x_host))


# Round 11 on the staged forward (``i``, one row per CTA): each row's z written a row later.
FWD_DEFERRED = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w4r1v8j8c8hogqit3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 5, 300)),
    ("w4r1v8j8c8huqit4", "bf16", 65536, "bf16", "none", {}, (1, 37)),
    ("w4r1v8j8c8hqit3b1", "bf16", 65536, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
    ("w4r1v8j4c1hogqit3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w7r1v8j4c2ogqfit3", "bf16", 14336, "bf16", "none", {}, (3, 1001)),
    ("w4r1v8j4c1eqit3", "bf16", 4096, "bf16", "none", {}, (2, 4099)),
    ("w1r1v1j32c1uit3", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    ("w2r1v4j8c1it3", "fp32", 2048, "fp32", "none", {}, (9,)),
    ("w1r1v8j4c1hit4", "fp16", 1000, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
]


@pytest.mark.parametrize("case", FWD_DEFERRED, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_deferred(op, case):
    """``i`` on the staged forward against the float64 reference: clusters of 8 and 2 CTAs and
    one CTA, LayerNorm with and without ``u`` (one or two statistics exchanges per row), the
    weights held (``h``), loaded per row (``e``) or in shared memory (as fp32, ``f``), N = 1,
    N below and above the grid's CTAs (the last row's z after the loop), H odd and H = 1000,
    fp16 and fp32 x (a 1e4 mean offset), fp32 and zero-centred gamma, bf16, FP8 and MXFP8 z;
    unaligned x at 4096; and bit for bit against the same layout without ``i`` (z bytes; with
    FP8 from bf16 x also mu, rsigma, amax and scale_inv)."""
    _check_forward_switch(op, case, "deferred")


# Round 25: the staged kernels' stages on a 128-byte boundary (``A``).
FWD_ALIGNED = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w4r1v8j4c1hogqiAt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w14r2v8j4c1ogqAt2", "bf16", 14336, "fp8_e4m3", "tensor", {}, (1, 3, 301)),
    ("w7r1v8j8c1qfWAt4", "bf16", 14336, "bf16", "none", {"zero_centered_gamma": True}, (5,)),
    ("w4r1v8j8c8hogqiyzAt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 37)),
    ("w1r1v8j4c1hAt4", "fp16", 1000, "fp8_e5m2", "mxfp8", {}, (7,)),
]


@pytest.mark.parametrize("case", FWD_ALIGNED, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_aligned(op, case):
    """``A`` on the staged forward (TUNED's LayerNorm FP8 entries at 4096 and 14336, two rows
    per CTA, fp32 weights in shared memory, a cluster of 8, H = 1000 with MXFP8) against the
    float64 reference and bit for bit against the same layout without it."""
    if op == "rmsnorm_fwd":
        case = (case[0].replace("z", "").replace("W", ""), *case[1:])  # (LayerNorm only)
    _check_forward_switch(op, case, "aligned")


# Round 25: ``A`` on the staged backward.
BWD_ALIGNED = [  # (tag, in dtype, H, flags, row counts)
    ("w8r1v8j2c1At5", "bf16", 4096, {}, (1, 4099)),
    ("w7r1v8j4c2qAt3", "fp16", 14336, {"fp32_gamma": True}, (3,)),
]


@pytest.mark.parametrize("case", BWD_ALIGNED, ids=lambda c: c[0] + "-" + c[1] + "-" + str(c[2]))
@pytest.mark.parametrize("op", BWD)
def test_backward_aligned(op, case):
    """``A`` on the staged backward (one CTA, a cluster of 2 with fp16 x and fp32 gamma)
    against the float64 reference and bit for bit against the same layout without it."""
    _check_backward_switch(op, case, "aligned", "aligned")


def _check_forward_switch(op, case, switch, close=None, max_ties=1 / 50):
    """A forward layout with ``switch`` on against the float64 reference and against
    the same layout without it; unaligned bf16 x at 4096. ``case``: (tag, in dtype, H, out
    dtype, scaling, flags, row counts). ``close(got, want)`` judges the two z tensors; by
    default they must agree bit for bit (z bytes; with FP8 from bf16 x also mu, rsigma, amax
    and scale_inv). ``max_ties``: both kernels' z against the reference (check)."""
    tag, in_dtype, hidden, out, scaling, flags, counts = case
    if op == "rmsnorm_fwd":
        tag = tag.replace("u", "")  # (u: LayerNorm only)
    fields = dict(in_dtype=in_dtype, out_dtype=out, scaling=scaling, hidden_size=hidden, **flags)
    kernel, plain = _switch_pair(op, fields, tag, switch)
    assert getattr(kernel.config, switch) and not getattr(plain.config, switch)
    for rows in counts:
        x_host = _sample_x(seed(op, tag, rows, switch), rows, hidden, in_dtype)
        got = run_forward(kernel, x_host, max_ties=max_ties)[0].clone()
        want = run_forward(plain, x_host, max_ties=max_ties)[0]
        if close is None:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        else:
            close(got, want)
    if hidden == 4096 and in_dtype == "bf16":
        x_host = reference.sample_input((301, 4096), "bf16", seed(op, tag, switch, "unaligned"))
        run_forward(kernel, x_host, x=unaligned_bf16(x_host))
    if close is None and scaling == "tensor" and in_dtype == "bf16" and not flags:
        _assert_same_fp8(kernel, plain, 3001, f"{switch} bits")


# Round 13 on the staged forward (``y``): x read from its stage for each pass over it and,
# one access at a time, for the output stage.
FWD_REREAD = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w4r1v8j8c8hogqyt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 5, 300)),
    ("w4r1v8j8c8hogqiyt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (3, 300)),
    ("w4r1v8j8c8huqiyt4", "bf16", 65536, "bf16", "none", {}, (1, 37)),
    ("w4r1v8j8c8hqyt3b1", "bf16", 65536, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
    ("w4r1v8j4c1hogqyt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w4r1v8j4c1hogqiyt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (2, 4099)),
    ("w4r2v8j4c1hogqyt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w14r2v8j4c1ogqyt2", "bf16", 14336, "fp8_e4m3", "tensor", {}, (3, 1001)),
    ("w7r1v8j4c2ogqfiyt3", "bf16", 14336, "bf16", "none", {}, (3, 1001)),
    ("w4r1v8j4c1eqyt3", "bf16", 4096, "bf16", "none", {}, (2, 4099)),
    ("w1r1v1j32c1uyt3", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    ("w2r1v4j8c1iyt3", "fp32", 2048, "fp32", "none", {}, (9,)),
    ("w1r1v8j4c1hyt4", "fp16", 1000, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
]


@pytest.mark.parametrize("case", FWD_REREAD, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_reread(op, case):
    """``y`` on the staged forward against the float64 reference and bit for bit against the
    same layout without it: clusters of 8 and 2 CTAs and one CTA, one and two rows per CTA,
    with ``i`` and without, LayerNorm with and without ``u``, the weights held (``h``), loaded
    per row (``e``) or in shared memory (as stored, or fp32 ``f``), N = 1, N below and above
    the grid's CTAs, H odd and H = 1000, fp16 and fp32 x (a 1e4 mean offset), fp32 and
    zero-centred gamma, bf16, FP8 and MXFP8 z; unaligned x at 4096."""
    _check_forward_switch(op, case, "reread")


# Round 16 on the staged LayerNorm FP8 forward (``z``): one-pass statistics about x[row, 0].
FWD_SHIFTED = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w4r1v8j8c8hogqizt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 5, 300)),
    ("w4r1v8j8c8hogqiyzt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (3, 300)),
    ("w4r1v8j8c8hogqzt3", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 37)),
    ("w4r1v8j8c8hqyzt3b1", "bf16", 65536, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
    ("w4r1v8j4c1hogqzt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w4r1v8j4c1hogqiyzt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (2, 4099)),
    ("w4r2v8j4c1hogqzt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w14r2v8j4c1ogqzt2", "bf16", 14336, "fp8_e4m3", "tensor", {}, (3, 1001)),
    ("w7r1v8j4c2ogqfizt3", "bf16", 14336, "fp8_e4m3", "tensor", {}, (3, 1001)),
    ("w4r1v8j4c1eqzt3", "fp16", 4096, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (2, 300)),
    ("w1r1v1j32c1zt3", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    ("w2r1v4j8c1izt3", "fp32", 2048, "fp8_e4m3", "tensor", {}, (9,)),
    ("w1r1v8j4c1hzt4", "fp16", 1000, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
    # register layouts: K read from global memory
    ("w4r1v8j4c1hogqzx4", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w4r1v8j4c1ogqpzx64", "bf16", 4096, "fp8_e4m3", "tensor", {}, (2, 4099)),
    ("w4r1v8j8c8ogqpzx64", "bf16", 65536, "fp8_e4m3", "tensor", {}, (1, 37)),
    ("w2r1v1j16c1z", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    ("w1r4v4j8c1z", "fp32", 1000, "fp8_e4m3", "tensor", {}, (1, 9)),
    ("w8r1v8j4c1z", "fp16", 8192, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
]


@pytest.mark.parametrize("case", FWD_SHIFTED, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
def test_forward_shifted(case):
    """``z`` on the LayerNorm FP8 forward against the float64 reference (its one-pass
    bounds, reference.layernorm_fwd's ``shift``): staged and register layouts (several row
    groups per CTA, ``p``), clusters of 8 and 2 CTAs and one CTA, one to four rows per CTA,
    with and without ``i`` and ``y``, the weights held (``h``), loaded
    per row (``e``) or in shared memory (as stored, or fp32 ``f``), N = 1, N below and above
    the grid's CTAs, H odd (the shift copied element by element) and H = 1000, fp16 and fp32
    x (a 1e4 mean offset), fp32 and zero-centred gamma, FP8 and MXFP8 z; unaligned x at 4096.
    Beside the same layout without ``z`` (the two round the same values differently): no
    more than 1% of the z bytes differ, with tensor scaling never by more than one FP8 step;
    from fp32 x with its 1e4 mean offset, where x * rsigma - mu * rsigma loses about 2^-10 of
    a normalized unit (several subnormal steps near zero), no more than 5%. Against the
    reference, up to 5% of the z elements from that fp32 x may be at ties, with or without
    ``z``: the fp32 mean of a row near 1e4 is off by up to 6e-4 in both forms, several
    subnormal E4M3 steps once scaled (3.3% seen at H = 1000 without ``z``)."""
    tag, in_dtype, _, _, scaling, _, _ = case
    limit = 0.05 if in_dtype == "fp32" else 0.01

    def close(got, want):
        _assert_fp8_close(got, want, scaling, limit, tag, steps=in_dtype != "fp32")

    _check_forward_switch("layernorm_fwd", case, "shifted", close,
                          max_ties=max(limit, 1 / 50))  # fmt: skip


# Round 19 on the LayerNorm forward (``W``): each warp's two passes, one exchange per row.
FWD_WARP_STATS = [  # (tag, in dtype, H, out dtype, scaling, flags, row counts)
    ("w7r1v8j8c1qfWt4", "bf16", 14336, "bf16", "none", {}, (1, 5, 700)),
    ("w7r1v8j8c1W", "bf16", 14336, "bf16", "none", {"zero_centered_gamma": True}, (1, 37)),
    ("w4r1v8j4c1W", "bf16", 4096, "bf16", "none", {}, (1, 4099)),
    ("w4r1v8j4c1eqWt3", "bf16", 4096, "bf16", "none", {}, (2, 4099)),
    ("w4r1v8j4c1eqyWt3", "bf16", 4096, "bf16", "none", {}, (2, 300)),
    ("w4r2v8j4c1hogqWt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 4099)),
    ("w14r2v8j4c1ogqWt2", "bf16", 14336, "fp8_e4m3", "tensor", {}, (3, 1001)),
    ("w8r1v8j4c1W", "fp16", 8192, "fp8_e5m2", "mxfp8", {"zero_centered_gamma": True}, (7,)),
    ("w2r1v1j16c1W", "bf16", 1001, "fp8_e4m3", "tensor", {"fp32_gamma": True}, (9, 50)),
    ("w1r4v4j8c1W", "fp32", 1000, "fp32", "none", {}, (1, 9)),
    ("w2r1v4j8c1Wt3", "fp32", 2048, "fp32", "none", {}, (13,)),
    # with i: a row's z written after the next row's exchange
    ("w4r1v8j4c1hogqiWt3", "bf16", 4096, "fp8_e4m3", "tensor", {}, (1, 2, 4099)),
    ("w4r1v8j8c1ogqiWt3", "bf16", 8192, "fp8_e4m3", "tensor", {}, (3, 700)),
    ("w4r1v8j4c1eqiWt3", "bf16", 4096, "bf16", "none", {"zero_centered_gamma": True}, (2, 667)),
    ("w2r1v4j8c1iWt4", "fp32", 2048, "fp32", "none", {}, (1, 13, 401)),
]


@pytest.mark.parametrize("case", FWD_WARP_STATS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
def test_forward_warp_stats(case):
    """``W`` on the LayerNorm forward, register and staged, against the float64 reference:
    one warp per row (no exchange) and 2-14 warps, one to four rows per CTA, with ``e``,
    ``y``, ``h``, ``f`` and ``i`` (z a row later), N = 1 and 2, N below and above the grid's
    CTAs, H odd (one element per access) and H = 1000 (a partial last access: warps of
    different counts), fp16 and fp32 x
    (a 1e4 mean offset: every warp's mean near 1e4, the deviations from it small), fp32 and
    zero-centred gamma, bf16, fp32, FP8 and MXFP8 z; unaligned x at 4096. Beside the same
    layout without ``W``: mu is the same bits (the warps' sums are added in the same order);
    16-bit and FP8 z bytes differ in at most 1% of the elements (by one FP8 step with tensor
    scaling). rsigma: within 8 fp32 ulps from 16-bit x; from fp32 x with its 1e4 mean offset
    within 2e-4 relative, as docs/norms.md bounds it: each warp mean is rounded (by up to
    |mu| 2^-24 = 6e-4 there) and Chan's formula takes the rounded means as exact, which moves
    M2 by up to 2 n_w |m_w - mu| |delta_w| per warp (m_w within about 3 / sqrt(n_w) = 0.1 of
    mu at 1024 elements per warp), 1.2e-4 of M2; the base's own fp32 mean carries an error of
    the same 6e-4 into every x - mu. fp32 z therefore within 2e-4 relative and 2^-10
    absolute (one ulp of a mean near 1e4, times a rsigma near 1)."""
    tag, in_dtype, hidden, out, scaling, flags, _ = case

    def close(got, want):
        if out == "fp32":
            torch.testing.assert_close(got, want, rtol=2e-4, atol=2**-10)
        else:
            _assert_fp8_close(got, want, scaling, 0.01, tag, steps=out != "bf16")

    _check_forward_switch("layernorm_fwd", case, "warp_stats", close)
    fields = dict(in_dtype=in_dtype, out_dtype=out, scaling=scaling, hidden_size=hidden, **flags)
    kernel, plain = _switch_pair("layernorm_fwd", fields, tag, "warp_stats")
    x_host = _sample_x(seed(tag, "W stats"), 33, hidden, in_dtype)
    _, _, mu, rs = run_forward(kernel, x_host, stats=True)
    _, _, mu_want, rs_want = run_forward(plain, x_host, stats=True)
    assert torch.equal(mu, mu_want)
    torch.testing.assert_close(rs, rs_want, rtol=2e-4 if in_dtype == "fp32" else 8 * 2**-23, atol=0)


def _assert_fp8_close(got, want, scaling, limit, label, steps=True):
    """FP8 z bytes ``got`` and ``want`` (same shape): at most a fraction ``limit`` of them
    differ and, with tensor scaling and ``steps``, each by one step of the format at most (an
    MXFP8 block whose amax rounds across a power of two changes its scale and all 32 of its
    bytes)."""
    a = got.view(torch.uint8).to(torch.int16)
    b = want.view(torch.uint8).to(torch.int16)
    differ = a != b
    assert differ.float().mean().item() <= limit, label
    if scaling == "tensor" and steps:

        def position(c):  # signed position on the number line: -0 and +0 are both 0
            return torch.where(c >= 0x80, -(c & 0x7F), c)

        assert int((position(a) - position(b)).abs().max()) <= 1, label


@pytest.mark.parametrize(
    ("tag", "hidden"),
    [("w4r1v8j4c1hogqzt3", 4096), ("w4r1v8j8c8hogqiyzt3", 65536), ("w4r1v8j4c1hogqzx4", 4096)],
)
@pytest.mark.parametrize("first", [50.0, 256.0, -2000.0])
def test_forward_shifted_outlier_first_element(tag, hidden, first):
    """``z`` where the shift is far from the row's mean: x[:, 0] an outlier of ``first``
    standard deviations (256 = sqrt(65536): half the bound's cancellation; -2000 a "massive
    activation" in the first channel) over N(0, 1) bf16 rows. The kernel stays within the
    one-pass bounds of the reference, which are wider than the two-pass ones there (so more
    elements are at ties: up to 20%); beside the same layout without ``z``, at most 5% of the
    z bytes differ (2.2% in bench/norm_shift_error.py's emulation at 256). Not always by one
    step: rsigma's relative error (3e-3 there) is an absolute error of xhat * gamma, several
    steps where z is small against it (near zero, or where beta cancels xhat * gamma)."""
    fields = dict(in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor", hidden_size=hidden)
    kernel, plain = _switch_pair("layernorm_fwd", fields, tag, "shifted")
    x_host = reference.sample_input((37, hidden), "bf16", seed("outlier", tag, first))
    x_host[:, 0] = first
    x_host[5, 0] = 0.0  # one row whose shift is near its mean
    got, ref = run_forward(kernel, x_host, max_ties=0.2)
    want, two_pass = run_forward(plain, x_host)
    _assert_fp8_close(got, want, "tensor", 0.05, tag, steps=False)
    wider = np.delete(np.arange(37), 5)
    assert np.all(ref.rsigma_tol[wider] > two_pass.rsigma_tol[wider])


def test_residency_reports_the_grids_assumptions():
    """``residency``: the SM count, each function's CTAs per SM and, for a kernel over a
    thread block cluster, the clusters resident at once (at most what its persistent grid
    takes)."""
    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    k = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=65536)
    got = k.residency(dev)
    assert got["sm_count"] == sms and len(got["ctas_per_sm"]) == 1
    per_sm = got["ctas_per_sm"][0]
    assert per_sm >= 1
    if k.config.cluster > 1:  # sm_90: a cluster of CTAs, never more than the SMs hold
        assert 1 <= got["clusters"] <= sms * per_sm // k.config.cluster
    else:
        assert got["clusters"] == 0
    # launch_grid: the persistent grid is what is resident, in whole clusters
    held = got["clusters"] if k.config.cluster > 1 else sms * per_sm
    if k.config.stages and not k.config.ctas_per_sm:
        assert k.launch_grid(2048, device=dev) == min(held, 2048) * k.config.cluster
        assert k.launch_grid(3, device=dev) == 3 * k.config.cluster
    bwd = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=None).residency(dev)
    assert len(bwd["ctas_per_sm"]) >= 2 and min(bwd["ctas_per_sm"]) >= 1  # main and finalize
    assert bwd["clusters"] == 0
