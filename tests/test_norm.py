"""Norm family without a GPU: every variant compiles, keys and configurations are valid,
arguments are checked before launch, and the float64 references agree with naive formulas
and numerical gradients.

Compilation coverage (CPU time): every op x input dtype x output mode (x's dtype; e4m3 and
e5m2 with tensor scaling; e4m3 and e5m2 MXFP8) compiles for sm_80, sm_89, sm_90 and sm_100a at
hidden sizes None (general kernel), 1000 (not a multiple of 32) and 4096 (e5m2 outputs of the
specialized kernels only for sm_90: they differ from e4m3 in one conversion instruction), and
for sm_90 (where clusters split large rows) at 768, 5120, 8192, 14336 and 65536. The flags
(zero-centred gamma, fp32 gamma) compile for every op at all four archs. That the kernels
themselves do not change is tests/test_norm_sass.py's (the ``matrix`` tier).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from fakes import FakeCaiArray, FakeCupyArray
from norm_shift_emulation import shifted_forward_fp32

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, KernelKey, VariantError, make_key
from nvrtc_engine import reference as ref
from nvrtc_engine.core import driver
from nvrtc_engine.core.key import arch_number
from nvrtc_engine.core.registry import get_spec
from nvrtc_engine.core.render import render
from nvrtc_engine.families.norm import config as norm_config
from nvrtc_engine.families.norm import spec as norm
from nvrtc_engine.families.norm.config import (
    MAX_ELEMENTS,
    MAX_REGISTERS,
    _registers,
    iters,
    vector_width,
)
from nvrtc_engine.families.norm.spec import (
    TUNED,
    BackwardConfig,
    ForwardConfig,
    Staging,
    fits_register_file,
    gamma_dtype,
    loop_threads_per_row,
)

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


def tuned_config(key):
    """TUNED's configuration for ``key`` where the table applies (sm_90, 16-bit x and gamma),
    else None."""
    if arch_number(key.arch) != 90 or key.hidden_size is None or key.input.itemsize != 2:
        return None
    if ne.DTYPES[gamma_dtype(key)].itemsize != 2:
        return None
    row = TUNED.get((key.op, key.hidden_size, key.scaling))
    return None if row is None else row[0]


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
    cfg = norm.norm_config(key)
    assert kernel.artifact.symbols[0] == f"{key}_{cfg.label}" and kernel.config == cfg
    expected = 1 if op in FWD else (2 if cfg.warps else 3)
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
    # TUNED's FP8 winner: its label names its fields
    assert key.spec.symbols(key) == (f"{key}_w4_r1_stages3_deferred_align128_held_words_batched",)
    assert bwd.spec.symbols(bwd) == (f"{bwd}_general", f"{bwd}_general_stats",
                                     f"{bwd}_general_finalize")  # fmt: skip
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
def test_configurations_cover_rows_and_fit(op, dt, arch):
    """Every specialized configuration covers the row (J accesses of V elements per thread,
    the last partly past the row at most) and fits: 1024 threads per CTA, 32 warps, and the
    rules' register estimate within 255 and the register file (TUNED's measured winners need
    not follow the estimate: ptxas fitted them); only TUNED's are staged or split a backward
    row over a cluster; the general kernel for hidden_size=None."""
    spec = get_spec(op)
    itemsize = ne.DTYPES[dt].itemsize
    for hidden in HIDDEN_SWEEP:
        key = make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch)
        cfg = norm.norm_config(key)
        assert isinstance(cfg, BackwardConfig if spec.backward else ForwardConfig)
        tuned = tuned_config(key)
        assert tuned is None or cfg == tuned
        if not cfg.warps:
            assert cfg.label == "general" and vector_width(key, cfg) == 16 // itemsize
            continue
        vec, j = vector_width(key, cfg), iters(key, cfg)
        assert hidden % vec == 0 and vec * itemsize <= 16
        per_row = 32 * cfg.warps * cfg.cluster
        assert (j - 1) * per_row < hidden // vec <= j * per_row
        assert cfg.threads <= 1024 and cfg.warps <= 32 and cfg.cluster in (1, 2, 4, 8)
        if tuned is None:
            assert cfg.staging is None
            assert j * vec <= MAX_ELEMENTS["bwd" if spec.backward else "fwd"]
            regs = _registers(spec.backward, spec.accumulators, j * vec)
            assert regs <= MAX_REGISTERS and fits_register_file(cfg.threads // 32, regs)
            assert cfg.cluster == 1 or (arch == "sm_90" and not spec.backward and cfg.rows == 1)
    general = norm.norm_config(make_key(op, in_dtype=dt, arch=arch))
    assert not general.warps and general.label == "general"


def test_configuration_choices():
    def label(op, hidden, arch="sm_90", dt="bf16", **fields):
        return norm.norm_config(make_key(op, in_dtype=dt, hidden_size=hidden, arch=arch,
                                         **fields)).label  # fmt: skip

    # the rules: 4 accesses of 16 bytes per thread over the fewest warps, small rows packed 4 to
    # a CTA, odd H in single elements, a cluster of 2 where one CTA cannot hold the row
    # (forward, sm_90 to sm_10x), the general kernel where nothing fits
    assert label("layernorm_fwd", 4096) == "w4_r1"
    assert label("layernorm_fwd", 768) == "w1_r4"
    assert iters(make_key("layernorm_fwd", in_dtype="bf16", hidden_size=1001, arch="sm_90"),
                 ForwardConfig(warps=1, rows=4)) == 32  # fmt: skip
    assert label("layernorm_fwd", 65536, "sm_100a") == "w19_r1_c2"
    assert label("layernorm_fwd", 65536, "sm_80") == "general"
    assert label("layernorm_bwd", 4096, "sm_100a") == "w4_r1"
    assert label("rmsnorm_bwd", 8192, "sm_100a") == "w8_r1"
    assert label("layernorm_bwd", 14336, "sm_100a") == "general"  # no backward clusters
    assert label("layernorm_fwd", 1 << 20) == "general"
    # TUNED (sm_90, 16-bit x and gamma): the measured winners
    assert label("rmsnorm_fwd", 4096) == "w8_r1"
    assert label("layernorm_bwd", 4096) == "w1_r1_c4_stages3_words"
    assert label("rmsnorm_bwd", 4096) == "w8_r1_stages5"
    assert label("layernorm_bwd", 65536) == "w16_r1_c8_stages3_deferred_ctas2_words"
    assert label("rmsnorm_bwd_add", 14336) == "w28_r1_stages3_deferred_fetch256_gamma_fp32"
    assert label("layernorm_fwd", 14336) == "w7_r1_stages4_shared_fp32_per_warp_words"
    assert label("layernorm_fwd", 4096, zero_centered_gamma=True) == "w4_r1"  # no entry
    assert label("layernorm_bwd", 8192, "sm_100a") == "w8_r1"  # TUNED is sm_90's
    assert label("rmsnorm_fwd", 4096, dt="fp32") == "w8_r1"  # 16-bit x only: the rules
    assert label("layernorm_bwd", 4096, fp32_gamma=True) == "w4_r1"  # 16-bit gamma only
    fp8 = make_key("rmsnorm_fwd", in_dtype="fp16", out_dtype="fp8_e5m2", hidden_size=8192,
                   arch="sm_90a")  # fmt: skip
    assert norm.norm_config(fp8).label == "w2_r1_c2_held_words_batched_groups64"


def test_tuned_rows_are_the_configurations_of_their_keys():
    """Every TUNED row is what norm_config returns for its (op, H, scaling) with bf16 and fp16
    x (E4M3 and E5M2 z), with zero-centred gamma too, on sm_90 and sm_90a; it gives a reason
    with a figure; rmsnorm_bwd_add takes rmsnorm_bwd's; the table is read-only."""
    for (op, hidden, scaling), (cfg, why) in TUNED.items():
        assert re.search(r"\d+\.\d", why) and re.search(r"\w\.json\)", why), why
        assert isinstance(cfg, BackwardConfig if get_spec(op).backward else ForwardConfig)
        for dt in ("bf16", "fp16"):
            for out in ("fp8_e4m3", "fp8_e5m2") if scaling != "none" else (dt,):
                for arch in ("sm_90", "sm_90a"):
                    for zcg in (False, True):
                        key = make_key(op, in_dtype=dt, out_dtype=out, scaling=scaling,
                                       hidden_size=hidden, arch=arch,
                                       zero_centered_gamma=zcg)  # fmt: skip
                        assert norm.norm_config(key) == cfg
                        vec = vector_width(key, cfg)
                        per_row = 32 * cfg.warps * cfg.cluster
                        assert (iters(key, cfg) - 1) * per_row < hidden // vec
        if op == "rmsnorm_bwd":
            assert TUNED[("rmsnorm_bwd_add", hidden, scaling)][0] == cfg
    with pytest.raises(TypeError):
        TUNED[("layernorm_fwd", 1024, "none")] = (ForwardConfig(4), "")  # type: ignore[index]


