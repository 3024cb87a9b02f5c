"""Array and stream protocols: what a kernel argument is, where it lives, and its stream.

Accepted arrays: PyTorch tensors (read through their own attributes, the fastest path),
anything with ``__cuda_array_interface__`` (CuPy, Numba, :class:`~nvrtc_engine.DeviceBuffer`)
and anything with ``__dlpack__``/``__dlpack_device__`` (JAX and others). bf16 and FP8 have no
standard typestr, so raw storage is accepted for them: ``uint8`` arrays hold FP8 bytes (as
TransformerEngine's ``Float8Tensor`` does) and ``uint16`` arrays in ``__cuda_array_interface__``
hold bf16.

Streams: ``None`` (PyTorch's current stream when the arrays are tensors, CuPy's current
stream for CuPy arrays, else the legacy default stream 0), an ``int`` handle, an object with
``__cuda_stream__`` (the cuda.core protocol), a ``torch.cuda.Stream``, a CuPy stream, or a
``cuda.bindings`` ``CUstream``.
"""

from __future__ import annotations

import functools
import reprlib
import sys
from collections.abc import Mapping
from operator import index
from typing import Any

from .dtypes import DTYPES, DType
from .errors import ArgumentError, ArgumentTypeError

__all__ = [
    "TORCH_TYPES",
    "Array",
    "allocate_bytes",
    "allocate_like",
    "as_array",
    "explicit_stream",
    "stream_handle",
    "torch_stream_getter",
]

_TYPESTR_DTYPES: dict[str, tuple[str, ...]] = {
    "<f4": ("fp32",), "<f2": ("fp16",), "<u2": ("bf16",), "|u1": ("fp8_e4m3", "fp8_e5m2"),
    "<V2": ("bf16",),
}  # fmt: skip
_DLPACK_DTYPES: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 32): ("fp32",), (2, 16): ("fp16",), (4, 16): ("bf16",),
    (10, 8): ("fp8_e4m3",), (12, 8): ("fp8_e5m2",), (1, 8): ("fp8_e4m3", "fp8_e5m2"),
}  # fmt: skip
_TORCH_DTYPES: dict[Any, tuple[str, ...]] = {}
# Exactly torch.Tensor and torch.nn.Parameter once PyTorch has been seen (filled by the first
# tensor argument): the classes whose calls may be prepared (nvrtc_engine.core.launch; subclasses,
# e.g. wrapper tensors, take the checked path).
TORCH_TYPES: set[type] = set()


class Array:
    """What a kernel needs to know about one array argument.

    Attributes: ``ptr`` (device address), ``shape``, ``dtypes`` (engine dtype names whose
    bytes the array holds: one name, or several for raw uint8 storage), ``dtype_text`` (the
    array's own dtype, for messages), ``device`` (ordinal, or -1 if not known yet),
    ``contiguous`` (C order), ``kind`` (``"torch"``, ``"cupy"`` or ``"other"``) and ``obj``.
    """

    __slots__ = ("_dtype", "contiguous", "device", "dtypes", "kind", "obj", "ptr", "shape")

    def __init__(
        self, ptr: int, shape: tuple[int, ...], dtypes: tuple[str, ...], dtype: Any,
        device: int, contiguous: bool, kind: str, obj: Any,
    ) -> None:  # fmt: skip
        self.ptr = ptr
        self.shape = shape
        self.dtypes = dtypes
        self._dtype = dtype
        self.device = device
        self.contiguous = contiguous
        self.kind = kind
        self.obj = obj

    @property
    def dtype_text(self) -> str:
        """The array's own dtype as text (for error messages): an array-interface typestr
        with numpy's name for it (``"<u2 (uint16)"``; raw bytes, ``V``, stay bare)."""
        text = str(self._dtype)
        if isinstance(self._dtype, str) and text[:1] in "<>|=" and text[1:2] in "biufc":
            try:
                import numpy

                return f"{text} ({numpy.dtype(text).name})"
            except (ImportError, TypeError):
                pass
        return text

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _c_contiguous(shape: tuple[int, ...], strides: Any, itemsize: int) -> bool:
    """Whether an array of ``shape`` with byte ``strides`` (None: C order) is C-contiguous.
    Raises ``ValueError`` when ``strides`` has not one entry per dimension."""
    if strides is None:
        return True
    strides = tuple(strides)
    if len(strides) != len(shape):
        raise ValueError(f"{len(strides)} strides for {len(shape)} dimensions")
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _torch_dtypes(torch: Any) -> dict[Any, tuple[str, ...]]:
    if not _TORCH_DTYPES:
        for d in DTYPES.values():
            t = getattr(torch, d.torch_name, None)
            if t is not None:
                _TORCH_DTYPES[t] = (d.name,)
        _TORCH_DTYPES[torch.uint8] = ("fp8_e4m3", "fp8_e5m2")
    return _TORCH_DTYPES


