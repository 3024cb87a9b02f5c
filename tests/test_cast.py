"""Cast / transpose family without a GPU: every op, dtype pair, scaling and layout compiles
for sm_80/89/90/100a; keys and arguments are validated before launch; the references agree
with naive formulas (E2M1 table, NVFP4 scales, dbias bound); the FP4 device helper's software
path (compiled for the host) matches the reference bit for bit."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
import textwrap

import ml_dtypes
import numpy as np
import pytest
from fakes import FakeCupyArray

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, VariantError, make_key
from nvrtc_engine import reference as ref
from nvrtc_engine.core import config
from nvrtc_engine.core.engine import Engine
from nvrtc_engine.core.render import render, templates_dir
from nvrtc_engine.families.activation import kernels as activation
from nvrtc_engine.families.cast import quantize
from nvrtc_engine.families.cast import spec as cast
from nvrtc_engine.families.cast.quantize import QuantizeConfig, hardware_fp4, quantize_config
from nvrtc_engine.families.cast.reference import FLT_MAX
from nvrtc_engine.families.cast.spec import (
    _ENTRY,
    _TABLE_BYTES,
    DACT_OPS,
    GATED_OPS,
    MAX_TENSORS,
    _groups,
    tile_config,
)
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100a"]
HP = ["fp32", "fp16", "bf16"]
FP8 = ["fp8_e4m3", "fp8_e5m2"]
PAIRS = list(itertools.product(HP, HP + FP8))
TILE_OPS = [
    "cast_transpose", "cast_transpose_dbias", *DACT_OPS, *GATED_OPS, "multi_cast_transpose",
]  # fmt: skip
LAYOUTS = ["rowwise", "columnwise", "both"]


def _compile_cases() -> list[tuple[str, str, str, str, str]]:
    """(op, in, out, layout, arch) to compile. NVRTC takes 0.1-0.5 s per variant of this
    family on a 2-core machine, so the full product (~1000 variants) is covered by:
    every op for every arch (bf16 -> e4m3, every quantize scaling x layout), every dtype pair
    for every arch in the code all tile ops share (cast_transpose, cast, transpose,
    quantize), and every op x dtype pair x layout on sm_90."""
    cases = set()
    for arch in ARCHS:
        for op in ["cast", *TILE_OPS]:
            cases.add((op, "bf16", "fp8_e4m3", "rowwise", arch))
        for i, o in PAIRS:
            cases.add(("cast_transpose", i, o, "rowwise", arch))
            cases.add(("cast", i, o, "rowwise", arch))
        for d in HP + FP8:
            cases.add(("transpose", d, d, "rowwise", arch))
        for layout in LAYOUTS:
            cases.add(("quantize", "bf16", "fp8_e4m3", layout, arch))
            cases.add(("quantize", "bf16", "fp4_e2m1", layout, arch))
        for i in ("fp32", "fp16"):
            cases.add(("quantize", i, "fp8_e5m2", "both", arch))
            cases.add(("quantize", i, "fp4_e2m1", "both", arch))
    for op in TILE_OPS:
        for i, o in PAIRS:
            cases.add((op, i, o, "rowwise", "sm_90"))
    for i, o, layout in itertools.product(HP, [*FP8, "fp4_e2m1"], LAYOUTS):
        cases.add(("quantize", i, o, layout, "sm_90"))
    return sorted(cases)


@pytest.mark.matrix
@pytest.mark.parametrize(("op", "in_dtype", "out_dtype", "layout", "arch"), _compile_cases())
def test_variant_compiles(op, in_dtype, out_dtype, layout, arch):
    k = make_key(op, in_dtype=in_dtype, out_dtype=out_dtype, layout=layout, arch=arch)
    kernel = ne.get_kernel(k)
    image = kernel.artifact.image
    assert kernel.artifact.kind == "cubin" and image[:4] == b"\x7fELF"
    for symbol in kernel.artifact.symbols:
        assert symbol.encode() in image


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_load_groups_compile(monkeypatch, arch):
    """``TileConfig.load_group`` values that divide a thread's chunks compile on every arch
    (dbias with dact, and gated); others are refused by the template's static_assert."""
    from nvrtc_engine.core.errors import CompileError
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    for op, group in [("cast_transpose_dbias_dgelu", 1), ("cast_transpose_dbias_dgelu", 2),
                      ("dswiglu_cast_transpose", 4)]:  # fmt: skip
        cfg = cast.TileConfig(128, 128, 128, 16, 2, group)  # 8 chunks per thread
        monkeypatch.setattr(cast, "tile_config", lambda key, cfg=cfg: cfg)
        kernel = Engine().get(make_key(op, dtype="fp8", arch=arch))
        assert kernel.config == cfg and kernel.artifact.image[:4] == b"\x7fELF"
    cfg = cast.TileConfig(128, 128, 128, 16, 2, 3)
    monkeypatch.setattr(cast, "tile_config", lambda key: cfg)
    with pytest.raises(CompileError, match="load_group"):
        Engine().get(make_key("cast_transpose_dbias", dtype="fp8", arch=arch))


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_tile_switches_compile(monkeypatch, arch):
    """The ``TileConfig`` switches ``prefetch`` and ``gather4`` (on by default from 16-bit
    input to FP8, the first for the dbias ops, the second for the others) compile together
    on every arch for cast_transpose,
    cast_transpose_dbias, every cast_transpose_dbias_d{act}, the gated ops and
    multi_cast_transpose, on their default block shapes and on 512 threads (2 chunks per
    thread); with them off the rendered source holds none of their code."""
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    chosen = cast.tile_config
    ops = ["cast_transpose", "cast_transpose_dbias", *cast.DACT_OPS, *cast.GATED_OPS,
           "multi_cast_transpose"]  # fmt: skip
    for op, shape in itertools.product(ops, [{}, dict(threads=512, min_blocks=4, load_group=0)]):
        key = make_key(op, dtype="fp8", arch=arch)
        if not shape:
            off = chosen(key)._replace(prefetch=False, gather4=False, strip=0)
            monkeypatch.setattr(cast, "tile_config", lambda key, off=off: off)
            source = render(key).source
            assert not any(s in source for s in ("prefetch_l2", "kSlots4")), op
        cfg = chosen(key)._replace(prefetch=True, gather4=True, strip=0, **shape)
        monkeypatch.setattr(cast, "tile_config", lambda key, cfg=cfg: cfg)
        kernel = Engine().get(key)
        assert kernel.config == cfg and kernel.artifact.image[:4] == b"\x7fELF", op
        monkeypatch.setattr(cast, "tile_config", chosen)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_strip_compiles(monkeypatch, arch):
    """``TileConfig.strip`` compiles on every arch for the dbias ops, cast_transpose and a
    gated op (one shared buffer: two do not fit 48 KB); the symbols carry ``_st<strip>``,
    the workspace has a row per strip and the launch a block per strip; with strip off the
    source holds none of it; multi_cast_transpose refuses it. The 16-bit -> FP8 dbias
    defaults take strip 2 (dbias) and 4 (dbias_d<act>), 256 threads; nothing else does."""
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    chosen = cast.tile_config
    for op, fields in [
        ("cast_transpose_dbias", dict(strip=4, prefetch=True)),
        ("cast_transpose_dbias", dict(strip=2, threads=256, min_blocks=4)),
        ("cast_transpose_dbias_dgelu", dict(strip=4, min_blocks=4)),
        ("cast_transpose_dbias_dsilu", dict(strip=3)),
        ("cast_transpose", dict(strip=4)),
        ("dswiglu_cast_transpose", dict(strip=2)),
    ]:  # fmt: skip
        key = make_key(op, dtype="fp8", arch=arch)
        default = chosen(key)
        want = (2 if op == "cast_transpose_dbias" else 4) if "dbias" in op else 0
        assert default.strip == want, op
        assert default.threads == 256 or not want, op
        off = default._replace(strip=0)
        monkeypatch.setattr(cast, "tile_config", lambda key, off=off: off)
        assert "run_strip" not in render(key).source
        monkeypatch.setattr(cast, "tile_config", chosen)
        cfg = default._replace(**fields)
        monkeypatch.setattr(cast, "tile_config", lambda key, cfg=cfg: cfg)
        kernel = Engine().get(key)
        tag = f"_st{cfg.strip}"
        assert kernel.artifact.symbols[0] == f"{key}{tag}", op
        assert kernel.config == cfg and kernel.artifact.image[:4] == b"\x7fELF", op
        if "dbias" in op:
            assert kernel.artifact.symbols[1] == f"{key}{tag}_dbias"
            assert kernel.workspace_rows(9 * 128 + 1) == -(-10 // cfg.strip)
        assert cfg.tile_blocks(10, 3) == -(-10 // cfg.strip) * 3
        monkeypatch.setattr(cast, "tile_config", chosen)
    multi = make_key("multi_cast_transpose", dtype="fp8", arch=arch)
    cfg = chosen(multi)._replace(strip=2)
    monkeypatch.setattr(cast, "tile_config", lambda key: cfg)
    with pytest.raises(ValueError, match="strip"):
        render(multi)
    monkeypatch.setattr(cast, "tile_config", chosen)
    with pytest.raises(ValueError, match="strip"):
        cast.TileConfig(128, 128, 128, 16, 4, 1, strip=-1)


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("cast_transpose", dict(dtype="fp8", hidden_size=4096)),
        ("cast_transpose_dbias_dgelu", dict(dtype="bf16", hidden_size=1000)),
        ("dswiglu_cast_transpose", dict(dtype="fp8_e5m2", hidden_size=8192)),
        ("transpose", dict(in_dtype="fp8", out_dtype="fp8", hidden_size=2048)),
        ("quantize", dict(dtype="fp4_e2m1", layout="both", hidden_size=7168)),
        ("quantize", dict(dtype="fp8", layout="columnwise", hidden_size=33)),
    ],
)
def test_hidden_size_specialized_variants_compile(op, fields):
    for arch in ("sm_90", "sm_100a"):
        assert ne.get_kernel(op, arch=arch, **fields).artifact.image[:4] == b"\x7fELF"