def test_labels_name_every_field():
    """A configuration's label is its symbol suffix: one part per field that differs from the
    default, so two configurations of a key never share a symbol."""
    staging = [None, Staging(3), Staging(3, deferred=True), Staging(3, ctas_per_sm=2),
               Staging(2, align=128), Staging(4, fetch=256)]  # fmt: skip
    fwd = {ForwardConfig(4, staging=s, weights=w, stats=st, words=q, batched=b)
           for s in staging for w in ("global", "held", "shared", "shared_fp32")
           for st in ("two_pass", "per_warp", "shifted") for q in (False, True)
           for b in (False, True)
           if s is not None or (w in ("global", "held") and st != "shifted")}  # fmt: skip
    fwd |= {ForwardConfig(2, cluster=2, weights="held", row_groups=g) for g in (2, 8, 64)}
    bwd = {BackwardConfig(16, staging=s, gamma_fp32=f, words=q)
           for s in staging[1:] for f in (False, True) for q in (False, True)}  # fmt: skip
    for configs in (fwd, bwd):
        assert len({c.label for c in configs}) == len(configs)
        assert all(re.fullmatch(r"w\d+_r\d+(_[a-z0-9_]+)?", c.label) for c in configs)
    assert ForwardConfig().label == BackwardConfig().label == "general"
    assert ForwardConfig(4, rows=2).label == "w4_r2"


