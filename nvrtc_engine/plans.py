"""Launch plans: what a kernel call with torch tensors needs once its arguments are checked.

A family's ``__call__`` first offers its array arguments to ``Kernel._fast`` (a function
made by :func:`fast_path` for the family's number of array arguments). When every one is a
``torch.Tensor`` (exactly that class, or ``nn.Parameter``) on a CUDA device, or None, their
dtypes, shapes, device indices and contiguity, which ones are None, the family's ``extra``
and the pointers' alignment (one marker when all are 16-byte aligned, else each address
modulo 16) form the call's *plan key*. Every check of a family's generic path depends only
on that key (and on float arguments, which the family checks on every call), so:

- a key seen before runs its :class:`LaunchPlan`: allocate the outputs the caller left out
  (an allocation aligned otherwise than the planned one sends the call to the generic path),
  make the device's context current if it is not, find the stream, write this call's
  pointers and floats into this thread's copy of the pre-packed parameters, launch;
- any other call takes the generic path, which checks everything, raises the errors, packs
  the parameters and hands its launches to ``Kernel._submit``, each with its *references*:
  which parameter slots hold an argument's address (:class:`Ptr`) or a per-call float
  (:class:`Float`). With a plan key, :meth:`LaunchPlan.build` turns them into the key's plan,
  after checking every reference against the value the generic path packed (a reference
  that does not match is a bug: the call is launched as packed and not planned, with a
  warning).

A plan also fixes what the generic path read from module-level launch settings when it was
made (``activation.MAX_GRID``...): code that changes those at
run time (tuning scripts) must use new ``Kernel`` objects or clear ``kernel._launch_plans``.

Both hot functions are generated as straight-line Python (no loops, no tuple unpacking, the
plan's constants bound as names): the key reader once per number of arguments, the launch
function once per plan; and the kernel's last plan is tried before its dictionary of plans.
Together that takes about a quarter off a loop over arguments and slots with a dictionary
lookup (bench/launch_overhead.py).

With the compiled launcher (:mod:`nvrtc_engine.launcher`) both run in C instead. A plan made
then also gets a *native spec* (:attr:`LaunchPlan.native`: each launch's function, grid,
block, shared memory, packed parameters, the slots a call rewrites and whether it is a
programmatic dependent launch (``Kernel._dependent``), as bytes), unless it
allocates outputs; and the kernel's first such plan replaces the kernel's ``_fast`` by the
extension's ``fast`` (bound to the kernel, in its ``__dict__``). That function reads the
same plan key as the Python one, reads a tensor's attributes without the interpreter, and
launches a plan with a native spec itself: the parameters copied into its stack frame (so
threads never share them), this call's pointers and floats written, the GIL released once
around the context check and the launches. Plans without a spec run their Python ``run``.
"""

from __future__ import annotations

import functools
import struct
import sys
import types
from typing import TYPE_CHECKING, Any

from . import driver, launcher
from .driver import _streams
from .errors import warn
from .interop import TORCH_TYPES, explicit_stream, torch_stream_getter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .kernel import Kernel, Loaded

__all__ = [
    "NO_PLAN", "Float", "LaunchPlan", "LaunchSpec", "Ptr", "Refs", "compiled_fast", "fast_path",
]  # fmt: skip

# A launch as a family describes it: (function index, grid, block, ParamPack, parameter
# values, references: (slot, Ptr or Float) for each slot that depends on the call)
LaunchSpec = tuple[int, int, int, "driver.ParamPack", "Sequence[Any]", "Refs"]
Refs = tuple[tuple[int, "Ptr | Float"], ...]


class Ptr:
    """A reference: the parameter is the address of array argument ``index`` (in the
    family's order) plus ``offset`` bytes (0 when the argument is None)."""

    __slots__ = ("index", "offset")

    def __init__(self, index: int, offset: int = 0) -> None:
        self.index = index
        self.offset = offset


class Float:
    """A reference: the parameter is the call's float ``floats[index]``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


_READ = """\
    if t{i} is None:
        k{i} = None
        p{i} = 0
    elif type(t{i}) in TORCH_TYPES and t{i}.is_cuda:
        p{i} = t{i}.data_ptr()
        k{i} = (t{i}.dtype, t{i}.shape, t{i}.get_device(), t{i}.is_contiguous())
    else:
        return None, None
