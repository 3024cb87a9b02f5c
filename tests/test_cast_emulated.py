"""The cast family's kernels executed on the CPU, end to end, without a GPU.

Each rendered kernel source is compiled for the host with g++ against ``tests/host_cuda``
(one std::thread per CUDA thread, barriers for __syncthreads and warp shuffles, host
stand-ins for the PTX conversions and the special-function unit) and launched through the
real kernel classes: their argument checks, grids and packed parameters go to the emulated
kernel instead of the driver, with fake arrays pointing at numpy buffers. Results are
compared with the float64 references as the GPU tests do. Small shapes only (a thread per
CUDA thread is slow); skipped without a host C++20 compiler.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cast_edges import edge_input, nvfp4_non_finite_input, nvfp4_reference_with_nan
from fakes import FakeCupyArray

import nvrtc_engine as ne
from nvrtc_engine import reference
from nvrtc_engine.core.render import render, templates_dir
from nvrtc_engine.core.signature import Signature
from nvrtc_engine.families.activation import kernels as activation
from nvrtc_engine.families.cast import common as cast_common
from nvrtc_engine.families.cast import quantize
from nvrtc_engine.families.cast import spec as cast
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

HOST = Path(__file__).resolve().parent / "host_cuda"
CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++)")

TYPESTR = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2", "fp8_e4m3": "|u1", "fp8_e5m2": "|u1"}
STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}

# Launch wrappers appended to a rendered source: wrapper i runs function i of the kernel's
# symbols with cuLaunchKernel's argument array (params[j] points at argument j).
_ARG = "(*({t}*)p[{j}])"


def _call(name: str, sig: Signature) -> str:
    """A call of kernel ``name`` with each parameter of ``sig`` read from ``p``."""
    args = (_ARG.format(t=param.c_type(), j=j) for j, param in enumerate(sig.params))
    return f"{name}(" + ", ".join(args) + ")"


def _wrappers(kernel: ne.Kernel) -> str:
    spec = kernel.key.spec
    symbols = kernel.artifact.symbols
    if kernel.key.op == "quantize" and symbols[-1].endswith("_tile"):
        # the MXFP8 fast path: the activation tile kernel (namespace nve_mx_tile; its
        # In::storage and Out::storage are the quantize section's IS and OS)
        calls = [_call(symbols[0], quantize.QUANTIZE),
                 _call(f"nve_mx_tile::{symbols[1]}", activation.TILE)]  # fmt: skip
    elif kernel.key.op == "quantize":
        calls = [_call(symbols[0], quantize.QUANTIZE)]
        if len(symbols) > 1:
            calls += [_call(symbols[1], quantize.AMAX), _call(symbols[2], quantize.AMAX_FINAL)]
    elif getattr(spec, "multi", False):
        calls = [f"{symbols[0]}(*(const Table*)p[0])"]
    else:
        calls = [_call(symbols[0], cast.TILE)]
        if len(symbols) > 1:
            calls.append(_call(symbols[1], cast.DBIAS))
    return "".join(
        f'\nextern "C" void nve_launch_{i}(unsigned grid, unsigned block, void** p) '
        f"{{ nve_run_grid(grid, block, [&] {{ {call}; }}); }}\n"
        for i, call in enumerate(calls)
    )


_LIBS: dict[str, ctypes.CDLL] = {}


def host_library(kernel: ne.Kernel, tmp: Path) -> ctypes.CDLL:
    source = render(kernel.key).source + _wrappers(kernel)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest not in _LIBS:
        src, lib = tmp / f"{digest}.cpp", tmp / f"{digest}.so"
        src.write_text(source)
        subprocess.run(
            [CXX, "-std=c++20", "-O1", "-w", "-pthread", "-fPIC", "-shared", "-include",
             str(HOST / "host_cuda.h"), "-I", str(HOST), "-I", str(templates_dir() / "include"),
             str(src), "-o", str(lib)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        _LIBS[digest] = ctypes.CDLL(str(lib))
    return _LIBS[digest]


@pytest.fixture
def emulate(monkeypatch, tmp_path_factory):
    """``emulate(kernel)``: route the kernel's launches to its host build."""
    from nvrtc_engine.core import kernel as kernel_module

    tmp = tmp_path_factory.getbasetemp() / "host_kernels"
    tmp.mkdir(exist_ok=True)
    device = type("D", (), {"sm_count": 4})()
    libs: dict[int, ctypes.CDLL] = {}
    launched: list[int] = []  # function indices, in launch order

    def loaded(self, ordinal):  # a kernel's "functions": its host build and each index
        functions = tuple((libs[id(self)], index) for index in range(3))
        return type("L", (), {"device": device, "functions": functions})()

    def launch(function, grid, block, shmem, dependent, stream, params):
        lib, index = function
        launched.append(index)
        fn = getattr(lib, f"nve_launch_{index}")
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        fn(grid, block, params)

    monkeypatch.setattr(cast_common.CastKernelBase, "loaded", loaded)
    monkeypatch.setattr(kernel_module.driver, "make_current", lambda dev: None)
    monkeypatch.setattr(kernel_module, "launch", launch)

    def prepare(kernel):
        libs[id(kernel)] = host_library(kernel, tmp)
        return kernel

    prepare.launched = launched
    return prepare


