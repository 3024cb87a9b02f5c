"""The activation family without a GPU: every variant compiles for sm_80/89/90/100a, keys and
render choices, and every bad argument is refused before anything is launched."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes import FakeCaiArray, FakeCupyArray

import nvrtc_engine as ne
from nvrtc_engine import (
    ArgumentError,
    ArgumentTypeError,
    KernelKey,
    NoDeviceError,
    VariantError,
    make_key,
)
from nvrtc_engine.core import config
from nvrtc_engine.core.render import render
from nvrtc_engine.families.activation.kernels import (
    ActivationConfig,
    ActivationGradKernel,
    ActivationKernel,
    ClampedSwiGLUGradKernel,
    ClampedSwiGLUKernel,
    LaunchConfig,
    MXFP8Output,
    TileConfig,
    launch_config,
    magic,
    row_config,
    tile_config,
)
from nvrtc_engine.families.activation.spec import ACTIVATION_SPECS
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100a"]
IN = ["fp32", "fp16", "bf16"]
# (out_dtype, scaling, layout): every output an activation kernel writes
OUTPUTS = [
    *((o, "none", "rowwise") for o in ("fp32", "fp16", "bf16")),
    *((o, "tensor", "rowwise") for o in ("fp8_e4m3", "fp8_e5m2")),
    *((o, "mxfp8", lay) for o in ("fp8_e4m3", "fp8_e5m2") for lay in ne.core.key.LAYOUTS),
]
OPS = [spec.name for spec in ACTIVATION_SPECS]
KIND = {spec.name: spec.kind for spec in ACTIVATION_SPECS}


def test_every_op_is_registered_with_its_kind():
    plain = ["gelu", "qgelu", "silu", "relu", "srelu", "sigmoid"]
    gated = ["glu", "geglu", "qgeglu", "swiglu", "reglu", "sreglu", "clamped_swiglu"]
    expected = {
        **{n: "act" for n in plain}, **{"d" + n: "dact" for n in plain},
        **{n: "gated" for n in gated}, **{"d" + n: "dgated" for n in gated},
    }  # fmt: skip
    assert expected == KIND
    assert set(expected) <= set(ne.registered_ops())


@pytest.fixture
def memory_only(monkeypatch):
    """No disk cache: these tests are about compiling, and the store's I/O would dominate."""
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache(disk=False)  # the engine re-reads its settings


def _compile_all(keys: list[KernelKey]) -> None:
    # NVRTC releases the GIL: two threads compile in parallel on a 2-core machine.
    with ThreadPoolExecutor(2) as pool:
        kernels = list(pool.map(ne.get_kernel, keys))
    for key, kernel in zip(keys, kernels, strict=True):
        image = kernel.artifact.image
        assert kernel.artifact.kind == "cubin" and image[:4] == b"\x7fELF", key
        assert str(key).encode() in image, key  # the extern "C" symbol, unmangled
        assert kernel.artifact.options[0] == f"-arch={key.arch}"


def variants(op: str, arch: str) -> list[tuple[str, str, str, str]]:
    """(in_dtype, out_dtype, scaling, layout) of ``op`` to compile for ``arch``.

    sm_90: every input dtype x every output. The other archs: every output, with the input
    dtype rotating over the op's index, so every op x output x scaling x layout and, per
    kind of op, every input x output compile for every arch (the op only selects the
    device function, which every op of its kind shares the code around), at a third of the
    compile time (this file stays near 4 minutes on 2 cores).
    """
    if arch == "sm_90":
        return [(i, *out) for i in IN for out in OUTPUTS]
    shift = OPS.index(op) + ARCHS.index(arch)
    return [(IN[(j + shift) % len(IN)], *out) for j, out in enumerate(OUTPUTS)]