"""

_FAST = """\
def _fast(self, tensors, floats, stream, extra=None):
    {names}, = tensors
{reads}
    if ({low}) & 15:
        key = (extra, {parts}, ({residues},))
    else:
        key = (extra, {parts})
    plan = self._last_plan
    if plan.key != key:
        plan = self._launch_plans.get(key)
        if plan is None:
            return None, key
        self._last_plan = plan
    done = plan.run(tensors, [{ptrs}], floats, stream)
    return done, (key if done is not None else None)
"""


@functools.cache
def fast_path(count: int) -> Callable[..., tuple[Any, Any]]:
    """``Kernel._fast`` for calls with ``count`` array arguments:
    ``_fast(self, tensors, floats, stream, extra=None) -> (done, key)``.

    ``tensors``: the array arguments in the family's order (None where omitted);
    ``floats``: the per-call floats (checked); ``extra``: anything else (hashable) the
    generic path's outcome depends on. ``done`` is ``tensors`` with the omitted outputs
    allocated, once launched through the key's plan; else None, and ``key`` is the plan
    key to hand to ``Kernel._submit`` (None: not a call for a plan).
    """
    names = [f"t{i}" for i in range(count)]
    source = _FAST.format(
        names=", ".join(names),
        reads="".join(_READ.format(i=i) for i in range(count)),
        low=" | ".join(f"p{i}" for i in range(count)),
        parts=", ".join(f"k{i}" for i in range(count)),
        residues=", ".join(f"p{i} & 15" for i in range(count)),
        ptrs=", ".join(f"p{i}" for i in range(count)),
    )
    namespace: dict[str, Any] = {"TORCH_TYPES": TORCH_TYPES}
    exec(compile(source, f"<nvrtc_engine fast path, {count} arrays>", "exec"), namespace)
    return namespace["_fast"]


def compiled_fast(kernel: Kernel) -> Any:
    """The compiled extension's ``fast`` bound to ``kernel`` (a drop-in for its ``_fast``:
    the same arguments, plan keys and results), or None without the compiled launcher."""
    module = launcher.extension()
    if module is None:
        return None
    module.setup_fast(TORCH_TYPES)  # the same set object always: cheap and idempotent
    return types.MethodType(module.fast, kernel)


# The native spec's layout (nvrtc_engine/_launch.c, prepare()); the limits are the C side's.
_SPEC_HEADER = struct.Struct("<IIQ")  # launches, device ordinal, context
_SPEC_LAUNCH = struct.Struct("<QIIIIII")  # function, grid, block, shmem, slots, writes, flags
_SPEC_WRITE = struct.Struct("<IIIIQ")  # kind (0: address, 1: float), slot, index, 0, offset
_SPEC_MAX_LAUNCHES, _SPEC_MAX_SLOTS = 4, 64


_warned: set[str] = set()


def _mismatch(kernel: Kernel, slot: int, ref: Ptr | Float | None) -> None:
    """A family's references do not describe what it packed: warn once per kernel."""
    if kernel.name not in _warned:
        _warned.add(kernel.name)
        what = "no reference" if ref is None else f"{type(ref).__name__}({ref.index})"
        warn(
            f"{kernel.name}: launch parameter {slot} does not match its reference ({what}); "
            "calls take the checked path (a bug in nvrtc_engine: please report it)",
            RuntimeWarning,
        )
    return None