def arr(a: np.ndarray, dtype_name: str | None = None) -> FakeCupyArray:
    """A fake device array over a numpy buffer (bf16 as uint16, FP8 and bytes as uint8).
    It only holds the address: keep ``a`` alive while the kernel runs."""
    typestr = TYPESTR[dtype_name] if dtype_name else a.__array_interface__["typestr"]
    return FakeCupyArray(a.shape, typestr, ptr=a.ctypes.data)


def host_input(shape, dtype_name, rng):
    x = reference.sample_input(shape, dtype_name, rng)
    return x, np.ascontiguousarray(x).view(STORAGE[dtype_name])


def poison(shape, itemsize):
    return np.full(shape, 0xFF, dtype={1: np.uint8, 2: np.uint16, 4: np.uint32}[itemsize])


def f32(value):
    return np.array([value], np.float32)


def as_dtype(buf: np.ndarray, dtype_name: str) -> np.ndarray:
    return buf.view(ne.DTYPES[dtype_name].numpy())


SHAPES = [(31, 33), (96, 320), (64, 256)]
# the emulator's sweeps: the rest of each product runs in the matrix tier (pytest -m matrix)
MATRIX = pytest.mark.matrix


def sweep(*values):
    """Parameters for ``parametrize``: the first runs in the default tier, the others in the
    matrix tier."""
    return [values[0], *(pytest.param(*v if isinstance(v, tuple) else (v,), marks=MATRIX)
                         for v in values[1:])]  # fmt: skip


@pytest.mark.parametrize("dtype", sweep("fp8_e4m3", "bf16", "fp32"))
def test_transpose(emulate, dtype):
    kernel = emulate(ne.get_kernel("transpose", in_dtype=dtype, out_dtype=dtype, arch="sm_90"))
    d = ne.DTYPES[dtype]
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x = rng.integers(0, 2 ** (8 * d.itemsize), size=shape, dtype=np.uint64)
        x = x.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[d.itemsize])
        out = poison(shape[::-1], d.itemsize)
        kernel(arr(x, dtype), arr(out, dtype))
        assert (out == x.T).all(), shape


@pytest.mark.parametrize(
    ("op", "in_dtype", "out_dtype"),
    [
        ("cast_transpose", "bf16", "fp8_e4m3"),
        ("cast_transpose_dbias", "fp16", "fp32"),
        ("cast_transpose_dbias_dgelu", "bf16", "fp8_e5m2"),
        ("dswiglu_cast_transpose", "bf16", "fp8_e4m3"),
        pytest.param("cast_transpose", "fp32", "bf16", marks=MATRIX),
        pytest.param("cast_transpose_dbias", "bf16", "fp8_e4m3", marks=MATRIX),
        pytest.param("cast_transpose_dbias_dsilu", "fp32", "bf16", marks=MATRIX),
        pytest.param("dgeglu_cast_transpose", "fp32", "fp16", marks=MATRIX),
    ],
)
def test_cast_transpose_family(emulate, op, in_dtype, out_dtype):
    kernel = emulate(ne.get_kernel(op, in_dtype=in_dtype, out_dtype=out_dtype, arch="sm_90"))
    rng = np.random.default_rng(2)
    for m, k in SHAPES:
        _check_tile_host(kernel, rng, m, k)


