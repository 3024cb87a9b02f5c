"""Norm family without a GPU: every variant compiles, keys and launch configurations are
valid, arguments are checked before launch, and the float64 references agree with naive
formulas and numerical gradients.

Compilation coverage (CPU time): every op x input dtype x output mode (x's dtype; e4m3 and
e5m2 with tensor scaling; e4m3 and e5m2 MXFP8) compiles for sm_80, sm_89, sm_90 and sm_100a at
hidden sizes None (general kernel), 1000 (not a multiple of 32) and 4096 (e5m2 outputs of the
specialized kernels only for sm_90: they differ from e4m3 in one conversion instruction), and
for sm_90 (where clusters split large rows) at 768, 5120, 8192, 14336 and 65536. The flags
(zero-centred gamma, fp32 gamma) compile for every op at all four archs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re

import numpy as np
import pytest
from fakes import FakeCaiArray, FakeCupyArray

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, KernelKey, VariantError, driver, make_key
from nvrtc_engine import reference as ref
from nvrtc_engine.key import arch_number
from nvrtc_engine.ops import get_spec, norm, norm_kernels, norm_layout, norm_switches
from nvrtc_engine.ops.norm import (
    LaunchConfig,
    fits_register_file,
    gamma_dtype,
    launch_config,
    loop_threads_per_row,
)
from nvrtc_engine.ops.norm_layout import _registers
from nvrtc_engine.ops.norm_switches import (
    BWD_MAX_ELEMENTS,
    MAX_ELEMENTS,
    MAX_REGISTERS,
    REGISTER_FILE,
)
from nvrtc_engine.render import render

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100a"]
DTYPES = ["fp32", "fp16", "bf16"]
FWD = ["layernorm_fwd", "rmsnorm_fwd"]
BWD = ["layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"]
MODES = [("same", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor"),
         ("fp8_e4m3", "mxfp8"), ("fp8_e5m2", "mxfp8")]  # fmt: skip
# issue 4's sizes for every arch, with 1000 and an odd one (1001: one element per access)
ALL_ARCH_HIDDEN = [None, 768, 1000, 1001, 4096, 5120, 8192, 14336, 65536]


def variants(hidden_sizes, archs):
    for arch in archs:
        for hidden in hidden_sizes:
            for dt in DTYPES:
                for op in FWD:
                    for out, scaling in MODES:
                        if out == "fp8_e5m2" and hidden is not None and arch != "sm_90":
                            continue  # differs from e4m3 in one conversion instruction
                        yield op, dt, dt if out == "same" else out, scaling, hidden, arch
                for op in BWD:
                    yield op, dt, dt, "none", hidden, arch


def variant_id(v):
    op, dt, out, scaling, hidden, arch = v
    return f"{op}-{dt}-{out}-{scaling}-h{hidden or 'any'}-{arch}"


@contextlib.contextmanager
def rules_only():
    """launch_config by the layout rules alone: norm_switches.TUNED (the measured winners) emptied,
    the configuration and kernel caches cleared on the way in and out."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(norm_switches, "TUNED", {})
        launch_config.cache_clear()
        ne.clear_cache(disk=False)
        try:
            yield monkeypatch
        finally:
            launch_config.cache_clear()
            ne.clear_cache(disk=False)


def tuned_tag(key):
    """TUNED's tag for ``key`` where the table applies (sm_90, 16-bit x and gamma), else
    None."""
    if arch_number(key.arch) != 90 or key.hidden_size is None or key.input.itemsize != 2:
        return None
    if ne.DTYPES[gamma_dtype(key)].itemsize != 2:
        return None
    return norm_switches.TUNED.get((key.op, key.hidden_size, key.scaling))


def switch_letters(tag):
    """The code-switch letters of a tag (what follows ``w..r..v..j..c..``; none for loop)."""
    return "" if tag == "loop" else re.sub(r"^w\d+r\d+v\d+j\d+c\d+", "", tag)


def compile_and_check(key):
    kernel = ne.get_kernel(key)
    art = kernel.artifact
    assert art.kind == "cubin" and art.image[:4] == b"\x7fELF"
    assert art.options[0] == f"-arch={key.arch}"
    assert art.symbols == key.spec.symbols(key)
    for symbol in art.symbols:
        assert symbol.encode() in art.image
    return kernel


@pytest.mark.matrix
@pytest.mark.parametrize(
    "variant",
    list(variants(ALL_ARCH_HIDDEN, ARCHS)),
    ids=variant_id,
)
def test_every_norm_variant_compiles(variant):
    op, dt, out, scaling, hidden, arch = variant
    key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling, hidden_size=hidden, arch=arch)
    kernel = compile_and_check(key)
    cfg = launch_config(key)
    assert kernel.artifact.symbols[0].endswith(cfg.tag)
    expected = 1 if op in FWD else (2 if cfg.mode == "regs" else 3)
    assert len(kernel.artifact.symbols) == expected


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", FWD + BWD)
def test_flags_compile(op, arch):
    out = "fp8_e4m3" if op in FWD else "bf16"
    for hidden in (None, 2048):
        key = make_key(op, in_dtype="bf16", out_dtype=out, hidden_size=hidden, arch=arch,
                       zero_centered_gamma=True, fp32_gamma=True)  # fmt: skip
        assert str(key).endswith("_wf32_zcg")
        source = render(key).source
        assert "typedef nve::f32 Wt;" in source and "kZcg = true" in source
        compile_and_check(key)


def test_key_names_and_parse():
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90", zero_centered_gamma=True)  # fmt: skip
    assert str(key) == "layernorm_fwd_bf16_e4m3_tensor_rowwise_h4096_sm90_zcg"
    assert KernelKey.parse(str(key)) == key
    bwd = make_key("rmsnorm_bwd_add", dtype="fp16", arch="sm_100a", fp32_gamma=True)
    assert str(bwd) == "rmsnorm_bwd_add_fp16_fp16_none_rowwise_hany_sm100a_wf32"
    assert KernelKey.parse(str(bwd)) == bwd
    assert key.spec.symbols(key) == (
        f"{key}_w4r1v8j4c1hogqiAt3",
    )  # norm_switches.TUNED's FP8 winner
    assert bwd.spec.symbols(bwd) == (f"{bwd}_loop", f"{bwd}_loop_stats", f"{bwd}_loop_finalize")
    mx = make_key("rmsnorm_fwd", in_dtype="bf16", out_dtype="e5m2", scaling="mxfp8", arch="sm_90")
    assert mx.scaling == "mxfp8" and "mxfp8" in str(mx)


@pytest.mark.parametrize(
    ("op", "fields", "field"),
    [
        ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp16"}, "out_dtype"),
        ("layernorm_fwd", {"in_dtype": "fp32", "out_dtype": "bf16"}, "out_dtype"),
        ("layernorm_fwd", {"in_dtype": "fp8", "out_dtype": "fp8"}, "in_dtype"),
        ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "scaling": "nvfp4"}, "scaling"),
        ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "bf16", "scaling": "tensor"},
         "scaling"),
        ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "layout": "columnwise"},
         "layout"),
        ("rmsnorm_fwd", {"in_dtype": "fp32", "fp32_gamma": True}, "fp32_gamma"),
        ("rmsnorm_fwd", {"in_dtype": "bf16", "approximate": True}, "approximate"),
        ("layernorm_bwd", {"in_dtype": "bf16", "out_dtype": "fp32"}, "out_dtype"),
        ("layernorm_bwd", {"in_dtype": "bf16", "out_dtype": "fp8"}, "out_dtype"),
        ("rmsnorm_bwd", {"in_dtype": "bf16", "scaling": "tensor"}, "scaling"),
        ("rmsnorm_bwd_add", {"in_dtype": "fp16", "hidden_size": 0}, "hidden_size"),
    ],
)  # fmt: skip
def test_key_validation(op, fields, field):
    with pytest.raises(VariantError) as info:
        make_key(op, arch="sm_90", **fields)
    assert info.value.field == field


@pytest.mark.parametrize("out", ["fp8_e4m3", "fp16", "fp32"])
def test_backward_output_error_names_xs_dtype(out):
    # dx has x's dtype: the error lists that one, not every dtype a backward takes as input
    with pytest.raises(VariantError) as info:
        make_key("layernorm_bwd", in_dtype="bf16", out_dtype=out, arch="sm_90")
    assert info.value.field == "out_dtype"
    assert info.value.allowed == "bf16"


HIDDEN_SWEEP = [1, 7, 31, 64, 100, 768, 1000, 1001, 2048, 4096, 5120, 8192, 12288, 14336,
                16384, 20480, 32768, 49152, 65536, 65537, 131072]  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("op", FWD + BWD)
@pytest.mark.parametrize("dt", DTYPES)
def test_launch_configurations_cover_rows_and_fit(op, dt, arch):
    spec = get_spec(op)
    itemsize = ne.DTYPES[dt].itemsize
    for hidden in HIDDEN_SWEEP:
        cfg = launch_config(make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch))
        # measured winners (norm_switches.TUNED) need not follow the register estimate: ptxas fitted
        # them without spills (e.g. w19j7c2h at H=65536: 96 registers, estimate 128)
        tuned = arch == "sm_90" and itemsize == 2 and (op, hidden, "none") in norm_switches.TUNED
        if cfg.mode == "loop":
            assert cfg.vec == 16 // itemsize
            continue
        assert hidden % cfg.vec == 0 and cfg.vec * itemsize <= 16
        accesses = hidden // cfg.vec
        per_row = 32 * cfg.warps * cfg.cluster
        assert (cfg.iters - 1) * per_row < accesses <= cfg.iters * per_row
        # the register backward holds x and dz too; the staged one only its column sums
        limit = BWD_MAX_ELEMENTS if spec.backward and not cfg.stages else MAX_ELEMENTS
        assert cfg.iters * cfg.vec <= limit
        assert cfg.threads <= 1024 and cfg.warps <= 32
        key = make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch)
        w_size = ne.DTYPES[gamma_dtype(key)].itemsize
        weights = (1 if spec.rms else 2) * w_size // itemsize if cfg.hold else 0
        regs = _registers(spec.backward, spec.accumulators, cfg.iters * cfg.vec, itemsize,
                          weights=weights, prefetch=cfg.prefetch, packed=cfg.packed)  # fmt: skip
        assert tuned or (regs <= MAX_REGISTERS and fits_register_file(cfg.threads // 32, regs))
        # the register cap (min CTAs per SM) is what the estimate allows, and no less
        if cfg.min_ctas:
            assert cfg.min_ctas >= 2
            assert cfg.min_ctas * -(-cfg.threads // 128) * 128 * regs <= REGISTER_FILE
        assert cfg.cluster in (1, 2, 4, 8)
        # the rules split no backward row over a cluster (BWD_CLUSTERS off); TUNED's staged
        # backward layouts may (H = 65536: w32j2c4t2/t3), and only TUNED's are staged
        # (BWD_STAGED off)
        staged = spec.backward and cfg.stages > 0
        assert not staged or tuned
        assert cfg.cluster == 1 or (arch == "sm_90" and cfg.rows == 1
                                    and (not spec.backward or staged))  # fmt: skip
        assert not cfg.hold or (not spec.backward and (cfg.min_ctas >= 2 or tuned))
    general = launch_config(make_key(op, in_dtype=dt, arch=arch))
    assert general.mode == "loop" and general.tag == "loop"


def test_configuration_choices():
    def tag(op, hidden, arch="sm_90", dt="bf16"):
        return launch_config(make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch)).tag

    with rules_only():  # the layout rules (norm_switches.TUNED emptied)
        assert tag("layernorm_fwd", 4096) == "w4r1v8j4c1"  # 4 x 16-byte accesses per thread
        assert tag("layernorm_fwd", 768) == "w1r4v8j3c1"  # small rows: 4 rows per CTA
        assert tag("layernorm_fwd", 1001).startswith("w1r4v1")  # odd H: single elements
        assert tag("layernorm_fwd", 65536).endswith("c2")  # a cluster of 2 CTAs per row
        # backward: no prefetch, no register cap, 4 accesses per thread (norm_tuning.json)
        assert tag("layernorm_bwd", 4096) == "w4r1v8j4c1n"
        assert tag("rmsnorm_bwd", 4096) == "w4r1v8j4c1n"
        assert tag("rmsnorm_bwd", 8192) == "w8r1v8j4c1n"
        assert tag("layernorm_bwd", 8192) == "w8r1v8j4c1n"
        assert tag("rmsnorm_fwd", 4096) == "w4r1v8j4c1"
        assert tag("layernorm_bwd", 14336) == "loop"  # no cluster layouts in the backward
        assert tag("layernorm_bwd", 65536) == "loop"
        assert tag("layernorm_fwd", 1 << 20) == "loop"
    # norm_switches.TUNED (sm_90, 16-bit x and gamma): the measured winners take precedence
    assert tag("rmsnorm_fwd", 4096) == "w8r1v8j2c1"
    # the staged backward (3 rows deep; RMSNorm at 4096 5 rows deep), some over clusters
    assert tag("layernorm_bwd", 4096) == "w1r1v8j4c4qdt3"  # staged over a cluster of 4
    assert tag("rmsnorm_bwd", 4096) == "w8r1v8j2c1t5"
    assert tag("rmsnorm_bwd", 8192) == "w16r1v8j2c1qt4"
    assert tag("layernorm_bwd", 8192) == "w16r1v8j2c1qlt4"
    assert tag("layernorm_bwd", 14336) == "w7r1v8j4c2qt3"  # staged over a cluster of 2
    assert tag("layernorm_bwd", 65536) == "w16r1v8j2c8qlit3b2"  # staged over a cluster of 8
    assert tag("layernorm_bwd", 8192, "sm_100") == "w8r1v8j4c1n"  # TUNED is sm_90 only
    assert tag("layernorm_bwd", 14336, "sm_100") == "loop"
    assert tag("rmsnorm_fwd", 4096, dt="fp32") == "w8r1v4j4c1"  # TUNED: 16-bit x only
    assert tag("layernorm_bwd", 4096, dt="fp32") == "w8r1v4j4c1n"
    assert tag("layernorm_fwd", 4096) == "w4r1v8j4c1"  # no TUNED entry: the rules
    assert tag("layernorm_fwd", 1 << 20) == "loop"


def fp8_tag(op, hidden, arch="sm_90"):
    key = make_key(op, in_dtype="bf16", out_dtype="fp8", hidden_size=hidden, arch=arch)
    return launch_config(key).tag


def test_held_weights_need_two_ctas_per_sm():
    # not held by the rules (norm_tuning.json: LayerNorm lost with them)
    assert not norm_switches.FWD_HOLD_WEIGHTS["tensor"]
    with rules_only():
        for op in FWD:
            for hidden in (4096, 8192, 14336, 65536):
                key = make_key(op, in_dtype="bf16", out_dtype="fp8", hidden_size=hidden,
                               arch="sm_90")  # fmt: skip
                assert not launch_config(key).hold
    # TUNED holds RMSNorm's at 4096, 14336 and 65536 (the o/g/q/p/x letters: the FP8 switches
    # TUNED carries, test_tuned_fp8_forwards_carry_the_measured_switches); LayerNorm's FP8
    # entries are staged (t: x in shared memory), at 4096 and 65536 with the weights held
    assert fp8_tag("layernorm_fwd", 4096) == "w4r1v8j4c1hogqiAt3"
    assert fp8_tag("layernorm_fwd", 8192) == "w4r1v8j8c1ogqWt3"
    assert fp8_tag("rmsnorm_fwd", 4096) == "w4r1v8j4c1hogqx4"
    assert fp8_tag("rmsnorm_fwd", 14336) == "w14r1v8j4c1hogq"
    assert fp8_tag("rmsnorm_fwd", 65536) == "w4r1v8j8c8hogqiLt3"
    assert fp8_tag("layernorm_fwd", 65536) == "w4r1v8j8c8hogqiyzt3"
    with rules_only() as monkeypatch:
        monkeypatch.setitem(norm_switches.FWD_HOLD_WEIGHTS, "tensor", True)
        launch_config.cache_clear()
        assert fp8_tag("layernorm_fwd", 4096) == "w4r1v8j4c1hm4"  # gamma/beta held
        assert fp8_tag("rmsnorm_fwd", 8192) == "w8r1v8j4c1hm2"
        # H = 14336: 14 warps; with the weights held only one CTA would fit an SM
        assert fp8_tag("layernorm_fwd", 14336) == "w14r1v8j4c1"
    mx = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", scaling="mxfp8",
                  hidden_size=4096, arch="sm_90")  # fmt: skip
    assert launch_config(mx).tag == "w4r1v8j4c1"  # MXFP8: not held (FWD_HOLD_WEIGHTS)


def test_switches_follow_the_module_defaults():
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    big = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=65536, arch="sm_90")
    fp8 = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(norm_switches, "TUNED", {})  # the rules, not the measured table
        monkeypatch.setattr(norm_switches, "BWD_PREFETCH", True)
        monkeypatch.setattr(norm_switches, "BWD_PACKED", True)
        monkeypatch.setattr(norm_switches, "BWD_CLUSTERS", True)
        monkeypatch.setattr(norm_switches, "BWD_CAP", True)
        monkeypatch.setitem(norm_switches.FWD_HOLD_WEIGHTS, "tensor", True)
        launch_config.cache_clear()
        try:
            cfg = launch_config(key)
            assert cfg.prefetch and cfg.packed and cfg.tag.startswith("w4r1v8j4c1k")
            assert "n" not in cfg.tag[len("w4r1v8j4c1") :]
            assert launch_config(big).cluster > 1 and launch_config(big).prefetch
            assert launch_config(fp8).tag == "w4r1v8j4c1hm4"
            fp32 = make_key("layernorm_bwd", in_dtype="fp32", hidden_size=4096, arch="sm_90")
            assert not launch_config(fp32).packed  # packing saves nothing for fp32 x
            source = render(key).source
            assert "xc[j][i] = xn[j][i];" in source and "fetch(grp + pos.nclusters);" in source
        finally:
            launch_config.cache_clear()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(norm_switches, "TUNED", {})
        monkeypatch.setattr(norm_switches, "BWD_CAP", True)
        monkeypatch.setitem(norm_switches.FWD_HOLD_WEIGHTS, "tensor", True)
        launch_config.cache_clear()
        try:
            assert "__launch_bounds__(THREADS, 3)" in render(key).source  # 3 CTAs of 168
            held = render(fp8).source
            assert "Held<Wt::storage, V> gh[J];" in held and "__launch_bounds__(THREADS, 4)" in held
        finally:
            launch_config.cache_clear()
    with rules_only():  # the module defaults: no prefetch, no cap, nothing held
        source = render(key).source
        assert "fetch(grp);" in source and "xc[j][i]" not in source
        assert "__launch_bounds__(THREADS)\n" in source
        assert launch_config(big).tag == "loop"  # no backward clusters (BWD_CLUSTERS)
        assert "Held<" not in render(fp8).source
        plain = render(make_key("layernorm_fwd", in_dtype="bf16", hidden_size=4096,
                                arch="sm_90"))  # fmt: skip
        assert "Held<" not in plain.source and "__launch_bounds__(THREADS)\n" in plain.source
    # TUNED's layouts of these keys: the staged backward (t3; t2 over a cluster of 4 at
    # 65536), the FP8 forward staged with o/g/q and its weights held (h, round 10)
    assert launch_config(key).tag == norm_switches.TUNED[("layernorm_bwd", 4096, "none")]
    assert launch_config(big).tag == norm_switches.TUNED[("layernorm_bwd", 65536, "none")]
    assert launch_config(big).cluster == 8
    assert "cp.async.wait_group" in render(key).source
    assert launch_config(fp8).tag == norm_switches.TUNED[("layernorm_fwd", 4096, "tensor")]
    assert "Held<Wt::storage, V> gh[J];" in render(fp8).source


