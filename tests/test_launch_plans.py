"""Launch plans (the fast path of Kernel.__call__ for torch tensors), without a GPU.

A fake ``torch`` (tests/fake_torch.py) stands in for PyTorch and a fake ``cuda.bindings``
driver records every ``cuLaunchKernel``: function, grid, block, stream and the parameter
slots (copied at launch, as the driver does). For every family the planned call must pack
exactly what the generic path packs; a change of anything the checks depend on must
re-validate and raise the generic path's errors, before anything is launched.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import fake_torch
import pytest
from fakes import FakeCaiArray, FakeCupyArray, FakeStream

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, CudaError, driver, interop, launcher
from nvrtc_engine import kernel as kernel_mod
from nvrtc_engine.kernel import Loaded

CONTEXT = 0xC0DE


class Function:
    """A fake CUfunction: its name and how many 8-byte parameter slots to record."""

    def __init__(self, name: str, nparams: int) -> None:
        self.name = name
        self.nparams = nparams


class FakeBindings:
    """The part of cuda.bindings.driver a launch uses; records launches."""

    class CUstream:
        def __init__(self, handle: int) -> None:
            self.handle = int(handle)

    class CUresult(int):
        @property
        def name(self) -> str:
            return f"CUDA_ERROR_{int(self)}"

    def __init__(self) -> None:
        self.local = threading.local()
        self.launches: list[tuple[Any, ...]] = []
        self.context_sets = 0
        self.fail: int = 0

    def current(self) -> int:
        return getattr(self.local, "context", 0)

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return (0, self.current())

    def cuCtxSetCurrent(self, context: int) -> tuple[int]:
        self.context_sets += 1
        self.local.context = context
        return (0,)

    def cuGetErrorString(self, err: int) -> tuple[int, bytes]:
        return (0, b"fake error")

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f: Any, threads: int, shmem: int):
        return (0, 2)

    def cuMemsetD8Async(self, ptr: int, value: int, n: int, stream: int) -> tuple[int]:
        return (0,)

    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6

    class CUlaunchAttribute:
        def __init__(self) -> None:
            self.id = 0
            self.value = types.SimpleNamespace(programmaticStreamSerializationAllowed=0)

    class CUlaunchConfig:
        pass

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra,
                       dependent=False):  # fmt: skip
        assert isinstance(f, Function) and isinstance(stream, self.CUstream)
        assert type(params) is int and (gy, gz, by, bz, shmem, extra) == (1, 1, 1, 1, 0, 0)
        if self.current() != CONTEXT:
            return (self.CUresult(201),)
        if self.fail:
            return (self.CUresult(self.fail),)
        slots = tuple(
            ctypes.c_uint64.from_address(ctypes.c_void_p.from_address(params + 8 * i).value).value
            for i in range(f.nparams)
        )
        name = f"{f.name} (dependent)" if dependent else f.name
        self.launches.append((name, gx, bx, stream.handle, slots, threading.get_ident()))
        return (self.CUresult(0),)

    def cuLaunchKernelEx(self, config, f, params, extra):
        """A programmatic dependent launch (the only kind the engine makes this way): recorded
        as cuLaunchKernel's, the function's name marked."""
        (attr,) = config.attrs
        assert config.numAttrs == 1 and attr.id == 6
        assert attr.value.programmaticStreamSerializationAllowed == 1
        return self.cuLaunchKernel(
            f, config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
            config.blockDimY, config.blockDimZ, config.sharedMemBytes, config.hStream, params,
            extra, dependent=True,
        )  # fmt: skip


@dataclass
class Env:
    torch: Any
    drv: FakeBindings
    monkeypatch: pytest.MonkeyPatch
    allocations: list[Any] = field(default_factory=list)
    misalign: int = 0  # bytes added to every address torch.empty returns

    def tensor(self, shape, dtype="bfloat16", **kwargs) -> fake_torch.Tensor:
        return fake_torch.Tensor(shape, fake_torch.DTYPES[dtype], **kwargs)

    def attach(self, kernel: ne.Kernel, *nparams: int) -> ne.Kernel:
        """Make ``kernel`` 'loaded' on fake devices, recording ``nparams[i]`` parameter slots
        of its function i."""
        loaded: dict[int, Loaded] = {}

        def get(device: int) -> Loaded:
            if device not in loaded:
                dev = driver.Device(device, "fake", 9, 0, 132, device, CONTEXT)
                functions = tuple(Function(f"{kernel.name}#{i}", n) for i, n in enumerate(nparams))
                loaded[device] = Loaded(dev, functions, None)
            return loaded[device]

        self.monkeypatch.setattr(kernel, "loaded", get)
        kernel._launch_plans.clear()
        if hasattr(kernel, "_devices"):
            kernel._devices.clear()
        return kernel


@pytest.fixture
def env(monkeypatch):
    torch = fake_torch.module(current_stream=0x5000)
    env = Env(torch, FakeBindings(), monkeypatch)
    empty = torch.empty

    def recording_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        if env.misalign:
            t = fake_torch.Tensor(t.shape, t.dtype, t.data_ptr() + env.misalign)
        env.allocations.append(t)
        return t

    torch.empty = recording_empty
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(interop, "_TORCH_DTYPES", {})
    monkeypatch.setattr(interop, "_raw_stream", None)
    monkeypatch.setattr(driver, "_drv", lambda: env.drv)
    # these fakes stand in for cuda.bindings; the compiled launcher is tested against the
    # stub libcuda (test_launch_stub.py, test_launcher.py)
    monkeypatch.setattr(launcher, "_resolved", True)
    monkeypatch.setattr(launcher, "_launch", None)
    saved = set(interop.TORCH_TYPES)
    driver._streams.clear()
    driver._configs.clear()
    yield env
    interop.TORCH_TYPES.clear()
    interop.TORCH_TYPES.update(saved)
    driver._streams.clear()
    driver._configs.clear()


def flatten(result: Any) -> list[Any]:
    if isinstance(result, fake_torch.Tensor):
        return [result]
    if is_dataclass(result):
        return flatten([getattr(result, f.name) for f in fields(result)])
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in flatten(r)]
    return []


def nbytes(t: fake_torch.Tensor) -> int:
    return t.numel() * t.element_size()


def run_both(env: Env, kernel: ne.Kernel, call) -> tuple[list, Any, list, Any]:
    """(launches, result) of a planned call and of the same call through the generic path,
    the generic one's allocations renamed to the planned one's (allocated in the same
    order, with the same shapes and dtypes)."""
    call()  # the first torch tensor seen: generic path
    call()  # plans the call
    plans = len(kernel._launch_plans)
    assert plans, "the call was not planned"
    env.drv.launches.clear()
    env.allocations.clear()
    fast_result = call()
    fast, fast_allocs = list(env.drv.launches), list(env.allocations)
    assert len(kernel._launch_plans) == plans
    env.drv.launches.clear()
    env.allocations.clear()
    env.monkeypatch.setattr(kernel, "_fast", lambda *args, **kwargs: (None, None))
    slow_result = call()
    slow, slow_allocs = list(env.drv.launches), list(env.allocations)
    env.monkeypatch.delattr(kernel, "_fast")
    # the same sizes (an FP8 allocation viewed as uint8 is planned as a uint8 allocation)
    assert [(t.shape, nbytes(t)) for t in fast_allocs] == [
        (t.shape, nbytes(t)) for t in slow_allocs
    ]
    moves = [(s.data_ptr(), s.data_ptr() + nbytes(s), f.data_ptr() - s.data_ptr())
             for s, f in zip(slow_allocs, fast_allocs, strict=True)]  # fmt: skip

    def rename(v: int) -> int:  # an address in (or just past) a generic-path allocation
        return next((v + move for lo, hi, move in moves if lo <= v <= hi), v)

    slow = [(n, g, b, st, tuple(rename(v) for v in slots), tid)
            for n, g, b, st, slots, tid in slow]  # fmt: skip
    return fast, fast_result, slow, slow_result


def check_same(env: Env, kernel: ne.Kernel, call) -> Any:
    fast, fast_result, slow, slow_result = run_both(env, kernel, call)
    assert fast and fast == slow
    assert type(fast_result) is type(slow_result)
    fast_t, slow_t = flatten(fast_result), flatten(slow_result)
    assert [(t.shape, t.dtype) for t in fast_t] == [(t.shape, t.dtype) for t in slow_t]
    return fast_result


# -- every family: the planned call packs what the generic path packs ----------------------


def k(op: str, **fields: Any) -> ne.Kernel:
    return ne.get_kernel(op, arch="sm_90", **fields)


def case_gelu(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((4, 96)), env.tensor((4, 96))
    return kernel, lambda: kernel(x, y)


def case_gelu_alloc(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x = env.tensor((3, 5, 40))
    return kernel, lambda: kernel(x)


def case_gelu_fp8(env):
    kernel = env.attach(k("gelu", dtype="fp8"), 7)
    x, y = env.tensor((8, 64)), env.tensor((8, 64), "float8_e4m3fn")
    s, a, si = (env.tensor((1,), "float32") for _ in range(3))
    return kernel, lambda: kernel(x, y, scale=s, amax=a, scale_inv=si)


def case_gelu_fp8_alloc(env):
    kernel = env.attach(k("gelu", dtype="fp8", hidden_size=64), 7)
    x, s, a = env.tensor((8, 64)), env.tensor((1,), "float32"), env.tensor((2,), "float32")
    return kernel, lambda: kernel(x, scale=s, amax=a)


def case_dgelu(env):
    kernel = env.attach(k("dgelu", dtype="bf16"), 8)
    g, x, dx = env.tensor((2, 128)), env.tensor((2, 128)), env.tensor((2, 128))
    return kernel, lambda: kernel(g, x, dx)


def case_cast_fp16(env):
    kernel = env.attach(k("cast", in_dtype="fp32", out_dtype="fp16"), 7)
    x = env.tensor((16, 16), "float32")
    return kernel, lambda: kernel(x)


def case_swiglu(env):
    kernel = env.attach(k("swiglu", dtype="bf16"), 17)
    x = env.tensor((6, 256))
    return kernel, lambda: kernel(x)


def case_swiglu_fp8(env):
    kernel = env.attach(k("swiglu", dtype="fp8"), 17)
    x, y = env.tensor((6, 256)), env.tensor((6, 128), "uint8")
    s, a = env.tensor((1,), "float32"), env.tensor((1,), "float32")
    return kernel, lambda: kernel(x, y, scale=s, amax=a)


def case_clamped_swiglu(env):
    kernel = env.attach(k("clamped_swiglu", dtype="bf16"), 17)
    x = env.tensor((6, 256))
    return kernel, lambda: kernel(x, limit=7.0, alpha=1.5)


def case_dswiglu(env):
    kernel = env.attach(k("dswiglu", dtype="bf16"), 17)
    g, x = env.tensor((6, 128)), env.tensor((6, 256))
    return kernel, lambda: kernel(g, x)


def case_rmsnorm(env):
    kernel = env.attach(k("rmsnorm_fwd", in_dtype="bf16", hidden_size=64), 17)
    x, w = env.tensor((4, 64)), env.tensor((64,))
    return kernel, lambda: kernel(x, w, 1e-6)


def case_layernorm_loop(env):
    kernel = env.attach(k("layernorm_fwd", in_dtype="bf16"), 17)
    x, w, b = env.tensor((4, 200)), env.tensor((200,)), env.tensor((200,))
    z, mu, rs = env.tensor((4, 200)), env.tensor((4,), "float32"), env.tensor((4,), "float32")
    return kernel, lambda: kernel(x, w, b, 1e-5, z, mu, rs)


def case_layernorm_fp8(env):
    kernel = env.attach(k("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=64), 17)
    x, w, b = env.tensor((4, 64)), env.tensor((64,)), env.tensor((64,))
    s, a, si = (env.tensor((1,), "float32") for _ in range(3))
    return kernel, lambda: kernel(x, w, b, scale=s, amax=a, scale_inv=si)


def case_rmsnorm_mxfp8(env):
    kernel = env.attach(
        k("rmsnorm_fwd", in_dtype="fp16", out_dtype="fp8", scaling="mxfp8", hidden_size=64), 17
    )
    x, w = env.tensor((40, 64), "float16"), env.tensor((64,), "float16")
    return kernel, lambda: kernel(x, w)


def case_layernorm_bwd_loop(env):
    kernel = env.attach(k("layernorm_bwd", in_dtype="bf16"), 18, 18, 18)
    dz, x, w = env.tensor((8, 200)), env.tensor((8, 200)), env.tensor((200,))
    mu, rs = env.tensor((8,), "float32"), env.tensor((8,), "float32")
    return kernel, lambda: kernel(dz, x, mu, rs, w)


def case_rmsnorm_bwd_regs(env):
    kernel = env.attach(k("rmsnorm_bwd", in_dtype="bf16", hidden_size=64), 18, 18)
    dz, x, w, rs = (
        env.tensor((8, 64)),
        env.tensor((8, 64)),
        env.tensor((64,)),
        env.tensor((8,), "float32"),
    )
    ws = env.tensor((kernel.workspace_elements(8, 64),), "float32")
    return kernel, lambda: kernel(dz, x, rs, w, workspace=ws)


def case_rmsnorm_bwd_add_in_place(env):
    kernel = env.attach(k("rmsnorm_bwd_add", in_dtype="fp32", hidden_size=64), 18, 18)
    dz, x, add = (env.tensor((8, 64), "float32") for _ in range(3))
    w, rs = env.tensor((64,), "float32"), env.tensor((8,), "float32")
    return kernel, lambda: kernel(dz, x, rs, w, add, add)  # dx is add: in place


def case_transpose(env):
    kernel = env.attach(k("transpose", dtype="fp16"), 11)
    x = env.tensor((100, 70), "float16")
    return kernel, lambda: kernel(x)


def case_cast_transpose(env):
    kernel = env.attach(k("cast_transpose", dtype="fp8"), 11)
    x, q, qt = (
        env.tensor((128, 256)),
        env.tensor((128, 256), "uint8"),
        env.tensor((256, 128), "uint8"),
    )
    s, a = env.tensor((1,), "float32"), env.tensor((1,), "float32")
    return kernel, lambda: kernel(x, out=q, out_t=qt, scale=s, amax=a)


def case_cast_transpose_dbias(env):
    kernel = env.attach(k("cast_transpose_dbias", in_dtype="bf16", out_dtype="bf16"), 11, 4)
    x = env.tensor((96, 320))
    return kernel, lambda: kernel(x)


def case_dbias_dgelu(env):
    kernel = env.attach(k("cast_transpose_dbias_dgelu", dtype="fp8"), 11, 4)
    g, x = env.tensor((64, 128)), env.tensor((64, 128))
    s, a = env.tensor((1,), "float32"), env.tensor((1,), "float32")
    return kernel, lambda: kernel(g, x, scale=s, amax=a)


def case_dswiglu_cast_transpose(env):
    kernel = env.attach(k("dswiglu_cast_transpose", in_dtype="bf16", out_dtype="bf16"), 11)
    g, x = env.tensor((64, 128)), env.tensor((64, 256))
    return kernel, lambda: kernel(g, x)


def case_quantize_mxfp8(env):
    kernel = env.attach(k("quantize", dtype="fp8", layout="both"), 15)
    x = env.tensor((64, 128))
    return kernel, lambda: kernel(x)


def case_quantize_nvfp4(env):
    kernel = env.attach(k("quantize", dtype="fp4_e2m1", layout="both"), 15, 4, 3)
    x, si = env.tensor((64, 128)), env.tensor((1,), "float32")
    return kernel, lambda: kernel(x, scale_inv=si)


def case_quantize_nvfp4_given_amax(env):
    kernel = env.attach(k("quantize", dtype="fp4_e2m1", layout="rowwise"), 15, 4, 3)
    x, amax = env.tensor((64, 128)), env.tensor((1,), "float32")
    return kernel, lambda: kernel(x, amax=amax, compute_amax=False)


CASES = [v for name, v in sorted(globals().items()) if name.startswith("case_")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_planned_call_packs_what_the_generic_path_packs(env, case):
    kernel, call = case(env)
    check_same(env, kernel, call)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_dependent_launches_are_the_norms_on_sm90(env, case):
    """Every launch of a norm kernel (sm_90) is a programmatic dependent launch, planned or
    not; no other family's is; with ``dependent_launch`` off, kernels made then launch
    ordinarily on both paths."""
    kernel, call = case(env)
    fast, _, slow, _ = run_both(env, kernel, call)
    norm = "norm" in kernel.key.op
    assert all(n.endswith("(dependent)") == norm for n, *_ in fast + slow), fast + slow
    # the generic path's CUlaunchConfigs, one per launch shape and stream, made once
    assert len(driver._configs) == (len({(g, b, st) for _, g, b, st, *_ in slow}) if norm else 0)
    if norm:
        ne.configure(dependent_launch=False)
        try:
            ne.clear_cache(disk=False)
            kernel, call = case(env)
            assert not kernel._dependent
            fast, _, slow, _ = run_both(env, kernel, call)
            assert not any(n.endswith("(dependent)") for n, *_ in fast + slow)
        finally:
            ne.configure(dependent_launch=True)
            ne.clear_cache(disk=False)


# -- one plan per key; anything else re-validates ------------------------------------------


def launched(env: Env, fn) -> list[tuple[Any, ...]]:
    env.drv.launches.clear()
    fn()
    return list(env.drv.launches)


def test_same_shapes_reuse_one_plan_and_skip_the_checks(env, monkeypatch):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((4, 96)), env.tensor((4, 96))
    kernel(x, y)
    kernel(x, y)
    assert len(kernel._launch_plans) == 1

    def no_generic_path(*args, **kwargs):
        raise AssertionError("the generic path ran")

    monkeypatch.setattr(kernel, "_run", no_generic_path)
    for _ in range(3):
        x2, y2 = env.tensor((4, 96)), env.tensor((4, 96))
        (launch,) = launched(env, lambda x2=x2, y2=y2: kernel(x2, y2))
        assert launch[4][:2] == (x2.data_ptr(), y2.data_ptr())
        assert launch[4][2:] == (4 * 96, 0, 0, 0, 1)
    assert len(kernel._launch_plans) == 1


def test_changes_of_key_revalidate_and_raise_before_launch(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((4, 96)), env.tensor((4, 96))
    kernel(x, y)
    kernel(x, y)
    bad = [
        (env.tensor((4, 96), "float32"), y, ArgumentError, "x: has dtype torch.float32"),
        (x, env.tensor((4, 95)), ArgumentError, r"out: has shape \(4, 95\)"),
        (x, env.tensor((4, 96), "float16"), ArgumentError, "out: has dtype torch.float16"),
        (env.tensor((96, 4), strides=(1, 96)), y, ArgumentError, "x: must be C-contiguous"),
        (x, env.tensor((4, 96), strides=(1, 4)), ArgumentError, "out: must be C-contiguous"),
        (env.tensor((4, 96), device=-1), y, ArgumentError, "x: is a cpu tensor"),
        (x, env.tensor((4, 96), device=1), ArgumentError, "out: is on device 1"),
        (x, FakeCupyArray((4, 96), "<f4"), ArgumentError, "out: has dtype <f4"),
        ("x", y, ArgumentTypeError, "x: expected a CUDA array"),
    ]
    for _ in range(2):  # the same errors again: nothing was planned for them
        for xi, yi, error, match in bad:
            with pytest.raises(error, match=match):
                assert not launched(env, lambda xi=xi, yi=yi: kernel(xi, yi))
            assert not env.drv.launches
    assert len(kernel._launch_plans) == 1


def test_alignment_is_part_of_the_key(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((1, 1000)), env.tensor((1, 1000))
    xu = env.tensor((1, 1000), ptr=x.data_ptr() + 2)  # a view one element in
    yu = env.tensor((1, 1000), ptr=y.data_ptr() + 6)
    kernel(x, y)
    for _ in range(2):
        (aligned,) = launched(env, lambda: kernel(x, y))
        (unaligned,) = launched(env, lambda: kernel(xu, y))
        (other,) = launched(env, lambda: kernel(x, yu))
        assert aligned[4][-1] == 1 and aligned[1] == -(-1000 // (128 * 8))
        assert unaligned[4][-1] == 0 and unaligned[1] == -(-1000 // 128)
        assert unaligned[4][:2] == (xu.data_ptr(), y.data_ptr())
        assert other[4][-1] == 0 and other[4][:2] == (x.data_ptr(), yu.data_ptr())
    assert len(kernel._launch_plans) == 3


def test_alignment_decides_mxfp8_errors_each_time(env):
    kernel = env.attach(k("gelu", dtype="fp8", scaling="mxfp8"), 17)
    x = env.tensor((32, 64))
    kernel(x)
    kernel(x)
    xu = env.tensor((32, 64), ptr=x.data_ptr() + 2)
    for _ in range(2):
        with pytest.raises(ArgumentError, match="x: must be 16-byte aligned for MXFP8"):
            kernel(xu)
    assert not kernel._launch_plans  # MXFP8 outputs are zeroed first: never planned


def test_specialized_hidden_size_and_scaling_errors_after_planning(env):
    kernel = env.attach(k("gelu", dtype="fp8", hidden_size=64), 7)
    x, y = env.tensor((2, 64)), env.tensor((2, 64), "float8_e4m3fn")
    s, a = env.tensor((1,), "float32"), env.tensor((1,), "float32")
    kernel(x, y, scale=s, amax=a)
    kernel(x, y, scale=s, amax=a)
    assert len(kernel._launch_plans) == 1
    cases = [
        ((env.tensor((2, 65)), env.tensor((2, 65), "uint8")), {"scale": s, "amax": a},
         "hidden_size=64"),
        ((x, y), {"amax": a}, "scale: is required"),
        ((x, y), {"scale": s}, "amax: is required"),
        ((x, y), {"scale": env.tensor((1,), "float16"), "amax": a}, "scale: must be a float32"),
        ((x, y), {"scale": s, "amax": env.tensor((0,), "float32")}, "amax: must have at least"),
        ((x, y), {"scale": s, "amax": a, "scale_inv": env.tensor((1,), "float32", device=3)},
         "scale_inv: is on device 3"),
    ]  # fmt: skip
    for args, kwargs, match in cases:
        with pytest.raises(ArgumentError, match=match):
            kernel(*args, **kwargs)
    assert not env.drv.launches[2:]


def test_planned_allocation_misaligned_takes_the_generic_path(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x = env.tensor((4, 96))
    kernel(x)
    kernel(x)
    assert len(kernel._launch_plans) == 1
    env.misalign = 8  # an allocator that does not align as torch's caching allocator does
    for _ in range(2):
        env.drv.launches.clear()
        y = kernel(x)
        (launch,) = env.drv.launches
        assert launch[4][1] == y.data_ptr() and launch[4][-1] == 0


def test_devices_streams_and_contexts(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((2, 64)), env.tensor((2, 64))
    x1, y1 = env.tensor((2, 64), device=1), env.tensor((2, 64), device=1)
    env.torch.streams[1] = 0x1111
    for _ in range(2):
        assert launched(env, lambda: kernel(x, y))[0][3] == 0x5000
        assert launched(env, lambda: kernel(x1, y1))[0][3] == 0x1111
    assert len(kernel._launch_plans) == 2
    env.torch.streams[0] = 0x7777  # torch's current stream changed
    assert launched(env, lambda: kernel(x, y))[0][3] == 0x7777
    assert launched(env, lambda: kernel(x, y, stream=0x42))[0][3] == 0x42
    assert launched(env, lambda: kernel(x, y, stream=FakeStream(0x43)))[0][3] == 0x43
    assert launched(env, lambda: kernel(x, y, stream=fake_torch.Stream(0x44)))[0][3] == 0x44
    with pytest.raises(ArgumentTypeError, match="stream"):
        launched(env, lambda: kernel(x, y, stream="default"))
    assert not env.drv.launches
    # another thread starts without a current context; the plan makes it current
    sets = env.drv.context_sets
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(launched(env, lambda: kernel(x, y))))
    thread.start()
    thread.join()
    assert len(result[0]) == 1 and env.drv.context_sets == sets + 1
    env.drv.local.context = 0x999  # someone switched this thread's context
    assert len(launched(env, lambda: kernel(x, y))) == 1
    assert env.drv.current() == CONTEXT


def test_launch_failure_raises_cuda_error(env):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    x, y = env.tensor((2, 64)), env.tensor((2, 64))
    kernel(x, y)
    kernel(x, y)
    env.drv.fail = 701
    with pytest.raises(CudaError, match="cuLaunchKernel"):
        kernel(x, y)


def test_per_call_floats_are_written_each_call(env):
    kernel = env.attach(k("clamped_swiglu", dtype="bf16"), 17)
    x = env.tensor((6, 256))
    kernel(x, limit=7.0)
    kernel(x, limit=7.0)
    for limit, alpha, offset in ((1.25, 2.5, -0.5), (3.0, 1.0, 0.0)):
        (launch,) = launched(env, lambda a=limit, b=alpha, c=offset: kernel(
            x, limit=a, alpha=b, linear_offset=c))  # fmt: skip
        floats = [ctypes.c_float.from_buffer_copy(v.to_bytes(8, "little")[:4]).value
                  for v in launch[4][13:16]]  # fmt: skip
        assert floats == [limit, alpha, offset]
    with pytest.raises(ArgumentError, match="limit: must be > 0"):
        kernel(x, limit=-1.0)
    norm = env.attach(k("rmsnorm_fwd", in_dtype="bf16", hidden_size=64), 17)
    xn, w = env.tensor((4, 64)), env.tensor((64,))
    norm(xn, w, 1e-5)
    for eps in (1e-5, 0.25, 0):
        (launch,) = launched(env, lambda e=eps: norm(xn, w, e))
        assert ctypes.c_float.from_buffer_copy(launch[4][12].to_bytes(8, "little")[:4]).value \
            == pytest.approx(eps)  # fmt: skip
    for eps in (-1.0, float("nan"), True, "x"):  # a string: ArgumentTypeError
        with pytest.raises((ArgumentError, ArgumentTypeError), match="eps"):
            norm(xn, w, eps)


def test_inputs_other_than_torch_tensors_are_never_planned(env, monkeypatch):
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    monkeypatch.setattr(driver, "pointer_device", lambda ptr: 0)
    x = env.tensor((2, 64))

    class Sub(fake_torch.Tensor):  # a tensor subclass (e.g. a wrapper tensor)
        __module__ = "torch.sub"

    calls = [
        lambda: kernel(FakeCaiArray((2, 64), "<u2"), FakeCaiArray((2, 64), "<u2")),
        lambda: kernel(x, FakeCaiArray((2, 64), "<u2")),
        lambda: kernel(Sub((2, 64), fake_torch.DTYPES["bfloat16"])),
    ]
    for call in calls * 2:
        assert len(launched(env, call)) == 1
    assert not kernel._launch_plans
    p = fake_torch.Parameter((2, 64), fake_torch.DTYPES["bfloat16"])
    kernel(p)
    kernel(p)
    assert len(kernel._launch_plans) == 1


def test_multi_cast_transpose_with_torch_tensors(env):
    kernel = env.attach(k("multi_cast_transpose", dtype="fp8"), 1)
    xs = [env.tensor((64, 128)), env.tensor((32, 256))]
    scales = [env.tensor((1,), "float32") for _ in xs]
    amaxes = [env.tensor((1,), "float32") for _ in xs]
    for _ in range(2):
        outs = kernel(xs, scales=scales, amaxes=amaxes)
        assert [(q.shape, qt.shape) for q, qt in outs] == [((64, 128), (128, 64)),
                                                           ((32, 256), (256, 32))]  # fmt: skip
    assert len(env.drv.launches) == 2


def test_plans_are_bounded(env, monkeypatch):
    monkeypatch.setattr(kernel_mod, "MAX_PLANS", 3)
    kernel = env.attach(k("gelu", dtype="bf16"), 7)
    for n in range(1, 8):
        x = env.tensor((n, 64))
        kernel(x)
        kernel(x)
        assert len(kernel._launch_plans) <= 3
    assert len(launched(env, lambda: kernel(env.tensor((1, 64))))) == 1


def test_threads_each_launch_their_own_pointers(env):
    kernel = env.attach(k("dgelu", dtype="bf16"), 8)
    g = env.tensor((2, 64))
    kernel(g, g, env.tensor((2, 64)))
    kernel(g, g, env.tensor((2, 64)))
    assert len(kernel._launch_plans) == 1
    barrier = threading.Barrier(4)
    expected: dict[int, set[tuple[int, int, int]]] = {}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work() -> None:
        tid = threading.get_ident()
        mine = [tuple(env.tensor((2, 64)) for _ in range(3)) for _ in range(20)]
        expected[tid] = {(x.data_ptr(), y.data_ptr(), gr.data_ptr()) for gr, x, y in mine}
        barrier.wait()
        for _ in range(50):
            for gr, x, y in mine:
                kernel(gr, x, y)

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(env.drv.launches) == 2 + 4 * 50 * 20
    for _, _, _, _, slots, tid in env.drv.launches[2:]:
        assert (slots[0], slots[1], slots[7]) in expected[tid]


def test_param_buffers_are_per_thread():
    pack = driver.ParamPack("PqPf")
    preset = pack.preset((1, 2, 3, 0.5))
    barrier = threading.Barrier(2)
    seen: dict[int, tuple[Any, ...]] = {}

    def read(address: int, kinds: str) -> tuple[Any, ...]:
        slot = [ctypes.c_void_p.from_address(address + 8 * i).value for i in range(len(kinds))]
        return tuple(
            ctypes.c_float.from_address(a).value if kind == "f"
            else ctypes.c_uint64.from_address(a).value
            for a, kind in zip(slot, kinds, strict=True)
        )  # fmt: skip

    def work(i: int) -> None:
        address = pack.pack(100 + i, i, 200 + i, float(i))
        slots, floats, p_address = preset.buffers()
        slots[0] = 300 + i
        floats[6] = 2.0 * i
        barrier.wait()  # both threads have written
        seen[i] = (read(address, "PqPf"), read(p_address, "PqPf"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert seen[i] == ((100 + i, i, 200 + i, float(i)), (300 + i, 2, 3, 2.0 * i))


def test_a_reference_that_does_not_match_is_not_planned(env, monkeypatch):
    """References that disagree with what the generic path packed (a bug) leave the call on
    the generic path, with one warning per kernel."""
    from nvrtc_engine import plans
    from nvrtc_engine.ops import activation

    monkeypatch.setattr(plans, "_warned", set())
    x, y = env.tensor((2, 64)), env.tensor((2, 64))
    swapped = ((0, plans.Ptr(2)), (1, plans.Ptr(1)))  # x and out swapped
    missing = ((0, plans.Ptr(1)),)  # out's slot not described
    for refs in (swapped, missing):
        monkeypatch.setattr(activation, "_FLAT_REFS", refs)
        kernel = env.attach(k("gelu", dtype="bf16"), 7)
        plans._warned.clear()
        with pytest.warns(RuntimeWarning, match="does not match its reference"):
            for _ in range(3):
                (launch,) = launched(env, lambda kernel=kernel: kernel(x, y))
                assert launch[4][:2] == (x.data_ptr(), y.data_ptr())
        assert not kernel._launch_plans