def test_variants_cover_every_input_and_output_per_kind_and_arch():
    for arch in ARCHS:
        for kind in ("act", "dact", "gated", "dgated"):
            got = {v for op in OPS if KIND[op] == kind for v in variants(op, arch)}
            assert got == {(i, *out) for i in IN for out in OUTPUTS}, (arch, kind)
        assert {(op, *v[1:]) for op in OPS for v in variants(op, arch)} == {
            (op, *out) for op in OPS for out in OUTPUTS
        }


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
def test_every_variant_compiles(op, arch, memory_only):
    """Every output dtype x scaling x layout of ``op`` (input dtypes: see ``variants``),
    general hidden size."""
    keys = [
        make_key(op, in_dtype=i, out_dtype=o, scaling=s, layout=lay, arch=arch)
        for i, o, s, lay in variants(op, arch)
    ]
    _compile_all(keys)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_size_specialized_variants_compile(arch, memory_only):
    """Compile-time hidden sizes (the split point H of gated ops): one op per kind and
    scaling, an MXFP8 size and a size that is not a multiple of the vector width."""
    keys = []
    for op, (o, s, lay), hidden in itertools.product(
        ["gelu", "dsilu", "swiglu", "dclamped_swiglu"], OUTPUTS[2:5] + OUTPUTS[-1:], [96, 4099]
    ):
        if s == "mxfp8" and hidden % 32:
            continue
        keys.append(make_key(op, in_dtype="bf16", out_dtype=o, scaling=s, layout=lay,
                             hidden_size=hidden, arch=arch))  # fmt: skip
    _compile_all(keys)


def test_names_parse_back():
    for op in OPS:
        k = make_key(op, dtype="fp8", scaling="mxfp8", layout="both", hidden_size=64, arch="sm_90")
        assert KernelKey.parse(str(k)) == k
        assert str(k).startswith(f"{op}_bf16_e4m3_mxfp8_both_h64_sm90")


def test_render_picks_the_kernel_structure():
    def source(op, **kw):
        return render(make_key(op, arch="sm_90", **kw)).source

    flat = source("gelu", dtype="fp8")
    assert "flat element-wise kernel" in flat and "nve_mx.cuh" not in flat
    assert "const In::storage* __restrict__ grad" in source("dgelu", dtype="bf16")
    assert "const In::storage* __restrict__ grad" not in flat
    gated = source("swiglu", dtype="bf16")
    assert "row-flat kernel" in gated and "nve_reduce.cuh" not in gated
    assert "__shared__" not in gated
    rowwise = source("gelu", dtype="fp8", scaling="mxfp8")  # owner mode: a block per thread
    assert "row-flat kernel" in rowwise and "mx_scale_block(" not in rowwise
    assert "part[kOuts]" not in rowwise  # no columnwise pass
    gated_rowwise = source("swiglu", dtype="fp8", scaling="mxfp8")  # lane mode: shuffles
    assert "row-flat kernel" in gated_rowwise and "nve::mx_scale_block(" in gated_rowwise
    both = source("dswiglu", dtype="fp8", scaling="mxfp8", layout="both", hidden_size=4096)
    assert "const long long cols = 4096;" in both and "part[kOuts]" in both
    assert "constexpr int kOuts = 2;" in both
    clamped = source("clamped_swiglu", dtype="bf16")
    assert "nve::clamped_silu(a, p.limit, p.alpha)" in clamped
    e5m2 = source("gelu", dtype="e5m2", scaling="mxfp8")
    assert "0x1.24924a0000000p-16f" in e5m2  # fp32(1 / 57344)


def test_mxfp8_tile_is_one_columnwise_block_high():
    for dtype in IN:
        cfg = tile_config(make_key("gelu", in_dtype=dtype, out_dtype="fp8", scaling="mxfp8",
                                   arch="sm_90"))  # fmt: skip
        assert cfg.tile_rows() == 32


@pytest.mark.parametrize(
    ("fields", "field", "match"),
    [
        ({"in_dtype": "fp8_e4m3"}, "in_dtype", "fp8_e4m3"),
        ({"out_dtype": "bf16", "scaling": "mxfp8"}, "scaling", "is not scaled"),
        ({"scaling": "nvfp4"}, "scaling", "nvfp4"),
        ({"layout": "both"}, "layout", "MXFP8 only"),
        ({"scaling": "mxfp8", "hidden_size": 100}, "hidden_size", "multiple of 32"),
    ],
)
def test_variant_errors(fields, field, match):
    base = dict(op="dswiglu", in_dtype="bf16", out_dtype="fp8_e4m3", scaling="tensor",
                layout="rowwise", hidden_size=None, arch="sm_90")  # fmt: skip
    with pytest.raises(VariantError, match=match) as info:
        KernelKey(**{**base, **fields})
    assert info.value.field == field


# -- argument checks, before any launch (fake arrays: reaching the GPU would fail) ------------