def test_tags_name_every_code_switch():
    base = LaunchConfig("regs", 8, 4, 1, 4, 1)
    assert base.tag == "w4r1v8j4c1"
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, hold=True, min_ctas=4).tag == "w4r1v8j4c1hm4"
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, packed=True).tag == "w4r1v8j4c1k"
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, prefetch=False, min_ctas=1).tag == "w4r1v8j4c1n"
    assert LaunchConfig("loop", 8, hold=True).tag == "loop"
    tags = {LaunchConfig("regs", 8, 4, 1, 4, 1, h, p, k, m).tag
            for h in (False, True) for p in (False, True) for k in (False, True)
            for m in (0, 2, 3)}  # fmt: skip
    assert len(tags) == 2 * 2 * 2 * 3  # distinct code, distinct symbol
    for tag in tags:
        assert norm.parse_tag(tag).tag == tag
    for bad, match in [("w0r1v8j4c1", r"w0 \(warps=0\): 1 to 32 warps"),
                       ("w4r1v3j4c1", r"v3 \(vec=3\): an access of"),
                       ("w4r0v8j4c1", "r0 .rows=0.: at least 1 row"),
                       ("w4r1v8j0c1", "j0 .iters=0.: 1 to 256 accesses"),
                       ("w4r1v8j4c3", "c3 .cluster=3.: a cluster of"),
                       ("w04r1v8j4c1", "leading zeros"),
                       ("w\u0664r1v8j4c1", "not a norm configuration tag"),
                       ("loop", "names the general kernel")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            norm.parse_tag(bad)
    with pytest.raises(ValueError, match="in the order h k n"):
        norm.parse_tag("w4r1v8j4c1Ahogq")
    with pytest.raises(ArgumentTypeError, match="parse_tag takes a str, not int"):
        norm.parse_tag(4)
    # only what LaunchConfig.tag writes, so parse_tag(t).tag == t for every tag it accepts
    for bad, match in [
        ("w33r1v8j1c1", "1 to 32 warps"),
        ("w32r2v8j1c1", "2048 threads per CTA .rows \\* warps \\* 32., at most 1024"),
        ("w4r1v8j4c1a3", "a3 .accumulators=3.: 1, 2 or 4"),
        ("w4r1v8j4c1a1", "names the same"),
        ("w4r1v8j4c1s7", "s7 .shared_sums=7.: 0, 1 or 2"),
        ("w4r1v8j4c1t1", "t1 .stages=1.: 0 .not staged. or 2 to 32"),
        ("w4r1v8j4c1m1", "names the same"),
        ("w4r1v8j4c1t0", "names the same"),
        ("w4r1v8j4c1m0", "names the same"),
        ("w4r1v8j4c1s0", "names the same"),
        ("w4r1v8j4c1x0", "names the same"),
        ("w4r1v8j4c1b0", "names the same"),
        ("w4r1v8j4c1b99999999999999999999", "to 32 CTAs per SM"),
        ("w4r1v8j99999999999999999c1", "1 to 256 accesses"),
    ]:
        with pytest.raises(ValueError, match=match):
            norm.parse_tag(bad)
    for good in ("w32r1v8j1c1", "w8r4v8j1c1", "w4r1v8j4c1a4s2t2m2x1b1"):
        assert norm.parse_tag(good).tag == good


def test_launch_config_checks_its_fields():
    """A LaunchConfig built by hand is checked as parse_tag's are, with the field's name."""
    base = {"mode": "regs", "vec": 8, "warps": 4, "rows": 1, "iters": 4, "cluster": 1}
    for change, match in [({"warps": 0}, r"w0 \(warps=0\)"), ({"warps": 33}, "1 to 32 warps"),
                          ({"vec": 3}, r"v3 \(vec=3\)"), ({"cluster": 3}, "a cluster of"),
                          ({"stages": 1}, r"t1 \(stages=1\)"), ({"groups": -1}, "x-1"),
                          ({"rows": 8, "warps": 8}, "2048 threads per CTA"),
                          ({"mode": "register"}, "mode is 'regs' or 'loop'"),
                          ({"mode": "loop", "vec": 5}, r"v5 \(vec=5\)"),
                          ({"iters": 10**20}, "1 to 256 accesses"),
                          ({"ctas_per_sm": 33}, "to 32 CTAs per SM"),
                          ({"stages": 33}, "2 to 32 rows deep")]:  # fmt: skip
        with pytest.raises(ArgumentError, match=match):
            LaunchConfig(**{**base, **change})
    for change, match in [({"warps": 4.0}, "warps is an int, not float"),
                          ({"hold": 1}, "hold is a bool, not int"),
                          ({"iters": True}, "iters is an int, not bool")]:  # fmt: skip
        with pytest.raises(ArgumentTypeError, match=match):
            LaunchConfig(**{**base, **change})
    numpy_ints = LaunchConfig(**{**base, "warps": np.int64(4), "stages": np.int32(3)})
    assert type(numpy_ints.warps) is int and numpy_ints == LaunchConfig(**base, stages=3)
    assert LaunchConfig("loop", 8).tag == "loop" and LaunchConfig(**base, min_ctas=1).tag == (
        "w4r1v8j4c1"
    )


def test_launch_config_of_a_wrong_argument_names_it():
    """launch_config checks its argument before the cache hashes it: a dict or a key of
    another family is a TypeError saying what was passed; the cache is still clearable."""
    for wrong, match in [({"op": "layernorm_fwd"}, "KernelKey is needed .* not dict"),
                         (["layernorm_fwd"], "not list"), (None, "not NoneType")]:  # fmt: skip
        with pytest.raises(ArgumentTypeError, match=match):
            launch_config(wrong)
    with pytest.raises(ArgumentTypeError, match="not a norm op"):
        launch_config(make_key("gelu", dtype="bf16", arch="sm_90"))
    key = make_key("layernorm_fwd", dtype="bf16", arch="sm_90", hidden_size=4096)
    launch_config.cache_clear()
    assert launch_config(key) is launch_config(key)
    assert launch_config.cache_info().hits >= 1 and launch_config.__name__ == "launch_config"


def test_tuned_layouts_are_valid():
    """Every measured winner (norm_switches.TUNED) is a valid layout of its hidden size and is what
    launch_config returns for the key it names (bf16 and fp16, sm_90)."""
    for (op, hidden, scaling), tag in norm_switches.TUNED.items():
        for dt in ("bf16", "fp16"):
            out = "fp8_e4m3" if scaling != "none" else dt
            key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling, hidden_size=hidden,
                           arch="sm_90")  # fmt: skip
            cfg = launch_config(key)
            assert cfg.tag == tag
            accesses = hidden // cfg.vec
            per_row = 32 * cfg.warps * cfg.cluster
            assert hidden % cfg.vec == 0
            assert (cfg.iters - 1) * per_row < accesses <= cfg.iters * per_row
            assert cfg.threads <= 1024 and (cfg.cluster == 1 or cfg.rows == 1)
            assert not (cfg.hold and get_spec(op).backward)


def test_register_estimate():
    # forward: x in fp32 plus overhead; held bf16 gamma and beta: 2 x 16 registers more
    assert _registers(False, 0, 32, 2) == 72
    assert _registers(False, 0, 32, 2, weights=2) == 104
    # backward LN (2 sums), 32 elements of bf16: ptxas -v needs 168 without the prefetch
    assert _registers(True, 2, 32, 2, prefetch=False) == 168
    assert _registers(True, 2, 32, 2) == 224  # the prefetch: 32 stored registers + overhead
    assert _registers(True, 2, 32, 2, prefetch=False, packed=True) == 136
    assert _registers(True, 1, 16, 2, prefetch=False) == 88


def test_loop_threads_per_row():
    assert loop_threads_per_row(64) == 32
    assert loop_threads_per_row(1000) == 32
    assert loop_threads_per_row(4096) == 128
    assert loop_threads_per_row(65536) == 1024
    assert loop_threads_per_row(1 << 20) == 1024
    for hidden in HIDDEN_SWEEP:  # the reference's summation depth assumes this
        assert math.ceil(hidden / loop_threads_per_row(hidden)) <= max(64, hidden // 1024 + 1)


def test_render_cluster_and_headers():
    big = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=65536, arch="sm_90")
    r = render(big)
    assert "__cluster_dims__(8, 1, 1)" in r.source and '#include "nve_cluster.cuh"' in r.source
    # the row sums go through the cluster's mailboxes: no release-ordered cluster barrier
    assert "mail_send<" in r.source and "nve::cluster_sync();" not in r.source
    assert not r.cuda_headers
    small = render(make_key("rmsnorm_bwd", in_dtype="bf16", hidden_size=4096, arch="sm_90"))
    assert "__cluster_dims__" not in small.source
    fp8_ampere = render(make_key("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8", arch="sm_80"))
    assert fp8_ampere.cuda_headers and "NVE_SOFT_FP8" in fp8_ampere.source


# ---- argument checks (fakes: nothing reaches the GPU) -----------------------------------


@pytest.fixture(scope="module")
def ln_fp8():
    return ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=64,
                         arch="sm_90")  # fmt: skip


@pytest.fixture(scope="module")
def rms_mx():
    return ne.get_kernel("rmsnorm_fwd", in_dtype="fp16", out_dtype="fp8", scaling="mxfp8",
                         arch="sm_90")  # fmt: skip


@pytest.fixture(scope="module")
def ln_bwd():
    return ne.get_kernel("layernorm_bwd", in_dtype="bf16", arch="sm_90", fp32_gamma=True)


@pytest.fixture(scope="module")
def rms_add():
    return ne.get_kernel("rmsnorm_bwd_add", in_dtype="fp32", hidden_size=64, arch="sm_90")


def arr(shape, typestr, i=0, **kw):
    return FakeCupyArray(shape, typestr, ptr=0x7F0000000000 + (i << 24), **kw)


def fwd_args(x_type="<u2", w_type="<u2", hidden=64):
    return {"x": arr((4, hidden), x_type, 1), "gamma": arr((hidden,), w_type, 2),
            "beta": arr((hidden,), w_type, 3)}  # fmt: skip


def scalars():
    return {name: arr((1,), "<f4", 10 + i) for i, name in enumerate(("scale", "amax"))}


def test_forward_input_checks(ln_fp8):
    z = arr((4, 64), "|u1", 4)
    with pytest.raises(ArgumentError, match="x: has dtype <f2.*takes bf16"):
        ln_fp8(**fwd_args(x_type="<f2"), out=z, **scalars())
    with pytest.raises(ArgumentError, match="last dimension is 65.*hidden_size=64"):
        ln_fp8(arr((4, 65), "<u2"), arr((65,), "<u2"), arr((65,), "<u2"), **scalars())
    with pytest.raises(ArgumentError, match=r"gamma: has shape \(32,\); expected \(64,\)"):
        ln_fp8(arr((4, 64), "<u2"), arr((32,), "<u2"), arr((64,), "<u2"), **scalars())
    with pytest.raises(ArgumentError, match=r"gamma: has dtype <f4 \(float32\); .* takes bf16"):
        ln_fp8(**fwd_args(w_type="<f4"), out=z, **scalars())
    with pytest.raises(ArgumentTypeError, match="beta: expected a CUDA array"):
        ln_fp8(arr((4, 64), "<u2"), arr((64,), "<u2"), None, out=z, **scalars())
    with pytest.raises(ArgumentError, match="must be C-contiguous"):
        ln_fp8(arr((4, 64), "<u2", strides=(2, 8)), arr((64,), "<u2"), arr((64,), "<u2"))
    with pytest.raises(ArgumentError, match="at least one dimension"):
        ln_fp8(arr((), "<u2"), arr((64,), "<u2"), arr((64,), "<u2"))


@pytest.mark.parametrize(("eps", "error"), [
    (-1e-5, ArgumentError), (float("nan"), ArgumentError), (float("inf"), ArgumentError),
    (np.float64(1e300), ArgumentError), (None, ArgumentTypeError), (object(), ArgumentTypeError),
])  # fmt: skip
def test_eps_checked(ln_fp8, eps, error):
    with pytest.raises(error, match="eps: must be"):
        ln_fp8(**fwd_args(), eps=eps, out=arr((4, 64), "|u1", 4), **scalars())


def test_a_plain_float_eps_above_fp32_max_is_refused_by_a_call(ln_fp8):
    """The call's shortcut for a plain float keeps _eps's range: 1e300 would be inf in fp32."""
    with pytest.raises(ArgumentError, match="^eps: must be at most 3.4028235e"):
        ln_fp8(None, None, None, eps=1e300)


def test_eps_is_no_bool_and_fits_fp32():
    """A bool is the wrong type (ArgumentTypeError, as a string is); the kernels take eps
    as fp32, so a value above fp32's largest (which would become inf) is refused."""
    from nvrtc_engine.ops.norm_kernels import _eps

    for flag in (True, False, np.bool_(True)):
        with pytest.raises(ArgumentTypeError, match="^eps: must be a float >= 0, got") as info:
            _eps(flag)
        assert isinstance(info.value, TypeError)
    for big in (1e300, 3.5e38, np.float64(1e39), 10**40):
        with pytest.raises(ArgumentError, match=r"^eps: .*at most 3\.4028235e\+38") as info:
            _eps(big)
        assert not isinstance(info.value, TypeError)
    assert _eps(3.4028235e38) == 3.4028235e38 and _eps(0.0) == 0.0


def test_eps_type_errors(ln_fp8):
    """eps is a number: a string is a type error (float() would take "1e-5"), and an array
    where an RMSNorm kernel's eps goes, most often beta, says that RMSNorm takes none (a
    LayerNorm kernel's message has no such hint); numpy scalars and ints are numbers."""
    from nvrtc_engine.ops.norm_kernels import _eps

    for text in ("1e-5", b"1e-5"):
        with pytest.raises(ArgumentTypeError, match="eps: must be a float >= 0, got"):
            ln_fp8(**fwd_args(), eps=text, out=arr((4, 64), "|u1", 4), **scalars())
    rms = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=64, arch="sm_90")
    args = fwd_args()
    with pytest.raises(ArgumentTypeError, match=r"shape \(64,\) \(RMSNorm kernels take no beta"):
        rms(args["x"], args["gamma"], args["beta"])
    with pytest.raises(ArgumentTypeError, match=r"got an array of shape \(64,\)$"):
        ln_fp8(**args, eps=args["beta"], out=arr((4, 64), "|u1", 4), **scalars())  # no hint
    assert _eps(np.float32(0.5)) == 0.5 and _eps(1) == 1.0 and _eps(np.array(0.25)) == 0.25
    # eps is checked before the arrays (and so before any device is asked about them)
    for bad, error in (
        ("1e-5", ArgumentTypeError),
        (-1.0, ArgumentError),
        (math.nan, ArgumentError),
    ):
        with pytest.raises(error, match="^eps: "):
            ln_fp8(None, None, None, eps=bad)


def test_forward_output_checks(ln_fp8):
    args = fwd_args()
    with pytest.raises(ArgumentError, match=r"out: has shape \(4, 32\)"):
        ln_fp8(**args, out=arr((4, 32), "|u1", 4), **scalars())
    with pytest.raises(ArgumentError, match="mu: has dtype <u2"):
        ln_fp8(**args, out=arr((4, 64), "|u1", 4), mu=arr((4,), "<u2", 5), **scalars())
    with pytest.raises(ArgumentError, match=r"rsigma: has shape \(5,\); expected \(4,\)"):
        ln_fp8(**args, out=arr((4, 64), "|u1", 4), mu=arr((4,), "<f4", 5),
               rsigma=arr((5,), "<f4", 6), **scalars())  # fmt: skip
    with pytest.raises(ArgumentError, match="rsigma: is on device 1"):
        ln_fp8(**args, out=arr((4, 64), "|u1", 4), mu=arr((4,), "<f4", 5),
               rsigma=arr((4,), "<f4", 6, device=1), **scalars())  # fmt: skip