def _from_torch(obj: Any, name: str) -> Array:
    device = obj.get_device()  # -1 for CPU tensors
    if device < 0 or not obj.is_cuda:
        raise ArgumentError(name, f"is a {obj.device} tensor; kernels need CUDA tensors (.cuda())")
    dt = obj.dtype
    dtypes = _TORCH_DTYPES.get(dt)
    if dtypes is None:
        dtypes = _torch_dtypes(sys.modules["torch"]).get(dt, ())
    cls = type(obj)
    if cls not in TORCH_TYPES:
        torch = sys.modules["torch"]
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            TORCH_TYPES.add(cls)
    return Array(obj.data_ptr(), tuple(obj.shape), dtypes, dt, device, obj.is_contiguous(),
                 "torch", obj)  # fmt: skip


def _from_cai(obj: Any, name: str, kind: str) -> Array:
    """Describe ``obj`` from its ``__cuda_array_interface__``. Raises
    :class:`~nvrtc_engine.ArgumentTypeError` naming ``name`` and the part of the interface
    at fault when it is malformed (not a dict, an entry missing or of the wrong type, a size
    that is a bool, negative or not below 2**63, a ``data`` that is not a pair, a pointer
    that is a bool or not from 0 to 2**64 - 1)."""
    cai = obj.__cuda_array_interface__
    try:  # (no cost unless it raises: the diagnosis is left to the error path)
        sizes = cai["shape"]
        shape = tuple(map(index, sizes))  # ints only ("12" is no shape (1, 2))
        # a size that is negative or beyond int64, or a bool (looked for only where a size
        # is 0 or 1, as a bool's would be)
        if shape and ((low := min(shape)) < 0 or max(shape) >= 2**63
                      or (low <= 1 and bool in map(type, sizes))):  # fmt: skip
            raise ValueError("a size out of range, or a bool")
        typestr = cai["typestr"]
        address, _ = cai["data"]  # exactly a (pointer, read_only) pair
        ptr = index(address)
        if not 0 <= ptr < 2**64 or address.__class__ is bool:
            raise ValueError("a pointer out of range, or a bool")
        itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
        contiguous = _c_contiguous(shape, cai.get("strides"), itemsize)
    except (AttributeError, IndexError, KeyError, OverflowError, TypeError, ValueError) as exc:
        raise ArgumentTypeError(name, f"has a malformed __cuda_array_interface__: "
                                f"{_cai_problem(cai, exc)}") from exc  # fmt: skip
    device = -1
    if kind == "cupy":
        device = int(obj.device.id)
    return Array(ptr, shape, _TYPESTR_DTYPES.get(typestr, ()), typestr, device, contiguous,
                 kind, obj)  # fmt: skip


def _is_int(value: Any) -> bool:
    """Whether ``value`` is an integer as ``operator.index`` takes it (numpy's too), and not
    a bool (nor a float or a string)."""
    return hasattr(type(value), "__index__") and not isinstance(value, bool)


def _ints(value: Any) -> bool:
    """Whether ``value`` is a tuple (or list) of integers."""
    return isinstance(value, (tuple, list)) and all(map(_is_int, value))