def _check_tile_host(kernel, rng, m, k, inputs=None):
    """One emulated launch of a tile kernel on fresh inputs (or ``inputs``: the ``(g, a,
    scale)`` of an earlier call, the same values again) against the reference. Returns the
    inputs and the bytes of q, qt, amax and dbias."""
    op, in_dtype, out_dtype = kernel.key.op, kernel.key.in_dtype, kernel.key.out_dtype
    gated, dact = op.endswith("glu_cast_transpose"), op.startswith("cast_transpose_dbias_d")
    osz = ne.DTYPES[out_dtype].itemsize
    fp8 = ne.DTYPES[out_dtype].is_fp8
    width = 2 * k if gated else k
    if inputs is None:
        g, _ = host_input((m, k), in_dtype, rng)
        a = host_input((m, width), in_dtype, rng)[0] if gated or dact else None
        inputs = (g, a, float(np.float32(rng.uniform(1, 16))) if fp8 else None)
    g, a, scale = inputs
    host = [np.ascontiguousarray(t).view(STORAGE[in_dtype]) for t in (g, a) if t is not None]
    args = [arr(t, in_dtype) for t in host]  # (host keeps the buffers alive)
    out, out_t = poison((m, width), osz), poison((width, m), osz)
    kw = {"out": arr(out, out_dtype), "out_t": arr(out_t, out_dtype)}
    bufs = {}
    if fp8:
        bufs = {"scale": f32(scale), "amax": f32(0.0), "scale_inv": f32(np.nan)}
        kw.update({name: arr(b) for name, b in bufs.items()})
    dbias = np.zeros(0, np.uint8)
    if "dbias" in op:
        dbias = poison((k,), ne.DTYPES[in_dtype].itemsize)
        ws = np.full((kernel.workspace_rows(m), k), np.nan, np.float32)
        kw.update(dbias=arr(dbias, in_dtype), workspace=arr(ws))
    kernel(*args, **kw)
    ref = reference.cast_transpose(op, g, out_dtype, scale, a)
    factor = np.float64(np.float32(scale)) if fp8 else 1.0
    reference.check_close(as_dtype(out, out_dtype), ref.values * factor, out_dtype,
                          ref.tolerance * factor, name=f"out {m}x{k}")  # fmt: skip
    assert (out_t == out.T).all(), (m, k)
    if fp8:
        exact = op in ("cast_transpose", "cast_transpose_dbias")
        slack = 0.0 if exact else float(ref.tolerance.max())
        assert abs(float(bufs["amax"][0]) - ref.amax) <= slack, (m, k)
        assert bufs["scale_inv"][0] == ref.scale_inv
    if "dbias" in op:
        tol = reference.dbias_tolerance(ref.values, ref.tolerance, kernel.dbias_depth(m))
        reference.check_close(as_dtype(dbias, in_dtype), ref.dbias, in_dtype, tol,
                              name=f"dbias {m}x{k}")  # fmt: skip
    amax = bufs["amax"].tobytes() if fp8 else b""
    return inputs, (out.tobytes(), out_t.tobytes(), amax, dbias.tobytes())


def test_multi_cast_transpose_two_launches(emulate):
    kernel = emulate(ne.get_kernel("multi_cast_transpose", dtype="fp8", arch="sm_90"))
    rng = np.random.default_rng(3)
    shapes = [(1, 1), (31, 33), (64, 128), (5, 130), (0, 8), (70, 16)]
    picks = [shapes[i] for i in rng.integers(0, len(shapes), size=65)]
    hosts, xs, outs, fakes, sc = [], [], [], [], []
    for s in picks:
        x, buf = host_input(s, "bf16", rng)
        q, qt = poison(s, 1), poison(s[::-1], 1)
        hosts.append(x)
        xs.append(arr(buf, "bf16"))
        outs.append((q, qt))
        fakes.append((arr(q, "fp8_e4m3"), arr(qt, "fp8_e4m3")))
        sc.append({"scale": f32(np.float32(rng.uniform(1, 16))), "amax": f32(0.0)})
    kernel(xs, outs=fakes, scales=[arr(d["scale"]) for d in sc],
           amaxes=[arr(d["amax"]) for d in sc])  # fmt: skip
    for x, (q, qt), d in zip(hosts, outs, sc, strict=True):
        scale = float(d["scale"][0])
        ref = reference.cast_transpose("multi_cast_transpose", x, "fp8_e4m3", scale)
        reference.check_close(as_dtype(q, "fp8_e4m3"), ref.values * np.float64(scale),
                              "fp8_e4m3", ref.tolerance * scale)  # fmt: skip
        assert (qt == q.T).all()
        if x.size:
            assert float(d["amax"][0]) == ref.amax