def test_forward_scaling_checks(ln_fp8, rms_mx):
    args = fwd_args()
    full = {"out": arr((4, 64), "|u1", 4), "mu": arr((4,), "<f4", 5), "rsigma": arr((4,), "<f4", 6)}
    with pytest.raises(ArgumentError, match="scale: is required"):
        ln_fp8(**args, **full, amax=scalars()["amax"])
    with pytest.raises(ArgumentError, match="amax: is required"):
        ln_fp8(**args, **full, scale=scalars()["scale"])
    x, g = arr((4, 96), "<f2", 1), arr((96,), "<f2", 2)
    rest = {"out": arr((4, 96), "|u1", 4), "rsigma": arr((4,), "<f4", 6)}
    with pytest.raises(ArgumentError, match="MXFP8 scales are computed per block"):
        rms_mx(x, g, **rest, scale=scalars()["scale"])
    with pytest.raises(ArgumentError, match=r"scale_inv: has shape \(4, 3\); expected \(128, 4\)"):
        rms_mx(x, g, **rest, scale_inv=arr((4, 3), "|u1", 7))
    with pytest.raises(ArgumentError, match="scale_inv: has dtype <f4"):
        rms_mx(x, g, **rest, scale_inv=arr((128, 4), "<f4", 7))
    plain = ne.get_kernel("rmsnorm_fwd", in_dtype="fp16", arch="sm_90")
    with pytest.raises(ArgumentError, match="has no scaling"):
        plain(x, g, out=arr((4, 96), "<f2", 4), rsigma=rest["rsigma"], amax=scalars()["amax"])


def test_forward_outputs_need_an_allocating_library(ln_fp8, monkeypatch):
    from nvrtc_engine import driver

    monkeypatch.setattr(driver, "pointer_device", lambda ptr: 0)
    args = {k: FakeCaiArray(v.shape, v._cai["typestr"], ptr=v._cai["data"][0])
            for k, v in fwd_args().items()}  # fmt: skip
    with pytest.raises(ArgumentTypeError, match="out: is required"):
        ln_fp8(**args, **scalars())


def bwd_args(hidden=64, x_type="<u2", w_type="<f4"):
    return {"dz": arr((4, hidden), x_type, 1), "x": arr((4, hidden), x_type, 2),
            "mu": arr((4,), "<f4", 3), "rsigma": arr((4,), "<f4", 4),
            "gamma": arr((hidden,), w_type, 5)}  # fmt: skip


def test_backward_input_checks(ln_bwd, rms_add):
    args = bwd_args()
    with pytest.raises(ArgumentError, match=r"dz: has shape \(4, 32\)"):
        ln_bwd(**{**args, "dz": arr((4, 32), "<u2", 1)})
    with pytest.raises(ArgumentError, match="dz: has dtype <f2"):
        ln_bwd(**{**args, "dz": arr((4, 64), "<f2", 1)})
    with pytest.raises(ArgumentError, match="mu: has dtype <u2"):
        ln_bwd(**{**args, "mu": arr((4,), "<u2", 3)})
    with pytest.raises(ArgumentError, match="gamma: has dtype <u2"):
        ln_bwd(**{**args, "gamma": arr((64,), "<u2", 5)})  # fp32_gamma kernel
    with pytest.raises(ArgumentError, match=r"dgamma: has shape \(32,\)"):
        ln_bwd(**args, dx=arr((4, 64), "<u2", 6), dgamma=arr((32,), "<f4", 7))
    with pytest.raises(ArgumentError, match="dbeta: has dtype <u2"):
        ln_bwd(**args, dx=arr((4, 64), "<u2", 6), dgamma=arr((64,), "<f4", 7),
               dbeta=arr((64,), "<u2", 8))  # fmt: skip
    rms = {k: v for k, v in bwd_args(x_type="<f4").items() if k != "mu"}
    with pytest.raises(ArgumentTypeError, match="add: expected a CUDA array"):
        rms_add(**rms, add=None)
    with pytest.raises(ArgumentError, match="last dimension is 65"):
        rms_add(**{**rms, "x": arr((4, 65), "<f4", 2)}, add=arr((4, 65), "<f4", 9))


def test_backward_dx_must_not_overlap_x_or_dz(ln_bwd):
    args = bwd_args()
    outs = {"dgamma": arr((64,), "<f4", 7), "dbeta": arr((64,), "<f4", 8)}
    with pytest.raises(ArgumentError, match="dx: overlaps x's memory"):
        ln_bwd(**args, dx=args["x"], **outs)
    dz_ptr = args["dz"].__cuda_array_interface__["data"][0]
    for offset in (2, -(4 * 64 - 1) * 2):  # dx starts inside dz / ends inside it
        with pytest.raises(ArgumentError, match="dx: overlaps dz's memory"):
            ln_bwd(**args, dx=FakeCupyArray((4, 64), "<u2", ptr=dz_ptr + offset), **outs)
    with pytest.raises(Exception) as touching:  # ends where dz starts: past the check
        ln_bwd(**args, dx=FakeCupyArray((4, 64), "<u2", ptr=dz_ptr - 4 * 64 * 2), **outs)
    assert "overlaps" not in str(touching.value)


def test_backward_workspace_checks(ln_bwd, monkeypatch):
    from nvrtc_engine import driver

    monkeypatch.setattr(driver, "pointer_device", lambda ptr: 0)
    args = {k: FakeCaiArray(v.shape, v._cai["typestr"], ptr=v._cai["data"][0])
            for k, v in bwd_args().items()}  # fmt: skip
    outs = {"dx": FakeCaiArray((4, 64), "<u2", ptr=0x9000), "dgamma": FakeCaiArray((64,), "<f4"),
            "dbeta": FakeCaiArray((64,), "<f4", ptr=0xA000)}  # fmt: skip
    with pytest.raises(ArgumentTypeError, match="workspace: is required"):
        ln_bwd(**args, **outs)
    with pytest.raises(ArgumentError, match="workspace: has dtype <u2"):
        ln_bwd(**args, **outs, workspace=FakeCaiArray((4096,), "<u2"))
    with pytest.raises(ArgumentTypeError, match="dx: is required"):
        ln_bwd(**args)


# ---- references against naive formulas -----------------------------------------------


def naive_layernorm(x, gamma, beta, eps, zcg):
    out, mus, rss = [], [], []
    for row in np.asarray(x, dtype=np.float64):
        mu = math.fsum(row) / len(row)
        var = math.fsum((v - mu) ** 2 for v in row) / len(row)
        rs = 1.0 / math.sqrt(var + eps)
        g = np.asarray(gamma, np.float64) + (1.0 if zcg else 0.0)
        out.append([(v - mu) * rs * gg + b for v, gg, b in zip(row, g, beta, strict=True)])
        mus.append(mu)
        rss.append(rs)
    return np.array(out), np.array(mus), np.array(rss)


@pytest.mark.parametrize("zcg", [False, True])
def test_reference_forward_matches_naive(zcg):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 37)) * 3 + 2
    gamma, beta = rng.standard_normal(37), rng.standard_normal(37)
    eps = 0.25  # exactly representable in fp32
    got = ref.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma=zcg)
    z, mu, rs = naive_layernorm(x, gamma, beta, eps, zcg)
    np.testing.assert_allclose(got.z, z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.mu, mu, rtol=1e-13)
    np.testing.assert_allclose(got.rsigma, rs, rtol=1e-13)
    rms = ref.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=zcg)
    g = gamma + (1.0 if zcg else 0.0)
    rs2 = 1.0 / np.sqrt((x * x).mean(axis=1) + eps)
    np.testing.assert_allclose(rms.z, x * rs2[:, None] * g, rtol=1e-13)
    assert rms.mu is None and rms.mu_tol is None
    for r in (got, rms):
        assert np.all(r.z_tol > 0) and np.all(np.isfinite(r.z_tol))
        assert np.all(r.z_tol < 1e-4 * (1 + np.abs(r.z)))  # far below a bf16 ulp


def test_reference_forward_bounds_scale_with_the_mean_offset():
    rng = np.random.default_rng(2)
    x = (1e4 + rng.standard_normal((2, 4096))).astype(np.float32)
    r = ref.layernorm_fwd(x, np.ones(4096), np.zeros(4096), 1e-5)
    assert abs(r.z.std() - 1.0) < 0.05  # the float64 reference is not fooled by the offset
    # one-pass E[x^2] - E[x]^2 in fp32 is off by far more than the bound allows
    x32 = x.astype(np.float32)
    naive_var = np.float32((x32 * x32).mean(dtype=np.float32)) - np.float32(
        x32.mean(dtype=np.float32)) ** 2  # fmt: skip
    true_var = float(x.astype(np.float64).var())
    assert abs(float(naive_var) - true_var) > 0.5 * true_var
    assert r.z_tol.max() < 0.2


def _bench_module(name):
    """The script bench/NAME.py as a module."""
    import importlib.util
    from pathlib import Path

    here = Path(__file__).parent
    found = [here.parent / "bench" / "tuning" / f"{name}.py", here.parent / "bench" / f"{name}.py",
             here / f"{name}.py"]  # fmt: skip
    path = next(p for p in found if p.exists())
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("hidden, first", [(65536, 256.0), (4096, -2000.0), (1001, 30.0),
                                           (4096, None)])  # fmt: skip
def test_reference_shifted_bounds_cover_the_one_pass_statistics(hidden, first):
    """``layernorm_fwd(..., shift=K)`` bounds the fp32 one-pass statistics about K (switch
    ``z``, emulated by bench/norm_shift_error.py): bf16 rows of N(0, 1) whose first element
    is an outlier (256 = sqrt(65536) standard deviations: half the bound's cancellation; a "massive
    activation" of -2000), where the fp32 computation is far outside the two-pass bounds and
    inside the shifted ones; and fp32 rows with a 1e4 mean offset."""
    rng = np.random.default_rng(hidden)
    if first is None:
        x = (1e4 + rng.standard_normal((8, hidden))).astype(np.float32)
    else:
        x = rng.standard_normal((8, hidden))
        x[:, 0] = first
        x = x.astype(ne.DTYPES["bf16"].numpy()).astype(np.float32)
    gamma = (rng.standard_normal(hidden) * 0.5 + 1).astype(np.float32)
    beta = (rng.standard_normal(hidden) * 0.5).astype(np.float32)
    emulated = _bench_module("norm_shift_emulation").shifted_forward_fp32
    k, mu, rs, z = emulated(x, gamma, beta, 1e-5)
    shifted = ref.layernorm_fwd(x, gamma, beta, 1e-5, shift=k)
    assert np.all(np.abs(mu - shifted.mu) <= shifted.mu_tol)
    assert np.all(np.abs(rs - shifted.rsigma) <= shifted.rsigma_tol)
    assert np.all(np.abs(z - shifted.z) <= shifted.z_tol)
    if first is not None:
        plain = ref.layernorm_fwd(x, gamma, beta, 1e-5)
        assert np.any(np.abs(rs - plain.rsigma) > 2 * plain.rsigma_tol)
        assert np.all(shifted.rsigma_tol > plain.rsigma_tol)


def numerical_grad(f, a, h=1e-6):
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        old = a[idx]
        a[idx] = old + h
        up = f()
        a[idx] = old - h
        down = f()
        a[idx] = old
        g[idx] = (up - down) / (2 * h)
    return g


@pytest.mark.parametrize("zcg", [False, True])
def test_reference_layernorm_backward_is_the_gradient(zcg):
    rng = np.random.default_rng(3)
    x, dz = rng.standard_normal((3, 11)), rng.standard_normal((3, 11))
    gamma, beta = rng.standard_normal(11), rng.standard_normal(11)

    def loss():
        return float((ref.layernorm_fwd(x, gamma, beta, 0.1, zero_centered_gamma=zcg).z
                      * dz).sum())  # fmt: skip

    fwd = ref.layernorm_fwd(x, gamma, beta, 0.1, zero_centered_gamma=zcg)
    got = ref.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zero_centered_gamma=zcg)
    np.testing.assert_allclose(got.dx, numerical_grad(loss, x), atol=1e-7)
    np.testing.assert_allclose(got.dgamma, numerical_grad(loss, gamma), atol=1e-7)
    np.testing.assert_allclose(got.dbeta, numerical_grad(loss, beta), atol=1e-7)
    assert np.all(got.dx_tol > 0) and np.all(got.dgamma_tol > 0) and np.all(got.dbeta_tol > 0)


def test_reference_rmsnorm_backward_is_the_gradient():
    rng = np.random.default_rng(4)
    x, dz, add = (rng.standard_normal((3, 13)) for _ in range(3))
    gamma = rng.standard_normal(13)

    def loss():
        return float((ref.rmsnorm_fwd(x, gamma, 0.1).z * dz).sum())

    fwd = ref.rmsnorm_fwd(x, gamma, 0.1)
    got = ref.rmsnorm_bwd(dz, x, fwd.rsigma, gamma)
    np.testing.assert_allclose(got.dx, numerical_grad(loss, x), atol=1e-7)
    np.testing.assert_allclose(got.dgamma, numerical_grad(loss, gamma), atol=1e-7)
    assert got.dbeta is None and got.dbeta_tol is None
    with_add = ref.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, add=add)
    np.testing.assert_allclose(with_add.dx, got.dx + add, rtol=1e-15)
    assert np.all(with_add.dx_tol >= got.dx_tol)


def test_summation_depth():
    assert ref.summation_depth(1) == 1
    assert ref.summation_depth(100) == 100
    assert ref.summation_depth(4096) == 109
    assert ref.summation_depth(65536) == 109
    assert ref.summation_depth(1 << 20) == 1024 + 45


@pytest.mark.parametrize("hidden", [None, 1000, 4096, 65536])
@pytest.mark.parametrize("op", BWD)
def test_backward_grid_plans_cover_the_rows(op, hidden):
    from nvrtc_engine.ops.norm_kernels import _Device

    kernel = ne.get_kernel(op, in_dtype="bf16", hidden_size=hidden, arch="sm_90")
    cfg = kernel.config
    nacc = kernel.spec.accumulators
    h = hidden or 3000
    for sm_count, occ in ((132, (2, 2, 2)), (8, (1, 1, 1))):
        dev = _Device(sm_count, occ[: len(kernel.artifact.symbols)])
        for rows in (0, 1, 7, 1000, 16384):
            plan = kernel._plan(dev, rows, h)
            if rows == 0:
                assert plan.parts == 0 and plan.workspace == 0
                continue
            assert 1 <= plan.parts <= rows
            if cfg.mode == "regs":
                assert plan.parts * cfg.cluster <= max(cfg.cluster, sm_count * 2)
            else:
                assert (plan.parts - 1) * plan.chunk_rows < rows <= plan.parts * plan.chunk_rows
                assert plan.stats_offset % 4 == 0 and plan.workspace == plan.stats_offset + 2 * rows
            assert plan.part_elements == nacc * plan.parts * h
            assert plan.workspace >= plan.part_elements


ROUND3 = [
    {"FWD_ACCUMULATORS": 4},
    {"FWD_ONE_REDUCTION": True, "FWD_ACCUMULATORS": 2},
    {"FWD_EARLY_WEIGHTS": True, "FWD_ONE_REDUCTION": True},
    {"BWD_SHARED_SUMS": 1},
    {"BWD_SHARED_SUMS": 2, "BWD_CAP": True},
]


@pytest.mark.matrix
@pytest.mark.parametrize(
    "values", ROUND3, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("arch", ARCHS)
def test_round3_switches_compile(monkeypatch, arch, values):
    """The round-3 switches compile on every arch and name themselves in the symbol;
    H = 1024 packs 4 rows per CTA, H = 1001 has a partial last access,
    H = 65536 uses a cluster on sm_90/sm_100a (forward)."""
    monkeypatch.setattr(norm_switches, "TUNED", {})
    for name, value in values.items():
        monkeypatch.setattr(norm_switches, name, value)
    launch_config.cache_clear()
    ne.clear_cache(disk=False)
    try:
        backward = "BWD_SHARED_SUMS" in values
        ops = BWD if backward else FWD
        for op in ops:
            for hidden in (1001, 1024, 4096) + (() if backward else (65536,)):
                out = "bf16" if backward else "fp8_e4m3"
                scaling = "none" if backward else "tensor"
                key = make_key(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                               hidden_size=hidden, arch=arch)  # fmt: skip
                cfg = launch_config(key)
                assert cfg.mode == "regs" or (hidden == 65536 and arch in ("sm_80", "sm_89"))
                if cfg.mode == "loop":
                    continue
                if backward:
                    assert cfg.shared_sums == min(values["BWD_SHARED_SUMS"],
                                                  get_spec(op).accumulators)  # fmt: skip
                    assert f"s{cfg.shared_sums}" in cfg.tag
                else:
                    assert cfg.accumulators == values.get("FWD_ACCUMULATORS", 1)
                    assert cfg.one_reduction == (values.get("FWD_ONE_REDUCTION", False)
                                                 and op == "layernorm_fwd")  # fmt: skip
                    assert cfg.early == values.get("FWD_EARLY_WEIGHTS", False)
                kernel = compile_and_check(key)
                assert kernel.artifact.symbols[0].endswith(cfg.tag)
                source = render(key).source
                assert ("row_stats(st" in source) == cfg.one_reduction
                assert ("acc_sh[" in source) == (cfg.shared_sums > 0)
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


@pytest.mark.matrix
def test_round3_tags_round_trip():
    base = LaunchConfig("regs", 8, 4, 1, 4, 1)
    tags = set()
    for early in (False, True):
        for one in (False, True):
            for accs in (1, 2, 4):
                for shared in (0, 1, 2):
                    for m in (0, 3):
                        cfg = LaunchConfig("regs", 8, 4, 1, 4, 1, prefetch=False, min_ctas=m,
                                           early=early, one_reduction=one, accumulators=accs,
                                           shared_sums=shared)  # fmt: skip
                        assert norm.parse_tag(cfg.tag) == cfg
                        tags.add(cfg.tag)
    assert len(tags) == 2 * 2 * 3 * 3 * 2
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, early=True, one_reduction=True,
                        accumulators=2).tag == "w4r1v8j4c1eua2"  # fmt: skip
    assert base.tag == "w4r1v8j4c1"