# ---- keys -------------------------------------------------------------------------------


def test_make_key_defaults_for_the_family():
    k = make_key("quantize", dtype="fp4_e2m1", arch="sm_100a")
    assert (k.in_dtype, k.out_dtype, k.scaling, k.layout) == (
        "bf16",
        "fp4_e2m1",
        "nvfp4",
        "rowwise",
    )
    assert str(k) == "quantize_bf16_e2m1_nvfp4_rowwise_hany_sm100a"
    assert ne.KernelKey.parse(str(k)) == k
    k = make_key("quantize", dtype="fp8", layout="both", arch="sm_90")
    assert (k.scaling, k.layout) == ("mxfp8", "both")
    k = make_key("cast_transpose", dtype="fp8", arch="sm_90")
    assert (k.in_dtype, k.out_dtype, k.scaling) == ("bf16", "fp8_e4m3", "tensor")
    k = make_key("transpose", in_dtype="fp8", out_dtype="fp8", arch="sm_90")
    assert (k.in_dtype, k.out_dtype, k.scaling) == ("fp8_e4m3", "fp8_e4m3", "none")
    k = make_key("dgeglu_cast_transpose", dtype="fp16", arch="sm_90")
    assert str(k) == "dgeglu_cast_transpose_fp16_fp16_none_rowwise_hany_sm90"
    assert ne.KernelKey.parse(str(k)) == k


@pytest.mark.parametrize(
    ("op", "fields", "match"),
    [
        ("transpose", dict(in_dtype="bf16", out_dtype="fp8"), "transpose keeps the dtype"),
        ("transpose", dict(dtype="fp8"), "out_dtype"),  # bf16 input by default
        ("transpose", dict(dtype="bf16", scaling="tensor"), "scaling"),
        ("cast_transpose", dict(in_dtype="fp8", out_dtype="bf16"), "in_dtype"),
        ("cast_transpose", dict(dtype="fp8", scaling="none"), "needs a scaling mode"),
        ("cast_transpose", dict(dtype="fp8", scaling="mxfp8"), "is the 'quantize' op"),
        ("cast_transpose", dict(dtype="bf16", layout="both"), "layout"),
        ("cast_transpose_dbias", dict(dtype="fp4_e2m1"), r"^dtype='fp4_e2m1' is not allowed"),
        ("multi_cast_transpose", dict(dtype="fp8", hidden_size=1024), "hidden_size"),
        ("quantize", dict(dtype="bf16"), r"^dtype='bf16' is not allowed"),
        ("quantize", dict(dtype="fp8", scaling="nvfp4"), "scaling"),
        ("quantize", dict(dtype="fp4_e2m1", scaling="mxfp8"), "scaling"),
        ("quantize", dict(dtype="fp8", scaling="tensor"), r"allowed: mxfp8, nvfp4$"),
        ("quantize", dict(in_dtype="fp8", out_dtype="fp4_e2m1"), "in_dtype"),
        ("dswiglu_cast_transpose", dict(dtype="fp8", scaling="nvfp4"), "is the 'quantize' op"),
    ],
)
def test_bad_keys_are_variant_errors(op, fields, match):
    with pytest.raises(VariantError, match=match):
        make_key(op, arch="sm_90", **fields)


