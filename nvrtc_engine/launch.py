"""The launch path: the driver call, and launches prepared once per call key.

**The driver call** (:func:`launcher`): ``cuLaunchKernelEx`` through ``cuda.bindings`` with a
``CUlaunchConfig`` made once per launch shape and stream, carrying the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` for a programmatic dependent launch
(``Kernel._dependent``). bench/launch_candidates.py measured it against ``cuLaunchKernel``
through ``cuda.bindings``, ctypes calls of both and ``cuda.core``'s ``launch``; this function
is the one place that choice is made.

**Prepared launches** (:class:`Prepared`). A call whose array arguments are all torch tensors
(exactly ``torch.Tensor`` or ``nn.Parameter``) or None has a *call key* (``Kernel._fast``):
for each argument its type, dtype, shape, device index and contiguity (None where omitted),
the family's ``extra`` (what else its checks depend on) and the pointers' alignment (nothing
when all are 16-byte aligned, else each address modulo 16). Every check a family makes
depends only on that key and on its float arguments, which it checks on each call, so the
first call of a key takes the family's checked path, and its launches become the key's
:class:`Prepared`: the outputs to allocate, the device and its context, and per launch the
driver call, the parameters packed once (:meth:`Signature.prepare`) and the slots each call
writes. A later call of the key allocates what the caller left out (one ``torch.empty``
each), checks the current context (PyTorch or CuPy may switch it at any time), takes torch's
current stream unless given one, writes its pointers and floats into this thread's copy of
the parameters, and launches.

What a family reads from module-level launch settings (``activation.MAX_GRID``,
``norm_switches.FWD_ONE_PASS``...) is fixed in a prepared launch: code that changes them at run
time (tuning scripts) must use new ``Kernel`` objects or clear ``kernel._prepared``.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from . import driver
from .interop import explicit_stream, torch_stream_getter
from .signature import param_buffer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .signature import Signature

__all__ = ["MAX_PREPARED", "LaunchSpec", "Prepared", "launch", "launcher"]

MAX_PREPARED = 256  # prepared launches kept per kernel (per call key); the oldest go first

# A launch as a family describes it: (function index, grid, block, signature, values bound by
# name: numbers, Ref and FloatRef; see nvrtc_engine.signature)
LaunchSpec = tuple[int, int, int, "Signature", dict[str, Any]]


def launcher(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Callable[
    [int, int], None
]:  # fmt: skip
    """``go(stream, params)``: launch ``function`` (a ``CUfunction``) on a 1-D grid of
    ``grid`` blocks of ``block`` threads with ``shmem`` bytes of dynamic shared memory on
    stream handle ``stream`` (an int) with the parameters at ``params`` (the ``void*[]``
    address :meth:`Signature.pack` returns); ``dependent``: as a programmatic dependent
    launch (only for a kernel that waits for its grid dependency). Raises
    :class:`~nvrtc_engine.CudaError` when the driver refuses the launch.

    ``cuLaunchKernelEx`` through ``cuda.bindings``; its ``CUlaunchConfig`` is made once per
    stream handle (about 4 us each through ``cuda.bindings``)."""
    drv = driver._drv()
    launch_ex = drv.cuLaunchKernelEx
    configs: dict[int, Any] = {}

    def go(stream: int, params: int) -> None:
        config = configs.get(stream)
        if config is None:
            if len(configs) >= 64:  # streams come and go
                configs.clear()
            config = configs[stream] = launch_config(grid, block, shmem, stream, dependent)
        (err,) = launch_ex(config, function, params, 0)
        if err:
            driver.check((err,), "cuLaunchKernelEx")

    return go


def launch_config(grid: int, block: int, shmem: int, stream: int, dependent: bool) -> Any:
    """A ``CUlaunchConfig`` (cuda.bindings) for a 1-D launch on stream handle ``stream``; with
    ``dependent`` the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION is set:
    the kernel may start before the previous kernel of the stream completes and waits for
    it itself (``griddepcontrol.wait``, templates/include/nve_memory.cuh)."""
    drv = driver._drv()
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = shmem
    config.hStream = drv.CUstream(stream)
    if dependent:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
    else:
        config.numAttrs = 0
    return config


_launchers: dict[tuple[Any, ...], Callable[[int, int], None]] = {}


def launch(
    function: Any, grid: int, block: int, shmem: int, dependent: bool, stream: int, params: int
) -> None:
    """One launch through :func:`launcher` (made once per function and launch shape): the
    checked path's launches, which are not prepared."""
    key = (function, grid, block, shmem, dependent)
    go = _launchers.get(key)
    if go is None:
        if len(_launchers) >= 1024:  # shapes come and go
            _launchers.clear()
        go = _launchers[key] = launcher(function, grid, block, shmem, dependent)
    go(stream, params)


