"""The engine's kernels called on torch tensors: one function per forward and backward of each
op, shared by the registered operators (:mod:`._ops`, their CPU and CUDA implementations)
and the eager autograd Functions (:mod:`.functional`).

Each makes its inputs contiguous, finds its kernel (:func:`._kernels.kernel`: one lookup, the
checks of :mod:`._checks` on the first call of a key; a module that keeps its kernels gives
a forward its kernel ``k``, of the key :func:`act_key` or :func:`norm_key` makes), calls it
on PyTorch's current stream and returns new tensors. A norm without weight (gamma) or bias
(beta) gets kept ones or zeros (:func:`._kernels.fill`). ``limit``, ``alpha`` and
``linear_offset`` are clamped SwiGLU's (``limit`` None for every other activation).
"""

from __future__ import annotations

from typing import Any

import torch

from ..families.activation.kernels import CLAMPED_SWIGLU_ALPHA as ALPHA
from ..families.activation.kernels import CLAMPED_SWIGLU_LINEAR_OFFSET as OFFSET
from . import _checks
from ._kernels import Key, fill, kernel

__all__ = [
    "act_bwd",
    "act_bwd_fp8",
    "act_fwd",
    "act_fp8",
    "act_key",
    "add_rms_norm_fwd",
    "add_rms_norm_fp8",
    "cast_fp8",
    "cast_transpose_fp8",
    "layer_norm_bwd",
    "layer_norm_fp8",
    "layer_norm_fwd",
    "norm_key",
    "rms_norm_bwd",
    "rms_norm_fp8",
    "rms_norm_fwd",
    "transpose",
]

_GATED = frozenset(_checks.GATED)
_BACKWARD = {act: "d" + act for act in (*_checks.PLAIN, *_checks.GATED)}
_ZCG, _WF32 = ("zero_centered_gamma", True), ("fp32_gamma", True)
# (zero_centered_gamma, gamma of float32 for 16-bit x) -> the norm kernels' key flags
_NORM_FLAGS = {
    (False, False): (),
    (True, False): (_ZCG,),
    (False, True): (_WF32,),
    (True, True): (_ZCG, _WF32),
}


# A norm forward of x, gamma (beta) and eps launches through its call key's prepared launch
# directly (Kernel._fast2/_fast3 with the kernel's _call_tags: what its __call__ tries first,
# without its frames and result tuple) where eps is a float the kernels take as it is
_EPS_LIMIT = torch.finfo(torch.float32).max


