"""The CUDA driver layer: devices, primary contexts and modules (launches:
:mod:`nvrtc_engine.core.launch`).

Through ``cuda.bindings.driver``. Nothing happens at import: the driver is initialized on the
first call that needs it, once per process (a forked child initializes its own). Each device
is used through its primary context, the one PyTorch and CuPy share, so memory and streams
from either library work with kernels launched here.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ArgumentError, ArgumentTypeError, CudaError, NoDeviceError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "Device",
    "DeviceBuffer",
    "current_device",
    "device_count",
    "get_device",
    "load_function",
    "make_current",
    "on_device",
    "pointer_device",
    "synchronize",
    "time_launches",
]

_lock = threading.Lock()
_init_pid: int | None = None
_init_error: BaseException | None = None
_devices: dict[int, Device] = {}


_bindings: Any = None


def _drv() -> Any:
    """``cuda.bindings.driver``, imported on first use."""
    global _bindings
    if _bindings is None:
        from cuda.bindings import driver

        _bindings = driver
    return _bindings


def check(result: Any, call: str) -> Any:
    """Raise :class:`CudaError` unless ``result`` (a cuda.bindings result tuple) is success."""
    err = result[0]
    if int(err) != 0:
        drv = _drv()
        try:
            name = drv.CUresult(int(err)).name
        except Exception:
            name = str(err)
        try:
            _, desc = drv.cuGetErrorString(err)
        except Exception:  # a code cuda.bindings has no enum member for
            desc = None
        detail = desc.decode() if isinstance(desc, bytes) else ""
        raise CudaError(call, int(err), name, detail)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _init() -> None:
    """cuInit once per process; remembers a failure so later calls fail fast."""
    global _init_pid, _init_error
    pid = os.getpid()
    if _init_pid != pid:
        with _lock:
            if _init_pid != pid:
                _devices.clear()  # handles from a parent process are not valid after fork
                try:
                    check(_drv().cuInit(0), "cuInit")
                    _init_error = None
                except Exception as exc:  # no libcuda, no device, or a broken driver
                    _init_error = exc
                _init_pid = pid
    if _init_error is not None:
        raise NoDeviceError(f"no usable CUDA driver or device: {_init_error}")


def device_count() -> int:
    """Number of visible CUDA devices; 0 when there is no driver or no device (never raises)."""
    try:
        _init()
        return int(check(_drv().cuDeviceGetCount(), "cuDeviceGetCount"))
    except (NoDeviceError, CudaError):
        return 0


class Device(NamedTuple):
    """A CUDA device and its retained primary context.

    Attributes: ``ordinal``, ``name``, ``major``/``minor`` (compute capability),
    ``sm_count`` (multiprocessors), ``handle`` (``CUdevice``) and ``context`` (``CUcontext``).
    """

    ordinal: int
    name: str
    major: int
    minor: int
    sm_count: int
    handle: Any
    context: Any

    @property
    def arch(self) -> str:
        """The device's arch as a key field, e.g. ``sm_90`` (no ``a`` suffix)."""
        return f"sm_{self.major}{self.minor}"


MAX_ORDINAL = 2**31 - 1  # a CUdevice ordinal is a C int


def checked_ordinal(device: Any) -> int:
    """``device`` as a CUDA device ordinal: an int from 0 to :data:`MAX_ORDINAL` (numpy's
    integers too; never a bool), checked without the driver. Raises
    :class:`~nvrtc_engine.ArgumentTypeError` for another type and
    :class:`~nvrtc_engine.ArgumentError` for a value out of that range, both naming
    ``device``."""
    accepted = f"a CUDA device ordinal is an int from 0 to {MAX_ORDINAL}"
    if isinstance(device, bool) or not isinstance(device, numbers.Integral):
        raise ArgumentTypeError("device", f"{accepted}, not {type(device).__name__}")
    if not 0 <= device <= MAX_ORDINAL:
        raise ArgumentError("device", f"{accepted}, got {device}")
    return int(device)