def arr(shape, typestr="<u2", **kw):
    return FakeCupyArray(shape, typestr, **kw)


def scalars():
    return {n: arr((1,), "<f4", ptr=0x2000 + 16 * i) for i, n in enumerate(("scale", "amax"))}


@pytest.fixture(scope="module")
def kernels():
    def k(op, **kw):
        return ne.get_kernel(op, arch="sm_90", **kw)

    return {
        "gelu": k("gelu", dtype="bf16"),
        "dgelu8": k("dgelu", dtype="fp8"),
        "swiglu": k("swiglu", dtype="bf16", hidden_size=64),
        "dswiglu": k("dswiglu", dtype="bf16"),
        "clamped": k("clamped_swiglu", dtype="bf16"),
        "dclamped": k("dclamped_swiglu", dtype="fp8"),
        "mx_row": k("gelu", dtype="fp8", scaling="mxfp8"),
        "mx_both": k("dswiglu", dtype="fp8", scaling="mxfp8", layout="both"),
        "mx_col": k("swiglu", dtype="e5m2", scaling="mxfp8", layout="columnwise"),
    }


def test_kernel_classes(kernels):
    assert type(kernels["gelu"]) is ActivationKernel
    assert type(kernels["dgelu8"]) is ActivationGradKernel
    assert type(kernels["swiglu"]) is ActivationKernel
    assert type(kernels["dswiglu"]) is ActivationGradKernel
    assert type(kernels["clamped"]) is ClampedSwiGLUKernel
    assert type(kernels["dclamped"]) is ClampedSwiGLUGradKernel


def test_config_names_the_structure_and_launch_configuration(kernels, monkeypatch):
    """``kernel.config`` is the structure and configuration its key chose (the functions
    rendering used), read-only, and the block size launches use."""
    choose = {"flat": launch_config, "rows": row_config, "tile": tile_config}
    for name, kernel in kernels.items():
        cfg = kernel.config
        assert type(cfg) is ActivationConfig, name
        assert cfg.structure == kernel.key.spec.structure(kernel.key), name
        assert cfg.launch == choose[cfg.structure](kernel.key), name
        assert cfg.threads == cfg.launch.threads
        assert isinstance(cfg.launch, TileConfig if cfg.structure == "tile" else LaunchConfig)
    assert [kernels[n].config.structure for n in ("gelu", "swiglu", "mx_row", "mx_both")] == [
        "flat", "rows", "rows", "tile"]  # fmt: skip
    assert repr(kernels["gelu"].config) == (
        "ActivationConfig(structure='flat', launch=LaunchConfig(threads=128, unroll=1, "
        "owner=False))"
    )
    assert repr(kernels["mx_both"].config).startswith(
        "ActivationConfig(structure='tile', launch=TileConfig(threads=128, chunks_per_row=16, "
    )
    with pytest.raises(AttributeError):
        kernels["gelu"].config = kernels["swiglu"].config  # type: ignore[misc]
    with pytest.raises(AttributeError):
        kernels["gelu"].config.structure = "rows"  # type: ignore[misc]
    # what a launch uses: the block size, and a configuration other than the default
    swiglu = kernels["swiglu"]
    ((_, _, block, _),) = _launches(swiglu, monkeypatch, arr((8, 128)), arr((8, 64)))
    assert block == swiglu.config.threads
    assert _lane_mode(kernels["mx_row"], monkeypatch).config.launch == LaunchConfig(128, 4)


def test_rank_and_gated_shapes(kernels):
    with pytest.raises(ArgumentError, match="x: must have at least one dimension"):
        kernels["swiglu"](arr(()))
    with pytest.raises(ArgumentError, match="last dimension is 127.*must be even"):
        kernels["dswiglu"](arr((4, 63)), arr((4, 127)))
    with pytest.raises(ArgumentError, match=r"specialized for hidden_size=64 \(last dimension 2"):
        kernels["swiglu"](arr((4, 64)), arr((4, 32)))
    with pytest.raises(ArgumentError, match=r"out: has shape \(4, 128\); expected \(4, 64\)"):
        kernels["swiglu"](arr((4, 128)), arr((4, 128)))


