"""The default tier's compile coverage: every family x scaling mode compiles for each arch
class (sm_80 or sm_89: Ampere/Ada, software FP8 conversion on sm_80; sm_90: Hopper;
sm_100a: Blackwell's arch-specific target, hardware FP4). Each cell names three variants,
one per arch class, that between them take the cell's kernel structures (plain, gated,
backward and fused ops; general and specialized hidden sizes; rowwise, columnwise and
both layouts). The exhaustive product (every variant for every arch) is the ``matrix``
tier: ``pytest -m matrix`` (test_activation.py, test_cast.py, test_norm.py, test_nvrtc.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import nvrtc_engine as ne
from nvrtc_engine import KernelKey, make_key
from nvrtc_engine.core import config
from nvrtc_engine.core.registry import get_spec, registered_ops

# arch class -> its archs (sm_80 and sm_89 take turns over the cells)
ARCH_CLASSES = {"ampere/ada": ("sm_80", "sm_89"), "hopper": ("sm_90",), "blackwell": ("sm_100a",)}

# (family, scaling) -> make_key fields of its variant for each arch class, in ARCH_CLASSES'
# order
CELLS: dict[tuple[str, str], list[dict]] = {
    ("activation", "none"): [
        dict(op="gelu", dtype="bf16"),
        dict(op="swiglu", in_dtype="fp16", out_dtype="fp16", hidden_size=4096),
        dict(op="dclamped_swiglu", dtype="fp32"),
    ],
    ("activation", "tensor"): [
        dict(op="dgelu", dtype="fp8_e4m3", hidden_size=4099),
        dict(op="dswiglu", in_dtype="fp32", out_dtype="fp8_e5m2"),
        dict(op="cast", dtype="fp8_e5m2"),  # the cast family's element-wise op
    ],
    ("activation", "mxfp8"): [
        dict(op="gelu", dtype="fp8_e4m3", scaling="mxfp8", hidden_size=4096),
        dict(op="swiglu", dtype="fp8_e4m3", scaling="mxfp8", layout="columnwise"),
        dict(op="dgeglu", in_dtype="fp16", out_dtype="fp8_e5m2", scaling="mxfp8", layout="both"),
    ],
    ("cast", "none"): [
        dict(op="cast_transpose_dbias", in_dtype="bf16", out_dtype="fp32"),
        dict(op="transpose", in_dtype="fp8_e4m3", out_dtype="fp8_e4m3"),
        dict(op="multi_cast_transpose", in_dtype="fp32", out_dtype="bf16"),
    ],
    ("cast", "tensor"): [
        dict(op="cast_transpose", dtype="fp8_e4m3"),
        dict(op="cast_transpose_dbias_dgelu", dtype="fp8_e4m3", hidden_size=8192),
        # (not a 16-bit input to FP8 without dbias: that takes gather4, whose sm_100a compile
        # alone takes 20-35 s on 2 cores; the matrix tier compiles it)
        dict(op="dswiglu_cast_transpose", in_dtype="fp32", out_dtype="fp8_e4m3"),
    ],
    ("cast", "mxfp8"): [
        dict(op="quantize", in_dtype="fp32", out_dtype="fp8_e5m2", hidden_size=7168),
        dict(op="quantize", dtype="fp8_e4m3", layout="both"),
        dict(op="quantize", in_dtype="fp16", out_dtype="fp8_e4m3", layout="columnwise"),
    ],
    ("cast", "nvfp4"): [
        dict(op="quantize", in_dtype="fp16", out_dtype="fp4_e2m1", layout="columnwise"),
        dict(op="quantize", dtype="fp4_e2m1"),
        dict(op="quantize", dtype="fp4_e2m1", layout="both"),  # hardware E2M1 conversion
    ],
    ("norm", "none"): [
        dict(op="rmsnorm_fwd", in_dtype="fp16", hidden_size=4096, zero_centered_gamma=True),
        dict(op="layernorm_bwd", in_dtype="bf16", hidden_size=8192),
        dict(op="rmsnorm_bwd_add", in_dtype="fp32"),
    ],
    ("norm", "tensor"): [
        dict(op="layernorm_fwd", in_dtype="fp16", out_dtype="fp8_e5m2", fp32_gamma=True),
        dict(op="rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8_e4m3", hidden_size=8192),
        dict(op="rmsnorm_fwd", in_dtype="fp32", out_dtype="fp8_e4m3", hidden_size=1000),
    ],
    ("norm", "mxfp8"): [
        dict(op="rmsnorm_fwd", in_dtype="fp16", out_dtype="fp8_e5m2", scaling="mxfp8"),
        dict(op="layernorm_fwd", in_dtype="bf16", out_dtype="fp8_e4m3", scaling="mxfp8",
             hidden_size=4096),
        dict(op="layernorm_fwd", in_dtype="bf16", out_dtype="fp8_e4m3", scaling="mxfp8"),
    ],
}  # fmt: skip


def _keys(arch_class: str) -> list[KernelKey]:
    """The arch class's variant of every cell."""
    c = list(ARCH_CLASSES).index(arch_class)
    archs = ARCH_CLASSES[arch_class]
    keys = []
    for i, ((family, scaling), variants) in enumerate(CELLS.items()):
        fields = dict(variants[c])
        key = make_key(fields.pop("op"), arch=archs[i % len(archs)], **fields)
        assert (key.spec.family, key.scaling) == (family, scaling), key
        keys.append(key)
    return keys


def test_the_cells_cover_every_family_and_scaling():
    """Every (family, scaling) an op of the registry has is a cell with a variant for each
    arch class, and the sm_80/sm_89 class compiles both of its archs: a new family or
    scaling needs its cell."""
    have = {(get_spec(op).family, s) for op in registered_ops() for s in get_spec(op).scalings}
    assert have == set(CELLS)
    assert all(len(v) == len(ARCH_CLASSES) for v in CELLS.values())
    assert {k.arch for k in _keys("ampere/ada")} == set(ARCH_CLASSES["ampere/ada"])


@pytest.fixture
def memory_only(monkeypatch):
    """No disk cache: these tests are about compiling, and the store's I/O would dominate."""
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache(disk=False)


@pytest.mark.parametrize("arch_class", list(ARCH_CLASSES))
def test_every_family_and_scaling_compiles_for_each_arch_class(arch_class, memory_only):
    """A cubin for the exact arch, holding every ``extern "C"`` symbol of the key."""
    keys = _keys(arch_class)
    with ThreadPoolExecutor(2) as pool:  # NVRTC releases the GIL: two compiles at a time
        kernels = list(pool.map(ne.get_kernel, keys))
    for key, kernel in zip(keys, kernels, strict=True):
        art = kernel.artifact
        assert art.kind == "cubin" and art.image[:4] == b"\x7fELF", key
        assert art.options[0] == f"-arch={key.arch}", key
        assert art.symbols == key.spec.symbols(key), key
        for symbol in art.symbols:
            assert symbol.encode() in art.image, (key, symbol)