def _cai_problem(cai: Any, exc: BaseException) -> str:
    """What is wrong with a ``__cuda_array_interface__`` that could not be read (``exc``
    is what reading it raised), for the error message: its first faulty part."""
    shown = reprlib.repr
    if not isinstance(cai, Mapping):
        return f"it is {type(cai).__qualname__} {shown(cai)}, not a dict"
    missing = [entry for entry in ("shape", "typestr", "data") if entry not in cai]
    if missing:
        has = shown(sorted(map(str, cai)))
        return f"it has no {', '.join(map(repr, missing))} entry (its entries: {has})"
    shape, typestr, data = cai["shape"], cai["typestr"], cai["data"]
    if not _ints(shape) or any(size < 0 for size in shape):
        return f"'shape' must be a tuple of ints >= 0, got {shown(shape)}"
    if any(size >= 2**63 for size in shape):
        return f"'shape' must hold sizes below 2**63, got {shown(shape)}"
    if not isinstance(typestr, str):
        return f"'typestr' must be a str such as '<f4', got {shown(typestr)}"
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and _is_int(data[0])):
        return f"'data' must be a (pointer, read_only) tuple with an int pointer, got {shown(data)}"
    if not 0 <= index(data[0]) < 2**64:
        return f"'data' must hold a pointer from 0 to 2**64 - 1, got {shown(data)}"
    strides = cai.get("strides")
    if strides is not None and not (_ints(strides) and len(strides) == len(shape)):
        return (f"'strides' must be None or a tuple of {len(shape)} ints (one per dimension), "
                f"got {shown(strides)}")  # fmt: skip
    return f"{type(exc).__name__}: {exc}"


@functools.cache
def _dlpack_structs() -> tuple[Any, Any]:
    """ctypes views of DLPack's DLTensor and PyCapsule_GetPointer, built on first use."""
    import ctypes

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
            ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
            ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
        ]  # fmt: skip

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return DLTensor, get


def _from_dlpack(obj: Any, name: str) -> Array:
    """Describe ``obj`` from its DLPack capsule (not consumed). Raises
    :class:`~nvrtc_engine.ArgumentTypeError` naming ``name`` when ``__dlpack_device__()`` is
    no ``(device_type, device_id)`` pair of ints or ``__dlpack__()`` no DLPack capsule, and
    :class:`~nvrtc_engine.ArgumentError` for a device that is not CUDA's."""
    device = obj.__dlpack_device__()
    try:
        dev_type, dev_id = device
        dev_type, dev_id = int(dev_type), int(dev_id)
    except (OverflowError, TypeError, ValueError):
        raise ArgumentTypeError(name, "has a malformed __dlpack_device__(): expected a "
                                "(device_type, device_id) pair of ints, got "
                                f"{reprlib.repr(device)}") from None  # fmt: skip
    if dev_type not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise ArgumentError(name, f"lives on DLPack device type {dev_type}, not a CUDA device")
    dl_tensor, get_pointer = _dlpack_structs()
    capsule = obj.__dlpack__()
    try:
        address = get_pointer(capsule, b"dltensor")
    except ValueError as exc:  # not a capsule, or one already consumed ("used_dltensor")
        what = type(capsule).__qualname__
        raise ArgumentTypeError(name, f"__dlpack__() returned {what}, not an unconsumed "
                                f"DLPack 'dltensor' capsule ({exc})") from None  # fmt: skip
    tensor = dl_tensor.from_address(address)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    itemsize = max(1, tensor.dtype.bits // 8)
    strides = None
    if tensor.strides:
        strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim))
    code = (tensor.dtype.code, tensor.dtype.bits)
    dtypes = _DLPACK_DTYPES.get(code, ()) if tensor.dtype.lanes == 1 else ()
    ptr = (tensor.data or 0) + tensor.byte_offset
    del tensor, capsule  # unconsumed: the capsule's destructor releases the producer's reference
    return Array(ptr, shape, dtypes, f"dlpack{code}", int(dev_id),
                 _c_contiguous(shape, strides, itemsize), "other", obj)  # fmt: skip


def as_array(obj: Any, name: str) -> Array:
    """Describe array argument ``name``.

    Raises :class:`~nvrtc_engine.ArgumentTypeError` if ``obj`` is not a CUDA array of an
    accepted kind, :class:`~nvrtc_engine.ArgumentError` if it lives in host memory.
    """
    cls = type(obj)
    module = cls.__module__
    if module.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name, "cupy" if module.startswith("cupy") else "other")
    if hasattr(obj, "__array_interface__"):
        raise ArgumentError(name, "is a host (numpy) array; copy it to the GPU first")
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name)
    raise ArgumentTypeError(
        name,
        f"expected a CUDA array (torch.Tensor, CuPy array, or an object with "
        f"__cuda_array_interface__ or __dlpack__), got {cls.__module__}.{cls.__qualname__}",
    )


