"""Modules that run the engine's kernels: drop-in replacements for ``torch.nn.LayerNorm``,
``torch.nn.RMSNorm``, ``torch.nn.GELU`` (tanh), ``SiLU``, ``ReLU`` and ``Sigmoid`` (same
constructor arguments, ``state_dict`` keys and ``reset_parameters``), TransformerEngine's
other activations and gated activations, and :class:`AddRMSNorm` (the residual add and the
RMSNorm after it). In eager mode (plain ``torch.Tensor`` inputs outside ``torch.compile``) a
module calls its kernel directly (:mod:`._eager`): it keeps its kernels by its input's dtype,
hidden size and device (and the settings that choose the kernel), so a call costs one lookup;
the first call of such an input runs every argument check, then fetches the kernel. Anything
else goes through :mod:`nvrtc_engine.torch.functional`, which calls the registered operators
under ``torch.compile``.

FP8 output (``out_dtype=torch.float8_e4m3fn`` or ``torch.float8_e5m2``; the norms and the
gated activations): ``forward`` returns an :class:`~nvrtc_engine.torch.FP8Output` ``(data,
scale_inv)`` for ``torch._scaled_mm``, with tensor scaling by the module's float32 buffers
``scale`` (``(1,)``, 1.0 until you set it) and ``amax`` (``(1,)``, max-reduced with each
output's ``max |y|`` before scaling: zero it when a new amax period starts, TransformerEngine's
delayed scaling). Both stay float32 through ``module.to(dtype)`` and are not in the
``state_dict`` (so that PyTorch's checkpoints load); FP8 outputs have no backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..core.errors import ArgumentError, ArgumentTypeError
from ..families.activation.kernels import CLAMPED_SWIGLU_ALPHA, CLAMPED_SWIGLU_LINEAR_OFFSET
from . import _checks, _eager, _impl, _kernels
from . import functional as F
from .functional import FP8Output

__all__ = [
    "GEGLU",
    "GELU",
    "GLU",
    "AddRMSNorm",
    "ClampedSwiGLU",
    "LayerNorm",
    "QuickGEGLU",
    "QuickGELU",
    "RMSNorm",
    "ReGLU",
    "ReLU",
    "SiLU",
    "Sigmoid",
    "SquaredReGLU",
    "SquaredReLU",
    "SwiGLU",
]

_FINFO_EPS = {dtype: torch.finfo(dtype).eps for dtype in _kernels.HIGH_PRECISION}
_takes = _eager.takes


def _param(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """``module.<name>``, a parameter (or None), from ``module._parameters`` where it is
    registered (``module.<name>`` would go through ``Module.__getattr__``, about a
    microsecond a call), else as an attribute (parametrized, or replaced by a plain one)."""
    try:
        return module._parameters[name]
    except KeyError:
        return getattr(module, name)  # type: ignore[no-any-return]


class _FP8State(torch.nn.Module):
    """The ``out_dtype`` option: None, or an FP8 dtype with float32 ``scale`` and ``amax``
    buffers that follow the module's device but keep their dtype. Also the module's eager
    kernels (``_kernel_cache``, see the module docstring)."""

    out_dtype: torch.dtype | None
    _kernel_cache: _kernels.Cache

    def _init_fp8(self, out_dtype: torch.dtype | None, device: Any) -> None:
        if out_dtype is not None and out_dtype not in _kernels.FP8_DTYPES:
            raise ArgumentTypeError(
                "out_dtype",
                f"is {out_dtype}; expected None (the input's "
                "dtype), torch.float8_e4m3fn or torch.float8_e5m2",
            )
        self.out_dtype = out_dtype
        self._kernel_cache = _kernels.Cache()
        if out_dtype is not None:
            kw = dict(dtype=torch.float32, device=device)
            self.register_buffer("scale", torch.ones(1, **kw), persistent=False)  # type: ignore[arg-type]
            self.register_buffer("amax", torch.zeros(1, **kw), persistent=False)  # type: ignore[arg-type]

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to(dtype)/.half() would convert the scaling buffers: move them by device only
        keep = {n: self._buffers.pop(n) for n in ("scale", "amax") if n in self._buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in keep.items():
                device = fn(t.new_empty(0)).device if t is not None else None
                self._buffers[name] = t if t is None or device == t.device else t.to(device)
        return self

    def _fp8_repr(self) -> str:
        return "" if self.out_dtype is None else f", out_dtype={self.out_dtype}"


def _hidden(normalized_shape: int | Sequence[int]) -> tuple[int]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or not isinstance(shape[0], int) or isinstance(shape[0], bool):
        raise ArgumentError(
            "normalized_shape",
            f"is {normalized_shape!r}; these norms work over "
            "the last dimension: give one size (an int or a 1-element shape)",
        )
    if shape[0] < 1:
        raise ArgumentError("normalized_shape", f"is {normalized_shape!r}; the size must be >= 1")
    return (int(shape[0]),)


class _Norm(_FP8State):
    normalized_shape: tuple[int]
    eps: float | None
    elementwise_affine: bool
    zero_centered_gamma: bool

    def _init_norm(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None,
        elementwise_affine: bool,
        zero_centered_gamma: bool,
        out_dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        self.normalized_shape = _hidden(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.zero_centered_gamma = zero_centered_gamma
        self._init_fp8(out_dtype, device)

    def _check(self, x: Any) -> None:
        """Refuse an ``x`` whose last dimension is not the module's hidden size."""
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[-1] == self.normalized_shape[0]:
            return
        if not isinstance(x, torch.Tensor):
            raise ArgumentTypeError("x", f"expected a torch.Tensor, got {type(x).__name__}")
        raise ArgumentError(
            "x",
            f"has shape {tuple(x.shape)}; {type(self).__name__} with "
            f"normalized_shape={self.normalized_shape} takes (..., "
            f"{self.normalized_shape[0]})",
        )

    def _eps(self, x: torch.Tensor) -> float:
        return _FINFO_EPS.get(x.dtype, 0.0) if self.eps is None else self.eps

    def _eager_call(self, x: torch.Tensor) -> tuple[torch.Tensor | None, Any, float | None]:
        """``(weight, forward kernel, eps)`` of an eager call on ``x`` (a plain tensor); eps
        None is ``torch.finfo(x.dtype).eps`` for RMSNorm (as PyTorch's). The kernel: one
        lookup by (x's dtype, hidden size, device, the weight's dtype, zero_centered_gamma,
        out_dtype); on a miss, the call's every check first (raising what is wrong), then
        :meth:`_fetch`."""
        w = _param(self, "weight")
        try:
            k = self._kernel_cache[
                x.dtype,
                x.shape[-1],
                x.get_device(),
                None if w is None else w.dtype,
                self.zero_centered_gamma,
                self.out_dtype,
            ]
        except (KeyError, IndexError):  # (IndexError: a 0-dimensional x, refused by _check)
            self._check(x)
            key = (x.dtype, x.shape[-1], x.get_device(), None if w is None else w.dtype)
            k = self._fetch(x, w)
            self._kernel_cache[(*key, self.zero_centered_gamma, self.out_dtype)] = k
        eps = self.eps
        if eps is None and isinstance(self, RMSNorm):
            eps = _FINFO_EPS[x.dtype]
        return w, k, eps

    def _fetch(self, x: torch.Tensor, w: torch.Tensor | None) -> Any:
        """Check a call on ``x`` with weight ``w`` and fetch its forward kernel."""
        raise NotImplementedError

    def _fetch_norm(
        self, op: str, what: str, x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None
    ) -> Any:
        """:meth:`_fetch` of norm kernel ``op`` (``what``: the call, as errors name it)."""
        out_dtype, zcg = self.out_dtype, self.zero_centered_gamma
        if out_dtype is None:
            _checks.norm_weights(x, w, b, what)
        else:
            _checks.fp8_norm(x, w, b, self.scale, self.amax, out_dtype, what + "_fp8")
        return _kernels.fetch(_impl.norm_key(op, x, w, b, zcg, out_dtype))

    def _reset_weight(self) -> None:
        if self.elementwise_affine:
            # zero-centred gamma: the weight applied is weight + 1
            (torch.nn.init.zeros_ if self.zero_centered_gamma else torch.nn.init.ones_)(self.weight)

    def extra_repr(self) -> str:
        zcg = ", zero_centered_gamma=True" if self.zero_centered_gamma else ""
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine="
            f"{self.elementwise_affine}{zcg}{self._fp8_repr()}"
        )


