"""Normalization family: LayerNorm and RMSNorm, forward and backward.

Template: ``templates/norm.cu.j2`` (and the ``norm_*.j2`` it includes); float64 references
and error bounds: :mod:`.reference`; usage: ``docs/norms.md``. This module holds the ops
(:class:`NormSpec`) and re-exports the public names of the two beside it: :mod:`.config`
(the configurations, the rules and the measured table ``TUNED``) and :mod:`.kernels` (the
host side of the kernels and their results, imported when a kernel is made or rendered: a
lookup of a cached kernel's digest needs the configuration only).

Ops (x is ``(..., hidden_size)``, rows ``N`` = the product of the leading dimensions):

- ``layernorm_fwd``: ``z = (x - mu) * rsigma * gamma + beta``, ``mu``/``rsigma`` fp32 per row.
- ``rmsnorm_fwd``: ``z = x * rsigma * gamma``, ``rsigma`` fp32 per row.
- ``layernorm_bwd``: ``dx``, ``dgamma``, ``dbeta``.
- ``rmsnorm_bwd``: ``dx``, ``dgamma``; ``rmsnorm_bwd_add``: the same with a residual gradient
  added into ``dx`` in the same pass.

Key fields: ``in_dtype`` is the dtype of x (and dz); ``out_dtype`` that of z (forward: x's dtype,
or fp8_e4m3/fp8_e5m2 with ``scaling`` ``tensor`` or ``mxfp8``) or dx (backward: x's dtype).
Flags: ``zero_centered_gamma`` (short ``zcg``: multiply by gamma + 1) and ``fp32_gamma`` (short
``wf32``: gamma, beta, dgamma and dbeta are fp32 while x is fp16/bf16; without it they have x's
dtype). ``eps`` is a run-time argument.

Specialization: with ``hidden_size`` the row lives in registers (or in shared-memory stages
that feed them) with compile-time trip counts; :func:`norm_config` chooses the kernel and its
configuration (:class:`ForwardConfig`, :class:`BackwardConfig`), whose label ends the kernel's
symbol, e.g. ``layernorm_fwd_bf16_bf16_none_rowwise_h1024_sm90_w1_r4`` or
``rmsnorm_bwd_bf16_bf16_none_rowwise_h8192_sm90_w16_r1_stages4_words``. When no layout fits
(and always for ``hidden_size=None``) the general kernel streams each row (label ``general``).
Math as in TransformerEngine: fp32 compute, biased variance, ``rsigma = 1/sqrt(var + eps)``.
Every norm function waits for its grid dependency first, so on sm_90+ the kernels are
programmatic dependent launches (``Kernel._dependent``, ``NVRTC_ENGINE_DEPENDENT_LAUNCH``).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, ClassVar

from ...core.errors import VariantError
from ...core.spec import FP8, HIGH_PRECISION, TYPE_TAGS, OpSpec
from .config import (
    TUNED,
    BackwardConfig,
    ForwardConfig,
    NormConfig,
    Staging,
    fits_register_file,
    gamma_dtype,
    iters,
    loop_threads_per_row,
    norm_config,
    vector_width,
)

if TYPE_CHECKING:
    from ...core.kernel import Kernel
    from ...core.key import KernelKey
    from .kernels import (
        LayerNormBwdKernel,
        LayerNormFwdKernel,
        LayerNormGrads,
        LayerNormOutput,
        RMSNormBwdAddKernel,
        RMSNormBwdKernel,
        RMSNormFwdKernel,
        RMSNormGrads,
        RMSNormOutput,
    )

__all__ = [
    "NORM_SPECS",
    "TUNED",
    "BackwardConfig",
    "ForwardConfig",
    "LayerNormBwdKernel",
    "LayerNormFwdKernel",
    "LayerNormGrads",
    "LayerNormOutput",
    "NormConfig",
    "NormSpec",
    "RMSNormBwdAddKernel",
    "RMSNormBwdKernel",
    "RMSNormFwdKernel",
    "RMSNormGrads",
    "RMSNormOutput",
    "Staging",
    "fits_register_file",
    "gamma_dtype",
    "loop_threads_per_row",
    "norm_config",
]


def _triggers(cfg: NormConfig) -> bool:
    """Whether a kernel under ``cfg`` lets the next grid launch once all of its CTAs have
    started (``griddepcontrol.launch_dependents`` after the wait; the next grid's CTAs then
    take the slots this one frees and wait there for it). Paired A/B on the H200
    (``bench/tuning/source_ab.py`` reruns it): faster for a staged kernel whose persistent
    grid fills every slot (1.003-1.007x) and a register forward of one row group per CTA
    (1.006-1.012x); slower where ``ctas_per_sm`` caps the grid (RMSNorm bf16 65536: 91.7% of
    copy without, 86.6% with) and with held weights (1.003-1.021x without); the general
    kernels and the register backward keep the plain wait (not measured)."""
    if not cfg.warps or (cfg.staging and cfg.staging.ctas_per_sm):
        return False
    if isinstance(cfg, ForwardConfig) and cfg.weights == "held":
        return False
    if cfg.staging:
        return True
    return isinstance(cfg, ForwardConfig)


def _float_literal(value: float) -> str:
    """A C++ hex literal holding exactly fp32(value)."""
    f32 = struct.unpack("<f", struct.pack("<f", value))[0]
    return f"{f32.hex()}f" if f32 else "0.0f"


class NormSpec(OpSpec):
    """A LayerNorm/RMSNorm op (forward or backward); see the module docstring."""

    family = "norm"
    flags: ClassVar[dict[str, str]] = {"zero_centered_gamma": "zcg", "fp32_gamma": "wf32"}

    def __init__(self, name: str, *, rms: bool, backward: bool, add: bool, doc: str) -> None:
        self.name = name
        self.rms = rms
        self.backward = backward
        self.add = add
        self.doc = doc
        self.in_dtypes = HIGH_PRECISION
        if backward:
            self.out_dtypes = HIGH_PRECISION
            self.scalings = ("none",)
        else:
            self.out_dtypes = HIGH_PRECISION + FP8
            self.scalings = ("none", "tensor", "mxfp8")
        self.layouts = ("rowwise",)

    @property
    def accumulators(self) -> int:
        """Column sums the backward kernel keeps: dgamma (RMSNorm), dgamma and dbeta."""
        return 1 if self.rms else 2

    def validate(self, key: KernelKey) -> None:
        # the output rule first: it names the dtypes actually allowed for this x (the base
        # check would list every 16-bit dtype for a backward's dx)
        allowed = [key.in_dtype] + ([] if self.backward else list(FP8))
        if key.in_dtype in self.in_dtypes and key.out_dtype not in allowed:
            what = "dx" if self.backward else "z"
            raise VariantError("out_dtype", key.out_dtype, allowed,
                               f"{what} of {self.name} has x's dtype"
                               + ("" if self.backward else " or an FP8 dtype"))  # fmt: skip
        super().validate(key)
        if key.flag("fp32_gamma") and key.in_dtype == "fp32":
            raise VariantError("fp32_gamma", True, [False],
                               "gamma is already fp32 when x is fp32")  # fmt: skip

    def config(self, key: KernelKey) -> NormConfig:
        """The configuration ``key``'s kernel is rendered, compiled and launched with:
        :func:`norm_config`, looked up in this module when called, so that one patch of
        ``norm.norm_config`` reaches the source, the symbols and the kernel's grids alike."""
        return norm_config(key)

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        cfg = self.config(key)
        stem = f"{key}_{cfg.label}"
        if not self.backward:
            return (stem,)
        if cfg.warps:
            return (stem, f"{stem}_finalize")
        return (stem, f"{stem}_stats", f"{stem}_finalize")

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        from .kernels import BWD, FWD

        ctx = super().render_context(key)
        cfg = self.config(key)
        out = key.output
        ctx.update(
            cfg=cfg,
            symbols=self.symbols(key),
            backward=self.backward,
            rms=self.rms,
            add=self.add,
            zcg=key.flag("zero_centered_gamma"),
            w_dtype=gamma_dtype(key),
            w_type=TYPE_TAGS[gamma_dtype(key)],
            vec=vector_width(key, cfg),
            iters=iters(key, cfg) if cfg.warps else 0,
            trigger=_triggers(cfg),
            max_norm_rcp=_float_literal(1.0 / out.max_finite) if out.is_fp8 else "0.0f",
            signature=BWD if self.backward else FWD,
        )
        return ctx

    def kernel_class(self) -> type[Kernel]:
        from . import kernels

        if not self.backward:
            return kernels.RMSNormFwdKernel if self.rms else kernels.LayerNormFwdKernel
        if self.add:
            return kernels.RMSNormBwdAddKernel
        return kernels.RMSNormBwdKernel if self.rms else kernels.LayerNormBwdKernel