def allocate_like(like: Array, shape: tuple[int, ...], dtype: DType, name: str = "out") -> Any:
    """A new array of ``shape``/``dtype`` on ``like``'s device, from ``like``'s library.

    PyTorch gets its own dtype (``torch.float8_e4m3fn``...); CuPy gets raw storage for bf16
    and FP8 (``uint16``/``uint8``). Raises :class:`~nvrtc_engine.ArgumentTypeError` naming
    ``name`` when ``like``'s library cannot allocate (pass the output explicitly).
    """
    lib = _library(like, name, "its output")
    if like.kind == "torch":
        return lib.empty(shape, dtype=getattr(lib, dtype.torch_name), device=like.obj.device)
    storage = {"bf16": "uint16", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8"}
    with lib.cuda.Device(like.device):
        return lib.empty(shape, dtype=storage.get(dtype.name, dtype.numpy_name))


def allocate_bytes(like: Array, shape: tuple[int, ...], name: str, what: str = "it") -> Any:
    """An uninitialized ``uint8`` array of ``shape`` on ``like``'s device, from its library
    (block scales, packed FP4 data, workspaces).

    Raises :class:`~nvrtc_engine.ArgumentTypeError` naming ``name`` when the input's library
    cannot allocate (``what`` says what the caller should pass instead).
    """
    lib = _library(like, name, what)
    if like.kind == "torch":
        return lib.empty(shape, dtype=lib.uint8, device=like.obj.device)
    with lib.cuda.Device(like.device):
        return lib.empty(shape, dtype="uint8")


def _library(like: Array, name: str, what: str) -> Any:
    """The module (torch or cupy) that allocates beside ``like``; raises
    :class:`~nvrtc_engine.ArgumentTypeError` naming ``name`` when there is none (another
    library's array, or an object that only claims to be CuPy's while CuPy is not loaded)."""
    lib = sys.modules.get(like.kind) if like.kind in ("torch", "cupy") else None
    if lib is None:
        why = (
            "the input claims to be a CuPy array but CuPy is not loaded"
            if like.kind == "cupy"
            else "the input is neither a torch tensor nor a CuPy array"
        )
        raise ArgumentTypeError(name, f"is required: {why}, so the kernel cannot allocate {what}")
    return lib


def stream_handle(stream: Any, like: Array) -> int:
    """The ``CUstream`` handle (an int) to launch on; see the module docstring for defaults.

    Raises :class:`~nvrtc_engine.ArgumentTypeError` for anything that is not a stream.
    """
    if stream is None:
        if like.kind == "torch":
            return int(torch_stream_getter()(like.device))
        cupy = sys.modules.get("cupy") if like.kind == "cupy" else None
        return 0 if cupy is None else int(cupy.cuda.get_current_stream().ptr)
    return explicit_stream(stream)


def explicit_stream(stream: Any) -> int:
    """The handle of a stream given explicitly (anything but None; see the module docstring).

    Raises :class:`~nvrtc_engine.ArgumentTypeError` for anything that is not a stream.
    """
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1] if isinstance(value, tuple) else value)
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return handle
    if type(stream).__name__ == "CUstream":
        return int(stream)
    raise ArgumentTypeError(
        "stream",
        "expected None, an int handle, an object with __cuda_stream__, a torch.cuda.Stream, "
        f"a CuPy stream or a CUstream; got {type(stream).__qualname__}",
    )


_raw_stream: Any = None


def torch_stream_getter() -> Any:
    """``device -> handle`` of PyTorch's current stream on a device: the cheapest call there
    is (``torch._C._cuda_getCurrentRawStream``), or ``torch.cuda.current_stream`` where
    that private function is missing. PyTorch must be imported."""
    global _raw_stream
    if _raw_stream is None:
        torch = sys.modules["torch"]
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if getter is None:
            current = torch.cuda.current_stream

            def getter(device: int) -> int:
                return int(current(device).cuda_stream)

        _raw_stream = getter
    return _raw_stream