class LayerNorm(_Norm):
    """LayerNorm over the last dimension, as ``torch.nn.LayerNorm(normalized_shape, eps,
    elementwise_affine, bias, device, dtype)`` (same parameters ``weight`` ``(H,)`` and
    ``bias`` ``(H,)``), plus ``zero_centered_gamma`` (the weight applied is ``weight + 1``,
    initialized to 0) and ``out_dtype`` (FP8 output, see the module docstring).

    ``forward(x)``: x ``(..., H)`` float32, float16 or bfloat16 on a CUDA device; returns x's
    shape and dtype (weights of float32 with 16-bit x are allowed; the output keeps x's
    dtype). Only a single normalized dimension is supported (``normalized_shape`` an int or
    one size). Raises :class:`~nvrtc_engine.ArgumentError` for x of another hidden size or
    device, :class:`~nvrtc_engine.ArgumentTypeError` for another dtype, before launching.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        zero_centered_gamma: bool = False,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._init_norm(
            normalized_shape, eps, elementwise_affine, zero_centered_gamma, out_dtype, device
        )
        kw = dict(device=device, dtype=dtype)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, **kw))  # type: ignore[arg-type]
            if bias:
                self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, **kw))  # type: ignore[arg-type]
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self._reset_weight()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _fetch(self, x: torch.Tensor, w: torch.Tensor | None) -> Any:
        return self._fetch_norm("layernorm_fwd", "layer_norm", x, w, _param(self, "bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor | FP8Output:
        if _takes(x):
            w, k, eps = self._eager_call(x)
            b, zcg, out_dtype = _param(self, "bias"), self.zero_centered_gamma, self.out_dtype
            if out_dtype is None:
                return _eager.layer_norm(x, w, b, eps, zcg, k)  # type: ignore[arg-type]
            scale, amax = self._buffers["scale"], self._buffers["amax"]
            return FP8Output(
                *_eager.layer_norm_fp8(x, w, b, eps, scale, amax, out_dtype, zcg, k)  # type: ignore[arg-type]
            )
        self._check(x)
        if self.out_dtype is None:
            return F.layer_norm(
                x,
                self.weight,
                self.bias,
                self.eps,  # type: ignore[arg-type]
                zero_centered_gamma=self.zero_centered_gamma,
            )
        return F.layer_norm_fp8(
            x,
            self.weight,
            self.bias,
            self.eps,
            self.scale,  # type: ignore[arg-type]
            self.amax,
            self.out_dtype,
            zero_centered_gamma=self.zero_centered_gamma,
        )


class RMSNorm(_Norm):
    """RMSNorm over the last dimension, as ``torch.nn.RMSNorm(normalized_shape, eps,
    elementwise_affine, device, dtype)`` (parameter ``weight`` ``(H,)``; ``eps=None`` is
    ``torch.finfo(x.dtype).eps``), plus ``zero_centered_gamma`` and ``out_dtype`` (see
    :class:`LayerNorm`). ``forward(x)`` as :class:`LayerNorm`'s."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        zero_centered_gamma: bool = False,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._init_norm(
            normalized_shape, eps, elementwise_affine, zero_centered_gamma, out_dtype, device
        )
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self._reset_weight()

    def _fetch(self, x: torch.Tensor, w: torch.Tensor | None) -> Any:
        return self._fetch_norm("rmsnorm_fwd", "rms_norm", x, w, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor | FP8Output:
        if _takes(x):
            w, k, eps = self._eager_call(x)
            zcg, out_dtype = self.zero_centered_gamma, self.out_dtype
            if out_dtype is None:
                return _eager.rms_norm(x, w, eps, zcg, k)
            scale, amax = self._buffers["scale"], self._buffers["amax"]
            return FP8Output(*_eager.rms_norm_fp8(x, w, eps, scale, amax, out_dtype, zcg, k))  # type: ignore[arg-type]
        self._check(x)
        if self.out_dtype is None:
            return F.rms_norm(
                x, self.weight, self._eps(x), zero_centered_gamma=self.zero_centered_gamma
            )
        return F.rms_norm_fp8(
            x,
            self.weight,
            self._eps(x),
            self.scale,
            self.amax,
            self.out_dtype,
            zero_centered_gamma=self.zero_centered_gamma,
        )


class AddRMSNorm(RMSNorm):
    """The residual add and the RMSNorm after it, as in a pre-norm transformer's residual
    stream: ``forward(x, residual) -> (z, h)`` with ``h = x + residual`` (the stream going
    on) and ``z = RMSNorm(h)``; with ``out_dtype``, ``(FP8Output, h)``. Constructor,
    parameters and checks as :class:`RMSNorm`. The backward is one kernel
    (``rmsnorm_bwd_add``: the norm's gradient plus h's own, for x and residual alike)."""

    def _fetch(self, x: torch.Tensor, w: torch.Tensor | None) -> Any:
        return self._fetch_norm("rmsnorm_fwd", "add_rms_norm", x, w, None)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor | FP8Output, torch.Tensor]:
        if _takes(x):
            w, k, eps = self._eager_call(x)
            zcg, out_dtype = self.zero_centered_gamma, self.out_dtype
            if out_dtype is None:
                return _eager.add_rms_norm(x, residual, w, eps, zcg, k)
            scale, amax = self._buffers["scale"], self._buffers["amax"]
            q, h, scale_inv = _eager.add_rms_norm_fp8(
                x,
                residual,
                w,
                eps,
                scale,
                amax,
                out_dtype,
                zcg,
                k,  # type: ignore[arg-type]
            )
            return FP8Output(q, scale_inv), h
        self._check(x)
        if self.out_dtype is None:
            return F.add_rms_norm(
                x, residual, self.weight, self._eps(x), zero_centered_gamma=self.zero_centered_gamma
            )
        return F.add_rms_norm_fp8(
            x,
            residual,
            self.weight,
            self._eps(x),
            self.scale,
            self.amax,
            self.out_dtype,
            zero_centered_gamma=self.zero_centered_gamma,
        )