def default_keys(ops, hidden_sizes, scalings=("none",), archs=("sm_90", "sm_100a")):
    """Keys of ``ops`` at ``hidden_sizes`` and ``archs``, bf16 x (at 4096 also fp32 x, and bf16
    x with fp32 gamma); forwards with each of ``scalings`` (tensor: e4m3 output)."""
    for arch in archs:
        for hidden in hidden_sizes:
            inputs = [("bf16", {})]
            if hidden == 4096:
                inputs += [("fp32", {}), ("bf16", {"fp32_gamma": True})]
            for op in ops:
                for dt, flags in inputs:
                    for scaling in ("none",) if op in BWD else scalings:
                        out = dt if scaling == "none" else "fp8_e4m3"
                        yield make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling,
                                       hidden_size=hidden, arch=arch, **flags)  # fmt: skip


@pytest.mark.matrix
def test_round3_defaults_are_off():
    """The round-3 switches are off by the rules (measured: no gain, bench/results/
    norm_tuning.json): keys outside norm_switches.TUNED carry none of them (e, u, a, s); TUNED keys
    take exactly TUNED's tag (its round-5 winners replaced the one entry that had one: s2,
    LayerNorm backward at 4096)."""
    assert not norm_switches.FWD_EARLY_WEIGHTS and not norm_switches.FWD_ONE_REDUCTION
    assert norm_switches.FWD_ACCUMULATORS == 1 and norm_switches.BWD_SHARED_SUMS == 0
    tuned = 0
    for key in default_keys(FWD + BWD, (1000, 4096, 8192, 14336, 65536), ("none", "tensor")):
        cfg = launch_config(key)
        if tuned_tag(key) is not None:
            assert cfg.tag == tuned_tag(key)
            tuned += 1
            continue
        assert not (cfg.early or cfg.one_reduction) and cfg.accumulators == 1
        assert cfg.shared_sums == 0
        assert not set(switch_letters(cfg.tag)) & set("eusa"), key
    assert tuned  # the loop met TUNED keys


# Round-4 FP8 forward candidates (tensor scaling only): the batched output stage (``o``) and
# the warp-level amax atomics with the guard read at the start (``g``).
FP8_CANDIDATES = [
    {"FWD_FP8_BATCHED": True, "FWD_FP8_WARP_AMAX": True},
    {"FWD_FP8_BATCHED": True},
    {"FWD_FP8_WARP_AMAX": True},
]
FP8_CANDIDATE_HIDDEN = (768, 1000, 1001, 1024, 4096, 8192, 14336, 65536)


def _without_fp8_switches(key, tag):
    """A TUNED tag with the FP8 forward switches (o, g, q, p), the row-group count (x) and the
    staged forward (t, f, b: the register kernel of the same layout) taken out: the layout the
    switch tests start from (as in test_gpu_norm.py)."""
    cfg = norm.parse_tag(tag)
    if key[0].endswith("_fwd"):  # TUNED's key: (op, hidden size, scaling)
        cfg = dataclasses.replace(cfg, stages=0, gamma32=False, ctas_per_sm=0)
    return dataclasses.replace(cfg, batched=False, warp_amax=False, words=False,
                               next_row=False, groups=0).tag  # fmt: skip


def _with_switches(monkeypatch, values):
    """The module switches ``values`` on, over TUNED's layouts with their own o/g/q/p/x letters
    taken out (TUNED carries the measured winners; these tests are about the switches)."""
    layouts = {key: _without_fp8_switches(key, tag) for key, tag in norm_switches.TUNED.items()}
    monkeypatch.setattr(norm_switches, "TUNED", layouts)
    for name, value in values.items():
        monkeypatch.setattr(norm_switches, name, value)
    launch_config.cache_clear()
    ne.clear_cache(disk=False)


# TUNED's FP8 forwards (sm_90, bf16 x; bench/results/norm_tuning-fp8b.json, 2026-12-01;
# H = 65536: norm_tuning-big2.json; RMSNorm 4096: norm_tuning-near-rms.json; LayerNorm: the
# staged forward, norm_tuning-sfwd.json and norm_tuning-snear.json, 2026-12-02; two rows per
# CTA, norm_tuning-srows.json and norm_tuning-bal.json; weights held, norm_tuning-sregs.json;
# z a row later, norm_tuning-fdefer.json; LayerNorm 65536: one-pass statistics about the row's
# first element, norm_tuning-shift.json; LayerNorm 8192: W, source_ab-ln8192-fp8-W2.json;
# RMSNorm 65536: L, source_ab-fp8-cp256.json; LayerNorm 4096 and 14336: A,
# source_ab-ln4096-fp8-smemoffset.json and source_ab-align16.json)
TUNED_FP8 = {
    ("layernorm_fwd", 4096): "w4r1v8j4c1hogqiAt3",
    ("layernorm_fwd", 8192): "w4r1v8j8c1ogqWt3",
    ("layernorm_fwd", 14336): "w14r2v8j4c1ogqAt2",
    ("layernorm_fwd", 65536): "w4r1v8j8c8hogqiyzt3",
    ("rmsnorm_fwd", 4096): "w4r1v8j4c1hogqx4",
    ("rmsnorm_fwd", 8192): "w2r1v8j8c2hogqpx64",
    ("rmsnorm_fwd", 14336): "w14r1v8j4c1hogq",
    ("rmsnorm_fwd", 65536): "w4r1v8j8c8hogqiLt3",
}


def test_tuned_fp8_forwards_carry_the_measured_switches():
    """TUNED's FP8 winners (bench/results/norm_tuning-fp8b.json, 2026-12-01; at RMSNorm
    8192 norm_tuning-bwdc.json, 2026-12-02) keep their o/g/q/p letters (and x4, 4 row groups
    per CTA) whatever the module switches say, on sm_90 only (16-bit x and gamma); elsewhere
    the module's defaults (off) apply."""
    assert not (norm_switches.FWD_FP8_BATCHED or norm_switches.FWD_FP8_WARP_AMAX)
    assert not (norm_switches.FWD_FP8_WORDS or norm_switches.FWD_FP8_NEXT_ROW)
    for (op, hidden), tag in TUNED_FP8.items():
        assert norm_switches.TUNED[(op, hidden, "tensor")] == tag
        assert fp8_tag(op, hidden) == tag
        for dt in ("fp16", "bf16"):
            key = make_key(op, in_dtype=dt, out_dtype="fp8", hidden_size=hidden, arch="sm_90")
            assert launch_config(key) == norm.parse_tag(tag)
        # not sm_90, or fp32 x, or fp32 gamma: the rules, none of the letters
        others = [make_key(op, in_dtype="bf16", out_dtype="fp8", hidden_size=hidden,
                           arch="sm_100a"),
                  make_key(op, in_dtype="fp32", out_dtype="fp8", hidden_size=hidden,
                           arch="sm_90"),
                  make_key(op, in_dtype="bf16", out_dtype="fp8", hidden_size=hidden,
                           arch="sm_90", fp32_gamma=True)]  # fmt: skip
        for key in others:
            cfg = launch_config(key)
            assert not (cfg.batched or cfg.warp_amax or cfg.words or cfg.next_row), key
            assert cfg.groups == 0 and not set(switch_letters(cfg.tag)) & set("ogqpx"), key
    assert norm.parse_tag(TUNED_FP8[("rmsnorm_fwd", 4096)]).groups == 4
    source = render(make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8",
                             hidden_size=8192, arch="sm_90")).source  # fmt: skip
    assert "constexpr bool v = true;" in source and "amax_seen" in source
    assert "store_fw<" in source and "cp.async.cg" in source and "warp_stats_merge(" in source
    held = render(make_key("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8",
                           hidden_size=4096, arch="sm_90")).source  # fmt: skip
    assert "load_fw<" in held and "gh[j].get<Wt>(gf);" in held
    other = render(make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8",
                            hidden_size=8192, arch="sm_100a")).source  # fmt: skip
    assert "amax_seen" not in other and "load_fw<" not in other and "cp.async" not in other


@pytest.mark.matrix
@pytest.mark.parametrize(
    "values", FP8_CANDIDATES, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_candidates_compile(monkeypatch, arch, values):
    """Each FP8 candidate compiles for LayerNorm and RMSNorm with tensor scaling on every arch
    and names itself in the symbol, over the measured table's layouts (norm_switches.TUNED, its
    o/g/q/p/x letters taken out): H = 768, 1000, 4096, 8192, 14336 (sm_90: the TUNED
    layouts, held weights at RMS 14336), 1001 (a partial last access), 1024 (4 rows per
    CTA), 65536 (a cluster on sm_90/sm_100a). Both
    switches on everywhere; each alone at H = 1001, 4096 and 14336 (e5m2 at 4096)."""
    both = len(values) == 2
    if not both and arch not in ("sm_90", "sm_100a"):
        pytest.skip("each switch alone: sm_90 and sm_100a")
    _with_switches(monkeypatch, values)
    batched = values.get("FWD_FP8_BATCHED", False)
    warp_amax = values.get("FWD_FP8_WARP_AMAX", False)
    try:
        for op in FWD:
            for hidden in FP8_CANDIDATE_HIDDEN if both else (1001, 4096, 14336):
                for out in ("fp8_e4m3", "fp8_e5m2") if hidden == 4096 else ("fp8_e4m3",):
                    key = make_key(op, in_dtype="bf16", out_dtype=out, scaling="tensor",
                                   hidden_size=hidden, arch=arch)  # fmt: skip
                    cfg = launch_config(key)
                    if cfg.mode == "loop":
                        assert hidden == 65536 and arch in ("sm_80", "sm_89")
                        continue
                    assert (cfg.batched, cfg.warp_amax) == (batched, warp_amax)
                    letters = ("o" if batched else "") + ("g" if warp_amax else "")
                    # the letters end the switches that TUNED's layouts keep here, before the
                    # numbered fields (a2, m4, x4...); z (LayerNorm 65536, which now applies
                    # to its register form too) and W (LayerNorm 8192) come after them
                    plain = re.sub(r"[asmtxb]\d+", "", switch_letters(cfg.tag))
                    assert re.sub("[zW]+$", "", plain).endswith(letters), cfg.tag
                    kernel = compile_and_check(key)
                    assert kernel.artifact.symbols[0].endswith(cfg.tag)
                    source = render(key).source
                    assert ("constexpr bool v = true;" in source) == batched
                    assert ("amax_seen" in source) == warp_amax
                    assert ("block_max<THREADS>" in source) == (not warp_amax)
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100a"])
def test_fp8_candidates_leave_other_kernels_alone(monkeypatch, arch):
    """The candidates change tensor-scaling forwards only: with them on, the bf16-output,
    MXFP8 and backward kernels render byte for byte as with them off; off (the default), no
    kernel carries their code or their tag letters."""
    keys = []
    for hidden in (1000, 4096, 8192, 14336):
        for op in FWD:
            for out, scaling in (("bf16", "none"), ("fp8_e4m3", "mxfp8"), ("fp8_e4m3", "tensor")):
                keys.append(make_key(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                     hidden_size=hidden, arch=arch))  # fmt: skip
        for op in BWD:
            keys.append(make_key(op, in_dtype="bf16", hidden_size=hidden, arch=arch))
    assert not norm_switches.FWD_FP8_BATCHED and not norm_switches.FWD_FP8_WARP_AMAX
    _with_switches(monkeypatch, {})  # TUNED's layouts without their o/g letters
    off = {}
    for key in keys:
        cfg = launch_config(key)
        assert not (cfg.batched or cfg.warp_amax)
        source = render(key).source
        assert "constexpr bool v = true;" not in source and "amax_seen" not in source
        off[key] = source
    _with_switches(monkeypatch, FP8_CANDIDATES[0])
    try:
        for key in keys:
            source = render(key).source
            if key.scaling == "tensor" and launch_config(key).mode == "regs":
                assert source != off[key] and "amax_seen" in source
            else:
                assert source == off[key], key
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


@pytest.mark.matrix
def test_fp8_candidate_tags_round_trip():
    tags = set()
    for batched in (False, True):
        for warp_amax in (False, True):
            for hold in (False, True):
                for m in (0, 8):
                    cfg = LaunchConfig("regs", 8, 4, 1, 4, 1, hold=hold, min_ctas=m,
                                       batched=batched, warp_amax=warp_amax,
                                       accumulators=2)  # fmt: skip
                    assert norm.parse_tag(cfg.tag) == cfg
                    tags.add(cfg.tag)
    assert len(tags) == 16
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, batched=True, warp_amax=True,
                        min_ctas=8).tag == "w4r1v8j4c1ogm8"  # fmt: skip
    held = LaunchConfig("regs", 8, 14, 1, 4, 1, hold=True, batched=True, warp_amax=True)
    assert norm.parse_tag("w14r1v8j4c1hog") == held


# Round-5 candidate: the staged backward (BWD_STAGED, tag letter ``t{stages}``): x and dz
# copied into shared memory by cp.async, several rows deep; dynamic shared memory.
STAGED_HIDDEN = (1000, 1001, 1024, 4096, 8192, 14336, 65536)


@pytest.mark.matrix
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_staged_backward_compiles(monkeypatch, arch, stages):
    """Every backward op compiles staged on every arch (bf16; fp32 x and fp32 gamma at
    4096), names ``t{stages}`` in its symbol, fits the arch's opt-in shared memory and, on
    sm_90/sm_100a, splits H = 65536 over a cluster; where nothing fits the rules apply."""
    monkeypatch.setattr(norm_switches, "TUNED", {})
    monkeypatch.setattr(norm_switches, "BWD_STAGED", stages)
    launch_config.cache_clear()
    ne.clear_cache(disk=False)
    limit = norm_switches.OPTIN_SMEM_BYTES[int(arch[3:].rstrip("a"))] - 1024
    try:
        cases = [("bf16", h, False) for h in STAGED_HIDDEN]
        cases += [("fp32", 4096, False), ("bf16", 4096, True)]
        for op in BWD:
            for dt, hidden, wf32 in cases:
                key = make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch,
                               fp32_gamma=wf32)  # fmt: skip
                cfg = launch_config(key)
                staged = norm.staged_layout(key, stages)
                if staged is None:  # too large for this arch's shared memory
                    assert hidden >= 14336 and arch in ("sm_80", "sm_89")
                    assert not cfg.stages
                    continue
                assert cfg == staged and 2 <= cfg.stages <= stages and cfg.rows == 1
                assert f"t{cfg.stages}" in cfg.tag and norm.parse_tag(cfg.tag) == cfg
                w_size = 4 if wf32 or dt == "fp32" else 2
                size = norm.staged_smem_bytes(cfg, key.input.itemsize, w_size)
                assert 0 < size <= limit
                if hidden == 65536:
                    assert cfg.cluster == 4
                regs = key.spec.accumulators * cfg.iters * cfg.vec
                assert fits_register_file(cfg.warps, regs + norm_switches.STAGED_OVERHEAD_REGISTERS)
                assert cfg.iters * cfg.vec <= MAX_ELEMENTS
                kernel = compile_and_check(key)
                assert kernel.artifact.symbols[0].endswith(cfg.tag)
                assert kernel._shared_bytes() == (size, 0)
                source = render(key).source
                assert "cp.async.wait_group" in source and "extern __shared__" in source
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


def test_staged_backward_is_off_by_default_and_round_trips():
    """BWD_STAGED is a candidate (off): no layout of the rules is staged and the register
    kernels take no dynamic shared memory; norm_switches.TUNED's staged winners (sm_90, 16-bit x and
    gamma, H = 4096-65536) are exactly TUNED's tags; tags with ``t`` parse back."""
    assert norm_switches.BWD_STAGED == 0
    tuned, sizes = 0, (1000, 4096, 8192, 14336, 65536)
    for key in default_keys(BWD, sizes):
        cfg = launch_config(key)
        if tuned_tag(key) is not None:
            assert cfg.tag == tuned_tag(key) and cfg.stages > 1
            assert "cp.async" in render(key).source
            tuned += 1
            continue
        assert cfg.stages == 0 and "t" not in switch_letters(cfg.tag), key
        assert "cp.async" not in render(key).source
    assert tuned == sum(op in BWD and hidden in sizes for op, hidden, _ in norm_switches.TUNED) > 0
    assert ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=4096,
                         arch="sm_100a")._shared_bytes() == ()  # fmt: skip
    tuned_cfg = norm.parse_tag(norm_switches.TUNED[("layernorm_bwd", 4096, "none")])
    assert ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=4096,
                         arch="sm_90")._shared_bytes() == (
        norm.staged_smem_bytes(tuned_cfg, 2, 2), 0)  # fmt: skip
    cfg = LaunchConfig("regs", 8, 28, 1, 2, 1, stages=3)
    assert cfg.tag == "w28r1v8j2c1t3" and norm.parse_tag(cfg.tag) == cfg
    assert norm.parse_tag("w32r1v8j2c4t2").cluster == 4
    assert norm.parse_tag("w4r1v8j4c1nt2m3") == LaunchConfig(
        "regs", 8, 4, 1, 4, 1, prefetch=False, stages=2, min_ctas=3)  # fmt: skip
    assert norm.staged_smem_bytes(cfg, 2, 2) == 28 * 32 * 2 * 8 * (2 * 3 * 2 + 2)
    assert norm.staged_smem_bytes(LaunchConfig("regs", 8, 4, 1, 4, 1), 2, 2) == 0


