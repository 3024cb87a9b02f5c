"""PyTorch integration: modules, functions and ``torch.ops.nvrtc_engine`` operators.

    >>> import nvrtc_engine.torch as net
    >>> norm = net.RMSNorm(4096, eps=1e-6, device="cuda", dtype=torch.bfloat16)
    >>> act = net.SwiGLU()                      # (..., 2H) -> (..., H)
    >>> y = act(up(norm(x)))                    # autograd, torch.compile, CUDA graphs

Layers: :mod:`.modules` (drop-in ``LayerNorm``, ``RMSNorm``, ``GELU``... and the gated
activations, :class:`AddRMSNorm`), :mod:`.functional` (the same as functions, FP8 outputs
for ``torch._scaled_mm``), and the registered operators (:mod:`._ops`: schemas, fake
implementations, backward formulas). Eager calls run the kernels directly; ``torch.compile``
traces the operators. See docs/torch.md.

Needs PyTorch (``pip install 'nvrtc-engine[torch]'``); ``import nvrtc_engine`` never imports
it.
"""

from __future__ import annotations

try:
    import torch as _torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError(
        "nvrtc_engine.torch needs PyTorch, which is not installed: "
        "pip install 'nvrtc-engine[torch]' (or install torch yourself)"
    ) from exc

from . import functional
from ._kernels import clear as clear_kernels
from ._ops import NAMESPACE, SCHEMAS
from .functional import (
    FP8Output,
    activation,
    activation_backward,
    activation_backward_fp8,
    activation_fp8,
    add_rms_norm,
    add_rms_norm_fp8,
    cast_fp8,
    cast_transpose_fp8,
    layer_norm,
    layer_norm_fp8,
    rms_norm,
    rms_norm_fp8,
    transpose,
)
from .modules import (
    GEGLU,
    GELU,
    GLU,
    AddRMSNorm,
    ClampedSwiGLU,
    LayerNorm,
    QuickGEGLU,
    QuickGELU,
    ReGLU,
    ReLU,
    RMSNorm,
    Sigmoid,
    SiLU,
    SquaredReGLU,
    SquaredReLU,
    SwiGLU,
)

del _torch

__all__ = [
    "GEGLU",
    "GELU",
    "GLU",
    "NAMESPACE",
    "SCHEMAS",
    "AddRMSNorm",
    "ClampedSwiGLU",
    "FP8Output",
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
    "activation",
    "activation_backward",
    "activation_backward_fp8",
    "activation_fp8",
    "add_rms_norm",
    "add_rms_norm_fp8",
    "cast_fp8",
    "cast_transpose_fp8",
    "clear_kernels",
    "functional",
    "layer_norm",
    "layer_norm_fp8",
    "rms_norm",
    "rms_norm_fp8",
    "transpose",
]
