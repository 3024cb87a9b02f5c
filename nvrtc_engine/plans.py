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
- any other call takes the generic path, which checks everything, raises the errors, and
  hands its launches to ``Kernel._submit``: described with :class:`Ptr` (an argument's
  address) and :class:`Float` (a per-call float) where they depend on the call, they become
  the key's plan (:meth:`LaunchPlan.build`).

Both hot functions are generated as straight-line Python (no loops, no tuple unpacking, the
plan's constants bound as names): the key reader once per number of arguments, the launch
function once per plan. That halves their cost against a loop over arguments and slots
(bench/launch_overhead.py).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from . import driver
from .driver import _streams
from .interop import TORCH_TYPES, explicit_stream, torch_stream_getter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .kernel import Kernel, Loaded

__all__ = ["Float", "LaunchPlan", "LaunchSpec", "Ptr", "fast_path", "resolve"]

# A launch as a family describes it: (function index, grid, block, ParamPack, parameter
# values: constants, Ptr and Float)
LaunchSpec = tuple[int, int, int, "driver.ParamPack", "Sequence[Any]"]


class Ptr:
    """A pointer parameter of a launch: the address of array argument ``index`` plus
    ``offset`` bytes."""

    __slots__ = ("index", "offset")

    def __init__(self, index: int, offset: int = 0) -> None:
        self.index = index
        self.offset = offset


class Float:
    """A float parameter of a launch that changes from call to call: ``floats[index]``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def resolve(values: Sequence[Any], ptrs: Sequence[int], floats: Sequence[float]) -> list[Any]:
    """``values`` with each :class:`Ptr` and :class:`Float` replaced by this call's value."""
    return [
        ptrs[v.index] + v.offset if type(v) is Ptr else floats[v.index] if type(v) is Float else v
        for v in values
    ]


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
    plan = self._launch_plans.get(key)
    if plan is None:
        return None, key
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


class LaunchPlan:
    """Everything a call's launches need that its plan key determines: the outputs to
    allocate (shape, dtype, device, address modulo 16), the device and its context, and per
    launch the function, grid, block, parameters packed once (:class:`driver.Preset`) and
    the slots that take each call's pointers and floats.

    :meth:`build` makes it from the launches of a call that the generic path checked;
    ``run(tensors, ptrs, floats, stream, allocate=True)`` (generated for the plan) launches
    for a call with the same key: ``ptrs`` are the arguments' addresses (0 for None), filled
    in for the outputs it allocates (unless ``allocate`` is false). It returns ``tensors``
    with those outputs, or None, launching nothing, when one is not aligned as planned.
    """

    __slots__ = ("allocs", "device", "launches", "run", "source")

    @classmethod
    def build(
        cls, kernel: Kernel, loaded: Loaded, given: Sequence[Any], tensors: Sequence[Any],
        ptrs: Sequence[int], launches: Sequence[LaunchSpec],
    ) -> LaunchPlan | None:  # fmt: skip
        """The plan for ``launches`` (see ``Kernel._submit``), or None when they cannot be
        replayed: an output allocated as something other than a ``torch.Tensor``, or a
        non-zero pointer parameter that is not a :class:`Ptr`."""
        plan = cls()
        plan.device = loaded.device
        plan.allocs = []
        for index, (arg, t) in enumerate(zip(given, tensors, strict=True)):
            if arg is None and t is not None:  # allocated by the generic path: by each call
                if type(t) not in TORCH_TYPES:
                    return None
                plan.allocs.append((index, t.shape, t.dtype, t.device, ptrs[index] & 15))
        plan.launches = []
        for function, grid, block, pack, values in launches:
            writes: list[tuple[str, int, int, int]] = []  # (view, slot, source index, offset)
            image = []
            for slot, (kind, value) in enumerate(zip(pack.kinds, values, strict=True)):
                if type(value) is Ptr:
                    if tensors[value.index] is not None:  # else 0 in every call of this key
                        writes.append(("slots", slot, value.index, value.offset))
                    value = ptrs[value.index] + value.offset
                elif type(value) is Float:
                    writes.append(("values", 2 * slot, value.index, 0))
                    value = 0.0
                elif kind == "P" and value:
                    return None
                image.append(value)
            function = loaded.functions[function]
            plan.launches.append((function, grid, block, pack.preset(image), writes))
        plan.source, namespace = plan._generate()
        exec(compile(plan.source, f"<launch plan of {kernel.name}>", "exec"), namespace)
        plan.run = namespace["run"]
        return plan

    def _generate(self) -> tuple[str, dict[str, Any]]:
        """The source of :attr:`run` and the names it uses."""
        drv = driver._drv()
        device = self.device
        names: dict[str, Any] = {
            "get_context": drv.cuCtxGetCurrent, "cu_launch": drv.cuLaunchKernel,
            "context": device.context, "device": device, "make_current": driver.make_current,
            "raw_stream": torch_stream_getter(), "explicit_stream": explicit_stream,
            "streams": _streams, "stream_object": driver.stream_object, "check": driver.check,
            "empty": sys.modules["torch"].empty,
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
        lines += [
            "    if get_context()[1] != context:",
            "        make_current(device)",
            f"    handle = raw_stream({device.ordinal}) if stream is None "
            "else explicit_stream(stream)",
            "    s = streams.get(handle)",
            "    if s is None:",
            "        s = stream_object(handle)",
        ]
        for n, (function, grid, block, preset, writes) in enumerate(self.launches):
            names.update({f"function{n}": function, f"preset{n}": preset,
                          f"local{n}": preset.local})  # fmt: skip
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
            lines += [
                f"    (err,) = cu_launch(function{n}, {grid}, 1, 1, {block}, 1, 1, 0, s, "
                "address, 0)",
                "    if err:",
                '        check((err,), "cuLaunchKernel")',
            ]
        lines.append("    return tensors")
        return "\n".join(lines) + "\n", names