def test_staged_layouts_at_the_issue_shapes():
    """The rule's staged layouts on sm_90 (bf16): two accesses per thread, as many warps as
    that takes, 3 stages where they fit in 227 KB; H = 65536 over a cluster of 4."""

    def tag(op, hidden, stages, target=norm_switches.STAGED_TARGET_BYTES):
        key = make_key(op, in_dtype="bf16", hidden_size=hidden, arch="sm_90")
        return norm.staged_layout(key, stages, target).tag

    for op in BWD:
        assert tag(op, 4096, 3) == "w8r1v8j2c1t3"
        assert tag(op, 8192, 3) == "w16r1v8j2c1t3"
        assert tag(op, 14336, 3) == "w28r1v8j2c1t3"
        assert tag(op, 14336, 4) == "w28r1v8j2c1t3"  # 4 stages do not fit: 3
        assert tag(op, 65536, 3) == "w32r1v8j2c4t3"
        assert tag(op, 4096, 2, 64) == "w4r1v8j4c1t2"


@pytest.mark.parametrize(
    "tag, want",
    [  # (rows -> CTAs) on 132 SMs holding 4 CTAs each and 62 clusters of 8
        ("loop", {1: 1, 16384: 16384 // (1024 // norm.loop_threads_per_row(4096))}),
        ("w4r1v8j4c1", {1: 1, 16384: 16384}),  # one-pass: a CTA per row group
        ("w4r2v8j4c1", {1: 1, 16383: 8192}),
        ("w4r1v8j4c1hogqx4", {1: 1, 16384: 4096, 1000: 528}),  # 4 groups a CTA, >= resident
        ("w4r1v8j4c1hogqit3", {1: 1, 16384: 528, 100: 100}),  # persistent: what is resident
        ("w4r1v8j4c1hogqit3b2", {16384: 264}),  # at most 2 CTAs per SM
        ("w4r1v8j8c8hogqit3", {1: 8, 2048: 62 * 8, 7: 56}),  # whole clusters of 8
    ],
)
def test_forward_grid(tag, want):
    """_grid (launch_grid on a device): the CTAs a forward launches for its layout."""
    from nvrtc_engine.ops.norm_kernels import _Device

    cfg = norm.LaunchConfig("loop", 8) if tag == "loop" else norm.parse_tag(tag)
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    kernel = norm.LayerNormFwdKernel.__new__(norm.LayerNormFwdKernel)
    kernel._config, kernel.spec = cfg, key.spec
    dev = _Device(132, (4,), 62 if cfg.cluster > 1 else 0)
    for rows, ctas in want.items():
        assert kernel._grid(dev, rows, 4096) == ctas, (tag, rows)


@pytest.mark.parametrize("op, query", [("layernorm_fwd", "launch_grid"),
                                       ("layernorm_bwd", "workspace_elements")])  # fmt: skip
def test_host_queries_check_their_arguments(op, query):
    """Bad rows or hidden sizes raise the library's typed errors, naming the argument,
    before any device is touched (without a GPU a valid query reaches NoDeviceError): the
    forward's launch_grid and the backward's workspace_elements (which once returned a
    wrong size for another H, and for negative or float sizes)."""
    spec = ne.get_kernel(op, in_dtype="bf16", hidden_size=4096, arch="sm_90")
    general = ne.get_kernel(op, in_dtype="bf16", arch="sm_90")
    for kernel, rows, hidden, error, name in [
        (spec, 0, None, ArgumentError, "rows"), (spec, -5, None, ArgumentError, "rows"),
        (spec, True, None, ArgumentTypeError, "rows"),
        (spec, 2.0, None, ArgumentTypeError, "rows"), (spec, "8", None, ArgumentTypeError, "rows"),
        (spec, 8, 1024, ArgumentError, "hidden_size"),
        (spec, 8, 4096.0, ArgumentTypeError, "hidden_size"),
        (general, 8, None, ArgumentError, "hidden_size"),
        (general, 8, 0, ArgumentError, "hidden_size"),
        (general, 8, -1, ArgumentError, "hidden_size"),
        (general, 8, True, ArgumentTypeError, "hidden_size"),
        (general, 8, 4096.0, ArgumentTypeError, "hidden_size"),
        (spec, None, None, ArgumentTypeError, "rows"),
    ]:  # fmt: skip
        with pytest.raises(error) as info:
            getattr(kernel, query)(rows, hidden)
        assert info.value.argument == name, (rows, hidden)
    with pytest.raises(ArgumentError, match="pass hidden_size="):
        getattr(general, query)(8)
    if not driver.device_count():
        for kernel, rows, hidden in ((spec, 8, None), (spec, 8, 4096), (general, 8, 1000),
                                     (spec, np.int64(8), np.int32(4096))):  # fmt: skip
            with pytest.raises(ne.NoDeviceError):
                getattr(kernel, query)(rows, hidden)


def test_staged_grid_is_persistent_and_counts_whole_clusters():
    """One partial row of column sums per CTA (cluster) of the persistent grid, never more
    clusters than the device can hold at once, at least one, at most one per row."""
    from nvrtc_engine.ops.norm_kernels import _Device

    cfg = norm.parse_tag("w32r1v8j2c4t3")
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=65536, arch="sm_90")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(norm, "launch_config", lambda k: cfg)
        kernel = norm.LayerNormBwdKernel.__new__(norm.LayerNormBwdKernel)
        kernel._config, kernel.spec = cfg, key.spec
        for rows, want in ((1, 1), (7, 7), (2048, 30)):
            plan = kernel._plan(_Device(132, (1, 8), 30), rows, 65536)
            assert plan.parts == want and plan.part_elements == 2 * want * 65536
        assert kernel._plan(_Device(132, (1, 8), 0), 2048, 65536).parts == 33


def test_balanced_persistent_grid(monkeypatch):
    """PERSISTENT_BALANCED (off by default): the fewest clusters that keep the most row
    groups one cluster takes, so that none takes one more than the others; never more than
    the resident clusters or the row groups, at least one."""
    from nvrtc_engine.ops.norm_kernels import _Device, _persistent

    dev = _Device(132, (4, 8), 0)
    assert not norm_switches.PERSISTENT_BALANCED
    assert _persistent(dev, 1, 4, 16384) == 528  # 16 CTAs take 32 rows, 512 take 31
    assert _persistent(dev, 1, 4, 7) == 7
    monkeypatch.setattr(norm_switches, "PERSISTENT_BALANCED", True)
    for groups in (1, 7, 528, 529, 1000, 8192, 16384, 16385, 100003):
        n = _persistent(dev, 1, 4, groups)
        most = -(-groups // min(528, groups))
        assert 1 <= n <= min(528, groups) and -(-groups // n) == most
        assert n == 1 or -(-groups // (n - 1)) > most  # the fewest
    assert _persistent(dev, 1, 4, 16384) == 512
    assert _persistent(_Device(132, (1, 8), 30), 4, 1, 2048) == 30  # 69 row groups: 29.7
    assert _persistent(_Device(132, (1, 8), 33), 4, 1, 2048) == 33  # 62.06: 63 -> 33


def test_tuned_can_name_a_staged_layout(monkeypatch):
    """A ``t`` tag in norm_switches.TUNED (how a measured winner would be adopted) is what the key
    gets on sm_90, with its dynamic shared memory; other archs keep the rules."""
    monkeypatch.setitem(norm_switches.TUNED, ("layernorm_bwd", 14336, "none"), "w28r1v8j2c1t3")
    launch_config.cache_clear()
    ne.clear_cache(disk=False)
    try:
        key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=14336, arch="sm_90")
        assert launch_config(key).tag == "w28r1v8j2c1t3"
        kernel = compile_and_check(key)
        assert kernel._shared_bytes() == (200704, 0)
        other = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=14336, arch="sm_100a")
        assert launch_config(other).stages == 0
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


# Round-5 FP8 forward candidates (tensor scaling only): 32-bit word unpacking of bf16 and
# packing of FP8 (``q``) and the next row group's x copied ahead into shared memory (``p``).
FP8_ROUND5 = [
    {"FWD_FP8_WORDS": True},
    {"FWD_FP8_NEXT_ROW": True},
    {"FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True, "FWD_FP8_BATCHED": True,
     "FWD_FP8_WARP_AMAX": True},
]  # fmt: skip


def _next_row_fits(key, cfg):
    """Where ``p`` applies: 16-byte accesses whose slots fit the static shared memory."""
    return (cfg.vec * key.input.itemsize == 16
            and cfg.threads * cfg.iters * 16 <= norm_switches.STATIC_SMEM_BYTES - 1024)  # fmt: skip


@pytest.mark.matrix
def test_fp8_round5_defaults_are_off():
    """FWD_FP8_WORDS and FWD_FP8_NEXT_ROW are off: keys outside norm_switches.TUNED carry neither
    (nor a row-group count, x); TUNED's FP8 keys carry exactly TUNED's tag."""
    assert not norm_switches.FWD_FP8_WORDS and not norm_switches.FWD_FP8_NEXT_ROW
    tuned, sizes = 0, (1000, 4096, 8192, 14336, 65536)
    for key in default_keys(FWD, sizes, ("tensor", "none")):
        cfg = launch_config(key)
        if tuned_tag(key) is not None:
            assert cfg.tag == tuned_tag(key)
            tuned += key.scaling == "tensor"
            continue
        assert not (cfg.words or cfg.next_row) and cfg.groups == 0, key
        assert not set(switch_letters(cfg.tag)) & set("qpx"), key
    assert tuned == sum(op in FWD and hidden in sizes and scaling == "tensor"
                        for op, hidden, scaling in norm_switches.TUNED) > 0  # fmt: skip


@pytest.mark.matrix
@pytest.mark.parametrize(
    "values", FP8_ROUND5, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items())
)
@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_round5_candidates_compile(monkeypatch, arch, values):
    """Each round-5 candidate (and all four FP8 switches together) compiles for LayerNorm
    and RMSNorm with tensor scaling and names itself in the symbol, over TUNED's layouts:
    H = 768, 1000, 1001 (a partial last access, 2-byte accesses: no ``p``), 1024 (4 rows per
    CTA, one warp each), 4096 (also e5m2, fp16 and fp32 x, zero-centred fp32 gamma), 8192,
    14336 (held weights for RMSNorm on sm_90), 65536 (a cluster: on sm_100a the rules' 2 CTAs
    of 19 warps, whose slots do not fit, no ``p``; on sm_90 TUNED's 8 CTAs of 4 warps, whose
    16 KB of slots fit)."""
    _with_switches(monkeypatch, values)
    words = values.get("FWD_FP8_WORDS", False)
    next_row = values.get("FWD_FP8_NEXT_ROW", False)
    alone = len(values) == 1
    try:
        for op in FWD:
            for hidden in (1001, 4096, 14336) if alone else FP8_CANDIDATE_HIDDEN:
                fields = [("bf16", "fp8_e4m3", {})]
                if hidden == 4096:
                    fields += [("bf16", "fp8_e5m2", {}), ("fp16", "fp8_e4m3", {}),
                               ("fp32", "fp8_e4m3", {}),
                               ("bf16", "fp8_e4m3", {"zero_centered_gamma": True,
                                                     "fp32_gamma": True})]  # fmt: skip
                for in_dtype, out, flags in fields:
                    key = make_key(op, in_dtype=in_dtype, out_dtype=out, scaling="tensor",
                                   hidden_size=hidden, arch=arch, **flags)  # fmt: skip
                    cfg = launch_config(key)
                    if cfg.mode == "loop":
                        assert hidden == 65536 and arch in ("sm_80", "sm_89")
                        continue
                    fits = _next_row_fits(key, cfg)
                    assert cfg.words == words
                    assert cfg.next_row == (next_row and fits)
                    assert norm.parse_tag(cfg.tag) == cfg
                    if hidden == 65536 and arch == "sm_100a":
                        assert not fits  # 2 CTAs of 19 warps, 7 accesses each: 68 KB of slots
                    if hidden == 65536 and arch == "sm_90":  # TUNED: w4j8c8, 16 KB of slots
                        assert fits, cfg
                    if hidden == 1001:
                        assert not fits
                    kernel = compile_and_check(key)
                    assert kernel.artifact.symbols[0].endswith(cfg.tag)
                    source = render(key).source
                    assert ("load_fw<" in source) == words
                    assert ("cp.async.cg" in source) == cfg.next_row
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100a"])
def test_fp8_round5_candidates_leave_other_kernels_alone(monkeypatch, arch):
    """With ``q`` and ``p`` on, bf16-output, MXFP8 and backward kernels render byte for byte
    as with them off."""
    keys = []
    for hidden in (1000, 4096, 8192, 14336):
        for op in FWD:
            for out, scaling in (("bf16", "none"), ("fp8_e4m3", "mxfp8")):
                keys.append(make_key(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                     hidden_size=hidden, arch=arch))  # fmt: skip
        for op in BWD:
            keys.append(make_key(op, in_dtype="bf16", hidden_size=hidden, arch=arch))
    _with_switches(monkeypatch, {})
    off = {key: render(key).source for key in keys}
    _with_switches(monkeypatch, {"FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True})
    try:
        for key in keys:
            cfg = launch_config(key)
            assert not (cfg.words or cfg.next_row)
            assert render(key).source == off[key], key
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_next_row_copies_for_16_bit_output(monkeypatch, arch):
    """A layout's ``p`` (a TUNED tag or a sweep's, bench/norm_tuning.py --candidates big)
    applies to bf16/fp16 output as to FP8 tensor scaling: the copies are x's. H = 65536 over
    a cluster of 4 (w8j8: 32 KB of slots, within the static shared memory) compiles with
    cp.async and names ``p``, for both forward ops; the FP8-only module switch leaves bf16
    kernels alone; MXFP8 never takes ``p``."""
    cfg = norm.LaunchConfig("regs", 8, 8, 1, 8, 4, next_row=True)
    assert norm_layout.next_row_fits(cfg, 2) and cfg.tag == "w8r1v8j8c4p"
    monkeypatch.setitem(norm_switches.TUNED, ("rmsnorm_fwd", 65536, "none"), cfg.tag)
    # (TUNED's LayerNorm bf16 entry at 65536 is staged since round 10, without p)
    monkeypatch.setitem(norm_switches.TUNED, ("layernorm_fwd", 65536, "none"), cfg.tag)
    monkeypatch.setitem(norm_switches.TUNED, ("layernorm_fwd", 65536, "mxfp8"), cfg.tag)
    launch_config.cache_clear()
    try:
        for op in FWD:
            for in_dtype in ("bf16", "fp16"):
                key = make_key(op, in_dtype=in_dtype, hidden_size=65536, arch=arch)
                got = launch_config(key)
                assert got.next_row == (arch == "sm_90"), (key, got)
                source = render(key).source
                assert ("cp.async.cg" in source) == got.next_row
                if got.next_row:
                    kernel = compile_and_check(key)
                    assert kernel.artifact.symbols[0].endswith(cfg.tag)
        mx = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", scaling="mxfp8",
                      hidden_size=65536, arch="sm_90")  # fmt: skip
        assert not launch_config(mx).next_row
        assert "cp.async.cg" not in render(mx).source
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


def test_backward_ctas_per_sm_is_a_grid_choice(monkeypatch):
    """``b{n}`` caps the backward's persistent grid at n CTAs per SM (so n partial column-sum
    rows per SM; BWD_CTAS_PER_SM otherwise), names itself in the tag after ``x``, round-trips
    through parse_tag, and leaves the rendered code as it is but for the dependent launch's
    trigger (a grid below the occupancy would let the next grid's CTAs in early)."""
    cfg = norm.parse_tag("w8r1v8j2c1t3b2")
    assert cfg.ctas_per_sm == 2 and cfg.stages == 3 and cfg.tag == "w8r1v8j2c1t3b2"
    assert norm.parse_tag("w4r1v8j4c1oqpx4b3").tag == "w4r1v8j4c1oqpx4b3"
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    big = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=65536, arch="sm_90")
    assert launch_config(big).ctas_per_sm == 2  # a TUNED entry's b2
    plain = dataclasses.replace(cfg, ctas_per_sm=0)
    monkeypatch.setattr(norm, "launch_config", lambda k: plain)
    source = render(key).source
    monkeypatch.setattr(norm, "launch_config", lambda k: cfg)
    trigger = "  nve::launch_dependents();"
    line = next(ln for ln in source.splitlines(keepends=True) if ln.startswith(trigger))
    assert render(key).source == source.replace(plain.tag, cfg.tag).replace(line, "")
    dev = norm_kernels._Device(sm_count=132, occupancy=(4, 8))
    kernel = object.__new__(norm.LayerNormBwdKernel)
    kernel._config, kernel.spec = cfg, key.spec
    assert kernel._plan(dev, 16384, 4096).parts == 132 * 2
    kernel._config = plain
    assert kernel._plan(dev, 16384, 4096).parts == 132 * min(4, norm_switches.BWD_CTAS_PER_SM)


@pytest.mark.matrix
def test_fp8_round5_tags_round_trip():
    tags = set()
    for words in (False, True):
        for next_row in (False, True):
            for hold in (False, True):
                cfg = LaunchConfig("regs", 8, 4, 1, 4, 1, hold=hold, min_ctas=8, batched=True,
                                   warp_amax=True, words=words, next_row=next_row,
                                   accumulators=2)  # fmt: skip
                assert norm.parse_tag(cfg.tag) == cfg
                tags.add(cfg.tag)
    assert len(tags) == 8
    assert norm.parse_tag("w14r1v8j4c1hogqp") == LaunchConfig(
        "regs", 8, 14, 1, 4, 1, hold=True, batched=True, warp_amax=True, words=True,
        next_row=True)  # fmt: skip
    assert LaunchConfig("regs", 8, 4, 1, 4, 1, words=True, next_row=True,
                        min_ctas=7).tag == "w4r1v8j4c1qpm7"  # fmt: skip
    # the older tags parse as before
    assert norm.parse_tag("w4r1v8j4c1ns2") == LaunchConfig("regs", 8, 4, 1, 4, 1, prefetch=False,
                                                           shared_sums=2)  # fmt: skip


# Round-8 candidates: ROW_SUM_LANES (``l``: a row sum's per-warp values added across lanes by
# shuffles) and BWD_STAGED_WORDS (``q`` on the staged backward: shared-memory reads as words).
def test_kernel_repr_names_the_layout():
    k = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=14336, arch="sm_90")
    assert f"[{k.config.tag}]" in repr(k) and k.config.tag == "w7r1v8j4c2qt3"