def test_registry_lists_every_family_op():
    ops = ne.registered_ops()
    for op in ["cast", "transpose", "quantize", "multi_cast_transpose", *TILE_OPS]:
        assert op in ops


def test_fp4_dtype_and_scale_shapes():
    d = ne.DTYPES["fp4_e2m1"]
    assert d.is_fp4 and not d.is_fp8 and d.needs_scaling and d.max_finite == 6.0
    assert d.numpy() == np.dtype(ml_dtypes.float4_e2m1fn) and d.itemsize == 1
    assert ne.core.dtypes.dtype_name("e2m1") == "fp4_e2m1"
    assert nvfp4_scale_shape(31, 33, "rowwise") == (128, 4)
    assert nvfp4_scale_shape(31, 33, "rowwise", padded=False) == (31, 3)
    assert nvfp4_scale_shape(31, 33, "columnwise") == (128, 4)
    assert nvfp4_scale_shape(31, 33, "columnwise", padded=False) == (33, 2)
    assert nvfp4_scale_shape(256, 7168, "columnwise") == (7168, 16)
    with pytest.raises(ValueError, match="direction"):
        nvfp4_scale_shape(1, 1, "both")


def test_render_paths_per_arch():
    """Hardware E2M1 conversion only on arch-specific Blackwell targets; CUDA's cuda_fp8.h
    only where FP8 conversions have no instruction (sm_80); transposes never need it."""
    src = render(make_key("quantize", dtype="fp4_e2m1", arch="sm_100a")).source
    assert "#define NVE_HW_FP4 1" in src and "cuda_fp8.h" not in src
    src = render(make_key("quantize", dtype="fp4_e2m1", arch="sm_90")).source
    assert "NVE_HW_FP4" not in src
    assert render(make_key("quantize", dtype="fp4_e2m1", arch="sm_80")).cuda_headers
    assert not render(
        make_key("transpose", in_dtype="fp8", out_dtype="fp8", arch="sm_80")
    ).cuda_headers
    assert [hardware_fp4(a) for a in ("sm_90a", "sm_100", "sm_100a", "sm_120f", "sm_103a")] == [
        False, False, True, True, True,
    ]  # fmt: skip


