"""A stand-in ``torch`` module for CPU tests and the CPU mode of bench/launch_overhead.py.

It has what the engine reads from PyTorch: dtypes, CUDA tensors that only describe memory
(``data_ptr``, ``dtype``, ``shape``, ``stride``, ``is_contiguous``, ``get_device``,
``is_cuda``, ``device``, ``view``), ``torch.empty`` and ``torch.empty_like`` (a bump
allocator of fake 512-byte aligned addresses), ``torch.nn.Parameter`` and the current-stream
getters. Nothing is ever dereferenced. Install it with :func:`install` (tests:
``monkeypatch.setitem(sys.modules, "torch", fake_torch.module())``), never where real torch
tests run in the same process.
"""

from __future__ import annotations

import itertools
import types
from typing import Any

_ITEMSIZE = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float64": 8,
}  # fmt: skip


class dtype:  # mirrors torch.dtype
    def __init__(self, name: str, itemsize: int) -> None:
        self.name = name
        self.itemsize = itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


DTYPES = {name: dtype(name, size) for name, size in _ITEMSIZE.items()}


class Size(tuple):
    pass


class device:  # mirrors torch.device
    def __init__(self, kind: str, index: int | None = None) -> None:
        self.type = kind
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __repr__(self) -> str:
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


_next_address = itertools.count(1)


def _allocate(nbytes: int) -> int:
    # distinct, 512-byte aligned, far apart: like the caching allocator's blocks
    return 0x7F0000000000 + next(_next_address) * max(1 << 20, -(-nbytes // 512) * 512)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(s, 1)
    return tuple(reversed(strides))


class Tensor:
    """A CUDA (or CPU, ``device=-1``) tensor that only describes memory. Strides in elements."""

    __module__ = "torch"

    def __init__(
        self, shape: Any, dtype: dtype, ptr: int | None = None, device: int = 0,
        strides: tuple[int, ...] | None = None,
    ) -> None:  # fmt: skip
        self.shape = Size(int(s) for s in shape)
        self.dtype = dtype
        n = self.numel()
        self._ptr = _allocate(n * dtype.itemsize) if ptr is None else ptr
        self._device = device
        self.is_cuda = device >= 0
        self._strides = tuple(strides) if strides is not None else _contiguous_strides(self.shape)
        self._contiguous = all(
            size == 1 or stride == want
            for size, stride, want in zip(
                self.shape, self._strides, _contiguous_strides(self.shape), strict=True
            )
        )

    @property
    def device(self) -> device:
        return device("cuda", self._device) if self.is_cuda else device("cpu")

    def data_ptr(self) -> int:
        return self._ptr

    def get_device(self) -> int:
        return self._device

    def stride(self) -> tuple[int, ...]:
        return self._strides

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def is_contiguous(self) -> bool:
        return self._contiguous

    def view(self, dtype: dtype) -> Tensor:
        if dtype.itemsize != self.dtype.itemsize:
            raise NotImplementedError("fake view keeps the element size")
        return Tensor(self.shape, dtype, self._ptr, self._device, self._strides)

    def __repr__(self) -> str:
        return f"FakeTensor({tuple(self.shape)}, {self.dtype}, 0x{self._ptr:x}, {self.device})"


class Parameter(Tensor):
    __module__ = "torch.nn.parameter"


class Stream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


def module(current_stream: int = 0) -> types.ModuleType:
    """A fresh fake ``torch`` module; ``module().streams[device]`` is each device's current
    stream handle (``current_stream`` for any device not set)."""
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0+fake"
    for name, dt in DTYPES.items():
        setattr(torch, name, dt)
    torch.dtype = dtype
    torch.Size = Size
    torch.device = device
    torch.Tensor = Tensor
    torch.nn = types.SimpleNamespace(Parameter=Parameter)
    streams: dict[int, int] = {}
    torch.streams = streams

    def raw_stream(index: int) -> int:
        return streams.get(index, current_stream)

    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=raw_stream)
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: True,
        current_device=lambda: 0,
        current_stream=lambda index=0: Stream(raw_stream(index)),
        Stream=Stream,
    )

    def empty(*size: Any, dtype: dtype, device: Any = None) -> Tensor:
        if not size:  # as torch's: a 0-d tensor is empty(())
            raise TypeError('empty() missing 1 required positional arguments: "size"')
        index = device.index if isinstance(device, type(torch.device("cuda", 0))) else 0
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        return Tensor(shape, dtype, device=index or 0)

    def empty_like(t: Tensor, *, dtype: dtype | None = None) -> Tensor:
        return Tensor(t.shape, t.dtype if dtype is None else dtype, device=t.get_device())

    torch.empty = empty
    torch.empty_like = empty_like
    return torch