def test_configurations_check_their_fields():
    """A configuration built by hand fails where it is built, with the field's name: ranges
    (ArgumentError, a ValueError), types (ArgumentTypeError, a TypeError) and the fields that
    need a staged kernel."""
    for make, match in [
        (lambda: ForwardConfig(33), "warps=33: 1 to 32"),
        (lambda: ForwardConfig(-1), "warps=-1"),
        (lambda: ForwardConfig(4, rows=0), "rows=0: at least 1"),
        (lambda: ForwardConfig(4, cluster=3), "cluster=3: 1, 2, 4 or 8"),
        (lambda: ForwardConfig(8, rows=8), "2048 threads per CTA, at most 1024"),
        (lambda: ForwardConfig(4, rows=2, cluster=2), "a cluster holds one row"),
        (lambda: ForwardConfig(rows=2), "the general kernel takes no rows"),
        (lambda: ForwardConfig(4, weights="smem"), "weights is one of"),
        (lambda: ForwardConfig(4, stats="one_pass"), "stats is one of"),
        (lambda: ForwardConfig(4, weights="shared"), "weights='shared' needs staging"),
        (lambda: ForwardConfig(4, stats="shifted"), "stats='shifted' needs staging"),
        (lambda: ForwardConfig(4, staging=Staging(3), row_groups=2), "1 for a staged kernel"),
        (lambda: ForwardConfig(4, staging=Staging(1)), "stages=1: 2 to 32"),
        (lambda: ForwardConfig(4, staging=Staging(2, deferred=True)), "deferred needs 3"),
        (lambda: ForwardConfig(4, staging=Staging(3, align=64)), "align=64: 16 or 128"),
        (lambda: ForwardConfig(4, staging=Staging(3, fetch=64)), "fetch=64: 128 or 256"),
        (lambda: ForwardConfig(4, staging=Staging(3, ctas_per_sm=33)), "ctas_per_sm=33"),
        (lambda: BackwardConfig(4, words=True), "need staging"),
        (lambda: BackwardConfig(4, cluster=2), "a cluster needs staging"),
    ]:  # fmt: skip
        with pytest.raises(ArgumentError, match=match):
            make()
    for make, match in [(lambda: ForwardConfig(4.0), "warps is int, not float"),
                        (lambda: ForwardConfig(4, words=1), "words is bool, not int"),
                        (lambda: ForwardConfig(True), "warps is int, not bool"),
                        (lambda: ForwardConfig(4, staging=3), "staging is a Staging")]:  # fmt: skip
        with pytest.raises((ArgumentTypeError, ArgumentError), match=match):
            make()


