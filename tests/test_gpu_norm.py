"""LayerNorm/RMSNorm on a real GPU against the float64 references: every dtype and output mode
(FP8 tensor-scaled, MXFP8), zero-centred and fp32 gamma, odd hidden sizes, large mean offsets,
N = 1, H = 65536 (thread block clusters on sm_90), specialized vs general kernels, backward
determinism, unaligned pointers, and errors raised before launch.

Tolerances are the per-element error bounds of :mod:`nvrtc_engine.families.norm.reference`; outputs
must equal the rounding of a value within that bound of the float64 result.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from test_gpu_gelu import poisoned, to_host, to_torch

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, reference
from nvrtc_engine.families.norm import spec as norm
from nvrtc_engine.families.norm.spec import TUNED, gamma_dtype
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape
from nvrtc_engine.families.shared.mx_reference import e8m0_multiplier, e8m0_scale

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


def z_of(res):
    """The z data of a forward result (of its BlockScaledOutput with MXFP8 output)."""
    return res.z.rowwise_data if isinstance(res.z, ne.BlockScaledOutput) else res.z


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
        assert z_of(res) is out and res.rsigma is rsigma
        ref = reference.rmsnorm_fwd(x_host, gamma_host, eps, zero_centered_gamma=zcg)
    else:
        res = kernel(x, gamma, beta, eps, out, mu, rsigma, **kwargs)
        assert z_of(res) is out and res.mu is mu and res.rsigma is rsigma
        shifted = getattr(kernel.config, "stats", None) == "shifted"
        shift = np.asarray(x_host, np.float64)[:, 0] if shifted else None
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
    else:  # MXFP8: z is a BlockScaledOutput
        assert res.z.rowwise_scale_inv is kwargs["scale_inv"] and res.z.columnwise_data is None
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


@pytest.mark.parametrize("hidden", [1024, 4096, 16384, 65536, None])
@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd"])
def test_forward_without_stats_writes_the_same_z(op, hidden):
    """stats=False (null mu/rsigma pointers) on the register, staged, cluster and general
    kernels: the same z, bit for bit, on the checked path and the prepared launch."""
    size = 1001 if hidden is None else hidden
    kernel = ne.get_kernel(
        op, in_dtype="bf16", **({} if hidden is None else {"hidden_size": hidden})
    )
    x = torch.randn(37, size, device="cuda").to(torch.bfloat16)
    gamma = torch.randn(size, device="cuda").to(torch.bfloat16)
    args = (x, gamma) if op == "rmsnorm_fwd" else (x, gamma, gamma)
    want = kernel(*args, 1e-5)
    for _ in range(2):
        got = kernel(*args, 1e-5, stats=False)
        assert got.rsigma is None and (op == "rmsnorm_fwd" or got.mu is None)
        assert torch.equal(got.z, want.z)


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
    assert out.z.rowwise_data.shape == (2, 8, 512) and out.mu.shape == (2, 8)
    scales = out.z.rowwise_scale_inv
    assert scales.dtype == torch.uint8
    assert tuple(scales.shape) == mxfp8_scale_shape(16, 512, "rowwise")
    assert not scales[16:].any() and not scales[:, 16:].any()
    with pytest.warns(DeprecationWarning, match="z.rowwise_scale_inv"):
        assert out.scale_inv is scales


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
    assert norm.norm_config(key).label == "general"  # no register layout: streamed, H compiled in
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
    z = cupy.asnumpy(res.z.rowwise_data).view(ne.DTYPES["fp8_e4m3"].numpy())
    check_mxfp8(z, cupy.asnumpy(res.z.rowwise_scale_inv), ref.z, ref.z_tol, "fp8_e4m3")
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


# ---- code switches of the specialized kernels (the norm spec's module defaults) ----


@pytest.mark.parametrize("entry", sorted(TUNED), ids=lambda e: f"{e[0]}-h{e[1]}-{e[2]}")
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


def test_forward_shifted_outlier_first_element():
    """The shifted statistics (TUNED's LayerNorm FP8 forward at 65536: one pass about the
    row's first element) where the shift is far from the row's mean: x[:, 0] an outlier of
    50, 256 (= sqrt(65536): half the bound's cancellation) or -2000 standard deviations (a
    "massive activation" in the first channel) over N(0, 1) bf16 rows. The kernel stays within
    the one-pass bounds of the reference, which are wider than the two-pass ones there (so more
    elements are at ties: up to 20%); beside the same configuration with two-pass statistics,
    at most 5% of the z bytes differ (2.2% in tests/norm_shift_emulation.py's emulation at 256).
    Not always by one step: rsigma's relative error (3e-3 there) is an absolute error of
    xhat * gamma, several steps where z is small against it."""
    fields = dict(in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor", hidden_size=65536)
    kernel = ne.get_kernel("layernorm_fwd", **fields)
    assert kernel.config.stats == "shifted"
    two_pass = kernel.config._replace(stats="two_pass")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(norm, "norm_config", lambda key: two_pass)
        ne.clear_cache(disk=False)
        try:
            plain = ne.get_kernel("layernorm_fwd", **fields)
        finally:
            ne.clear_cache(disk=False)
    assert plain.config == two_pass
    for first in (50.0, 256.0, -2000.0):
        x_host = reference.sample_input((37, 65536), "bf16", seed("outlier", first))
        x_host[:, 0] = first
        x_host[5, 0] = 0.0  # one row whose shift is near its mean
        got, ref = run_forward(kernel, x_host, max_ties=0.2)
        want, two = run_forward(plain, x_host)
        _assert_fp8_close(got, want, "tensor", 0.05, str(first), steps=False)
        wider = np.delete(np.arange(37), 5)
        assert np.all(ref.rsigma_tol[wider] > two.rsigma_tol[wider])


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
    if k.config.staging and not k.config.staging.ctas_per_sm:
        assert k.launch_grid(2048, device=dev) == min(held, 2048) * k.config.cluster
        assert k.launch_grid(3, device=dev) == 3 * k.config.cluster
    bwd = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=None).residency(dev)
    assert len(bwd["ctas_per_sm"]) >= 2 and min(bwd["ctas_per_sm"]) >= 1  # main and finalize
    assert bwd["clusters"] == 0