@pytest.mark.parametrize(
    ("in_dtype", "out_dtype", "layout"),
    sweep(("bf16", "fp8_e4m3", "both"), ("fp32", "fp8_e5m2", "columnwise"),
          ("fp16", "fp8_e4m3", "rowwise")),
)  # fmt: skip
def test_mxfp8(emulate, in_dtype, out_dtype, layout):
    kernel = emulate(ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype=out_dtype,
                                   layout=layout, arch="sm_90"))  # fmt: skip
    rng = np.random.default_rng(4)
    for m, k in [(31, 33), (64, 256), (96, 320)]:
        x, buf = host_input((m, k), in_dtype, rng)
        _check_mxfp8_host(kernel, x, buf, in_dtype, out_dtype, layout)


def _check_mxfp8_host(kernel, x, buf, in_dtype, out_dtype, layout):
    m, k = x.shape
    kw, outs = {}, {}
    for direction in ("rowwise", "columnwise"):
        if layout in (direction, "both"):
            outs[direction] = (poison((m, k), 1), poison(mxfp8_scale_shape(m, k, direction), 1))
            kw[f"{direction}_data"] = arr(outs[direction][0], out_dtype)
            kw[f"{direction}_scale_inv"] = arr(outs[direction][1])
    kernel(arr(buf, in_dtype), **kw)
    for direction, (data, scales) in outs.items():
        want, want_scales, _ = reference.mxfp8_quantize(x.astype(np.float64), out_dtype, direction)
        r, c = mxfp8_scale_shape(m, k, direction, padded=False)
        assert (scales[:r, :c] == want_scales).all(), (direction, m, k)
        padding = scales.copy()
        padding[:r, :c] = 0
        assert not padding.any(), (direction, m, k)
        assert (data == want.view(np.uint8)).all(), (direction, m, k)
    return [a for pair in outs.values() for a in pair]


# The MXFP8 fast path (quantize.MX_FAST_PATH): the activation family's tiled kernel with the
# identity activation, for M, K multiples of 128 and aligned data; the quantize kernel else.
FAST_SHAPES = [(128, 128), (256, 384), (128, 4096)]


@pytest.mark.parametrize(
    ("in_dtype", "out_dtype", "layout"),
    sweep(*((i, o, lay) for (i, o), lay in itertools.product(
        [("bf16", "fp8_e4m3"), ("fp32", "fp8_e5m2"), ("fp16", "fp8_e4m3")],
        ["both", "columnwise"]))),
)  # fmt: skip
def test_mxfp8_fast_path(emulate, monkeypatch, in_dtype, out_dtype, layout):
    """The fast path gives the reference's bytes (edge values: zeros, subnormals, maxima,
    inf and NaN for bf16) and the quantize kernel's; shapes it cannot take fall back."""
    kernel = emulate(ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype=out_dtype,
                                   layout=layout, arch="sm_90"))  # fmt: skip
    assert kernel.artifact.symbols[1].endswith("_tile")
    rng = np.random.default_rng(7)
    for m, k in FAST_SHAPES:
        if in_dtype == "bf16":
            x = edge_input((m, k), rng)
            buf = np.ascontiguousarray(x).view(np.uint16)
        else:
            x, buf = host_input((m, k), in_dtype, rng)
        got = {}
        for fast in (True, False):
            monkeypatch.setattr(quantize, "MX_FAST_PATH", fast)
            del emulate.launched[:]
            got[fast] = _check_mxfp8_host(kernel, x, buf, in_dtype, out_dtype, layout)
            assert emulate.launched == [1 if fast else 0], (fast, m, k)
        for a, b in zip(got[True], got[False], strict=True):
            assert (a == b).all(), (m, k)
    monkeypatch.setattr(quantize, "MX_FAST_PATH", True)
    for m, k in [(31, 33), (96, 320), (160, 128), (128, 96)]:  # fallback: padded scales
        del emulate.launched[:]
        x, buf = host_input((m, k), in_dtype, rng)
        _check_mxfp8_host(kernel, x, buf, in_dtype, out_dtype, layout)
        assert emulate.launched == [0], (m, k)


