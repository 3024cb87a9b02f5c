"""Fake device arrays for CPU tests: they describe memory through the protocols the engine
reads, without any GPU. Kernels reject them only when they reach the driver."""

from __future__ import annotations


class FakeDevice:
    def __init__(self, ordinal: int) -> None:
        self.id = ordinal


class FakeCupyArray:
    """Looks like a CuPy array: __cuda_array_interface__ and .device.id."""

    __module__ = "cupy._core.core"

    def __init__(self, shape, typestr, ptr=0x7F0000000000, strides=None, device=0):
        self.shape = tuple(shape)
        self._cai = {
            "shape": self.shape,
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }
        self.device = FakeDevice(device)

    @property
    def __cuda_array_interface__(self):
        return self._cai


class FakeCaiArray(FakeCupyArray):
    """Only __cuda_array_interface__ (a Numba-like array): device found from the pointer."""

    __module__ = "numba.cuda.fake"


class FakeStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)