class _Activation(_FP8State):
    act: str = ""
    # (limit, alpha, linear_offset): clamped SwiGLU's, unused by the other activations
    _clamp: tuple[float | None, float, float] = (
        None,
        CLAMPED_SWIGLU_ALPHA,
        CLAMPED_SWIGLU_LINEAR_OFFSET,
    )

    def __init__(self, *, out_dtype: torch.dtype | None = None, device: Any = None) -> None:
        super().__init__()
        self._init_fp8(out_dtype, device)

    def _kernel(self, x: torch.Tensor) -> Any:
        """The kernel of an eager call on ``x`` (a plain tensor): one lookup by (x's dtype,
        last dimension, device, out_dtype); on a miss, the call's checks first (raising what
        is wrong), then fetched."""
        try:
            return self._kernel_cache[x.dtype, x.shape[-1], x.get_device(), self.out_dtype]
        except (KeyError, IndexError):  # (IndexError: a 0-dimensional x, refused here)
            act, limit, out_dtype = self.act, self._clamp[0], self.out_dtype
            if out_dtype is None:
                _checks.activation(x, act, limit, "activation")
            else:
                _checks.fp8_activation(
                    x, None, act, limit, self.scale, self.amax, out_dtype, "activation_fp8"
                )
            found = _kernels.fetch(_impl.act_key(act, x, act, out_dtype))
            self._kernel_cache[x.dtype, x.shape[-1], x.get_device(), out_dtype] = found
            return found

    def forward(self, x: torch.Tensor) -> torch.Tensor | FP8Output:
        act, out_dtype = self.act, self.out_dtype
        limit, alpha, offset = self._clamp
        if _takes(x):
            k = self._kernel(x)
            if out_dtype is None:
                return _eager.activation(x, act, limit, alpha, offset, k)
            scale, amax = self._buffers["scale"], self._buffers["amax"]
            return FP8Output(
                *_eager.activation_fp8(x, scale, amax, act, out_dtype, limit, alpha, offset, k)  # type: ignore[arg-type]
            )
        clamp = dict(limit=limit, alpha=alpha, linear_offset=offset)
        if out_dtype is None:
            return F.activation(x, act, **clamp)  # type: ignore[arg-type]
        return F.activation_fp8(x, act, self.scale, self.amax, out_dtype, **clamp)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return self._fp8_repr().removeprefix(", ")