def _scale_inv(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(1, dtype=torch.float32, device=x.device)


# -- activations ------------------------------------------------------------------------------


def _act_call(
    k: object,
    args: tuple[torch.Tensor, ...],
    act: str,
    limit: float | None,
    alpha: float,
    linear_offset: float,
    **scaling: torch.Tensor,
) -> torch.Tensor:
    if act == "clamped_swiglu":
        return k(*args, limit=limit, alpha=alpha, linear_offset=linear_offset, **scaling)  # type: ignore[operator]
    return k(*args, **scaling)  # type: ignore[operator]


def act_key(op: str, x: torch.Tensor, act: str, out_dtype: torch.dtype | None) -> Key:
    """The kernel key of activation ``act``'s ``op`` (it, or its backward) on ``x``."""
    last = x.shape[-1]
    return (op, x.dtype, out_dtype, last // 2 if act in _GATED else last, x.get_device(), ())


def act_fwd(
    x: torch.Tensor,
    act: str,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
    k: Any = None,
) -> torch.Tensor:
    """``act(x)``; gated: ``(..., 2H) -> (..., H)``."""
    x = x.contiguous()
    if k is None:
        k = kernel(act_key(act, x, act, None), _checks.activation, x, act, limit, "activation")
    return _act_call(k, (x,), act, limit, alpha, linear_offset)


def act_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    act: str,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> torch.Tensor:
    """The gradient of :func:`act_fwd` at ``x`` for ``grad`` (the output's gradient)."""
    x, grad = x.contiguous(), grad.contiguous()
    key = act_key(_BACKWARD.get(act, act), x, act, None)
    k = kernel(key, _checks.activation_grad, grad, x, act, limit, "activation backward")
    return _act_call(k, (grad, x), act, limit, alpha, linear_offset)


def act_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    act: str,
    out_dtype: torch.dtype,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
    k: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x)`` quantized to ``out_dtype`` with tensor scaling: ``(q, scale_inv)``."""
    x = x.contiguous()
    if k is None:
        k = kernel(
            act_key(act, x, act, out_dtype),
            _checks.fp8_activation,
            x,
            None,
            act,
            limit,
            scale,
            amax,
            out_dtype,
            "activation_fp8",
        )
    scale_inv = _scale_inv(x)
    q = _act_call(
        k, (x,), act, limit, alpha, linear_offset, scale=scale, amax=amax, scale_inv=scale_inv
    )
    return q, scale_inv


def act_bwd_fp8(
    grad: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    act: str,
    out_dtype: torch.dtype,
    limit: float | None = None,
    alpha: float = ALPHA,
    linear_offset: float = OFFSET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`act_bwd` quantized to ``out_dtype`` with tensor scaling: ``(q, scale_inv)``."""
    x, grad = x.contiguous(), grad.contiguous()
    key = act_key(_BACKWARD.get(act, act), x, act, out_dtype)
    k = kernel(
        key,
        _checks.fp8_activation,
        x,
        grad,
        act,
        limit,
        scale,
        amax,
        out_dtype,
        "activation_backward_fp8",
    )
    scale_inv = _scale_inv(x)
    q = _act_call(
        k, (grad, x), act, limit, alpha, linear_offset, scale=scale, amax=amax, scale_inv=scale_inv
    )
    return q, scale_inv


# -- norms ------------------------------------------------------------------------------------


def _flags(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, zcg: bool
) -> tuple[tuple[str, bool], ...]:
    """The key flags of a norm call; zero_centered_gamma only applies to a weight that is
    given, fp32_gamma to weights (or a bias alone) of another dtype than x's."""
    w = weight if weight is not None else bias
    return _NORM_FLAGS[zcg and weight is not None, w is not None and w.dtype != x.dtype]


def norm_key(
    op: str,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    zcg: bool,
    out_dtype: torch.dtype | None = None,
) -> Key:
    """The kernel key of norm kernel ``op`` on ``x`` with these weights."""
    return (op, x.dtype, out_dtype, x.shape[-1], x.get_device(), _flags(x, weight, bias, zcg))


def _gamma(weight: torch.Tensor | None, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The gamma to pass: the weight, else kept ones of the bias's dtype (else x's)."""
    if weight is not None:
        return weight
    return fill(1.0, x.dtype if bias is None else bias.dtype, x.shape[-1], x)


def _beta(bias: torch.Tensor | None, weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The beta to pass: the bias, else kept zeros of the weight's dtype (else x's)."""
    if bias is not None:
        return bias
    return fill(0.0, x.dtype if weight is None else weight.dtype, x.shape[-1], x)


def layer_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    zcg: bool = False,
    k: Any = None,
    stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dimension: ``(z, mu, rsigma)``, mu and rsigma float32
    ``x.shape[:-1]``; None (not written, not allocated) with ``stats`` False."""
    x = x.contiguous()
    if k is None:
        key = norm_key("layernorm_fwd", x, weight, bias, zcg)
        k = kernel(key, _checks.norm_weights, x, weight, bias, "layer_norm")
    gamma, beta = _gamma(weight, bias, x), _beta(bias, weight, x)
    if type(eps) is float and 0.0 <= eps < _EPS_LIMIT:
        done = k._fast3(k._call_tags[stats], x, gamma, beta, (eps,), None)
        if done is not None:  # (z, mu, rsigma), or (z,) without stats
            return (*done, None, None) if len(done) == 1 else done  # type: ignore[return-value]
    z, mu, rsigma, _ = k(x, gamma, beta, eps, stats=stats)
    return z, mu, rsigma


def layer_norm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    weight: torch.Tensor | None,
    zcg: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)`` of :func:`layer_norm_fwd` (dweight and dbias in the weights'
    dtype, also where the forward had none)."""
    x, dz = x.contiguous(), dz.contiguous()
    key = norm_key("layernorm_bwd", x, weight, None, zcg)
    k = kernel(key, _checks.norm_weights, x, weight, None, "layer_norm backward")
    dx, dgamma, dbeta = k(dz, x, mu, rsigma, _gamma(weight, None, x))
    return dx, dgamma, dbeta


def layer_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool = False,
    k: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm quantized to ``out_dtype`` with tensor scaling: ``(q, scale_inv)``."""
    x = x.contiguous()
    if k is None:
        key = norm_key("layernorm_fwd", x, weight, bias, zcg, out_dtype)
        k = kernel(key, _checks.fp8_norm, x, weight, bias, scale, amax, out_dtype, "layer_norm_fp8")
    scale_inv = _scale_inv(x)
    gamma, beta = _gamma(weight, bias, x), _beta(bias, weight, x)
    z = k(x, gamma, beta, eps, scale=scale, amax=amax, scale_inv=scale_inv, stats=False)[0]
    return z, scale_inv


def rms_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    zcg: bool = False,
    k: Any = None,
    stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension: ``(z, rsigma)``, rsigma float32 ``x.shape[:-1]``;
    None (not written, not allocated) with ``stats`` False."""
    x = x.contiguous()
    if k is None:
        key = norm_key("rmsnorm_fwd", x, weight, None, zcg)
        k = kernel(key, _checks.norm_weights, x, weight, None, "rms_norm")
    gamma = _gamma(weight, None, x)
    if type(eps) is float and 0.0 <= eps < _EPS_LIMIT:
        done = k._fast2(k._call_tags[stats], x, gamma, (eps,), None)
        if done is not None:  # (z, rsigma), or (z,) without stats
            return (done[0], None) if len(done) == 1 else done  # type: ignore[return-value]
    z, rsigma, _ = k(x, gamma, eps, stats=stats)
    return z, rsigma


def rms_norm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    rsigma: torch.Tensor,
    weight: torch.Tensor | None,
    zcg: bool = False,
    add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` of :func:`rms_norm_fwd`; with ``add`` (x's shape and dtype, the
    gradient reaching x by another path) ``dx`` includes it (``rmsnorm_bwd_add``)."""
    x, dz = x.contiguous(), dz.contiguous()
    op = "rmsnorm_bwd" if add is None else "rmsnorm_bwd_add"
    key = norm_key(op, x, weight, None, zcg)
    k = kernel(key, _checks.norm_weights, x, weight, None, "rms_norm backward")
    gamma = _gamma(weight, None, x)
    if add is None:
        dx, dgamma = k(dz, x, rsigma, gamma)
    else:
        dx, dgamma = k(dz, x, rsigma, gamma, add.contiguous())
    return dx, dgamma


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool = False,
    k: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm quantized to ``out_dtype`` with tensor scaling: ``(q, scale_inv)``."""
    x = x.contiguous()
    if k is None:
        key = norm_key("rmsnorm_fwd", x, weight, None, zcg, out_dtype)
        k = kernel(key, _checks.fp8_norm, x, weight, None, scale, amax, out_dtype, "rms_norm_fp8")
    scale_inv = _scale_inv(x)
    gamma = _gamma(weight, None, x)
    z = k(x, gamma, eps, scale=scale, amax=amax, scale_inv=scale_inv, stats=False)[0]
    return z, scale_inv


def _residual(x: torch.Tensor, residual: torch.Tensor, what: str) -> torch.Tensor:
    """``x + residual``, the sum the fused norm normalizes (and returns)."""
    if (
        not isinstance(residual, torch.Tensor)
        or residual.shape != x.shape
        or residual.dtype != x.dtype
        or residual.get_device() != x.get_device()
    ):
        _checks.tensor(x, "x", what)
        _checks.like(residual, "residual", x, tuple(x.shape), what)
    return torch.add(x, residual)


def add_rms_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    zcg: bool = False,
    k: Any = None,
    stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h = x + residual``, then RMSNorm of h: ``(z, h, rsigma)`` (``k``: the
    ``rmsnorm_fwd`` kernel; rsigma None with ``stats`` False)."""
    h = _residual(x, residual, "add_rms_norm")
    z, rsigma = rms_norm_fwd(h, weight, eps, zcg, k, stats)
    return z, h, rsigma


def add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
    zcg: bool = False,
    k: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h = x + residual``, then :func:`rms_norm_fp8` of h: ``(q, h, scale_inv)``."""
    h = _residual(x, residual, "add_rms_norm_fp8")
    q, scale_inv = rms_norm_fp8(h, weight, eps, scale, amax, out_dtype, zcg, k)
    return q, h, scale_inv


# -- cast and transpose -----------------------------------------------------------------------


def cast_fp8(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` quantized to ``out_dtype`` with tensor scaling: ``(q, scale_inv)``."""
    x = x.contiguous()
    key = ("cast", x.dtype, out_dtype, x.shape[-1], x.get_device(), ())
    k = kernel(key, _checks.cast, x, scale, amax, out_dtype, "cast_fp8", False)
    scale_inv = _scale_inv(x)
    return k(x, scale=scale, amax=amax, scale_inv=scale_inv), scale_inv


def cast_transpose_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` ``(M, K)`` quantized to ``out_dtype`` with tensor scaling, and its transpose:
    ``(q, qt, scale_inv)``, q ``(M, K)`` and qt ``(K, M)`` sharing one scale."""
    x = x.contiguous()
    key = ("cast_transpose", x.dtype, out_dtype, x.shape[-1], x.get_device(), ())
    k = kernel(key, _checks.cast, x, scale, amax, out_dtype, "cast_transpose_fp8", True)
    scale_inv = _scale_inv(x)
    q, qt = k(x, scale=scale, amax=amax, scale_inv=scale_inv)
    return q, qt, scale_inv


def transpose(x: torch.Tensor) -> torch.Tensor:
    """``x.T`` of a matrix ``(M, K)`` as a new contiguous ``(K, M)`` tensor (FP8 too)."""
    x = x.contiguous()
    key = ("transpose", x.dtype, None, x.shape[-1], x.get_device(), ())
    return kernel(key, _checks.transpose, x)(x)
