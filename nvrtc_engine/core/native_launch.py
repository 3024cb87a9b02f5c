"""The compiled launcher: a prepared launch's per-call work in C (``_native_launch.c``).

The wheel's build compiles it (nvrtc_engine/_build_hook.py; never the package at run time).
Where it loads and ``NVRTC_ENGINE_NATIVE_LAUNCH`` is on (the default), each kernel made
afterwards reads its call keys in C (``Kernel._fast1``, ``_fast2``, ``_fast3``, ``_fastn``
become the C ``Launcher``'s) and its prepared launches (:func:`nvrtc_engine.launch.prepare`)
are C ``Plan``\\ s: a call's tensor addresses, allocated outputs (the same one
``torch.empty_like``/``torch.empty`` call each), offsets and floats are written into each
launch's parameter slots on the C stack, and ``cuLaunchKernelEx`` is called through the
address ``cuGetProcAddress`` gave (no CUDA headers or libcuda at build time). Everything
else stays in Python: the checked path, which makes every key's first call and raises every
argument error, and the rare paths of a call (switching the context, a stream object, a
refused launch's :class:`~nvrtc_engine.CudaError`).

PyTorch's builtins are called through their C functions, without Python's call protocol:
``torch.empty_like``/``torch.empty`` and the current-stream getter a Plan holds, and what a
call's key reads from a tensor (its ``data_ptr``, ``get_device`` and ``is_contiguous``
methods' C functions, its ``dtype`` and ``shape`` getters), found once per tensor class, the
first time the launcher meets one: a method then patched onto ``torch.Tensor`` is not seen;
one patched before, as bench/launch_overhead.py --stub patches ``get_device``, is called as
it is.

Without it, :mod:`nvrtc_engine.launch` does the same work in Python: the same call keys,
parameter bytes and errors (tests/test_launch_stub.py runs both).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import config, driver
from .errors import CudaError
from .interop import TORCH_TYPES, explicit_stream, torch_stream_getter

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["bind", "loaded", "plan", "unavailable"]

_ext: Any = None
unavailable: str | None = None  # why the compiled launcher is not used (None: it is)
try:
    from . import _native_launch as _ext  # type: ignore[attr-defined,no-redef]
except ImportError as exc:
    unavailable = f"not built ({exc})"
else:
    # beside its source (an editable install), an extension built from another version of
    # it is not used: `pip install -e .` again rebuilds it
    _source = Path(__file__).with_name("_native_launch.c")
    if _source.is_file():
        digest = hashlib.sha256(_source.read_bytes()).hexdigest()[:16]
        if digest != _ext.SOURCE_DIGEST:
            unavailable = "built from another version of _native_launch.c (reinstall)"
            _ext = None

_setup_lock = threading.Lock()
_set_up = False


def loaded() -> bool:
    """Whether the compiled launcher loaded (see :data:`unavailable` when not)."""
    return _ext is not None


def bind(kernel: Any) -> bool:
    """Give ``kernel`` the C launcher's call-key reads (its ``_fast1``... as instance
    attributes) when the compiled launcher loaded and ``NVRTC_ENGINE_NATIVE_LAUNCH`` is on;
    whether it did (``Kernel._native``: its launches are then prepared as C plans)."""
    if _ext is None or not config.settings().native_launch:
        return False
    launcher = _ext.Launcher(kernel, TORCH_TYPES)
    kernel._fast1, kernel._fast2 = launcher.fast1, launcher.fast2
    kernel._fast3, kernel._fastn = launcher.fast3, launcher.fastn
    return True


def _setup() -> None:
    """Hand the C launcher the driver's cuLaunchKernelEx and cuCtxGetCurrent (once)."""
    global _set_up
    with _setup_lock:
        if _set_up:
            return
        drv = driver._drv()
        flags = drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        addresses = []
        for name in ("cuLaunchKernelEx", "cuCtxGetCurrent", "cuCtxSetCurrent"):
            got = driver.check(drv.cuGetProcAddress(name.encode(), 12000, flags),
                               "cuGetProcAddress")  # fmt: skip
            address = int(got[0] if isinstance(got, tuple) else got)
            if not address:
                raise CudaError("cuGetProcAddress", 500, "CUDA_ERROR_NOT_FOUND", name)
            addresses.append(address)
        _ext.setup(*addresses, driver.check, explicit_stream)
        _set_up = True


def plan(
    ngiven: int, allocs: Sequence[tuple[Any, ...]], row: dict[int, int],
    prepared: Sequence[tuple[bytes, tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]]],
    shapes: Sequence[tuple[Any, int, int, int, bool]], nfloats: int, device: driver.Device,
) -> Any:  # fmt: skip
    """The C ``Plan`` of a prepared launch (:func:`nvrtc_engine.launch.prepare`, whose
    arguments these are: ``allocs`` as its ``(like, same dtype, sizes, dtype, device,
    residue)``, ``row`` its CallArgs index -> address row, ``prepared`` each launch's
    :meth:`~nvrtc_engine.signature.Signature.prepare`, ``shapes`` each launch's
    ``(function, grid, block, shared memory, dependent)``): callable as the pure path's
    ``run(tensors, ptrs, floats, stream)``, and run without that call by the C
    ``Launcher``."""
    _setup()
    torch = sys.modules["torch"]
    c_allocs = []
    for like, same_dtype, sizes, dtype, where, residue in allocs:
        if like is None:
            c_allocs.append((-1, sizes, {"dtype": dtype, "device": where}, residue))
        else:
            c_allocs.append((like, None, None if same_dtype else {"dtype": dtype}, residue))
    launches = tuple(
        (int(function), grid, block, shmem, int(dependent), constants,
         tuple((slot, row[i], offset) for slot, i, offset in refs), floats)
        for (function, grid, block, shmem, dependent), (constants, refs, floats)
        in zip(shapes, prepared, strict=True)
    )  # fmt: skip
    return _ext.Plan(ngiven, tuple(c_allocs), launches, nfloats, int(device.context),
                     device.ordinal, torch_stream_getter(), torch.empty,
                     torch.empty_like)  # fmt: skip