@pytest.mark.parametrize("layout", sweep("both", "columnwise"))
def test_mxfp8_fast_path_nan_inf(emulate, monkeypatch, layout):
    """NaN and inf inputs: the fast path's bytes are the quantize kernel's (both drop NaN
    from block maxima with fmaxf; an inf maximum gives scale 0xfe; the data keeps NaN)."""
    kernel = emulate(ne.get_kernel("quantize", dtype="fp8", layout=layout, arch="sm_90"))
    rng = np.random.default_rng(9)
    m, k = 128, 256
    _, buf = host_input((m, k), "bf16", rng)
    buf[3, 5], buf[40, 7], buf[70, 200], buf[100, 100:132] = 0x7FC0, 0x7F80, 0xFF80, 0x7FC0
    got = {}
    for fast in (True, False):
        monkeypatch.setattr(quantize, "MX_FAST_PATH", fast)
        del emulate.launched[:]
        kw, outs = {}, []
        for direction in ("rowwise", "columnwise"):
            if layout in (direction, "both"):
                outs += [poison((m, k), 1), poison(mxfp8_scale_shape(m, k, direction), 1)]
                kw[f"{direction}_data"], kw[f"{direction}_scale_inv"] = arr(outs[-2]), arr(outs[-1])
        kernel(arr(buf, "bf16"), **kw)
        assert emulate.launched == [1 if fast else 0]
        got[fast] = outs
    for a, b in zip(got[True], got[False], strict=True):
        assert (a == b).all()


def test_mxfp8_fast_path_unaligned_falls_back(emulate):
    """A data pointer off 16 bytes takes the quantize kernel (same bytes)."""
    kernel = emulate(ne.get_kernel("quantize", dtype="fp8", layout="both", arch="sm_90"))
    rng = np.random.default_rng(8)
    m, k = 128, 128
    x, buf = host_input((m, k), "bf16", rng)
    del emulate.launched[:]
    kw, outs = {}, {}
    for direction in ("rowwise", "columnwise"):
        data = poison((m * k + 1,), 1)  # data at byte 1: unaligned
        scales = poison(mxfp8_scale_shape(m, k, direction), 1)
        outs[direction] = (data, scales)
        view = FakeCupyArray((m, k), "|u1", ptr=data.ctypes.data + 1)
        kw[f"{direction}_data"], kw[f"{direction}_scale_inv"] = view, arr(scales)
    kernel(arr(buf, "bf16"), **kw)
    assert emulate.launched == [0]
    for direction, (data, scales) in outs.items():
        want, want_scales, _ = reference.mxfp8_quantize(x.astype(np.float64), "fp8_e4m3",
                                                        direction)  # fmt: skip
        assert (scales == want_scales).all()
        assert (data[1:].reshape(m, k) == want.view(np.uint8)).all()


@pytest.mark.parametrize("layout", sweep("both", "rowwise", "columnwise"))
def test_mxfp8_edge_values(emulate, layout):
    """The quantize kernel gives the reference's bytes on edge values (zeros, subnormals,
    maxima, inf and NaN) and partial tiles (shapes the fast path does not take)."""
    kernel = emulate(ne.get_kernel("quantize", dtype="fp8", layout=layout, arch="sm_90"))
    rng = np.random.default_rng(6)
    for m, k in [(31, 33), (96, 320), (64, 512), (40, 128)]:
        x = edge_input((m, k), rng)
        buf = np.ascontiguousarray(x).view(np.uint16)
        _check_mxfp8_host(kernel, x, buf, "bf16", "fp8_e4m3", layout)


