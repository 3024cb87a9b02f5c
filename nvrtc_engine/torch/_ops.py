"""The ``torch.ops.nvrtc_engine`` operators: schemas, implementations (CPU and CUDA: one
function, which refuses what is not on the kernels' device), fake implementations (shapes and
dtypes, and the same argument checks, for FakeTensorMode, torch.compile and torch.export) and
the backward formulas of the differentiable ones.

The ``*_fp8`` operators write an FP8 tensor with tensor scaling and max-reduce into ``amax``,
which their schemas mark as mutated (``Tensor(a!) amax``); they have no backward (FP8 outputs
are for inference and for feeding ``torch._scaled_mm``). The ``*_backward`` operators are
what the backward formulas call; they are not differentiable themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..families.activation.kernels import CLAMPED_SWIGLU_ALPHA, CLAMPED_SWIGLU_LINEAR_OFFSET
from . import _checks, _impl

__all__ = ["LIB", "NAMESPACE", "SCHEMAS"]

NAMESPACE = "nvrtc_engine"
_CLAMP = (
    f"float? limit=None, float alpha={CLAMPED_SWIGLU_ALPHA}, "
    f"float linear_offset={CLAMPED_SWIGLU_LINEAR_OFFSET}"
)
_ZCG = "bool zero_centered_gamma=False"
_SCALING = "Tensor scale, Tensor(a!) amax"
# name -> schema; the order of the arguments is the order of the _impl function's
SCHEMAS: dict[str, str] = {
    "activation": f"(Tensor x, str act, {_CLAMP}) -> Tensor",
    "activation_backward": f"(Tensor grad, Tensor x, str act, {_CLAMP}) -> Tensor",
    "activation_fp8": f"(Tensor x, {_SCALING}, str act, ScalarType out_dtype, {_CLAMP}) "
    "-> (Tensor, Tensor)",
    "activation_backward_fp8": f"(Tensor grad, Tensor x, {_SCALING}, str act, "
    f"ScalarType out_dtype, {_CLAMP}) -> (Tensor, Tensor)",
    "layer_norm": f"(Tensor x, Tensor? weight, Tensor? bias, float eps, {_ZCG}) "
    "-> (Tensor, Tensor, Tensor)",
    "layer_norm_backward": f"(Tensor dz, Tensor x, Tensor mu, Tensor rsigma, Tensor? weight, "
    f"{_ZCG}) -> (Tensor, Tensor, Tensor)",
    "layer_norm_fp8": f"(Tensor x, Tensor? weight, Tensor? bias, float eps, {_SCALING}, "
    f"ScalarType out_dtype, {_ZCG}) -> (Tensor, Tensor)",
    "rms_norm": f"(Tensor x, Tensor? weight, float eps, {_ZCG}) -> (Tensor, Tensor)",
    "rms_norm_backward": f"(Tensor dz, Tensor x, Tensor rsigma, Tensor? weight, {_ZCG}, "
    "Tensor? add=None) -> (Tensor, Tensor)",
    "rms_norm_fp8": f"(Tensor x, Tensor? weight, float eps, {_SCALING}, ScalarType out_dtype, "
    f"{_ZCG}) -> (Tensor, Tensor)",
    "add_rms_norm": f"(Tensor x, Tensor residual, Tensor? weight, float eps, {_ZCG}) "
    "-> (Tensor, Tensor, Tensor)",
    "add_rms_norm_fp8": f"(Tensor x, Tensor residual, Tensor? weight, float eps, {_SCALING}, "
    f"ScalarType out_dtype, {_ZCG}) -> (Tensor, Tensor, Tensor)",
    "cast_fp8": f"(Tensor x, {_SCALING}, ScalarType out_dtype) -> (Tensor, Tensor)",
    "cast_transpose_fp8": f"(Tensor x, {_SCALING}, ScalarType out_dtype) "
    "-> (Tensor, Tensor, Tensor)",
    "transpose": "(Tensor x) -> Tensor",
}

IMPLS: dict[str, Callable[..., Any]] = {
    "activation": _impl.act_fwd,
    "activation_backward": _impl.act_bwd,
    "activation_fp8": _impl.act_fp8,
    "activation_backward_fp8": _impl.act_bwd_fp8,
    "layer_norm": _impl.layer_norm_fwd,
    "layer_norm_backward": _impl.layer_norm_bwd,
    "layer_norm_fp8": _impl.layer_norm_fp8,
    "rms_norm": _impl.rms_norm_fwd,
    "rms_norm_backward": _impl.rms_norm_bwd,
    "rms_norm_fp8": _impl.rms_norm_fp8,
    "add_rms_norm": _impl.add_rms_norm_fwd,
    "add_rms_norm_fp8": _impl.add_rms_norm_fp8,
    "cast_fp8": _impl.cast_fp8,
    "cast_transpose_fp8": _impl.cast_transpose_fp8,
    "transpose": _impl.transpose,
}


# -- fake implementations: the outputs' shapes and dtypes, after the calls' checks -------------


def _empty(like: torch.Tensor, shape: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(
        tuple(shape), dtype=like.dtype if dtype is None else dtype, device=like.device
    )


def _scale_inv(x: torch.Tensor) -> torch.Tensor:
    return _empty(x, (1,), torch.float32)


def _stats(x: torch.Tensor) -> torch.Tensor:
    return _empty(x, x.shape[:-1], torch.float32)


def _fake_activation(
    x: torch.Tensor,
    act: str,
    limit: float | None = None,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> torch.Tensor:
    return _empty(x, _checks.activation(x, act, limit, "activation")[2])


def _fake_activation_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    act: str,
    limit: float | None = None,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> torch.Tensor:
    _checks.activation_grad(grad, x, act, limit, "activation_backward")
    return _empty(x, x.shape)


def _fake_activation_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    act: str,
    out_dtype: torch.dtype,
    limit: float | None = None,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = _checks.activation(x, act, limit, "activation_fp8")[2]
    _checks.fp8_args(scale, amax, out_dtype, x, "activation_fp8")
    return _empty(x, shape, out_dtype), _scale_inv(x)


def _fake_activation_backward_fp8(
    grad: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    act: str,
    out_dtype: torch.dtype,
    limit: float | None = None,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.activation_grad(grad, x, act, limit, "activation_backward_fp8")
    _checks.fp8_args(scale, amax, out_dtype, x, "activation_backward_fp8")
    return _empty(x, x.shape, out_dtype), _scale_inv(x)


def _fake_layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, bias, "layer_norm")
    return _empty(x, x.shape), _stats(x), _stats(x)


def _weight_grad(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _empty(x, (x.shape[-1],), dtype)


def _fake_layer_norm_backward(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    weight: torch.Tensor | None,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = _checks.norm_weights(x, weight, None, "layer_norm_backward")
    _checks.like(dz, "dz", x, tuple(x.shape), "layer_norm_backward")
    return _empty(x, x.shape), _weight_grad(x, dtype), _weight_grad(x, dtype)


def _fake_layer_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, bias, "layer_norm_fp8")
    _checks.fp8_args(scale, amax, out_dtype, x, "layer_norm_fp8")
    return _empty(x, x.shape, out_dtype), _scale_inv(x)


def _fake_rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, zero_centered_gamma: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, None, "rms_norm")
    return _empty(x, x.shape), _stats(x)


def _fake_rms_norm_backward(
    dz: torch.Tensor,
    x: torch.Tensor,
    rsigma: torch.Tensor,
    weight: torch.Tensor | None,
    zero_centered_gamma: bool = False,
    add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = _checks.norm_weights(x, weight, None, "rms_norm_backward")
    _checks.like(dz, "dz", x, tuple(x.shape), "rms_norm_backward")
    if add is not None:
        _checks.like(add, "add", x, tuple(x.shape), "rms_norm_backward")
    return _empty(x, x.shape), _weight_grad(x, dtype)


def _fake_rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, None, "rms_norm_fp8")
    _checks.fp8_args(scale, amax, out_dtype, x, "rms_norm_fp8")
    return _empty(x, x.shape, out_dtype), _scale_inv(x)


def _fake_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, None, "add_rms_norm")
    _checks.like(residual, "residual", x, tuple(x.shape), "add_rms_norm")
    return _empty(x, x.shape), _empty(x, x.shape), _stats(x)


def _fake_add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.norm_weights(x, weight, None, "add_rms_norm_fp8")
    _checks.like(residual, "residual", x, tuple(x.shape), "add_rms_norm_fp8")
    _checks.fp8_args(scale, amax, out_dtype, x, "add_rms_norm_fp8")
    return _empty(x, x.shape, out_dtype), _empty(x, x.shape), _scale_inv(x)


def _fake_cast_fp8(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.cast(x, scale, amax, out_dtype, "cast_fp8", False)
    return _empty(x, x.shape, out_dtype), _scale_inv(x)


def _fake_cast_transpose_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _checks.cast(x, scale, amax, out_dtype, "cast_transpose_fp8", True)
    m, k = x.shape
    return _empty(x, (m, k), out_dtype), _empty(x, (k, m), out_dtype), _scale_inv(x)


def _fake_transpose(x: torch.Tensor) -> torch.Tensor:
    _checks.transpose(x)
    return _empty(x, (x.shape[1], x.shape[0]))


FAKES: dict[str, Callable[..., Any]] = {name: globals()[f"_fake_{name}"] for name in SCHEMAS}


# -- backward formulas ------------------------------------------------------------------------


def _setup_activation(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.params = inputs[1:]


def _backward_activation(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (x,) = ctx.saved_tensors
    dx = torch.ops.nvrtc_engine.activation_backward(grad, x, *ctx.params)
    return dx, None, None, None, None


def _setup_layer_norm(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, bias, _, zcg = inputs
    _, mu, rsigma = output
    ctx.mark_non_differentiable(mu, rsigma)
    ctx.save_for_backward(x, mu, rsigma, weight)
    ctx.zcg, ctx.has_weight, ctx.has_bias = zcg, weight is not None, bias is not None


def _backward_layer_norm(ctx: Any, dz: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    x, mu, rsigma, weight = ctx.saved_tensors
    dx, dw, db = torch.ops.nvrtc_engine.layer_norm_backward(dz, x, mu, rsigma, weight, ctx.zcg)
    return dx, dw if ctx.has_weight else None, db if ctx.has_bias else None, None, None


def _setup_rms_norm(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, _, zcg = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, output[1], weight)
    ctx.zcg, ctx.has_weight = zcg, weight is not None


def _backward_rms_norm(ctx: Any, dz: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    x, rsigma, weight = ctx.saved_tensors
    dx, dw = torch.ops.nvrtc_engine.rms_norm_backward(dz, x, rsigma, weight, ctx.zcg)
    return dx, dw if ctx.has_weight else None, None, None


def _setup_add_rms_norm(
    ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]
) -> None:
    _, _, weight, _, zcg = inputs
    _, h, rsigma = output
    ctx.mark_non_differentiable(rsigma)
    ctx.save_for_backward(h, rsigma, weight)
    ctx.zcg, ctx.has_weight = zcg, weight is not None


def _backward_add_rms_norm(
    ctx: Any, dz: torch.Tensor, dh: torch.Tensor | None, *_: Any
) -> tuple[Any, ...]:
    h, rsigma, weight = ctx.saved_tensors
    # the gradient of h = x + residual reaches both: the norm's, plus h's own (dh)
    dx, dw = torch.ops.nvrtc_engine.rms_norm_backward(dz, h, rsigma, weight, ctx.zcg, dh)
    return dx, dx, dw if ctx.has_weight else None, None, None


def _setup_transpose(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    pass


def _backward_transpose(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return torch.ops.nvrtc_engine.transpose(grad)


_AUTOGRAD = ("activation", "layer_norm", "rms_norm", "add_rms_norm", "transpose")

LIB = torch.library.Library(NAMESPACE, "DEF")
for _name, _schema in SCHEMAS.items():
    LIB.define(_name + _schema, tags=(torch.Tag.pt2_compliant_tag,))
    for _key in ("CPU", "CUDA"):  # CPU: the implementation's checks refuse the tensors
        LIB.impl(_name, IMPLS[_name], _key)
    torch.library.register_fake(f"{NAMESPACE}::{_name}", FAKES[_name], lib=LIB)
for _name in _AUTOGRAD:
    torch.library.register_autograd(
        f"{NAMESPACE}::{_name}",
        globals()[f"_backward_{_name}"],
        setup_context=globals()[f"_setup_{_name}"],
        lib=LIB,
    )
