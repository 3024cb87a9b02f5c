"""Cast / transpose family on a real GPU against the float64 references: cast, transpose,
cast_transpose with dbias and activation backward (plain and gated), multi-tensor launches,
MXFP8 and NVFP4 quantization. Odd shapes take the bounds-checked path, aligned shapes with a
partial last tile mix both paths in one launch; outputs are poisoned before each launch."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import nvrtc_engine as ne
from nvrtc_engine import reference
from nvrtc_engine.core import config
from nvrtc_engine.core.engine import Engine
from nvrtc_engine.families.cast import quantize
from nvrtc_engine.families.cast.spec import DACT_OPS, GATED_OPS
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from cast_edges import edge_input, nvfp4_non_finite_input, nvfp4_reference_with_nan  # noqa: E402
from test_gpu_gelu import poisoned, to_host, to_torch  # noqa: E402  (needs torch)

# Shapes looped over inside each test (one compile per test): all bounds-checked, then
# aligned rows with partial last tiles (both paths in one launch), then several full tiles.
SMALL = [(1, 1), (31, 33), (96, 320)]
PAIRS = [("bf16", "fp8_e4m3"), ("fp32", "bf16"), ("fp16", "fp8_e5m2"), ("bf16", "fp32")]


def rng_for(*key):
    """A generator seeded from ``key`` the same way in every process (``hash`` of a string
    differs between processes)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def for_shapes(shapes, check):
    """Run ``check(shape)`` for each shape, naming the shape in a failure."""
    for shape in shapes:
        try:
            check(shape)
        except AssertionError as exc:
            raise AssertionError(f"shape {shape}: {exc}") from exc


def sample(shape, dtype_name, rng, small_block=None):
    """Test input; ``small_block`` (n) scales the first n elements of row 0 by 1e-4 so that
    one block gets a tiny scale."""
    x = reference.sample_input(shape, dtype_name, rng)
    if small_block and x.size:
        x64 = x.astype(np.float64)
        x64[0, : min(shape[1], small_block)] *= 1e-4
        x = x64.astype(x.dtype)
    return x


def device(host: np.ndarray, dtype_name: str):
    """A CUDA tensor with exactly the host values (FP8 as uint8 storage)."""
    if ne.DTYPES[dtype_name].itemsize == 1:
        return torch.from_numpy(np.ascontiguousarray(host).view(np.uint8)).cuda()
    return to_torch(np.ascontiguousarray(host), dtype_name)


