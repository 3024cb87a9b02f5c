"""The eager path: a call on a plain ``torch.Tensor`` outside ``torch.compile`` and
``torch.func`` transforms (:func:`takes`) runs its kernel directly, bare where no gradient
is needed (``torch.no_grad``, no input requiring grad; the norms then write no mu or rsigma,
``stats=False``), else inside an ``autograd.Function`` whose backward calls the backward
kernel.

One function per forward, shared by :mod:`.functional` (which looks the kernel up: ``k``
None) and :mod:`.modules` (which keeps its kernels and passes ``k``). Arguments as the
:mod:`._impl` function each calls; the ``*_fp8`` ones refuse inputs that need a gradient.

The Functions are applied through the C ``apply`` that ``autograd.Function.apply`` ends in
(:func:`_direct`): the Python wrapper around it costs a few microseconds a call, all of it
for ``torch.func`` transforms, which never reach this path, and for a ``setup_context``
these Functions do not define.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import _impl

__all__ = [
    "activation",
    "activation_fp8",
    "add_rms_norm",
    "add_rms_norm_fp8",
    "layer_norm",
    "layer_norm_fp8",
    "no_grad_for_fp8",
    "rms_norm",
    "rms_norm_fp8",
    "takes",
    "transpose",
]

_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_Tensor = torch.Tensor


def takes(x: object) -> bool:
    """Whether a call on ``x`` takes the eager path: a plain tensor (no FakeTensor or other
    subclass), outside a ``torch.compile``/``torch.export`` trace and ``torch.func``
    transforms (whose wrapped tensors are plain ``torch.Tensor`` objects without storage).
    Everything else goes through the registered operators."""
    return type(x) is _Tensor and not _is_compiling() and not _transforms_active()


def _direct(fn: type[torch.autograd.Function]) -> Callable[..., Any]:
    """``fn.apply`` as the C function ``autograd.Function.apply`` calls last (see the module
    docstring): the same graph node, saved tensors and outputs; ``fn.apply`` itself on a
    PyTorch whose Function has no C base ``apply`` (a private detail that may change)."""
    try:
        return super(torch.autograd.Function, fn).apply  # type: ignore[misc,no-any-return]
    except AttributeError:
        return fn.apply


def no_grad_for_fp8(what: str, *tensors: torch.Tensor | None) -> None:
    """Raise ``RuntimeError`` where ``what``, an FP8 output, would need a backward."""
    if _grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"nvrtc_engine.torch.{what}: an FP8 output has no backward here; call it under "
            "torch.no_grad() or torch.inference_mode(), or on tensors that do not require grad"
        )


# -- activations ------------------------------------------------------------------------------


class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        act: str,
        limit: float | None,
        alpha: float,
        linear_offset: float,
        k: Any,
    ) -> torch.Tensor:
        ctx.save_for_backward(x)  # (the backward makes it contiguous)
        ctx.params = (act, limit, alpha, linear_offset)
        return _impl.act_fwd(x, act, limit, alpha, linear_offset, k)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        return _impl.act_bwd(grad, x, *ctx.params), None, None, None, None, None


_activation = _direct(_Activation)


def activation(
    x: torch.Tensor, act: str, limit: float | None, alpha: float, linear_offset: float, k: Any
) -> torch.Tensor:
    if _grad_enabled() and x.requires_grad:
        return _activation(x, act, limit, alpha, linear_offset, k)
    return _impl.act_fwd(x, act, limit, alpha, linear_offset, k)


def activation_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    act: str,
    out_dtype: torch.dtype,
    limit: float | None,
    alpha: float,
    linear_offset: float,
    k: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    no_grad_for_fp8("activation_fp8", x)
    return _impl.act_fp8(x, scale, amax, act, out_dtype, limit, alpha, linear_offset, k)


# -- norms ------------------------------------------------------------------------------------


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        zcg: bool,
        k: Any,
    ) -> torch.Tensor:
        z, mu, rsigma = _impl.layer_norm_fwd(x, weight, bias, eps, zcg, k)
        ctx.save_for_backward(x, mu, rsigma, weight)  # (the backward makes x contiguous)
        ctx.zcg = zcg
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dz: torch.Tensor) -> tuple[Any, ...]:
        x, mu, rsigma, weight = ctx.saved_tensors
        dx, dw, db = _impl.layer_norm_bwd(dz, x, mu, rsigma, weight, ctx.zcg)
        _, has_w, has_b = ctx.needs_input_grad[:3]
        return dx, dw if has_w else None, db if has_b else None, None, None, None


_layer_norm = _direct(_LayerNorm)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    zcg: bool,
    k: Any,
) -> torch.Tensor:
    if _grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return _layer_norm(x, weight, bias, eps, zcg, k)
    return _impl.layer_norm_fwd(x, weight, bias, eps, zcg, k, False)[0]


def layer_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool,
    k: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    no_grad_for_fp8("layer_norm_fp8", x, weight, bias)
    return _impl.layer_norm_fp8(x, weight, bias, eps, scale, amax, out_dtype, zcg, k)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, eps: float, zcg: bool, k: Any
    ) -> torch.Tensor:
        z, rsigma = _impl.rms_norm_fwd(x, weight, eps, zcg, k)
        ctx.save_for_backward(x, rsigma, weight)  # (the backward makes x contiguous)
        ctx.zcg = zcg
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dz: torch.Tensor) -> tuple[Any, ...]:
        x, rsigma, weight = ctx.saved_tensors
        dx, dw = _impl.rms_norm_bwd(dz, x, rsigma, weight, ctx.zcg)
        return dx, dw if ctx.needs_input_grad[1] else None, None, None, None


_rms_norm = _direct(_RMSNorm)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, zcg: bool, k: Any
) -> torch.Tensor:
    if _grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return _rms_norm(x, weight, eps, zcg, k)
    return _impl.rms_norm_fwd(x, weight, eps, zcg, k, False)[0]


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool,
    k: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    no_grad_for_fp8("rms_norm_fp8", x, weight)
    return _impl.rms_norm_fp8(x, weight, eps, scale, amax, out_dtype, zcg, k)


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        zcg: bool,
        k: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z, h, rsigma = _impl.add_rms_norm_fwd(x, residual, weight, eps, zcg, k)
        ctx.save_for_backward(h, rsigma, weight)
        ctx.zcg = zcg
        ctx.set_materialize_grads(False)  # no gradient of h: rms_norm's backward alone
        return z, h

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dz: torch.Tensor | None, dh: torch.Tensor | None) -> tuple[Any, ...]:
        h, rsigma, weight = ctx.saved_tensors
        if dz is None:  # only h was used
            return dh, dh, None, None, None, None
        dx, dw = _impl.rms_norm_bwd(dz, h, rsigma, weight, ctx.zcg, dh)
        return dx, dx, dw if ctx.needs_input_grad[2] else None, None, None, None


_add_rms_norm = _direct(_AddRMSNorm)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    zcg: bool,
    k: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    if _grad_enabled() and (
        x.requires_grad
        or getattr(residual, "requires_grad", False)
        or (weight is not None and weight.requires_grad)
    ):
        return _add_rms_norm(x, residual, weight, eps, zcg, k)
    z, h, _ = _impl.add_rms_norm_fwd(x, residual, weight, eps, zcg, k, False)
    return z, h


def add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool,
    k: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    no_grad_for_fp8("add_rms_norm_fp8", x, residual, weight)
    return _impl.add_rms_norm_fp8(x, residual, weight, eps, scale, amax, out_dtype, zcg, k)


# -- transpose --------------------------------------------------------------------------------


class _Transpose(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _impl.transpose(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _impl.transpose(grad)


_transpose = _direct(_Transpose)


def transpose(x: torch.Tensor) -> torch.Tensor:
    if _grad_enabled() and x.requires_grad:
        return _transpose(x)
    return _impl.transpose(x)
