"""GELU on a real GPU against the float64 reference: every dtype pair, odd shapes, unaligned
tails, torch and CuPy arrays, streams, graphs, and errors raised before launch."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from gpu_util import poisoned, to_host, to_torch, torch

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, reference

pytestmark = pytest.mark.gpu

IN = ["fp32", "fp16", "bf16"]
OUT = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
SHAPES = [(1,), (7, 33), (5, 1001), (3, 5, 67), (128, 4096)]


def run_and_check(kernel, x_host, out_dtype, *, x=None, out=None, scale=None, stream=None):
    key = kernel.key
    x = to_torch(x_host, key.in_dtype) if x is None else x
    out = poisoned(x_host.shape, out_dtype) if out is None else out
    kwargs = {}
    if key.scaling == "tensor":
        kwargs = {
            "scale": torch.tensor([scale], dtype=torch.float32, device="cuda"),
            "amax": torch.zeros(1, dtype=torch.float32, device="cuda"),
            "scale_inv": torch.full((1,), float("nan"), device="cuda"),
        }
    got = kernel(x, out, stream=stream, **kwargs)
    assert got is out
    torch.cuda.synchronize()
    ref = reference.activation(key.op, x_host, out_dtype, scale)
    scaled = ref.y * (np.float64(np.float32(scale)) if scale is not None else 1.0)
    factor = np.float32(scale) if scale is not None else 1.0
    n, at_ties = reference.check_close(
        to_host(out, out_dtype), scaled, out_dtype, ref.tolerance * factor
    )
    if out_dtype != "fp32":  # fp32 output is checked to a tolerance, not bit for bit
        assert at_ties <= max(2, n // 1000), f"{at_ties} of {n} elements at rounding ties"
    if kwargs:
        if ref.amax >= 10.0:  # the largest |y| is an outlier, where fp32 GELU(x) = x exactly
            assert kwargs["amax"].item() == ref.amax
        else:
            assert abs(kwargs["amax"].item() - ref.amax) <= ref.tolerance.max() + 1e-30
        assert kwargs["scale_inv"].item() == float(ref.scale_inv)
    return out


@pytest.mark.parametrize(("in_dtype", "out_dtype"), list(itertools.product(IN, OUT)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_dtype_pair_and_shape(in_dtype, out_dtype, shape):
    rng = np.random.default_rng(zlib.crc32(repr((in_dtype, out_dtype, shape)).encode()))
    kernel = ne.get_kernel("gelu", in_dtype=in_dtype, out_dtype=out_dtype)
    x_host = reference.sample_input(shape, in_dtype, rng)
    scale = float(np.float32(rng.uniform(0.5, 8.0))) if kernel.key.scaling == "tensor" else None
    run_and_check(kernel, x_host, out_dtype, scale=scale)


@pytest.mark.parametrize("out_dtype", ["bf16", "fp8_e4m3"])
def test_hidden_size_specialized_kernel(out_dtype):
    rng = np.random.default_rng(5)
    kernel = ne.get_kernel("gelu", dtype=out_dtype, hidden_size=4096)
    assert kernel.key.arch == ne.core.driver.get_device(torch.cuda.current_device()).arch
    x_host = reference.sample_input((64, 4096), "bf16", rng)
    run_and_check(kernel, x_host, out_dtype, scale=1.5 if out_dtype != "bf16" else None)
    with pytest.raises(ArgumentError, match="hidden_size=4096"):
        kernel(torch.zeros(4, 4095, dtype=torch.bfloat16, device="cuda"))


def test_fp8_saturates_and_scales():
    kernel = ne.get_kernel("gelu", dtype="fp8")
    x_host = np.array([0.0, 1.0, -1.0, 30.0, 200.0, -200.0, 3.0, 0.5], dtype=np.float64)
    x_host = x_host.astype(ne.DTYPES["bf16"].numpy())
    out = run_and_check(kernel, x_host, "fp8_e4m3", scale=4.0)
    assert to_host(out, "fp8_e4m3").astype(np.float64)[4] == 448.0  # 800 saturates


def test_unaligned_pointers_take_the_scalar_path():
    rng = np.random.default_rng(7)
    kernel = ne.get_kernel("gelu", dtype="fp8")
    x_host = reference.sample_input((1, 5000), "bf16", rng)
    base = to_torch(reference.sample_input((1, 5001), "bf16", rng), "bf16")
    x = base.view(-1)[1:].view(1, 5000)
    x.copy_(to_torch(x_host, "bf16"))
    assert x.data_ptr() % 16 != 0
    run_and_check(kernel, x_host, "fp8_e4m3", x=x, scale=2.0)
    out_base = poisoned((5001,), "fp8_e4m3")
    out = out_base[1:].view(1, 5000)
    run_and_check(kernel, x_host, "fp8_e4m3", out=out, scale=2.0)


def test_output_allocated_with_torch_dtype_and_uint8_storage_accepted():
    kernel = ne.get_kernel("gelu", dtype="fp8")
    x = torch.randn(16, 64, device="cuda").to(torch.bfloat16)
    s = torch.ones(1, device="cuda")
    a = torch.zeros(1, device="cuda")
    y = kernel(x, scale=s, amax=a)
    assert y.dtype == torch.float8_e4m3fn and y.shape == x.shape
    y8 = kernel(x, torch.empty(16, 64, dtype=torch.uint8, device="cuda"), scale=s, amax=a)
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.uint8), y8)


def test_amax_accumulates_across_launches():
    kernel = ne.get_kernel("gelu", dtype="fp8")
    amax = torch.zeros(1, device="cuda")
    s = torch.ones(1, device="cuda")
    kernel(torch.full((256,), 3.0, dtype=torch.bfloat16, device="cuda"), scale=s, amax=amax)
    kernel(torch.full((256,), 1.0, dtype=torch.bfloat16, device="cuda"), scale=s, amax=amax)
    torch.cuda.synchronize()
    assert amax.item() == pytest.approx(float(reference.gelu(np.array([3.0]))[0]), rel=1e-6)


def test_non_default_stream_explicit_and_current():
    rng = np.random.default_rng(11)
    kernel = ne.get_kernel("gelu", dtype="bf16")
    x_host = reference.sample_input((512, 1024), "bf16", rng)
    stream = torch.cuda.Stream()
    x = to_torch(x_host, "bf16")
    stream.wait_stream(torch.cuda.current_stream())
    out = poisoned(x_host.shape, "bf16")
    with torch.cuda.stream(stream):
        kernel(x, out)  # picks up torch's current stream
    stream.synchronize()
    ref = reference.activation("gelu", x_host, "bf16")
    reference.check_close(to_host(out, "bf16"), ref.y, "bf16", ref.tolerance)
    out2 = poisoned(x_host.shape, "bf16")
    stream.wait_stream(torch.cuda.current_stream())
    kernel(x, out2, stream=stream)  # a torch.cuda.Stream object
    kernel(x, out2, stream=stream.cuda_stream)  # a raw handle
    stream.synchronize()
    assert torch.equal(out, out2)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(13)
    for in_dtype, out_dtype in [("fp32", "fp16"), ("fp16", "fp8_e4m3"), ("fp32", "fp8_e5m2")]:
        kernel = ne.get_kernel("gelu", in_dtype=in_dtype, out_dtype=out_dtype)
        x_host = reference.sample_input((33, 257), in_dtype, rng)
        x = cupy.asarray(x_host)
        kwargs = {}
        scale = None
        if kernel.key.scaling == "tensor":
            scale = 2.0
            kwargs = {
                "scale": cupy.full((1,), scale, dtype=cupy.float32),
                "amax": cupy.zeros((1,), dtype=cupy.float32),
            }
        y = kernel(x, **kwargs)  # allocated by CuPy (uint8 storage for FP8)
        cupy.cuda.get_current_stream().synchronize()
        got = cupy.asnumpy(y).view(ne.DTYPES[out_dtype].numpy())
        ref = reference.activation("gelu", x_host, out_dtype, scale)
        scaled = ref.y * (scale or 1.0)
        reference.check_close(got, scaled, out_dtype, ref.tolerance * (scale or 1.0))
        if kwargs:
            assert float(kwargs["amax"].get()[0]) == ref.amax


def test_device_buffer_without_torch():
    rng = np.random.default_rng(17)
    kernel = ne.get_kernel("gelu", dtype="fp16")
    x_host = reference.sample_input((8, 999), "fp16", rng)
    dev = torch.cuda.current_device()
    x = ne.DeviceBuffer(dev, x_host.shape, "fp16")
    y = ne.DeviceBuffer(dev, x_host.shape, "fp16")
    x.copy_from_host(x_host)
    y.fill_bytes(0xFF)
    kernel(x, y)
    ref = reference.activation("gelu", x_host, "fp16")
    reference.check_close(y.to_host(), ref.y, "fp16", ref.tolerance)


def test_cuda_graph_capture_and_replay():
    kernel = ne.get_kernel("gelu", dtype="fp8")
    x = torch.randn(256, 1024, device="cuda").to(torch.bfloat16)
    s = torch.full((1,), 2.0, device="cuda")
    amax = torch.zeros(1, device="cuda")
    out = torch.empty(256, 1024, dtype=torch.float8_e4m3fn, device="cuda")
    kernel(x, out, scale=s, amax=amax)  # load the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(x, out, scale=s, amax=amax)
    out.view(torch.uint8).fill_(0xFF)
    amax.zero_()
    x.copy_(torch.randn(256, 1024, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    x_host = to_host(x, "bf16")
    ref = reference.activation("gelu", x_host, "fp8_e4m3", 2.0)
    reference.check_close(to_host(out, "fp8_e4m3"), ref.y * 2.0, "fp8_e4m3", ref.tolerance * 2)
    assert amax.item() == pytest.approx(ref.amax, rel=1e-5)


def test_errors_before_launch_with_real_tensors():
    kernel = ne.get_kernel("gelu", dtype="bf16")
    with pytest.raises(ArgumentError, match="x: is a cpu tensor"):
        kernel(torch.zeros(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="x: has dtype torch.float32"):
        kernel(torch.zeros(4, 8, device="cuda"))
    with pytest.raises(ArgumentError, match="must be C-contiguous"):
        kernel(torch.zeros(8, 4, dtype=torch.bfloat16, device="cuda").t())
    ampere = ne.get_kernel("gelu", dtype="bf16", arch="sm_80")
    with pytest.raises(ArgumentError, match="cubin for sm_80"):
        ampere(torch.zeros(4, 8, dtype=torch.bfloat16, device="cuda"))
    arch_specific = ne.get_kernel("gelu", dtype="bf16", arch=torch_arch() + "a")
    y = arch_specific(torch.ones(4, 8, dtype=torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    assert y.float().mean().item() == pytest.approx(
        float(reference.gelu(np.array([1.0]))[0]), rel=1e-2
    )


def torch_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def test_empty_input_launches_nothing():
    kernel = ne.get_kernel("gelu", dtype="bf16")
    x = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    assert kernel(x).shape == (0, 128)


def test_disk_cached_kernel_runs_in_this_process(isolated_cache):
    from nvrtc_engine.core.engine import Engine

    key = ne.make_key("gelu", dtype="fp8", hidden_size=1024)
    Engine().get(key)
    kernel = Engine().get(key)
    assert kernel.origin == "disk"
    x_host = reference.sample_input((32, 1024), "bf16", np.random.default_rng(3))
    run_and_check(kernel, x_host, "fp8_e4m3", scale=3.0)


def test_demo_runs_and_checks_each_variant(capsys):
    """`nvrtc-engine demo` on a GPU: every variant run on the device and checked against the
    float64 reference (a small --tokens keeps the reference quick); exit code 0 only when
    every check passed, one progress line per variant before its check."""
    from nvrtc_engine.tools.cli import main

    assert main(["demo", "--tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "checking it against the float64 reference" in out
    rows = [line for line in out.splitlines() if line.startswith("gelu_")]
    assert len(rows) == 4 and all(" ok" in line for line in rows), out
    assert out.count(" ...") == 4