NORM_SPECS: tuple[NormSpec, ...] = (
    NormSpec("layernorm_fwd", rms=False, backward=False, add=False,
             doc="LayerNorm forward (z, mu, rsigma), as in TransformerEngine"),
    NormSpec("rmsnorm_fwd", rms=True, backward=False, add=False,
             doc="RMSNorm forward (z, rsigma), as in TransformerEngine"),
    NormSpec("layernorm_bwd", rms=False, backward=True, add=False,
             doc="LayerNorm backward (dx, dgamma, dbeta), as in TransformerEngine"),
    NormSpec("rmsnorm_bwd", rms=True, backward=True, add=False,
             doc="RMSNorm backward (dx, dgamma), as in TransformerEngine"),
    NormSpec("rmsnorm_bwd_add", rms=True, backward=True, add=True,
             doc="RMSNorm backward plus a residual gradient into dx, as in TransformerEngine"),
)  # fmt: skip


_KERNELS = ("LayerNormBwdKernel", "LayerNormFwdKernel", "LayerNormGrads", "LayerNormOutput",
            "RMSNormBwdAddKernel", "RMSNormBwdKernel", "RMSNormFwdKernel", "RMSNormGrads",
            "RMSNormOutput")  # fmt: skip


def __getattr__(name: str) -> Any:
    """The public names of :mod:`.kernels`, imported from there on first use."""
    if name not in _KERNELS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import kernels

    return getattr(kernels, name)