@pytest.mark.matrix
def test_round8_tags_round_trip():
    lanes = LaunchConfig("regs", 8, 14, 1, 4, 1, batched=True, warp_amax=True, words=True,
                         lanes=True)  # fmt: skip
    assert lanes.tag == "w14r1v8j4c1ogql" and norm.parse_tag(lanes.tag) == lanes
    staged = LaunchConfig("regs", 8, 28, 1, 2, 1, words=True, lanes=True, stages=2,
                          ctas_per_sm=2)  # fmt: skip
    assert staged.tag == "w28r1v8j2c1qlt2b2" and norm.parse_tag(staged.tag) == staged
    both = dataclasses.replace(staged, gamma32=True, folded=True)
    assert both.tag == "w28r1v8j2c1qlfdt2b2" and norm.parse_tag(both.tag) == both
    assert norm.parse_tag("w28r1v8j2c1dt3").folded and not norm.parse_tag("w28r1v8j2c1dt3").gamma32
    held = norm.parse_tag("w4r1v8j8c8hogqplx64")
    assert held.lanes and held.next_row and held.groups == 64 and held.cluster == 8


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_round8_switches_compile(monkeypatch, arch):
    """With ROW_SUM_LANES, BWD_STAGED_WORDS, BWD_GAMMA32 and BWD_FOLDED on (all off by
    default), every op compiles at TUNED's hidden sizes and H = 1001 (bf16; FP8
    tensor-scaled and MXFP8 z forward); ``l`` appears exactly where a row has several warps
    of one CTA and ``q``, ``f`` and ``d`` on every staged backward, each changing the source,
    and nothing changes for the general kernel."""
    assert not (norm_switches.ROW_SUM_LANES or norm_switches.BWD_STAGED_WORDS)
    assert not (norm_switches.BWD_GAMMA32 or norm_switches.BWD_FOLDED)
    keys = []
    for hidden in (1001, 4096, 8192, 14336, 65536, None):
        for op in ("layernorm_fwd", "rmsnorm_fwd"):
            for out, scaling in (("bf16", "none"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "mxfp8")):
                keys.append(make_key(op, in_dtype="bf16", out_dtype=out, scaling=scaling,
                                     hidden_size=hidden, arch=arch))  # fmt: skip
        for op in BWD:
            keys.append(make_key(op, in_dtype="bf16", hidden_size=hidden, arch=arch))
    launch_config.cache_clear()
    before = {key: (launch_config(key), render(key).source) for key in keys}
    monkeypatch.setattr(norm_switches, "ROW_SUM_LANES", True)
    monkeypatch.setattr(norm_switches, "BWD_STAGED_WORDS", True)
    monkeypatch.setattr(norm_switches, "BWD_GAMMA32", True)
    monkeypatch.setattr(norm_switches, "BWD_FOLDED", True)
    launch_config.cache_clear()
    ne.clear_cache(disk=False)
    try:
        for key in keys:
            old, old_source = before[key]
            cfg = launch_config(key)
            staged = old.mode == "regs" and old.stages > 0 and key.spec.backward
            f32 = dataclasses.replace(old, gamma32=True)
            want = dataclasses.replace(
                old, lanes=old.mode == "regs" and old.warps > 1, words=old.words or staged,
                gamma32=old.gamma32 or (staged and norm_layout.staged_fits(key, f32)),
                folded=old.folded or staged,
            )  # fmt: skip
            assert cfg == want, key
            if cfg.stages:
                assert norm_layout.staged_fits(key, cfg), key
            source = render(key).source
            assert (source != old_source) == (cfg != old), key
            if cfg.lanes:
                assert "Switch l:" in source
            kernel = ne.get_kernel(key)
            assert kernel.artifact.symbols[0].endswith(cfg.tag)
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


# Round-9 candidate: the staged forward (FWD_STAGED, tag letter ``t{stages}`` on a forward
# key; FWD_GAMMA32, ``f``: the weights in shared memory as fp32).
@pytest.mark.matrix
@pytest.mark.parametrize("f32", [False, True], ids=["stored", "fp32"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_staged_forward_compiles(monkeypatch, arch, stages, f32):
    """Every forward op compiles staged on every arch (bf16 x to bf16, FP8 tensor-scaled and
    MXFP8 z; fp16 and fp32 x, fp32 gamma and zero-centred gamma at 4096), names ``t`` (and
    ``f`` where the fp32 weights fit) in its symbol, fits the arch's opt-in shared memory,
    takes exactly that dynamic shared memory, copies x with cp.async and keeps none of the
    register kernels' row-group switches (held weights, next-row copies)."""
    monkeypatch.setattr(norm_switches, "TUNED", {})
    monkeypatch.setattr(norm_switches, "FWD_STAGED", stages)
    monkeypatch.setattr(norm_switches, "FWD_GAMMA32", f32)
    launch_config.cache_clear()
    ne.clear_cache(disk=False)
    limit = norm_switches.OPTIN_SMEM_BYTES[int(arch[3:].rstrip("a"))] - 1024
    modes = (("bf16", "none"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "mxfp8"))
    cases = [("bf16", h, out, sc, {}) for h in STAGED_HIDDEN for out, sc in modes]
    cases += [("fp16", 4096, "fp16", "none", {}), ("fp32", 4096, "fp8_e5m2", "tensor", {}),
              ("bf16", 4096, "fp8_e4m3", "tensor", {"fp32_gamma": True}),
              ("bf16", 4096, "bf16", "none", {"zero_centered_gamma": True})]  # fmt: skip
    try:
        for op in FWD:
            for dt, hidden, out, scaling, flags in cases:
                key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling,
                               hidden_size=hidden, arch=arch, **flags)  # fmt: skip
                cfg = launch_config(key)
                staged = norm.staged_layout(key, stages)
                if staged is None:  # too large for the shared memory of an arch without clusters
                    assert hidden >= 14336 and arch in ("sm_80", "sm_89"), key
                    assert not cfg.stages
                    continue
                assert cfg == staged and 2 <= cfg.stages <= stages and cfg.rows == 1
                assert not (cfg.hold or cfg.next_row or cfg.early), key
                assert f"t{cfg.stages}" in cfg.tag and norm.parse_tag(cfg.tag) == cfg
                fits32 = norm_layout.staged_fits(key, dataclasses.replace(cfg, gamma32=True))
                assert cfg.gamma32 == (f32 and fits32), key
                w_size = 4 if flags.get("fp32_gamma") or dt == "fp32" else 2
                size = norm.staged_smem_bytes(cfg, key.input.itemsize, w_size,
                                              **norm.staged_counts(key.spec))  # fmt: skip
                weights = 1 if op == "rmsnorm_fwd" else 2
                share = cfg.iters * cfg.warps * 32 * cfg.vec
                assert size == share * (
                    cfg.stages * key.input.itemsize + weights * (4 if cfg.gamma32 else w_size)
                )
                assert 0 < size <= limit
                kernel = compile_and_check(key)
                assert kernel.artifact.symbols[0].endswith(cfg.tag)
                assert kernel._shared_bytes() == (size,)
                source = render(key).source
                assert "cp.async.wait_group" in source and "extern __shared__" in source
                assert ("put_f32(" in source) == cfg.gamma32
    finally:
        launch_config.cache_clear()
        ne.clear_cache(disk=False)


def test_staged_forward_is_off_by_default_and_round_trips():
    """FWD_STAGED is a candidate (off by default): no forward layout of the rules is staged
    and the register forward takes no dynamic shared memory; staged forward tags parse back
    and name their shared memory."""
    assert norm_switches.FWD_STAGED == 0 and not norm_switches.FWD_GAMMA32
    for key in default_keys(FWD, (1000, 4096, 8192, 14336, 65536), ("none", "tensor")):
        cfg = launch_config(key)
        tag = tuned_tag(key)
        if tag is not None and "t" in switch_letters(tag):
            assert cfg.tag == tag and cfg.stages > 1
            continue
        assert cfg.stages == 0 and "cp.async.wait_group" not in render(key).source, key
    assert ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=4096,
                         arch="sm_100a")._shared_bytes() == ()  # fmt: skip
    cfg = LaunchConfig("regs", 8, 14, 1, 4, 1, batched=True, warp_amax=True, words=True,
                       stages=3, gamma32=True)  # fmt: skip
    assert cfg.tag == "w14r1v8j4c1ogqft3" and norm.parse_tag(cfg.tag) == cfg
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=14336,
                   arch="sm_90")  # fmt: skip
    assert norm.staged_counts(key.spec) == {"tensors": 1, "weights": 2}
    assert norm.staged_smem_bytes(cfg, 2, 2, tensors=1, weights=2) == 14336 * (3 * 2 + 2 * 4)
    assert norm_layout.staged_fits(key, cfg)  # 196 KB: one CTA per SM on sm_90
    assert norm_layout.staged_fits(key, dataclasses.replace(cfg, stages=4))  # 224 KB
    assert not norm_layout.staged_fits(key, dataclasses.replace(cfg, stages=5))
    rms = make_key("rmsnorm_fwd", in_dtype="bf16", hidden_size=14336, arch="sm_90")
    assert norm.staged_counts(rms.spec) == {"tensors": 1, "weights": 1}


# Round-10 candidate: the staged forward with several rows per CTA (``r2``/``r4`` with ``t``):
# a stage area per row slot, the weights shared by the slots.
STAGED_ROWS = [  # (tag, in dtype, H, scaling, flags)
    ("w4r2v8j4c1qt2", "bf16", 4096, "none", {}),
    ("w2r4v8j8c1ogqft3", "bf16", 4096, "tensor", {}),
    ("w4r2v8j8c1qft2", "bf16", 8192, "mxfp8", {}),
    ("w1r4v8j4c1t2", "fp16", 1000, "tensor", {"zero_centered_gamma": True}),
    ("w2r2v4j8c1ft2", "fp32", 2048, "none", {}),
    ("w1r2v1j32c1t3", "bf16", 1001, "tensor", {"fp32_gamma": True}),
    # the weights in registers, not shared memory: held (h), or loaded per row (e)
    ("w4r1v8j8c8hogqt2", "bf16", 65536, "tensor", {}),
    ("w4r2v8j4c1eqt3", "bf16", 4096, "none", {}),
    ("w1r2v8j4c1ht2", "fp16", 1000, "mxfp8", {"zero_centered_gamma": True}),
]


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_staged_forward_rows_compile(arch):
    """A staged forward with 2 or 4 rows per CTA, or with its weights in registers (``h``,
    ``e``), as norm_switches.TUNED would name one, compiles on every arch (clusters from sm_90), for
    both forward ops and every output mode: its symbol ends with the tag, its dynamic shared
    memory is a stage area of ``stages`` rows per row slot plus the weights once (none in
    registers), within the arch's opt-in limit (sm_80 and sm_89 skip the fp32 weights that
    pass theirs), and the kernel waits for the row slots' shares of staged weights with one
    block barrier."""
    limit = norm_switches.OPTIN_SMEM_BYTES[int(arch[3:].rstrip("a"))] - 1024
    compiled = 0
    with rules_only() as mp:
        for tag, dt, hidden, scaling, flags in STAGED_ROWS:
            cfg = norm.parse_tag(tag)
            mp.setattr(norm_layout, "_tuned", lambda key, cfg=cfg: cfg)
            out = {"none": dt, "tensor": "fp8_e4m3", "mxfp8": "fp8_e5m2"}[scaling]
            for op in FWD:
                launch_config.cache_clear()
                ne.clear_cache(disk=False)  # two entries may share a key
                key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling,
                               hidden_size=hidden, arch=arch, **flags)  # fmt: skip
                assert launch_config(key) == cfg and (cfg.rows > 1 or cfg.hold or cfg.early)
                if cfg.cluster > 1 and arch in ("sm_80", "sm_89"):
                    continue  # no clusters before sm_90
                if not norm_layout.staged_fits(key, cfg):  # past sm_80/sm_89's shared memory
                    assert arch in ("sm_80", "sm_89") and cfg.gamma32, key
                    continue
                compiled += 1
                w_size = 4 if flags.get("fp32_gamma") or dt == "fp32" else 2
                weights = 0 if cfg.hold or cfg.early else 1 if op == "rmsnorm_fwd" else 2
                share = cfg.iters * cfg.warps * 32 * cfg.vec
                size = share * (cfg.rows * cfg.stages * key.input.itemsize
                                + weights * (4 if cfg.gamma32 else w_size))  # fmt: skip
                assert size <= limit
                kernel = compile_and_check(key)
                assert kernel.artifact.symbols[0].endswith(tag)
                assert kernel._shared_bytes() == (size,)
                source = render(key).source
                assert ("if (grp == pos.cluster) __syncthreads();" in source) == bool(weights)
                assert ("(sg, gamma, v, pos.t, pos.tr, pos.slot);" in source) == bool(weights)
                assert ("Held<Wt::storage, V> gh[J];" in source) == cfg.hold
    launch_config.cache_clear()
    assert compiled >= 6 if arch in ("sm_80", "sm_89") else compiled == 2 * len(STAGED_ROWS)


def test_staged_rows_count_in_the_fit():
    """staged_fits counts every row slot: their stage areas in the shared memory (the weights
    once), their warps in the register file."""
    key = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=8192, arch="sm_90")
    one = norm.parse_tag("w4r1v8j8c1qt3")
    four = dataclasses.replace(one, rows=4)
    assert norm_layout.staged_fits(key, one) and norm_layout.staged_fits(
        key, four
    )  # 4 x 48 + 32 KB
    assert norm.staged_smem_bytes(four, 2, 2, tensors=1, weights=2) == 8192 * (4 * 3 * 2 + 2 * 2)
    assert not norm_layout.staged_fits(
        key, dataclasses.replace(four, gamma32=True)
    )  # 4 x 48 + 64 KB
    assert norm_layout.staged_fits(key, dataclasses.replace(four, rows=2, gamma32=True))
    # 32 elements a thread (72 registers): 24 warps fit the register file, 32 do not
    eight = norm.parse_tag("w8r3v8j4c1qt2")
    assert norm_layout.staged_fits(key, eight)
    assert not norm_layout.staged_fits(key, dataclasses.replace(eight, rows=4))


def test_tuned_can_name_a_staged_forward(monkeypatch):
    """A forward ``t`` tag in norm_switches.TUNED is what the key gets on sm_90 (with its dynamic
    shared memory and the same symbol stem); the staged kernel's source keeps the register
    kernel's arithmetic: the same row sums and output expressions, only where x and the
    weights come from differs."""
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=14336,
                   arch="sm_90")  # fmt: skip
    with rules_only() as mp:
        mp.setattr(norm_switches, "TUNED", {("layernorm_fwd", 14336, "tensor"): "w7r1v8j4c2ogqft3"})
        launch_config.cache_clear()
        cfg = launch_config(key)
        assert cfg.tag == "w7r1v8j4c2ogqft3"
        kernel = compile_and_check(key)
        assert kernel._shared_bytes() == (7168 * (3 * 2 + 2 * 4),)
        staged_source = render(key).source
        mp.setattr(norm_switches, "TUNED", {("layernorm_fwd", 14336, "tensor"): "w7r1v8j4c2ogq"})
        launch_config.cache_clear()
        plain_source = render(key).source
    for line in (
        "zf[i] = fmaf((xf[j][i] - mean) * rs, gf[i], bf[i]);",
        "row_sum<1>(t, red, parity, pos.slot, pos.warp, pos.lane);",
    ):
        assert line in staged_source
    assert "zf[i] = fmaf((xf[j][i] - mean) * rs, weight(gf[i]), bf[i]);" in plain_source
    assert "cp.async" not in plain_source and "get_f32(sg, j, pos.t, gf);" in staged_source


def _compile_with_and_without(mp, key, cfg, switch="deferred"):
    """The rendered sources of ``key`` under the layout ``cfg`` (with ``switch`` on: ``i`` by
    default) and the same layout without it, each compiled and checked: launch_config gives
    the layout, the symbol ends with its tag, and both take the same dynamic shared memory."""
    sources, sizes = [], []
    for layout in (cfg, dataclasses.replace(cfg, **{switch: False})):
        mp.setattr(norm_layout, "_tuned", lambda key, layout=layout: layout)
        launch_config.cache_clear()
        ne.clear_cache(disk=False)
        assert launch_config(key) == layout
        kernel = compile_and_check(key)
        assert kernel.artifact.symbols[0].endswith(layout.tag)
        sizes.append(kernel._shared_bytes())
        sources.append(render(key).source)
    assert sizes[0] == sizes[1]
    return sources


# Round 11: the staged backward with each row's dx written a row later (``i``).
DEFERRED = [  # (tag, in dtype, H, flags)
    ("w8r1v8j4c8qlit3b2", "bf16", 65536, {}),
    ("w4r1v8j8c8it4b1", "bf16", 65536, {"zero_centered_gamma": True}),
    ("w7r1v8j4c2qit3", "fp16", 14336, {"fp32_gamma": True}),
    ("w8r1v8j2c1it5", "bf16", 4096, {}),
    ("w1r1v1j32c1fdit3", "bf16", 1001, {}),
]


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_deferred_backward_compile(arch):
    """A staged backward with ``i`` compiles on every arch (clusters from sm_90) for the three
    backward ops: its symbol ends with the tag, its dynamic shared memory is that of the same
    layout without ``i`` (S stages), its source posts a row's sums before the previous row's
    dx, and over a cluster the mailboxes have 4 parts instead of 2."""
    compiled = 0
    with rules_only() as mp:
        for tag, dt, hidden, flags in DEFERRED:
            cfg = norm.parse_tag(tag)
            assert cfg.deferred and cfg.tag == tag
            if cfg.cluster > 1 and arch in ("sm_80", "sm_89"):
                continue  # no clusters before sm_90
            for op in BWD:
                key = make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch, **flags)
                sources = _compile_with_and_without(mp, key, cfg)
                compiled += 1
                post = "row_post<kAcc>(s, red, parity, 0, pos.warp, pos.lane);"
                assert post in sources[0] and post not in sources[1]
                assert "output(prev, pst, pr, pm, ps);" in sources[0]
                if cfg.cluster > 1:
                    assert "constexpr int kMailLog2 = 2;" in sources[0]
                    assert "constexpr int kMailLog2 = 1;" in sources[1]
    launch_config.cache_clear()
    assert compiled == 3 * (2 if arch in ("sm_80", "sm_89") else len(DEFERRED))