def test_tile_configs_are_consistent():
    for i, o in [*PAIRS, ("fp8_e4m3", "fp8_e4m3")]:
        cfg = tile_config(make_key("transpose" if i == o else "cast_transpose", in_dtype=i,
                                   out_dtype=o, arch="sm_90"))  # fmt: skip
        isz, osz = ne.DTYPES[i].itemsize, ne.DTYPES[o].itemsize
        assert cfg.chunk * min(isz, osz) == 16
        per_thread = cfg.tile_rows * cfg.tile_cols // cfg.threads
        assert per_thread % cfg.chunk == 0 and cfg.tile_rows % (16 // osz) == 0
        assert cfg.tile_rows * cfg.tile_cols * osz * 2 <= 48 * 1024  # gated: two tiles


# ---- arguments, checked before launch (fake CuPy arrays, no GPU) -----------------------

BF16, U1, F4 = "<u2", "|u1", "<f4"


def fake(shape, typestr=BF16, ptr=0x7F0000000000, device=0, strides=None):
    return FakeCupyArray(shape, typestr, ptr=ptr, device=device, strides=strides)


def scalars(prefix=""):
    return {f"{prefix}{n}": fake((1,), F4, ptr=0x2000 + 64 * i) for i, n in
            enumerate(("scale", "amax", "scale_inv"))}  # fmt: skip


@pytest.fixture(scope="module")
def kernels():
    get = ne.get_kernel
    return {
        "ct": get("cast_transpose", dtype="fp8", arch="sm_90"),
        "ct16": get("cast_transpose", dtype="bf16", arch="sm_90"),
        "dbias": get("cast_transpose_dbias_dgelu", dtype="fp8", arch="sm_90"),
        "gated": get("dswiglu_cast_transpose", dtype="fp8", arch="sm_90"),
        "t": get("transpose", in_dtype="fp8", out_dtype="fp8", hidden_size=64, arch="sm_90"),
        "multi": get("multi_cast_transpose", dtype="fp8", arch="sm_90"),
        "mx": get("quantize", dtype="fp8", layout="both", arch="sm_90"),
        "fp4": get("quantize", dtype="fp4_e2m1", layout="rowwise", arch="sm_90"),
    }


def test_config_is_the_kernels_configuration_and_read_only(kernels):
    from nvrtc_engine.families.cast.quantize import quantize_config

    for name, kernel in kernels.items():
        want = (quantize_config if name in ("mx", "fp4") else tile_config)(kernel.key)
        assert kernel.config == want, name
        with pytest.raises(AttributeError):
            kernel.config = want


def test_wrong_rank_and_hidden_size(kernels):
    with pytest.raises(ArgumentError, match=r"x: must be 2-D .* got shape \(4, 8, 64\)"):
        kernels["ct"](fake((4, 8, 64)), **scalars())
    with pytest.raises(ArgumentError, match="x: must be 2-D"):
        kernels["mx"](fake((64,)))
    with pytest.raises(ArgumentError, match="x: has 65 columns.*hidden_size=64"):
        kernels["t"](fake((4, 65), U1))


def test_cast_transpose_outputs_and_scaling(kernels):
    x = fake((32, 64))
    out, out_t = fake((32, 64), U1), fake((64, 32), U1)
    with pytest.raises(ArgumentError, match="scale: is required"):
        kernels["ct"](x, out=out, out_t=out_t)
    with pytest.raises(ArgumentError, match="amax: is required"):
        kernels["ct"](x, out=out, out_t=out_t, scale=scalars()["scale"])
    with pytest.raises(ArgumentError, match=r"out_t: has shape \(32, 64\); expected \(64, 32\)"):
        kernels["ct"](x, out=out, out_t=fake((32, 64), U1), **scalars())
    with pytest.raises(ArgumentError, match="out: has dtype <u2"):
        kernels["ct"](x, out=fake((32, 64)), out_t=out_t, **scalars())
    with pytest.raises(ArgumentError, match="has no scaling"):
        kernels["ct16"](x, out=fake((32, 64)), out_t=fake((64, 32)), scale=scalars()["scale"])
    with pytest.raises(ArgumentError, match="act_input: cast_transpose takes no act_input"):
        kernels["ct"](x, fake((32, 64)), out=out, out_t=out_t, **scalars())
    with pytest.raises(ArgumentError, match="dbias: .* computes no dbias"):
        kernels["ct"](x, out=out, out_t=out_t, dbias=fake((64,)), **scalars())
    with pytest.raises(ArgumentError, match="x: has dtype <f2"):
        kernels["ct"](fake((32, 64), "<f2"), out=out, out_t=out_t, **scalars())


def test_dact_and_gated_inputs(kernels):
    x = fake((32, 64))
    with pytest.raises(
        ArgumentError, match=r"act_input: is required for cast_transpose_dbias_dgelu"
    ):
        kernels["dbias"](x, **scalars())
    with pytest.raises(
        ArgumentError, match=r"act_input: has shape \(32, 65\); expected \(32, 64\)"
    ):
        kernels["dbias"](x, fake((32, 65)), **scalars())
    with pytest.raises(ArgumentError, match=r"act_input: .*expected \(32, 128\), \(M, 2H\)"):
        kernels["gated"](x, fake((32, 64)), **scalars())
    with pytest.raises(ArgumentError, match="act_input: is on device 1"):
        kernels["gated"](x, fake((32, 128), device=1), out=fake((32, 128), U1),
                         out_t=fake((128, 32), U1), **scalars())  # fmt: skip
    with pytest.raises(ArgumentError, match=r"dbias: has shape \(63,\)"):
        kernels["dbias"](x, fake((32, 64)), out=fake((32, 64), U1), out_t=fake((64, 32), U1),
                         dbias=fake((63,)), **scalars())  # fmt: skip
    with pytest.raises(ArgumentError, match=r"workspace: has shape \(2, 64\); expected \(1, 64\)"):
        kernels["dbias"](x, fake((32, 64)), out=fake((32, 64), U1), out_t=fake((64, 32), U1),
                         dbias=fake((64,)), workspace=fake((2, 64), F4), **scalars())  # fmt: skip


def test_multi_cast_transpose_lists(kernels):
    k = kernels["multi"]
    xs = [fake((16, 64)), fake((8, 32), ptr=0x7F0000100000)]
    outs = [(fake((16, 64), U1), fake((64, 16), U1)), (fake((8, 32), U1), fake((32, 8), U1))]
    s = [scalars(), scalars()]
    lists = {n: [d[n] for d in s] for n in ("scale", "amax")}
    with pytest.raises(ArgumentTypeError, match="xs: expected a list or tuple"):
        k(fake((16, 64)), outs=outs, scales=lists["scale"], amaxes=lists["amax"])
    with pytest.raises(ArgumentError, match=r"xs\[1\]: has dtype <f2"):
        k([xs[0], fake((8, 32), "<f2")], outs=outs, scales=lists["scale"], amaxes=lists["amax"])
    with pytest.raises(ArgumentError, match="scales: is required"):
        k(xs, outs=outs, amaxes=lists["amax"])
    with pytest.raises(ArgumentError, match="amaxes: has 1 entries; expected one per tensor"):
        k(xs, outs=outs, scales=lists["scale"], amaxes=lists["amax"][:1])
    with pytest.raises(ArgumentError, match=r"outs\[1\]\[1\]: has shape \(8, 32\)"):
        k(xs, outs=[outs[0], (outs[1][0], fake((8, 32), U1))], scales=lists["scale"],
          amaxes=lists["amax"])  # fmt: skip
    with pytest.raises(ArgumentError, match=r"xs\[1\]: is on device 2"):
        k([xs[0], fake((8, 32), device=2)], outs=outs, scales=lists["scale"],
          amaxes=lists["amax"])  # fmt: skip
    with pytest.raises(ArgumentError, match=r"xs\[0\]: must be 2-D"):
        k([fake((16,))], scales=lists["scale"][:1], amaxes=lists["amax"][:1])
    assert k([], scales=[], amaxes=[]) == []


def test_quantize_arguments(kernels):
    x = fake((64, 96))
    mx = kernels["mx"]
    row_s, col_s = mxfp8_scale_shape(64, 96, "rowwise"), mxfp8_scale_shape(64, 96, "columnwise")
    good = {
        "rowwise_data": fake((64, 96), U1),
        "rowwise_scale_inv": fake(row_s, U1),
        "columnwise_data": fake((64, 96), U1),
        "columnwise_scale_inv": fake(col_s, U1),
    }
    with pytest.raises(
        ArgumentError, match=r"rowwise_scale_inv: has shape \(64, 3\); expected \(128, 4\)"
    ):
        mx(x, **{**good, "rowwise_scale_inv": fake((64, 3), U1)})
    with pytest.raises(ArgumentError, match="columnwise_scale_inv: must hold bytes"):
        mx(x, **{**good, "columnwise_scale_inv": fake(col_s, F4)})
    with pytest.raises(ArgumentError, match="amax: is only for NVFP4"):
        mx(x, **good, amax=scalars()["amax"])
    fp4 = kernels["fp4"]
    data, scales = fake((64, 48), U1), fake(nvfp4_scale_shape(64, 96, "rowwise"), U1)
    with pytest.raises(
        ArgumentError, match=r"rowwise_data: has shape \(64, 96\); expected \(64, 48\)"
    ):
        fp4(x, rowwise_data=fake((64, 96), U1), rowwise_scale_inv=scales)
    with pytest.raises(ArgumentError, match="columnwise_data: .*writes no columnwise output"):
        fp4(x, rowwise_data=data, rowwise_scale_inv=scales, columnwise_data=fake((96, 32), U1))
    with pytest.raises(ArgumentError, match="amax: is required with compute_amax=False"):
        fp4(x, rowwise_data=data, rowwise_scale_inv=scales, compute_amax=False)
    with pytest.raises(ArgumentError, match="workspace: has 16 elements; needs at least 1024"):
        fp4(x, rowwise_data=data, rowwise_scale_inv=scales, amax=scalars()["amax"],
            workspace=fake((16,), F4))  # fmt: skip


def test_multi_table_layout_and_grouping():
    assert _ENTRY.size == 64 and _TABLE_BYTES <= 4096
    entries = [(0,) * 8 + (5, 1)] * (2 * MAX_TENSORS + 3)
    groups = _groups(entries)
    assert [len(g) for g in groups] == [MAX_TENSORS, MAX_TENSORS, 3]
    big = [(0,) * 8 + (t, 1) for t in (2**30 - 1, 2**30, 5)]
    assert [len(g) for g in _groups(big)] == [2, 1]  # at most 2**31 - 1 tiles per launch


def _between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i) + len(end)]