def test_backward_grad_checks(kernels):
    x, out = arr((4, 128)), arr((4, 128))
    with pytest.raises(ArgumentError, match=r"grad: has shape \(4, 128\); expected \(4, 64\)"):
        kernels["dswiglu"](arr((4, 128)), x, out)
    with pytest.raises(ArgumentError, match="grad: has dtype <f4.*takes bf16"):
        kernels["dswiglu"](arr((4, 64), "<f4"), x, out)
    with pytest.raises(ArgumentError, match="grad: is on device 1"):
        kernels["dswiglu"](arr((4, 64), device=1), x, out)
    with pytest.raises(ArgumentError, match="x: has dtype <f2"):
        kernels["dgelu8"](arr((4, 64)), arr((4, 64), "<f2"), arr((4, 64), "|u1"), **scalars())


def test_mismatched_and_fp8_input_dtypes(kernels):
    with pytest.raises(ArgumentError, match=r"x: has dtype .u1 \(uint8\); .* takes bf16"):
        kernels["gelu"](arr((4, 64), "|u1"), arr((4, 64)))
    with pytest.raises(ArgumentError, match="out: has dtype <f4"):
        kernels["gelu"](arr((4, 64)), arr((4, 64), "<f4"))


def test_tensor_scaling_needs_scale_and_amax(kernels):
    g, x, y = arr((4, 64)), arr((4, 64)), arr((4, 64), "|u1")
    with pytest.raises(ArgumentError, match="scale: is required"):
        kernels["dgelu8"](g, x, y, amax=scalars()["amax"])
    with pytest.raises(ArgumentError, match="amax: is required"):
        kernels["dgelu8"](g, x, y, scale=scalars()["scale"])
    with pytest.raises(ArgumentError, match="scale: .*no scaling"):
        kernels["gelu"](x, arr((4, 64)), scale=scalars()["scale"])


def test_clamped_swiglu_parameters(kernels):
    x, y = arr((4, 128)), arr((4, 64))
    with pytest.raises(ArgumentError, match="limit: is required"):
        kernels["clamped"](x, y)
    with pytest.raises(ArgumentError, match="limit: must be > 0"):
        kernels["clamped"](x, y, limit=-1.0)
    with pytest.raises(ArgumentError, match="alpha: must be finite"):
        kernels["clamped"](x, y, limit=7.0, alpha=float("nan"))
    with pytest.raises(ArgumentError, match="limit: must be finite as fp32"):
        kernels["clamped"](x, y, limit=1e39)  # fp32's inf: refused, prepared call or not
    with pytest.raises(ArgumentTypeError, match="linear_offset: must be a real number"):
        kernels["clamped"](x, y, limit=7.0, linear_offset="1")
    with pytest.raises(ArgumentError, match="limit: is required"):
        kernels["dclamped"](arr((4, 64)), x, arr((4, 128), "|u1"), **scalars())


def mx_out(shape, layout, **overrides):
    rows, cols = shape
    fields = {}
    for i, direction in enumerate(("rowwise", "columnwise")):
        if layout in (direction, "both"):
            fields[direction + "_data"] = arr(shape, "|u1", ptr=0x100000 * (i + 1))
            s = mxfp8_scale_shape(rows, cols, direction)
            fields[direction + "_scale_inv"] = arr(s, "|u1", ptr=0x800000 * (i + 1))
    fields.update(overrides)
    return MXFP8Output(**fields)


def test_mxfp8_dimensions_must_be_multiples_of_32(kernels):
    with pytest.raises(ArgumentError, match="last dimension to be a multiple of 32.*it is 48"):
        kernels["mx_row"](arr((8, 48)), mx_out((8, 48), "rowwise"))
    with pytest.raises(ArgumentError, match="hidden size H to be a multiple of 32.*it is 48"):
        kernels["mx_both"](arr((64, 48)), arr((64, 96)), mx_out((64, 96), "both"))
    with pytest.raises(ArgumentError, match="number of rows.*multiple of 32.*it is 40"):
        kernels["mx_both"](arr((40, 64)), arr((40, 128)), mx_out((40, 128), "both"))
    with pytest.raises(ArgumentError, match="columnwise output needs the number of rows"):
        kernels["mx_col"](arr((5, 8, 128)), mx_out((40, 64), "columnwise"))