class GELU(_Activation):
    """GELU, tanh form (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``), as
    ``torch.nn.GELU(approximate="tanh")``. ``approximate="none"`` (erf, torch's default) has
    no kernel and is refused (``ArgumentError``): use ``torch.nn.GELU()`` for it."""

    act = "gelu"

    def __init__(self, approximate: str = "tanh") -> None:
        if approximate != "tanh":
            raise ArgumentError(
                "approximate",
                f"is {approximate!r}; nvrtc_engine's GELU is the "
                "tanh form (TransformerEngine's): pass approximate='tanh', or "
                "use torch.nn.GELU() for the erf form",
            )
        super().__init__()
        self.approximate = approximate

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class _InplaceArg(_Activation):
    """An activation with ``torch.nn``'s ``inplace`` argument: False only (the kernels write
    a new tensor)."""

    def __init__(self, inplace: bool = False) -> None:
        if inplace:
            raise ArgumentError("inplace", "must be False: the kernels write a new tensor")
        super().__init__()
        self.inplace = False


class SiLU(_InplaceArg):
    """SiLU ``x * sigmoid(x)``, as ``torch.nn.SiLU()``."""

    act = "silu"


class ReLU(_InplaceArg):
    """ReLU ``max(x, 0)``, as ``torch.nn.ReLU()``."""

    act = "relu"


