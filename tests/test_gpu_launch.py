"""Prepared launches on a real GPU: prepared calls give the checked path's results bit for
bit, in every family; many calls with alternating shapes, dtypes, alignment and allocation
stay right; prepared launches follow torch's current stream, survive context switches and
threads, and are captured in CUDA graphs.

The checked path is forced by a table of prepared launches that keeps none (``generic``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gpu_util import poisoned, to_host, torch

import nvrtc_engine as ne
from nvrtc_engine import reference

pytestmark = pytest.mark.gpu


class _KeepsNone(dict):
    """A table of prepared launches that keeps none: every call takes the checked path."""

    def __setitem__(self, key, value):
        pass


def generic(kernel):
    """The same kernel object, made to take the checked path on every call."""
    kernel._prepared = _KeepsNone()
    return kernel


def prepared(kernel):
    """The kernel with prepared launches again."""
    kernel._prepared = {}
    return kernel


def tensors_of(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, ne.BlockScaledOutput):  # all six fields (iterating gives four)
        return tensors_of([getattr(result, name) for name in result.__slots__])
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in tensors_of(r)]
    return []


def same_bits(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))  # fmt: skip


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda").to(dtype)


def check_gelu(x, out, x_host=None):
    torch.cuda.synchronize()
    x_host = to_host(x, "bf16") if x_host is None else x_host
    ref = reference.activation("gelu", x_host, "bf16")
    reference.check_close(to_host(out, "bf16"), ref.y, "bf16", ref.tolerance)


def test_alternating_shapes_alignment_and_allocation():
    kernel = ne.get_kernel("gelu", dtype="bf16")
    base = randn(128 * 4096 + 8)
    cases = []
    for shape in [(1, 1024), (7, 33), (128, 4096), (3, 5, 67)]:
        n = int(np.prod(shape))
        cases.append((base[:n].view(shape), None))  # aligned, allocated output
        cases.append((base[1 : n + 1].view(shape), None))  # unaligned input
        cases.append((base[:n].view(shape), "given"))
    rng = np.random.default_rng(3)
    for i in rng.integers(0, len(cases), size=200):
        x, out = cases[i]
        y = poisoned(x.shape, "bf16") if out else None
        got = kernel(x, y)
        assert got is y if out else got.shape == x.shape
        check_gelu(x, got)
    assert len(kernel._prepared) <= len(cases)


@pytest.mark.parametrize(
    "case",
    ["gelu_fp8", "dgelu", "swiglu", "clamped_swiglu", "rmsnorm", "layernorm_fp8", "layernorm_bwd",
     "rmsnorm_bwd_add", "transpose", "cast_transpose_dbias", "quantize_mxfp8", "quantize_nvfp4"],
)  # fmt: skip
def test_prepared_calls_match_the_checked_path_bit_for_bit(case):
    x = randn(256, 1024)
    h = randn(256, 2048)
    s, a = torch.full((1,), 2.0, device="cuda"), torch.zeros(1, device="cuda")
    si = torch.empty(1, device="cuda")
    w, b = randn(1024), randn(1024)
    calls = {
        "gelu_fp8": lambda: (ne.get_kernel("gelu", dtype="fp8"),
                             lambda k: k(x, scale=s, amax=a, scale_inv=si)),
        "dgelu": lambda: (ne.get_kernel("dgelu", dtype="bf16"), lambda k: k(x * 0.5, x)),
        "swiglu": lambda: (ne.get_kernel("swiglu", dtype="bf16"), lambda k: k(h)),
        "clamped_swiglu": lambda: (ne.get_kernel("clamped_swiglu", dtype="bf16"),
                                   lambda k: k(h, limit=3.0, alpha=1.5)),
        "rmsnorm": lambda: (ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024),
                            lambda k: k(x, w, 1e-5)),
        "layernorm_fp8": lambda: (ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8"),
                                  lambda k: k(x, w, b, 1e-5, scale=s, amax=a)),
        "layernorm_bwd": lambda: (ne.get_kernel("layernorm_bwd", in_dtype="bf16"),
                                  lambda k: k(x * 0.5, x, torch.zeros(256, device="cuda"),
                                              torch.ones(256, device="cuda"), w)),
        "rmsnorm_bwd_add": lambda: (ne.get_kernel("rmsnorm_bwd_add", in_dtype="bf16",
                                                  hidden_size=1024),
                                    lambda k: k(x * 0.5, x, torch.ones(256, device="cuda"), w,
                                                x * 2.0)),
        "transpose": lambda: (ne.get_kernel("transpose", dtype="bf16"), lambda k: k(x)),
        "cast_transpose_dbias": lambda: (ne.get_kernel("cast_transpose_dbias", dtype="fp8"),
                                         lambda k: k(x, scale=s, amax=a)),
        "quantize_mxfp8": lambda: (ne.get_kernel("quantize", dtype="fp8", layout="both"),
                                   lambda k: k(x)),
        "quantize_nvfp4": lambda: (ne.get_kernel("quantize", dtype="fp4_e2m1", layout="both"),
                                   lambda k: k(x)),
    }  # fmt: skip
    kernel, call = calls[case]()
    want = tensors_of(call(generic(kernel)))
    prepared(kernel)
    for _ in range(3):  # prepares, then runs the prepared launch twice
        got = tensors_of(call(kernel))
        torch.cuda.synchronize()
        assert len(got) == len(want)
        for g, e in zip(got, want, strict=True):
            assert same_bits(g, e)
    assert kernel._prepared


def test_in_place_and_aliasing():
    kernel = ne.get_kernel("gelu", dtype="bf16")
    for _ in range(3):
        x = randn(64, 512)
        x_host = to_host(x, "bf16")
        assert kernel(x, x) is x
        check_gelu(x, x, x_host)
    add = ne.get_kernel("rmsnorm_bwd_add", in_dtype="bf16", hidden_size=1024)
    x, dz, w = randn(64, 1024), randn(64, 1024), randn(1024)
    rs = torch.ones(64, device="cuda")
    want = generic(add)(dz, x, rs, w, randn(64, 1024).fill_(1.0))
    prepared(add)
    for _ in range(3):
        residual = torch.ones(64, 1024, dtype=torch.bfloat16, device="cuda")
        got = add(dz, x, rs, w, residual, residual)  # dx is add: in place
        torch.cuda.synchronize()
        assert got.dx is residual and same_bits(got.dx, want.dx)


def test_prepared_launches_follow_the_current_stream():
    kernel = ne.get_kernel("gelu", dtype="bf16")
    x = randn(512, 4096)
    kernel(x)
    kernel(x)  # prepared from here on
    side = torch.cuda.Stream()  # does not wait for the legacy default stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)
        x2 = x * 2.0  # written after the sleep: a launch on another stream reads garbage
        y = kernel(x2)
        z = kernel(x2, stream=side.cuda_stream)
        w = kernel(x2, stream=side)
    side.synchronize()
    check_gelu(x2, y)
    assert same_bits(y, z) and same_bits(y, w)


def test_prepared_launches_after_a_context_switch_and_in_threads():
    from cuda.bindings import driver as cu

    kernel = ne.get_kernel("gelu", dtype="bf16")
    x = randn(32, 1024)
    kernel(x)
    kernel(x)
    cu.cuCtxSetCurrent(cu.CUcontext(0))  # no current context on this thread
    check_gelu(x, kernel(x))
    results: list = []
    errors: list = []

    def work() -> None:
        try:
            xs = [randn(32, 1024) for _ in range(20)]
            results.append([(t, kernel(t)) for t in xs for _ in range(5)])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for pairs in results:
        for t, y in pairs:
            check_gelu(t, y)


def test_prepared_launches_in_a_cuda_graph():
    kernel = ne.get_kernel("gelu", dtype="fp8")
    x = randn(256, 1024)
    s = torch.full((1,), 2.0, device="cuda")
    amax = torch.zeros(1, device="cuda")
    out = torch.empty(256, 1024, dtype=torch.float8_e4m3fn, device="cuda")
    for _ in range(2):  # load, prepare
        kernel(x, out, scale=s, amax=amax)
        kernel(x, scale=s, amax=amax)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(x, out, scale=s, amax=amax)  # prepared, given output
        allocated = kernel(x, scale=s, amax=amax)  # prepared, output from the graph's pool
    out.view(torch.uint8).fill_(0xFF)
    amax.zero_()
    x.copy_(randn(256, 1024))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference.activation("gelu", to_host(x, "bf16"), "fp8_e4m3", 2.0)
    reference.check_close(to_host(out, "fp8_e4m3"), ref.y * 2.0, "fp8_e4m3", ref.tolerance * 2)
    assert same_bits(allocated, out)
    assert amax.item() == pytest.approx(ref.amax, rel=1e-5)


def test_float_arguments_change_per_prepared_call():
    kernel = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024)
    x, w = randn(64, 1024), randn(1024)
    for eps in (1e-5, 1e-5, 0.5, 2.0, 1e-5):
        got = kernel(x, w, eps)
        want = generic(kernel)(x, w, eps)
        prepared(kernel)
        torch.cuda.synchronize()
        assert same_bits(got.z, want.z) and same_bits(got.rsigma, want.rsigma)


def test_an_ordinal_beyond_the_visible_devices_is_an_argument_error():
    """The driver is asked for the count: one past the last visible device is an
    ArgumentError naming the device argument, from get_device and from Kernel.loaded."""
    from nvrtc_engine.core import driver

    count = driver.device_count()
    assert count >= 1
    with pytest.raises(ne.ArgumentError, match=f"^device: device {count} does not exist; "):
        driver.get_device(count)
    kernel = ne.get_kernel("gelu", dtype="bf16")
    with pytest.raises(ne.ArgumentError, match=f"device {count} does not exist"):
        kernel.loaded(count)
    assert kernel.loaded(0).device.ordinal == 0