def bits(t):
    """The tensor's bytes as an integer tensor of the same shape (exact comparisons)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def fp32(value: float):
    return torch.tensor([value], dtype=torch.float32, device="cuda")


def poisoned_bytes(shape):
    return torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda")


def scale_for(rng, out_dtype):
    """A tensor scale for FP8 outputs (large enough that outliers saturate), else None."""
    return float(np.float32(rng.uniform(0.5, 16.0))) if ne.DTYPES[out_dtype].is_fp8 else None


def scaling_kwargs(scale):
    if scale is None:
        return {}
    return {"scale": fp32(scale), "amax": torch.zeros(1, device="cuda"),
            "scale_inv": fp32(float("nan"))}  # fmt: skip


def check_scaling(kwargs, ref, exact_amax: bool):
    if not kwargs:
        return
    got = kwargs["amax"].item()
    if exact_amax:
        assert got == ref.amax
    else:
        assert abs(got - ref.amax) <= float(ref.tolerance.max()) + 1e-30
    assert kwargs["scale_inv"].item() == float(ref.scale_inv)


def check_out(q, qt, ref, out_dtype, scale):
    """q against the reference (differences only at rounding ties), qt == q.T exactly."""
    factor = np.float64(np.float32(scale)) if scale is not None else 1.0
    n, ties = reference.check_close(
        to_host(q, out_dtype), ref.values * factor, out_dtype, ref.tolerance * factor
    )
    if out_dtype != "fp32":
        assert ties <= max(2, n // 1000), f"{ties} of {n} elements at rounding ties"
    assert torch.equal(bits(qt), bits(q).t())


# ---- cast and transpose -------------------------------------------------------------------


@pytest.mark.parametrize(("in_dtype", "out_dtype"), [*PAIRS, ("fp16", "fp16")])
def test_cast(in_dtype, out_dtype):
    rng = rng_for("cast", in_dtype, out_dtype)
    kernel = ne.get_kernel("cast", in_dtype=in_dtype, out_dtype=out_dtype)

    def check(shape):
        x_host = reference.sample_input(shape, in_dtype, rng)
        scale = scale_for(rng, out_dtype)
        kwargs = scaling_kwargs(scale)
        out = poisoned(shape, out_dtype)
        kernel(to_torch(x_host, in_dtype), out, **kwargs)
        torch.cuda.synchronize()
        x64 = x_host.astype(np.float64) * (np.float64(np.float32(scale)) if scale else 1.0)
        tol = reference.FP32_EPS * np.abs(x64)
        reference.check_close(to_host(out, out_dtype), x64, out_dtype, tol)
        if kwargs:
            assert kwargs["amax"].item() == np.abs(x_host.astype(np.float64)).max()
            assert kwargs["scale_inv"].item() == float(np.float32(1) / np.float32(scale))

    for_shapes([*SMALL, (3, 5, 7)], check)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_transpose(dtype):
    rng = rng_for("transpose", dtype)
    kernel = ne.get_kernel("transpose", in_dtype=dtype, out_dtype=dtype)
    one_byte = ne.DTYPES[dtype].itemsize == 1

    def check(shape):
        x_host = reference.sample_input(shape, "fp32", rng)
        x_host = reference.round_to(x_host.astype(np.float64), dtype)
        x = device(x_host, dtype)
        out = poisoned_bytes(shape[::-1]) if one_byte else poisoned(shape[::-1], dtype)
        assert kernel(x, out) is out
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(x).t())
        want = np.ascontiguousarray(x_host.T).view(np.uint8)
        assert (to_host(out, dtype).view(np.uint8) == want).all()

    large = [(4096, 4096)] if dtype in ("bf16", "fp8_e4m3") else []
    for_shapes([*SMALL, (64, 4096), *large], check)


# ---- cast_transpose, dbias, activation backward --------------------------------------------


def run_cast_transpose(op, in_dtype, out_dtype, shapes, *, arch=None):
    """The op on each shape against :func:`reference.cast_transpose` (one compile)."""
    rng = rng_for(op, in_dtype, out_dtype)
    fields = {} if arch is None else {"arch": arch}
    kernel = ne.get_kernel(op, in_dtype=in_dtype, out_dtype=out_dtype, **fields)
    for_shapes(shapes, lambda shape: _run_cast_transpose(kernel, rng, shape))


def _run_cast_transpose(kernel, rng, shape):
    op, in_dtype, out_dtype = kernel.key.op, kernel.key.in_dtype, kernel.key.out_dtype
    gated, dact = op in GATED_OPS, op in DACT_OPS
    m, k = shape
    width = 2 * k if gated else k
    g_host = reference.sample_input(shape, in_dtype, rng)
    a_host = reference.sample_input((m, width), in_dtype, rng) if (gated or dact) else None
    scale = scale_for(rng, out_dtype)
    kwargs = scaling_kwargs(scale)
    out, out_t = poisoned((m, width), out_dtype), poisoned((width, m), out_dtype)
    extra = {}
    dbias_op = "dbias" in op
    if dbias_op:
        extra["dbias"] = poisoned((k,), in_dtype)
        extra["workspace"] = torch.full((kernel.workspace_rows(m), k), float("nan"), device="cuda")
    args = (to_torch(g_host, in_dtype),) + (
        (to_torch(a_host, in_dtype),) if a_host is not None else ()
    )
    result = kernel(*args, out=out, out_t=out_t, **extra, **kwargs)
    torch.cuda.synchronize()
    assert result[0] is out and result[1] is out_t
    ref = reference.cast_transpose(op, g_host, out_dtype, scale, a_host)
    check_out(out, out_t, ref, out_dtype, scale)
    check_scaling(kwargs, ref, exact_amax=op in ("cast_transpose", "cast_transpose_dbias"))
    if dbias_op:
        assert result[2] is extra["dbias"]
        tol = reference.dbias_tolerance(ref.values, ref.tolerance, kernel.dbias_depth(m))
        reference.check_close(to_host(result[2], in_dtype), ref.dbias, in_dtype, tol, name="dbias")


@pytest.mark.parametrize(
    ("in_dtype", "out_dtype"), [*PAIRS, ("fp16", "fp16"), ("fp32", "fp8_e4m3")]
)
@pytest.mark.parametrize("op", ["cast_transpose", "cast_transpose_dbias"])
def test_cast_transpose_and_dbias(op, in_dtype, out_dtype):
    run_cast_transpose(op, in_dtype, out_dtype, [*SMALL, (64, 4096)])


@pytest.mark.parametrize(("in_dtype", "out_dtype"), PAIRS)
@pytest.mark.parametrize("op", list(DACT_OPS))
def test_cast_transpose_dbias_dact(op, in_dtype, out_dtype):
    run_cast_transpose(op, in_dtype, out_dtype, SMALL)


@pytest.mark.parametrize(("in_dtype", "out_dtype"), PAIRS)
@pytest.mark.parametrize("op", list(GATED_OPS))
def test_gated_dact_cast_transpose(op, in_dtype, out_dtype):
    run_cast_transpose(op, in_dtype, out_dtype, SMALL)


@pytest.mark.parametrize(
    "op", ["cast_transpose", "cast_transpose_dbias", "cast_transpose_dbias_dgelu",
           "dswiglu_cast_transpose"],
)  # fmt: skip
def test_every_load_group_gives_the_same_bytes(monkeypatch, op):
    """``TileConfig.load_group`` (compiled in memory, the key does not see it) changes only
    when chunks are loaded: q, qt, amax and dbias are the same bytes as with all chunks at
    once (load_group 0) of the same block size, on edge-only, mixed and full-tile shapes;
    each also against the reference. Across block sizes q, qt and amax are the same bytes;
    dbias is not compared there: the column sums add rows in another grouping (fp32
    rounding, each order fixed and within the reference's tolerance)."""
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    gated, dact = op in GATED_OPS, op in DACT_OPS
    shapes = [(96, 320), (300, 1024), (1024, 2048)]
    rng = rng_for("load groups", op)
    inputs = []
    for m, k in shapes:
        g = reference.sample_input((m, k), "bf16", rng)
        a = reference.sample_input((m, 2 * k if gated else k), "bf16", rng)
        inputs.append((to_torch(g, "bf16"), to_torch(a, "bf16") if gated or dact else None))
    first = None
    for threads, blocks, groups in [(128, 2, [0, 1, 2, 4]), (256, 4, [0, 1, 2])]:
        same_threads = None
        for group in groups:
            cfg = cast.TileConfig(threads, 128, 128, 16, blocks, group)
            monkeypatch.setattr(cast, "tile_config", lambda key, cfg=cfg: cfg)
            kernel = Engine().get(ne.make_key(op, in_dtype="bf16", out_dtype="fp8_e4m3"))
            assert kernel.config == cfg
            got = []
            for (x, a), (m, k) in zip(inputs, shapes, strict=True):
                width = 2 * k if gated else k
                out, out_t = poisoned((m, width), "fp8_e4m3"), poisoned((width, m), "fp8_e4m3")
                kw = {"scale": torch.full((1,), 2.0, device="cuda"),
                      "amax": torch.zeros(1, device="cuda"),
                      "scale_inv": torch.empty(1, device="cuda")}  # fmt: skip
                if "dbias" in op:
                    kw["dbias"] = poisoned((k,), "bf16")
                    kw["workspace"] = torch.full((kernel.workspace_rows(m), k), float("nan"),
                                                 device="cuda")  # fmt: skip
                kernel(x, *(() if a is None else (a,)), out=out, out_t=out_t, **kw)
                torch.cuda.synchronize()
                got.append([t.view(torch.uint8).cpu().numpy().tobytes()
                            for t in (out, out_t, kw["amax"], kw.get("dbias", out))])  # fmt: skip
            if first is None:
                first = got
            if same_threads is None:
                same_threads = got
            assert got == same_threads, f"{cfg}: bytes differ from load_group 0"
            assert [g[:3] for g in got] == [f[:3] for f in first], f"{cfg}: q, qt or amax"
            for_shapes([(300, 1024)], lambda shape, k=kernel: _run_cast_transpose(k, rng, shape))


# TileConfigs other than the defaults: (threads, blocks per SM, load_group, switches), the
# tile shape tile_config's; every switch on other block shapes, strip over 2 and 4 tiles.
TILE_CONFIGS = [
    (256, 4, 0, {"prefetch": True, "gather4": True}),
    (128, 8, 1, {"prefetch": True, "gather4": True}),
    (128, 4, 1, {"prefetch": True, "strip": 4}),
    (256, 4, 1, {"prefetch": True, "strip": 2}),
]


def _config_id(cand):
    threads, blocks, group, switches = cand
    return f"{threads}x{blocks}g{group}" + "".join(
        f"-{name}" + ("" if value is True else str(value)) for name, value in switches.items()
    )


@pytest.mark.parametrize("cand", TILE_CONFIGS, ids=_config_id)
@pytest.mark.parametrize(
    "op", ["cast_transpose", "cast_transpose_dbias", "cast_transpose_dbias_dgelu"]
)
def test_tile_configs_agree_with_the_default(monkeypatch, op, cand):
    """A configuration (compiled in memory; the key does not see it) against the reference
    on 1x1, 31x33 and 4096x4096; on 8192x28672 against the default kernel: q, qt and amax
    the same bytes, dbias within both summation orders' fp32 error bound (and against
    float64 for cast_transpose_dbias), and two runs of it the same bytes."""
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    key = ne.make_key(op, dtype="fp8")
    default = Engine().get(key)
    threads, blocks, group, switches = cand
    # from the default's tile shape without strip (the default takes it for dbias), then
    # the configuration's
    base = cast.tile_config(key)._replace(strip=0)
    cfg = base._replace(threads=threads, min_blocks=blocks, load_group=group,
                              **switches)  # fmt: skip
    monkeypatch.setattr(cast, "tile_config", lambda key: cfg)
    kernel = Engine().get(key)
    assert kernel.config == cfg  # (a candidate may be the default itself)
    rng = rng_for("tile configs", op, _config_id(cand))
    # 1000 x 1000: strips of 4 tiles cut short by the bottom edge, ending in edge tiles
    for_shapes(
        [(1, 1), (31, 33), (1000, 1000), (4096, 4096)],
        lambda shape: _run_cast_transpose(kernel, rng, shape),
    )

    m, k = 8192, 28672
    torch.manual_seed(28672)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    act = (torch.randn(m, k, device="cuda").to(torch.bfloat16),) if op in DACT_OPS else ()

    def run(kern):
        kw = scaling_kwargs(4.0)
        out, out_t = poisoned((m, k), "fp8_e4m3"), poisoned((k, m), "fp8_e4m3")
        if "dbias" in op:
            kw["dbias"] = poisoned((k,), "bf16")
            kw["workspace"] = torch.full((kern.workspace_rows(m), k), float("nan"), device="cuda")
        kern(x, *act, out=out, out_t=out_t, **kw)
        torch.cuda.synchronize()
        return out, out_t, kw["amax"], kw.get("dbias", kw["amax"])

    want, got, again = run(default), run(kernel), run(kernel)
    for name, a, b, c in zip(("q", "qt", "amax", "dbias"), want, got, again, strict=True):
        assert torch.equal(bits(b), bits(c)), f"{name}: two runs differ"
        if name != "dbias":
            assert torch.equal(bits(a), bits(b)), f"{name}: differs from the default kernel"
    if "dbias" not in op:
        return
    # Each fp32 sum is within gamma(depth) * sum |v| of the exact one; |dgelu| < 1.13.
    depth = max(kernel.dbias_depth(m), default.dbias_depth(m))
    gamma = depth * 2.0**-24 / (1 - depth * 2.0**-24)
    bound = gamma * x.double().abs().sum(0) * (1.2 if act else 1.0)
    d_want, d_got = want[3].double(), got[3].double()
    rounding = 2.0**-8 * (d_want.abs() + d_got.abs())  # each rounded once to bf16
    assert bool(((d_got - d_want).abs() <= 2 * bound + rounding).all()), "dbias vs default"
    if not act:
        exact = x.double().sum(0)
        assert bool(((d_got - exact).abs() <= bound + 2.0**-8 * exact.abs()).all()), "dbias"


@pytest.mark.parametrize(
    ("op", "shape"),
    [("cast_transpose", (4096, 4096)), ("cast_transpose_dbias", (4096, 4096)),
     ("cast_transpose_dbias_dgelu", (4096, 4096)), ("dswiglu_cast_transpose", (4096, 2048))],
)  # fmt: skip
def test_cast_transpose_4096(op, shape):
    run_cast_transpose(op, "bf16", "fp8_e4m3", [shape])


def test_arch_specific_target_of_this_device():
    """The device's arch-specific target (sm_90a on H200) compiles the same source; check
    its results against the reference too."""
    major, minor = torch.cuda.get_device_capability()
    for op in ["cast_transpose", "cast_transpose_dbias_dsilu", "dgeglu_cast_transpose"]:
        run_cast_transpose(op, "bf16", "fp8_e4m3", [(96, 320)], arch=f"sm_{major}{minor}a")


def test_cast_transpose_8192x28672():
    """The large shape, checked exactly: the kernel's value is fp32(x * scale), which numpy
    float32 reproduces, so every byte must match (qt compared to q on the GPU)."""
    rng = np.random.default_rng(8192)
    m, k = 8192, 28672
    kernel = ne.get_kernel("cast_transpose", dtype="fp8")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    x[17, 1234] = 30.0
    x[4000, 28000] = 0.0
    scale = float(np.float32(rng.uniform(4.0, 16.0)))
    kwargs = scaling_kwargs(scale)
    out = poisoned((m, k), "fp8_e4m3")
    out_t = poisoned((k, m), "fp8_e4m3")
    kernel(x, out=out, out_t=out_t, **kwargs)
    torch.cuda.synchronize()
    assert torch.equal(bits(out_t), bits(out).t())
    assert kwargs["amax"].item() == x.float().abs().max().item()
    rows = rng.choice(m, size=256, replace=False)
    index = torch.from_numpy(rows).cuda()
    x_rows = to_host(x[index], "bf16").astype(np.float32)
    want = reference.round_to((x_rows * np.float32(scale)).astype(np.float64), "fp8_e4m3")
    got = out.view(torch.uint8)[index].cpu().numpy()
    assert (got == want.view(np.uint8)).all()


def test_dbias_on_a_stream_and_allocated_outputs():
    rng = np.random.default_rng(21)
    kernel = ne.get_kernel("cast_transpose_dbias", dtype="bf16")
    g_host = reference.sample_input((300, 520), "bf16", rng)
    stream = torch.cuda.Stream()
    g = to_torch(g_host, "bf16")
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, out_t, dbias = kernel(g)
    stream.synchronize()
    ref = reference.cast_transpose("cast_transpose_dbias", g_host, "bf16")
    check_out(out, out_t, ref, "bf16", None)
    tol = reference.dbias_tolerance(ref.values, ref.tolerance, kernel.dbias_depth(300))
    reference.check_close(to_host(dbias, "bf16"), ref.dbias, "bf16", tol)
    assert dbias.dtype == torch.bfloat16 and out.shape == (300, 520) and out_t.shape == (520, 300)


def test_dbias_of_zero_rows_is_zero():
    kernel = ne.get_kernel("cast_transpose_dbias", dtype="fp8")
    dbias = poisoned((64,), "bf16")
    kernel(torch.empty(0, 64, dtype=torch.bfloat16, device="cuda"), dbias=dbias,
           **scaling_kwargs(1.0))  # fmt: skip
    torch.cuda.synchronize()
    assert (dbias.float() == 0).all()


# ---- multi_cast_transpose -------------------------------------------------------------------


@pytest.mark.parametrize(("in_dtype", "out_dtype"), [("bf16", "fp8_e4m3"), ("fp32", "fp16")])
def test_multi_cast_transpose_many_launches(in_dtype, out_dtype):
    rng = rng_for("multi", in_dtype, out_dtype)
    kernel = ne.get_kernel("multi_cast_transpose", in_dtype=in_dtype, out_dtype=out_dtype)
    shapes = [(1, 1), (31, 33), (64, 128), (96, 320), (17, 256), (128, 64), (5, 7), (200, 48),
              (0, 16)]  # fmt: skip
    count = 2 * 60 + 10  # three launches
    picks = [shapes[i] for i in rng.integers(0, len(shapes), size=count)]
    hosts = [reference.sample_input(s, in_dtype, rng) for s in picks]
    xs = [to_torch(h, in_dtype) for h in hosts]
    outs = [(poisoned(s, out_dtype), poisoned(s[::-1], out_dtype)) for s in picks]
    fp8 = ne.DTYPES[out_dtype].is_fp8
    scales = [scale_for(rng, out_dtype) for _ in picks]
    kw = [scaling_kwargs(s) for s in scales]
    lists = {}
    if fp8:
        lists = {"scales": [d["scale"] for d in kw], "amaxes": [d["amax"] for d in kw],
                 "scale_invs": [d["scale_inv"] for d in kw]}  # fmt: skip
    result = kernel(xs, outs=outs, **lists)
    torch.cuda.synchronize()
    assert len(result) == count
    for i, (h, (q, qt)) in enumerate(zip(hosts, result, strict=True)):
        assert q is outs[i][0] and qt is outs[i][1]
        ref = reference.cast_transpose("multi_cast_transpose", h, out_dtype, scales[i])
        check_out(q, qt, ref, out_dtype, scales[i])
        if fp8 and h.size:
            check_scaling(kw[i], ref, exact_amax=True)


# ---- MXFP8 and NVFP4 --------------------------------------------------------------------


def _padding_is_zero(scales, real):
    s = scales.cpu().numpy()
    mask = np.ones(s.shape, bool)
    mask[: real[0], : real[1]] = False
    return not s[mask].any()


@pytest.mark.parametrize("in_dtype", ["bf16", "fp32", "fp16"])
@pytest.mark.parametrize("out_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("layout", ["rowwise", "columnwise", "both"])
def test_mxfp8(in_dtype, out_dtype, layout):
    rng = rng_for("mxfp8", in_dtype, out_dtype, layout)
    kernel = ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype=out_dtype, layout=layout)
    large = [(4096, 4096)] if (in_dtype, out_dtype, layout) == ("bf16", "fp8_e4m3", "both") else []
    for_shapes([*SMALL, (64, 4096), *large], lambda shape: _check_mxfp8(kernel, rng, shape))


def _check_mxfp8(kernel, rng, shape, edges=False):
    in_dtype, out_dtype, layout = kernel.key.in_dtype, kernel.key.out_dtype, kernel.key.layout
    m, k = shape
    if edges:
        assert in_dtype == "bf16"
        x_host = edge_input(shape, rng)
    else:
        x_host = sample(shape, in_dtype, rng, small_block=32)
    outs = {}
    for direction in ("rowwise", "columnwise"):
        if layout in (direction, "both"):
            outs[f"{direction}_data"] = poisoned(shape, out_dtype)
            outs[f"{direction}_scale_inv"] = poisoned_bytes(mxfp8_scale_shape(m, k, direction))
    res = kernel(to_torch(x_host, in_dtype), **outs)
    torch.cuda.synchronize()
    for direction in ("rowwise", "columnwise"):
        data = getattr(res, f"{direction}_data")
        if layout not in (direction, "both"):
            assert data is None
            continue
        assert data is outs[f"{direction}_data"]
        want, scales, _ = reference.mxfp8_quantize(x_host.astype(np.float64), out_dtype, direction)
        got = getattr(res, f"{direction}_scale_inv")
        real = mxfp8_scale_shape(m, k, direction, padded=False)
        assert (got.cpu().numpy()[: real[0], : real[1]] == scales).all(), f"{direction} scales"
        assert _padding_is_zero(got, real)
        assert (to_host(data, out_dtype).view(np.uint8) == want.view(np.uint8)).all(), direction


def _quantize_both_paths(monkeypatch, kernel, x):
    """The kernel's outputs for ``x`` with the MXFP8 fast path on and off (each output's
    bytes), and which path each took (the tile function's launch spied on)."""
    m, k = x.shape
    calls = []
    real = quantize.QuantizeKernel._tile_launch
    monkeypatch.setattr(quantize.QuantizeKernel, "_tile_launch",
                        lambda self, *a: calls.append(1) or real(self, *a))  # fmt: skip
    got, took = {}, {}
    for fast in (True, False):
        monkeypatch.setattr(quantize, "MX_FAST_PATH", fast)
        del calls[:]
        outs = {}
        for direction in ("rowwise", "columnwise"):
            if kernel.key.layout in (direction, "both"):
                outs[f"{direction}_data"] = poisoned((m, k), kernel.key.out_dtype)
                outs[f"{direction}_scale_inv"] = poisoned_bytes(mxfp8_scale_shape(m, k, direction))
        kernel(x, **outs)
        torch.cuda.synchronize()
        got[fast] = {name: t.view(torch.uint8).clone() for name, t in outs.items()}
        took[fast] = bool(calls)
    monkeypatch.setattr(quantize, "MX_FAST_PATH", True)
    return got, took


@pytest.mark.parametrize("layout", ["both", "columnwise"])
@pytest.mark.parametrize(("in_dtype", "out_dtype"), [("bf16", "fp8_e4m3"), ("fp32", "fp8_e5m2"),
                                                     ("fp16", "fp8_e4m3")])  # fmt: skip
def test_mxfp8_fast_path_is_the_quantize_kernel(monkeypatch, in_dtype, out_dtype, layout):
    """quantize.MX_FAST_PATH: the activation tile kernel with the identity activation gives
    the quantize kernel's bytes, NaN and inf included (aligned shapes take it, others fall
    back); both against the reference on the smaller shapes."""
    kernel = ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype=out_dtype, layout=layout)
    rng = rng_for("mxfp8 fast", in_dtype, out_dtype, layout)
    shapes = [(128, 128), (256, 384), (4096, 4096)]
    if (in_dtype, layout) == ("bf16", "both"):
        shapes.append((8192, 28672))
    for m, k in [*shapes, (31, 33), (96, 320), (160, 128)]:
        x_host = sample((m, k), in_dtype, rng, small_block=32) if m * k < 2**24 else None
        if x_host is None:
            x = torch.randn(m, k, device="cuda").to(getattr(torch, ne.DTYPES[in_dtype].torch_name))
        else:
            x = to_torch(x_host, in_dtype)
        x[1 % m, 2 % k], x[40 % m, 3 % k] = float("nan"), float("inf")
        x[70 % m, 100 % k], x[100 % m, :32] = float("-inf"), float("nan")
        got, took = _quantize_both_paths(monkeypatch, kernel, x)
        aligned = m % 128 == 0 and k % 128 == 0
        assert took == {True: aligned, False: False}, (m, k)
        for name in got[True]:
            assert torch.equal(got[True][name], got[False][name]), (m, k, name)
    for shape in [(128, 128), (256, 384), (31, 33), (96, 320)]:  # against the reference
        for_shapes([shape], lambda sh: _check_mxfp8(kernel, rng, sh))