@pytest.mark.parametrize(("in_dtype", "out_dtype", "layout", "arch"),
                         [("bf16", "fp8_e4m3", "both", "sm_90"),
                          ("fp32", "fp8_e5m2", "columnwise", "sm_100a"),
                          ("fp16", "fp8_e4m3", "both", "sm_80")])  # fmt: skip
def test_mxfp8_fast_path_is_the_activation_tile_kernel(in_dtype, out_dtype, layout, arch):
    """quantize's ``_tile`` function is rendered from the same Jinja source as the activation
    family's MXFP8 tiled kernel: the same text but for the kernel name (and value(), the
    identity there, gelu here)."""
    fields = dict(in_dtype=in_dtype, out_dtype=out_dtype, layout=layout, arch=arch)
    qk = make_key("quantize", **fields)
    ak = make_key("gelu", scaling="mxfp8", **fields)
    q, a = render(qk).source, render(ak).source
    assert render(qk).symbols == (str(qk), f"{qk}_tile")
    for start, end in [("// ---- tiled kernel", "\n  }\n}\n"), ("// N outputs to chunk", "\n}\n")]:
        assert _between(q, start, end).replace(f"{qk}_tile", "K") == _between(
            a, start, end
        ).replace(str(ak), "K")
    assert "return nve::identity(x);" in q


def test_mxfp8_fast_path_keys():
    """Which keys carry the ``_tile`` function (see quantize.mx_tile_config)."""
    has = lambda **f: len(render(make_key("quantize", arch="sm_90", **f)).symbols) == 2  # noqa: E731
    assert has(dtype="fp8", layout="both") and has(dtype="fp8", layout="columnwise")
    assert has(dtype="fp8", layout="both", hidden_size=4096)
    assert not has(dtype="fp8", layout="both", hidden_size=4000)
    assert not has(dtype="fp8", layout="rowwise")
    assert (
        len(render(make_key("quantize", dtype="fp4_e2m1", layout="both", arch="sm_90")).symbols)
        == 3
    )


def test_mxfp8_fast_path_launch(monkeypatch):
    """Aligned M, K multiples of 128: function 1 (the tile kernel) with the activation tile
    kernel's grid and parameters; otherwise, or with the switch off, function 0."""
    rec = _Recorder(monkeypatch, {0: quantize.QUANTIZE, 1: activation.TILE})
    k = ne.get_kernel("quantize", dtype="fp8", layout="both", arch="sm_90")

    def call(m, n, base=0x10000):
        outs = {
            "rowwise_data": fake((m, n), U1, ptr=base + 0x1000000),
            "columnwise_data": fake((m, n), U1, ptr=base + 0x2000000),
            "rowwise_scale_inv": fake(mxfp8_scale_shape(m, n, "rowwise"), U1, ptr=0x3000),
            "columnwise_scale_inv": fake(mxfp8_scale_shape(m, n, "columnwise"), U1, ptr=0x4000),
        }
        del rec.calls[:]
        k(fake((m, n), ptr=base), **outs)
        return rec.calls

    ((index, grid, block, p),) = call(256, 384)
    assert (index, grid, block) == (1, (256 // 32) * (384 // 128), 128)
    assert (p["x"], p["grad"], p["y"], p["y_col"]) == (0x10000, 0, 0x1010000, 0x2010000)
    assert (p["s_row"], p["s_col"], p["rows"], p["cols_arg"]) == (0x3000, 0x4000, 256, 384)
    assert (p["s_row_stride"], p["s_col_stride"]) == (384 // 32, 384)
    assert call(200, 384)[0][0] == 0  # padding rows
    assert call(256, 320)[0][0] == 0  # padding columns
    assert call(256, 384, base=0x10008)[0][0] == 0  # unaligned
    monkeypatch.setattr(quantize, "MX_FAST_PATH", False)
    assert call(256, 384)[0][0] == 0


def test_template_has_no_cuda_includes_besides_fp8():
    text = (templates_dir() / "cast.cu.j2").read_text()
    includes = {line.split()[1] for line in text.splitlines() if line.startswith("#include")}
    assert includes <= {"<cuda_fp8.h>", '"nve_types.cuh"', '"nve_memory.cuh"', '"nve_reduce.cuh"',
                        '"nve_act.cuh"', '"nve_mx.cuh"', '"nve_fp4.cuh"'}  # fmt: skip


# ---- references against naive formulas --------------------------------------------------


def test_e2m1_code_table():
    codes = np.arange(16, dtype=np.uint8)
    values = ref.e2m1_decode(codes)
    assert list(values[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert list(values[8:]) == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6] and np.signbit(values[8])
    assert (ref.e2m1_encode(values) == codes).all()
    # midpoints round to the even code; beyond 6 saturates; NaN -> +6
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 1e30, np.inf])
    assert ref.e2m1_encode(mids).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7, 7]
    assert ref.e2m1_encode(-mids).tolist() == [8, 10, 10, 12, 12, 14, 14, 15, 15, 15]
    assert ref.e2m1_encode(np.array([np.nan, -0.1, 0.26])).tolist() == [7, 8, 1]


def test_e2m1_encode_matches_ml_dtypes():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(20000) * 3, rng.uniform(-8, 8, 20000),
                        np.arange(-700, 701) / 100]).astype(np.float32)  # fmt: skip
    theirs = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    assert (ref.e2m1_encode(v) == theirs).all()


def test_e2m1_packing_low_nibble_first():
    codes = np.array([[1, 2, 3], [15, 0, 7]], np.uint8)
    packed = ref.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x03], [0x0F, 0x07]]
    assert (ref.unpack_e2m1(packed, 3) == codes).all()


