"""Argument checks of the PyTorch layer: what is wrong with a call, as a
:class:`~nvrtc_engine.ArgumentError` (a ``ValueError``) or
:class:`~nvrtc_engine.ArgumentTypeError` (a ``TypeError``) naming the argument, before
anything is fetched or launched. The fake (meta) implementations run them on every trace;
eager calls run them when a call's kernel is first fetched (a later call of the same dtypes,
hidden size and device finds its kernel, and the kernel checks shapes and devices itself).
"""

from __future__ import annotations

import math

import torch

from ..core.errors import ArgumentError, ArgumentTypeError
from ..families.activation.spec import ACTIVATION_SPECS
from . import _kernels

__all__ = [
    "GATED",
    "PLAIN",
    "activation",
    "activation_grad",
    "cast",
    "fp8_activation",
    "fp8_args",
    "fp8_norm",
    "like",
    "matrix",
    "norm_weights",
    "tensor",
    "transpose",
]

PLAIN: tuple[str, ...] = tuple(s.name for s in ACTIVATION_SPECS if s.kind == "act")
GATED: tuple[str, ...] = tuple(s.name for s in ACTIVATION_SPECS if s.kind == "gated")
_DTYPES = "torch.float32, torch.float16 or torch.bfloat16"


def tensor(
    t: object, name: str, what: str, dtypes: dict[torch.dtype, str] = _kernels.HIGH_PRECISION
) -> torch.Tensor:
    """``t`` as an input of ``what``: a tensor on the kernels' device type, of one of
    ``dtypes`` (the high-precision ones by default), with at least one dimension."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(name, f"{what} takes a torch.Tensor, got {type(t).__name__}")
    if t.device.type != _kernels.DEVICE_TYPE:
        raise ArgumentError(
            name,
            f"is a {t.device} tensor; {what} runs on "
            f"{_kernels.DEVICE_TYPE} tensors (move it with .cuda())",
        )
    if t.dtype not in dtypes:
        allowed = _DTYPES if dtypes is _kernels.HIGH_PRECISION else ", ".join(map(str, dtypes))
        raise ArgumentTypeError(name, f"has dtype {t.dtype}; {what} takes {allowed}")
    if t.dim() == 0:
        raise ArgumentError(name, f"is a 0-dimensional tensor; {what} takes (..., hidden_size)")
    return t


def matrix(x: torch.Tensor, what: str) -> None:
    """Refuse an ``x`` that is no matrix ``(M, K)``."""
    if x.dim() != 2:
        raise ArgumentError("x", f"has shape {tuple(x.shape)}; {what} takes a matrix (M, K)")


def like(t: object, name: str, ref: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    """``t`` checked as :func:`tensor`, and of ``ref``'s dtype and device and of ``shape``."""
    tensor(t, name, what)
    assert isinstance(t, torch.Tensor)
    if t.dtype != ref.dtype:
        raise ArgumentTypeError(name, f"has dtype {t.dtype}; {what} needs x's, {ref.dtype}")
    if t.device != ref.device:
        raise ArgumentError(name, f"is on {t.device}, x on {ref.device}")
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(name, f"has shape {tuple(t.shape)}; {what} needs {tuple(shape)}")


def norm_weights(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, what: str
) -> torch.dtype:
    """Check a norm's weight (gamma) and bias (beta) against input ``x`` (checked first):
    each None or ``(hidden_size,)`` on x's device, both of one dtype, x's or (for 16-bit
    x) float32. Returns that dtype (x's where both are None)."""
    tensor(x, "x", what)
    hidden = x.shape[-1]
    dtype = None
    for name, w in (("weight", weight), ("bias", bias)):
        if w is None:
            continue
        tensor(w, name, what)
        if tuple(w.shape) != (hidden,):
            raise ArgumentError(
                name,
                f"has shape {tuple(w.shape)}; {what} of an input of "
                f"hidden size {hidden} needs ({hidden},)",
            )
        if w.device != x.device:
            raise ArgumentError(name, f"is on {w.device}, x on {x.device}")
        if dtype is not None and w.dtype != dtype:
            raise ArgumentTypeError(
                name, f"has dtype {w.dtype}, weight {dtype}; {what} takes both in one dtype"
            )
        if w.dtype != x.dtype and not (w.dtype == torch.float32 and x.element_size() == 2):
            raise ArgumentTypeError(
                name,
                f"has dtype {w.dtype}; for x of {x.dtype}, {what} "
                f"takes {x.dtype} or torch.float32 weights",
            )
        dtype = w.dtype
    return x.dtype if dtype is None else dtype


