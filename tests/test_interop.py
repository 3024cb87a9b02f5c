"""Array and stream protocols, without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeCaiArray, FakeCupyArray, FakeStream

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError
from nvrtc_engine.core.interop import as_array, stream_handle


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


GOOD_CAI = {"shape": (4, 8), "typestr": "<f2", "data": (0x1000, False), "version": 3}


@pytest.mark.parametrize(
    ("interface", "says"),
    [
        (dict(GOOD_CAI, shape="ab"), r"'shape' must be a tuple of ints >= 0, got 'ab'"),
        (dict(GOOD_CAI, shape="48"), r"'shape' must be a tuple of ints >= 0, got '48'"),
        (dict(GOOD_CAI, shape=(4, None)), r"'shape' must be a tuple of ints"),
        (dict(GOOD_CAI, shape=8), r"'shape' must be a tuple of ints >= 0, got 8"),
        (dict(GOOD_CAI, shape=(4, -8)), r"'shape' must be a tuple of ints >= 0, got \(4, -8\)"),
        (dict(GOOD_CAI, data=None), r"'data' must be a \(pointer, read_only\) tuple"),
        (dict(GOOD_CAI, data=("0x1000", False)), r"'data' must be .*got \('0x1000', False\)"),
        (dict(GOOD_CAI, data=()), r"'data' must be"),
        (dict(GOOD_CAI, typestr=None), r"'typestr' must be a str such as '<f4', got None"),
        (dict(GOOD_CAI, typestr=4), r"'typestr' must be a str"),
        (dict(GOOD_CAI, strides=(16,)), r"'strides' must be None or a tuple of 2 ints"),
        (dict(GOOD_CAI, strides=5), r"'strides' must be None or a tuple of 2 ints .*got 5"),
        (dict(GOOD_CAI, shape=(True, 4096)), r"'shape' must be a tuple of ints >= 0, got \(True"),
        (dict(GOOD_CAI, shape=(4, np.bool_(True))), r"'shape' must be a tuple of ints >= 0"),
        (dict(GOOD_CAI, shape=(2**63, 8)), r"'shape' must hold sizes below 2\*\*63, got \(9"),
        (dict(GOOD_CAI, data=(-1, False)), r"'data' must hold a pointer from 0 to 2\*\*64 - 1"),
        (dict(GOOD_CAI, data=(2**64, False)), r"'data' must hold a pointer from 0 to 2\*\*64"),
        (dict(GOOD_CAI, data=(0x1000,)), r"'data' must be a \(pointer, read_only\) tuple"),
        (dict(GOOD_CAI, data=(0x1000, False, 0)), r"'data' must be a \(pointer, read_only\)"),
        (dict(GOOD_CAI, data=(True, False)), r"'data' must be a \(pointer, read_only\) tuple"),
        ({}, r"it has no 'shape', 'typestr', 'data' entry"),
        ({"shape": (4,), "data": (0, False)}, r"it has no 'typestr' entry"),
        (5, r"it is int 5, not a dict"),
        (None, r"it is NoneType None, not a dict"),
        ([(4, 8), "<f2"], r"it is list .*, not a dict"),
    ],
)
@pytest.mark.parametrize("name", ["x", "out", "gamma"])
def test_malformed_cuda_array_interface_names_argument_and_part(interface, says, name):
    for array in (FakeCaiArray((4, 8), "<f2"), FakeCupyArray((4, 8), "<f2")):
        array._cai = interface
        with pytest.raises(ArgumentTypeError, match=rf"^{name}: has a malformed "
                           rf"__cuda_array_interface__: {says}") as info:  # fmt: skip
            as_array(array, name)
        assert info.value.argument == name and isinstance(info.value, TypeError)


def test_cuda_array_interface_takes_numpy_ints_and_lists():
    array = FakeCaiArray((4, 8), "<f2")
    array._cai = dict(GOOD_CAI, shape=[np.int64(4), np.int32(8)], data=[np.uint64(0x1000), 0])
    a = as_array(array, "x")
    assert (a.ptr, a.shape, a.dtypes) == (0x1000, (4, 8), ("fp16",))
    assert all(type(s) is int for s in a.shape) and type(a.ptr) is int
    array._cai = dict(GOOD_CAI, shape=(2**63 - 1, 0), data=(2**64 - 1, True))
    a = as_array(array, "x")  # the largest size and pointer there are
    assert (a.ptr, a.shape) == (2**64 - 1, (2**63 - 1, 0))


def test_a_kernel_call_names_the_argument_with_a_malformed_interface():
    kernel = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    good, bad = FakeCupyArray((4, 64), "<u2"), FakeCupyArray((4, 64), "<u2")
    bad._cai = dict(bad._cai, data=None)
    for args, name in (((bad,), "x"), ((good, bad), "out")):
        with pytest.raises(ArgumentTypeError, match=rf"^{name}: has a malformed "
                           r"__cuda_array_interface__: 'data' must be"):  # fmt: skip
            kernel(*args)


@pytest.mark.parametrize("device", [5, None, (2,), (2, 0, 1), ("cuda", 0), (2, None)])
def test_malformed_dlpack_device_names_argument(device):
    class BadDevice:
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return device

    with pytest.raises(ArgumentTypeError, match=r"^w: has a malformed __dlpack_device__\(\): "
                       r"expected a \(device_type, device_id\) pair of ints"):  # fmt: skip
        as_array(BadDevice(), "w")


@pytest.mark.parametrize("consumed", [False, True])
def test_dlpack_that_returns_no_capsule_names_argument(consumed):
    import ctypes

    host = np.zeros(4, np.float32)

    class NoCapsule:
        def __dlpack__(self, stream=None):
            if not consumed:
                return 5
            capsule = host.__dlpack__()
            set_name = ctypes.pythonapi.PyCapsule_SetName
            set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
            set_name(capsule, b"used_dltensor")  # as a consumer renames it
            return capsule

        def __dlpack_device__(self):
            return (2, 0)

    what = "PyCapsule" if consumed else "int"
    with pytest.raises(ArgumentTypeError, match=rf"^y: __dlpack__\(\) returned {what}, not an "
                       "unconsumed DLPack 'dltensor' capsule"):  # fmt: skip
        as_array(NoCapsule(), "y")


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

    from nvrtc_engine.core.dtypes import DTYPES
    from nvrtc_engine.core.interop import allocate_bytes, allocate_like

    if "cupy" in sys.modules:
        pytest.skip("CuPy is loaded: the lookalike would allocate through it")
    like = as_array(FakeCupyArray((2,), "<f4"), "x")
    with pytest.raises(ArgumentTypeError, match="out: is required: .*CuPy is not loaded"):
        allocate_like(like, (2,), DTYPES["fp32"], "out")
    with pytest.raises(ArgumentTypeError, match="scale_inv: is required"):
        allocate_bytes(like, (2,), "scale_inv")
    assert stream_handle(None, like) == 0
