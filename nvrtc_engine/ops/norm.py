"""Normalization family: LayerNorm and RMSNorm, forward and backward.

Template: ``templates/norm.cu.j2`` (and the ``norm_*.j2`` it includes); float64 references
and error bounds: :mod:`nvrtc_engine.reference.norm`; usage: ``docs/norms.md``. This module
holds the ops (:class:`NormSpec`) and re-exports the public names of the three beside it:
:mod:`.norm_layout` (:class:`LaunchConfig`, :func:`launch_config`: the layout rules),
:mod:`.norm_switches` (the measured settings and ``TUNED``; read there at call time, so
patch them there) and :mod:`.norm_kernels` (the host side of the kernels and their results).

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

Specialization: with ``hidden_size`` the row lives in registers with compile-time trip counts
(:func:`launch_config` picks warps per row, rows per CTA, access width, forward on sm_90 and
sm_100 CTAs per row as a thread block cluster, and code switches: weights held in registers,
backward prefetch, packed rows, a register cap; round 3, off by default: early weight loads,
one (count, mean, M2) reduction, split sums, backward column sums in shared memory; round 4,
off by default but on in TUNED's FP8 layouts: the FP8 forward's output stage batched,
warp-level amax atomics; round 5, off by default: the staged backward, x and dz copied into
shared memory by cp.async several rows ahead, and the FP8 forward's bf16 unpacking and FP8
packing by 32-bit words, the next row group's x copied ahead into shared memory; round 8,
off by default: a row sum's per-warp values added across lanes by shuffles, and in the
staged backward shared-memory reads by 32-bit words, gamma kept as fp32 and dx from per-row
constants); the choice is part of the kernel's symbol, e.g.
``layernorm_fwd_bf16_bf16_none_rowwise_h4096_sm90_w4r1v8j4c1`` or
``layernorm_bwd_bf16_bf16_none_rowwise_h4096_sm90_w4r1v8j4c1nm3``. When no register layout
fits (and always for ``hidden_size=None``) the general kernel streams each row (symbol suffix
``loop``). Math as in TransformerEngine: fp32 compute, biased variance,
``rsigma = 1/sqrt(var + eps)``. Every norm function waits for its grid dependency first, so
on sm_90+ the kernels are programmatic dependent launches (``Kernel._dependent``,
``NVRTC_ENGINE_DEPENDENT_LAUNCH``); a staged kernel whose persistent grid fills every slot
(no ``b``) also lets the next grid launch at once.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import VariantError
from ..kernel import Kernel
from . import norm_switches as sw
from .base import FP8, HIGH_PRECISION, TYPE_TAGS, OpSpec
from .norm_kernels import (
    BWD,
    FWD,
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
from .norm_layout import (
    LaunchConfig,
    fits_register_file,
    gamma_dtype,
    launch_config,
    loop_threads_per_row,
    parse_tag,
    shift_applies,
    staged_counts,
    staged_layout,
    staged_smem_bytes,
    staged_weights_in_registers,
    warp_stats_apply,
)

if TYPE_CHECKING:
    from ..key import KernelKey

__all__ = [
    "NORM_SPECS",
    "LaunchConfig",
    "LayerNormBwdKernel",
    "LayerNormFwdKernel",
    "LayerNormGrads",
    "LayerNormOutput",
    "NormSpec",
    "RMSNormBwdAddKernel",
    "RMSNormBwdKernel",
    "RMSNormFwdKernel",
    "RMSNormGrads",
    "RMSNormOutput",
    "fits_register_file",
    "gamma_dtype",
    "launch_config",
    "loop_threads_per_row",
    "parse_tag",
    "staged_counts",
    "staged_layout",
    "staged_smem_bytes",
]


def _triggers(spec: NormSpec, cfg: LaunchConfig) -> bool:
    """Whether a kernel of ``spec`` under ``cfg`` lets the next grid launch once all of its
    CTAs have started (``griddepcontrol.launch_dependents`` first thing after the wait; the
    next grid's CTAs then take the slots this one frees and wait there for it to finish).
    Figures: bench/source_ab.py, same-round medians of 20 paired rounds ('won': the rounds
    the faster one won).

    - A staged kernel: its persistent grid fills every slot. With the trigger LayerNorm FP8
      8192 (``uogqt3``) ran 1.003x and LayerNorm bf16 14336 (``qft4``) 1.007x faster (won
      14 and 16 of 20; source_ab-staged-*-trigger.json). Not where ``b`` caps the grid below
      the occupancy (RMSNorm bf16 at 65536, ``b2``, read 86.6% of copy with the trigger,
      91.7% without).
    - A register forward with one row group per CTA (its grid is one CTA per row group): bf16
      1.006-1.012x at 4096 and 8192 in every round, 1.001x at LayerNorm 14336
      (source_ab-trigger.json).
    - Not where the CTA holds its weights in registers (``h``) or takes several row groups
      (``p``): without the trigger RMSNorm FP8 at 4096, 8192 and 14336 (``hogqx4``,
      ``hogqpx64``, ``hogq``) ran 1.003-1.006x faster (won 16-18 of 20,
      source_ab-fp8-trigger.json); the staged LayerNorm bf16 65536 (``hqit3``) 1.021x and
      LayerNorm FP8 4096 (``hogqit3``) 1.006x (won 20 of 20; 1.007x and 18 of 20 in a run
      minutes earlier), LayerNorm FP8 65536 (``hogqiyzt3``) 1.003x (16 of 20); RMSNorm FP8 65536
      (``hogqit3``) alike either way (0.999x, 8 of 20).
    - Not the general kernels, nor a register backward (not measured)."""
    if cfg.mode != "regs" or cfg.ctas_per_sm or cfg.hold:
        return False
    if cfg.stages:
        return True
    return not spec.backward and not cfg.next_row


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

    def layout(self, key: KernelKey) -> LaunchConfig:
        """The layout ``key``'s kernel is rendered, compiled and launched with:
        :func:`launch_config`, looked up in this module when called, so that one patch of
        ``norm.launch_config`` (bench/common.py's ``norm_layout``, tests) reaches the source,
        the symbols and the kernel's grids alike."""
        return launch_config(key)

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        cfg = self.layout(key)
        stem = f"{key}_{cfg.tag}"
        if not self.backward:
            return (stem,)
        if cfg.mode == "regs":
            return (stem, f"{stem}_finalize")
        return (stem, f"{stem}_stats", f"{stem}_finalize")

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        cfg = self.layout(key)
        symbols = self.symbols(key)
        w_dtype = gamma_dtype(key)
        out = key.output
        staged = cfg.mode == "regs" and cfg.stages > 0  # either direction
        # the staged forward may keep its weights in registers (h, e); never the backward
        regs_weights = staged_weights_in_registers(self, cfg)
        ctx.update(
            direction="bwd" if self.backward else "fwd",
            rms=self.rms,
            add=self.add,
            zcg=key.flag("zero_centered_gamma"),
            w_dtype=w_dtype,
            w_type=TYPE_TAGS[w_dtype],
            nacc=self.accumulators,
            mode=cfg.mode,
            tag=cfg.tag,
            vec=cfg.vec,
            vmax=16 // key.input.itemsize,
            warps=cfg.warps,
            rows=cfg.rows,
            iters=cfg.iters,
            cluster=cfg.cluster,
            hold=cfg.hold and (not staged or regs_weights),
            prefetch=cfg.prefetch,
            packed=cfg.packed,
            min_ctas=cfg.min_ctas,
            early=cfg.early and not cfg.hold and (not staged or regs_weights),
            one_reduction=cfg.one_reduction and not self.rms,
            accs=cfg.accumulators,
            smem=min(cfg.shared_sums, self.accumulators),
            tensor_scaling=key.scaling == "tensor",
            batched=cfg.batched and key.scaling == "tensor",
            warp_amax=cfg.warp_amax and key.scaling == "tensor",
            stages=cfg.stages if staged else 0,
            trigger=_triggers(self, cfg),
            smem_weights=staged and not self.backward and not regs_weights,  # staged forward
            words=cfg.words and (not self.backward or staged),
            next_row=cfg.next_row and key.scaling in sw.NEXT_ROW_SCALING and not staged,
            lanes=cfg.lanes,  # set only on register layouts (_round8_switches, parse_tag)
            gamma32=cfg.gamma32 and staged and not regs_weights,
            folded=cfg.folded and staged,
            defer=cfg.deferred and staged,
            reread=cfg.reread and staged and not self.backward,
            shifted=cfg.shifted and shift_applies(key, cfg),
            warp_stats=cfg.warp_stats and warp_stats_apply(key, cfg),
            fetch256=cfg.fetch256 and staged,
            stage_align=128 if cfg.aligned and staged else 16,
            mxfp8=key.scaling == "mxfp8",
            max_norm_rcp=_float_literal(1.0 / out.max_finite) if out.is_fp8 else "0.0f",
            stats_name=symbols[1] if len(symbols) == 3 else "",
            finalize_name=symbols[-1] if self.backward else "",
            fwd_params=FWD.c_params(),
            bwd_params=BWD.c_params(),
        )
        return ctx

    def kernel_class(self) -> type[Kernel]:
        if not self.backward:
            return RMSNormFwdKernel if self.rms else LayerNormFwdKernel
        if self.add:
            return RMSNormBwdAddKernel
        return RMSNormBwdKernel if self.rms else LayerNormBwdKernel


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
