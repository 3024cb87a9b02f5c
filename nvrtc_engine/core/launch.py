"""The launch path: the driver call, and launches prepared once per call key.

**The driver call**: ``cuLaunchKernelEx`` through ``cuda.bindings`` with a ``CUlaunchConfig``
per launch shape and stream (:func:`launch_config`, made once each), carrying the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` for a programmatic dependent launch
(``Kernel._dependent``). bench/tuning/launch_candidates.py measured it against ``cuLaunchKernel``
through ``cuda.bindings``, ctypes calls of both and ``cuda.core``'s ``launch``. The checked
path calls it through :func:`launch`, a prepared launch directly.

**Prepared launches** (:func:`prepare`). A call whose array arguments are all torch tensors
(exactly ``torch.Tensor`` or ``nn.Parameter``) or None has a *call key*
(:func:`call_key`): which arguments are given (a :class:`~signature.CallArgs` mask), the
family's ``extra`` (what else its checks depend on) and for each given tensor its dtype, shape,
device index, contiguity and address modulo 16. Every check a family makes depends only on
that key and on its float arguments, which it checks on each call, so the first call of a key
takes the family's checked path, which makes the key's prepared launch: a function
``run(tensors, ptrs, floats, stream)`` of the given tensors, their addresses and the floats,
closed over everything the key fixes.

A run keeps, per thread, one buffer holding the call's values and each launch's constant
parameters and ``void*[]``: the ``void*[]`` entries point at the value each parameter takes,
wherever it lies, so a call writes its addresses in one slice assignment (then its allocated
outputs' addresses, addresses plus offsets and floats) and never touches the constants. A run
allocates what the caller left out (one ``torch.empty_like`` or ``torch.empty`` each), takes
torch's current stream unless given one, checks the current context (PyTorch or CuPy may
switch it at any time) and launches in the device's context, the thread's previous one
current again afterwards (:func:`~nvrtc_engine.driver.on_device`): the family's ``__call__``
reads the key (``Kernel._fast1``...), the run launches, and nothing else runs in Python
between them.

**The compiled launcher** (:mod:`nvrtc_engine.native_launch`, built into the wheel): where
it loads, a kernel's key reads (``Kernel._fast1``...) and prepared launches (:func:`prepare`
returns its C ``Plan``) run in C with the same keys, parameter bytes and errors; the
pure-Python ``run`` below is the path without it (``NVRTC_ENGINE_NATIVE_LAUNCH=0``).

What a family reads from module-level launch settings (``activation.MAX_GRID``,
``norm_config.MAX_GRID``...) is fixed in a prepared launch: code that changes them at run time
(tuning scripts) must use new ``Kernel`` objects or clear ``kernel._prepared``.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from . import driver
from .interop import TORCH_TYPES, explicit_stream, torch_stream_getter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .signature import Signature

__all__ = ["MAX_PREPARED", "LaunchSpec", "call_key", "launch", "launch_config", "prepare"]

MAX_PREPARED = 256  # prepared launches kept per kernel (per call key); the oldest go first

# A launch as a family describes it: (function index, grid, block, signature, values bound by
# name: numbers, Ref and FloatRef; see nvrtc_engine.core.signature)
LaunchSpec = tuple[int, int, int, "Signature", dict[str, Any]]

_configs: dict[tuple[int, int, int, int, bool], Any] = {}


def launch_config(grid: int, block: int, shmem: int, stream: int, dependent: bool) -> Any:
    """The ``CUlaunchConfig`` (cuda.bindings) of a 1-D launch of ``grid`` blocks of ``block``
    threads with ``shmem`` bytes of dynamic shared memory on stream handle ``stream``, made
    once per argument tuple (about 4 us each through cuda.bindings) and shared: it is only
    read. With ``dependent`` the attribute
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION is set: the kernel may start before
    the previous kernel of the stream completes and waits for it itself
    (``griddepcontrol.wait``, templates/include/nve_memory.cuh)."""
    key = (grid, block, shmem, stream, dependent)
    config = _configs.get(key)
    if config is not None:
        return config
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
    if len(_configs) >= 1024:  # shapes and streams come and go
        _configs.clear()
    _configs[key] = config
    return config


def launch(
    function: Any, grid: int, block: int, shmem: int, dependent: bool, stream: int, params: int
) -> None:
    """Launch ``function`` (a ``CUfunction``) with the parameters at ``params`` (the
    ``void*[]`` address :meth:`Signature.pack` returns) on stream handle ``stream`` (an int),
    as :func:`launch_config` describes (``dependent``: as a programmatic dependent launch, only
    for a kernel that waits for its grid dependency): the checked path's launches. Raises
    :class:`~nvrtc_engine.CudaError` when the driver refuses the launch."""
    config = launch_config(grid, block, shmem, stream, dependent)
    (err,) = driver._drv().cuLaunchKernelEx(config, function, params, 0)
    if err:
        driver.check((err,), "cuLaunchKernelEx")


def call_key(given: Sequence[Any], extra: Any = None) -> tuple[tuple[Any, ...], list[Any],
                                                                list[int]] | None:  # fmt: skip
    """``(key, tensors, ptrs)`` of a call with array arguments ``given`` (in the family's
    :class:`~signature.CallArgs` order, None where omitted): the call key (see the module
    docstring), the given tensors and their addresses; None when an argument is no torch
    tensor of :data:`~interop.TORCH_TYPES` (such calls are not prepared).

    The key is ``(tag, dtype, shape, device, contiguous, address % 16, ...)`` per given
    tensor, ``tag`` the CallArgs mask of the given arguments, or ``(mask, extra)`` with an
    ``extra``: ``Kernel._fast1``, ``_fast2`` and ``_fast3`` read the same key by hand."""
    mask = 0
    key: list[Any] = []
    tensors, ptrs = [], []
    for i, t in enumerate(given):
        if t is not None:
            if type(t) not in TORCH_TYPES:
                return None
            p = t.data_ptr()
            mask |= 1 << i
            key += (t.dtype, t.shape, t.get_device(), t.is_contiguous(), p & 15)
            tensors.append(t)
            ptrs.append(p)
    return (mask if extra is None else (mask, extra), *key), tensors, ptrs


def prepare(
    kernel: Any, loaded: Any, given: Sequence[Any], tensors: Sequence[Any], ptrs: Sequence[int],
    nfloats: int, launches: Sequence[LaunchSpec],
) -> Callable[..., tuple[Any, ...] | None] | None:  # fmt: skip
    """The prepared launch of ``launches``, which a checked call with array arguments
    ``given`` made on ``loaded`` (``tensors``: the arguments with the outputs it allocated,
    ``ptrs`` their addresses, in CallArgs order; ``nfloats`` float arguments):
    ``run(tensors, ptrs, floats, stream)``, where ``tensors`` and ``ptrs`` are the given
    tensors of a later call with the key and their addresses, in the same order; it returns
    the outputs it allocated (in CallArgs order), or None, launching nothing, when an
    allocation is aligned otherwise than the key's. None when the launches cannot be
    replayed: an argument or an allocated output that is not exactly a torch tensor, or a
    pointer parameter bound to an address of the family's own (:meth:`Signature.prepare`)."""
    # The per-thread buffer, in 8-byte slots: the call's addresses (given, then allocated),
    # addresses plus offsets, floats (4 bytes each), then per launch its constant parameters
    # and its void*[].
    row: dict[int, int] = {}  # CallArgs index -> slot of its address
    for i, t in enumerate(given):
        if t is not None:
            if type(t) not in TORCH_TYPES:
                return None
            row[i] = len(row)
    present = [given[i] for i in row]
    allocs = []
    for i, (arg, t) in enumerate(zip(given, tensors, strict=True)):
        if arg is None and t is not None:  # allocated by the checked path: by each call
            if type(t) not in TORCH_TYPES:
                return None
            like, same_dtype = _like(present, t)
            sizes = tuple(t.shape) or ((),)  # torch.empty(*ints) parses fastest; () for 0-d
            allocs.append((like, same_dtype, sizes, t.dtype, t.device, ptrs[i] & 15))
            row[i] = len(row)
    is_present = [t is not None for t in tensors]
    prepared = []
    for _, _, _, sig, bound in launches:
        got = sig.prepare(bound, is_present)
        if got is None:
            return None
        prepared.append(got)
    shared, dependent = kernel._shared, kernel._dependent
    shapes = [(loaded.functions[index], grid, block, shared[index] if shared else 0, dependent)
              for index, grid, block, _, _ in launches]  # fmt: skip
    if kernel._native:  # the compiled launcher's plan (nvrtc_engine.native_launch)
        from . import native_launch

        return native_launch.plan(len(present), allocs, row, prepared, shapes, nfloats,
                                  loaded.device)  # fmt: skip
    offsets: dict[tuple[int, int], int] = {}  # (CallArgs index, offset) -> slot
    for _, refs, _ in prepared:
        for _, index, offset in refs:
            if offset and (index, offset) not in offsets:
                offsets[index, offset] = len(row) + len(offsets)
    float_at = len(row) + len(offsets)  # the floats' first slot
    at = float_at + (nfloats + 1) // 2
    image = b""
    targets: list[int] = []  # byte offset in the buffer of each void*[] entry's value
    for constants, refs, floats in prepared:
        count = len(constants) // 8
        where = [8 * (at + s) for s in range(count)]
        for slot, i, offset in refs:
            where[slot] = 8 * (offsets[i, offset] if offset else row[i])
        for slot, f in floats:
            where[slot] = 8 * float_at + 4 * f
        image += constants
        targets += where
        at += count
    args_at = at  # the void*[] of all launches, one after another
    total = args_at + len(targets)
    constants_at = args_at - len(image) // 8
    addresses, start = [], args_at
    for constants, _, _ in prepared:
        addresses.append(start)
        start += len(constants) // 8
    offset_list = tuple((slot, row[i], offset) for (i, offset), slot in offsets.items())
    state = _state_maker(total, image, constants_at, targets, args_at, float_at, nfloats)
    return _runner(
        len(present), tuple(allocs), offset_list, nfloats, tuple(shapes), tuple(addresses),
        loaded.device, state,
    )  # fmt: skip