def test_mxfp8_output_buffers(kernels):
    k = kernels["mx_both"]
    g, x = arr((64, 32)), arr((64, 64))
    with pytest.raises(ArgumentTypeError, match="expected None or a BlockScaledOutput"):
        k(g, x, arr((64, 64), "|u1"))
    with pytest.raises(ArgumentError, match=r"out.rowwise_scale_inv: has shape \(64, 3\); expected "
                       r"\(128, 4\) .* or \(64, 2\)"):  # fmt: skip
        k(g, x, mx_out((64, 64), "both", rowwise_scale_inv=arr((64, 3), "|u1")))
    with pytest.raises(ArgumentError, match=r"out.columnwise_scale_inv: has dtype <u2 \(uint16"):
        k(g, x, mx_out((64, 64), "both", columnwise_scale_inv=arr((4, 128))))
    with pytest.raises(ArgumentError, match="out.columnwise_data: has shape"):
        k(g, x, mx_out((64, 64), "both", columnwise_data=arr((64, 32), "|u1")))
    with pytest.raises(ArgumentError, match="out.rowwise_data: has dtype <u2"):
        k(g, x, mx_out((64, 64), "both", rowwise_data=arr((64, 64))))
    with pytest.raises(
        ArgumentError, match="out.columnwise_data: is given, but .* layout is 'rowwise'"
    ):
        kernels["mx_row"](arr((8, 64)), mx_out((8, 64), "both"))
    with pytest.raises(ArgumentError, match="out.rowwise_scale_inv: is on device 2"):
        k(g, x, mx_out((64, 64), "both", rowwise_scale_inv=arr((128, 4), "|u1", device=2)))
    with pytest.raises(ArgumentError, match="x: must be 16-byte aligned for MXFP8"):
        k(g, arr((64, 64), ptr=0x7F0000000002), mx_out((64, 64), "both"))
    with pytest.raises(ArgumentError, match="scale: .*MXFP8 scales are computed per block"):
        k(g, x, mx_out((64, 64), "both"), scale=scalars()["scale"])
    # every check passes with compact (unpadded) scale tensors: the call reaches the device
    compact = mx_out((64, 64), "both", rowwise_scale_inv=arr((64, 2), "|u1"),
                     columnwise_scale_inv=arr((2, 64), "|u1"))  # fmt: skip
    with pytest.raises(NoDeviceError):
        k(g, x, compact, stream=0)


def test_non_mxfp8_kernel_refuses_mxfp8_output(kernels):
    with pytest.raises(ArgumentTypeError, match="is not MXFP8"):
        kernels["gelu"](arr((4, 64)), MXFP8Output())


def test_mxfp8_allocation_needs_a_library(kernels, monkeypatch):
    from nvrtc_engine.core import driver

    monkeypatch.setattr(driver, "pointer_device", lambda ptr: 0)
    with pytest.raises(ArgumentTypeError, match="out.rowwise_data: is required"):
        kernels["mx_row"](FakeCaiArray((8, 64), "<u2"))
    out = MXFP8Output(rowwise_data=FakeCaiArray((8, 64), "|u1"))
    with pytest.raises(ArgumentTypeError, match="out.rowwise_scale_inv: is required"):
        kernels["mx_row"](FakeCaiArray((8, 64), "<u2"), out)


# -- kernel structures and launch geometry ------------------------------------------------


def test_each_key_gets_its_kernel_structure():
    def structure(op, **kw):
        key = make_key(op, arch="sm_90", **kw)
        return key.spec.structure(key)

    assert structure("gelu", dtype="bf16") == "flat"
    assert structure("dgelu", dtype="fp8") == "flat"
    for op in ("swiglu", "dgeglu", "clamped_swiglu", "dclamped_swiglu"):
        assert structure(op, dtype="bf16") == "rows"
        assert structure(op, dtype="fp8") == "rows"
    for op in ("gelu", "dsilu", "swiglu", "dswiglu"):
        assert structure(op, dtype="fp8", scaling="mxfp8") == "rows"
        assert structure(op, dtype="fp8", scaling="mxfp8", layout="both") == "tile"
        assert structure(op, dtype="fp8", scaling="mxfp8", layout="columnwise") == "tile"
    cfg = row_config(make_key("swiglu", dtype="bf16", arch="sm_90"))
    assert cfg.vec(2) == 8 and cfg.threads % 32 == 0  # 16-byte chunks


