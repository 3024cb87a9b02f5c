"""Functions on torch tensors that call the engine's kernels, with autograd.

Each function takes the eager path (:mod:`._eager`) when its input is a plain
``torch.Tensor`` outside ``torch.compile``: the kernel is called directly (one dictionary
lookup finds it), inside an ``autograd.Function`` whose backward calls the backward kernel
where a gradient is needed, or bare where none is (``torch.no_grad``, inputs without
``requires_grad``). Anything else
(a trace of ``torch.compile`` or ``torch.export``, FakeTensors, other tensor subclasses)
goes through the registered operator ``torch.ops.nvrtc_engine.*``, whose fake
implementation and backward formula those systems read. The two paths launch the same
kernels; the eager one skips the dispatcher's several microseconds per call.

Shapes: ``x`` is ``(..., hidden_size)``; a gated activation takes ``(..., 2H)`` (the
activation half first, then the linear half: TransformerEngine's layout) and returns
``(..., H)``. Dtypes: ``x`` float32, float16 or bfloat16; a norm's weight and bias of x's
dtype or (for 16-bit x) float32; outputs of x's dtype, or an FP8 dtype for the ``*_fp8``
functions, which return an :class:`FP8Output` for ``torch._scaled_mm``. Errors:
:class:`~nvrtc_engine.ArgumentError` (``ValueError``) and
:class:`~nvrtc_engine.ArgumentTypeError` (``TypeError``) naming the argument, before
anything is launched. Math: TransformerEngine's, computed in fp32 (docs/activations.md,
docs/norms.md, docs/cast.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.errors import ArgumentTypeError
from ..families.activation.kernels import CLAMPED_SWIGLU_ALPHA as ALPHA
from ..families.activation.kernels import CLAMPED_SWIGLU_LINEAR_OFFSET as OFFSET
from . import _eager, _impl
from . import _ops as _ops  # registers torch.ops.nvrtc_engine

__all__ = [
    "FP8Output",
    "activation",
    "activation_backward",
    "activation_backward_fp8",
    "activation_fp8",
    "add_rms_norm",
    "add_rms_norm_fp8",
    "cast_fp8",
    "cast_transpose_fp8",
    "layer_norm",
    "layer_norm_fp8",
    "rms_norm",
    "rms_norm_fp8",
    "transpose",
]

_E4M3 = torch.float8_e4m3fn
_ops_ns = torch.ops.nvrtc_engine
_is_eager = _eager.takes
_Tensor = torch.Tensor


class FP8Output(NamedTuple):
    """An FP8 tensor with tensor scaling: ``data`` (``torch.float8_e4m3fn`` or
    ``torch.float8_e5m2``) holds ``value * scale`` rounded and saturated; ``scale_inv``
    (float32, shape ``(1,)``) is ``1 / scale``, so ``data.float() * scale_inv`` is the value,
    and ``torch._scaled_mm(data, w, scale_a=scale_inv, scale_b=...)`` multiplies by it."""

    data: torch.Tensor
    scale_inv: torch.Tensor


def _tensor(x: object, name: str = "x") -> None:
    if not isinstance(x, _Tensor):
        raise ArgumentTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")


# -- activations ------------------------------------------------------------------------------


def activation(
    x: torch.Tensor,
    act: str,
    *,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> torch.Tensor:
    """``act(x)``: plain (``gelu`` (tanh form), ``qgelu``, ``silu``, ``relu``, ``srelu``,
    ``sigmoid``: x's shape) or gated (``glu``, ``geglu``, ``qgeglu``, ``swiglu``, ``reglu``,
    ``sreglu``, ``clamped_swiglu``: ``(..., 2H) -> (..., H)``, ``act(a) * b`` for
    ``x = [a | b]``). ``limit``, ``alpha``, ``linear_offset``: clamped SwiGLU's (GPT-OSS),
    ``limit`` required there and refused elsewhere. Differentiable in ``x``."""
    _tensor(x)
    if not _is_eager(x):
        return _ops_ns.activation(x, act, limit, alpha, linear_offset)
    return _eager.activation(x, act, limit, alpha, linear_offset, None)


def activation_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    act: str,
    *,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> torch.Tensor:
    """The gradient of :func:`activation` at ``x`` for ``grad`` (the output's gradient):
    x's shape (gated: ``[d/da | d/db]``, ``(..., 2H)``). Not differentiable."""
    _tensor(grad, "grad")
    _tensor(x)
    if not _is_eager(x):
        return _ops_ns.activation_backward(grad, x, act, limit, alpha, linear_offset)
    return _impl.act_bwd(grad, x, act, limit, alpha, linear_offset)


def activation_fp8(
    x: torch.Tensor,
    act: str,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
    *,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> FP8Output:
    """:func:`activation` quantized with tensor scaling (TransformerEngine's): ``data =
    fp8_satfinite(y * scale[0])``; ``amax[0]`` is max-reduced with ``max |y|`` (in place:
    zero it when a new amax period starts); ``scale_inv = 1 / scale``. ``scale``, ``amax``:
    float32 tensors on x's device. No gradient (inference)."""
    _tensor(x)
    if not _is_eager(x):
        _eager.no_grad_for_fp8("activation_fp8", x)
        return FP8Output(
            *_ops_ns.activation_fp8(x, scale, amax, act, out_dtype, limit, alpha, linear_offset)
        )
    return FP8Output(
        *_eager.activation_fp8(x, scale, amax, act, out_dtype, limit, alpha, linear_offset, None)
    )


def activation_backward_fp8(
    grad: torch.Tensor,
    x: torch.Tensor,
    act: str,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
    *,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> FP8Output:
    """:func:`activation_backward` quantized with tensor scaling as :func:`activation_fp8`
    (the gated backward's output feeding an FP8 GEMM). Not differentiable."""
    _tensor(grad, "grad")
    _tensor(x)
    if not _is_eager(x):
        return FP8Output(
            *_ops_ns.activation_backward_fp8(
                grad, x, scale, amax, act, out_dtype, limit, alpha, linear_offset
            )
        )
    return FP8Output(
        *_impl.act_bwd_fp8(grad, x, scale, amax, act, out_dtype, limit, alpha, linear_offset)
    )


# -- norms ------------------------------------------------------------------------------------


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``
    (biased variance; ``weight + 1`` with ``zero_centered_gamma``; no weight: 1, no bias:
    0). Differentiable in x, weight and bias."""
    _tensor(x)
    if not _is_eager(x):
        return _ops_ns.layer_norm(x, weight, bias, eps, zero_centered_gamma)[0]
    return _eager.layer_norm(x, weight, bias, eps, zero_centered_gamma, None)


def layer_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
    *,
    zero_centered_gamma: bool = False,
) -> FP8Output:
    """:func:`layer_norm` quantized with tensor scaling (see :func:`activation_fp8`)."""
    _tensor(x)
    if not _is_eager(x):
        _eager.no_grad_for_fp8("layer_norm_fp8", x, weight, bias)
        return FP8Output(
            *_ops_ns.layer_norm_fp8(
                x, weight, bias, eps, scale, amax, out_dtype, zero_centered_gamma
            )
        )
    return FP8Output(
        *_eager.layer_norm_fp8(
            x, weight, bias, eps, scale, amax, out_dtype, zero_centered_gamma, None
        )
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x^2) + eps) * weight`` (``weight + 1``
    with ``zero_centered_gamma``; no weight: 1). Differentiable in x and weight."""
    _tensor(x)
    if not _is_eager(x):
        return _ops_ns.rms_norm(x, weight, eps, zero_centered_gamma)[0]
    return _eager.rms_norm(x, weight, eps, zero_centered_gamma, None)


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
    *,
    zero_centered_gamma: bool = False,
) -> FP8Output:
    """:func:`rms_norm` quantized with tensor scaling (see :func:`activation_fp8`)."""
    _tensor(x)
    if not _is_eager(x):
        _eager.no_grad_for_fp8("rms_norm_fp8", x, weight)
        return FP8Output(
            *_ops_ns.rms_norm_fp8(x, weight, eps, scale, amax, out_dtype, zero_centered_gamma)
        )
    return FP8Output(
        *_eager.rms_norm_fp8(x, weight, eps, scale, amax, out_dtype, zero_centered_gamma, None)
    )


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it: ``h = x + residual``, ``z = rms_norm(h,
    weight, eps)``; returns ``(z, h)`` (h: the residual stream going on). Both of x's shape
    and dtype. The backward is one kernel (``rmsnorm_bwd_add``: the norm's gradient plus
    h's own); the forward adds in torch, then runs the norm kernel. Differentiable in x,
    residual and weight."""
    _tensor(x)
    if not _is_eager(x):
        z, h, _ = _ops_ns.add_rms_norm(x, residual, weight, eps, zero_centered_gamma)
        return z, h
    return _eager.add_rms_norm(x, residual, weight, eps, zero_centered_gamma, None)


def add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
    *,
    zero_centered_gamma: bool = False,
) -> tuple[FP8Output, torch.Tensor]:
    """:func:`add_rms_norm` with z quantized as :func:`rms_norm_fp8`: ``(FP8Output, h)``."""
    _tensor(x)
    if not _is_eager(x):
        _eager.no_grad_for_fp8("add_rms_norm_fp8", x, residual, weight)
        q, h, scale_inv = _ops_ns.add_rms_norm_fp8(
            x, residual, weight, eps, scale, amax, out_dtype, zero_centered_gamma
        )
    else:
        q, h, scale_inv = _eager.add_rms_norm_fp8(
            x, residual, weight, eps, scale, amax, out_dtype, zero_centered_gamma, None
        )
    return FP8Output(q, scale_inv), h


# -- cast and transpose -----------------------------------------------------------------------


def cast_fp8(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype = _E4M3
) -> FP8Output:
    """``x`` quantized with tensor scaling (see :func:`activation_fp8`), x's shape."""
    _tensor(x)
    _eager.no_grad_for_fp8("cast_fp8", x)
    if not _is_eager(x):
        return FP8Output(*_ops_ns.cast_fp8(x, scale, amax, out_dtype))
    return FP8Output(*_impl.cast_fp8(x, scale, amax, out_dtype))


def cast_transpose_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype = _E4M3,
) -> tuple[FP8Output, torch.Tensor]:
    """A matrix ``x`` ``(M, K)`` quantized as :func:`cast_fp8`, and its transpose in one pass:
    ``(FP8Output(data (M, K), scale_inv), data_t (K, M))``, one scale for both (``data_t``
    is the row-major ``(K, M)`` operand ``torch._scaled_mm`` wants as ``.t()``)."""
    _tensor(x)
    _eager.no_grad_for_fp8("cast_transpose_fp8", x)
    if not _is_eager(x):
        q, qt, scale_inv = _ops_ns.cast_transpose_fp8(x, scale, amax, out_dtype)
    else:
        q, qt, scale_inv = _impl.cast_transpose_fp8(x, scale, amax, out_dtype)
    return FP8Output(q, scale_inv), qt


def transpose(x: torch.Tensor) -> torch.Tensor:
    """``x.T`` of a matrix ``(M, K)`` as a new contiguous ``(K, M)`` tensor, any dtype the
    kernels take (FP8 data too: its scale_inv stays valid). Differentiable."""
    _tensor(x)
    if not _is_eager(x):
        return _ops_ns.transpose(x)
    return _eager.transpose(x)