def test_deferred_switch_applies_from_three_stages(monkeypatch):
    """BWD_DEFERRED turns ``i`` on for staged backward layouts of three stages or more only:
    not on a two-stage one (a TUNED ``i`` there is dropped too), a register layout or a
    forward."""
    monkeypatch.setattr(norm_switches, "BWD_DEFERRED", True)
    entries = {("layernorm_bwd", 4096, "none"): "w8r1v8j2c1t3",
               ("rmsnorm_bwd", 4096, "none"): "w8r1v8j2c1it2",
               ("layernorm_fwd", 4096, "none"): "w4r1v8j4c1qt3"}  # fmt: skip
    monkeypatch.setattr(norm_switches, "TUNED", entries)

    def cfg(op):
        return launch_config(make_key(op, in_dtype="bf16", hidden_size=4096, arch="sm_90"))

    launch_config.cache_clear()
    try:
        assert cfg("layernorm_bwd").deferred and cfg("layernorm_bwd").tag.endswith("it3")
        assert not cfg("rmsnorm_bwd").deferred and cfg("rmsnorm_bwd").tag == "w8r1v8j2c1t2"
        assert not cfg("layernorm_fwd").deferred
    finally:
        launch_config.cache_clear()


def _forward_keys(cases, arch):
    """(layout, op, key) for each forward op and each (tag, in dtype, H, scaling, flags) of
    ``cases`` on ``arch``, the layout's tag round-tripped; clusters from sm_90 only."""
    for tag, dt, hidden, scaling, flags in cases:
        cfg = norm.parse_tag(tag)
        assert cfg.tag == tag
        if cfg.cluster > 1 and arch in ("sm_80", "sm_89"):
            continue
        out = {"none": dt, "tensor": "fp8_e4m3", "mxfp8": "fp8_e5m2"}[scaling]
        for op in FWD:
            key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling, hidden_size=hidden,
                           arch=arch, **flags)  # fmt: skip
            yield cfg, op, key


FWD_DEFERRED = [  # (tag, in dtype, H, scaling, flags)
    ("w4r1v8j8c8hogqit3", "bf16", 65536, "tensor", {}),
    ("w4r1v8j8c8huqit4b1", "bf16", 65536, "none", {}),
    ("w7r1v8j4c2ogqfit3", "bf16", 14336, "mxfp8", {"zero_centered_gamma": True}),
    ("w4r1v8j4c1eqit3", "fp16", 4096, "none", {"fp32_gamma": True}),
    ("w1r1v1j32c1it3", "bf16", 1001, "tensor", {}),
]


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_deferred_forward_compile(arch):
    """A staged forward with ``i`` (one row per CTA) compiles on every arch (clusters from
    sm_90) for both forward ops and its output mode: its symbol ends with the tag, its
    dynamic shared memory is that of the same layout without ``i``, its source posts the
    row's last statistics before the previous row's z (LayerNorm: the variance, 3 calls back
    without ``u``, the (count, mean, M2) triple 2 calls back with it), and over a cluster the
    mailboxes have 4 parts. ``i`` on several rows per CTA is dropped."""
    compiled = 0
    with rules_only() as mp:
        for cfg, op, key in _forward_keys(FWD_DEFERRED, arch):
            sources = _compile_with_and_without(mp, key, cfg)
            compiled += 1
            assert "emit_deferred(parity - 1);" in sources[0]
            assert "emit_deferred" not in sources[1]
            uni = cfg.one_reduction and op == "layernorm_fwd"
            back = 3 if op == "layernorm_fwd" and not uni else 2
            assert f"emit_deferred(parity - {back});" in sources[0]
            post = "row_stats_post(st, red" if uni else "row_post<1>(q, red"
            assert post in sources[0] and post not in sources[1]
            if cfg.cluster > 1:
                assert "constexpr int kMailLog2 = 2;" in sources[0]
        two = dataclasses.replace(norm.parse_tag("w4r2v8j4c1qt3"), deferred=True)
        mp.setattr(norm_layout, "_tuned", lambda key: two)
        launch_config.cache_clear()
        key = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=4096, arch=arch)
        assert not launch_config(key).deferred
    launch_config.cache_clear()
    assert compiled == 2 * (2 if arch in ("sm_80", "sm_89") else len(FWD_DEFERRED))


# Round 13: the staged forward with x read from its stage in each pass (``y``).
FWD_REREAD = [  # (tag, in dtype, H, scaling, flags)
    ("w4r1v8j8c8hogqyt3", "bf16", 65536, "tensor", {}),
    ("w4r1v8j8c8huqiyt4b1", "bf16", 65536, "none", {}),
    ("w4r2v8j4c1hogqyt3", "bf16", 4096, "tensor", {}),
    ("w7r1v8j4c2ogqfiyt3", "bf16", 14336, "mxfp8", {"zero_centered_gamma": True}),
    ("w4r1v8j4c1eqyt3", "fp16", 4096, "none", {"fp32_gamma": True}),
    ("w1r1v1j32c1uyt3", "bf16", 1001, "tensor", {}),
]


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_reread_forward_compile(arch):
    """A staged forward with ``y`` compiles on every arch (clusters from sm_90) for both
    forward ops and its output mode: its symbol ends with the tag, its dynamic shared memory
    is that of the same layout without ``y``, and its source reads x from the row's stage
    again before the deviations pass (LayerNorm without ``u``) and one access at a time in
    the output stage, which takes the stage (not the held values). ``y`` on a register layout
    or a backward is dropped."""
    compiled = 0
    with rules_only() as mp:
        for cfg, op, key in _forward_keys(FWD_REREAD, arch):
            assert cfg.reread
            sources = _compile_with_and_without(mp, key, cfg, "reread")
            compiled += 1
            read = "shared_f<In, V>(mine + xs * kShare + j * TR * V, xq);"
            assert read in sources[0] and read not in sources[1]
            again = "read_stage(cur, valid, xf);"
            twice = op == "layernorm_fwd" and not cfg.one_reduction
            assert (again in sources[0]) == twice and again not in sources[1]
            call = "emit(prev, true, mean, rs, pst);"
            if not cfg.deferred:
                call = "emit(row, valid, mean, rs, cur);"
            assert call in sources[0] and call not in sources[1]
        for op, tag in (("layernorm_fwd", "w4r1v8j4c1y"), ("layernorm_bwd", "w8r1v8j2c1yt3")):
            layout = norm.parse_tag(tag)
            mp.setattr(norm_layout, "_tuned", lambda key, layout=layout: layout)
            launch_config.cache_clear()
            key = make_key(op, in_dtype="bf16", hidden_size=4096, arch=arch)
            assert not launch_config(key).reread
    launch_config.cache_clear()
    assert compiled == 2 * (3 if arch in ("sm_80", "sm_89") else len(FWD_REREAD))


# Round 16: the staged LayerNorm FP8 forward's one-pass statistics about x[row, 0] (``z``).
FWD_SHIFTED = [  # (tag, in dtype, H, scaling, flags)
    ("w4r1v8j8c8hogqiyzt3", "bf16", 65536, "tensor", {}),
    ("w4r1v8j8c8hqyzt3b1", "bf16", 65536, "mxfp8", {"zero_centered_gamma": True}),
    ("w4r2v8j4c1hogqzt3", "bf16", 4096, "tensor", {}),
    ("w7r1v8j4c2ogqfizt3", "bf16", 14336, "tensor", {}),
    ("w4r1v8j4c1eqzt3", "fp16", 4096, "tensor", {"fp32_gamma": True}),
    ("w1r1v1j32c1izt3", "bf16", 1001, "mxfp8", {}),
    # register layouts (K read from global memory)
    ("w4r1v8j4c1hogqzx4", "bf16", 4096, "tensor", {}),
    ("w4r1v8j8c8ogqpzx64", "bf16", 65536, "tensor", {}),
    ("w2r1v1j16c1z", "fp16", 1001, "mxfp8", {"fp32_gamma": True}),
]


def _layernorm_sources(mp, cases, arch, switch):
    """(layout, its sources with and without ``switch``: _compile_with_and_without) for the
    LayerNorm forward of each of ``cases`` on ``arch`` (:func:`_forward_keys`)."""
    for cfg, op, key in _forward_keys(cases, arch):
        if op == "layernorm_fwd":
            assert getattr(cfg, switch)
            yield cfg, _compile_with_and_without(mp, key, cfg, switch)


def _assert_dropped(mp, op, tag, scaling, arch, switch, text):
    """The layout ``tag`` (``switch`` on in it) as ``op``'s TUNED entry at H = 4096 on
    ``arch`` (``scaling``: FP8 z where "tensor", else bf16): launch_config drops ``switch``
    and the rendered source lacks ``text``."""
    layout = norm.parse_tag(tag)
    assert getattr(layout, switch) and layout.tag == tag
    mp.setattr(norm_layout, "_tuned", lambda key: layout)
    launch_config.cache_clear()
    out = "fp8_e4m3" if scaling == "tensor" else "bf16"
    fields = {} if op == "layernorm_bwd" else {"out_dtype": out, "scaling": scaling}
    key = make_key(op, in_dtype="bf16", hidden_size=4096, arch=arch, **fields)
    assert not getattr(launch_config(key), switch), (op, tag)
    assert text not in render(key).source


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_shifted_forward_compile(arch):
    """A LayerNorm FP8 forward with ``z``, staged or not, compiles on every arch (clusters
    from sm_90): its symbol ends with the tag, its dynamic shared memory is that of the same
    layout without ``z``, and its source takes each row's first element (staged: copied with
    the row; otherwise read from global memory), takes the statistics in one pass about it
    (one exchange of two sums: posted, with ``i``) and folds the centring into the output
    stage's multiply-add. ``z`` is dropped where it does not apply: RMSNorm, a bf16 z, with
    ``u``, the backward."""
    compiled = 0
    with rules_only() as mp:
        for cfg, sources in _layernorm_sources(mp, FWD_SHIFTED, arch, "shifted"):
            compiled += 1
            first = "first_x[st * THREADS + threadIdx.x]" if cfg.stages else "In::load(xr[0])"
            for text in (first, "shifted_stats(", "fmaf(fmaf(", "float sq[2];"):
                assert text in sources[0] and text not in sources[1], text
            post = "row_post<2>(sq," if cfg.deferred else "row_sum<2>(sq,"
            assert post in sources[0]
            if cfg.next_row:  # p: the first row group's copy, then the next one's in the loop
                assert sources[0].count("copy_row_async(xs, x,") == 2
            if cfg.deferred:
                assert "emit_deferred(parity - 2);" in sources[0]
                assert "emit_deferred(parity - 3);" in sources[1]
        dropped = [("rmsnorm_fwd", "w4r1v8j4c1hogqzt3", "tensor"),
                   ("layernorm_fwd", "w4r1v8j4c1hqzt3", "none"),
                   ("layernorm_fwd", "w4r1v8j4c1huoqzt3", "tensor"),
                   ("layernorm_bwd", "w8r1v8j2c1zt3", "none")]  # fmt: skip
        for op, tag, scaling in dropped:
            _assert_dropped(mp, op, tag, scaling, arch, "shifted", "shifted_stats(")
    launch_config.cache_clear()
    one_cta = sum(norm.parse_tag(case[0]).cluster == 1 for case in FWD_SHIFTED)
    assert compiled == (one_cta if arch in ("sm_80", "sm_89") else len(FWD_SHIFTED))


# Round 19: the LayerNorm forward's statistics by two passes per warp, one exchange (``W``).
FWD_WARP_STATS = [  # (tag, in dtype, H, scaling, flags)
    ("w7r1v8j8c1qfWt4", "bf16", 14336, "none", {}),
    ("w7r1v8j8c1W", "bf16", 14336, "none", {"zero_centered_gamma": True}),
    ("w4r2v8j4c1hogqWt3", "bf16", 4096, "tensor", {}),
    ("w4r1v8j4c1eqyWt3", "fp16", 4096, "none", {"fp32_gamma": True}),
    ("w2r1v1j16c1W", "bf16", 1001, "mxfp8", {}),
    ("w1r4v4j8c1W", "fp32", 1000, "none", {}),
    ("w4r1v8j4c1hogqiWt3", "bf16", 4096, "tensor", {}),
    ("w2r1v4j8c1iWt4", "fp32", 2048, "none", {}),
]


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_warp_stats_forward_compile(arch):
    """A LayerNorm forward with ``W`` compiles on every arch, register and staged, for each
    output mode: its symbol ends with the tag, its dynamic shared memory is that of the same
    layout without ``W``, and its source takes each warp's two passes and one exchange of
    (count, sum, mean, M2) per row instead of the two row sums. FWD_WARP_STATS turns it on
    where it applies (with ``i`` too: z a row later); it is dropped on RMSNorm, over a
    cluster, with ``u`` or ``z``, and on the backward."""
    compiled = 0
    with rules_only() as mp:
        for _cfg, sources in _layernorm_sources(mp, FWD_WARP_STATS, arch, "warp_stats"):
            compiled += 1
            merge = "warp_stats_merge(make_float4(wn, ws, wm, warp_sum(split_total(s))),"
            assert merge in sources[0] and merge not in sources[1]
            # the two row sums (the second posted, with i) without W
            assert "row_sum<1>(q," in sources[1] or "row_post<1>(q," in sources[1]
            assert "row_sum<1>(" not in sources[0] and "row_post<1>(" not in sources[0]
        dropped = [("rmsnorm_fwd", "w4r1v8j4c1W", "none", "sm_80"),
                   ("layernorm_fwd", "w1r1v8j4c4W", "none", "sm_90"),
                   ("layernorm_fwd", "w4r1v8j4c1uW", "none", "sm_80"),
                   ("layernorm_fwd", "w4r1v8j4c1hogqzWt3", "tensor", "sm_80"),
                   ("layernorm_bwd", "w8r1v8j2c1Wt3", "none", "sm_80")]  # fmt: skip
        for op, tag, scaling, on in dropped:
            _assert_dropped(mp, op, tag, scaling, on, "warp_stats", "warp_stats_merge(")
        mp.setattr(norm_switches, "FWD_WARP_STATS", True)
        for tag, want in (("w7r1v8j8c1qft4", "w7r1v8j8c1qfWt4"), ("w7r1v8j8c1", "w7r1v8j8c1W")):
            layout = norm.parse_tag(tag)
            mp.setattr(norm_layout, "_tuned", lambda key, layout=layout: layout)
            launch_config.cache_clear()
            key = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=14336, arch=arch)
            assert launch_config(key).tag == want
    launch_config.cache_clear()
    assert compiled == len(FWD_WARP_STATS)


# Programmatic dependent launch: every norm kernel waits for its grid dependency first.
_GLOBAL_ACCESS = re.compile(r"\b(?:ld|st|atom|red)\.(?!param|shared|local|const)|\bcp\.async\.")
DEPENDENT_CASES = [  # (op, fields, staged: its main kernel is the persistent staged one)
    # hogqit3: staged, weights held in registers: no trigger
    ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "hidden_size": 4096}, True),
    # ogqWt3: staged, weights in shared memory: the trigger
    ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "hidden_size": 8192}, True),
    ("rmsnorm_fwd", {"in_dtype": "bf16", "hidden_size": 4096}, False),
    ("layernorm_fwd", {"in_dtype": "fp16", "out_dtype": "fp8", "scaling": "mxfp8"}, False),
    ("layernorm_bwd", {"in_dtype": "bf16", "hidden_size": 4096}, True),
    ("rmsnorm_bwd_add", {"in_dtype": "bf16", "hidden_size": 1000}, False),
    ("layernorm_bwd", {"in_dtype": "bf16"}, False),
    ("rmsnorm_fwd", {"in_dtype": "bf16", "hidden_size": 65536}, True),  # b2: no trigger
    # hogqx4: several row groups per CTA, no trigger
    ("rmsnorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "hidden_size": 4096}, False),
]


@pytest.mark.parametrize("arch", [pytest.param("sm_80", marks=pytest.mark.matrix), "sm_90"])
@pytest.mark.parametrize(("op", "fields", "staged"), DEPENDENT_CASES,
                         ids=lambda v: v if isinstance(v, str) else None)  # fmt: skip
def test_kernels_wait_for_their_grid_dependency(op, fields, staged, arch):
    """In the PTX of every function of a norm kernel for compute_90, ``griddepcontrol.wait``
    comes before the first access to global memory (so a programmatic dependent launch sees
    its predecessor's writes and cannot overwrite what that one still reads); the persistent
    staged kernels and the register forwards of one row group per CTA also let the next grid
    launch (``launch_dependents``) once all their CTAs have started, but not under ``b``, nor
    where a CTA holds its weights in registers (``h``) or takes several row groups (``p``),
    nor in the general kernels. Below
    sm_90 there is neither, and the kernel is launched ordinarily (``Kernel._dependent``)."""
    from nvrtc_engine.nvrtc import CompileOptions, compile_source

    key = make_key(op, arch=arch, **fields)
    kernel = ne.get_kernel(key)
    assert kernel._dependent == (arch == "sm_90")
    assert norm.launch_config(key).stages > 0 if staged and arch == "sm_90" else True
    r = render(key)
    options = CompileOptions(arch=arch.replace("sm_", "compute_"))
    ptx = compile_source(r.name, r.source, r.headers, options, cuda_headers=r.cuda_headers)
    ptx = ptx.image.decode()
    entries = ptx.split(".entry ")[1:]
    assert len(entries) == len(key.spec.symbols(key)) >= 1
    for n, body in enumerate(entries):
        wait = body.find("griddepcontrol.wait")
        first = _GLOBAL_ACCESS.search(body)
        assert first is not None, body[:200]
        if arch == "sm_80":
            assert wait < 0 and "griddepcontrol" not in body
            continue
        assert 0 <= wait < first.start(), (n, body[:400])
        trigger = "griddepcontrol.launch_dependents" in body
        cfg = launch_config(key)
        one_group = not key.spec.backward and not cfg.next_row
        expected = (cfg.mode == "regs" and (cfg.stages > 0 or one_group) and not cfg.hold
                    and not cfg.ctas_per_sm)  # fmt: skip
        assert trigger == (expected and n == 0), n