def test_mxfp8_both_8192x28672():
    """The large shape: sampled 32-row blocks against the reference, the rest of the scales
    and data checked for consistency (every row's and column's scale written)."""
    rng = np.random.default_rng(28672)
    m, k = 8192, 28672
    kernel = ne.get_kernel("quantize", dtype="fp8", layout="both")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    x[100, 200] = 30.0
    outs = {
        "rowwise_data": poisoned((m, k), "fp8_e4m3"),
        "columnwise_data": poisoned((m, k), "fp8_e4m3"),
        "rowwise_scale_inv": poisoned_bytes(mxfp8_scale_shape(m, k, "rowwise")),
        "columnwise_scale_inv": poisoned_bytes(mxfp8_scale_shape(m, k, "columnwise")),
    }
    res = kernel(x, **outs)
    torch.cuda.synchronize()
    for t in outs.values():
        assert not (t.view(torch.uint8) == 0xFF).any()  # poison gone (no NaN data, no 0xFF scale)
    for block in rng.choice(m // 32, size=6, replace=False):
        rows = slice(32 * block, 32 * block + 32)
        xb = to_host(x[rows], "bf16").astype(np.float64)
        for direction in ("rowwise", "columnwise"):
            want, scales, _ = reference.mxfp8_quantize(xb, "fp8_e4m3", direction)
            got = to_host(getattr(res, f"{direction}_data")[rows], "fp8_e4m3")
            assert (got.view(np.uint8) == want.view(np.uint8)).all()
            s = getattr(res, f"{direction}_scale_inv")
            got_s = s[rows, : k // 32] if direction == "rowwise" else s[block : block + 1, :k]
            assert (got_s.cpu().numpy() == scales).all()


def _nvfp4_check(res, x_host, amax, layout):
    m, k = x_host.shape
    for direction in ("rowwise", "columnwise"):
        data = getattr(res, f"{direction}_data")
        if layout not in (direction, "both"):
            assert data is None
            continue
        want = reference.nvfp4_quantize(x_host.astype(np.float64), amax, direction)
        got = data.cpu().numpy()
        assert got.shape == want.data.shape
        assert (got == want.data).all(), f"{direction} data"
        s = getattr(res, f"{direction}_scale_inv")
        real = nvfp4_scale_shape(m, k, direction, padded=False)
        assert (s.cpu().numpy()[: real[0], : real[1]] == want.scales).all(), f"{direction} scales"
        assert _padding_is_zero(s, real)


@pytest.mark.parametrize("in_dtype", ["bf16", "fp32", "fp16"])
@pytest.mark.parametrize("layout", ["rowwise", "columnwise", "both"])
def test_nvfp4(in_dtype, layout):
    rng = rng_for("nvfp4", in_dtype, layout)
    kernel = ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype="fp4_e2m1", layout=layout)
    large = [(4096, 4096)] if (in_dtype, layout) == ("bf16", "both") else []
    for_shapes([*SMALL, (64, 4096), *large], lambda shape: _check_nvfp4(kernel, rng, shape))


def _check_nvfp4(kernel, rng, shape):
    in_dtype, layout = kernel.key.in_dtype, kernel.key.layout
    m, k = shape
    x_host = sample(shape, in_dtype, rng, small_block=16)
    outs = {}
    for direction in ("rowwise", "columnwise"):
        if layout in (direction, "both"):
            data_shape = (m, -(-k // 2)) if direction == "rowwise" else (k, -(-m // 2))
            outs[f"{direction}_data"] = poisoned_bytes(data_shape)
            outs[f"{direction}_scale_inv"] = poisoned_bytes(nvfp4_scale_shape(m, k, direction))
    amax = fp32(float("nan"))
    scale_inv = fp32(float("nan"))
    res = kernel(to_torch(x_host, in_dtype), amax=amax, scale_inv=scale_inv, **outs)
    torch.cuda.synchronize()
    true_amax = float(np.abs(x_host.astype(np.float64)).max())
    assert res.amax is amax and amax.item() == true_amax
    assert scale_inv.item() == float(reference.nvfp4_encode_scale(true_amax)[1])
    _nvfp4_check(res, x_host, true_amax, layout)


@pytest.mark.parametrize("layout", ["rowwise", "columnwise", "both"])
def test_nvfp4_edge_values(layout):
    """Data and scales bit-exact on E2M1 midpoints (exact: amax 2688 gives S_enc 1 and every
    block holds a 6), values above 6 x the block scale, zeros, -0, values near the fp32
    minimum normal and negative values (tests/cast_edges.py)."""
    rng = rng_for("nvfp4 edges", layout)
    kernel = ne.get_kernel("quantize", dtype="fp4_e2m1", layout=layout)

    def check(shape):
        x_host = edge_input(shape, rng, sixes=True)
        res = kernel(to_torch(x_host, "bf16"), amax=fp32(2688.0), compute_amax=False)
        torch.cuda.synchronize()
        _nvfp4_check(res, x_host, 2688.0, layout)

    for_shapes([(64, 128), (48, 80), (33, 31), (256, 4096)], check)


@pytest.mark.parametrize("layout", ["rowwise", "columnwise", "both"])
def test_nvfp4_non_finite(layout):
    """NaN of either sign (quiet and signaling) gives 0x7, +-inf saturate to +-6, beside the
    edge values of test_nvfp4_edge_values; data and scales bit-exact (tests/cast_edges.py)."""
    rng = rng_for("nvfp4 non-finite", layout)
    kernel = ne.get_kernel("quantize", dtype="fp4_e2m1", layout=layout)

    def check(shape):
        x_host = nvfp4_non_finite_input(shape, rng)
        res = kernel(to_torch(x_host, "bf16"), amax=fp32(2688.0), compute_amax=False)
        torch.cuda.synchronize()
        m, k = shape
        for direction in ("rowwise", "columnwise"):
            if layout in (direction, "both"):
                want = nvfp4_reference_with_nan(x_host, 2688.0, direction)
                assert (getattr(res, f"{direction}_data").cpu().numpy() == want.data).all()
                real = nvfp4_scale_shape(m, k, direction, padded=False)
                s = getattr(res, f"{direction}_scale_inv").cpu().numpy()
                assert (s[: real[0], : real[1]] == want.scales).all(), f"{direction} scales"

    for_shapes([(64, 128), (48, 80), (33, 31), (256, 4096)], check)


def test_nvfp4_with_given_amax_and_allocated_outputs():
    rng = np.random.default_rng(44)
    kernel = ne.get_kernel("quantize", dtype="fp4_e2m1", layout="both")
    x_host = reference.sample_input((160, 272), "bf16", rng)
    given = float(np.float32(3.0 * np.abs(x_host.astype(np.float64)).max()))
    amax = fp32(given)
    res = kernel(to_torch(x_host, "bf16"), amax=amax, compute_amax=False)
    torch.cuda.synchronize()
    assert amax.item() == given and res.scale_inv is None
    assert res.rowwise_data.dtype == torch.uint8 and res.columnwise_data.shape == (272, 80)
    _nvfp4_check(res, x_host, given, "both")


def test_nvfp4_quantize_in_a_cuda_graph():
    rng = np.random.default_rng(45)
    kernel = ne.get_kernel("quantize", dtype="fp4_e2m1", layout="rowwise")
    x = to_torch(reference.sample_input((256, 1024), "bf16", rng), "bf16")
    amax, workspace = fp32(0.0), torch.empty(1024, device="cuda")
    data = poisoned_bytes((256, 512))
    scales = poisoned_bytes(nvfp4_scale_shape(256, 1024, "rowwise"))
    kw = dict(rowwise_data=data, rowwise_scale_inv=scales, amax=amax, workspace=workspace)
    kernel(x, **kw)  # load the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(x, **kw)
    x_host = reference.sample_input((256, 1024), "bf16", rng)
    x.copy_(to_torch(x_host, "bf16"))
    data.fill_(0xFF)
    amax.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    true_amax = float(np.abs(x_host.astype(np.float64)).max())
    assert amax.item() == true_amax
    res = type("R", (), {"rowwise_data": data, "rowwise_scale_inv": scales,
                         "columnwise_data": None})()  # fmt: skip
    _nvfp4_check(res, x_host, true_amax, "rowwise")


def test_errors_before_launch_with_real_tensors():
    ct = ne.get_kernel("cast_transpose", dtype="fp8")
    x = torch.zeros(8, 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ne.ArgumentError, match="x: is a cpu tensor"):
        ct(x.cpu(), **scaling_kwargs(1.0))
    with pytest.raises(ne.ArgumentError, match="x: must be C-contiguous"):
        ct(x.t(), **scaling_kwargs(1.0))
    multi = ne.get_kernel("multi_cast_transpose", dtype="bf16")
    with pytest.raises(ne.ArgumentError, match=r"xs\[1\]: has dtype torch.float16"):
        multi([x, x.half()])
    q = ne.get_kernel("quantize", dtype="fp8")
    with pytest.raises(ne.ArgumentError, match="rowwise_scale_inv: must hold bytes"):
        q(x, rowwise_scale_inv=torch.zeros(mxfp8_scale_shape(8, 16, "rowwise"), device="cuda"))