def _state_maker(
    total: int, image: bytes, constants_at: int, targets: list[int], args_at: int,
    float_at: int, nfloats: int,
) -> Callable[[], tuple[Any, Any, dict[int, Any]]]:  # fmt: skip
    """``new()``: a thread's buffer of ``total`` slots (constants ``image`` at slot
    ``constants_at``, the ``void*[]`` at ``args_at`` pointing at byte offsets ``targets``),
    a float32 view of its ``nfloats`` floats at slot ``float_at`` (None without floats) and
    its launches by stream handle (empty)."""
    import ctypes  # (here, when a launch is prepared: a process that only compiles needs none)

    def new() -> tuple[Any, Any, dict[int, Any]]:
        buffer = (ctypes.c_uint64 * total)()
        base = ctypes.addressof(buffer)
        ctypes.memmove(base + 8 * constants_at, image, len(image))
        buffer[args_at:total] = [base + t for t in targets]
        floats = None
        if nfloats:
            floats = (ctypes.c_float * nfloats).from_buffer(buffer, 8 * float_at)
        return buffer, floats, {}

    return new


def _runner(
    ngiven: int, allocs: tuple[Any, ...], offsets: tuple[tuple[int, int, int], ...],
    nfloats: int, shapes: tuple[Any, ...], addresses: tuple[int, ...], device: Any,
    new_state: Callable[[], tuple[Any, Any, dict[int, Any]]],
) -> Callable[..., tuple[Any, ...] | None]:  # fmt: skip
    """The prepared launch's ``run`` (see :func:`prepare`)."""
    from ctypes import addressof

    drv = driver._drv()
    get_context, set_context = drv.cuCtxGetCurrent, drv.cuCtxSetCurrent
    launch_ex = drv.cuLaunchKernelEx
    context, ordinal = device.context, device.ordinal
    current_stream = torch_stream_getter()
    check = driver.check
    local = threading.local()
    torch = sys.modules["torch"]
    empty, empty_like = torch.empty, torch.empty_like
    first_alloc, given_slots = ngiven, slice(0, ngiven)

    def configure(calls: dict[int, Any], handle: int, base: int) -> tuple[Any, ...]:
        """This thread's launches on stream ``handle``: (config, function, void*[] address)."""
        if len(calls) >= 64:  # streams come and go
            calls.clear()
        made = calls[handle] = tuple(
            (launch_config(grid, block, shmem, handle, dependent), function, base + 8 * at)
            for (function, grid, block, shmem, dependent), at in zip(shapes, addresses,
                                                                     strict=True)
        )  # fmt: skip
        return made

    def run(tensors: Sequence[Any], ptrs: Sequence[int], floats: Sequence[float],
            stream: Any) -> tuple[Any, ...] | None:  # fmt: skip
        try:
            slots, float_view, calls = local.state
        except AttributeError:
            slots, float_view, calls = local.state = new_state()
        slots[given_slots] = ptrs
        made: tuple[Any, ...] = ()
        if allocs:
            at = first_alloc
            for like, same_dtype, sizes, dtype, where, residue in allocs:
                # one step each, the cheapest to parse (bench/launch_overhead.py): empty_like
                # of a given tensor of the output's shape and device, else empty of the sizes
                if like is None:
                    t = empty(*sizes, dtype=dtype, device=where)
                elif same_dtype:
                    t = empty_like(tensors[like])
                else:
                    t = empty_like(tensors[like], dtype=dtype)
                p = t.data_ptr()
                if p & 15 != residue:
                    return None
                slots[at] = p
                at += 1
                made += (t,)
        if offsets:
            for slot, index, offset in offsets:
                p = slots[index]
                slots[slot] = p + offset if p else 0
        if nfloats:
            float_view[:] = floats
        handle = current_stream(ordinal) if stream is None else explicit_stream(stream)
        launches = calls.get(handle)
        if launches is None:
            launches = configure(calls, handle, addressof(slots))
        previous = get_context()[1]
        switch = previous != context  # another device's context, or none (driver.on_device)
        if switch:
            check(set_context(context), "cuCtxSetCurrent")
        try:
            for config, function, params in launches:
                (err,) = launch_ex(config, function, params, 0)
                if err:
                    check((err,), "cuLaunchKernelEx")
        finally:
            if switch:
                check(set_context(previous), "cuCtxSetCurrent")
        return made

    return run


def _like(given: Sequence[Any], out: Any) -> tuple[int | None, bool]:
    """``(index, same dtype)``: the index in ``given`` (torch tensors) of a contiguous one
    that ``out`` (a contiguous output) has the shape and device of, one of its dtype first,
    for ``torch.empty_like``, and whether its dtype is ``out``'s; ``(None, False)`` when there
    is none."""
    found: tuple[int | None, bool] = (None, False)
    for index, t in enumerate(given):
        if t.is_contiguous() and t.shape == out.shape and t.device == out.device:
            if t.dtype == out.dtype:
                return index, True
            if found[0] is None:
                found = (index, False)
    return found