def test_norm_config_of_a_wrong_argument_names_it():
    """norm_config checks its argument before the cache hashes it: a dict or a key of another
    family is a TypeError saying what was passed; a key's configuration is computed once."""
    for wrong, match in [({"op": "layernorm_fwd"}, "KernelKey is needed .* not dict"),
                         (["layernorm_fwd"], "not list"), (None, "not NoneType")]:  # fmt: skip
        with pytest.raises(ArgumentTypeError, match=match):
            norm.norm_config(wrong)
    with pytest.raises(ArgumentTypeError, match="not a norm op"):
        norm.norm_config(make_key("gelu", dtype="bf16", arch="sm_90"))
    key = make_key("layernorm_fwd", dtype="bf16", arch="sm_90", hidden_size=4096)
    assert norm.norm_config(key) is norm.norm_config(key)


def test_register_estimate():
    # forward: x in fp32 plus the overhead
    assert _registers(False, 1, 32) == 72
    # backward LN (2 sums), 32 elements: ptxas -v needs 168
    assert _registers(True, 2, 32) == 168
    assert _registers(True, 1, 16) == 88


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
    from nvrtc_engine.families.norm.kernels import _eps

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
    from nvrtc_engine.families.norm.kernels import _eps

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
    from nvrtc_engine.core import driver

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
    from nvrtc_engine.core import driver

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


@pytest.mark.parametrize("hidden, first", [(65536, 256.0), (4096, -2000.0), (1001, 30.0),
                                           (4096, None)])  # fmt: skip
def test_reference_shifted_bounds_cover_the_one_pass_statistics(hidden, first):
    """``layernorm_fwd(..., shift=K)`` bounds the fp32 one-pass statistics about K
    (``stats="shifted"``, emulated by tests/norm_shift_emulation.py): bf16 rows of N(0, 1)
    whose first element is an outlier (256 = sqrt(65536) standard deviations: half the bound's
    cancellation; a "massive activation" of -2000), where the fp32 computation is far outside
    the two-pass bounds and inside the shifted ones; and fp32 rows with a 1e4 mean offset."""
    rng = np.random.default_rng(hidden)
    if first is None:
        x = (1e4 + rng.standard_normal((8, hidden))).astype(np.float32)
    else:
        x = rng.standard_normal((8, hidden))
        x[:, 0] = first
        x = x.astype(ne.DTYPES["bf16"].numpy()).astype(np.float32)
    gamma = (rng.standard_normal(hidden) * 0.5 + 1).astype(np.float32)
    beta = (rng.standard_normal(hidden) * 0.5).astype(np.float32)
    k, mu, rs, z = shifted_forward_fp32(x, gamma, beta, 1e-5)
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
    from nvrtc_engine.families.norm.kernels import _Device

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
            if cfg.warps:
                assert plan.parts * cfg.cluster <= max(cfg.cluster, sm_count * 2)
            else:
                assert (plan.parts - 1) * plan.chunk_rows < rows <= plan.parts * plan.chunk_rows
                assert plan.stats_offset % 4 == 0 and plan.workspace == plan.stats_offset + 2 * rows
            assert plan.part_elements == nacc * plan.parts * h
            assert plan.workspace >= plan.part_elements


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