def activation(
    x: torch.Tensor, act: str, limit: float | None, what: str
) -> tuple[bool, int, tuple[int, ...]]:
    """Check ``act`` (an activation's name) and its input ``x``; returns ``(gated, hidden,
    output shape)``: a gated activation takes ``(..., 2H)`` and gives ``(..., H)``."""
    if act in PLAIN:
        gated = False
    elif act in GATED:
        gated = True
    else:
        raise ArgumentError(
            "act",
            f"{act!r} is no activation; plain: {', '.join(PLAIN)}; "
            f"gated (on [..., 2H]): {', '.join(GATED)}",
        )
    if act == "clamped_swiglu":
        if limit is None or not math.isfinite(limit) or limit <= 0:
            raise ArgumentError("limit", f"clamped_swiglu needs a finite limit > 0, got {limit}")
    elif limit is not None:
        raise ArgumentError("limit", f"only clamped_swiglu takes a limit, not {act}")
    tensor(x, "x", what)
    last = x.shape[-1]
    if not gated:
        return False, last, tuple(x.shape)
    if last % 2:
        raise ArgumentError(
            "x",
            f"has last dimension {last}; {act} takes (..., 2H): the "
            "activation half, then the linear half, so it must be even",
        )
    return True, last // 2, (*x.shape[:-1], last // 2)


def fp8_args(scale: object, amax: object, out_dtype: object, x: torch.Tensor, what: str) -> None:
    """Check tensor scaling's ``scale`` and ``amax`` (float32 tensors on x's device with at
    least one element; element 0 is used) and ``out_dtype`` (an FP8 dtype)."""
    if out_dtype not in _kernels.FP8_DTYPES:
        raise ArgumentTypeError(
            "out_dtype", f"is {out_dtype}; {what} writes torch.float8_e4m3fn or torch.float8_e5m2"
        )
    for name, t in (("scale", scale), ("amax", amax)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(name, f"{what} takes a float32 tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ArgumentTypeError(
                name, f"has dtype {t.dtype}; tensor scaling needs torch.float32"
            )
        if t.device != x.device:
            raise ArgumentError(name, f"is on {t.device}, x on {x.device}")
        if t.numel() < 1:
            raise ArgumentError(name, "is empty; element 0 is the value")


def activation_grad(
    grad: torch.Tensor, x: torch.Tensor, act: str, limit: float | None, what: str
) -> None:
    """Check an activation's backward: :func:`activation`, and ``grad`` of the forward
    output's shape, x's dtype and device."""
    shape = activation(x, act, limit, what)[2]
    like(grad, "grad", x, shape, what)


def fp8_activation(
    x: torch.Tensor,
    grad: torch.Tensor | None,
    act: str,
    limit: float | None,
    scale: object,
    amax: object,
    out_dtype: object,
    what: str,
) -> None:
    """Check an activation (``grad`` None) or its backward with an FP8 output."""
    if grad is None:
        activation(x, act, limit, what)
    else:
        activation_grad(grad, x, act, limit, what)
    fp8_args(scale, amax, out_dtype, x, what)


def fp8_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: object,
    amax: object,
    out_dtype: object,
    what: str,
) -> None:
    """Check a norm with an FP8 output."""
    norm_weights(x, weight, bias, what)
    fp8_args(scale, amax, out_dtype, x, what)


def cast(
    x: torch.Tensor, scale: object, amax: object, out_dtype: object, what: str, as_matrix: bool
) -> None:
    """Check a cast to FP8 (of a matrix ``(M, K)`` where ``as_matrix``)."""
    tensor(x, "x", what)
    if as_matrix:
        matrix(x, what)
    fp8_args(scale, amax, out_dtype, x, what)


def transpose(x: torch.Tensor) -> None:
    """Check a transpose's input: a matrix of any dtype the kernels take (FP8 too)."""
    matrix(tensor(x, "x", "transpose", _kernels.ENGINE_DTYPES), "transpose")