def _launches(kernel, monkeypatch, *args, **kwargs):
    """The launches a call would submit, ``(function index, grid, block, parameter values by
    name)`` each (no driver: _submit is replaced)."""
    seen = []
    monkeypatch.setattr(kernel, "_prepared", {})  # (none: _submit prepares them)
    record = lambda *a, **k: seen.extend((i, g, b, v) for i, g, b, _, v in a[6])  # noqa: E731
    monkeypatch.setattr(kernel, "_submit", record)
    kernel(*args, **kwargs)
    return seen


def _steps(values):
    """The row-flat kernel's steps and magic pair, ``(ur, uq, sr, sq)`` and ``(m, s)``."""
    return (tuple(values[n] for n in ("ur", "uq", "sr", "sq")),
            (values["div_magic_arg"], values["div_shift_arg"]))  # fmt: skip


def test_row_flat_grid_and_aligned_flag(kernels, monkeypatch):
    swiglu = kernels["swiglu"]  # bf16, hidden_size=64
    cfg = row_config(swiglu.key)
    rows = 1000
    y = arr((rows, 64), ptr=0x7F0000100000)
    ((_, grid, block, values),) = _launches(swiglu, monkeypatch, arr((rows, 128)), y)
    assert block == cfg.threads and (values["rows"], values["cols_arg"]) == (rows, 64)
    assert values["aligned"] == 1
    assert grid == -(-(rows * 64 // 8) // (cfg.threads * cfg.unroll))
    # the per-shape steps and the magic pair for the division by 8 chunks per row
    stride = grid * cfg.threads * cfg.unroll
    assert _steps(values) == ((*divmod(cfg.threads, 8), *divmod(stride, 8)), magic(8))
    assert values["compact"] == 0
    # an unaligned pointer: the element path, one position per thread
    x = arr((rows, 128), ptr=0x7F0000000002)
    ((_, grid, _, values),) = _launches(swiglu, monkeypatch, x, y)
    assert values["aligned"] == 0 and grid == -(-(rows * 64) // cfg.threads)
    # H not a multiple of 8 elements: the element path
    dswiglu = kernels["dswiglu"]
    ((_, grid, _, values),) = _launches(dswiglu, monkeypatch, arr((3, 60)),
                                        arr((3, 120)), arr((3, 120)))  # fmt: skip
    assert values["aligned"] == 0 and (values["rows"], values["cols_arg"]) == (3, 60)
    assert grid == 1


def _lane_mode(kernel, monkeypatch):
    """``kernel``'s key built in lane mode (128 x 4, a chunk per lane), whatever the default
    mode of plain-op MXFP8 rowwise keys is."""
    import nvrtc_engine.families.activation.kernels as activation_ops
    from nvrtc_engine.core.engine import Engine

    monkeypatch.setattr(activation_ops, "row_config", lambda key: LaunchConfig(128, 4))
    return Engine().get(kernel.key)


def test_row_flat_grid_is_capped_for_huge_tensors(kernels, monkeypatch):
    """A tensor of more than 2^32 chunks: one pass, or at most MAX_GRID blocks that loop
    (the kernel splits chunk indices with 64-bit division past 2^32)."""
    import nvrtc_engine.families.activation.kernels as activation_ops

    kernel = _lane_mode(kernels["mx_row"], monkeypatch)
    rows, cols = 2**22, 2**14  # 2^36 positions, 2^33 chunks
    monkeypatch.setattr(activation_ops, "bind_mxfp8_output", lambda *a: _FakeBound())
    cfg = activation_ops.row_config(kernel.key)
    chunks = rows * cols // 8
    assert chunks > 2**32
    ((_, grid, _, values),) = _launches(kernel, monkeypatch, arr((rows, cols)))
    assert grid == chunks // (cfg.threads * cfg.unroll)
    assert (values["rows"], values["cols_arg"], values["aligned"]) == (rows, cols, 1)
    assert values["div_magic_arg"] == 0  # dividends past 2^31: no magic pair, 64-bit division
    monkeypatch.setattr(activation_ops, "MAX_GRID", 1000)
    ((_, grid, _, _),) = _launches(kernel, monkeypatch, arr((rows, cols)))
    assert grid == 1000


class _FakeBound:
    result = None
    rowwise, rowwise_scale, rowwise_scale_stride = 0x7F0000100000, 0x7F0000200000, 512
    columnwise = columnwise_scale = columnwise_scale_stride = 0
    fresh = ()


def test_row_flat_source_splits_chunks_by_row():
    src = render(make_key("dswiglu", dtype="bf16", arch="sm_90", hidden_size=4096)).source
    assert "row-flat kernel" in src and "const long long cols = 4096;" in src
    assert "split(static_cast<long long>(blockIdx.x)" in src  # one division per thread
    assert "nve::tile_coords(i, cols, r, cl);" in src  # the element path
    mx = render(make_key("dswiglu", dtype="fp8", scaling="mxfp8", arch="sm_90")).source
    assert "row-flat kernel" in mx and "mx_scale_block(" in mx and "if (aligned)" not in mx


# -- division-free row-flat kernel: magic numbers, E8M0, owner mode ----------------------


def test_magic_division_is_exact():
    """``magic(d)`` divides every n < 2^31 exactly (the device's ``nve::magic_div``):
    every divisor up to 2^12 against edge and random dividends, and random divisors."""
    import random

    rng = random.Random(1)

    def check(d):
        m, s = magic(d)
        assert 0 < m < 2**32 and 0 <= s <= 31
        ns = {0, 1, d - 1, d, d + 1, 2**31 - 1, 2**31 - 2, (2**31 - 1) // d * d}
        ns |= {q * d + r for q in (1, 2, 3, 2**31 // d - 1) for r in (0, d - 1)}
        ns |= {rng.randrange(2**31) for _ in range(64)}
        for n in ns:
            if 0 <= n < 2**31:
                t = (n * m) >> 32
                assert t + n < 2**32  # the device sum does not overflow
                assert (t + n) >> s == n // d, (n, d)

    for d in range(1, 4097):
        check(d)
    for _ in range(2000):
        check(rng.randrange(1, 2**31))
    for k in range(31):
        check(2**k)
        if 2**k > 1:
            check(2**k - 1)
            check(2**k + 1)
    with pytest.raises(ValueError):
        magic(0)


def _e8m0_reference(bits):
    """numpy model of ``nve::e8m0_from_amax`` on the bits of v = amax * max_norm_rcp."""
    import numpy as np

    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    is_zero = (bits & 0x7FFFFFFF) == 0
    up = (mantissa != 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + up.astype(np.uint32)
    e = np.where(is_zero, 0, e)
    return np.where(exponent == 0xFF, np.where(mantissa != 0, 0xFF, 0xFE), e)


def _e8m0_fast(bits):
    """numpy model of ``nve::e8m0_from_amax_fast``."""
    import numpy as np

    b = bits & np.uint32(0x7FFFFFFF)
    up = np.where(b < 0x800000, np.uint32(0x3FFFFF), np.uint32(0x7FFFFF))
    e = np.minimum((b + up) >> np.uint32(23), np.uint32(0xFE))
    return np.where(b > 0x7F800000, np.uint32(0xFF), e)


def test_fast_e8m0_matches_the_reference_bit_for_bit():
    """Both E8M0 functions are bit arithmetic on v's fp32 bits: every pattern with a step
    of 2^10 (4M patterns, both signs, every exponent) plus every pattern near each binade
    edge, subnormal half point, inf and NaN."""
    import numpy as np

    bits = [np.arange(0, 2**32, 2**10 + 1, dtype=np.uint64).astype(np.uint32)]
    edges = [e << 23 for e in range(256)] + [0x400000, 0x7F800000, 0x7F7FFFFF, 0x7FFFFFFF]
    for edge in edges:
        for sign in (0, 0x80000000):
            lo = max(edge - 4096, 0)
            bits.append((np.arange(lo, min(edge + 4096, 2**31), dtype=np.uint64) | sign)
                        .astype(np.uint32))  # fmt: skip
    allbits = np.concatenate(bits)
    np.testing.assert_array_equal(_e8m0_fast(allbits), _e8m0_reference(allbits))
    # the published cases
    f = np.array([0.0, -0.0, np.inf, np.nan, 1.0, 1.5, 2.0**-149, 2.0**-127, 3.0e38],
                 dtype=np.float32).view(np.uint32)  # fmt: skip
    assert list(_e8m0_fast(f)) == list(_e8m0_reference(f))
    assert list(_e8m0_reference(f)[:5]) == [0, 0, 0xFE, 0xFF, 127]


def test_owner_mode_is_for_plain_mxfp8_ops_only(monkeypatch):
    import nvrtc_engine.families.activation.kernels as activation_ops

    monkeypatch.setattr(activation_ops, "row_config",
                        lambda key: LaunchConfig(128, 2, owner=True))  # fmt: skip
    src = render(make_key("gelu", dtype="fp8", scaling="mxfp8", arch="sm_90")).source
    assert "Owner mode" in src and "__shfl_xor_sync" not in src
    with pytest.raises(ValueError, match="owner mode"):
        render(make_key("swiglu", dtype="fp8", scaling="mxfp8", arch="sm_90"))


def test_plain_mxfp8_rowwise_compact_flag_and_owner_grid(kernels, monkeypatch):
    import nvrtc_engine.families.activation.kernels as activation_ops

    kernel = _lane_mode(kernels["mx_row"], monkeypatch)
    rows, cols = 64, 4096  # scale row stride 128 = cols / 32: compact
    bound = type("B", (_FakeBound,), {"rowwise_scale_stride": 128})
    monkeypatch.setattr(activation_ops, "bind_mxfp8_output", lambda *a: bound())
    ((_, grid, _, values),) = _launches(kernel, monkeypatch, arr((rows, cols)))
    assert values["compact"] == (0 if kernel.key.spec.gated else 1)
    bound.rowwise_scale_stride = 132  # padded: the row is computed
    ((_, grid, _, values),) = _launches(kernel, monkeypatch, arr((rows, cols)))
    assert values["compact"] == 0 and _steps(values)[1] == magic(cols // 8)
    # owner mode: one thread per 32-value block and unroll step; the magic pair divides by
    # the blocks per row
    from nvrtc_engine.core.engine import Engine

    monkeypatch.setattr(activation_ops, "row_config",
                        lambda key: LaunchConfig(128, 2, owner=True))  # fmt: skip
    owner = Engine().get(kernel.key)
    ((_, grid, block, values),) = _launches(owner, monkeypatch, arr((rows, cols)))
    assert block == 128 and grid == -(-(rows * cols // 32) // 256)
    blocks = cols // 32
    steps = (*divmod(128, blocks), *divmod(grid * 256, blocks))
    assert _steps(values) == (steps, magic(blocks)) and values["compact"] == 0


def test_tile_grid_is_one_block_per_tile(kernels, monkeypatch):
    """The tiled kernel (MXFP8 columnwise and both) launches one block per tile of
    ``tile_rows() x tile_cols(vec)`` positions, edge tiles included."""
    import nvrtc_engine.families.activation.kernels as activation_ops
    from nvrtc_engine.core.engine import Engine

    cfg = activation_ops.TileConfig(64, 8, 4)  # 32 x 64 tiles for bf16
    monkeypatch.setattr(activation_ops, "tile_config", lambda key: cfg)
    kernel = Engine().get(kernels["mx_both"].key)  # dswiglu bf16 -> MXFP8 both
    monkeypatch.setattr(activation_ops, "bind_mxfp8_output", lambda *a: _FakeBound())
    rows, cols = 320, 992  # 10 x 16 tiles of 32 x 64 (the last one partial)
    ((_, grid, block, _),) = _launches(kernel, monkeypatch, arr((rows, cols)),
                                       arr((rows, 2 * cols)))  # fmt: skip
    assert block == 64 and grid == 10 * 16


def test_fp8_outputs_are_stored_as_words_and_tile_loads_are_clamped():
    """Every kernel structure stores FP8 outputs as 32-bit words from the paired
    conversions (``nve::convert_fp8_words``), others element by element; the tiled kernel
    loads without bounds checks (rows % 32 == 0 for MXFP8 columnwise and both)."""
    cases = [("gelu", "tensor", "rowwise"), ("swiglu", "tensor", "rowwise"),
             ("dgelu", "mxfp8", "rowwise"), ("geglu", "mxfp8", "both"),
             ("dswiglu", "mxfp8", "columnwise")]  # fmt: skip
    for op, scaling, layout in cases:
        for out in ("fp8_e4m3", "bf16"):
            if out == "bf16" and scaling != "tensor":
                continue
            key = make_key(op, in_dtype="bf16", out_dtype=out, layout=layout, arch="sm_90",
                           scaling=scaling if out != "bf16" else "none")  # fmt: skip
            src = render(key).source
            assert ("nve::convert_fp8_words<Out, N>" in src) == (out != "bf16"), key
            assert ("Clamped loads" in src) == (key.spec.structure(key) == "tile"), key
