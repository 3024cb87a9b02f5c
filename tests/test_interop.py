"""Array and stream protocols, without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeCupyArray, FakeStream

from nvrtc_engine import ArgumentError, ArgumentTypeError
from nvrtc_engine.interop import as_array, stream_handle


def test_cuda_array_interface_fields():
    a = as_array(FakeCupyArray((4, 8), "<f2", ptr=0x1000, device=1), "x")
    assert (a.ptr, a.shape, a.dtypes, a.device, a.contiguous, a.kind) == (
        0x1000,
        (4, 8),
        ("fp16",),
        1,
        True,
        "cupy",
    )
    assert a.numel == 32


@pytest.mark.parametrize(
    ("typestr", "dtypes"),
    [
        ("<f4", ("fp32",)),
        ("<f2", ("fp16",)),
        ("<u2", ("bf16",)),
        ("|u1", ("fp8_e4m3", "fp8_e5m2")),
        ("<i4", ()),
    ],
)
def test_typestrs(typestr, dtypes):
    assert as_array(FakeCupyArray((2,), typestr), "x").dtypes == dtypes


def test_strides_decide_contiguity():
    assert as_array(FakeCupyArray((4, 8), "<f4", strides=(32, 4)), "x").contiguous
    assert not as_array(FakeCupyArray((4, 8), "<f4", strides=(4, 16)), "x").contiguous
    assert not as_array(FakeCupyArray((4, 8), "<f4", strides=(64, 4)), "x").contiguous
    assert as_array(FakeCupyArray((1, 8), "<f4", strides=(999, 4)), "x").contiguous


def test_host_arrays_and_other_objects_are_rejected_by_name():
    with pytest.raises(ArgumentError, match="x: is a host"):
        as_array(np.zeros(4, np.float32), "x")
    with pytest.raises(ArgumentTypeError, match="out: expected a CUDA array"):
        as_array([1.0, 2.0], "out")

    # numpy supports DLPack on the CPU only
    class CpuDlpack:
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(ArgumentError, match="not a CUDA device"):
        as_array(CpuDlpack(), "x")


def test_dlpack_capsule_is_parsed():
    # numpy exports a real DLPack capsule; pretend its device is CUDA to read the fields
    host = np.arange(12, dtype=np.float32).reshape(3, 4)

    class Wrapped:
        def __dlpack__(self, stream=None):
            return host.__dlpack__()

        def __dlpack_device__(self):
            return (2, 0)

    a = as_array(Wrapped(), "x")
    assert a.ptr == host.ctypes.data and a.shape == (3, 4) and a.dtypes == ("fp32",)
    assert a.contiguous and a.device == 0
    t = host.T

    class WrappedT(Wrapped):
        def __dlpack__(self, stream=None):
            return t.__dlpack__()

    assert not as_array(WrappedT(), "x").contiguous


def test_streams():
    like = as_array(FakeCupyArray((2,), "<f4"), "x")
    assert stream_handle(1234, like) == 1234
    assert stream_handle(FakeStream(77), like) == 77

    class TorchLikeStream:
        cuda_stream = 55

    class CupyLikeStream:
        ptr = 66

    assert stream_handle(TorchLikeStream(), like) == 55
    assert stream_handle(CupyLikeStream(), like) == 66
    with pytest.raises(ArgumentTypeError, match="stream"):
        stream_handle("default", like)
    with pytest.raises(ArgumentTypeError, match="stream"):
        stream_handle(True, like)


def test_cupy_lookalike_without_cupy_cannot_allocate():
    """An array whose class claims CuPy's module while CuPy is not loaded: outputs left out
    raise the typed error, and the default stream is the legacy one."""
    import sys

    from nvrtc_engine.dtypes import DTYPES
    from nvrtc_engine.interop import allocate_bytes, allocate_like

    if "cupy" in sys.modules:
        pytest.skip("CuPy is loaded: the lookalike would allocate through it")
    like = as_array(FakeCupyArray((2,), "<f4"), "x")
    with pytest.raises(ArgumentTypeError, match="out: is required: .*CuPy is not loaded"):
        allocate_like(like, (2,), DTYPES["fp32"], "out")
    with pytest.raises(ArgumentTypeError, match="scale_inv: is required"):
        allocate_bytes(like, (2,), "scale_inv")
    assert stream_handle(None, like) == 0
