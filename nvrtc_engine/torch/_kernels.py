"""The kernels the PyTorch layer launches: fetched once per (op, dtypes, hidden size, device,
flags) with :func:`nvrtc_engine.get_kernel` for that device's arch, loaded there, and kept in
one dictionary, so that a call costs one lookup. Also the constant weights (ones, zeros) that
stand in for a norm's missing gamma or beta, kept the same way, and the modules' own
caches (:class:`Cache`: each module's kernels by its input's dtype, hidden size and device).

Nothing is fetched, compiled, loaded or allocated while the current stream captures a CUDA
graph: that would break the capture, so a kernel first needed there is an error that says to
run the model once before capturing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..api import get_kernel

__all__ = [
    "DEVICE_TYPE",
    "ENGINE_DTYPES",
    "FP8_DTYPES",
    "HIGH_PRECISION",
    "Cache",
    "clear",
    "fetch",
    "fill",
    "kernel",
    "load",
]

# The device type the kernels run on (the tests' CPU stand-ins set "cpu").
DEVICE_TYPE = "cuda"
HIGH_PRECISION: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}
FP8_DTYPES: dict[torch.dtype, str] = {
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}
ENGINE_DTYPES: dict[torch.dtype, str] = {**HIGH_PRECISION, **FP8_DTYPES}

# (op, in dtype, FP8 out dtype or None, hidden size, device ordinal, flags) -> Kernel
Key = tuple[str, torch.dtype, torch.dtype | None, int, int, tuple[tuple[str, bool], ...]]
_KERNELS: dict[Key, Any] = {}
_FILLS: dict[tuple[float, torch.dtype, int, int], torch.Tensor] = {}
_CACHES: weakref.WeakValueDictionary[int, Cache] = weakref.WeakValueDictionary()  # by id


class Cache(dict):  # type: ignore[type-arg]
    """A module's kernels by what its calls' inputs and settings key (a dict). It copies and
    pickles empty (kernels are loaded in one process), and :func:`clear` empties it."""

    __slots__ = ("__weakref__",)

    def __init__(self) -> None:
        super().__init__()
        _CACHES[id(self)] = self

    def __reduce__(self) -> tuple[type[Cache], tuple[()]]:
        return Cache, ()


def kernel(key: Key, check: Callable[..., object], *args: Any) -> Any:
    """The kernel of ``key``: ``(op, input dtype, out dtype, hidden size, device ordinal,
    flags)``, where the out dtype is an FP8 dtype (tensor scaling) or None (the input's), the
    hidden size is compiled in and the flags are the op's key flags as ``(name, True)``
    pairs. One dictionary lookup once fetched; else ``check(*args)`` (which raises what is
    wrong with the call), then :func:`load`."""
    found = _KERNELS.get(key)
    if found is not None:
        return found
    check(*args)
    return load(key)


def fetch(key: Key) -> Any:
    """The kernel of ``key`` (see :func:`kernel`), the call already checked."""
    found = _KERNELS.get(key)
    return found if found is not None else load(key)


def load(key: Key) -> Any:
    """Fetch, load on its device and keep the kernel of ``key`` (see :func:`kernel`).

    Raises ``RuntimeError`` while the current stream captures a CUDA graph, and what
    :func:`nvrtc_engine.get_kernel` raises (:class:`~nvrtc_engine.CompileError`...)."""
    op, in_dtype, out_dtype, hidden, device, flags = key
    _refuse_in_capture(f"kernel {op} ({in_dtype}, hidden size {hidden})", device)
    fields: dict[str, Any] = dict(flags)
    if out_dtype is not None:
        fields.update(out_dtype=ENGINE_DTYPES[out_dtype], scaling="tensor")
    found = get_kernel(
        op, in_dtype=ENGINE_DTYPES[in_dtype], hidden_size=hidden, device=device, **fields
    )
    found.loaded(device)  # the module load, now rather than at the first launch
    _KERNELS[key] = found
    return found


def fill(value: float, dtype: torch.dtype, hidden: int, like: torch.Tensor) -> torch.Tensor:
    """A kept ``(hidden,)`` tensor of ``value`` on ``like``'s device (a norm's gamma of ones or
    beta of zeros where the caller has none). Raises ``RuntimeError`` when it must be made
    during a capture."""
    key = (value, dtype, hidden, like.get_device())
    found = _FILLS.get(key)
    if found is None:
        _refuse_in_capture(f"a constant weight of {hidden} {dtype} values", key[3])
        found = _FILLS[key] = torch.full((hidden,), value, dtype=dtype, device=like.device)
    return found


def clear() -> None:
    """Forget every kernel and constant kept here and in the modules' caches (the engine's
    own caches keep theirs)."""
    _KERNELS.clear()
    _FILLS.clear()
    for cache in list(_CACHES.values()):
        cache.clear()


def _refuse_in_capture(what: str, device: int) -> None:
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"nvrtc_engine.torch: {what} on cuda:{device} is first needed while the current "
            "stream captures a CUDA graph, and loading it now would break the capture. Run "
            "the model once (forward and backward) before capturing: torch.compile's "
            "mode='reduce-overhead' and torch.cuda.make_graphed_callables do such warm-up "
            "runs; with torch.cuda.graph, run a warm-up iteration on a side stream first."
        )
