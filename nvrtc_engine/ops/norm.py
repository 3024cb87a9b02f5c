"""Normalization family: LayerNorm and RMSNorm, forward and backward.

Template: ``templates/norm.cu.j2``; float64 references and error bounds:
:mod:`nvrtc_engine.reference.norm`; usage: ``docs/norms.md``.

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

import dataclasses
import functools
import math
import re
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, NoReturn

from .. import driver
from ..dtypes import DTYPES, DType
from ..errors import ArgumentError, ArgumentTypeError, CudaError, VariantError
from ..interop import TORCH_TYPES, Array, allocate_like
from ..kernel import Kernel, Loaded
from ..key import arch_number
from ..plans import Float, Ptr, fast_path
from .base import FP8, HIGH_PRECISION, TYPE_TAGS, OpSpec
from .blockscale import mxfp8_scale_shape

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

_FP32 = DTYPES["fp32"]
_BYTES = DTYPES["fp8_e4m3"]  # uint8 storage: E8M0 scale bytes are accepted like FP8 data
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80 ... sm_100)
MAX_THREADS = 1024
MAX_GRID = 2**31 - 1  # CUDA's limit on gridDim.x
MAX_REGISTERS = 255
# Guess, to be measured (ptxas -v on the variants of tests/test_norm.py): registers a thread
# needs besides the row values it holds (addresses, indices, row statistics, loop state).
OVERHEAD_REGISTERS = 40
# The backward needs more (bench/profile_kernels.py under ncu: w16 j2 at H=8192, estimated
# 120 with the above, spilled at the 128-register cap of a 512-thread CTA).
BWD_OVERHEAD_REGISTERS = 64
# Without the prefetch (BWD_PREFETCH False): ptxas -v, sm_90, bf16, no spills at these caps:
# LN w4j4 168 registers at 3 CTAs per SM (estimate 168), RMS w8j2 80-94 (estimate 104).
BWD_OVERHEAD_NO_PREFETCH = 40
# Bytes of one row tensor a thread should hold per row (four 16-byte accesses forward, two
# backward, where the backward kernel also holds dz and column sums). bench/norm_tuning.py
# (H200, bf16, H = 4096 / 8192 / 14336): the forward layouts this gives are within 1-3% of
# the best of every (warps, rows) layout.
# LayerNorm backward (two column sums): the same sweep measured 4 accesses per thread ahead
# of 2 (H=4096: w4j4 59.4% of copy against w8j2 44.7%; H=8192: w8j4 59.3% against w16j2
# 50.8%); RMSNorm backward preferred 2-3.
# bench/results/norm_tuning.json (H200, 2026-11-29): RMSNorm backward also best at 4 accesses
# (w4j4n 76.6% at H=4096 against w8j2 68.1%; w8j4n 84.0% at H=8192 against w16j2 65.1%).
TARGET_BYTES = {"fwd": 64, "bwd": 64, "bwd2": 64}
MAX_ELEMENTS = 64  # row elements per thread per tensor; also bounds the summation depth
# The backward holds at most this many (H=14336 at 4 x 8 per thread over a cluster of 2
# measured below the general kernel; more per thread leaves too few warps per SM).
BWD_MAX_ELEMENTS = 32
# Backward CTAs per SM in the persistent grid (at most the occupancy): each adds a partial
# row of dgamma/dbeta that the finalize kernel reads back. bench/norm_tuning.py measured 2,
# 4 and 8 within 0.5% of each other when the occupancy was 1-2; the register caps now allow
# 2-5, which 8 lets the grid use (guess, to be measured: the sweep tries 2 and 8).
BWD_CTAS_PER_SM = 8
# Forward grid: False, a persistent grid (SMs x occupancy CTAs looping over rows); True, one
# CTA (cluster) per row group, scheduled by the hardware. bench/norm_tuning.py (H200): one
# pass 87-96% of copy bandwidth for bf16 at H >= 4096, persistent 82-91%.
FWD_ONE_PASS = True
# Forward, per scaling: whether gamma/beta are loaded once per thread into registers (as
# stored) and reused for every row group the CTA handles (symbol suffix ``h``); the one-pass
# grid then gives each CTA up to FWD_GROUPS_PER_CTA row groups (never fewer CTAs than the
# persistent grid), which also divides the tensor-scaling amax reductions and atomics by as
# much. Guess, to be measured (bench/norm_tuning.py sweeps it): FP8 tensor scaling was
# issue-bound under ncu (gamma/beta reloaded for every row), bf16 output was not.
# bench/results/norm_tuning.json (H200): held weights lost for LayerNorm (FP8 at H=8192: 58.7%
# held against 70.2% reloaded) and won for RMSNorm only at H >= 14336 with 8 row groups per
# CTA (:data:`TUNED`); so none by default, 8 groups where held.
FWD_HOLD_WEIGHTS = {"none": False, "tensor": False, "mxfp8": False}
FWD_GROUPS_PER_CTA = 8
# Backward switches (bench/norm_tuning.py sweeps them). BWD_PREFETCH: load the next row
# group's x and dz before the current row's arithmetic (symbol suffix ``n`` when off).
# BWD_PACKED: keep the current row as stored (16-bit x: half the registers) and convert it
# again in the second pass (suffix ``k``). Either way the register estimate becomes a cap
# (``__launch_bounds__`` minimum CTAs, suffix ``m3``) so ptxas keeps the occupancy it
# promises. Guess, to be measured: the backward was register-bound (42-69% of copy at 1-2
# CTAs per SM). ptxas -v (sm_90, bf16): with the prefetch and a cap, LN at H=4096 (w4j4)
# spilled (packed or not) while without it 168 registers fit 3 CTAs with no spill; the
# packed form saved nothing once capped. So: no prefetch, not packed; more CTAs instead.
# bench/results/norm_tuning.json: without the cap as fast or faster (RMS H=4096 w4j4n 76.6%
# against w4j4nm3 73.8%; LN 62.3% against 62.4%), so the backward sets no cap (BWD_CAP).
BWD_PREFETCH = False
BWD_PACKED = False
BWD_CAP = False
# Backward rows split over a thread block cluster: bench/norm_bandwidth.py (H200, bf16)
# measured the general kernel ahead of every cluster layout (H=14336: 44.7/54.1% against
# 42.3/49.0% of copy for LN/RMS; H=65536: 50.7/55.0% against 21.8/25.5%), so by default a
# backward row that does not fit one CTA takes the general kernel (symbol suffix ``loop``).
BWD_CLUSTERS = False
# Round-3 code switches (bench/norm_tuning.py sweeps them; all off by default until measured).
# Forward (specialized kernel): FWD_EARLY_WEIGHTS issues the gamma/beta loads (kept as
# stored) before the row reductions, so their latency overlaps them (symbol suffix ``e``);
# FWD_ONE_REDUCTION (LayerNorm) replaces the two block reductions (sum, then squared
# deviations) by one of per-thread (count, mean, M2) triples merged with Chan's parallel
# formula (suffix ``u``; exact two-pass statistics per thread, so safe with large mean
# offsets); FWD_ACCUMULATORS splits each thread's sums over 1, 2 or 4 independent chains
# (suffix ``a2``/``a4``). Backward: BWD_SHARED_SUMS keeps the last 1 or 2 of the column-sum
# arrays (dbeta, then dgamma) in thread-private shared memory instead of registers (suffix
# ``s1``/``s2``), trading registers for occupancy. Guess, to be measured: the forward was
# latency-bound (two 32-deep add chains, two barriers per row), the backward register-bound.
FWD_EARLY_WEIGHTS = False
FWD_ONE_REDUCTION = False
FWD_ACCUMULATORS = 1
BWD_SHARED_SUMS = 0
# Round-4 switches for the FP8 (tensor-scaling) forward, off by default; the TUNED FP8
# layouts at H = 4096-14336 carry them (measured: bench/norm_tuning.py --candidates fp8).
# SASS (sm_90, bf16 x, the layouts without them): in the FP8 kernel each access's gamma/beta
# loads sit in a branch of their own and follow the previous access's amax update, so a row
# makes J dependent trips to L2 for the weights (the bf16 kernel, whose loop the compiler
# unswitches, issues them in one or two batches); and each CTA ends with a block barrier for
# the amax plus thread 0's read of the amax word (a round trip) before the atomic.
# FWD_FP8_BATCHED (suffix ``o``): the output stage of a row under one branch on the row's
# validity, amax and scaling inside it, so the weight loads of all J accesses can issue
# together. FWD_FP8_WARP_AMAX (suffix ``g``): no block reduction for the amax; lane 0 of
# each warp reads the amax word when the kernel starts (its latency overlaps the row) and,
# at the end, max-reduces its warp's amax into it only if larger (the word only grows, so a
# value no larger than an earlier reading needs no atomic).
FWD_FP8_BATCHED = False
FWD_FP8_WARP_AMAX = False
# Round-5 FP8 forward candidate, off by default (bench/norm_tuning.py --candidates fp8b).
# SASS (sm_90, NVRTC 13.5, the TUNED FP8 layouts): of about 620 instructions a thread issues
# per row at LayerNorm H = 14336 (w14j4og, 32 elements), about 90 pack the FP8 bytes (each
# cvt pair is split into bytes and reassembled: 5-6 instructions per pair instead of half a
# PRMT) and about 50 extract the upper bf16 half of each loaded word before shifting it.
# FWD_FP8_WORDS (suffix ``q``): the vector path loads bf16 x/gamma/beta as 32-bit words and
# unpacks each half in one instruction (``w << 16``, ``w & 0xffff0000``: exact), and packs
# the FP8 output four values to a word from the paired conversions. Same fp32 arithmetic and
# the same bytes as without it.
FWD_FP8_WORDS = False
# FWD_FP8_NEXT_ROW (suffix ``p``): each CTA handles up to FWD_GROUPS_PER_CTA row groups (as
# with held weights) and copies the next row group's x into shared memory with cp.async
# (16-byte accesses, each thread its own slots) right after the current row's first block
# reduction, so the copy overlaps the rest of the row: ncu (LayerNorm 14336 og) showed 2 CTAs
# per SM, 40.8% achieved occupancy and DRAM at 57.8%, with one row per CTA and so nothing in
# flight while a CTA is in its reductions, its output stage or its exit. No extra registers
# (the copy lands in shared memory: 16 bytes per access a thread holds); only where the
# access is 16 bytes and the slots fit the static shared memory. Same values, same bytes.
FWD_FP8_NEXT_ROW = False
# A layout's ``p`` (a TUNED tag's, or a sweep's) applies to these scalings (the copy is x's,
# whatever the output); FWD_FP8_NEXT_ROW turns it on for tensor scaling only.
# bench/norm_tuning.py --candidates big tried it at H = 65536 over clusters of 4 and 8 CTAs
# (whose slots fit the static shared memory), for bf16 and FP8 z: it lost there, 3-25 points
# (norm_tuning-big.json), and on the bf16 forwards at 4096-14336, 0.7-4.7 points
# (--candidates bf16p, norm_tuning-bf16p.json). Once the cluster mailboxes took the cluster
# barrier out of the row reductions it won at H = 65536 (clusters of 8, 64 row groups per
# CTA: --candidates big2, norm_tuning-big2.json), where TUNED now takes it for every z.
_NEXT_ROW_SCALING = ("tensor", "none")
STATIC_SMEM_BYTES = 48 * 1024  # static shared memory a CTA may declare
# Round-8 switches, off by default (bench/norm_tuning.py --candidates lanes). SASS (sm_90,
# NVRTC 13.5, bf16): after a row sum's block barrier every thread read the W per-warp values
# and added them one by one: at LayerNorm backward H = 14336 (w28, two sums) 14 LDS.128 and
# 54 FADD of the ~600 instructions a thread issues per row, and the staged backward unpacked
# each bf16 it read from shared memory in two instructions for odd elements (the forward's
# ``q`` had fixed that there). ROW_SUM_LANES (suffix ``l``): lane i reads warp i's value and
# the warp adds them by a butterfly of shuffles (log2 W steps; every lane the same bits, in
# another order than the one-by-one sum). BWD_STAGED_WORDS (``q`` on the staged backward):
# x, dz and gamma read from shared memory as 32-bit words and unpacked one instruction per
# element (same values, same bytes). BWD_GAMMA32 (``f``, staged backward): weight(gamma) kept
# in shared memory as fp32, converted once, instead of gamma as stored (unpacked, and with
# zero-centred gamma incremented, twice per row). BWD_FOLDED (``d``, staged backward): dx =
# r dy - (xc c1 + c0) with xc = x - mu and the row's c1 = r^2 mean(dy xhat), c0 = r mean(dy):
# two FFMA per element after xc and dy instead of four operations (other roundings, within
# the same bound).
ROW_SUM_LANES = False
BWD_STAGED_WORDS = False
BWD_GAMMA32 = False
BWD_FOLDED = False
# Round-11 switch, off by default (bench/norm_tuning.py --candidates defer). The staged
# backward over a cluster of 8 (H = 65536) stayed at 70% of copy (LayerNorm) against 89% for
# the cluster of 2 at 14336: each row waits for its sums from the 8 CTAs (one mailbox
# exchange) before it writes dx, and nothing of that CTA's own is left to issue meanwhile.
# BWD_DEFERRED (suffix ``i``, three stages or more): a row's sums are posted (row_post) and
# its dx written only after the next row's first pass and posting, so the exchange's wait
# overlaps a row of work; a row's stage is then refilled two rows later (one row fewer in
# flight) and the mailboxes have 4 parts instead of 2. Same values, same bits.
# FWD_DEFERRED (``i`` on the staged forward, one row per CTA): the same for z, after the
# row's last statistics exchange (LayerNorm without ``u`` still waits for the mean), x of
# the row read from its stage again. Why: LayerNorm FP8 at 65536 stayed at 81% of copy.
BWD_DEFERRED = False
FWD_DEFERRED = False
# Round-13 switch, off by default (bench/norm_tuning.py --candidates reread). ptxas -v
# (sm_90, NVRTC 13.5): the staged forward holds its x of the row in fp32 registers from the
# first pass to the output stage, across the row's block (cluster) exchanges: with the
# weights held (h) LayerNorm FP8 at 65536 takes 168 registers, 3 CTAs per SM where its
# stages fit 4 (bf16 z: 125), and at 4096 96 (5 per SM). Round 12's register caps (m)
# squeezed the same code and lost. FWD_REREAD (suffix ``y``, staged forward): x read again
# from its stage for each pass over it, and in the output stage one access at a time, so
# no pass's values live across an exchange: 128 and 64 registers there. Same values, same
# bits; a few shared-memory reads and unpacks more per element. Round 14 (--candidates
# hreread: h and y together at 8192 and 14336) and round 15 (--candidates wide: LayerNorm FP8
# at 65536 over 8 or 16 warps per CTA) found nothing faster in every round (norm_tuning-hreread,
# norm_tuning-wide.json); TUNED unchanged.
FWD_REREAD = False
# Round-16 switch, off by default (bench/norm_tuning.py --candidates shift). SASS (sm_90,
# NVRTC 13, bench/sass.py) of LayerNorm FP8 at 65536 (w4r1v8j8c8hogqiyt3): 18.5
# instructions per element in the row loop, 9.6 of them for the statistics (x read and
# unpacked twice around the mean's exchange: sum; deviation, square) and 8.8 for the output
# stage (3 unpacks, x - mu, * rsigma, * gamma + beta, amax, * scale, half a conversion).
# FWD_SHIFTED (suffix ``z``: the LayerNorm forward with FP8 output, staged or in registers,
# without ``u``): one pass about the row's first element K (staged: each thread copies it with
# the row; in registers: each thread reads it from global memory, one address per row; round
# 24, where every register layout with it lost: source_ab-ln4096-fp8-regz*.json): S1 = sum(x -
# K), S2 = sum((x - K)^2), one exchange of both per row; mean = K + S1 / H, variance = S2 / H -
# (S1 / H)^2.
# K is one of the row's values, so (mean - K)^2 <= M2 = sum((x - mean)^2) and S2 = M2 + H (mean -
# K)^2 <= (H + 1) M2: the cancellation multiplies S2's relative error by at most H + 1. In an fp32
# emulation of the kernel (bench/norm_shift_error.py), rsigma's relative error is 3.0e-3 at 65536
# where K is an outlier sqrt(H) = 256 standard deviations out (there the cancellation is H / 2; it
# nears H as K goes further out), 2.5e-7 for a typical K (two passes: 0.5-1.6e-7), against the
# 2^-4 of an E4M3 step. The output stage takes x * rsigma - mu * rsigma (one FFMA) instead of (x -
# mu) * rsigma: an absolute error of |mu| * rsigma * 2^-24 in units of the normalized value. FP8
# outputs only: a bf16 or fp32 z keeps the two-pass form (docs/norms.md).
FWD_SHIFTED = False
# Round-19 switch, off by default (bench/source_ab.py, below). FWD_WARP_STATS (suffix ``W``:
# the LayerNorm forward, register or staged, one CTA per row, without ``u`` or ``z``):
# each warp takes its lanes' sum and then their squared deviations from the warp's own mean
# (two passes over the registers, a warp_sum each), and the row's W warps exchange (count,
# sum, mean, M2) once: mean = the warps' sums added in order / H, M2 = sum(M2_w + n_w (m_w -
# mean)^2) (Chan's formula). One block barrier per row instead of the two-pass form's two
# (sum, then squared deviations from the row's mean); the same shuffles, and no
# cancellation (every deviation is from a mean of the values it is taken from). ``u`` also
# has one barrier, but merges (count, mean, M2) at each of a warp's five shuffle steps. The
# exchange reads each warp's four values once: sum n_w (m_w - mean)^2 is taken about warp 0's
# mean (sum n_w e_w^2 - (sum n_w e_w)^2 / H, e_w = m_w - m_0, small), which held ptxas to 108
# registers at LayerNorm 14336 (127 without W; 119 where the W values were read twice).
# Precision: each warp mean m_w is rounded to fp32 (by delta_w, up to |m_w| 2^-24) and the
# formula takes the rounded means as exact, which moves M2 by up to 2 n_w |m_w - mu| |delta_w|
# per warp: 1.2e-4 of M2 for fp32 rows with a 1e4 mean offset (test_forward_warp_stats),
# where the fp32 mean's own rounding already carries up to 6e-4 into every x - mu;
# negligible where |mu| is of the order of the spread.
# Measured (bench/source_ab.py, 20 paired rounds, H200; the template then aligned every
# forward's reduction buffer to 16 bytes, as it now does only under W): a TUNED entry where it won,
# LayerNorm bf16 14336 (staged qft4, 1.022x) and LayerNorm FP8 8192 (in place of u, 1.030x,
# every round); a default it is not: the register layout at 4096 lost 0.998x (16 of 20
# rounds; source_ab-ln4096-W2.json) and the FP8 14336 layout of two 14-warp rows per CTA ran at a
# third of its speed (0.33x, not explained: no spills; source_ab-ln14336-fp8-W2.json). With
# the first form (values read twice; source_ab-*-W-twopassmerge.json) the register layout
# at 8192 lost 0.933x (80 registers against 64: 3 CTAs per SM instead of 4; this form takes
# 78, and capped by m4 it spills) and LayerNorm FP8 4096 without i 0.975x (hogqit3).
# Round 23: with i (staged, one CTA per row: z of a row after the next row's exchange) at
# LayerNorm FP8 4096, 80 registers against hogqit3's 96 (6 CTAs per SM against 5), hogqiWt3
# ran 0.974x, ogqiWt3 0.966x, hogqiWt4 0.947x, slower in every round
# (source_ab-ln4096-fp8-Wi.json).
FWD_WARP_STATS = False
# Round-21 switch, off by default (bench/source_ab.py, edit ``cp256``). The staged kernels copy
# their rows (and, where they keep them in shared memory as stored, gamma and beta once) into
# shared memory by 16-byte ``cp.async.cg`` with the prefetch hint ``.L2::128B``.
# STAGED_FETCH256 (suffix ``L``): ``.L2::256B``, so that a miss may bring 256 bytes into L2
# (PTX leaves which bytes to the hardware; the template's comment says "the next 128", read
# it as "the rest of the 256"). Same copies, same values. On by the module switch it would
# also change the staged backwards, which were not measured. Measured (H200, 20
# paired rounds, 2026-12-03): RMSNorm FP8 at 65536 (``hogqit3``, clusters of 8) 1.048x and
# 1.046x in two runs (faster in 20 and 18 of 20 rounds; source_ab-fp8-cphints.json,
# source_ab-fp8-cp256.json), a TUNED entry; every other staged forward 0.988-1.000x
# (LayerNorm FP8 4096-65536, LayerNorm bf16 14336 and 65536, RMSNorm bf16 65536; the same
# files and source_ab-bf16-cp256.json); the staged backwards not measured. Without the hint
# (``cpnohint``) RMSNorm FP8 65536 ran 1.032x, LayerNorm FP8 4096 0.997x.
STAGED_FETCH256 = False
# Round-25 switch, off by default (bench/source_ab.py). The stages of a staged kernel follow
# its static shared memory (the reduction buffer, cluster mailboxes), aligned to 16 bytes, so
# where they start differs from layout to layout (ptxas, sm_90: 32, 128, 192, 224, 1056 or
# 1888 bytes past the 1 KB the driver keeps). bench/norm_cta_times.py first (2026-12-04): in
# LayerNorm FP8 4096 (hogqit3) the CTAs of the persistent grid end 41-55 us into a 52-55 us
# call; a dynamic row assignment meant to even that out (source_ab ``dynrows*``) ran
# 0.85-0.90x, and taking its parts apart (``dynstatic1``, ``dynloop1``) put the loss on the 16
# bytes of static shared memory it added: the stages 16 bytes off a 32-byte boundary. Then
# (``red4``, ``red8``, ``red24``: the reduction buffer longer, 20 paired rounds): 0.861x,
# 0.998x, 1.010x. STAGED_ALIGNED (suffix ``A``): the stages start on a 128-byte boundary
# (``extern __shared__ __align__(128)``; ptxas pads the static shared memory). Not every
# kernel gains (source_ab-align16.json, 10 paired rounds, ``align16`` against the template
# with 128 for all): LayerNorm FP8 14336 (ogqt2, stages at 224 before) 1.056x with it (every
# round), LayerNorm bf16 14336 (qfWt4, at 224) 0.943x and RMSNorm FP8 65536 (hogqiLt3, at
# 192) 0.984x (slower in every round), LayerNorm bf16 and FP8 and RMSNorm bf16 at 65536
# within 0.8% (either way). So TUNED takes it where it won; the staged backwards (at 1056)
# were not measured with it. Why the offset matters is not established.
STAGED_ALIGNED = False
# Round-5 candidate, off by default (0): the staged backward (symbol suffix ``t{stages}``).
# Each CTA (or cluster: H = 65536) holds a fixed share of the columns and loops over rows
# (persistent grid); a thread copies its share of the row's x and dz into shared memory
# with cp.async (sm_80+), ``stages`` rows deep, so the loads of the next stages - 1 rows are
# in flight while it computes the current one from shared memory: x and dz are read once
# (the general kernel at H >= 14336 reads them twice: 5 passes over memory, not 3), and
# they take no registers (the register kernels hold 2 fp32 per element: 255 registers and
# one CTA per SM for LayerNorm at H = 8192). Each thread reads back only what it copied, so
# cp.async.wait_group needs no barrier; the row sums take one block (cluster) barrier per
# row as before. gamma is copied once into shared memory (a thread's columns never
# change). Guess, to be measured (bench/norm_tuning.py --candidates bwd): Little's law wants
# ~33 KB of loads in flight per SM at 4.3 TB/s; H = 14336 bf16 with 3 stages keeps 2 rows of
# 56 KB in flight per SM.
BWD_STAGED = 0
# Round-9 candidate, off by default (0): the staged forward (symbol suffix ``t{stages}`` on a
# forward key). Each CTA (cluster) keeps the same columns and loops over rows (persistent
# grid); a thread copies its share of each row's x into shared memory by cp.async, ``stages``
# rows deep, and gamma (and beta) once; with FWD_GAMMA32 (suffix ``f``) the weights are kept
# there as fp32 with zero-centring applied, so the output stage reads 16-byte words of ready
# values instead of loading (from L1/L2) and unpacking bf16 per row. Why (SASS and ncu of the
# register kernels, LayerNorm FP8 at H = 14336): the CTA holds one row, so nothing is in
# flight while it reduces and writes (41% achieved occupancy, DRAM at 58%), and the weights
# cost about 2.25 instructions per element per row (loads and unpacking) of the ~12 issued.
# bench/norm_tuning.py --candidates sfwd (H200, 2026-12-02, norm_tuning-sfwd.json): LayerNorm
# FP8 won at every H (TUNED takes it: 14336 over a cluster of 2, 93.0% of copy against 78.8%;
# f only at 4096), while RMSNorm's forwards and LayerNorm bf16 at 4096 and 8192 lost to their
# register kernels (0.90-0.99x, norm_tuning-sfwd-rms.json) and LayerNorm bf16 at 14336 and
# 65536 tied (1.003-1.005x, 5 of 6 rounds); so off by the rules, on through TUNED. Round 10
# (TUNED only): several rows per CTA sharing the weights (r2), and the weights in registers
# (h, e) rather than shared memory (staged_weights_in_registers).
FWD_STAGED = 0
FWD_GAMMA32 = False
# Round-10 candidate, off by default: a balanced persistent grid (host side only; the
# staged forward, the forwards that take several row groups per CTA and every register
# backward). The persistent grid has as many CTAs
# (clusters) as are resident at once, and CTA i takes row groups i, i + grid, ...: with
# 16384 rows over 528 CTAs, 16 take 32 rows and 512 take 31, so the last row's time runs on
# 3% of the grid. Balanced: the fewest CTAs that keep the most row groups any CTA takes
# (here 512 CTAs of 32 rows each), so that all of them finish together.
PERSISTENT_BALANCED = False
# Dynamic shared memory a CTA may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin), by
# compute capability: sm_80/87 163 KB, sm_86/89/120 99 KB, sm_90/100/103 227 KB.
OPTIN_SMEM_BYTES = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448,
                    100: 232448, 103: 232448, 110: 232448, 120: 101376, 121: 101376}  # fmt: skip
# Bytes of x (and of dz) a thread of the staged backward copies per row: 2 bf16 accesses. Its
# registers are then the column sums plus about 32 (ptxas, sm_90, NVRTC 13, bf16, no spills:
# LayerNorm H = 14336 w28j2 60, H = 65536 w32j2c4 61, H = 8192 w16j2 75-78; RMSNorm 14336
# w28j2 56); at 4 accesses LayerNorm took 128 (w4j4, H = 4096) and spilled under the 128 cap
# of 448 or 512 threads (H = 14336 w14j4: 40 bytes of stack), so 2 is the default.
STAGED_TARGET_BYTES = 32
STAGED_OVERHEAD_REGISTERS = 32
# Measured winners that the rules above do not reproduce: (op, H, scaling) -> tag, for sm_90
# with 16-bit x and 16-bit gamma (the sweep ran bf16); other keys take the rules. Figures:
# % of copy bandwidth, bench/results/norm_tuning.json (H200, N=16384; N=2048 at H=65536),
# the winner against the rule's layout of the time.
TUNED: dict[tuple[str, int, str], str] = {
    ("rmsnorm_fwd", 4096, "none"): "w8r1v8j2c1",  # 91.1 against w4j4 88.0
    ("rmsnorm_fwd", 14336, "none"): "w7r1v8j8c1",  # 96.2 against w14j4 93.2
    # H = 65536 forward, "fdefer" (round 11): --candidates fdefer, 6 rounds
    # (norm_tuning-fdefer.json): the staged forward with i (a row's z written after the next
    # row's statistics are posted), faster than the entry before in every round; figures
    # that run's, the entry before in brackets (RMSNorm: hpx64, 91.2 against w16j8c2h 88.6
    # in big2)
    ("rmsnorm_fwd", 65536, "none"): "w4r1v8j8c8hqit3b2",  # 92.6 (90.5, hpx64), 1.023x
    # LayerNorm bf16 at 65536: the staged forward with the weights held in registers (round
    # 10, --candidates sregs --hidden 4096,65536, 4 rounds, norm_tuning-sregs.json: 1.036x,
    # every round); before it hpx64 (84.0 against w16j8c2hua2 72.4, big2); then with i
    # (fdefer, above)
    ("layernorm_fwd", 65536, "none"): "w4r1v8j8c8hqit3",  # 91.5 (86.3, hqt2), 1.057x
    # LayerNorm bf16 at 14336: the staged forward (t4: x through shared memory 4 rows deep,
    # the weights there too; f: as fp32; q: 32-bit word reads), round 17: --candidates pdl
    # (6 rounds, norm_tuning-pdl-ln14336.json) 1.022x over the entry before, w7r1v8j8c1 (91.0
    # against w14j4 90.0 in norm_tuning.json); then bench/source_ab.py --cases layernorm:14336
    # --rounds 20 on rotating buffers (source_ab-ln14336.json; w7r1v8j8c1 with the trigger):
    # 1.014x over it and 1.020x over torch.compile, both in every round; then round 19, W
    # (FWD_WARP_STATS: one exchange of the statistics per row): bench/source_ab.py
    # --cases layernorm:14336 --variants base,@w7r1v8j8c1qft4 --rounds 20
    # (source_ab-ln14336-W2.json) 1.022x over qft4 (faster in 17 of 20 rounds) and 1.027x over
    # torch.compile (19 of 20); % of copy from that run
    ("layernorm_fwd", 14336, "none"): "w7r1v8j8c1qfWt4",  # 94.9 against 93.0 (qft4)
    # FP8 forward with the round-4 switches (o: batched output stage, g: warp amax atomics)
    # and the round-5 ones (q: word unpacking and packing, p: the next row group copied
    # ahead; x4: 4 row groups per CTA), bench/norm_tuning.py --candidates fp8b, 2026-12-01
    # (norm_tuning-fp8b.json; the round-4 entries before them in norm_tuning-fp8.json)
    # LayerNorm FP8: the round-9 staged forward (t: x through shared memory, 2-3 rows deep,
    # persistent grid; f: the weights there as fp32), bench/norm_tuning.py --candidates sfwd
    # --norms layernorm --rounds 6 --repeat 5 --shuffle, 2026-12-02 (norm_tuning-sfwd.json):
    # faster than the entry before in every round (median same-round speed-ups 1.013x,
    # 1.037x, 1.183x, 1.091x); the register entries they replace in the comments. Then
    # --candidates snear (8 rounds, norm_tuning-snear.json): u at 8192 (1.012x, every round).
    # Round 10, two rows per CTA sharing the weights (r2): --candidates srows (6 rounds,
    # norm_tuning-srows.json) and bal (8 rounds, norm_tuning-bal.json), 2026-12-02, faster
    # than the entry before in every round of both: 4096 1.011x and 1.014x, 14336 (the
    # cluster's row in one CTA of 14 warps) 1.015x and 1.020x; % of copy from bal. Then
    # --candidates sregs (4 rounds, norm_tuning-sregs.json): the weights held in registers
    # instead of shared memory (h) at 4096 (1.014x) and 65536 (1.043x), every round. Round
    # 11, --candidates fdefer (6 rounds, norm_tuning-fdefer.json): at 4096 one row per CTA
    # with i (z a row later), 1.010x over the r2 entry, every round (89.3 against 88.4;
    # the r2 entry was 87.4 against ogqft2 86.1 in sregs). Round 19, bench/source_ab.py --out
    # fp8 (20 rounds, source_ab-ln8192-fp8-W2.json): W at 8192 in place of u (one exchange
    # either way: W's two passes per warp, not u's merges at each shuffle step), 1.030x
    # over uogqt3 in every round (93.5 against 90.8).
    # Round 25, the stages on a 128-byte boundary (A, STAGED_ALIGNED above): at 4096 1.010x
    # (source_ab-ln4096-fp8-smemoffset.json, red24), at 14336 1.056x (source_ab-align16.json);
    # norm_bandwidth-2026-12-04-align128.json: 91.6 and 97.9 (paired 91.3 and 98.2).
    ("layernorm_fwd", 4096, "tensor"): "w4r1v8j4c1hogqiAt3",  # 89.3 (88.4, w4r2v8j4c1hogqt3)
    ("layernorm_fwd", 8192, "tensor"): "w4r1v8j8c1ogqWt3",  # 93.5 (90.8, uogqt3)
    ("layernorm_fwd", 14336, "tensor"): "w14r2v8j4c1ogqAt2",  # 92.4 against w7r1j4c2 90.6 (78.8)
    # Round 13, --candidates reread --hidden 4096,65536 (4 rounds, norm_tuning-reread.json):
    # y (x read from its stage in each pass: 168 -> 128 registers, 4 CTAs per SM) with i,
    # faster than round 10's hogqt3 (81.2%) in every round; y lost at every other entry
    # Round 16, --candidates shift --norms layernorm (4 rounds, norm_tuning-shift.json): z
    # (one-pass statistics about x[row, 0]; 128 -> 96 registers) on round 13's entry, 93.6
    # against 85.5, 1.086x in every round; z lost at 4096-14336 (0.82-0.99x)
    ("layernorm_fwd", 65536, "tensor"): "w4r1v8j8c8hogqiyzt3",  # 93.6 (85.5, hogqiyt3)
    ("rmsnorm_fwd", 4096, "tensor"): "w4r1v8j4c1hogqx4",  # 89.2 against ogq 88.3, near
    ("rmsnorm_fwd", 8192, "tensor"): "w2r1v8j8c2hogqpx64",  # 95.2 against w4j8c1gq 91.5, bwdc
    ("rmsnorm_fwd", 14336, "tensor"): "w14r1v8j4c1hogq",  # 94.7 (8 groups) against hog 83.9
    # Round 21, bench/source_ab.py edit cp256 (20 rounds, source_ab-fp8-cp256.json, and
    # source_ab-fp8-cphints.json minutes before): L (STAGED_FETCH256, the row copies asking
    # L2 for 256 bytes) 1.046x and 1.048x over hogqit3, round 11's entry (fdefer: 93.3%
    # against 88.1% for hogqpx64 in norm_tuning-fdefer.json); % of copy from cp256's run
    ("rmsnorm_fwd", 65536, "tensor"): "w4r1v8j8c8hogqiLt3",  # 94.9 (90.9, hogqit3)
    # "near": bench/norm_tuning.py --candidates near --shuffle --rounds 8 --repeat 5,
    # 2026-12-01 (norm_tuning-near-{ln,rms}.json): the neighbourhood of each entry timed in
    # shuffled short rounds; the entries marked "near" were faster than the previous one in
    # 88-100% of the rounds (median same-round speed-ups 1.003-1.011x); the figures are
    # that run's.
    # H = 65536, "big2": bench/norm_tuning.py --candidates big2 --shuffle --rounds 3
    # --repeat 5, 2026-12-01 (norm_tuning-big2.json), after the cluster mailboxes took the
    # cluster barrier (and its MEMBAR.ALL.GPU) out of every row reduction: clusters of 8
    # with the next row copied ahead and 64 row groups per CTA, and the staged backward over
    # clusters of 8, faster than the entries before in every round (figures: that run's;
    # the previous entries had themselves gained 1-13 points from the mailboxes alone,
    # norm_tuning-big-mail.json). Before the mailboxes:
    # H = 65536 forward entries: bench/norm_tuning.py --candidates big, 2026-12-01
    # (norm_tuning-big.json: clusters of 2, 4 and 8 CTAs at 2-8 accesses per thread, held
    # weights, next-row copies; the winners against the earlier w19j7c2 layouts; p lost
    # everywhere there, 3-25 points); LayerNorm then --candidates onered (norm_tuning-onered.json:
    # u, one (count, mean, M2) reduction, a cluster barrier fewer per row; a2, split sums)
    # Backward at 4096: bench/norm_tuning.py --candidates bwd2, 2026-12-01 (norm_tuning-bwd2.json:
    # 1-4 accesses per thread, 2-6 stages, 2/4/8 CTAs per SM); elsewhere round 5's.
    # Backward: the round-5 staged kernel (t: x and dz through shared memory, cp.async),
    # bench/norm_tuning.py --candidates bwd, 2026-12-01 (norm_tuning-bwd.json), against the
    # earlier defaults (register layouts; the general kernel from 14336). "lanes": bench/
    # norm_tuning.py --candidates lanes --shuffle --rounds 12 --repeat 5, 2026-12-02
    # (norm_tuning-lanes.json): q (shared-memory reads as words) and l (row sums across
    # lanes) on the staged entries, taken where faster than the entry before in >= 92% of
    # the rounds (median same-round speed-ups 1.002-1.046x); the figures are that run's.
    # "fold": --candidates fold, same settings (norm_tuning-fold.json): f (fp32 gamma in
    # shared memory) and d (dx from per-row constants) on those entries; f won at RMSNorm
    # 14336 (every round, 1.016x), d at LayerNorm 4096 (92% of rounds, 1.004x); both lost
    # elsewhere (to 0.937x). "bwdc": --candidates bwdc, 8 rounds (norm_tuning-bwdc.json,
    # norm_tuning-bwdc-4096.json): the staged backward and the FP8 forward at 4096-14336
    # split over clusters of 2 and 4 CTAs (the row sums through the cluster mailboxes);
    # faster than the entries before in every round at LayerNorm backward 14336 (1.182x)
    # and 4096 (1.040x) and RMSNorm FP8 forward 8192 (1.042x); slower elsewhere.
    ("layernorm_bwd", 4096, "none"): "w1r1v8j4c4qdt3",  # 83.1 against w8j2c1qdt3b2 79.8, bwdc
    ("layernorm_bwd", 8192, "none"): "w16r1v8j2c1qlt4",  # 86.3 against t4 84.8, lanes
    ("layernorm_bwd", 14336, "none"): "w7r1v8j4c2qt3",  # 88.9 against w28j2c1qt2b2 75.2, bwdc
    # "defer" (round 11): --candidates defer, 6 rounds (norm_tuning-defer.json): i (a row's dx
    # written after the next row's sums are posted), faster than the entry before in every
    # round at 65536 (LayerNorm 1.090x, now 16 warps of 2 accesses per CTA, RMSNorm 1.125x) and
    # RMSNorm 14336 (1.008x); figures that run's, the entry before in brackets.
    ("layernorm_bwd", 65536, "none"): "w16r1v8j2c8qlit3b2",  # 77.2 (71.1, w8r1v8j4c8qlt3b2)
    ("rmsnorm_bwd", 4096, "none"): "w8r1v8j2c1t5",  # 85.7 against t4 77.3, bwd2
    ("rmsnorm_bwd", 8192, "none"): "w16r1v8j2c1qt4",  # 92.9 against t4 92.7, lanes
    # Round 22, --candidates fetch256 (L on each staged backward entry: its row copies ask L2
    # for 256 bytes), 8 shuffled rounds (norm_tuning-fetch256.json): RMSNorm 14336 1.014x in
    # every round, then 1.016x in 20 of 20 (norm_tuning-fetch256-rms14336.json, % of copy
    # from it); every other staged backward 0.988-1.000x, entries unchanged.
    ("rmsnorm_bwd", 14336, "none"): "w28r1v8j2c1lfiLt3",  # 91.3 (89.9, lfit3)
    ("rmsnorm_bwd", 65536, "none"): "w16r1v8j2c8it4b1",  # 88.1 (78.3, w4r1v8j8c8t3b4), defer
    # rmsnorm_bwd_add: the same kernel with the residual gradient added (not swept apart)
    ("rmsnorm_bwd_add", 4096, "none"): "w8r1v8j2c1t5",
    ("rmsnorm_bwd_add", 8192, "none"): "w16r1v8j2c1qt4",
    ("rmsnorm_bwd_add", 14336, "none"): "w28r1v8j2c1lfiLt3",
    ("rmsnorm_bwd_add", 65536, "none"): "w16r1v8j2c8it4b1",
}
LOOP_BLOCK = 1024  # threads per CTA of the streaming kernels (forward, backward row sums)
TILE_BLOCK = 256  # threads per CTA of the streaming backward (8 warps on a 32-access tile)
TILE_CTAS_PER_SM = 4  # guess, to be measured: target CTAs of the streaming backward
FINALIZE_BLOCK = 256
# Parameter slots that take the array arguments or eps, for launch plans (Kernel._submit).
# Forward (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv): scale_inv is slot 8
# with tensor scaling, slot 9 (the block scales) with MXFP8.
_FWD_REFS = (*((i, Ptr(i)) for i in range(8)), (12, Float(0)))
_FWD_TENSOR_REFS = (*_FWD_REFS, (8, Ptr(8)))
_FWD_MXFP8_REFS = (*_FWD_REFS, (9, Ptr(8)))
# Backward (dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace); slot 8, the row
# sums inside the workspace, is added per call (its offset depends on the shapes).
_BWD_REFS = (*((i, Ptr(i)) for i in range(7)), (7, Ptr(9)), (9, Ptr(7)), (10, Ptr(8)))


@dataclass(frozen=True)
class LaunchConfig:
    """How a variant maps rows to threads.

    ``mode`` is ``"regs"`` (the row lives in registers; ``hidden_size`` compiled in) or
    ``"loop"`` (the row is streamed from memory; the general kernel). In ``regs`` mode a row
    is held by ``cluster`` CTAs (a thread block cluster, sm_90/sm_100) of ``warps`` warps
    each; each thread holds ``iters`` accesses of ``vec`` elements; a CTA holds ``rows`` rows.
    The other fields switch code paths or grid choices, each named by a letter in :attr:`tag`
    (which lists them) and most with a module constant that turns it on by default
    (``FWD_HOLD_WEIGHTS``, ``BWD_PREFETCH``, ``BWD_PACKED``, ``FWD_FP8_WORDS``,
    ``ROW_SUM_LANES``, ...); ``stages`` > 1 selects the staged kernel (``BWD_STAGED``,
    ``FWD_STAGED``; a persistent grid; backward: one row per CTA or cluster, and
    ``prefetch``, ``packed`` and ``shared_sums`` do not apply, so a staged layout reports
    the field defaults for them; forward: several rows per CTA without a cluster, ``hold``
    and ``early`` keep the weights in registers rather than shared memory, ``next_row``
    does not apply). In
    ``loop`` mode ``vec`` is the widest access (16 bytes of x), used at run time when the
    hidden size is a multiple of it and every pointer is 16-byte aligned.

    Chosen by :func:`launch_config`; bench/norm_tuning.py sweeps the layouts on the H200 and
    bench/norm_bandwidth.py compares the specialized and general kernels.
    """

    mode: str
    vec: int
    warps: int = 0
    rows: int = 1
    iters: int = 0
    cluster: int = 1
    hold: bool = False  # forward: gamma/beta held in registers across row groups
    prefetch: bool = True  # backward: the next row group's loads issued early
    packed: bool = False  # backward: the current row kept as stored, converted twice
    min_ctas: int = 0  # > 1: __launch_bounds__ asks ptxas for this many CTAs per SM
    early: bool = False  # forward: gamma/beta loaded before the row reductions
    one_reduction: bool = False  # forward LayerNorm: (count, mean, M2) merged in one reduction
    accumulators: int = 1  # forward: independent partial sums per thread (1, 2 or 4)
    shared_sums: int = 0  # backward: column-sum arrays kept in shared memory (0, 1 or 2)
    batched: bool = False  # forward, tensor scaling: the output stage under one branch
    warp_amax: bool = False  # forward, tensor scaling: one guarded atomic per warp
    stages: int = 0  # > 1: the staged kernel (x, and dz backward, via cp.async in shared memory)
    words: bool = False  # FP8 forward, staged backward: bf16 (and FP8) moved as 32-bit words
    next_row: bool = False  # forward (tensor scaling, bf16/fp16/fp32 z): next row's x copied ahead
    groups: int = 0  # forward, held weights or next_row: row groups per CTA (0: the module's)
    ctas_per_sm: int = 0  # backward, staged forward: at most this many CTAs per SM (0: module's)
    lanes: bool = False  # regs: a row sum's W warp values added across lanes by shuffles
    gamma32: bool = False  # staged: weight(gamma) (and beta) held in shared memory as fp32
    folded: bool = False  # staged backward: dx from the row's constants, two FFMA per element
    deferred: bool = False  # staged: a row's dx (z) after the next row's sums are posted
    reread: bool = False  # staged forward: x read from its stage in each pass, not held
    shifted: bool = False  # LayerNorm FP8 forward: one-pass statistics about x[row, 0]
    warp_stats: bool = False  # LayerNorm forward: per-warp two passes, one exchange per row
    fetch256: bool = False  # staged: the 16-byte cp.async copies ask L2 for 256 bytes
    aligned: bool = False  # staged: the stages start on a 128-byte boundary

    @property
    def threads(self) -> int:
        """Threads per CTA of the main kernel."""
        return self.rows * 32 * self.warps if self.mode == "regs" else LOOP_BLOCK

    @property
    def tag(self) -> str:
        """The configuration as a symbol suffix: ``w4r1v8j4c1`` or ``loop``; switches that
        change the code follow: ``h`` (held weights), ``k`` (packed), ``n`` (no prefetch),
        ``e`` (early weight loads), ``u`` (one reduction), ``o`` (batched FP8 output stage),
        ``g`` (warp-level amax atomics), ``q`` (the FP8 forward's word unpacking and
        packing; the staged backward's and bf16 forward's 32-bit word reads), ``p`` (the
        forward's next row group copied ahead), ``l`` (the row sums' per-warp values added
        across lanes by shuffles), ``f`` (a staged kernel's weights in shared memory as
        fp32), ``d`` (the staged backward's dx from per-row constants), ``i`` (a staged
        kernel's dx or z of a row written after the next row's sums are posted), ``y`` (the
        staged forward's x read from its stage in each pass and in the output stage access
        by access, instead of held in registers across the row), ``z`` (the staged LayerNorm
        FP8 forward's one-pass statistics about the row's first element), ``W`` (the
        LayerNorm forward's statistics by two passes per warp and one exchange), ``L`` (a
        staged kernel's cp.async copies of the rows ask L2 for 256 bytes), ``A`` (a staged
        kernel's stages on a 128-byte boundary), ``a2``
        (split sums), ``s1`` (column sums in shared memory), ``t3`` (the staged kernel, 3
        rows deep), ``m2`` (at least 2 CTAs per SM: a register cap for ptxas); then the
        grid choices, the same code: ``x4`` (4 row groups per CTA where a CTA takes
        several, forward) and ``b2`` (a persistent grid of at most 2 CTAs per SM: the
        backward's, with as many partial column-sum rows, and the staged forward's; the code
        differs only in leaving out the dependent launch's trigger)."""
        if self.mode == "loop":
            return "loop"
        switches = ("h" if self.hold else "") + ("k" if self.packed else "")
        switches += "" if self.prefetch else "n"
        switches += ("e" if self.early else "") + ("u" if self.one_reduction else "")
        switches += ("o" if self.batched else "") + ("g" if self.warp_amax else "")
        switches += ("q" if self.words else "") + ("p" if self.next_row else "")
        switches += ("l" if self.lanes else "") + ("f" if self.gamma32 else "")
        switches += ("d" if self.folded else "") + ("i" if self.deferred else "")
        switches += ("y" if self.reread else "") + ("z" if self.shifted else "")
        switches += ("W" if self.warp_stats else "") + ("L" if self.fetch256 else "")
        switches += "A" if self.aligned else ""
        switches += f"a{self.accumulators}" if self.accumulators > 1 else ""
        switches += f"s{self.shared_sums}" if self.shared_sums else ""
        switches += f"t{self.stages}" if self.stages else ""
        switches += f"m{self.min_ctas}" if self.min_ctas > 1 else ""
        switches += f"x{self.groups}" if self.groups else ""
        switches += f"b{self.ctas_per_sm}" if self.ctas_per_sm else ""
        return f"w{self.warps}r{self.rows}v{self.vec}j{self.iters}c{self.cluster}{switches}"


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


def gamma_dtype(key: KernelKey) -> str:
    """Dtype of gamma/beta/dgamma/dbeta: fp32 with the ``fp32_gamma`` flag, else x's dtype."""
    return "fp32" if key.flag("fp32_gamma") else key.in_dtype


def _vector_width(hidden: int, itemsize: int) -> int:
    """The widest access (power of two, at most 16 bytes) whose width divides ``hidden``."""
    v = 16 // itemsize
    while hidden % v:
        v //= 2
    return v


def fits_register_file(warps: int, regs: int) -> bool:
    """Whether a CTA of ``warps`` warps using ``regs`` registers per thread fits one SM: the
    register file is split over 4 sub-partitions, each holding a quarter of the warps."""
    return -(-warps // 4) * 4 * 32 * regs <= REGISTER_FILE


def _registers(
    backward: bool, accumulators: int, elements: int, itemsize: int = 4, *,
    weights: int = 0, prefetch: bool = True, packed: bool = False,
) -> int:  # fmt: skip
    """Estimated registers per thread holding ``elements`` values of each row tensor (x of
    ``itemsize`` bytes), rounded up to the allocation unit (8 per thread).

    Forward: x in fp32, plus ``weights`` tensors (gamma, beta) held as stored
    (``itemsize`` bytes each: gamma's dtype) when they stay in registers. Backward: the
    column sums in fp32; x and dz as xhat and dy in fp32 (``packed``: as stored); with
    ``prefetch`` the next row's x and dz as stored too."""
    stored = -(-elements * itemsize // 4)
    if backward:
        row = 2 * stored if packed else 2 * elements
        regs = accumulators * elements + row
        regs += 2 * stored + BWD_OVERHEAD_REGISTERS if prefetch else BWD_OVERHEAD_NO_PREFETCH
    else:
        regs = elements + weights * stored + OVERHEAD_REGISTERS
    return -(-regs // 8) * 8


def _switches(key: KernelKey) -> tuple[bool, bool, bool]:
    """``(hold, prefetch, packed)`` for a key, from the module's defaults."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    if spec.backward:
        return False, BWD_PREFETCH, BWD_PACKED and key.input.itemsize < 4
    return FWD_HOLD_WEIGHTS.get(key.scaling, False), True, False


@functools.lru_cache(maxsize=1024)
def launch_config(key: KernelKey) -> LaunchConfig:
    """The launch configuration of a norm variant (see :class:`LaunchConfig`).

    Heuristic (thresholds checked against bench/norm_tuning.py): the access width is the widest that
    divides H (16 bytes of x at most). Each thread should hold about ``TARGET_BYTES`` of a row
    tensor; the fewest warps per row that achieve it are used, up to 32. A layout must fit:
    at most 1024 threads per CTA, and the estimated registers (:data:`OVERHEAD_REGISTERS` plus
    the row values and, backward, column sums: all fp32) within 255 per thread and the register
    file (:func:`fits_register_file`). Candidates, in order: one CTA per row with up to twice
    the target per thread; then, on sm_90, sm_100 and sm_103 (where clusters of up to 8 CTAs
    are portable), the row split over a cluster of 2, 4 or 8 CTAs with the same shares; then
    larger shares (up to :data:`MAX_ELEMENTS` elements per thread), one CTA first. If nothing
    fits, the streaming kernel is used. Small rows are packed several to a CTA (forward 128
    threads). The backward takes no clusters unless :data:`BWD_CLUSTERS`.
    Code switches (:data:`FWD_HOLD_WEIGHTS`, :data:`BWD_PREFETCH`, :data:`BWD_PACKED`) enter
    the register estimate and the symbol (:attr:`LaunchConfig.tag`). On sm_90 with 16-bit x
    and gamma, the measured winners in :data:`TUNED` (bench/results/norm_tuning.json) take
    precedence over these rules.
    """
    tuned = _tuned(key)
    if tuned is None:
        stages = BWD_STAGED if key.spec.backward else FWD_STAGED
        tuned = staged_layout(key, stages) if stages > 1 else None
    cfg = tuned if tuned is not None else _layout(key, *_switches(key))
    return _round8_switches(key, _round3_switches(key, cfg))


def staged_smem_bytes(
    cfg: LaunchConfig, in_size: int, w_size: int, *, tensors: int = 2, weights: int = 1
) -> int:
    """Dynamic shared memory (bytes) of a staged CTA (``cfg.stages`` > 1): ``tensors`` row
    tensors of ``stages`` rows for each of the CTA's ``cfg.rows`` row slots (``in_size`` bytes
    each; the backward's x and dz, the forward's x) and ``weights`` weight tensors once,
    shared by the row slots (``w_size`` bytes; 4 with ``gamma32``: the backward's gamma, the
    forward's gamma and beta), for a row slot's ``iters * 32 * warps`` accesses of ``vec``
    elements; 0 for other layouts. :func:`staged_counts` gives a key's ``tensors`` and
    ``weights``."""
    if cfg.mode != "regs" or cfg.stages < 2:
        return 0
    share = cfg.iters * 32 * cfg.warps * cfg.vec
    rows = tensors * cfg.stages * cfg.rows * in_size
    return share * (rows + weights * (4 if cfg.gamma32 else w_size))


def staged_counts(spec: NormSpec, cfg: LaunchConfig | None = None) -> dict[str, int]:
    """The row tensors and weight tensors a staged kernel of ``spec`` (with layout ``cfg``)
    keeps in shared memory (:func:`staged_smem_bytes`' keywords): backward x and dz, gamma;
    forward x, gamma (and beta for LayerNorm), none of the weights where ``cfg`` keeps them
    in registers (:func:`staged_weights_in_registers`)."""
    if spec.backward:
        return {"tensors": 2, "weights": 1}
    if cfg is not None and staged_weights_in_registers(spec, cfg):
        return {"tensors": 1, "weights": 0}
    return {"tensors": 1, "weights": 1 if spec.rms else 2}


def staged_weights_in_registers(spec: NormSpec, cfg: LaunchConfig) -> bool:
    """Whether a staged forward layout keeps its weights in registers rather than shared
    memory (round 10): held once per CTA (``h``) or loaded per row from global memory, an L2
    hit, before the reductions (``e``); the staged backward always stages gamma."""
    return cfg.stages > 0 and not spec.backward and (cfg.hold or cfg.early)


def staged_layout(
    key: KernelKey, stages: int, target_bytes: int | None = None
) -> LaunchConfig | None:
    """The staged layout of a specialized key (:data:`BWD_STAGED`, :data:`FWD_STAGED`), or
    None where none fits.

    Rule (a guess to be measured): the access width as for the register kernels; one row per
    CTA (or cluster); the fewest warps that give each thread ``target_bytes`` of x (default:
    backward :data:`STAGED_TARGET_BYTES`, 2 bf16 accesses; forward the register kernels'
    ``TARGET_BYTES``), up to twice that (at most 64 elements), such that the estimated
    registers fit 255 and the register file (:func:`staged_fits`), and the shared memory of
    ``stages`` rows plus the weights fits the arch's opt-in limit (:data:`OPTIN_SMEM_BYTES`,
    1 KB kept for the reductions); ``stages`` drops one at a time, down to 2, before the row
    is split over a cluster of 2, 4 or 8 CTAs (sm_90 and sm_100 only). Forward layouts take
    the weights as fp32 (``f``) with :data:`FWD_GAMMA32` where that fits."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    if key.hidden_size is None or stages < 2:
        return None
    if target_bytes is None:
        target_bytes = STAGED_TARGET_BYTES if spec.backward else TARGET_BYTES["fwd"]
    itemsize = key.input.itemsize
    arch = arch_number(key.arch)
    vec = _vector_width(key.hidden_size, itemsize)
    accesses = key.hidden_size // vec
    start = max(1, target_bytes // (vec * itemsize))
    most = max(start, MAX_ELEMENTS // vec)
    clusters = (1, 2, 4, 8) if 90 <= arch < 110 else (1,)
    for cluster in clusters:
        for depth in range(stages, 1, -1):
            for iters in range(start, min(2 * start, most) + 1):
                warps = -(-accesses // (32 * cluster * iters))
                if warps > 32 or (cluster > 1 and warps * 32 * cluster > accesses):
                    continue
                iters = -(-accesses // (32 * cluster * warps))
                cfg = LaunchConfig("regs", vec, warps, 1, iters, cluster, stages=depth)
                if not spec.backward and FWD_GAMMA32:
                    f32 = dataclasses.replace(cfg, gamma32=True)
                    cfg = f32 if staged_fits(key, f32) else cfg
                if staged_fits(key, cfg):
                    return cfg
    return None


def staged_fits(key: KernelKey, cfg: LaunchConfig) -> bool:
    """Whether the staged layout ``cfg`` fits ``key``'s arch: the estimated registers
    (backward: the column sums, fp32, plus :data:`STAGED_OVERHEAD_REGISTERS`; forward: as the
    register kernels, the row in fp32 plus :data:`OVERHEAD_REGISTERS`) within 255 and the
    register file, and the shared memory of its stages plus the weights within the arch's
    opt-in limit (:data:`OPTIN_SMEM_BYTES`, 1 KB kept for the reductions)."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    elements = cfg.iters * cfg.vec
    w_size = DTYPES[gamma_dtype(key)].itemsize
    if spec.backward:
        regs = -(-(spec.accumulators * elements + STAGED_OVERHEAD_REGISTERS) // 8) * 8
    elif staged_weights_in_registers(spec, cfg):
        regs = _registers(False, 0, elements, w_size, weights=1 if spec.rms else 2)
    else:
        regs = _registers(False, 0, elements)
    if regs > MAX_REGISTERS or not fits_register_file(cfg.rows * cfg.warps, regs):
        return False
    arch = arch_number(key.arch)
    limit = OPTIN_SMEM_BYTES.get(arch, min(OPTIN_SMEM_BYTES.values())) - 1024
    size = staged_smem_bytes(cfg, key.input.itemsize, w_size, **staged_counts(spec, cfg))
    size += cfg.stages * cfg.threads * 4 if cfg.shifted else 0  # z: each thread's copy of K
    return size <= limit


def _round3_switches(key: KernelKey, cfg: LaunchConfig) -> LaunchConfig:
    """``cfg`` with the module's defaults for the round-3 switches (``FWD_EARLY_WEIGHTS``,
    ``FWD_ONE_REDUCTION``, ``FWD_ACCUMULATORS``, ``BWD_SHARED_SUMS``) and the round-4 FP8
    candidates (``FWD_FP8_BATCHED``, ``FWD_FP8_WARP_AMAX``: tensor scaling only) where they
    apply; each stays on where ``cfg``, a :data:`TUNED` entry, has it (``e``, ``u``, ``a2``,
    ``o``, ``g``, ``q``, ``p``)."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    if cfg.mode != "regs" or cfg.stages:
        return cfg
    if spec.backward:
        # Column-sum arrays in shared memory: at most what fits in the 48 KB of static shared
        # memory a CTA can have (4 bytes per element a thread holds, per array; 1 KB kept for
        # the kernel's own reductions).
        per_array = cfg.threads * cfg.vec * cfg.iters * 4
        fits = max(0, (STATIC_SMEM_BYTES - 1024) // per_array)
        shared = min(BWD_SHARED_SUMS, spec.accumulators, fits)
        return dataclasses.replace(cfg, shared_sums=shared) if shared else cfg
    return dataclasses.replace(
        cfg, early=(cfg.early or FWD_EARLY_WEIGHTS) and not cfg.hold,
        one_reduction=(cfg.one_reduction or FWD_ONE_REDUCTION) and not spec.rms,
        accumulators=cfg.accumulators if cfg.accumulators > 1 else FWD_ACCUMULATORS,
        batched=(cfg.batched or FWD_FP8_BATCHED) and key.scaling == "tensor",
        warp_amax=(cfg.warp_amax or FWD_FP8_WARP_AMAX) and key.scaling == "tensor",
        words=cfg.words or (FWD_FP8_WORDS and key.scaling == "tensor"),
        next_row=((cfg.next_row and key.scaling in _NEXT_ROW_SCALING)
                  or (FWD_FP8_NEXT_ROW and key.scaling == "tensor"))
        and next_row_fits(cfg, key.input.itemsize),
    )  # fmt: skip


def _round8_switches(key: KernelKey, cfg: LaunchConfig) -> LaunchConfig:
    """``cfg`` with ``ROW_SUM_LANES`` (several warps per row), ``BWD_STAGED_WORDS``,
    ``BWD_GAMMA32`` (where its fp32 gamma fits the arch's shared memory), ``BWD_FOLDED``
    and ``BWD_DEFERRED`` (the staged backward) and ``FWD_DEFERRED`` (the staged forward of
    one row per CTA; ``i`` from three stages), ``FWD_REREAD`` (the staged forward),
    ``FWD_SHIFTED`` and ``FWD_WARP_STATS`` where they apply; each stays on where ``cfg``, a
    :data:`TUNED` entry, has it (``l``, ``q``, ``f``, ``d``, ``i``, ``y``, ``z``, ``W``),
    and ``i``, ``y``, ``z`` and ``W`` are dropped where they do not apply."""
    if cfg.mode != "regs":
        return cfg
    staged = cfg.stages > 0 and key.spec.backward  # the BWD_* switches: staged backward only
    lanes = (cfg.lanes or ROW_SUM_LANES) and cfg.warps > 1
    words = cfg.words or (BWD_STAGED_WORDS and staged)
    folded = cfg.folded or (BWD_FOLDED and staged)
    # i: a staged kernel of three stages or more (the forward's of one row per CTA)
    deferred = (cfg.deferred or (BWD_DEFERRED if key.spec.backward else FWD_DEFERRED)) and (
        cfg.stages >= 3 and (key.spec.backward or cfg.rows == 1)
    )
    gamma32 = cfg.gamma32 or (
        BWD_GAMMA32 and staged and staged_fits(key, dataclasses.replace(cfg, gamma32=True))
    )
    reread = (cfg.reread or FWD_REREAD) and cfg.stages > 0 and not key.spec.backward
    shifted = (cfg.shifted or FWD_SHIFTED) and shift_applies(key, cfg)
    warp_stats = (cfg.warp_stats or FWD_WARP_STATS) and warp_stats_apply(
        key, dataclasses.replace(cfg, deferred=deferred, shifted=shifted)
    )
    fetch256 = (cfg.fetch256 or STAGED_FETCH256) and cfg.stages > 0
    aligned = (cfg.aligned or STAGED_ALIGNED) and cfg.stages > 0
    new = dict(lanes=lanes, words=words, gamma32=gamma32, folded=folded, deferred=deferred,
               reread=reread, shifted=shifted, warp_stats=warp_stats,
               fetch256=fetch256, aligned=aligned)  # fmt: skip
    if all(getattr(cfg, k) == v for k, v in new.items()):
        return cfg
    return dataclasses.replace(cfg, **new)


def shift_applies(key: KernelKey, cfg: LaunchConfig) -> bool:
    """Whether ``z`` (``FWD_SHIFTED``: one-pass statistics about the row's first element)
    applies: the LayerNorm forward in registers (staged or not) with an FP8 output (tensor
    scaling or MXFP8), without ``u``. The staged kernel copies K with the row; the others
    read it from global memory (one address per row)."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    return (cfg.mode == "regs" and not spec.backward and not spec.rms
            and key.output.is_fp8 and not cfg.one_reduction)  # fmt: skip


def warp_stats_apply(key: KernelKey, cfg: LaunchConfig) -> bool:
    """Whether ``W`` (``FWD_WARP_STATS``: the statistics by two passes per warp and one
    exchange) applies: the LayerNorm forward in registers (staged or not) without a cluster,
    and without ``u`` or ``z`` (which exchange the statistics their own ways); with ``i``
    (staged, one row per CTA) a row's z follows the next row's exchange."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    return (cfg.mode == "regs" and not spec.backward and not spec.rms and cfg.cluster == 1
            and not (cfg.one_reduction or (cfg.shifted and shift_applies(key, cfg))))  # fmt: skip


def next_row_fits(cfg: LaunchConfig, itemsize: int) -> bool:
    """Whether the FP8 forward's next-row copy (``p``) applies to ``cfg`` for x of
    ``itemsize`` bytes: 16-byte accesses, and a slot of 16 bytes per access a thread holds
    within the static shared memory (1 KB kept for the reductions)."""
    return cfg.vec * itemsize == 16 and cfg.threads * cfg.iters * 16 <= STATIC_SMEM_BYTES - 1024


_TAG = re.compile(
    r"w(\d+)r(\d+)v(\d+)j(\d+)c(\d+)(h?)(k?)(n?)(e?)(u?)(o?)(g?)(q?)(p?)(l?)(f?)(d?)(i?)(y?)(z?)(W?)(L?)(A?)"
    r"(?:a(\d+))?"
    r"(?:s(\d+))?"
    r"(?:t(\d+))?(?:m(\d+))?(?:x(\d+))?(?:b(\d+))?"
)


def parse_tag(tag: str) -> LaunchConfig:
    """The :class:`LaunchConfig` a tag names (the inverse of :attr:`LaunchConfig.tag`).

    Raises ``TypeError`` for a tag that is not a string and ``ValueError`` for one that is not
    of the form (the message gives it), or whose warps, rows or accesses are 0, whose access
    width is not 1, 2, 4, 8 or 16 elements, or whose cluster is not 1, 2, 4 or 8 CTAs."""
    if not isinstance(tag, str):
        raise TypeError(f"parse_tag: a tag is a str, not {type(tag).__name__}")
    if tag == "loop":
        raise ValueError("a loop tag does not name the access width")
    m = _TAG.fullmatch(tag)
    if m is None:
        raise ValueError(
            f"not a norm configuration tag: {tag!r} (expected w<warps>r<rows>v<vec>j<iters>"
            "c<cluster>, then the switch letters that apply in the order h k n e u o g q p l f "
            "d i y z W L A, then a<n> s<n> t<n> m<n> x<n> b<n> in that order)"
        )
    w, r, v, j, c = (int(g) for g in m.groups()[:5])
    if min(w, r, j) < 1 or v not in (1, 2, 4, 8, 16) or c not in (1, 2, 4, 8):
        raise ValueError(f"norm configuration tag {tag!r}: warps, rows and accesses (w, r, j) "
                         "are at least 1, the access width (v) 1, 2, 4, 8 or 16 elements, the "
                         "cluster (c) 1, 2, 4 or 8 CTAs")  # fmt: skip
    return LaunchConfig("regs", v, w, r, j, c, hold=bool(m[6]), prefetch=not m[8],
                        packed=bool(m[7]), min_ctas=int(m[27] or 0), early=bool(m[9]),
                        one_reduction=bool(m[10]), accumulators=int(m[24] or 1),
                        shared_sums=int(m[25] or 0), batched=bool(m[11]),
                        warp_amax=bool(m[12]), words=bool(m[13]), next_row=bool(m[14]),
                        lanes=bool(m[15]), gamma32=bool(m[16]), folded=bool(m[17]),
                        deferred=bool(m[18]), reread=bool(m[19]), shifted=bool(m[20]),
                        warp_stats=bool(m[21]), fetch256=bool(m[22]), aligned=bool(m[23]),
                        stages=int(m[26] or 0), groups=int(m[28] or 0),
                        ctas_per_sm=int(m[29] or 0))  # fmt: skip


def _tuned(key: KernelKey) -> LaunchConfig | None:
    """The :data:`TUNED` configuration of a key, if it has one (sm_90, 16-bit x and gamma)."""
    if key.hidden_size is None or arch_number(key.arch) != 90 or key.input.itemsize != 2:
        return None
    if DTYPES[gamma_dtype(key)].itemsize != 2:
        return None
    tag = TUNED.get((key.op, key.hidden_size, key.scaling))
    return None if tag is None else parse_tag(tag)


def _layout(key: KernelKey, hold: bool, prefetch: bool, packed: bool) -> LaunchConfig:
    """:func:`launch_config` for the given code switches."""
    spec = key.spec
    assert isinstance(spec, NormSpec)
    itemsize = key.input.itemsize
    if key.hidden_size is None:
        return LaunchConfig("loop", 16 // itemsize)
    hidden = key.hidden_size
    vec = _vector_width(hidden, itemsize)
    accesses = hidden // vec
    direction = ("bwd2" if spec.accumulators > 1 else "bwd") if spec.backward else "fwd"
    start = max(1, TARGET_BYTES[direction] // (vec * itemsize))
    clusters = (1, 2, 4, 8) if 90 <= arch_number(key.arch) < 110 else (1,)
    if spec.backward and not BWD_CLUSTERS:
        clusters = (1,)
    weights = (1 if spec.rms else 2) if hold else 0
    w_size = DTYPES[gamma_dtype(key)].itemsize
    most = max(start, (BWD_MAX_ELEMENTS if spec.backward else MAX_ELEMENTS) // vec)
    candidates = [(c, range(start, min(2 * start, most) + 1)) for c in clusters]
    candidates += [(c, range(2 * start + 1, most + 1)) for c in clusters]
    for cluster, shares in candidates:
        for iters in shares:
            warps = -(-accesses // (32 * cluster * iters))
            if warps > 32 or (cluster > 1 and warps * 32 * cluster > accesses):
                continue
            iters = -(-accesses // (32 * cluster * warps))  # balance the threads' shares
            regs = _registers(spec.backward, spec.accumulators, iters * vec, itemsize,
                              weights=weights * w_size // itemsize, prefetch=prefetch,
                              packed=packed)  # fmt: skip
            if regs > MAX_REGISTERS or not fits_register_file(warps, regs):
                continue
            rows = 1
            if cluster == 1:
                target = 128  # threads; backward 256 measured slower (w4r2 at H=4096)
                rows = max(1, target // (32 * warps))
                while rows > 1 and (
                    not fits_register_file(rows * warps, regs)
                    or spec.accumulators * iters * vec * 32 * warps * 4 > 32768
                ):
                    rows //= 2
            # The register cap the estimate allows (held weights; backward with BWD_CAP):
            # without it ptxas may take up to 255 registers and lose the occupancy promised.
            ctas = REGISTER_FILE // (-(-rows * warps // 4) * 4 * 32 * regs)
            if hold and ctas < 2:  # weights in registers only where 2+ CTAs still fit
                return _layout(key, False, prefetch, packed)
            ctas = ctas if ((spec.backward and BWD_CAP) or hold) and ctas > 1 else 0
            return LaunchConfig("regs", vec, warps, rows, iters, cluster, hold, prefetch, packed,
                                ctas)  # fmt: skip
    return LaunchConfig("loop", 16 // itemsize)


def loop_threads_per_row(hidden: int) -> int:
    """Threads per row of the streaming kernels: a power of two in [32, 1024], about 32
    elements per thread (so at most 64 up to H = 65536)."""
    want = max(1, -(-hidden // 32))
    return min(LOOP_BLOCK, max(32, 1 << (want - 1).bit_length()))


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

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        cfg = launch_config(key)
        stem = f"{key}_{cfg.tag}"
        if not self.backward:
            return (stem,)
        if cfg.mode == "regs":
            return (stem, f"{stem}_finalize")
        return (stem, f"{stem}_stats", f"{stem}_finalize")

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        cfg = launch_config(key)
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
            next_row=cfg.next_row and key.scaling in _NEXT_ROW_SCALING and not staged,
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
        )
        return ctx

    def kernel_class(self) -> type[Kernel]:
        if not self.backward:
            return RMSNormFwdKernel if self.rms else LayerNormFwdKernel
        if self.add:
            return RMSNormBwdAddKernel
        return RMSNormBwdKernel if self.rms else LayerNormBwdKernel


class LayerNormOutput(NamedTuple):
    """``layernorm_fwd`` results: ``z``, ``mu``, ``rsigma``, and ``scale_inv`` (the tensor-
    scaling buffer that was passed, the MXFP8 scale tensor, or None)."""

    z: Any
    mu: Any
    rsigma: Any
    scale_inv: Any


class RMSNormOutput(NamedTuple):
    """``rmsnorm_fwd`` results: ``z``, ``rsigma``, ``scale_inv`` (see :class:`LayerNormOutput`)."""

    z: Any
    rsigma: Any
    scale_inv: Any


class LayerNormGrads(NamedTuple):
    """``layernorm_bwd`` results: ``dx``, ``dgamma``, ``dbeta``."""

    dx: Any
    dgamma: Any
    dbeta: Any


class RMSNormGrads(NamedTuple):
    """``rmsnorm_bwd``/``rmsnorm_bwd_add`` results: ``dx``, ``dgamma``."""

    dx: Any
    dgamma: Any


@dataclass(frozen=True)
class _Device:
    """What the grids need on one device: SM count and each function's CTAs per SM."""

    sm_count: int
    occupancy: tuple[int, ...]
    clusters: int = 0  # clusters of the main function that fit the device at once (0: no cluster)


def _occupancy(function: Any, threads: int, shmem: int = 0) -> int:
    drv = driver._drv()
    try:
        n = driver.check(
            drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shmem),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )
    except CudaError:
        return 1
    return max(1, int(n))


def _active_clusters(function: Any, threads: int, shmem: int, cluster: int) -> int:
    """Clusters of ``cluster`` CTAs of a function (with compile-time cluster dimensions) that
    can be resident at once: fewer than SMs x occupancy / cluster where a GPC's SMs do not
    divide into whole clusters (a persistent grid of more would run a second wave). 0 where
    the driver does not say (the grid then assumes SMs x occupancy / cluster)."""
    drv = driver._drv()
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = shmem
    config.numAttrs = 0
    try:
        n = driver.check(drv.cuOccupancyMaxActiveClusters(function, config),
                         "cuOccupancyMaxActiveClusters")  # fmt: skip
    except CudaError:
        return 0
    return max(0, int(n))


def _persistent(dev: _Device, cluster: int, per_sm: int, groups: int) -> int:
    """Clusters (CTAs where ``cluster`` is 1) of a persistent grid over ``groups`` row groups
    with at most ``per_sm`` CTAs per SM: never more clusters than are resident at once
    (``dev.clusters``, where the driver says) nor than row groups, at least one; with
    :data:`PERSISTENT_BALANCED`, the fewest that keep the most row groups one cluster
    takes."""
    n = dev.sm_count * per_sm // cluster
    if dev.clusters:  # whole clusters per GPC: at most what is resident at once
        n = min(n, dev.clusters)
    n = max(1, min(n, groups))
    if PERSISTENT_BALANCED:
        n = -(-groups // -(-groups // n))
    return n


def _aligned(arrays: list[tuple[Array | None, int]]) -> bool:
    """Whether every array's address is a multiple of its access size (at most 16 bytes)."""
    return all(a is None or a.ptr % min(16, size) == 0 for a, size in arrays)


class _NormKernel(Kernel):
    """What the norm kernels share: configuration, per-device grids, argument checks. Their
    ``config`` (``Kernel.config``) is the :class:`LaunchConfig` their image was compiled for,
    ``launch_config(key)`` when the kernel was made; ``config.tag`` ends its symbols."""

    _config: LaunchConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        spec = key.spec
        assert isinstance(spec, NormSpec)
        self.spec = spec
        self._config = launch_config(key)
        self._in = key.input
        self._out = key.output
        self._w = DTYPES[gamma_dtype(key)]
        self._devices: dict[int, _Device] = {}

    def _device(self, loaded: Loaded) -> _Device:
        got = self._devices.get(loaded.device.ordinal)
        if got is None:
            driver.make_current(loaded.device)
            shared = self._shared or (0,) * len(loaded.functions)
            occ = tuple(_occupancy(f, t, b) for f, t, b in zip(
                loaded.functions, self._function_threads(), shared, strict=True))  # fmt: skip
            cfg = self.config
            clusters = 0
            if cfg.mode == "regs" and cfg.cluster > 1:
                clusters = _active_clusters(loaded.functions[0], cfg.threads, shared[0],
                                            cfg.cluster)  # fmt: skip
            got = _Device(loaded.device.sm_count, occ, clusters)
            self._devices[loaded.device.ordinal] = got
        return got

    def _function_threads(self) -> tuple[int, ...]:
        """Threads per CTA of each function in ``loaded.functions``."""
        raise NotImplementedError

    def residency(self, device: int = 0) -> dict[str, Any]:
        """What ``device`` holds of this kernel (loads it there): ``sm_count``;
        ``ctas_per_sm``, the driver's occupancy of each function (resident CTAs per SM with
        this kernel's threads and dynamic shared memory; the backward's second function is
        its finalize kernel); ``clusters``, the main function's clusters of
        ``config.cluster`` CTAs resident at once (``cuOccupancyMaxActiveClusters``), 0 for
        a kernel without a cluster or where the driver does not say. A persistent grid
        takes at most that many clusters (fewer where the layout caps its CTAs per SM,
        ``config.ctas_per_sm``), and how clusters fit a GPU's GPCs can differ between GPUs
        of one model, so bench/norm_bandwidth.py records it beside each timing.

        Raises :class:`~nvrtc_engine.NoDeviceError` without a driver or device,
        ``ValueError`` for an ordinal that does not exist, and
        :class:`~nvrtc_engine.ArgumentError` where the device's arch cannot run the image.
        """
        dev = self._device(self.loaded(device))
        return {"sm_count": dev.sm_count, "ctas_per_sm": list(dev.occupancy),
                "clusters": dev.clusters}  # fmt: skip

    def _waits_for_grid(self) -> bool:
        """Every norm kernel (forward, backward and finalize) starts with
        ``nve::grid_dependency_wait()``: on sm_90+ they are launched as programmatic
        dependent launches (``NVRTC_ENGINE_DEPENDENT_LAUNCH``; bench/pdl_probe.py measured
        1.4-1.8 us saved per kernel boundary on an H200)."""
        return True

    def _shared_bytes(self) -> tuple[int, ...]:
        """A staged layout's dynamic shared memory (:func:`staged_smem_bytes`) for the main
        kernel, none for the others (the backward's finalize); () for other layouts."""
        size = staged_smem_bytes(self.config, self._in.itemsize, self._w.itemsize,
                                 **staged_counts(self.spec, self.config))  # fmt: skip
        return (size,) + (0,) * (len(self._function_threads()) - 1) if size else ()

    def _rows(self, xa: Array, name: str) -> tuple[int, int]:
        """``(rows, hidden)`` of a ``(..., hidden)`` array, checked against the key."""
        if not xa.shape:
            raise ArgumentError(name, "must have at least one dimension (..., hidden_size)")
        hidden = xa.shape[-1]
        key = self.key
        if key.hidden_size is not None and hidden != key.hidden_size:
            raise ArgumentError(
                name, f"last dimension is {hidden}, but this kernel is specialized for "
                f"hidden_size={key.hidden_size} (use hidden_size=None for any size)",
            )  # fmt: skip
        if hidden < 1:
            raise ArgumentError(name, "hidden size (last dimension) must be at least 1")
        return xa.numel // hidden, hidden

    def _like(
        self, obj: Any, name: str, like: Array, shape: tuple[int, ...], dtype: DType
    ) -> Array:
        """An input of exactly ``shape``/``dtype`` on ``like``'s device."""
        a = self._input(obj, name, dtype)
        if a.shape != shape:
            raise ArgumentError(name, f"has shape {a.shape}; expected {shape}")
        if a.device != like.device:
            raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")
        return a

    def _vec(self, hidden: int) -> int:
        """Elements per access: the compiled width, or the loop kernel's (H a multiple)."""
        v = self.config.vec
        return v if self.config.mode == "regs" or hidden % v == 0 else 1


def _valid_eps(value: Any) -> float | None:
    """``eps`` as a float, or None where :func:`_eps` raises."""
    if type(value) is float and 0.0 <= value < math.inf:
        return value
    try:
        return _eps(value)
    except (ArgumentError, ArgumentTypeError):
        return None


def _eps(value: Any, rms: bool = False) -> float:
    """``eps`` as a float: a real number >= 0 (not a bool, a string, a CUDA array or an
    array with dimensions). For an RMSNorm kernel (``rms``) an array here is most often
    beta, which it takes none of, and the message says so."""
    if type(value) is not float:
        if isinstance(value, (str, bytes)):
            raise ArgumentTypeError("eps", f"must be a float >= 0, got {value!r}")
        if hasattr(value, "__cuda_array_interface__") or (
            hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", 0)
        ):  # fmt: skip
            hint = " (RMSNorm kernels take no beta: kernel(x, gamma, eps, ...))" if rms else ""
            raise ArgumentTypeError(
                "eps", f"must be a float >= 0, got an array of shape {tuple(value.shape)}{hint}"
            )
        if isinstance(value, bool):
            raise ArgumentError("eps", f"must be a float >= 0, got {value!r}")
    try:
        eps = float(value)
    except (TypeError, ValueError):
        raise ArgumentError("eps", f"must be a float >= 0, got {value!r}") from None
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ArgumentError("eps", f"must be a finite float >= 0, got {value!r}")
    return eps


class _NormFwdKernel(_NormKernel):
    _fast = fast_path(9)  # x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv
    _params = driver.ParamPack("PPPPPPPPPPqifiiiq")

    def _function_threads(self) -> tuple[int, ...]:
        return (self.config.threads,)

    def launch_grid(self, rows: int, hidden_size: int | None = None, device: int = 0) -> int:
        """CTAs that a call over ``rows`` rows of ``hidden_size`` elements launches on
        ``device``: the arithmetic the call itself uses, from the device's SM count, the
        kernel's occupancy there and its resident clusters (so it loads the kernel there).

        - The general kernel (``config.mode == "loop"``): one CTA per
          ``LOOP_BLOCK // loop_threads_per_row(H)`` rows.
        - One-pass register layouts: one CTA (cluster) per row group of ``config.rows`` rows;
          those that hold their weights (``h``) or copy the next row ahead (``p``) give a CTA
          up to ``config.groups`` row groups (:data:`FWD_GROUPS_PER_CTA` where 0), and never
          launch fewer CTAs than the persistent grid.
        - The staged forward: a persistent grid, at most the clusters resident at once (fewer
          under the layout's ``b`` cap), at most one per row group.

        Every grid is also capped at ``MAX_GRID`` CTAs, and it is a multiple of
        ``config.cluster``. ``hidden_size`` defaults to the key's and is required for the
        general kernel. Raises :class:`~nvrtc_engine.ArgumentTypeError` for a ``rows`` or
        ``hidden_size`` that is not an int, :class:`~nvrtc_engine.ArgumentError` for one
        below 1, a missing or a mismatched hidden size, and what :meth:`residency` raises
        (:class:`~nvrtc_engine.NoDeviceError` without a GPU)."""
        for name, value in (("rows", rows), ("hidden_size", hidden_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ArgumentTypeError(name, f"must be an int, got {value!r}")
        if rows < 1:
            raise ArgumentError("rows", f"must be at least 1, got {rows}")
        fixed = self.key.hidden_size
        hidden = fixed if hidden_size is None else hidden_size
        if hidden is None:
            raise ArgumentError("hidden_size", "the general kernel needs one: pass hidden_size=")
        if fixed is not None and hidden != fixed:
            raise ArgumentError("hidden_size", f"this kernel takes {fixed}, got {hidden}")
        if hidden < 1:
            raise ArgumentError("hidden_size", f"must be at least 1, got {hidden}")
        return self._grid(self._device(self.loaded(device)), rows, hidden)

    def _grid(self, dev: _Device, rows: int, hidden: int) -> int:
        """:meth:`launch_grid` on ``dev`` for ``rows`` rows of ``hidden`` elements."""
        cfg = self.config
        if cfg.mode != "regs":
            groups = -(-rows // (LOOP_BLOCK // loop_threads_per_row(hidden)))
            return min(groups, MAX_GRID if FWD_ONE_PASS else dev.sm_count * dev.occupancy[0])
        groups = -(-rows // cfg.rows)
        # the staged forward's grid is persistent, at most cfg.ctas_per_sm CTAs per SM
        per_sm = min(dev.occupancy[0], cfg.ctas_per_sm or dev.occupancy[0])
        persistent = _persistent(dev, cfg.cluster, per_sm, groups)
        clusters = groups if FWD_ONE_PASS and not cfg.stages else persistent
        # several row groups per CTA: weights loaded once (hold), or the next group's x
        # copied while the current one is worked on (next_row)
        if FWD_ONE_PASS and not cfg.stages and (cfg.hold or cfg.next_row):
            per_cta = cfg.groups or FWD_GROUPS_PER_CTA
            clusters = max(min(groups, persistent), -(-groups // per_cta))
        return min(groups, clusters, MAX_GRID // cfg.cluster) * cfg.cluster

    def _forward(
        self, x: Any, gamma: Any, beta: Any, eps: Any, out: Any, mu: Any, rsigma: Any,
        scale: Any, amax: Any, scale_inv: Any, stream: Any,
    ) -> tuple[Any, Any, Any, Any]:  # fmt: skip
        given = (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv)
        eps_value = _valid_eps(eps)
        plan_key = None
        if eps_value is not None:  # else _eps raises below, after the array checks
            done, plan_key = self._fast(given, (eps_value,), stream)
            if done is not None:
                return done[3], done[4], done[5], done[8]
        key = self.key
        xa = self._input(x, "x", self._in)
        rows, hidden = self._rows(xa, "x")
        ga = self._like(gamma, "gamma", xa, (hidden,), self._w)
        ba = None if self.spec.rms else self._like(beta, "beta", xa, (hidden,), self._w)
        eps_value = _eps(eps, self.spec.rms)
        out, oa = self._output(out, "out", xa, xa.shape, self._out)
        mua = None
        if not self.spec.rms:
            mu, mua = self._output(mu, "mu", xa, xa.shape[:-1], _FP32)
        rsigma, rsa = self._output(rsigma, "rsigma", xa, xa.shape[:-1], _FP32)
        scale_ptr = amax_ptr = scale_inv_ptr = mx_ptr = 0
        mx_stride, mx_rows = 0, 0
        if key.scaling == "mxfp8":  # scale_inv receives the block scales
            self._tensor_scaling(scale, amax, None, xa)
            shape = mxfp8_scale_shape(rows, hidden, "rowwise")
            if scale_inv is None:
                scale_inv = allocate_like(xa, shape, _BYTES, "scale_inv")
                if xa.kind == "torch":
                    scale_inv = scale_inv.view(sys.modules["torch"].uint8)
            mx_ptr = self._like(scale_inv, "scale_inv", xa, shape, _BYTES).ptr
            mx_rows, mx_stride = shape
        else:
            scale_ptr, amax_ptr, scale_inv_ptr = self._tensor_scaling(scale, amax, scale_inv, xa)
        if rows == 0:
            return out, mu, rsigma, scale_inv
        dev = self._device(self.loaded(xa.device))
        cfg = self.config
        vec = self._vec(hidden)
        aligned = vec > 1 and _aligned([
            (xa, vec * self._in.itemsize), (oa, vec * self._out.itemsize),
            (ga, vec * self._w.itemsize), (ba, vec * self._w.itemsize),
        ])  # fmt: skip
        tpr = 0 if cfg.mode == "regs" else loop_threads_per_row(hidden)
        grid = self._grid(dev, rows, hidden)
        values = (
            xa.ptr, ga.ptr, ba.ptr if ba is not None else 0, oa.ptr,
            mua.ptr if mua is not None else 0, rsa.ptr, scale_ptr, amax_ptr, scale_inv_ptr,
            mx_ptr, rows, hidden, eps_value, int(aligned), tpr, mx_stride, mx_rows,
        )  # fmt: skip
        mx = key.scaling == "mxfp8"
        tensors = (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv)
        ptrs = (*values[:8], mx_ptr if mx else scale_inv_ptr)
        refs = _FWD_MXFP8_REFS if mx else _FWD_TENSOR_REFS
        self._submit(plan_key, given, tensors, ptrs, (eps_value,), stream, xa,
                     [(0, grid, cfg.threads, self._params, values, refs)])  # fmt: skip
        return out, mu, rsigma, scale_inv


class LayerNormFwdKernel(_NormFwdKernel):
    """LayerNorm forward: ``z = (x - mu) * rsigma * gamma + beta`` (``gamma + 1`` with
    ``zero_centered_gamma``), per row of ``x``.

    Call: ``kernel(x, gamma, beta, eps=1e-5, out=None, mu=None, rsigma=None, *, scale=None,
    amax=None, scale_inv=None, stream=None) -> LayerNormOutput(z, mu, rsigma, scale_inv)``.

    Args:
        x: CUDA array ``(..., hidden_size)`` of ``in_dtype``, C-contiguous.
        gamma, beta: ``(hidden_size,)``, x's dtype (fp32 with the ``fp32_gamma`` flag).
        eps: added to the variance, a float >= 0.
        out: z, x's shape, ``out_dtype`` (FP8 may be uint8 storage); allocated if omitted.
        mu, rsigma: fp32 ``x.shape[:-1]``; allocated if omitted.
        scale, amax, scale_inv: tensor scaling: fp32 device arrays; element 0 of ``scale`` is
            the scale, element 0 of ``amax`` is max-reduced (atomically) with ``max|z|``
            before scaling (zero it first), ``1/scale`` goes to ``scale_inv`` (optional).
            MXFP8: ``scale_inv`` is the uint8 E8M0 scale tensor of shape
            ``mxfp8_scale_shape(N, hidden_size, "rowwise")`` (allocated if omitted; every byte,
            padding included, is written).
        stream: where to launch (see :mod:`nvrtc_engine.interop`).

    Math: mean and biased variance in fp32, two passes over the row; ``rsigma =
    1/sqrt(var + eps)``, as in TransformerEngine. Raises
    :class:`~nvrtc_engine.ArgumentError`/:class:`~nvrtc_engine.ArgumentTypeError` before
    launching when an argument is wrong.
    """

    def __call__(
        self, x: Any, gamma: Any, beta: Any, eps: Any = 1e-5, out: Any = None, mu: Any = None,
        rsigma: Any = None, *, scale: Any = None, amax: Any = None, scale_inv: Any = None,
        stream: Any = None,
    ) -> LayerNormOutput:  # fmt: skip
        z, mu, rsigma, scale_inv = self._forward(x, gamma, beta, eps, out, mu, rsigma, scale,
                                                 amax, scale_inv, stream)  # fmt: skip
        return LayerNormOutput(z, mu, rsigma, scale_inv)


class RMSNormFwdKernel(_NormFwdKernel):
    """RMSNorm forward: ``z = x * rsigma * gamma`` (``gamma + 1`` with
    ``zero_centered_gamma``), ``rsigma = 1/sqrt(mean(x^2) + eps)`` per row.

    Call: ``kernel(x, gamma, eps=1e-5, out=None, rsigma=None, *, scale=None, amax=None,
    scale_inv=None, stream=None) -> RMSNormOutput(z, rsigma, scale_inv)``; arguments as in
    :class:`LayerNormFwdKernel`. Math as in TransformerEngine (fp32 compute).
    """

    def __call__(
        self, x: Any, gamma: Any, eps: Any = 1e-5, out: Any = None, rsigma: Any = None, *,
        scale: Any = None, amax: Any = None, scale_inv: Any = None, stream: Any = None,
    ) -> RMSNormOutput:  # fmt: skip
        z, _, rsigma, scale_inv = self._forward(x, gamma, None, eps, out, None, rsigma, scale,
                                                amax, scale_inv, stream)  # fmt: skip
        return RMSNormOutput(z, rsigma, scale_inv)


@dataclass(frozen=True)
class _BwdPlan:
    """Grids and workspace of one backward call (a function of rows, hidden and device).

    ``parts``: partial rows of column sums (CTAs or clusters in ``regs`` mode, row chunks of
    ``chunk_rows`` rows in ``loop`` mode); ``stats_grid``/``tpr``: the row-sum kernel
    (``loop``); the workspace holds ``part_elements`` fp32 partial sums, then from
    ``stats_offset`` the row sums (``loop``), ``workspace`` elements in all.
    """

    stats_grid: int
    tpr: int
    parts: int
    chunk_rows: int
    part_elements: int
    stats_offset: int
    workspace: int


class _NormBwdKernel(_NormKernel):
    _fast = fast_path(10)  # dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace
    _params = driver.ParamPack("PPPPPPPPPPPqiiiiqi")

    def _function_threads(self) -> tuple[int, ...]:
        if self.config.mode == "regs":
            return (self.config.threads, FINALIZE_BLOCK)
        return (TILE_BLOCK, LOOP_BLOCK, FINALIZE_BLOCK)

    def _plan(self, dev: _Device, rows: int, hidden: int) -> _BwdPlan:
        cfg = self.config
        nacc = self.spec.accumulators
        stats_grid = tpr = chunk_rows = parts = stats = 0
        if rows > 0 and cfg.mode == "regs":
            groups = -(-rows // cfg.rows)
            per_sm = min(dev.occupancy[0], cfg.ctas_per_sm or BWD_CTAS_PER_SM)
            parts = _persistent(dev, cfg.cluster, per_sm, groups)
        elif rows > 0:
            tpr = loop_threads_per_row(hidden)
            stats_grid = min(-(-rows // (LOOP_BLOCK // tpr)), dev.sm_count * dev.occupancy[1])
            # chunks of rows sized for the widest tiles, so the workspace does not depend
            # on the pointers' alignment; ntiles is set per launch
            widest = -(-hidden // (32 * cfg.vec))
            want = max(1, -(-dev.sm_count * TILE_CTAS_PER_SM // widest))
            chunk_rows = -(-rows // min(rows, want))
            parts = -(-rows // chunk_rows)
            stats = 2 * rows
        part_elements = nacc * parts * hidden
        offset = -(-part_elements // 4) * 4  # 16-byte aligned
        return _BwdPlan(stats_grid, tpr, parts, chunk_rows, part_elements, offset,
                        offset + stats)  # fmt: skip

    def workspace_elements(self, rows: int, hidden: int | None = None, device: int = 0) -> int:
        """fp32 elements of workspace a call with ``rows`` rows needs on ``device``.

        The grid (and so the number of partial dgamma/dbeta rows) depends on the device's SM
        count and this kernel's occupancy there; loads the kernel on ``device``.
        """
        hidden = self.key.hidden_size if hidden is None else hidden
        if hidden is None:
            raise ArgumentError("hidden", "is required for a general (hidden_size=None) kernel")
        dev = self._device(self.loaded(device))
        return self._plan(dev, rows, hidden).workspace

    def _backward(
        self, dz: Any, x: Any, mu: Any, rsigma: Any, gamma: Any, add: Any, dx: Any, dgamma: Any,
        dbeta: Any, workspace: Any, stream: Any,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        given = (dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace)
        if dx is not None and type(dx) in TORCH_TYPES and {type(x), type(dz)} <= TORCH_TYPES:
            start = dx.data_ptr()  # (checked here: a call that a plan takes skips the rest)
            for other in (x, dz):
                if _overlap(start, dx.nbytes, other.data_ptr(), other.nbytes):
                    _alias_error(other, x)
        done, key = self._fast(given, (), stream)
        if done is not None:
            return done[6], done[7], done[8]
        spec = self.spec
        xa = self._input(x, "x", self._in)
        rows, hidden = self._rows(xa, "x")
        dza = self._like(dz, "dz", xa, xa.shape, self._in)
        mua = None if spec.rms else self._like(mu, "mu", xa, xa.shape[:-1], _FP32)
        rsa = self._like(rsigma, "rsigma", xa, xa.shape[:-1], _FP32)
        ga = self._like(gamma, "gamma", xa, (hidden,), self._w)
        adda = self._like(add, "add", xa, xa.shape, self._in) if spec.add else None
        dx, dxa = self._output(dx, "dx", xa, xa.shape, self._in)
        nbytes = xa.numel * self._in.itemsize  # (dx, x and dz: one shape and dtype)
        for other in (xa, dza):
            if _overlap(dxa.ptr, nbytes, other.ptr, nbytes):
                _alias_error(other.obj, x)
        dgamma, dga = self._output(dgamma, "dgamma", xa, (hidden,), self._w)
        dba = None
        if not spec.rms:
            dbeta, dba = self._output(dbeta, "dbeta", xa, (hidden,), self._w)
        if workspace is None and xa.kind not in ("torch", "cupy"):
            raise ArgumentTypeError(
                "workspace", "is required: the input is neither a torch tensor nor a CuPy "
                "array, so the kernel cannot allocate it",
            )  # fmt: skip
        wa = None if workspace is None else self._input(workspace, "workspace", _FP32)
        dev = self._device(self.loaded(xa.device))
        plan = self._plan(dev, rows, hidden)
        if wa is None:
            workspace = allocate_like(xa, (max(1, plan.workspace),), _FP32, "workspace")
            wa = self._input(workspace, "workspace", _FP32)
        if wa.numel < plan.workspace:
            raise ArgumentError("workspace", f"has {wa.numel} fp32 elements; this call needs "
                                f"{plan.workspace} (see workspace_elements)")  # fmt: skip
        if wa.ptr % 16 or wa.device != xa.device:
            raise ArgumentError("workspace", "must be 16-byte aligned and on the input's device")
        cfg = self.config
        vec = self._vec(hidden)
        w_size, in_size = self._w.itemsize, self._in.itemsize
        aligned = vec > 1 and _aligned([
            (xa, vec * in_size), (dza, vec * in_size), (dxa, vec * in_size),
            (adda, vec * in_size), (ga, vec * w_size),
        ])  # fmt: skip
        ntiles = -(-(hidden // (vec if aligned else 1)) // 32)  # loop mode: 32 accesses each
        values = (
            dza.ptr, xa.ptr, mua.ptr if mua is not None else 0, rsa.ptr, ga.ptr,
            adda.ptr if adda is not None else 0, dxa.ptr, wa.ptr, wa.ptr + 4 * plan.stats_offset,
            dga.ptr, dba.ptr if dba is not None else 0, rows, hidden, int(aligned), plan.tpr,
            plan.parts, plan.chunk_rows, ntiles,
        )  # fmt: skip
        p = (self._params, values, (*_BWD_REFS, (8, Ptr(9, 4 * plan.stats_offset))))
        launches = []
        if rows > 0 and cfg.mode == "regs":
            launches.append((0, plan.parts * cfg.cluster, cfg.threads, *p))
        elif rows > 0:
            launches.append((1, plan.stats_grid, LOOP_BLOCK, *p))
            launches.append((0, plan.parts * ntiles, TILE_BLOCK, *p))
        finalize_grid = spec.accumulators * -(-hidden // 32)
        launches.append((-1, finalize_grid, FINALIZE_BLOCK, *p))
        tensors = (dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace)
        ptrs = (*values[:7], dga.ptr, values[10], wa.ptr)
        self._submit(key, given, tensors, ptrs, (), stream, xa, launches)
        return dx, dgamma, dbeta


def _overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether the byte ranges ``[a, a + a_bytes)`` and ``[b, b + b_bytes)`` share a byte."""
    return a < b + b_bytes and b < a + a_bytes and a_bytes > 0 and b_bytes > 0


def _alias_error(other: Any, x: Any) -> NoReturn:
    """Raise the error of a dx whose memory overlaps x or dz (``other``)."""
    name = "x" if other is x else "dz"
    raise ArgumentError(
        "dx",
        f"overlaps {name}'s memory; the backward reads {name} while it "
        "writes dx, so pass a separate dx (or none, to have it allocated)",
    )


class LayerNormBwdKernel(_NormBwdKernel):
    """LayerNorm backward.

    Call: ``kernel(dz, x, mu, rsigma, gamma, dx=None, dgamma=None, dbeta=None, *,
    workspace=None, stream=None) -> LayerNormGrads(dx, dgamma, dbeta)``.

    Args:
        dz, x: ``(..., hidden_size)`` of ``in_dtype``; mu, rsigma: fp32 ``x.shape[:-1]`` (from
            the forward pass); gamma: ``(hidden_size,)``, x's dtype or fp32 (``fp32_gamma``).
        dx: x's shape and dtype, its memory apart from x's and dz's; dgamma, dbeta: gamma's
            shape and dtype; allocated if omitted.

    Math (TransformerEngine): ``xhat = (x - mu) * rsigma``, ``dy = dz * gamma`` (``gamma + 1``
    with ``zero_centered_gamma``), ``dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))``
    (means over the row), ``dgamma = sum_rows(dz * xhat)``, ``dbeta = sum_rows(dz)``; fp32.

    Column sums (dgamma, dbeta) are fp32 partial sums per CTA (or cluster), written to a
    workspace and added up by a second kernel in a fixed order: deterministic for a fixed
    shape and device. ``workspace``: fp32 CUDA array of at least
    ``kernel.workspace_elements(rows, hidden, device)`` elements, 16-byte aligned; allocated
    with the input's library (torch or CuPy) when omitted, required otherwise.

    Raises :class:`~nvrtc_engine.ArgumentError`/:class:`~nvrtc_engine.ArgumentTypeError`
    before launching when an argument is wrong.
    """

    def __call__(
        self, dz: Any, x: Any, mu: Any, rsigma: Any, gamma: Any, dx: Any = None,
        dgamma: Any = None, dbeta: Any = None, *, workspace: Any = None, stream: Any = None,
    ) -> LayerNormGrads:  # fmt: skip
        return LayerNormGrads(*self._backward(dz, x, mu, rsigma, gamma, None, dx, dgamma, dbeta,
                                              workspace, stream))  # fmt: skip


class RMSNormBwdKernel(_NormBwdKernel):
    """RMSNorm backward.

    Call: ``kernel(dz, x, rsigma, gamma, dx=None, dgamma=None, *, workspace=None,
    stream=None) -> RMSNormGrads(dx, dgamma)``; arguments as in :class:`LayerNormBwdKernel`.

    Math (TransformerEngine): ``xhat = x * rsigma``, ``dy = dz * gamma`` (``gamma + 1`` with
    ``zero_centered_gamma``), ``dx = rsigma * (dy - xhat * mean(dy * xhat))``,
    ``dgamma = sum_rows(dz * xhat)``; fp32. Workspace, determinism and errors as in
    :class:`LayerNormBwdKernel`.
    """

    def __call__(
        self, dz: Any, x: Any, rsigma: Any, gamma: Any, dx: Any = None, dgamma: Any = None, *,
        workspace: Any = None, stream: Any = None,
    ) -> RMSNormGrads:  # fmt: skip
        dx, dgamma, _ = self._backward(dz, x, None, rsigma, gamma, None, dx, dgamma, None,
                                       workspace, stream)  # fmt: skip
        return RMSNormGrads(dx, dgamma)


class RMSNormBwdAddKernel(_NormBwdKernel):
    """RMSNorm backward with a residual gradient: ``dx = rmsnorm_bwd(...) + add``.

    Call: ``kernel(dz, x, rsigma, gamma, add, dx=None, dgamma=None, *, workspace=None,
    stream=None) -> RMSNormGrads(dx, dgamma)``. ``add``: x's shape and dtype, the gradient
    reaching x through the residual branch (TransformerEngine's ``rmsnorm_bwd_add``); ``dx``
    may be ``add`` itself (in place). Other arguments and math as in :class:`RMSNormBwdKernel`.
    """

    def __call__(
        self, dz: Any, x: Any, rsigma: Any, gamma: Any, add: Any, dx: Any = None,
        dgamma: Any = None, *, workspace: Any = None, stream: Any = None,
    ) -> RMSNormGrads:  # fmt: skip
        dx, dgamma, _ = self._backward(dz, x, None, rsigma, gamma, add, dx, dgamma, None,
                                       workspace, stream)  # fmt: skip
        return RMSNormGrads(dx, dgamma)


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