def test_source_ab_edits_apply_to_the_rendered_source(monkeypatch):
    """bench/source_ab.py: each edit changes the rendered source or the helper headers as
    documented (the trigger added after the wait where there is none, and taken out where
    there is one), the edited source compiles, and an edit whose text is absent, a trigger
    added twice, two layouts or a bad one are errors."""
    from nvrtc_engine.nvrtc import CompileOptions, compile_source

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")  # restored after the test
    ab = _bench_module("source_ab")
    key = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    r = render(key)  # a register forward of one row group per CTA: it triggers
    assert r.source.count("nve::launch_dependents();") == 1
    assert "launch_dependents" not in ab.edited(r, ["notrigger"]).source
    with pytest.raises(ValueError, match="already triggers"):
        ab.edited(r, ["trigger"])
    held = render(make_key("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                           arch="sm_90"))  # fmt: skip
    assert "launch_dependents" not in held.source  # hogqx4: several row groups per CTA
    t = ab.edited(held, ["trigger"])
    wait = "nve::grid_dependency_wait();"
    assert t.source[t.source.index(wait) :].splitlines()[1].strip() == "nve::launch_dependents();"
    for names, match in ((["@w4r1v8j4c1", "@w8r1v8j2c1"], "one @TAG"), (["@w9"], "tag"),
                         (["bogus"], "unknown")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            ab.check_edits(names)
    ab.check_edits(["@w7r1v8j8c1qft4", "notrigger"])
    log = compile_source(t.name, t.source, t.headers, CompileOptions(arch="sm_90")).log
    assert "error" not in log.lower()
    with pytest.raises(ValueError, match="none of its text"):
        ab.edited(dataclasses.replace(r, source="", headers=()), ["notrigger"])
    # the diagnostics: the FP8 output stage without its amax update and scale multiply
    fp8 = render(make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                          arch="sm_90"))  # fmt: skip
    assert "fabsf(zf[i])" in fp8.source and "zf[i] *= scale;" in fp8.source
    d = ab.edited(fp8, ["noamax", "noscale"])
    assert "fabsf(zf[i])" not in d.source and "zf[i] *= scale;" not in d.source
    with pytest.raises(ValueError, match="none of its text"):
        ab.edited(r, ["noamax"])  # a bf16 output has no amax
    # the staged FP8 forward (hogqit3, no trigger): its row copies under an evict-first
    # policy, and the trigger at each CTA's last row; both compile
    assert "launch_dependents" not in fp8.source
    e = ab.edited(fp8, ["cpevictfirst", "latetrigger"])
    assert "createpolicy.fractional.L2::evict_first" in e.source and "L2::cache_hint" in e.source
    refill = e.source.index("issue(grp + D * step, refill_stage(st));")
    assert (
        e.source[refill:]
        .splitlines()[1]
        .strip()
        .startswith("if (grp + step >= groups) nve::launch_dependents();")
    )
    log = compile_source(e.name, e.source, e.headers, CompileOptions(arch="sm_90")).log
    assert "error" not in log.lower()
    for names in (["cpevictlast", "stevictfirst"], ["cpevictnormal", "stevictlast"]):
        e = ab.edited(fp8, names)
        assert "st.global.L2::cache_hint.v2.u32" in dict(e.headers)["nve_memory.cuh"]
        log = compile_source(e.name, e.source, e.headers, CompileOptions(arch="sm_90")).log
        assert "error" not in log.lower()
    for name in ("cpevictfirst", "latetrigger"):
        with pytest.raises(ValueError, match="none of its text"):
            ab.edited(r, [name])  # a register forward has neither
    # the refill after the first barrier, and the stages filled by bulk copies: every part
    # applied once, and the result compiles; on a register forward, an error
    late = ab.edited(fp8, ["latefill"])
    assert "issue(grp + D * step, refill_stage(cur));" in late.source
    assert "issue(grp + D * step, refill_stage(st));" not in late.source
    bulk = ab.edited(fp8, ["tma"])
    assert "cp.async.bulk.shared::cluster.global" in bulk.source
    assert "nve::mbar_wait(&tma_bar[st]" in bulk.source and "refill_stage(cur)" in bulk.source
    early = ab.edited(fp8, ["earlyfill"])
    top = early.source.index("issue(grp + D * step, refill_stage(st));")
    assert early.source[top:].splitlines()[1].strip().startswith("cp_wait<D>();")
    for e in (late, bulk, early):
        log = compile_source(e.name, e.source, e.headers, CompileOptions(arch="sm_90")).log
        assert "error" not in log.lower()
    for name in ("earlyfill", "latefill", "tma"):
        with pytest.raises(ValueError, match="exactly|needs 1"):
            ab.edited(r, [name])
    # round 25: rows from ticket counters, the diagnostics that took the edit apart, and the
    # stages' offset (TUNED's entry has A: its stages on a 128-byte boundary); all compile
    assert "__align__(128) unsigned char staged[]" in fp8.source
    edits = {name: ab.edited(fp8, [name]) for name in ("dynrows8", "dynstatic1r", "dynloop1",
                                                       "red4", "red12", "align16",
                                                       "align512")}  # fmt: skip
    assert "atomicAdd(&nve_dyn_next[dyn_k * 32], 1u)" in edits["dynrows8"].source
    assert "nve_dyn_done" in edits["dynrows8"].source
    assert (
        "atomicAdd" not in edits["dynstatic1r"].source and "dyn_box" in edits["dynstatic1r"].source
    )
    assert (
        "dyn_box[dyn_r & 1]" not in edits["dynloop1"].source
        and "while (dq[0] < groups)" in edits["dynloop1"].source
    )
    assert "float red[kRedFloats + 4];" in edits["red4"].source
    assert "float red[kRedFloats + 12];" in edits["red12"].source
    assert "__align__(16) unsigned char staged[]" in edits["align16"].source
    assert "__align__(512) unsigned char staged[]" in edits["align512"].source
    for e in edits.values():
        log = compile_source(e.name, e.source, e.headers, CompileOptions(arch="sm_90")).log
        assert "error" not in log.lower()
    for name in ("dynrows", "dynrows32", "dynatomic32"):
        with pytest.raises(ValueError, match="exactly|needs 1"):
            ab.edited(r, [name])  # a register forward has no staged loop
    with pytest.raises(ValueError, match="none of its text"):
        ab.edited(r, ["align16"])  # nor stages


# Round 21: the staged kernels' row copies asking L2 for 256 bytes (``L``).
@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_fetch256_compile(arch):
    """A staged forward (both ops) and a staged backward with ``L`` compile on every arch:
    the symbol ends with the tag, the dynamic shared memory is that of the same layout
    without ``L``, and the 16-byte copies carry ``.L2::256B`` instead of ``.L2::128B``; off
    by default, and dropped from a register layout (which has no copies to hint)."""
    assert not norm_switches.STAGED_FETCH256
    _check_staged_switch(arch, "fetch256", "STAGED_FETCH256", ["w4r1v8j4c1hogqiLt3"],
                         "w8r1v8j2c1Lt5", "w4r1v8j4c1hogqL",
                         "cp.async.cg.shared.global.L2::256B",
                         "cp.async.cg.shared.global.L2::128B")  # fmt: skip


def test_fetch256_candidates_are_the_staged_backwards_with_l():
    """bench/norm_tuning.py --candidates fetch256: a staged backward default with ``L`` and
    nothing else changed; nothing for a forward or for a backward that is not staged."""
    tuning = _bench_module("norm_tuning")
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=8192, arch="sm_90")
    default = norm.launch_config(key)
    assert default.stages and not default.fetch256
    ((cand, host),) = tuning.fetch256_candidates(norm, key, default)
    assert cand == dataclasses.replace(default, fetch256=True) and host == {}
    assert cand.tag.replace("L", "") == default.tag
    fwd = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    assert tuning.fetch256_candidates(norm, fwd, norm.launch_config(fwd)) == []
    plain = make_key("layernorm_bwd", in_dtype="fp32", hidden_size=1000, arch="sm_90")
    assert not norm.launch_config(plain).stages
    assert tuning.fetch256_candidates(norm, plain, norm.launch_config(plain)) == []


def _check_staged_switch(arch, switch, constant, forwards, backward, dropped, on, off):
    """The staged forwards ``forwards`` (tags at H = 4096, FP8 z, both ops) and the staged
    RMSNorm backward ``backward`` (``switch`` on in each) compile on ``arch`` with the text
    ``on`` and without ``off``, and the same layouts without ``switch`` the other way round
    (_compile_with_and_without); launch_config drops ``switch`` from the register layout
    ``dropped``; the module constant ``constant`` turns it on for a TUNED staged entry."""
    cases = [(cfg, key) for cfg, _op, key in _forward_keys(
        [(tag, "bf16", 4096, "tensor", {}) for tag in forwards], arch)]  # fmt: skip
    bwd = norm.parse_tag(backward)
    cases.append((bwd, make_key("rmsnorm_bwd", in_dtype="bf16", hidden_size=4096, arch=arch)))
    with rules_only() as mp:
        for cfg, key in cases:
            assert getattr(cfg, switch)
            with_it, without = _compile_with_and_without(mp, key, cfg, switch)
            assert on in with_it and off not in with_it
            assert off in without and on not in without
        _assert_dropped(mp, "rmsnorm_fwd", dropped, "tensor", arch, switch, on)
        mp.setattr(norm_switches, constant, True)
        mp.setattr(norm_layout, "_tuned", lambda key: norm.parse_tag("w4r1v8j4c1hogqit3"))
        launch_config.cache_clear()
        key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                       arch=arch)  # fmt: skip
        assert getattr(launch_config(key), switch)
    launch_config.cache_clear()


# Round 25: the staged kernels' stages on a 128-byte boundary (``A``).
@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
def test_aligned_compile(arch):
    """A staged forward (both ops; one and two rows per CTA) and a staged backward with ``A``
    compile on every arch: the symbol ends with the tag, the dynamic shared memory is that of
    the same layout without ``A``, and the stages are declared on a 128-byte boundary
    instead of a 16-byte one; off by default, and dropped from a register layout (which has
    no stages)."""
    assert not norm_switches.STAGED_ALIGNED
    align = "extern __shared__ __align__({}) unsigned char staged[];"
    _check_staged_switch(arch, "aligned", "STAGED_ALIGNED",
                         ["w4r1v8j4c1hogqiAt3", "w2r2v8j8c1ogqAt2"], "w8r1v8j2c1At5",
                         "w4r1v8j4c1hogqA", align.format(128), align.format(16))  # fmt: skip


def test_one_layout_patch_reaches_source_symbols_and_kernel(monkeypatch):
    """bench/common.py's ``norm_layout`` (how the sweeps and bench/source_ab.py build a
    candidate) patches ``norm.launch_config`` once; the layout must reach the rendered source,
    the symbols and the kernel's host side (``Kernel.config``: its grids) alike, though the
    kernels live in norm_kernels.py (NormSpec.layout is the one lookup)."""
    from nvrtc_engine.engine import Engine

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    common = _bench_module("common")
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    default = launch_config(key)
    candidate = norm.parse_tag("w8r1v8j2c1")
    assert candidate != default
    with common.norm_layout(candidate):
        kernel = Engine().get(key)
        assert key.spec.layout(key) == candidate
    assert kernel.config == candidate
    assert kernel.artifact.symbols == (f"{key}_{candidate.tag}",)
    assert f"_{candidate.tag}" in kernel.artifact.symbols[0]
    assert norm.launch_config is launch_config and key.spec.layout(key) == default


def test_norm_modules_keep_settings_in_one_place():
    """The settings live only in norm_switches (norm.py re-exports the layout's and kernels'
    public names, not the settings), so a patch of ``norm.TUNED`` or a switch fails loudly
    instead of changing nothing; norm_spec refuses a key of another family."""
    for name in ("TUNED", "FWD_REREAD", "STAGED_ALIGNED", "BWD_CTAS_PER_SM", "LOOP_BLOCK"):
        assert hasattr(norm_switches, name) and not hasattr(norm, name), name
        with pytest.MonkeyPatch.context() as mp, pytest.raises(AttributeError):
            mp.setattr(norm, name, None)
    assert not hasattr(norm, "_tuned") and callable(norm_layout._tuned)
    for name in norm.__all__:
        assert hasattr(norm, name), name
    key = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    assert norm_layout.norm_spec(key) is key.spec
    with pytest.raises(TypeError, match="gelu is not a norm op"):
        norm_layout.norm_spec(make_key("gelu", in_dtype="bf16", arch="sm_90"))


def test_sass_script_builds_edited_kernels(monkeypatch):
    """bench/sass.py's ``edits=`` (the diff against the same build without them needs
    cuobjdump, not here): the edited and plain builds share symbols and layout and differ in
    the image; ``instructions`` keeps only the instruction text of a disassembly."""
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    sass = _bench_module("sass")
    fields = dict(in_dtype="bf16", out_dtype="fp8", hidden_size=4096, arch="sm_90")
    plain = sass.edited_norm("layernorm_fwd", fields, "w4r1v8j4c1hogqit3", [])
    red = sass.edited_norm("layernorm_fwd", fields, "w4r1v8j4c1hogqit3", ["red4"])
    assert plain.config.tag == red.config.tag == "w4r1v8j4c1hogqit3"
    assert plain.artifact.symbols == red.artifact.symbols
    assert plain.artifact.image != red.artifact.image
    with pytest.raises(SystemExit, match="unknown edit"):
        sass.edited_norm("layernorm_fwd", fields, None, ["nosuch"])
    text = (  # fmt: skip
        "        Function : k\n"
        "        /*0000*/     LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
        "                                              /* 0x000fe40000000800 */\n"
        "        /*0010*/     UIADD3 UR5, UR5, 0x20, URZ ; /* 0x0000002005057890 */\n"
    )
    assert sass.instructions(text) == ["LDC R1, c[0x0][0x28] ;", "UIADD3 UR5, UR5, 0x20, URZ ;"]


@pytest.mark.matrix
def test_render_snapshot_script(tmp_path):
    """bench/render_snapshot.py (the check behind the module and template splits): a snapshot
    with the switches on differs from the default one, two of the same compare equal, and a
    missing file is a usage error."""
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).parent.parent / "bench" / "tuning" / "render_snapshot.py")
    run = lambda *a: subprocess.run([sys.executable, script, *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=600)  # fmt: skip
    plain, again, switched = (tmp_path / f"{n}.json" for n in ("plain", "again", "switched"))
    for out, extra in ((plain, []), (again, []), (switched, ["--switches"])):
        done = run("--out", str(out), *extra)
        assert done.returncode == 0 and "3168 keys" in done.stdout, done.stderr
    same = run("--compare", str(plain), str(again))
    assert same.returncode == 0 and "3168 of 3168 keys the same" in same.stdout
    differ = run("--compare", str(plain), str(switched))
    assert differ.returncode == 1 and "differs: " in differ.stdout
    missing = run("--compare", str(plain), str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "no file" in missing.stderr


def test_where_specialized_keys_fall_back_to_the_general_kernel():
    """docs/norms.md's table of the hidden sizes whose specialized key compiles the general
    algorithm (``loop``): the forwards at 65536 without clusters, the backwards from 14336
    (16384 for fp32 x in RMSNorm's, and on sm_90 with 16-bit x, whose TUNED staged layouts
    cover 14336 and 65536)."""
    sizes = (4096, 8192, 14336, 16384, 32768, 65536)

    def falls_back(op, arch, dt):
        keys = [make_key(op, in_dtype=dt, hidden_size=h, arch=arch) for h in sizes]
        return [k.hidden_size for k in keys if launch_config(k).mode == "loop"]

    for arch in ("sm_80", "sm_89", "sm_90", "sm_100a", "sm_120"):
        clusters = arch in ("sm_90", "sm_100a")
        for dt in DTYPES:
            tuned = arch == "sm_90" and dt != "fp32"
            for op in FWD:
                assert falls_back(op, arch, dt) == ([] if clusters else [65536])
            lnb = [16384, 32768] if tuned else [14336, 16384, 32768, 65536]
            assert falls_back("layernorm_bwd", arch, dt) == lnb
            for op in ("rmsnorm_bwd", "rmsnorm_bwd_add"):
                rms = [16384, 32768] if tuned else [16384, 32768, 65536]
                if dt != "fp32" and arch != "sm_90":
                    rms = [14336, *rms]
                assert falls_back(op, arch, dt) == rms, (op, arch, dt)


def test_eps_that_is_no_real_number_is_a_type_error(ln_fp8):
    """None, a list or a complex number is the wrong type, as a string is; an int too large
    for any float is out of fp32's range (a value error, saying so)."""
    for bad in (None, [1e-5], 1j):
        with pytest.raises(ArgumentTypeError, match="^eps: must be a float >= 0"):
            ln_fp8(None, None, None, eps=bad)
    with pytest.raises(ArgumentError, match="^eps: must be at most 3.4028235e"):
        ln_fp8(None, None, None, eps=10**400)