class Prepared:
    """The launches of one call key (see the module docstring), made by :meth:`build` from
    the launches of a call the family checked. ``run(tensors, ptrs, floats, stream,
    allocate=True)`` launches them for another call with that key: ``tensors`` its array
    arguments, ``ptrs`` their addresses (0 for None; the allocated outputs' are filled in),
    ``floats`` its float arguments; with ``allocate`` false, the outputs are in ``tensors``
    and ``ptrs`` already (the call that prepared). It returns ``tensors`` with the allocated
    outputs, or None, launching nothing, when an allocation is aligned otherwise than the
    key's. ``run`` is a closure over everything the key fixes (no attribute lookups, no
    method binding on the call)."""

    __slots__ = ("allocs", "device", "launches", "run")

    @classmethod
    def build(
        cls, kernel: Any, loaded: Any, given: Sequence[Any], tensors: Sequence[Any],
        ptrs: Sequence[int], launches: Sequence[LaunchSpec],
    ) -> Prepared | None:  # fmt: skip
        """The prepared form of ``launches``, which a checked call with arguments ``given``
        made (``tensors``: the arguments with the outputs it allocated, ``ptrs`` their
        addresses); None when they cannot be replayed: an argument or an allocated output
        that is not exactly a torch tensor, or a pointer parameter bound to an address of
        the family's own (:meth:`Signature.prepare`)."""
        from .interop import TORCH_TYPES

        self = cls()
        allocs = []
        for index, (arg, t) in enumerate(zip(given, tensors, strict=True)):
            if t is not None and type(t) not in TORCH_TYPES:
                return None
            if arg is None and t is not None:  # allocated by the checked path: by each call
                allocs.append((index, _like(given, t), tuple(t.shape), t.dtype, t.device,
                               ptrs[index] & 15))  # fmt: skip
        self.allocs = tuple(allocs)
        present = [t is not None for t in tensors]
        shared = kernel._shared
        out = []
        for index, grid, block, sig, bound in launches:
            prepared = sig.prepare(bound, present)
            if prepared is None:
                return None
            image, pointers, offsets, floats = prepared
            shmem = shared[index] if shared else 0
            go = launcher(loaded.functions[index], grid, block, shmem, kernel._dependent)
            out.append((go, threading.local(), image, pointers, offsets, floats))
        self.launches = tuple(out)
        self.device = loaded.device
        self.run = _runner(self.allocs, self.launches, loaded.device)
        return self


def _runner(allocs: tuple[Any, ...], launches: tuple[Any, ...], device: Any) -> Callable[..., Any]:
    """:attr:`Prepared.run` for these allocations and launches on ``device``."""
    get_context = driver._drv().cuCtxGetCurrent
    context, ordinal = device.context, device.ordinal
    current_stream = torch_stream_getter()
    make_current = driver.make_current

    def run(
        tensors: Sequence[Any], ptrs: list[int], floats: Sequence[float], stream: Any,
        allocate: bool = True,
    ) -> Sequence[Any] | None:  # fmt: skip
        if allocs and allocate:
            torch = sys.modules["torch"]
            tensors = list(tensors)
            for index, like, shape, dtype, where, residue in allocs:
                # one step each: empty_like where an input has the output's shape and dtype,
                # else empty with the sizes as ints (PyTorch parses a torch.Size slower)
                if like is None:
                    t = torch.empty(*shape, dtype=dtype, device=where)
                else:
                    t = torch.empty_like(tensors[like])
                p = t.data_ptr()
                if p & 15 != residue:
                    return None
                tensors[index] = t
                ptrs[index] = p
        if get_context()[1] != context:
            make_current(device)
        handle = current_stream(ordinal) if stream is None else explicit_stream(stream)
        for go, local, image, pointers, offsets, floats_at in launches:
            try:
                slots, values, address = local.views
            except AttributeError:
                _, slots, values, address = local.buffer = param_buffer(len(image), image)
                local.views = (slots, values, address)
            for slot, index in pointers:
                slots[slot] = ptrs[index]
            if offsets:
                for slot, index, offset in offsets:
                    p = ptrs[index]
                    slots[slot] = p + offset if p else 0
            if floats_at:
                for at, index in floats_at:
                    values[at] = floats[index]
            go(handle, address)
        return tensors

    return run


def _like(given: Sequence[Any], out: Any) -> int | None:
    """The index of a given torch tensor that ``out`` (a contiguous output) has the shape,
    dtype and device of, for ``torch.empty_like``; None when there is none."""
    for index, t in enumerate(given):
        if (t is not None and t.is_contiguous() and t.shape == out.shape and t.dtype == out.dtype
                and t.device == out.device):  # fmt: skip
            return index
    return None