class Sigmoid(_Activation):
    """The logistic sigmoid, as ``torch.nn.Sigmoid()``."""

    act = "sigmoid"

    def __init__(self) -> None:
        super().__init__()


class QuickGELU(_Activation):
    """Quick GELU ``x * sigmoid(1.702 x)``."""

    act = "qgelu"

    def __init__(self) -> None:
        super().__init__()


class SquaredReLU(_Activation):
    """Squared ReLU ``max(x, 0)^2``."""

    act = "srelu"

    def __init__(self) -> None:
        super().__init__()


class _Gated(_Activation):
    """A gated activation on ``x = [a | b]`` of shape ``(..., 2H)``: ``act(a) * b``, shape
    ``(..., H)`` (TransformerEngine's layout: the activation half first). ``out_dtype``: FP8
    output (see the module docstring)."""

    def __init__(self, *, out_dtype: torch.dtype | None = None, device: Any = None) -> None:
        super().__init__(out_dtype=out_dtype, device=device)


class GLU(_Gated):
    """GLU ``sigmoid(a) * b`` for ``x = [a | b]``. Not ``torch.nn.GLU``, which gates the other
    half (``a * sigmoid(b)``): ``GLU()(x)`` is ``torch.nn.GLU()(torch.cat([b, a], -1))``."""

    act = "glu"


class GEGLU(_Gated):
    """GeGLU ``gelu(a) * b`` (tanh GELU) for ``x = [a | b]``."""

    act = "geglu"


class QuickGEGLU(_Gated):
    """Quick-GeGLU ``qgelu(a) * b`` for ``x = [a | b]``."""

    act = "qgeglu"


class SwiGLU(_Gated):
    """SwiGLU ``silu(a) * b`` for ``x = [a | b]`` (Llama's MLP with its gate projection
    first in the fused ``[gate | up]`` output)."""

    act = "swiglu"


class ReGLU(_Gated):
    """ReGLU ``relu(a) * b`` for ``x = [a | b]``."""

    act = "reglu"


class SquaredReGLU(_Gated):
    """Squared-ReGLU ``relu(a)^2 * b`` for ``x = [a | b]``."""

    act = "sreglu"


class ClampedSwiGLU(_Gated):
    """Clamped SwiGLU (GPT-OSS) for ``x = [a | b]``: ``a' * sigmoid(alpha * a') *
    (clamp(b, -limit, limit) + linear_offset)`` with ``a' = min(a, limit)``."""

    act = "clamped_swiglu"

    def __init__(
        self,
        limit: float,
        alpha: float = CLAMPED_SWIGLU_ALPHA,
        linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
        *,
        out_dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        super().__init__(out_dtype=out_dtype, device=device)
        for name, value in (("limit", limit), ("alpha", alpha), ("linear_offset", linear_offset)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(name, f"must be a real number, got {value!r}")
            if not math.isfinite(value) or (name == "limit" and value <= 0):
                raise ArgumentError(
                    name, f"must be finite{' and > 0' * (name == 'limit')}, got {value}"
                )
        self.limit, self.alpha, self.linear_offset = (
            float(limit),
            float(alpha),
            float(linear_offset),
        )

    @property
    def _clamp(self) -> tuple[float | None, float, float]:  # type: ignore[override]
        return self.limit, self.alpha, self.linear_offset

    def extra_repr(self) -> str:
        return (
            f"limit={self.limit}, alpha={self.alpha}, linear_offset="
            f"{self.linear_offset}{self._fp8_repr()}"
        )