class LaunchPlan:
    """Everything a call's launches need that its plan key determines: the outputs to
    allocate (shape, dtype, device, address modulo 16), the device and its context, and per
    launch the function, grid, block, parameters packed once (:class:`driver.Preset`), the
    slots that take each call's pointers and floats, and whether it is a programmatic
    dependent launch (``Kernel._dependent``: cuLaunchKernelEx, :func:`driver.dependent_config`).

    :meth:`build` makes it from the launches of a call that the generic path checked;
    ``run(tensors, ptrs, floats, stream, allocate=True)`` (generated for the plan) launches
    for a call with the same key: ``ptrs`` are the arguments' addresses (0 for None), filled
    in for the outputs it allocates (unless ``allocate`` is false). It returns ``tensors``
    with those outputs, or None, launching nothing, when one is not aligned as planned.
    """

    __slots__ = ("allocs", "device", "key", "launches", "native", "run", "source")

    key: Any  # the plan key it was made for (set by Kernel._submit)

    @classmethod
    def build(
        cls, kernel: Kernel, loaded: Loaded, given: Sequence[Any], tensors: Sequence[Any],
        ptrs: Sequence[int], floats: Sequence[float], launches: Sequence[LaunchSpec],
    ) -> LaunchPlan | None:  # fmt: skip
        """The plan for ``launches`` (see ``Kernel._submit``), or None when they cannot be
        replayed: an output allocated as something other than a ``torch.Tensor``, or a
        reference that does not match the packed value (or a non-zero pointer with none)."""
        plan = cls()
        plan.device = loaded.device
        plan.allocs = []
        for index, (arg, t) in enumerate(zip(given, tensors, strict=True)):
            if arg is None and t is not None:  # allocated by the generic path: by each call
                if type(t) not in TORCH_TYPES:
                    return None
                plan.allocs.append((index, t.shape, t.dtype, t.device, ptrs[index] & 15))
        plan.launches = []
        for function, grid, block, pack, values, refs in launches:
            writes: list[tuple[str, int, int, int]] = []  # (view, slot, source index, offset)
            referenced = set()
            for slot, ref in refs:
                referenced.add(slot)
                if type(ref) is Float:
                    if values[slot] != floats[ref.index]:
                        return _mismatch(kernel, slot, ref)
                    writes.append(("values", 2 * slot, ref.index, 0))
                elif values[slot] != ptrs[ref.index] + (ref.offset if ptrs[ref.index] else 0):
                    return _mismatch(kernel, slot, ref)
                elif tensors[ref.index] is not None:  # else 0 in every call of this key
                    writes.append(("slots", slot, ref.index, ref.offset))
            for slot, kind in enumerate(pack.kinds):
                if kind == "P" and values[slot] and slot not in referenced:
                    return _mismatch(kernel, slot, None)
            shared = kernel._shared
            shmem = shared[function] if shared else 0
            function = loaded.functions[function]
            plan.launches.append((function, grid, block, shmem, pack.preset(values), writes,
                                  kernel._dependent))  # fmt: skip
        plan.source, namespace = plan._generate()
        exec(compile(plan.source, f"<launch plan of {kernel.name}>", "exec"), namespace)
        plan.run = namespace["run"]
        plan.native = plan._native() if namespace["c_launch"] is not None else None
        return plan

    def _native(self) -> tuple[bytes, Any, Any, Any] | None:
        """The plan's native spec for the compiled fast path: ``(spec, raw_stream,
        explicit_stream, launch_failed)``, or None when the plan allocates outputs (its
        Python ``run`` does that) or exceeds the C side's limits."""
        if self.allocs or len(self.launches) > _SPEC_MAX_LAUNCHES:
            return None
        parts = [_SPEC_HEADER.pack(len(self.launches), self.device.ordinal,
                                   int(self.device.context))]  # fmt: skip
        for function, grid, block, shmem, preset, writes, dependent in self.launches:
            image = preset.image
            slots = len(image) // 8
            if slots > _SPEC_MAX_SLOTS or len(image) % 8:
                return None
            parts.append(_SPEC_LAUNCH.pack(int(function), grid, block, shmem, slots,
                                           len(writes), int(dependent)))  # fmt: skip
            parts.append(image)
            for view, slot, index, offset in writes:
                if view == "slots":
                    parts.append(_SPEC_WRITE.pack(0, slot, index, 0, offset))
                else:  # "values": the float32 view's index 2 * slot
                    parts.append(_SPEC_WRITE.pack(1, slot // 2, index, 0, 0))
        getter = torch_stream_getter()
        return b"".join(parts), getter, explicit_stream, driver.launch_failed

    def _generate(self) -> tuple[str, dict[str, Any]]:
        """The source of :attr:`run` and the names it uses: launching through the compiled
        launcher (:mod:`nvrtc_engine.launcher`) when this process has one, which also checks
        the context, else through cuda.bindings."""
        drv = driver._drv()
        device = self.device
        compiled = launcher.get()
        names: dict[str, Any] = {
            "get_context": drv.cuCtxGetCurrent, "cu_launch": drv.cuLaunchKernel,
            "context": device.context, "device": device, "make_current": driver.make_current,
            "raw_stream": torch_stream_getter(), "explicit_stream": explicit_stream,
            "streams": _streams, "stream_object": driver.stream_object, "check": driver.check,
            "empty": sys.modules["torch"].empty, "c_launch": compiled,
            "launch_failed": driver.launch_failed, "context_address": int(device.context),
            "cu_launch_ex": drv.cuLaunchKernelEx, "dependent_config": driver.dependent_config,
        }  # fmt: skip
        lines = ["def run(tensors, ptrs, floats, stream, allocate=True):"]
        if self.allocs:
            lines += ["    if allocate:", "        tensors = list(tensors)"]
            for n, (index, shape, dtype, where, residue) in enumerate(self.allocs):
                names.update({f"shape{n}": shape, f"dtype{n}": dtype, f"device{n}": where})
                lines += [
                    f"        t = empty(shape{n}, dtype=dtype{n}, device=device{n})",
                    "        p = t.data_ptr()",
                    f"        if p & 15 != {residue}:",
                    "            return None",
                    f"        tensors[{index}] = t",
                    f"        ptrs[{index}] = p",
                ]
        if compiled is None:
            lines += [
                "    if get_context()[1] != context:",
                "        make_current(device)",
            ]
        lines.append(f"    handle = raw_stream({device.ordinal}) if stream is None "
                     "else explicit_stream(stream)")  # fmt: skip
        if compiled is None:
            lines += [
                "    s = streams.get(handle)",
                "    if s is None:",
                "        s = stream_object(handle)",
            ]
        for n, (function, grid, block, shmem, preset, writes, dependent) in enumerate(
            self.launches
        ):
            names.update({f"function{n}": function if compiled is None else int(function),
                          f"preset{n}": preset, f"local{n}": preset.local,
                          f"configs{n}": {}})  # fmt: skip
            lines += [
                "    try:",
                f"        slots, values, address = local{n}.views",
                "    except AttributeError:",
                f"        slots, values, address = preset{n}.buffers()",
            ]
            for view, slot, index, offset in writes:
                source = f"ptrs[{index}] + {offset}" if offset else (
                    f"ptrs[{index}]" if view == "slots" else f"floats[{index}]")  # fmt: skip
                lines.append(f"    {view}[{slot}] = {source}")
            if compiled is None and dependent:  # a launch config per stream, made once
                lines += [
                    f"    config = configs{n}.get(handle)",
                    "    if config is None:",
                    f"        if len(configs{n}) >= 64:",
                    f"            configs{n}.clear()",
                    f"        config = configs{n}[handle] = dependent_config({grid}, {block}, "
                    f"{shmem}, s)",
                    f"    (err,) = cu_launch_ex(config, function{n}, address, 0)",
                    "    if err:",
                    '        check((err,), "cuLaunchKernelEx")',
                ]
            elif compiled is None:
                lines += [
                    f"    (err,) = cu_launch(function{n}, {grid}, 1, 1, {block}, 1, 1, {shmem}, "
                    "s, address, 0)",
                    "    if err:",
                    '        check((err,), "cuLaunchKernel")',
                ]
            else:  # the first launch makes the context current; the others find it so
                ctx = "context_address" if n == 0 else "0"
                lines += [
                    f"    err = c_launch(function{n}, {grid}, {block}, {shmem}, handle, address, "
                    f"{ctx}{', 1' if dependent else ''})",
                    "    if err:",
                    "        launch_failed(err)",
                ]
        lines.append("    return tensors")
        return "\n".join(lines) + "\n", names


NO_PLAN = LaunchPlan()  # a kernel's last plan before it has one (its key matches no call)
NO_PLAN.key = None
NO_PLAN.native = None