@pytest.mark.parametrize(
    "cfg, want",
    [  # (rows -> CTAs) on 132 SMs holding 4 CTAs each and 62 clusters of 8
        (ForwardConfig(), {1: 1, 16384: 16384 // (1024 // norm.loop_threads_per_row(4096))}),
        (ForwardConfig(4), {1: 1, 16384: 16384}),  # one CTA per row group
        (ForwardConfig(4, rows=2), {1: 1, 16383: 8192}),
        (ForwardConfig(4, weights="held", row_groups=4), {1: 1, 16384: 4096, 1000: 528}),
        (ForwardConfig(4, staging=Staging(3)), {1: 1, 16384: 528, 100: 100}),  # persistent
        (ForwardConfig(4, staging=Staging(3, ctas_per_sm=2)), {16384: 264}),  # 2 per SM
        (ForwardConfig(4, cluster=8, staging=Staging(3)), {1: 8, 2048: 62 * 8, 7: 56}),
    ],
    ids=lambda v: v.label if isinstance(v, ForwardConfig) else None,
)
def test_forward_grid(cfg, want):
    """_grid (launch_grid on a device): the CTAs a forward launches for its configuration:
    several row groups per CTA never launch fewer CTAs than are resident; a staged kernel's
    grid is persistent, in whole clusters."""
    from nvrtc_engine.families.norm.kernels import _Device

    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    kernel = norm.LayerNormFwdKernel.__new__(norm.LayerNormFwdKernel)
    kernel._config, kernel.spec = cfg, key.spec
    dev = _Device(132, (4,), 62 if cfg.cluster > 1 else 0)
    for rows, ctas in want.items():
        assert kernel._grid(dev, rows, 4096) == ctas, (cfg.label, rows)


def test_staged_grid_is_persistent_and_counts_whole_clusters():
    """One partial row of column sums per CTA (cluster) of the persistent grid, never more
    clusters than the device can hold at once, at least one, at most one per row;
    ``ctas_per_sm`` caps it (BWD_CTAS_PER_SM otherwise)."""
    from nvrtc_engine.families.norm.kernels import _Device

    cfg = BackwardConfig(32, cluster=4, staging=Staging(3))
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=65536, arch="sm_90")
    kernel = norm.LayerNormBwdKernel.__new__(norm.LayerNormBwdKernel)
    kernel._config, kernel.spec, kernel._vec_width = cfg, key.spec, 8
    for rows, want in ((1, 1), (7, 7), (2048, 30)):
        plan = kernel._plan(_Device(132, (1, 8), 30), rows, 65536)
        assert plan.parts == want and plan.part_elements == 2 * want * 65536
    assert kernel._plan(_Device(132, (1, 8), 0), 2048, 65536).parts == 33
    kernel._config = BackwardConfig(8, staging=Staging(3, ctas_per_sm=2))
    dev = _Device(sm_count=132, occupancy=(4, 8))
    assert kernel._plan(dev, 16384, 4096).parts == 132 * 2
    kernel._config = BackwardConfig(8, staging=Staging(3))
    assert kernel._plan(dev, 16384, 4096).parts == 132 * min(4, norm_config.BWD_CTAS_PER_SM)


def test_capped_grid_leaves_the_code_but_the_trigger(monkeypatch):
    """``ctas_per_sm`` is a grid choice: the rendered source differs only in its symbol and in
    leaving out the dependent launch's trigger (a grid below the occupancy would let the next
    grid's CTAs in early)."""
    key = make_key("layernorm_bwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    capped = BackwardConfig(8, staging=Staging(3, ctas_per_sm=2))
    plain = capped._replace(staging=Staging(3))
    monkeypatch.setattr(norm, "norm_config", lambda k: plain)
    source = render(key).source
    monkeypatch.setattr(norm, "norm_config", lambda k: capped)
    got = render(key).source
    assert "bool trigger = true;" in source and "bool trigger = false;" in got
    assert got == source.replace(plain.label, capped.label).replace(
        repr(plain), repr(capped)
    ).replace("bool trigger = true;", "bool trigger = false;")


def test_kernel_repr_names_the_configuration():
    k = ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=14336, arch="sm_90")
    assert f"[{k.config.label}]" in repr(k) and k.config.label == "w7_r1_c2_stages3_words"


# Programmatic dependent launch: every norm kernel waits for its grid dependency first.
_GLOBAL_ACCESS = re.compile(r"\b(?:ld|st|atom|red)\.(?!param|shared|local|const)|\bcp\.async\.")
DEPENDENT_CASES = [  # (op, fields, staged: its main kernel is the persistent staged one)
    # staged, weights held in registers: no trigger
    ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "hidden_size": 4096}, True),
    # staged, weights in shared memory: the trigger
    ("layernorm_fwd", {"in_dtype": "bf16", "out_dtype": "fp8", "hidden_size": 8192}, True),
    ("rmsnorm_fwd", {"in_dtype": "bf16", "hidden_size": 4096}, False),
    ("layernorm_fwd", {"in_dtype": "fp16", "out_dtype": "fp8", "scaling": "mxfp8"}, False),
    ("layernorm_bwd", {"in_dtype": "bf16", "hidden_size": 4096}, True),
    ("rmsnorm_bwd_add", {"in_dtype": "bf16", "hidden_size": 1000}, False),
    ("layernorm_bwd", {"in_dtype": "bf16"}, False),
    ("rmsnorm_fwd", {"in_dtype": "bf16", "hidden_size": 65536}, True),  # capped: no trigger
    # several row groups per CTA, weights held: no trigger
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
    launch (``launch_dependents``) once all their CTAs have started, but not under
    ``ctas_per_sm``, nor where a CTA holds its weights in registers or takes several row groups,
    nor in the general kernels. Below
    sm_90 there is neither, and the kernel is launched ordinarily (``Kernel._dependent``)."""
    from nvrtc_engine.core.nvrtc import CompileOptions, compile_source

    key = make_key(op, arch=arch, **fields)
    kernel = ne.get_kernel(key)
    assert kernel._dependent == (arch == "sm_90")
    cfg = norm.norm_config(key)
    assert (cfg.staging is not None) == (staged and arch == "sm_90")
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
        fwd = isinstance(cfg, ForwardConfig)
        one_group = fwd and cfg.row_groups == 1
        held = fwd and cfg.weights == "held"
        capped = cfg.staging is not None and cfg.staging.ctas_per_sm > 0
        expected = cfg.warps > 0 and (cfg.staging is not None or one_group) and not held
        expected = expected and not capped
        assert trigger == (expected and n == 0), n


def test_one_config_patch_reaches_source_symbols_and_kernel(monkeypatch):
    """One patch of ``norm.norm_config`` (how a script would try a configuration) reaches the
    rendered source, the symbols and the kernel's host side (``Kernel.config``: its grids)
    alike, though the kernels live in norm_kernels.py (NormSpec.config is the one lookup)."""
    from nvrtc_engine.core.engine import Engine

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    default = norm.norm_config(key)
    candidate = ForwardConfig(8)
    assert candidate != default
    with monkeypatch.context() as mp:
        mp.setattr(norm, "norm_config", lambda k: candidate)
        kernel = Engine().get(key)
        assert key.spec.config(key) == candidate
        assert f"// {candidate!r}" in render(key).source
    assert kernel.config == candidate
    assert kernel.artifact.symbols == (f"{key}_{candidate.label}",)
    assert key.spec.config(key) == default


def _bench_module(name):
    """The script bench/tuning/NAME.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "bench" / "tuning" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_source_ab_variants_change_the_configuration_or_the_trigger(monkeypatch, capsys):
    """bench/tuning/source_ab.py: ``FIELD=VALUE`` and ``staging.FIELD=VALUE`` replace one
    field of the key's configuration, ``rules`` takes the rules' in place of a TUNED entry,
    ``trigger``/``notrigger`` flip the kernel's cfg::trigger; a built variant compiles under
    its configuration's label; anything that does not apply is a usage error before a GPU is
    needed."""
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")  # restored after the test
    ab = _bench_module("source_ab")
    fp8 = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=8192,
                   arch="sm_90")  # fmt: skip
    tuned = norm.norm_config(fp8)
    assert tuned.stats == "per_warp" and ab.configured(fp8, []) == tuned
    assert ab.configured(fp8, ["stats=two_pass"]) == tuned._replace(stats="two_pass")
    aligned = ab.configured(fp8, ["staging.align=128", "words=false"])
    assert aligned.staging.align == 128 and not aligned.words
    rules = ab.configured(fp8, ["rules"])
    assert rules == norm_config._register_layout(fp8) and rules != tuned
    for parts, match in ((["warps=x"], "warps"), (["staging=none"], "needs staging"),
                         (["rules", "staging.align=16"], "not a staged kernel"),
                         (["nosuch=1"], "nosuch")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            ab.configured(fp8, parts)
    assert ab.parse_variant("base") == [] and ab.parse_variant("rules+notrigger") == [
        "rules", "notrigger"]  # fmt: skip
    for bad, match in (("base+trigger", "give it alone"), ("bogus", "unknown change")):
        with pytest.raises(ValueError, match=match):
            ab.parse_variant(bad)
    plain = make_key("layernorm_fwd", in_dtype="bf16", hidden_size=4096, arch="sm_90")
    r = render(plain)  # a register forward of one row group per CTA: it triggers
    assert "bool trigger = true;" in r.source
    assert "bool trigger = false;" in ab.edited(r, ["notrigger"]).source
    with pytest.raises(ValueError, match="has no"):
        ab.edited(r, ["trigger"])
    ab.check_variants([("layernorm", 8192)], ["fp8"], [[], ["stats=two_pass"], ["notrigger"]])
    with pytest.raises(ValueError, match="layernorm:4096 --out bf16"):
        ab.check_variants([("layernorm", 4096)], ["bf16"], [["staging.align=128"]])
    kernel = ab.build(fp8, ["stats=two_pass"])
    assert kernel.config.stats == "two_pass"
    assert kernel.artifact.symbols == (f"{fp8}_{kernel.config.label}",)
    assert norm.norm_config(fp8) == tuned  # (the patch ends with the build)
    for argv, message in ((["--variants", "base,stream"], "unknown change"),
                          (["--rounds", "0"], "at least 1"), (["--name", "../x"], "not a path"),
                          (["--cases", "rmsnorm:4096", "--variants", "staging.align=128"],
                           "not a staged kernel")):  # fmt: skip
        monkeypatch.setattr("sys.argv", ["source_ab.py", *argv])
        with pytest.raises(SystemExit) as exc:
            ab.main()
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_sass_script_builds_variant_kernels(monkeypatch):
    """bench/tuning/sass.py's ``variant=`` (the diff itself needs cuobjdump, not here): the
    variant and the kernel as chosen share symbols and configuration and differ in the image;
    ``instructions`` keeps only the instruction text of a disassembly."""
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    sass = _bench_module("sass")
    fields = dict(in_dtype="bf16", hidden_size=4096, arch="sm_90")
    plain = sass.built("layernorm_fwd", fields, "base")
    flipped = sass.built("layernorm_fwd", fields, "notrigger")
    assert plain.config == flipped.config and plain.artifact.symbols == flipped.artifact.symbols
    assert plain.artifact.image != flipped.artifact.image
    with pytest.raises(SystemExit, match="unknown change"):
        sass.built("layernorm_fwd", fields, "nosuch")
    text = (  # fmt: skip
        "        Function : k\n"
        "        /*0000*/     LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
        "                                              /* 0x000fe40000000800 */\n"
        "        /*0010*/     UIADD3 UR5, UR5, 0x20, URZ ; /* 0x0000002005057890 */\n"
    )
    assert sass.instructions(text) == ["LDC R1, c[0x0][0x28] ;", "UIADD3 UR5, UR5, 0x20, URZ ;"]


def test_no_module_level_switch_changes_generated_code():
    """The configuration comes from the key alone: no norm module keeps a mutable setting
    (the tuning switches and their module are gone; TUNED is read-only); render_context passes
    the configuration object and the key's dtypes and flags, no loose layout values."""
    import importlib

    for gone in ("norm_switches", "norm_layout"):
        with pytest.raises(ImportError):
            importlib.import_module(f"nvrtc_engine.core.registry.{gone}")
    for name, value in vars(norm_config).items():  # (DTYPES: the dtype table, imported)
        if name[0] != "_" and name != "DTYPES" and isinstance(value, (dict, list, set)):
            raise AssertionError(f"norm_config.{name} is a mutable {type(value).__name__}")
    key = make_key("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096,
                   arch="sm_90")  # fmt: skip
    ctx = key.spec.render_context(key)
    assert ctx["cfg"] == norm.norm_config(key)
    assert len(ctx) - len(super(type(key.spec), key.spec).render_context(key)) <= 13
    for name in norm.__all__:
        assert hasattr(norm, name), name
    assert norm_config.norm_spec(key) is key.spec
    with pytest.raises(TypeError, match="gelu is not a norm op"):
        norm_config.norm_spec(make_key("gelu", in_dtype="bf16", arch="sm_90"))


def test_where_specialized_keys_fall_back_to_the_general_kernel():
    """docs/norms.md's table of the hidden sizes whose specialized key compiles the general
    algorithm (label ``general``): the forwards at 65536 without clusters, the backwards from 14336
    (16384 for fp32 x in RMSNorm's, and on sm_90 with 16-bit x, whose TUNED staged kernels
    cover 14336 and 65536)."""
    sizes = (4096, 8192, 14336, 16384, 32768, 65536)

    def falls_back(op, arch, dt):
        keys = [make_key(op, in_dtype=dt, hidden_size=h, arch=arch) for h in sizes]
        return [k.hidden_size for k in keys if not norm.norm_config(k).warps]

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