def _check_nvfp4_at_2688(kernel, x, layout, want):
    """Quantize bf16 ``x`` with amax 2688 (S_enc 1) and compare data and scales with the
    reference result ``want``."""
    m, k = x.shape
    buf = np.ascontiguousarray(x).view(np.uint16)
    shape = (m, -(-k // 2)) if layout == "rowwise" else (k, -(-m // 2))
    data, scales = poison(shape, 1), poison(nvfp4_scale_shape(m, k, layout), 1)
    kernel(arr(buf, "bf16"), **{f"{layout}_data": arr(data),
                                f"{layout}_scale_inv": arr(scales)},
           amax=arr(f32(2688.0)), compute_amax=False)  # fmt: skip
    r, c = nvfp4_scale_shape(m, k, layout, padded=False)
    assert (scales[:r, :c] == want.scales).all(), (m, k)
    assert (data == want.data).all(), (m, k)


@pytest.mark.parametrize("layout", ["rowwise", "columnwise"])
def test_nvfp4_edge_values(emulate, layout):
    """E2M1 midpoints, values above 6 * block scale (block scales rounded down), -0, tiny
    values, both signs; amax 2688 makes S_enc 1, so blocks whose amax is 6 have multiplier 1
    and their midpoints stay exact."""
    kernel = emulate(ne.get_kernel("quantize", dtype="fp4_e2m1", layout=layout, arch="sm_90"))
    rng = np.random.default_rng(7)
    for m, k in [(64, 128), (48, 80), (33, 31)]:
        x = edge_input((m, k), rng, sixes=True)
        want = reference.nvfp4_quantize(x.astype(np.float64), 2688.0, layout)
        _check_nvfp4_at_2688(kernel, x, layout, want)


@pytest.mark.parametrize("layout", ["rowwise", "columnwise"])
def test_nvfp4_non_finite(emulate, layout):
    """Quiet NaN of either sign gives 0x7 (sign dropped), +-inf saturate to +-6, beside the
    edge values of test_nvfp4_edge_values (tests/cast_edges.py)."""
    kernel = emulate(ne.get_kernel("quantize", dtype="fp4_e2m1", layout=layout, arch="sm_90"))
    rng = np.random.default_rng(11)
    for m, k in [(64, 128), (33, 31)]:
        x = nvfp4_non_finite_input((m, k), rng, signaling=False)
        _check_nvfp4_at_2688(kernel, x, layout, nvfp4_reference_with_nan(x, 2688.0, layout))


@pytest.mark.parametrize(
    ("in_dtype", "layout", "compute_amax"),
    sweep(("bf16", "both", True), ("fp32", "columnwise", True), ("fp16", "rowwise", False)),
)
def test_nvfp4(emulate, in_dtype, layout, compute_amax):
    kernel = emulate(ne.get_kernel("quantize", in_dtype=in_dtype, out_dtype="fp4_e2m1",
                                   layout=layout, arch="sm_90"))  # fmt: skip
    rng = np.random.default_rng(5)
    for m, k in [(31, 33), (64, 256), (96, 320)]:
        x, buf = host_input((m, k), in_dtype, rng)
        true_amax = float(np.abs(x.astype(np.float64)).max())
        amax = f32(np.nan if compute_amax else 2 * true_amax)
        use = true_amax if compute_amax else float(amax[0])
        scale_inv = f32(np.nan)
        kw = {"amax": arr(amax), "scale_inv": arr(scale_inv), "compute_amax": compute_amax}
        workspace = np.full(1024, np.nan, np.float32)  # kept alive: the fake only points at it
        if compute_amax:
            kw["workspace"] = arr(workspace)
        outs = {}
        for direction in ("rowwise", "columnwise"):
            if layout in (direction, "both"):
                shape = (m, -(-k // 2)) if direction == "rowwise" else (k, -(-m // 2))
                outs[direction] = (poison(shape, 1), poison(nvfp4_scale_shape(m, k, direction), 1))
                kw[f"{direction}_data"] = arr(outs[direction][0])
                kw[f"{direction}_scale_inv"] = arr(outs[direction][1])
        kernel(arr(buf, in_dtype), **kw)
        assert float(amax[0]) == use
        assert scale_inv[0] == reference.nvfp4_encode_scale(use)[1]
        for direction, (data, scales) in outs.items():
            want = reference.nvfp4_quantize(x.astype(np.float64), use, direction)
            r, c = nvfp4_scale_shape(m, k, direction, padded=False)
            assert (scales[:r, :c] == want.scales).all(), (direction, m, k)
            padding = scales.copy()
            padding[:r, :c] = 0
            assert not padding.any(), (direction, m, k)
            assert (data == want.data).all(), (direction, m, k)
