"""Activation family: every activation of TransformerEngine, forward and backward, plain and
gated, with high-precision, tensor-scaled FP8 or MXFP8 output.

Four kinds of op share one template (``templates/activation.cu.j2``), rendered per key:

- ``act``: ``y = act(x)`` (gelu, qgelu, silu, relu, srelu, sigmoid), any shape;
- ``dact``: ``dx = grad * act'(x)`` (dgelu, ...), grad and x of one shape;
- ``gated``: ``y = act(a) * b`` for ``x = [a | b]`` of shape ``(..., 2H)`` -> ``(..., H)``
  (glu, geglu, qgeglu, swiglu, reglu, sreglu, clamped_swiglu);
- ``dgated``: grad ``(..., H)``, x ``(..., 2H)`` -> ``[grad * act'(a) * b | grad * act(a)]``
  of shape ``(..., 2H)`` (dglu, ...).

Three kernel structures (:meth:`ActivationSpec.structure`): plain ops without MXFP8 run a
flat element-wise kernel (``flat``, :func:`launch_config`); gated and dgated ops without
MXFP8, and every MXFP8 ``rowwise`` output, run the row-flat kernel (``rows``,
:func:`row_config`): the flat kernel's 1-D chunk order with a row/column split of the chunk
index; MXFP8 ``columnwise`` and ``both`` outputs run a tiled kernel of 32-row tiles
(``tile``, :class:`TileConfig`). A kernel's ``config`` (:class:`ActivationConfig`) names
its structure and configuration. This module holds the ops (:class:`ActivationSpec`); the
configurations and the host side of the kernels are in :mod:`.kernels` (imported when a
kernel is made or rendered; its public names are also found here). Math:
``templates/include/nve_act.cuh``; references: :mod:`nvrtc_engine.reference`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.errors import VariantError
from ...core.key import LAYOUTS
from ...core.spec import OpSpec
from ..shared.blockscale import MXFP8_BLOCK

if TYPE_CHECKING:
    from ...core.kernel import Kernel
    from ...core.key import KernelKey
    from .kernels import (
        CLAMPED_SWIGLU_ALPHA,
        CLAMPED_SWIGLU_LINEAR_OFFSET,
        FLAT,
        FLAT_GRAD,
        ROWS,
        TILE,
        ActivationConfig,
        ActivationGradKernel,
        ActivationKernel,
        ClampedSwiGLUGradKernel,
        ClampedSwiGLUKernel,
        LaunchConfig,
        MXFP8Output,
        TileConfig,
        launch_config,
        magic,
        row_config,
        tile_config,
    )

__all__ = [
    "ACTIVATION_SPECS",
    "CAST_SPEC",
    "CLAMPED_SWIGLU_ALPHA",
    "CLAMPED_SWIGLU_LINEAR_OFFSET",
    "FLAT",
    "FLAT_GRAD",
    "KINDS",
    "ROWS",
    "TILE",
    "ActivationConfig",
    "ActivationGradKernel",
    "ActivationKernel",
    "ActivationSpec",
    "ClampedSwiGLUGradKernel",
    "ClampedSwiGLUKernel",
    "LaunchConfig",
    "MXFP8Output",
    "TileConfig",
    "launch_config",
    "magic",
    "row_config",
    "tile_config",
]

KINDS: tuple[str, ...] = ("act", "dact", "gated", "dgated")


class ActivationSpec(OpSpec):
    """One activation op: its kind (``act``, ``dact``, ``gated``, ``dgated``) and the device
    function of its activation (``nve::<act>``, derivative ``nve::d<act>``).

    ``hidden_size`` is the last dimension for plain ops and H (the split point of the
    ``(..., 2H)`` input) for gated ops; with MXFP8 output it must be a multiple of 32.
    Layouts other than ``rowwise`` exist only for MXFP8.
    """

    family = "activation"
    scalings = ("none", "tensor", "mxfp8")
    layouts = LAYOUTS

    def __init__(self, name: str, kind: str, act: str, doc: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.name = name
        self.kind = kind
        self.act = act
        self.clamped = act == "clamped_silu"
        self.doc = doc

    @property
    def gated(self) -> bool:
        return self.kind in ("gated", "dgated")

    @property
    def backward(self) -> bool:
        return self.kind in ("dact", "dgated")

    def structure(self, key: KernelKey) -> str:
        """The kernel structure of ``key``: ``tile`` for MXFP8 columnwise and both outputs,
        ``rows`` for gated ops and MXFP8 rowwise outputs, else ``flat``."""
        if key.scaling == "mxfp8":
            return "rows" if key.layout == "rowwise" else "tile"
        return "rows" if self.gated else "flat"

    def validate(self, key: KernelKey) -> None:
        super().validate(key)
        hint = f"for op {self.name!r}"
        if key.layout != "rowwise" and key.scaling != "mxfp8":
            raise VariantError("layout", key.layout, ["rowwise"],
                               f"{hint}: columnwise and both layouts are MXFP8 only")  # fmt: skip
        hs = key.hidden_size
        if key.scaling == "mxfp8" and hs is not None and hs % MXFP8_BLOCK:
            raise VariantError("hidden_size", hs, f"a multiple of {MXFP8_BLOCK}",
                               f"{hint}: MXFP8 blocks of 32 along rows")  # fmt: skip

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        from . import kernels as k  # (looked up there: one patch reaches source and launch)

        ctx = super().render_context(key)
        structure = self.structure(key)
        flat = structure == "flat"
        vec = 16 // key.input.itemsize
        mx = key.scaling == "mxfp8"
        ctx.update(
            kind=self.kind,
            act=self.act,
            clamped=self.clamped,
            vec=vec,
            tensor_scaling=key.scaling == "tensor",
            mxfp8=mx,
            rowwise=mx and key.layout in ("rowwise", "both"),
            colwise=mx and key.layout in ("columnwise", "both"),
            max_norm_rcp=k.fp32_literal(1.0 / key.output.max_finite) if mx else "",
        )
        if structure == "tile":
            ctx.update(structure="tile", tile_params=k.TILE.c_params(),
                       **k.tile_render_context(key, k.tile_config(key)))  # fmt: skip
        else:
            cfg2 = k.launch_config(key) if flat else k.row_config(key)
            owner = structure == "rows" and cfg2.owner
            if owner and (self.gated or not mx):
                raise ValueError(f"owner mode is for plain ops with MXFP8 output, not {key}")
            sig = (k.FLAT_GRAD if self.backward else k.FLAT) if flat else k.ROWS
            ctx.update(structure=structure, threads=cfg2.threads, unroll=cfg2.unroll,
                       owner=owner, params=sig.c_params(),
                       fp8_words=key.output.itemsize == 1)  # fmt: skip
        return ctx

    def kernel_class(self) -> type[Kernel]:
        from . import kernels as k

        if self.clamped:
            return k.ClampedSwiGLUGradKernel if self.backward else k.ClampedSwiGLUKernel
        return k.ActivationGradKernel if self.backward else k.ActivationKernel


_PLAIN = (
    ("gelu", "tanh-approximated GELU, as in TransformerEngine"),
    ("qgelu", "quick GELU x * sigmoid(1.702 x)"),
    ("silu", "SiLU (swish) x * sigmoid(x)"),
    ("relu", "ReLU max(x, 0)"),
    ("srelu", "squared ReLU max(x, 0)^2"),
    ("sigmoid", "logistic sigmoid"),
)
_GATED = (
    ("glu", "sigmoid", "GLU: sigmoid(a) * b"),
    ("geglu", "gelu", "GeGLU: gelu(a) * b"),
    ("qgeglu", "qgelu", "quick-GeGLU: qgelu(a) * b"),
    ("swiglu", "silu", "SwiGLU: silu(a) * b"),
    ("reglu", "relu", "ReGLU: relu(a) * b"),
    ("sreglu", "srelu", "squared-ReGLU: srelu(a) * b"),
    ("clamped_swiglu", "clamped_silu", "clamped SwiGLU (GPT-OSS), runtime limit/alpha/offset"),
)

ACTIVATION_SPECS: tuple[ActivationSpec, ...] = (
    *(ActivationSpec(n, "act", n, d) for n, d in _PLAIN),
    *(ActivationSpec("d" + n, "dact", n, f"gradient of {n}: grad * {n}'(x)") for n, _ in _PLAIN),
    *(ActivationSpec(n, "gated", a, d) for n, a, d in _GATED),
    *(ActivationSpec("d" + n, "dgated", a, f"gradient of {n}") for n, a, _ in _GATED),
)
# The plain cast is the identity activation (one template, one launch path)
CAST_SPEC = ActivationSpec(
    "cast", "act", "identity", "cast to fp32/fp16/bf16, or FP8 with tensor scaling"
)


_KERNELS = ("CLAMPED_SWIGLU_ALPHA", "CLAMPED_SWIGLU_LINEAR_OFFSET", "FLAT", "FLAT_GRAD", "ROWS",
            "TILE", "ActivationConfig", "ActivationGradKernel", "ActivationKernel",
            "ClampedSwiGLUGradKernel", "ClampedSwiGLUKernel", "LaunchConfig", "MXFP8Output",
            "TileConfig", "launch_config", "magic", "row_config", "tile_config")  # fmt: skip


def __getattr__(name: str) -> Any:
    """The public names of :mod:`.kernels`, imported from there on first use."""
    if name not in _KERNELS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import kernels

    return getattr(kernels, name)