def test_nvfp4_matches_a_naive_block_loop():
    rng = np.random.default_rng(1)
    x = ref.sample_input((40, 70), "bf16", rng).astype(np.float64)
    x[3, 16:32] = 0.0  # an all-zero block
    x[5, :16] *= 1e-6  # a block whose scale underflows E4M3
    amax = float(np.abs(x).max())
    s_enc = np.float32(2688.0) / np.float32(amax)
    s_dec = np.float32(1.0) / s_enc
    for direction in ("rowwise", "columnwise"):
        r = ref.nvfp4_quantize(x, amax, direction)
        t = x if direction == "rowwise" else x.T
        rows, cols = t.shape
        assert r.data.shape == (rows, -(-cols // 2)) and r.scales.shape == (rows, -(-cols // 16))
        for i in range(rows):
            for j0 in range(0, cols, 16):
                block = t[i, j0 : j0 + 16].astype(np.float32)
                sv = np.float32(
                    np.float32(np.abs(block).max()) * np.float32(s_enc * np.float32(1 / 6))
                )
                byte = np.array([min(float(sv), 448.0)]).astype(ml_dtypes.float8_e4m3fn)
                assert r.scales[i, j0 // 16] == byte.view(np.uint8)[0]
                dec = np.float32(byte.astype(np.float32)[0])
                with np.errstate(divide="ignore"):
                    mult = np.float32(min(np.float32(1.0) / np.float32(dec * s_dec), FLT_MAX))
                want = (block * mult).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
                assert (r.codes[i, j0 : j0 + 16] == want.view(np.uint8)).all()
        back = (
            ref.e2m1_decode(r.codes)
            * np.repeat(r.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64), 16, axis=1)[
                :, :cols
            ]
        )
        back = back * np.float64(s_dec)  # fmt: skip
        err = np.abs(back - t)
        scale_of = np.repeat(np.abs(t).reshape(rows, -1).max(axis=1, keepdims=True), cols, axis=1)
        assert (err <= 0.25 * scale_of + 1e-3).all()  # within E2M1's half-step of the block max


def test_nvfp4_encode_scale_special_values():
    assert ref.nvfp4_encode_scale(0.0) == (np.float32(1.0), np.float32(1.0))
    assert ref.nvfp4_encode_scale(2688.0)[0] == np.float32(1.0)
    assert ref.nvfp4_encode_scale(np.inf)[0] == np.float32(1.0)
    assert ref.nvfp4_encode_scale(1e-45)[0] == FLT_MAX


def test_cast_transpose_reference_formulas():
    rng = np.random.default_rng(2)
    g = ref.sample_input((16, 8), "bf16", rng).astype(np.float64)
    a = ref.sample_input((16, 16), "bf16", rng).astype(np.float64)
    r = ref.cast_transpose("dswiglu_cast_transpose", g, "fp8_e4m3", 2.0, a)
    s = 1 / (1 + np.exp(-a[:, :8]))
    np.testing.assert_allclose(
        r.values[:, :8], g * s * (1 + a[:, :8] * (1 - s)) * a[:, 8:], rtol=1e-12
    )
    np.testing.assert_allclose(r.values[:, 8:], g * a[:, :8] * s, rtol=1e-12)
    assert r.amax == np.abs(r.values).max() and r.scale_inv == np.float32(0.5) and r.dbias is None
    r = ref.cast_transpose("cast_transpose_dbias_drelu", g, "bf16", None, a[:, :8])
    np.testing.assert_array_equal(r.dbias, (g * (a[:, :8] > 0)).sum(axis=0))
    r = ref.cast_transpose("cast_transpose_dbias", g, "fp8_e5m2", 1.0)
    np.testing.assert_array_equal(r.dbias, g.sum(axis=0))
    with pytest.raises(ValueError, match="no cast_transpose reference"):
        ref.cast_transpose("gelu", g, "bf16")


def test_dbias_tolerance_bounds_fp32_sums_in_any_order():
    rng = np.random.default_rng(3)
    v = (rng.standard_normal((3000, 4)) * np.exp(rng.uniform(-5, 5, (3000, 4)))).astype(np.float32)
    v64 = v.astype(np.float64)
    exact = v64.sum(axis=0)
    for order in (np.arange(3000), rng.permutation(3000)):
        acc = np.zeros(4, np.float32)
        for i in order:  # one long chain: depth 3000
            acc = (acc + v[i]).astype(np.float32)
        assert (np.abs(acc - exact) <= ref.dbias_tolerance(v64, np.zeros_like(v64), 3000)).all()


# ---- the FP4 device helper's software path, compiled for the host ----------------------

_HOST_SHIM = """
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
static inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
#include "nve_fp4.cuh"
extern "C" {
void encode(const float* v, unsigned char* out, int n) {
  for (int i = 0; i < n; i += 2) out[i / 2] = (unsigned char)nve::e2m1x2(v[i], v[i + 1]);
}
void e4m3(const unsigned char* b, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = nve::e4m3_value(b[i]);
}
void enc(const float* a, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = nve::nvfp4_encode_scale(a[i]);
}
void mult(const unsigned char* b, float s_dec, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = nve::nvfp4_block_multiplier(b[i], s_dec);
}
}
"""


@pytest.fixture(scope="module")
def fp4_helper(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("fp4")
    (d / "shim.cpp").write_text(textwrap.dedent(_HOST_SHIM))
    lib = d / "shim.so"
    subprocess.run([cxx, "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-I",
                    str(templates_dir() / "include"), str(d / "shim.cpp"), "-o", str(lib)],
                   check=True, capture_output=True)  # fmt: skip
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def test_device_e2m1_software_path_matches_reference(fp4_helper):
    rng = np.random.default_rng(4)
    edges = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
    near = np.concatenate([np.nextafter(edges, 0), edges, np.nextafter(edges, 10)])
    v = np.concatenate([near, -near, rng.standard_normal(100000).astype(np.float32) * 3,
                        np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 7.0,
                                  -np.nan], np.float32)]).astype(np.float32)  # fmt: skip
    if v.size % 2:
        v = np.append(v, np.float32(1.0))
    out = np.zeros(v.size // 2, np.uint8)
    fp4_helper.encode(_ptr(v), _ptr(out), ctypes.c_int(v.size))
    assert (out == ref.pack_e2m1(ref.e2m1_encode(v)[None, :])[0]).all()


def test_device_e2m1_software_path_bit_patterns(fp4_helper):
    """The arithmetic E2M1 conversion against the reference's nearest-value search on a
    stride through all fp32 bit patterns, every pattern within 64 ulps of each midpoint,
    E2M1 value and binade edge up to 8, and both signs."""
    sweep = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    marks = np.array([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0,
                      6.0, 8.0, 2.0**-126], np.float32).view(np.uint32)  # fmt: skip
    near = (marks[:, None].astype(np.int64) + np.arange(-64, 65)).ravel().astype(np.uint32)
    bits = np.concatenate([sweep, near, near | np.uint32(0x80000000)])
    bits = np.append(bits, np.zeros(bits.size % 2, np.uint32))  # an even count
    v = bits.view(np.float32)
    out = np.zeros(v.size // 2, np.uint8)
    fp4_helper.encode(_ptr(v), _ptr(out), ctypes.c_int(v.size))
    with np.errstate(invalid="ignore"):  # signaling NaN patterns
        want = ref.pack_e2m1(ref.e2m1_encode(v)[None, :])[0]
    bad = np.nonzero(out != want)[0]
    assert bad.size == 0, [(hex(bits[2 * i]), hex(bits[2 * i + 1])) for i in bad[:5]]


def test_device_nvfp4_scale_helpers_match_reference(fp4_helper):
    b = np.arange(256, dtype=np.uint8)
    finite = (b & 0x7F) != 0x7F
    got = np.zeros(256, np.float32)
    fp4_helper.e4m3(_ptr(b), _ptr(got), ctypes.c_int(256))
    want = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert (got[finite] == want[finite]).all()
    amax = np.array([0.0, 1e-45, 1.0, 3.0, 2688.0, 1e30, np.inf, 0.1], np.float32)
    enc = np.zeros(amax.size, np.float32)
    fp4_helper.enc(_ptr(amax), _ptr(enc), ctypes.c_int(amax.size))
    assert enc.tolist() == [float(ref.nvfp4_encode_scale(a)[0]) for a in amax]
    s_dec = ref.nvfp4_encode_scale(3.7)[1]
    mult = np.zeros(256, np.float32)
    fp4_helper.mult(_ptr(b), ctypes.c_float(s_dec), _ptr(mult), ctypes.c_int(256))
    with np.errstate(divide="ignore"):
        expect = np.minimum(np.float32(1) / (want * s_dec), FLT_MAX).astype(np.float32)
    pos = finite & (b < 0x80)
    assert (mult[pos] == expect[pos]).all()


# ---- launches, intercepted: grids and packed parameters (no GPU) ------------------------


class _Recorder:
    """Stands in for the driver: records (function index, grid, block, parameters), copying
    the parameter bytes at launch time as cuLaunchKernel does. ``signatures`` maps a function
    index to its kernel's signature, which reads the bytes back by parameter name (or to a
    number of bytes, kept as they are: a by-value struct)."""

    def __init__(self, monkeypatch, signatures):
        from nvrtc_engine.core import kernel as kernel_module
        from nvrtc_engine.families.cast import common as cast_common

        self.calls = []
        self.signatures = signatures
        device = type("D", (), {"sm_count": 132})()
        loaded = type("L", (), {"device": device, "functions": (0, 1, 2)})()
        monkeypatch.setattr(cast_common.CastKernelBase, "loaded", lambda self, dev: loaded)
        monkeypatch.setattr(kernel_module.driver, "make_current", lambda dev: None)
        monkeypatch.setattr(kernel_module, "launch", self._launch)

    def _launch(self, function, grid, block, shmem, dependent, stream, params):
        sig = self.signatures[function]
        size = sig if isinstance(sig, int) else sig.struct.size
        first = ctypes.c_void_p.from_address(params).value  # slot 0 of void*[]
        raw = ctypes.string_at(first, size)
        self.calls.append((function, grid, block, raw if isinstance(sig, int) else sig.unpack(raw)))


def test_cast_transpose_dbias_launches(monkeypatch, kernels):
    rec = _Recorder(monkeypatch, {0: cast.TILE, 1: cast.DBIAS})
    k = kernels["dbias"]
    cfg = tile_config(k.key)
    m, n = cfg.tile_rows + 32, 320  # two tile rows, the second partial
    parts = k.workspace_rows(m)  # a row per strip of tiles (the default takes strip 4)
    assert cfg.strip == 4 and parts == 1
    ws = fake((parts, n), F4, ptr=0x40000)
    args = dict(out=fake((m, n), U1, ptr=0x10000), out_t=fake((n, m), U1, ptr=0x20000),
                dbias=fake((n,), ptr=0x30000), workspace=ws)  # fmt: skip
    k(fake((m, n), ptr=0x50000), fake((m, n), ptr=0x60000), **args, **scalars())
    (i0, grid, block, p0), (i1, grid1, block1, p1) = rec.calls
    tiles_c = -(-n // cfg.tile_cols)
    assert (i0, grid, block) == (0, parts * tiles_c, cfg.threads)
    assert (i1, grid1, block1) == (1, 10, 256)
    names = ("x", "act", "q", "qt", "partial", "scale_ptr", "amax_ptr", "scale_inv_ptr", "M",
             "K", "vec")  # fmt: skip
    assert [p0[name] for name in names] == [0x50000, 0x60000, 0x10000, 0x20000, 0x40000,
                                            0x2000, 0x2040, 0x2080, m, n, 1]  # fmt: skip
    assert p1 == {"partial": 0x40000, "rows": parts, "K": n, "dbias": 0x30000}
    rec.calls.clear()
    odd = {"out": fake((m, 33), U1), "out_t": fake((33, m), U1), "dbias": fake((33,)),
           "workspace": fake((parts, 33), F4)}  # fmt: skip
    k(fake((m, 33), ptr=0x50000), fake((m, 33), ptr=0x60000), **odd, **scalars())
    assert rec.calls[0][3]["vec"] == 0  # unaligned rows: scalar path


def test_quantize_nvfp4_launches(monkeypatch):
    rec = _Recorder(monkeypatch, {0: quantize.QUANTIZE, 1: quantize.AMAX, 2: quantize.AMAX_FINAL})
    k = ne.get_kernel("quantize", dtype="fp4_e2m1", layout="both", arch="sm_90")
    m, n = 31, 33
    outs = {
        "rowwise_data": fake((m, 17), U1, ptr=0x1000),
        "columnwise_data": fake((n, 16), U1, ptr=0x2000),
        "rowwise_scale_inv": fake((128, 4), U1, ptr=0x3000),
        "columnwise_scale_inv": fake((128, 4), U1, ptr=0x4000),
    }
    k(fake((m, n), ptr=0x5000), **outs, amax=fake((1,), F4, ptr=0x6000),
      scale_inv=fake((1,), F4, ptr=0x7000), workspace=fake((1024,), F4, ptr=0x8000))  # fmt: skip
    (ia, ga, ba, pa), (if_, gf, bf, pf), (im, gm, bm, pm) = rec.calls
    assert (ia, ga, ba) == (1, 1, 256)
    assert pa == {"x": 0x5000, "n": m * n, "partial": 0x8000, "aligned": 1}
    assert (if_, gf, bf) == (2, 1, 1024) and pf == {"partial": 0x8000, "count": 1, "amax": 0x6000}
    padding = 128 * 4 - n * 2  # the larger of the two scale tensors' padding
    assert (im, bm) == (0, 256) and gm == 1 + -(-padding // 256)
    assert pm == {
        "x": 0x5000,
        "data_r": 0x1000,
        "scale_r": 0x3000,
        "data_c": 0x2000,
        "scale_c": 0x4000,
        "amax_ptr": 0x6000,
        "scale_inv_ptr": 0x7000,
        "M": m,
        "K": n,
        "pcol_r": 4,
        "prow_r": 128,
        "pcol_c": 4,
        "prow_c": 128,
        "tiles": 1,
        "vec": 0,
    }


def test_quantize_config_is_the_templates_tile():
    """One thread mapping for every quantize key: 256 threads per 64 x 128 tile, as the
    template declares it."""
    both = make_key("quantize", dtype="fp8", layout="both", arch="sm_90")
    fp4 = make_key("quantize", dtype="fp4_e2m1", layout="both", arch="sm_90")
    for key in (both, fp4, make_key("quantize", dtype="fp8", arch="sm_90")):
        cfg = quantize_config(key)
        assert cfg == QuantizeConfig() and (cfg.threads, cfg.tile) == (256, (64, 128))
        src = render(key).source
        assert "kThreads = 256;" in src and "kTileR = 64;" in src and "kTileC = 128;" in src
        assert "kMinBlocks = 4;" in src


def _frame_sizes(image: bytes) -> dict[int, int]:
    """Stack frame bytes per kernel symbol index (EIATTR_FRAME_SIZE in the cubin's .nv.info;
    nonzero when ptxas spilled registers, as no kernel of this family uses local arrays)."""
    shoff = int.from_bytes(image[0x28:0x30], "little")
    shentsize, shnum, shstrndx = (
        int.from_bytes(image[o : o + 2], "little") for o in (0x3A, 0x3C, 0x3E)
    )
    heads = [image[shoff + i * shentsize : shoff + (i + 1) * shentsize] for i in range(shnum)]
    strtab = int.from_bytes(heads[shstrndx][24:32], "little")
    sizes: dict[int, int] = {}
    for h in heads:
        name_at = strtab + int.from_bytes(h[0:4], "little")
        if image[name_at : image.index(b"\0", name_at)] != b".nv.info":
            continue
        off, size = int.from_bytes(h[24:32], "little"), int.from_bytes(h[32:40], "little")
        d, i = image[off : off + size], 0
        while i < size:
            fmt, attr = d[i], d[i + 1]
            if fmt == 4:  # sized value
                n = int.from_bytes(d[i + 2 : i + 4], "little")
                if attr == 0x11:  # EIATTR_FRAME_SIZE: (symbol, bytes)
                    sym, val = (
                        int.from_bytes(d[i + 4 : i + 8], "little"),
                        int.from_bytes(d[i + 8 : i + 12], "little"),
                    )
                    sizes[sym] = max(sizes.get(sym, 0), val)
                i += 4 + n
            else:
                i += 4 if fmt in (2, 3) else 2
    return sizes


@pytest.mark.parametrize("layout", ["rowwise", "columnwise", "both"])
@pytest.mark.parametrize("dtype", ["fp8", "fp4_e2m1"])
def test_default_quantize_kernels_do_not_spill(dtype, layout):
    image = ne.get_kernel("quantize", dtype=dtype, layout=layout, arch="sm_90").artifact.image
    sizes = _frame_sizes(image)
    assert sizes and not any(sizes.values()), sizes


def test_frame_size_reader_sees_a_spill(monkeypatch):
    """A tile kernel capped at 32 registers (512 threads x 4 blocks per SM, every load first)
    spills: the reader behind test_default_quantize_kernels_do_not_spill sees it."""
    from nvrtc_engine.families.cast import spec as cast

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    monkeypatch.setattr(cast, "tile_config", lambda key: cast.TileConfig(512, 128, 128, 16, 4))
    key = make_key("cast_transpose_dbias", dtype="fp8", arch="sm_90")
    assert any(_frame_sizes(Engine().get(key).artifact.image).values())


def test_quantize_mxfp8_launch(monkeypatch):
    rec = _Recorder(monkeypatch, {0: quantize.QUANTIZE})
    k = ne.get_kernel("quantize", dtype="fp8", layout="both", arch="sm_90")
    cfg = k.config
    m, n = 100, 300
    outs = {
        "rowwise_data": fake((m, n), U1, ptr=0x1000),
        "columnwise_data": fake((m, n), U1, ptr=0x2000),
        "rowwise_scale_inv": fake(mxfp8_scale_shape(m, n, "rowwise"), U1, ptr=0x3000),
        "columnwise_scale_inv": fake(mxfp8_scale_shape(m, n, "columnwise"), U1, ptr=0x4000),
    }
    k(fake((m, n), ptr=0x5000), **outs)
    ((index, grid, block, params),) = rec.calls
    rows, cols = cfg.tile
    tiles = -(-m // rows) * -(-n // cols)
    pr, pc = mxfp8_scale_shape(m, n, "rowwise"), mxfp8_scale_shape(m, n, "columnwise")
    padding = max(pr[0] * pr[1] - m * -(-n // 32), pc[0] * pc[1] - -(-m // 32) * n)
    assert (index, block) == (0, cfg.threads) and grid == tiles + -(-padding // cfg.threads)
    assert (params["tiles"], params["vec"]) == (tiles, 0)  # k % 16 != 0: scalar path


def test_multi_cast_transpose_tables(monkeypatch, kernels):
    import struct

    rec = _Recorder(monkeypatch, {0: _TABLE_BYTES})
    k = kernels["multi"]
    count = 2 * MAX_TENSORS + 5
    xs = [fake((64 + i, 128), ptr=0x100000 * (i + 1)) for i in range(count)]
    outs = [(fake((64 + i, 128), U1), fake((128, 64 + i), U1)) for i in range(count)]
    sc = [scalars() for _ in range(count)]
    k(xs, outs=outs, scales=[d["scale"] for d in sc], amaxes=[d["amax"] for d in sc])
    assert [c[:1] for c in rec.calls] == [(0,), (0,), (0,)]
    cfg = tile_config(k.key)
    seen = 0
    for _, grid, block, table in rec.calls:
        n, _pad = struct.unpack_from("<ii", table, _ENTRY.size * MAX_TENSORS)
        start = 0
        for j in range(n):
            entry = _ENTRY.unpack_from(table, j * _ENTRY.size)
            i = seen + j
            assert entry[0] == 0x100000 * (i + 1) and entry[6:8] == (64 + i, 128)
            assert entry[8] == start and entry[9] == int((64 + i) % 16 == 0)
            start += -(-(64 + i) // cfg.tile_rows)
        assert grid == start and block == cfg.threads
        seen += n
    assert seen == count