def get_device(ordinal: int) -> Device:
    """The :class:`Device` for ``ordinal``, retaining its primary context on first use.

    Raises :class:`~nvrtc_engine.ArgumentTypeError` or :class:`~nvrtc_engine.ArgumentError`
    for what is no ordinal (:func:`checked_ordinal`, before the driver is asked),
    :class:`NoDeviceError` when there is no driver/device, :class:`~nvrtc_engine.ArgumentError`
    (a ``ValueError``) for an ordinal beyond the visible devices.
    """
    dev = _devices.get(ordinal)
    if dev is not None and _init_pid == os.getpid():
        return dev
    ordinal = checked_ordinal(ordinal)
    _init()
    drv = _drv()
    with _lock:
        dev = _devices.get(ordinal)
        if dev is not None:
            return dev
        count = int(check(drv.cuDeviceGetCount(), "cuDeviceGetCount"))
        if not 0 <= ordinal < count:
            raise ArgumentError("device", f"device {ordinal} does not exist; {count} visible")
        handle = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        major = check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle),
            "cuDeviceGetAttribute",
        )
        minor = check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle),
            "cuDeviceGetAttribute",
        )
        sms = check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, handle),
            "cuDeviceGetAttribute",
        )
        raw_name = check(drv.cuDeviceGetName(256, handle), "cuDeviceGetName")
        ctx = check(drv.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
        dev = Device(ordinal, raw_name.split(b"\0", 1)[0].decode(), int(major), int(minor),
                     int(sms), handle, ctx)  # fmt: skip
        _devices[ordinal] = dev
        return dev


def current_device() -> int:
    """The ordinal of the calling thread's current device.

    The device of the current CUDA context if there is one (PyTorch and CuPy make theirs
    current), else PyTorch's current device if PyTorch has initialized CUDA, else 0. Raises
    :class:`NoDeviceError` when there is no device.
    """
    _init()
    drv = _drv()
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is not None and int(ctx) != 0:
        return int(check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    if device_count() == 0:
        raise NoDeviceError("no CUDA device is visible")
    return 0


def make_current(dev: Device) -> Any:
    """Make ``dev``'s primary context current on this thread if it is not already; returns
    the context to make current again afterwards (the thread's previous one, a null
    ``CUcontext`` where none was), or None where ``dev``'s already was. Use
    :func:`on_device`, which does both.

    One ``cuCtxGetCurrent`` per call (PyTorch, CuPy or the caller may have switched the
    thread's context since the last launch, so the answer is never cached).
    """
    drv = _drv()
    previous = drv.cuCtxGetCurrent()[1]
    if previous == dev.context:
        return None
    check(drv.cuCtxSetCurrent(dev.context), "cuCtxSetCurrent")
    return previous


@contextlib.contextmanager
def on_device(dev: Device) -> Iterator[None]:
    """``dev``'s primary context current on this thread inside the block, the thread's
    previous context (or none) current again after it, as PyTorch's device guard does: work
    on another device's memory leaves the caller's current device (``torch.cuda.current_device()``,
    CuPy's, :func:`current_device`, which all follow the current context) as it was."""
    previous = make_current(dev)
    try:
        yield
    finally:
        if previous is not None:
            check(_drv().cuCtxSetCurrent(previous), "cuCtxSetCurrent")


def load_function(dev: Device, image: bytes, symbol: str) -> tuple[Any, Any]:
    """Load a cubin/PTX image into ``dev``'s primary context; return (module, function)."""
    drv = _drv()
    with on_device(dev):
        module = check(drv.cuModuleLoadData(image), "cuModuleLoadData")
        function = check(drv.cuModuleGetFunction(module, symbol.encode()), "cuModuleGetFunction")
    return module, function


def pointer_device(ptr: int) -> int:
    """The device ordinal owning device pointer ``ptr``.

    Raises ``ValueError`` when ``ptr`` is not device memory CUDA knows of (e.g. host memory).
    """
    _init()
    drv = _drv()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, value = drv.cuPointerGetAttribute(attr, ptr)
    if int(err) != 0:
        raise ValueError(f"0x{ptr:x} is not a CUDA device pointer")
    return int(value)


def synchronize(dev: Device) -> None:
    """Wait for all work on ``dev``."""
    with on_device(dev):
        check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")


class DeviceBuffer:
    """Device memory from ``cuMemAlloc``, for callers without PyTorch or CuPy (the demo).

    Exposes ``__cuda_array_interface__`` so kernels accept it like any array. ``dtype`` is a
    dtype name, alias or dtype object, as everywhere else (``"bf16"``, ``"fp8"``,
    ``numpy.float32``); the buffer's ``dtype`` is the :class:`~nvrtc_engine.DType` (FP8 and
    bf16 buffers show as uint8/uint16 typestrs).

    Raises, before the device is asked: :class:`~nvrtc_engine.ArgumentError` naming
    ``dtype`` for a dtype the engine has not, or ``shape`` for a negative size, and
    :class:`~nvrtc_engine.ArgumentTypeError` naming ``dtype`` for a value that is no dtype
    at all (``[]``, ``16``) or ``shape`` for one that is not a tuple of ints.
    """

    def __init__(self, device: int, shape: tuple[int, ...], dtype: Any) -> None:
        from .dtypes import DTYPES, dtype_name
        from .errors import VariantError, VariantTypeError

        try:
            name = dtype_name(dtype, "dtype")
        except VariantError as exc:  # a key field's error: here it is a call argument's
            error = ArgumentTypeError if isinstance(exc, VariantTypeError) else ArgumentError
            raise error("dtype", f"{dtype!r} {exc.detail}") from None
        if not isinstance(shape, tuple) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape
        ):
            raise ArgumentTypeError("shape", f"a tuple of ints >= 0, got {shape!r}")
        if any(s < 0 for s in shape):
            raise ArgumentError("shape", f"a tuple of ints >= 0, got {shape!r}")
        self.device = get_device(device)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = DTYPES[name]
        count = 1
        for s in self.shape:
            count *= s
        self.nbytes = max(1, count * self.dtype.itemsize)
        with on_device(self.device):
            self.ptr = int(check(_drv().cuMemAlloc(self.nbytes), "cuMemAlloc"))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = self.dtype.typestrs[0] if self.dtype.typestrs else self.dtype.storage_typestr
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "version": 3, "strides": None}  # fmt: skip

    def copy_from_host(self, array: Any) -> None:
        """Copy a C-contiguous host array of exactly ``nbytes`` bytes into the buffer."""
        import numpy as np

        host = np.ascontiguousarray(array)
        if host.nbytes != self.nbytes:
            raise ValueError(f"host array has {host.nbytes} bytes, buffer {self.nbytes}")
        with on_device(self.device):
            check(_drv().cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def to_host(self) -> Any:
        """The buffer's contents as a numpy array of its dtype (ml_dtypes for bf16/FP8)."""
        import numpy as np

        out = np.empty(self.shape, dtype=self.dtype.numpy())
        with on_device(self.device):
            check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")
            check(_drv().cuMemcpyDtoH(out.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return out

    def fill_bytes(self, value: int) -> None:
        """Set every byte to ``value`` (to poison outputs before a launch)."""
        with on_device(self.device):
            check(_drv().cuMemsetD8(self.ptr, value, self.nbytes), "cuMemsetD8")

    def free(self) -> None:
        if self.ptr:
            with on_device(self.device):
                check(_drv().cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.free()


def time_launches(dev: Device, fn: Any, repeat: int, warmup: int = 3) -> list[float]:
    """Run ``fn()`` (which launches on the legacy default stream) and time each run.

    Returns per-run milliseconds from CUDA events, after ``warmup`` untimed runs.
    """
    with on_device(dev):
        return _time_launches(fn, repeat, warmup)


def _time_launches(fn: Any, repeat: int, warmup: int) -> list[float]:
    drv = _drv()
    for _ in range(warmup):
        fn()
    start = check(drv.cuEventCreate(0), "cuEventCreate")
    stop = check(drv.cuEventCreate(0), "cuEventCreate")
    times = []
    try:
        for _ in range(repeat):
            check(drv.cuEventRecord(start, 0), "cuEventRecord")
            fn()
            check(drv.cuEventRecord(stop, 0), "cuEventRecord")
            check(drv.cuEventSynchronize(stop), "cuEventSynchronize")
            times.append(float(check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime")))
    finally:
        drv.cuEventDestroy(start)
        drv.cuEventDestroy(stop)
    return times
