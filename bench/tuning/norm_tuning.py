"""Launch-configuration sweep behind the specialized norm kernels' defaults (``launch_config``,
``TARGET_BYTES``, ``FWD_HOLD_WEIGHTS``, ``FWD_GROUPS_PER_CTA``, ``BWD_PREFETCH``,
``BWD_PACKED``, ``BWD_CLUSTERS``, ``BWD_CTAS_PER_SM`` and the round-3 switches in
nvrtc_engine/ops/norm_switches.py).

    python bench/tuning/norm_tuning.py [--tokens 16384] [--hidden 4096,8192,14336,65536]
                                [--rounds 2]
                                [--round3-only]
                                [--candidates fp8|fp8b|bwd|big|bf16p|bwd2|onered|near|big2|
                                              lanes|fold|bwdc|sfwd|snear|srows|bal|
                                              sregs|defer|fdefer|caps|reread|hreread|wide|
                                              shift|pdl|fetch256]
                                [--name norm_tuning] [--zero-amax] [--repeat 20] [--shuffle]

For LayerNorm and RMSNorm, bf16 input, at each hidden size (``--big-tokens`` rows, default
2048, from H = 65536 on): the forward to bf16 and to fp8_e4m3 (tensor scaling) for the
default layout and its neighbours (half and twice the accesses per thread), each with the
weights reloaded per row and held in registers (``h``: 2, 4 or 8 row groups per CTA, a
host-side choice); the backward for the same layouts, each with the code switches
(prefetch, packed, the register cap) and 2 or 8 CTAs per SM; at H = 65536 also every
cluster layout of the backward and the general kernel (``loop``) in both directions. The
round-3 code switches (``FWD_EARLY_WEIGHTS``, ``FWD_ONE_REDUCTION``, ``FWD_ACCUMULATORS``,
``BWD_SHARED_SUMS``: :func:`round3_candidates`) are tried on each default layout;
``--round3-only`` times just those and the defaults. ``--candidates fp8`` times only the
round-4 FP8 candidates (:func:`fp8_candidates`: ``FWD_FP8_BATCHED``, ``FWD_FP8_WARP_AMAX``)
against the default FP8 and bf16 kernels (forward only; hidden sizes 4096, 8192, 14336
unless ``--hidden`` says otherwise); ``--candidates fp8b`` does the same for the round-5
FP8 candidates (:func:`fp8b_candidates`: ``FWD_FP8_WORDS``, ``FWD_FP8_NEXT_ROW``, on TUNED's
FP8 layouts and with 4 or 16 row groups per CTA); ``--candidates bwd`` times only the
backward: the default, the round-5 staged layouts (:func:`staged_candidates`,
``BWD_STAGED``: x and dz copied into shared memory by cp.async, 2-4 rows deep) and, from H =
14336, the general kernel (about 3 minutes on an H200, most of it NVRTC compiles);
``--candidates big`` times only the forward at H = 65536 over thread block clusters of 2, 4
and 8 CTAs (:func:`big_candidates`: held weights, the next row's x copied ahead);
``--candidates bf16p`` times only the bf16 forward at H = 4096-14336 with the next row's x
copied ahead (:func:`bf16p_candidates`); ``--candidates bwd2`` times only the backward at
H = 4096-14336 over more staged layouts and CTAs per SM (:func:`bwd2_candidates`);
``--candidates onered`` times LayerNorm's one reduction (FP8 at H = 4096-14336, both outputs
at 65536: :func:`onered_candidates`); ``--candidates near`` the neighbourhood of each
default layout (:func:`near_candidates`: each switch flipped, other row-group counts, half
and twice the accesses; the staged backward's depth and grid), for re-checking near misses
with ``--shuffle`` and many short rounds (e.g. ``--rounds 8 --repeat 5``): each round then
times the cases in a shuffled order and rows add ``vs_default``, the median over rounds of
the default's time over the case's in the same round (the shared GPU drifts by more than
the differences sought; a same-round ratio cancels the drift); ``--candidates big2`` the
H = 65536 layouts after the cluster mailboxes (:func:`big2_candidates`: clusters of 4 and 8
with next-row copies, the staged backward over clusters of 8); round 8: ``--candidates
lanes`` each default with ``l`` (row sums across lanes) and ``q`` (word reads) flipped
(:func:`lanes_candidates`), ``--candidates fold`` the staged backward with ``f`` (fp32 gamma
in shared memory) and ``d`` (folded dx) (:func:`fold_candidates`), ``--candidates bwdc`` the
staged backward and the FP8 forward at H = 4096-14336 over clusters of 2 and 4 CTAs
(:func:`bwdc_candidates`, :func:`fwdc_candidates`); round 9: ``--candidates sfwd`` the
staged forward (:func:`sfwd_candidates`: x through shared memory several rows deep, the
weights in shared memory as stored or as fp32), ``--candidates snear`` the neighbourhood of
each staged forward default (:func:`snear_candidates`); round 10: ``--candidates srows`` the
staged forward with 2 and 4 rows per CTA sharing the weights (:func:`srows_candidates`),
``--candidates bal`` each persistent default with a balanced grid (:func:`bal_candidates`),
``--candidates sregs`` the staged forward with its weights in registers
(:func:`sregs_candidates`); round 11: ``--candidates defer`` the staged backward with each
row's dx written a row later (:func:`defer_candidates`), ``--candidates fdefer`` the
staged forward with each row's z written a row later (:func:`fdefer_candidates`); round
12: ``--candidates caps`` a register cap (``m``) on each forward default
(:func:`caps_candidates`); round 13: ``--candidates reread`` the staged forward with x read
from its stage in each pass (:func:`reread_candidates`); round 14: ``--candidates hreread``
``h`` and ``y`` together where the staged default keeps its weights in shared memory
(:func:`hreread_candidates`); round 15: ``--candidates wide`` the clustered staged forward
over 8 or 16 warps instead of 4 (:func:`wide_candidates`); round 16: ``--candidates
shift`` the staged LayerNorm FP8 forward with one-pass statistics (:func:`shift_candidates`);
round 17: ``--candidates pdl`` the staged bf16 forward layouts again, now that the norms are
dependent launches (:func:`pdl_candidates`); round 22: ``--candidates fetch256`` each staged
backward default with ``L`` (:func:`fetch256_candidates`); ``--versus-compile`` also times
torch.compile of the same op (bench/norm_bandwidth.torch_fns) in every round, so each
candidate's same-round ratio to it is in the JSON (``vs_compile``);
``--name`` names the JSON (e.g. ``norm_tuning-fp8``, so the full sweep's file stays);
``--zero-amax`` zeroes the amax word before every FP8 call (timed with it), as a training step does
once per forward, instead of leaving the first call's maximum there (which lets the guards skip
every later atomic). Each sweep runs ``--rounds`` times; rows give every round and the median; a
``*`` marks the
current default (``norm_switches.TUNED`` entries included). GB/s counts x, z (forward) and x, dz,
dx (backward) once. Writes bench/results/norm_tuning.json (or ``--name``). About 95 s on an
H200 (2 rounds, most of it NVRTC compiles).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
# Variants differ by monkeypatched configurations that neither the key nor the key index's
# environment fingerprint sees: compile each in memory, never reuse a disk entry.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"

import common

from nvrtc_engine.dtypes import DTYPES
from nvrtc_engine.ops import norm_layout, norm_switches

EPS = 1e-5


class _Compiled:
    """Stands for torch.compile of a case's op (``--versus-compile``) where a case holds a
    LaunchConfig; compared by identity."""

    tag = "torch.compile"


COMPILED = _Compiled()


def round3_candidates(norm: Any, key: Any, default: Any) -> list[Any]:
    """The round-3 code switches on the default layout (``mode == "regs"`` only): forward
    split sums (``a2``/``a4``), one (count, mean, M2) reduction (``u``, LayerNorm) and early
    weight loads (``e``) at H <= 14336; backward column sums in shared memory (``s1``/``s2``),
    uncapped and capped at 128 or 96 registers, at H <= 8192."""
    import dataclasses

    spec = key.spec
    if default.mode != "regs" or default.hold:
        return []
    out = []
    if not spec.backward and key.hidden_size <= 14336:
        reduce = [False] if spec.rms else [False, True]
        for early in (False, True):
            for one in reduce:
                for accs in (1, 2) if early else (1, 2, 4):
                    out.append(dataclasses.replace(default, early=early, one_reduction=one,
                                                   accumulators=accs))  # fmt: skip
    elif spec.backward and key.hidden_size <= 8192:
        threads = -(-default.rows * default.warps // 4) * 4 * 32
        for shared in range(1, spec.accumulators + 1):
            for regs in (0, 128, 96):
                cap = norm_switches.REGISTER_FILE // (threads * regs) if regs else 0
                out.append(dataclasses.replace(default, shared_sums=shared,
                                               min_ctas=cap if cap > 1 else 0))  # fmt: skip
    return [c for c in out if c != default]


def fp8_candidates(norm: Any, key: Any, default: Any) -> list[Any]:
    """The round-4 FP8 forward candidates for a tensor-scaling forward ``key`` (``regs``
    mode): on the default layout, on the bf16 kernel's layout (its twin: the same op and
    H with bf16 output) and, where the default holds the weights, on its layout with them
    reloaded, the batched output stage (``o``), the warp-level amax (``g``) and
    both (``og``); where a thread holds at most 32 elements in a CTA of at most 8 warps, also
    ``og`` capped at 64 registers (``m{n}``: ptxas -v, sm_90, gave 64-72 registers for the
    uncapped ``og`` there, one CTA per SM fewer than the default)."""
    import dataclasses

    import nvrtc_engine as ne

    if key.scaling != "tensor" or default.mode != "regs":
        return []
    twin = norm.launch_config(ne.make_key(key.op, in_dtype=key.in_dtype, out_dtype=key.in_dtype,
                                          hidden_size=key.hidden_size, arch=key.arch))  # fmt: skip
    layouts = [default] + ([twin] if twin.mode == "regs" and twin != default else [])
    if default.hold:  # the same layout with the weights reloaded per row
        layouts.append(dataclasses.replace(default, hold=False, min_ctas=0))
    out = []
    for lay in layouts:
        switches = [(True, False), (False, True), (True, True)] if lay == default else [
            (True, True)]  # fmt: skip
        for batched, warp_amax in switches:
            out.append(dataclasses.replace(lay, batched=batched, warp_amax=warp_amax))
        threads = -(-lay.rows * lay.warps // 4) * 4 * 32
        cap = norm_switches.REGISTER_FILE // (threads * 64)
        if lay.iters * lay.vec <= 32 and lay.rows * lay.warps <= 8 and cap > 1:
            out.append(dataclasses.replace(lay, batched=True, warp_amax=True, min_ctas=cap))
    return [c for c in out if c != default]


def staged_candidates(norm: Any, key: Any) -> list[Any]:
    """The round-5 staged backward layouts (``t{stages}``, :func:`norm.staged_layout`) of a
    specialized backward ``key``: 2, 3 and 4 stages (as many as fit), 2 and 4 accesses per
    thread (32 and 64 bytes of x; LayerNorm above H = 8192: 2); at H >= 65536 also clusters
    of 8 CTAs (the rule takes 4), 2 and 4 accesses per thread, where their shared memory
    fits."""
    from nvrtc_engine.key import arch_number

    spec = key.spec
    if not spec.backward or key.hidden_size is None:
        return []
    out: list[Any] = []
    # ptxas (sm_90): LayerNorm at 4 accesses per thread spills from H = 14336 on (the 128
    # registers of 448 or 512 threads), so only 2 there
    wide = spec.accumulators == 1 or key.hidden_size <= 8192
    for target in (32, 64) if wide else (32,):
        for stages in (2, 3, 4):
            cfg = norm.staged_layout(key, stages, target)
            if cfg is not None and cfg not in out:
                out.append(cfg)
    arch = arch_number(key.arch)
    if key.hidden_size >= 65536 and 90 <= arch < 110:
        itemsize = key.input.itemsize
        w_size = DTYPES[norm.gamma_dtype(key)].itemsize
        vec = 16 // itemsize
        limit = norm_switches.OPTIN_SMEM_BYTES[arch] - 1024
        accesses = key.hidden_size // vec
        for iters in (2, 4):
            warps = -(-accesses // (32 * 8 * iters))
            for stages in (2, 3, 4):
                cfg = norm.LaunchConfig("regs", vec, warps, 1, iters, 8, stages=stages)
                if warps <= 32 and norm.staged_smem_bytes(cfg, itemsize, w_size) <= limit:
                    out.append(cfg)
    return out


def fp8b_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The round-5 FP8 forward candidates for a tensor-scaling forward ``key`` (``regs``
    mode), as (LaunchConfig, host settings): on the default layout (TUNED's, with its o/g/h
    letters) the word unpacking and packing (``q``, ``FWD_FP8_WORDS``), the next row group's x
    copied ahead (``p``, ``FWD_FP8_NEXT_ROW``; several row groups per CTA, so also at 4 and 16
    groups per CTA, ``FWD_GROUPS_PER_CTA``, besides the default 8) and both; ``ogqp`` where
    the default lacks o or g; ``ogqp`` capped at 64 registers (``m{n}``) where a thread holds
    at most 32 elements in a CTA of at most 8 warps (``q`` took LayerNorm 4096 ``o`` from 64
    to 72 registers under ptxas, sm_90: one CTA per SM fewer); and ``ogqp`` on the bf16
    kernel's layout (its twin) where that differs. ``p`` is left out by launch_config where
    it does not apply (accesses under 16 bytes, slots over the static shared memory)."""
    import dataclasses

    import nvrtc_engine as ne

    if key.scaling != "tensor" or default.mode != "regs":
        return []
    twin = norm.launch_config(ne.make_key(key.op, in_dtype=key.in_dtype, out_dtype=key.in_dtype,
                                          hidden_size=key.hidden_size, arch=key.arch))  # fmt: skip
    fits = norm_layout.next_row_fits(default, key.input.itemsize)
    out: list[tuple[Any, dict[str, Any]]] = []
    q = dataclasses.replace(default, words=True)
    out.append((q, {}))
    if fits:
        p = dataclasses.replace(default, next_row=True)
        qp = dataclasses.replace(default, words=True, next_row=True)
        out += [(p, {}), (qp, {}), (qp, {"FWD_GROUPS_PER_CTA": 4}),
                (qp, {"FWD_GROUPS_PER_CTA": 16})]  # fmt: skip
    full = dataclasses.replace(default, batched=True, warp_amax=True, words=True,
                               next_row=fits)  # fmt: skip
    if not (default.batched and default.warp_amax):
        out.append((full, {}))
    threads = -(-default.rows * default.warps // 4) * 4 * 32
    cap = norm_switches.REGISTER_FILE // (threads * 64)
    if default.iters * default.vec <= 32 and default.rows * default.warps <= 8 and cap > 1:
        out.append((dataclasses.replace(full, min_ctas=cap), {}))
    same = (twin.warps, twin.iters, twin.rows) == (default.warps, default.iters, default.rows)
    if twin.mode == "regs" and not same:
        twin_fits = norm_layout.next_row_fits(twin, key.input.itemsize)
        out.append((dataclasses.replace(twin, batched=True, warp_amax=True, words=True,
                                        next_row=twin_fits and fits), {}))  # fmt: skip
    return out


def onered_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """LayerNorm's one (count, mean, M2) reduction (``u``), as (LaunchConfig, host
    settings). At H >= 65536, where each row reduction is a cluster barrier: on the leaders
    of ``--candidates big`` (w16j8c2, w19j7c2, w4j8c8, w8j8c4), each as is and with held
    weights (8 row groups per CTA), with 1 and 2 partial sums per thread (``a2``); FP8
    layouts carry TUNED's ``ogq``. Below, FP8 only: ``u`` and ``ua2`` on the default (TUNED)
    layout with its switches. The round-3 sweep tried ``u`` only up to H = 14336 and before
    the FP8 switches (it lost there on the plain FP8 layouts)."""
    import dataclasses

    spec = key.spec
    if spec.backward or spec.rms or key.hidden_size is None or default.mode != "regs":
        return []
    if key.scaling not in ("none", "tensor"):
        return []
    fp8 = key.scaling == "tensor"
    if key.hidden_size < 65536:
        if not fp8:
            return []
        one = dataclasses.replace(default, one_reduction=True)
        return [(one, {}), (dataclasses.replace(one, accumulators=2), {})]
    vec = 16 // key.input.itemsize
    out: list[tuple[Any, dict[str, Any]]] = []
    for warps, iters, cluster in ((16, 8, 2), (19, 7, 2), (4, 8, 8), (8, 8, 4)):
        base = norm.LaunchConfig("regs", vec, warps, 1, iters, cluster, one_reduction=True,
                                 batched=fp8, warp_amax=fp8, words=fp8)  # fmt: skip
        for accs in (1, 2):
            cfg = dataclasses.replace(base, accumulators=accs)
            out.append((cfg, {}))
            out.append((dataclasses.replace(cfg, hold=True), {"FWD_GROUPS_PER_CTA": 8}))
    return out


def bwd2_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """More of the staged backward for a specialized backward ``key`` at H <= 14336, as
    (LaunchConfig, host settings): 1, 2 and 4 accesses per thread (16-64 bytes of x), 2 to 6
    stages (as many as fit), each at 2, 4 and 8 CTAs per SM at most (``BWD_CTAS_PER_SM``: the
    persistent grid, and so the partial column-sum rows the finalize adds). The round-5 sweep
    (``--candidates bwd``) tried 2 and 4 accesses at 2-4 stages, 8 CTAs per SM; LayerNorm at
    4096 and 14336 ended 1-2 points short of 75%."""
    spec = key.spec
    if not spec.backward or key.hidden_size is None or key.hidden_size > 14336:
        return []
    layouts: list[Any] = []
    for target in (16, 32, 64):
        for stages in range(2, 7):
            cfg = norm.staged_layout(key, stages, target)
            if cfg is not None and cfg not in layouts:
                layouts.append(cfg)
    return [(cfg, {"BWD_CTAS_PER_SM": n}) for cfg in layouts for n in (2, 4, 8)]


def bf16p_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The next-row copies (``p``) for a bf16-output forward ``key`` at H <= 14336, as
    (LaunchConfig, host settings): on the default layout and on its neighbours (half and
    twice the accesses per thread) at 4, 8 and 16 row groups per CTA, and with held weights
    (``hp``) at 8, where the slots fit the static shared memory. ``p`` with 4 row groups per
    CTA gave LayerNorm FP8 at 4096 5 points (norm_tuning-fp8b.json); the bf16 forwards had
    never had it (it was FP8-only)."""
    import dataclasses

    spec = key.spec
    if spec.backward or key.scaling != "none" or default.mode != "regs":
        return []
    if key.hidden_size is None or key.hidden_size > 14336:
        return []
    layouts = [default]
    accesses = key.hidden_size // default.vec
    for iters in (default.iters // 2, default.iters * 2):
        if iters < 1 or default.cluster > 1:
            continue
        warps = -(-accesses // (32 * iters))
        iters = -(-accesses // (32 * warps))
        cfg = norm.LaunchConfig("regs", default.vec, warps, 1, iters, 1)
        if warps <= 32 and iters * default.vec <= 64 and cfg not in layouts:
            layouts.append(cfg)
    out: list[tuple[Any, dict[str, Any]]] = []
    for lay in layouts:
        if not norm_layout.next_row_fits(lay, key.input.itemsize):
            continue
        p = dataclasses.replace(lay, hold=False, min_ctas=0, next_row=True)
        out += [(p, {"FWD_GROUPS_PER_CTA": g}) for g in (4, 8, 16)]
        out.append((dataclasses.replace(p, hold=True), {"FWD_GROUPS_PER_CTA": 8}))
    return out


def big_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The H >= 65536 forward candidates (sm_90/sm_100: thread block clusters) for a bf16- or
    FP8-output forward ``key``, as (LaunchConfig, host settings): the row split over 2, 4 or
    8 CTAs at 1-8 accesses of 16 bytes per thread (up to 64 elements; 32 warps at most), each
    as is, with the weights held over 8 row groups per CTA (``h``), with the next row
    group's x copied ahead (``p``, where its slots fit the static shared memory: clusters of
    4 and 8) at 16 and 64 row groups per CTA (64: about one wave of resident clusters at N =
    2048) and held plus copied (``hp``, 16 groups). FP8 layouts carry TUNED's ``ogq``. The
    earlier sweeps tried only the rule's cluster of 2 (w19j7) in the forward: one CTA per SM,
    a row per CTA, so nothing was in flight while a CTA reduced and wrote its row."""
    import dataclasses

    if key.spec.backward:
        return []
    vec = 16 // key.input.itemsize
    fp8 = key.scaling == "tensor"
    out: list[tuple[Any, dict[str, Any]]] = []
    for cluster, warps, iters in _cluster_layouts(key, (2, 4, 8)):
        base = norm.LaunchConfig("regs", vec, warps, 1, iters, cluster, batched=fp8,
                                 warp_amax=fp8, words=fp8)  # fmt: skip
        if any(c == base for c, _ in out):
            continue
        out.append((base, {}))
        out.append((dataclasses.replace(base, hold=True), {"FWD_GROUPS_PER_CTA": 8}))
        if norm_layout.next_row_fits(base, key.input.itemsize):
            p = dataclasses.replace(base, next_row=True)
            held = dataclasses.replace(p, hold=True)
            out += [(p, {"FWD_GROUPS_PER_CTA": 16}), (p, {"FWD_GROUPS_PER_CTA": 64}),
                    (held, {"FWD_GROUPS_PER_CTA": 16})]  # fmt: skip
    return [(c, h) for c, h in out if not (c == default and not h)]


def _cluster_layouts(key: Any, clusters: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(cluster, warps, accesses per thread) for the row of ``key`` over each of ``clusters``
    CTAs at 2, 4 and 8 accesses of 16 bytes per thread (balanced; up to 64 elements and 32
    warps); none unless H >= 65536 on sm_90-sm_10x with no or tensor scaling."""
    from nvrtc_engine.key import arch_number

    if key.hidden_size is None or key.hidden_size < 65536:
        return []
    if not 90 <= arch_number(key.arch) < 110 or key.scaling not in ("none", "tensor"):
        return []
    vec = 16 // key.input.itemsize
    accesses = key.hidden_size // vec
    out = []
    for cluster in clusters:
        for iters in (2, 4, 8):
            warps = -(-accesses // (32 * cluster * iters))
            iters = -(-accesses // (32 * cluster * warps))
            if warps > 32 or warps * 32 * cluster > accesses or iters * vec > 64:
                continue
            out.append((cluster, warps, iters))
    return out


def big2_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """H >= 65536 after the cluster mailboxes (no cluster barrier per row reduction; the
    first sweep after them, ``--candidates big``, norm_tuning-big-mail.json, put clusters of
    8 with the next row copied ahead 8-26% ahead of TUNED's clusters of 2), as (LaunchConfig,
    host settings). Forward: clusters of 4 and 8 at 2, 4 and 8 accesses per thread with the
    next row copied ahead (``p``, where it fits), at 16, 32 and 64 row groups per CTA, with
    and without held weights, and for LayerNorm with and without the one reduction (``u``);
    FP8 layouts carry ``ogq``. Backward: the staged kernel over clusters of 8 at 2, 4 and 8
    accesses per thread, 2-4 stages, 2 or 4 CTAs per SM or the module's."""
    import dataclasses

    spec = key.spec
    vec = 16 // key.input.itemsize
    fp8 = key.scaling == "tensor"
    out: list[tuple[Any, dict[str, Any]]] = []
    if spec.backward:
        for _, warps, iters in _cluster_layouts(key, (8,)):
            for stages in (2, 3, 4):
                for per_sm in (0, 2, 4):
                    cfg = norm.LaunchConfig("regs", vec, warps, 1, iters, 8, stages=stages,
                                            ctas_per_sm=per_sm)  # fmt: skip
                    if norm_layout.staged_fits(key, cfg) and cfg != default:
                        out.append((cfg, {}))
        return out
    for cluster, warps, iters in _cluster_layouts(key, (4, 8)):
        base = norm.LaunchConfig("regs", vec, warps, 1, iters, cluster, batched=fp8,
                                 warp_amax=fp8, words=fp8, next_row=True)  # fmt: skip
        if not norm_layout.next_row_fits(base, key.input.itemsize):
            continue
        for groups in (16, 32, 64):
            for hold in (False, True):
                for one in (False, True) if not spec.rms else (False,):
                    cfg = dataclasses.replace(base, groups=groups, hold=hold,
                                              one_reduction=one)  # fmt: skip
                    if cfg != default:
                        out.append((cfg, {}))
    return out


def near_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The neighbourhood of the default (TUNED) layout of a specialized ``key``, as
    (LaunchConfig, host settings), for a paired re-check (``--shuffle``, many short rounds)
    of the near misses. Forward (one CTA per row group): each switch flipped alone (``h``,
    ``e``, ``u`` for LayerNorm, ``a2``; with tensor scaling ``o``, ``g``, ``q``; ``p`` where
    it fits), 4 and 16 row groups per CTA where the weights are held or the next row is
    copied, held weights at 4 and 16 groups, and half and twice the accesses per thread
    with the same switches. Staged backward: one stage fewer and more, 2, 4 and 8 CTAs per
    SM, and the layouts for 16 and 64 bytes of x per thread at the same depth."""
    import dataclasses

    spec = key.spec
    if default.mode != "regs" or key.hidden_size is None or default.cluster > 1:
        return []
    out: list[tuple[Any, dict[str, Any]]] = []

    def add(cfg: Any) -> None:
        if cfg is not None and cfg != default and (cfg, {}) not in out:
            out.append((cfg, {}))

    if spec.backward:
        if not default.stages:
            return []
        for stages in (default.stages - 1, default.stages + 1):
            if stages >= 2:
                add(dataclasses.replace(default, stages=stages))
        for per_sm in (2, 4, 8):
            add(dataclasses.replace(default, ctas_per_sm=per_sm))
        for target in (16, 64):
            cfg = norm.staged_layout(key, default.stages, target)
            add(dataclasses.replace(cfg, ctas_per_sm=default.ctas_per_sm) if cfg else None)
        return out
    fp8 = key.scaling == "tensor"
    fits = norm_layout.next_row_fits(default, key.input.itemsize)
    flips = ["hold", "early", "accumulators"] + (["one_reduction"] if not spec.rms else [])
    flips += ["batched", "warp_amax", "words"] if fp8 else []
    flips += ["next_row"] if fits else []
    for field in flips:
        if field == "accumulators":
            add(dataclasses.replace(default, accumulators=1 if default.accumulators > 1 else 2))
        else:
            add(dataclasses.replace(default, **{field: not getattr(default, field)}))
    for groups in (4, 16):
        if default.hold or default.next_row:
            add(dataclasses.replace(default, groups=groups))
        add(dataclasses.replace(default, hold=True, early=False, groups=groups))
    accesses = key.hidden_size // default.vec
    for iters in (default.iters // 2, default.iters * 2):
        if iters < 1 or iters * default.vec > norm_switches.MAX_ELEMENTS:
            continue
        warps = -(-accesses // (32 * iters))
        iters = -(-accesses // (32 * warps))
        if warps <= 32:
            cfg = dataclasses.replace(default, warps=warps, iters=iters, rows=1)
            fits = norm_layout.next_row_fits(cfg, key.input.itemsize)
            add(dataclasses.replace(cfg, next_row=cfg.next_row and fits))
    return out


def lanes_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates lanes`` (round 8): the default (TUNED) layout of a specialized ``key``
    with ``l`` flipped (a row sum's per-warp values added across lanes by shuffles, not read
    and added one by one by every thread), and where the layout has no ``q`` (the staged
    backward: x, dz and gamma read from shared memory as 32-bit words; the bf16 forward: x,
    gamma and beta loaded as words) also with ``q`` and with both, as (LaunchConfig, host
    settings)."""
    import dataclasses

    if default.mode != "regs" or default.warps < 2:
        return []
    out = [(dataclasses.replace(default, lanes=not default.lanes), {})]
    if not default.words and (default.stages or not key.spec.backward):
        out.append((dataclasses.replace(default, words=True), {}))
        out.append((dataclasses.replace(default, words=True, lanes=not default.lanes), {}))
    return out


def fold_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates fold`` (round 8): the staged backward's default (TUNED) layout with
    ``f`` (weight(gamma) in shared memory as fp32), ``d`` (dx from the row's constants, two
    FFMA per element) and both, as (LaunchConfig, host settings)."""
    import dataclasses

    if not (key.spec.backward and default.mode == "regs" and default.stages):
        return []
    return [(dataclasses.replace(default, gamma32=f, folded=d), {})
            for f, d in ((True, False), (False, True), (True, True))]  # fmt: skip


def _split_rows(
    accesses: int, iters_options: Any, clusters: tuple[int, ...] = (2, 4)
) -> list[tuple[int, int, int]]:
    """(cluster, warps, accesses per thread) that split a row of ``accesses`` accesses
    exactly over clusters of ``clusters`` CTAs (default 2 and 4) of 1-32 warps, at each of
    ``iters_options``."""
    out = []
    for cluster in clusters:
        for iters in iters_options:
            warps, rest = divmod(accesses, 32 * cluster * iters)
            if not rest and 1 <= warps <= 32:
                out.append((cluster, warps, iters))
    return out


def bwdc_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates bwdc`` (round 8): the staged backward at H = 4096-14336 over
    thread block clusters of 2 and 4 CTAs (the row's sums exchanged through the cluster
    mailboxes, as at 65536; a CTA's stages then take a half or a quarter of the shared
    memory, so more CTAs fit an SM), at 1, 2 and 4 accesses per thread, 2 and 3 stages, 2
    CTAs per SM or the module's, with the default's ``q``/``l``/``f``/``d``, as
    (LaunchConfig, host settings)."""
    import dataclasses

    if not (key.spec.backward and default.mode == "regs" and default.stages):
        return []
    if key.hidden_size not in (4096, 8192, 14336):
        return []
    out: list[tuple[Any, dict[str, Any]]] = []
    for cluster, warps, iters in _split_rows(key.hidden_size // default.vec, (1, 2, 4)):
        for stages in (2, 3):
            for per_sm in (0, 2):
                cfg = dataclasses.replace(default, warps=warps, iters=iters, cluster=cluster,
                                          stages=stages, ctas_per_sm=per_sm)  # fmt: skip
                if norm_layout.staged_fits(key, cfg) and cfg != default:
                    out.append((cfg, {}))
    return out


def fwdc_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates bwdc``, forward (round 8): FP8 (tensor-scaled) rows at H = 4096-14336
    over clusters of 2 and 4 CTAs, as TUNED takes at 65536: 2, 4 and 8 accesses per
    thread, ``ogq``, the next row copied ahead (``p``, where it fits) at 16 and 64 row groups
    per CTA, with and without held weights, as (LaunchConfig, host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling != "tensor" or key.hidden_size not in (4096, 8192, 14336):
        return []
    vec = 16 // key.input.itemsize
    out: list[tuple[Any, dict[str, Any]]] = []
    for cluster, warps, iters in _split_rows(key.hidden_size // vec, (2, 4, 8)):
        base = norm.LaunchConfig("regs", vec, warps, 1, iters, cluster, batched=True,
                                 warp_amax=True, words=True, next_row=True)  # fmt: skip
        if not norm_layout.next_row_fits(base, key.input.itemsize):
            continue
        for groups in (16, 64):
            for hold in (False, True):
                cfg = dataclasses.replace(base, groups=groups, hold=hold)
                if cfg != default:
                    out.append((cfg, {}))
    return out


def _staged_forward_shape(key: Any) -> tuple[bool, int, int, tuple[int, ...]] | None:
    """For the staged forward sweeps: (FP8 output, elements per 16-byte access, accesses per
    row, the clusters to try: 1 and 2 CTAs below H = 65536, 4 and 8 at 65536), or None for
    a key they skip (backward, MXFP8, general, H not a multiple of the access)."""
    if key.spec.backward or key.scaling == "mxfp8" or key.hidden_size is None:
        return None
    vec = 16 // key.input.itemsize
    accesses, rest = divmod(key.hidden_size, vec)
    if rest:
        return None
    clusters = (4, 8) if key.hidden_size >= 65536 else (1, 2)
    return key.scaling == "tensor", vec, accesses, clusters


def sfwd_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates sfwd`` (round 9): the staged forward (x through shared memory by
    cp.async, 2-4 rows deep, a persistent grid; ``FWD_STAGED``) with the weights in shared
    memory as stored or as fp32 (``f``), one CTA per row or the row over a cluster (2 CTAs
    below H = 65536; 4 and 8 at 65536), 2, 4 and 8 accesses per thread where they split the
    row exactly; ``q`` (word reads), and ``og`` for FP8 as TUNED's FP8 entries; where the
    shared memory fits, as (LaunchConfig, host settings)."""
    shape = _staged_forward_shape(key)
    if shape is None:
        return []
    fp8, vec, accesses, clusters = shape
    out: list[tuple[Any, dict[str, Any]]] = []
    for cluster, warps, iters in _split_rows(accesses, (2, 4, 8), clusters):
        for stages in (2, 3, 4):
            for f32 in (False, True):
                cfg = norm.LaunchConfig("regs", vec, warps, 1, iters, cluster, batched=fp8,
                                        warp_amax=fp8, words=True, stages=stages,
                                        gamma32=f32)  # fmt: skip
                if norm_layout.staged_fits(key, cfg) and cfg != default:
                    out.append((cfg, {}))
    return out


def snear_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates snear`` (round 9): the neighbourhood of a staged forward default (TUNED's
    ``t`` entries): one stage more and fewer, ``f``, ``l`` (several warps) and ``u``
    (LayerNorm) flipped, the persistent grid capped at 1-4 CTAs per SM (``b``), and the
    row over other clusters (1-8 CTAs; 4-8 at H = 65536) at half, the same and twice the
    accesses per thread, where they split the row exactly and fit, as (LaunchConfig, host
    settings); none for other defaults."""
    import dataclasses

    if key.spec.backward or default.mode != "regs" or not default.stages:
        return []
    out: list[tuple[Any, dict[str, Any]]] = []

    def add(cfg: Any) -> None:
        if cfg != default and norm_layout.staged_fits(key, cfg) and (cfg, {}) not in out:
            out.append((cfg, {}))

    for stages in (default.stages - 1, default.stages + 1):
        if stages >= 2:
            add(dataclasses.replace(default, stages=stages))
    add(dataclasses.replace(default, gamma32=not default.gamma32))
    if default.warps > 1:
        add(dataclasses.replace(default, lanes=not default.lanes))
    if not key.spec.rms:
        add(dataclasses.replace(default, one_reduction=not default.one_reduction))
    for per_sm in (1, 2, 3, 4):
        if per_sm != default.ctas_per_sm:
            add(dataclasses.replace(default, ctas_per_sm=per_sm))
    accesses = key.hidden_size // default.vec
    clusters = (4, 8) if key.hidden_size >= 65536 else (1, 2, 4, 8)
    iters = sorted({max(1, default.iters // 2), default.iters, default.iters * 2})
    for cluster, warps, n in _split_rows(accesses, iters, clusters):
        for stages in (2, 3):
            add(dataclasses.replace(default, warps=warps, iters=n, cluster=cluster, stages=stages))
    return out


def srows_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates srows`` (round 10): the staged forward with 2 and 4 rows per CTA (one
    stage area per row, the weights shared: more warps per SM for the same shared memory),
    one CTA per row group, 2, 4 and 8 accesses per thread where they split the row exactly,
    2 and 3 stages, weights as stored or as fp32 (``f``), ``q``, and ``og`` for FP8; where
    the shared memory and the register file fit, as (LaunchConfig, host settings)."""
    if key.spec.backward or key.scaling == "mxfp8" or key.hidden_size is None:
        return []
    fp8 = key.scaling == "tensor"
    vec = 16 // key.input.itemsize
    accesses, rest = divmod(key.hidden_size, vec)
    if rest or key.hidden_size >= 65536:
        return []
    out: list[tuple[Any, dict[str, Any]]] = []
    for _, warps, iters in _split_rows(accesses, (2, 4, 8), (1,)):
        for rows in (2, 4):
            for stages in (2, 3):
                for f32 in (False, True):
                    cfg = norm.LaunchConfig("regs", vec, warps, rows, iters, 1, batched=fp8,
                                            warp_amax=fp8, words=True, stages=stages,
                                            gamma32=f32)  # fmt: skip
                    if rows * warps <= 32 and norm_layout.staged_fits(key, cfg) and cfg != default:
                        out.append((cfg, {}))
    return out


def sregs_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates sregs`` (round 10): the staged forward with its weights in registers
    rather than shared memory (a CTA's shared memory then holds only x's stages, so more
    CTAs fit an SM, or more stages): held once per CTA (``h``) or loaded per row from global
    memory before the reductions (``e``), one CTA per row (1 or 2 rows per CTA) or the row
    over a cluster (2 below H = 65536; 4 and 8 at 65536), 4 and 8 accesses per thread where
    they split the row exactly, 2-4 stages, ``q``, and ``og`` for FP8; where the shared
    memory and the registers fit, as (LaunchConfig, host settings)."""
    shape = _staged_forward_shape(key)
    if shape is None:
        return []
    fp8, vec, accesses, clusters = shape
    out: list[tuple[Any, dict[str, Any]]] = []
    for cluster, warps, iters in _split_rows(accesses, (4, 8), clusters):
        for rows in (1, 2) if cluster == 1 else (1,):
            for stages in (2, 3, 4):
                for hold in (True, False):
                    cfg = norm.LaunchConfig("regs", vec, warps, rows, iters, cluster,
                                            hold=hold, early=not hold, batched=fp8,
                                            warp_amax=fp8, words=True,
                                            stages=stages)  # fmt: skip
                    if rows * warps <= 32 and norm_layout.staged_fits(key, cfg) and cfg != default:
                        out.append((cfg, {}))
    return out


def bal_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates bal`` (round 10): the default with a balanced persistent grid
    (``PERSISTENT_BALANCED``, host side) where its grid is persistent (the staged forward,
    the forwards with several row groups per CTA, every register backward); a staged forward
    default of one row per CTA (or cluster) also with two rows per CTA (``r2``; a cluster's
    row in one CTA of as many warps, where that fits), with either grid, as (LaunchConfig,
    host settings)."""
    import dataclasses

    if default.mode != "regs":
        return []
    persistent = key.spec.backward or default.stages or default.hold or default.next_row
    out: list[tuple[Any, dict[str, Any]]] = []
    if persistent:
        out.append((default, {"PERSISTENT_BALANCED": True}))
    if not key.spec.backward and default.stages and default.rows == 1:
        warps = default.warps * default.cluster  # a cluster's row in one CTA
        two = dataclasses.replace(default, rows=2, warps=warps, cluster=1)
        if warps <= 16 and norm_layout.staged_fits(key, two):
            out += [(two, {}), (two, {"PERSISTENT_BALANCED": True})]
    return out


def defer_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates defer`` (round 11): the staged backward's default (TUNED) layout with
    ``i`` (a row's dx written after the next row's sums are posted) at its depth and one and
    two stages deeper (``i`` keeps one row fewer in flight), and one stage deeper without
    ``i``; at H = 65536 also 3-5 stages at 1-3 CTAs per SM and the cluster's row over 16
    warps of 2 accesses or 4 warps of 8, with and without ``i``; where they fit, as
    (LaunchConfig, host settings)."""
    import dataclasses

    if not (key.spec.backward and default.mode == "regs" and default.stages):
        return []
    out: list[tuple[Any, dict[str, Any]]] = []

    def add(cfg: Any) -> None:
        if cfg.deferred and cfg.stages < 3:
            return
        if cfg != default and norm_layout.staged_fits(key, cfg) and (cfg, {}) not in out:
            out.append((cfg, {}))

    for stages in range(default.stages, default.stages + 3):
        add(dataclasses.replace(default, stages=stages, deferred=True))
    add(dataclasses.replace(default, stages=default.stages + 1))
    if key.hidden_size >= 65536:
        row = default.warps * default.iters  # accesses of a CTA's share of the row
        shapes = [(default.warps, default.iters)]
        shapes += [(w, row // w) for w in (16, 4) if w != default.warps and row % w == 0]
        for warps, iters in shapes:
            for stages in (3, 4, 5):
                for per_sm in (1, 2, 3):
                    for deferred in (False, True):
                        add(dataclasses.replace(default, warps=warps, iters=iters, stages=stages,
                                                ctas_per_sm=per_sm, deferred=deferred))  # fmt: skip
    return out


def fdefer_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates fdefer`` (round 11): the staged forward with ``i`` (a row's z written
    after the next row's statistics are posted; one row per CTA): each staged default (TUNED;
    a default of several rows per CTA as one row per CTA) at its depth and one stage deeper,
    with ``u`` flipped for LayerNorm, and at H = 65536 every forward (RMSNorm's register
    entries too) as the staged layout of 8 CTAs of 4 warps, weights held (``h``), 3 and 4
    stages at 1 and 2 CTAs per SM, with and without ``u``; where they fit, as (LaunchConfig,
    host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling == "mxfp8" or default.mode != "regs":
        return []
    out: list[tuple[Any, dict[str, Any]]] = []

    def add(cfg: Any) -> None:
        if cfg != default and norm_layout.staged_fits(key, cfg) and (cfg, {}) not in out:
            out.append((cfg, {}))

    fp8 = key.scaling == "tensor"
    bases = []
    if default.stages:
        bases.append(dataclasses.replace(default, rows=1))  # (warps are per row)
    if key.hidden_size >= 65536:
        bases.append(norm.LaunchConfig("regs", default.vec, 4, 1, 8, 8, hold=True, batched=fp8,
                                       warp_amax=fp8, words=True, stages=3))  # fmt: skip
    unis = (False, True) if not key.spec.rms else (False,)
    for base in bases:
        for stages in (max(3, base.stages), max(3, base.stages) + 1):
            for u in unis:
                for per_sm in (0,) if key.hidden_size < 65536 else (0, 1, 2):
                    add(dataclasses.replace(base, stages=stages, one_reduction=u, deferred=True,
                                            ctas_per_sm=per_sm or base.ctas_per_sm))  # fmt: skip
        if key.hidden_size >= 65536:
            for u in unis:
                add(dataclasses.replace(base, stages=3, one_reduction=u))
    return out


def caps_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates caps`` (round 12): each forward default (bf16 and FP8 z) with a register
    cap (``m``: ``__launch_bounds__`` asks ptxas for that many CTAs per SM) of 3-12 CTAs,
    where the threads, the shared memory of its stages and 40 registers a thread fit that many;
    a staged default also with its weights held in registers (``h``: its shared memory then
    holds only x's stages) and, one row per CTA from 3 stages, with ``i``; those two also
    uncapped. Why: ptxas -v (sm_90) gave LayerNorm FP8 at 65536 168 registers (3 CTAs per SM)
    and 128 with no spill under m4; at 4096 96 (5) and 72 under m7; LayerNorm bf16 at 4096 64
    (8) and 48 under m10; no sweep had tried a cap on the later layouts. As (LaunchConfig,
    host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling == "mxfp8" or default.mode != "regs":
        return []
    bases = [default]
    if default.stages and not (default.hold or default.early):
        bases.append(dataclasses.replace(default, hold=True))
    if default.stages >= 3 and default.rows == 1 and not default.deferred:
        bases.append(dataclasses.replace(default, deferred=True))
    w_size = DTYPES[norm.gamma_dtype(key)].itemsize
    limit = norm_switches.OPTIN_SMEM_BYTES[90]
    out: list[tuple[Any, dict[str, Any]]] = []
    for base in bases:
        if base is not default:
            if base.stages and not norm_layout.staged_fits(key, base):
                continue
            out.append((base, {}))
        smem = norm.staged_smem_bytes(base, key.input.itemsize, w_size,
                                      **norm.staged_counts(key.spec, base))  # fmt: skip
        fits = 2048 // base.threads
        if smem:
            fits = min(fits, limit // (smem + 2048))  # + static memory, reserved 1 KB
        warp_regs = -(-ptxas_registers(key, base) * 32 // 256) * 256  # allocation unit 256
        occupancy = 65536 // (warp_regs * (base.threads // 32))
        for m in (3, 4, 5, 6, 7, 8, 10, 12):
            cfg = dataclasses.replace(base, min_ctas=m)
            if occupancy < m <= fits and 65536 // (m * base.threads) >= 40:
                out.append((cfg, {}))
    return out


def reread_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates reread`` (round 13): the staged forward with ``y`` (x read again from
    its stage for each pass and, one access at a time, for the output stage: no pass's values
    held across the row's exchanges, so fewer registers and more CTAs per SM): each staged
    forward default with ``y`` at its depth and one deeper, with and without ``i`` (one row
    per CTA, 3 stages or more); at 4096 the register defaults also staged (weights held, 3-4
    stages) with and without ``y``. As (LaunchConfig, host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling == "mxfp8" or default.mode != "regs":
        return []
    fp8 = key.scaling == "tensor"
    if default.stages:
        base = default
    elif key.hidden_size == 4096:
        base = dataclasses.replace(default, stages=3, hold=True, words=True, batched=fp8,
                                   warp_amax=fp8, next_row=False, groups=0)  # fmt: skip
    else:
        return []
    out: list[tuple[Any, dict[str, Any]]] = []
    for stages in (base.stages, base.stages + 1):
        for deferred in (False, True):
            for reread in (True, False) if not default.stages else (True,):
                if deferred and (stages < 3 or base.rows != 1):
                    continue
                cfg = dataclasses.replace(base, stages=stages, deferred=deferred, reread=reread)
                if cfg != default and norm_layout.staged_fits(key, cfg) and (cfg, {}) not in out:
                    out.append((cfg, {}))
    return out


def hreread_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates hreread`` (round 14): the staged forward defaults that keep the weights
    in shared memory (no ``h``), with the weights held in registers and x read again from its
    stage in each pass (``h`` and ``y`` together), with and without ``i`` and ``u``, 2-4
    stages. Why: ptxas -v (sm_90, NVRTC 13.5) gives LayerNorm FP8 at 8192 (``uogqt3``, 96
    registers) 2 CTAs per SM by its 80 KB of stages and weights; with ``h`` and ``y`` 127-150
    registers and 48 KB, 3-4 CTAs per SM, a combination round 13 tried only at 4096 and
    65536. Also the cluster-of-2 layout at 14336 (the r2 default cannot hold its weights).
    As (LaunchConfig, host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling == "mxfp8" or not default.stages or default.hold:
        return []
    bases = [default]
    if key.hidden_size == 14336 and default.rows > 1:
        bases = [dataclasses.replace(default, warps=default.warps // 2, rows=1, cluster=2)]
    ln = key.op.startswith("layernorm")
    out: list[tuple[Any, dict[str, Any]]] = []
    for base in bases:
        for stages in (2, 3, 4):
            for deferred in (False, True):
                for one in (False, True) if ln else (False,):
                    if deferred and (stages < 3 or base.rows != 1):
                        continue
                    cfg = dataclasses.replace(base, stages=stages, deferred=deferred,
                                              hold=True, reread=True, one_reduction=one,
                                              gamma32=False)  # fmt: skip
                    if (
                        cfg != default
                        and norm_layout.staged_fits(key, cfg)
                        and (cfg, {}) not in out
                    ):
                        out.append((cfg, {}))
    return out


def wide_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates wide`` (round 15): the staged forward default over a cluster (H =
    65536) with the same columns per CTA spread over 2, 8 or 16 warps instead of 4 (fewer or
    more accesses per thread; those whose stages fit: for LayerNorm FP8 at 65536, 8 and 16),
    with and without ``u`` (LayerNorm) and ``y``, 3-4 stages. Why: LayerNorm FP8 at 65536
    (``w4r1v8j8c8hogqiyt3``) is bound by instruction issue inside the row (ncu: 73% of issue
    slots busy, 3.5 warps per scheduler, DRAM at 70.6%; 87% of copy at the margin,
    bench/norm_fixed_cost.py), and ptxas -v gives the 8-warp layout 78 registers (3 CTAs of
    8 warps per SM) where the 4-warp one takes 128 (4 of 4). As (LaunchConfig, host
    settings)."""
    import dataclasses

    if key.spec.backward or not default.stages or default.cluster < 2:
        return []
    ln = key.op.startswith("layernorm")
    per_cta = default.warps * default.iters
    out: list[tuple[Any, dict[str, Any]]] = []
    for warps in (2, 4, 8, 16):
        if per_cta % warps or per_cta // warps < 1:
            continue
        for stages in (3, 4):
            for reread in (True, False):
                for one in (False, True) if ln else (False,):
                    cfg = dataclasses.replace(default, warps=warps, iters=per_cta // warps,
                                              stages=stages, reread=reread,
                                              one_reduction=one)  # fmt: skip
                    if (
                        cfg != default
                        and norm_layout.staged_fits(key, cfg)
                        and (cfg, {}) not in out
                    ):
                        out.append((cfg, {}))
    return out


def shift_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates shift`` (round 16): the staged LayerNorm FP8 forward default with ``z``
    (one-pass statistics about the row's first element; ``u`` dropped where the default has it),
    with and without ``y`` and ``i``, 3-4 stages (and the default's). Why: the SASS of LayerNorm FP8
    at 65536 (``w4r1v8j8c8hogqiyt3``, bench/sass.py) spends 18.5 instructions per element in the row
    loop, 9.6 of them on the two-pass statistics; with ``z`` the loop takes 16.6 and ptxas 96
    registers instead of 128. As (LaunchConfig, host settings)."""
    import dataclasses

    if key.spec.backward or key.spec.rms or not default.stages or not key.output.is_fp8:
        return []
    out: list[tuple[Any, dict[str, Any]]] = []
    for stages in sorted({default.stages, 3, 4}):
        for reread in (True, False):
            for deferred in (True, False):
                cfg = dataclasses.replace(default, shifted=True, one_reduction=False,
                                          stages=stages, reread=reread,
                                          deferred=deferred and default.rows == 1)  # fmt: skip
                fits = norm.shift_applies(key, cfg) and norm_layout.staged_fits(key, cfg)
                if fits and (cfg, {}) not in out:
                    out.append((cfg, {}))
    return out


def pdl_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates pdl`` (round 17): the bf16 forward's staged layouts again
    (:func:`sfwd_candidates`), each also with ``y`` (x read from its stage in each pass) at
    3 and 4 stages with the weights as stored, where the default is a register layout; for
    a staged FP8 default, its neighbourhood (:func:`snear_candidates`) and its layout as a
    register kernel, the weights reloaded per row or held over 4 or 8 row groups. Why:
    rounds 9 and 13 timed them before the norms became programmatic dependent launches, and
    a staged kernel's persistent grid lets the next call's grid launch at once (the trigger;
    the register forwards of one row group per CTA have it too since round 17, which found it
    there with bench/source_ab.py). As (LaunchConfig, host settings)."""
    import dataclasses

    if key.spec.backward or key.scaling == "mxfp8" or default.mode != "regs":
        return []
    if key.output.is_fp8:
        if not default.stages:
            return []
        # the staged FP8 default's neighbourhood, and its layout as a register kernel (which
        # now triggers the next launch too), weights reloaded or held over 4 or 8 row groups
        out = snear_candidates(norm, key, default)
        plain = dataclasses.replace(default, stages=0, deferred=False, reread=False,
                                    gamma32=False, ctas_per_sm=0, shifted=False)  # fmt: skip
        for hold, groups in ((False, 0), (True, 4), (True, 8)):
            cand = dataclasses.replace(plain, hold=hold, groups=groups)
            if (cand, {}) not in out:
                out.append((cand, {}))
        return out
    if default.stages:
        return []
    out = sfwd_candidates(norm, key, default)
    for cfg, host in list(out):
        if cfg.stages >= 3 and not cfg.gamma32:
            cand = dataclasses.replace(cfg, reread=True)
            if norm_layout.staged_fits(key, cand) and (cand, host) not in out:
                out.append((cand, host))
    return out


def ptxas_registers(key: Any, cfg: Any) -> int:
    """Registers a thread of ``key``'s kernel takes under layout ``cfg``, by ptxas -v (an
    NVRTC compile here: no GPU needed)."""
    from nvrtc_engine.nvrtc import CompileOptions, compile_source
    from nvrtc_engine.render import render

    with common.norm_layout(cfg):
        r = render(key)
    options = CompileOptions(arch=key.arch, extra=("-Xptxas=-v",))
    log = compile_source(r.name, r.source, r.headers, options).log
    return int(re.findall(r"Used (\d+) registers", log)[0])  # the first: the row kernel


def _clusters_pairs(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates bwdc``: :func:`bwdc_candidates` and :func:`fwdc_candidates`."""
    return bwdc_candidates(norm, key, default) + fwdc_candidates(norm, key, default)


def _staged_pairs(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates bwd``: the staged layouts (:func:`staged_candidates`), plus the general
    kernel (``loop``) from H = 14336, as (LaunchConfig, host settings)."""
    out = [(cfg, {}) for cfg in staged_candidates(norm, key)]
    if key.hidden_size >= 14336:
        out.append((norm.LaunchConfig("loop", 16 // key.input.itemsize), {}))
    return out


def fetch256_candidates(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates fetch256`` (round 22): a staged backward default with ``L`` (its x and
    dz row copies, 16-byte ``cp.async``, ask L2 for 256 bytes; round 21 measured the staged
    forwards with bench/source_ab.py's ``cp256``, not the backwards), as (LaunchConfig, host
    settings)."""
    import dataclasses

    if not (key.spec.backward and default.stages and not default.fetch256):
        return []
    return [(dataclasses.replace(default, fetch256=True), {})]


def _fp8_pairs(norm: Any, key: Any, default: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``--candidates fp8`` (:func:`fp8_candidates`) as (LaunchConfig, host settings)."""
    return [(cfg, {}) for cfg in fp8_candidates(norm, key, default)]


# --candidates NAME: (the candidates besides the default, (norm, key, default) -> (cfg,
# host settings) pairs; the passes timed: forward to bf16, forward to FP8, backward)
CANDIDATE_SETS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "fp8": (_fp8_pairs, ("bf16", "fp8")),
    "fp8b": (fp8b_candidates, ("bf16", "fp8")),
    "bwd": (_staged_pairs, ("bwd",)),
    "big": (big_candidates, ("bf16", "fp8")),
    "bf16p": (bf16p_candidates, ("bf16",)),
    "bwd2": (bwd2_candidates, ("bwd",)),
    "onered": (onered_candidates, ("bf16", "fp8")),
    "near": (near_candidates, ("bf16", "fp8", "bwd")),
    "big2": (big2_candidates, ("bf16", "fp8", "bwd")),
    "lanes": (lanes_candidates, ("bf16", "fp8", "bwd")),
    "fold": (fold_candidates, ("bwd",)),
    "bwdc": (_clusters_pairs, ("fp8", "bwd")),
    "sfwd": (sfwd_candidates, ("bf16", "fp8")),
    "snear": (snear_candidates, ("bf16", "fp8")),
    "srows": (srows_candidates, ("bf16", "fp8")),
    "bal": (bal_candidates, ("bf16", "fp8", "bwd")),
    "sregs": (sregs_candidates, ("bf16", "fp8")),
    "defer": (defer_candidates, ("bwd",)),
    "fdefer": (fdefer_candidates, ("bf16", "fp8")),
    "caps": (caps_candidates, ("bf16", "fp8")),
    "reread": (reread_candidates, ("bf16", "fp8")),
    "hreread": (hreread_candidates, ("bf16", "fp8")),
    "wide": (wide_candidates, ("fp8",)),
    "shift": (shift_candidates, ("fp8",)),
    "pdl": (pdl_candidates, ("bf16", "fp8")),
    "fetch256": (fetch256_candidates, ("bwd",)),
}


def candidates(
    norm: Any, key: Any, round3_only: bool = False, only: str | None = None
) -> list[tuple[Any, dict[str, Any]]]:
    """(LaunchConfig, host settings) pairs to time for ``key``; the default comes first.
    ``round3_only``: the default and its round-3 switches (:func:`round3_candidates`);
    ``only``: the default and the named set of :data:`CANDIDATE_SETS` (``--candidates``:
    fp8, fp8b, bwd, big, bf16p, bwd2, onered, near, big2, lanes, fold, bwdc, sfwd, snear,
    srows, bal, sregs, defer, fdefer, caps, reread, hreread, wide, shift, pdl, fetch256)."""
    spec = key.spec
    default = norm.launch_config(key)
    out: list[tuple[Any, dict[str, Any]]] = []

    def add(cfg: Any, **host: Any) -> None:
        if (cfg, host) not in out:
            out.append((cfg, host))

    if only is not None:
        add(default)
        for cfg, host in CANDIDATE_SETS[only][0](norm, key, default):
            add(cfg, **host)
        return out
    if round3_only:
        add(default)
        for cfg in round3_candidates(norm, key, default):
            add(cfg)
        return out

    layouts = []
    if default.mode == "regs":
        layouts.append(default)
        accesses = key.hidden_size // default.vec
        # forward: half and twice the accesses per thread; backward: the other of 2 and 4
        other = [2 if default.iters >= 4 else 4] if spec.backward else []
        for iters in other or [default.iters // 2, default.iters * 2]:
            if iters < 1 or iters == default.iters or default.cluster > 1:
                continue
            warps = -(-accesses // (32 * iters))
            iters = -(-accesses // (32 * warps))
            if warps <= 32 and iters * default.vec <= 64:
                layouts.append(norm.LaunchConfig("regs", default.vec, warps, 1, iters, 1))
    if spec.backward and default.mode == "loop":  # the cluster layouts (BWD_CLUSTERS)
        for cluster in (2, 4, 8):
            accesses = key.hidden_size // default.vec
            warps = -(-accesses // (32 * cluster * 4))
            if warps <= 32 and warps * 32 * cluster <= accesses:
                layouts.append(norm.LaunchConfig("regs", default.vec, warps, 1, 4, cluster))
    for lay in layouts:
        base = dict(mode="regs", vec=lay.vec, warps=lay.warps, rows=lay.rows, iters=lay.iters,
                    cluster=lay.cluster)  # fmt: skip
        threads = -(-lay.rows * lay.warps // 4) * 4 * 32
        if spec.backward:
            # (prefetch, packed, capped): the former code; no prefetch with and without the
            # register cap; packed with the cap (ptxas -v: the prefetch spills once capped)
            switches = [(True, False, False), (False, False, True), (False, False, False),
                        (False, True, True)]  # fmt: skip
            if lay.cluster > 1:
                switches = switches[:3]
            for prefetch, packed, capped in switches:
                regs = norm_layout._registers(True, spec.accumulators, lay.iters * lay.vec, 2,
                                       prefetch=prefetch, packed=packed)  # fmt: skip
                cap = norm_switches.REGISTER_FILE // (threads * regs)
                cfg = norm.LaunchConfig(**base, prefetch=prefetch, packed=packed,
                                        min_ctas=cap if capped and cap > 1 else 0)  # fmt: skip
                for per_sm in (2, 8):
                    add(cfg, BWD_CTAS_PER_SM=per_sm)
        else:
            add(norm.LaunchConfig(**base))
            weights = 1 if spec.rms else 2
            regs = norm_layout._registers(False, 0, lay.iters * lay.vec, 2, weights=weights)
            cap = norm_switches.REGISTER_FILE // (threads * regs)
            held = norm.LaunchConfig(**base, hold=True, min_ctas=cap if cap > 1 else 0)
            for groups in (2, 4, 8):
                add(held, FWD_GROUPS_PER_CTA=groups)
    if default.mode == "loop" or key.hidden_size >= 65536:
        add(norm.LaunchConfig("loop", 8))
    if default not in [c for c, _ in out]:
        add(default)
    for cfg in round3_candidates(norm, key, default):
        add(cfg)
    return out


def same_round(rows: list[dict], is_reference: Any, ratio_key: str, faster_key: str) -> None:
    """Set ``ratio_key`` on each row to the median over rounds of (its group's reference
    time / its time) in the same round, and ``faster_key`` to the fraction of rounds it was
    faster; a group is (norm, H, direction, output), its reference the row ``is_reference``
    picks. Rows of a group without a reference, or with another round count, get neither."""
    refs = {(r["norm"], r["hidden"], r["direction"], r["out"]): r["ms_rounds"]
            for r in rows if is_reference(r)}  # fmt: skip
    for r in rows:
        ref = refs.get((r["norm"], r["hidden"], r["direction"], r["out"]))
        if ref is not None and len(ref) == len(r["ms_rounds"]):
            ratios = [b / t for b, t in zip(ref, r["ms_rounds"], strict=True)]
            r[ratio_key] = statistics.median(ratios)
            r[faster_key] = sum(q > 1 for q in ratios) / len(ratios)


def case_list(
    args: Any,
    hidden: list[int] | None = None,
    defaults: dict[tuple, Any] | None = None,
    arch: str | None = None,
) -> list[tuple]:
    """The cases of a run, ``(norm, h, direction, out, cfg, host settings as a tuple)``, at
    ``hidden`` (default: every ``--hidden`` size); fills ``defaults`` with each (norm,
    direction, out)'s default configuration. ``arch``: that of the keys (None: the current
    device's; given, no GPU is needed)."""
    import nvrtc_engine as ne
    import nvrtc_engine.ops.norm as norm

    sizes = hidden if hidden is not None else [int(v) for v in args.hidden.split(",")]
    passes = CANDIDATE_SETS[args.candidates][1] if args.candidates else ("bf16", "fp8", "bwd")
    all_modes = {"bf16": ("fwd", "bf16", {}), "fp8": ("fwd", "fp8_e4m3", {"scaling": "tensor"}),
                 "bwd": ("bwd", "bf16", {})}  # fmt: skip
    modes = [all_modes[name] for name in passes]
    cases = []
    for h in sizes:
        for nm in args.norms.split(","):
            for direction, out, extra in modes:
                key = ne.make_key(f"{nm}_{direction}", in_dtype="bf16", out_dtype=out,
                                  hidden_size=h, arch=arch, **extra)  # fmt: skip
                if defaults is not None:
                    defaults[(nm, direction, out)] = norm.launch_config(key)
                for cfg, host in candidates(norm, key, args.round3_only, args.candidates):
                    cases.append((nm, h, direction, out, cfg, tuple(sorted(host.items()))))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--big-tokens", type=int, default=2048)
    parser.add_argument("--hidden", default=None, help="default 4096,8192,14336,65536; "
                        "4096,8192,14336 with --candidates fp8, bf16p or bwd2; 65536 with "
                        "--candidates big or big2")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--norms", default="layernorm,rmsnorm")
    parser.add_argument(
        "--round3-only",
        action="store_true",
        help="time only the defaults and their round-3 code switches",
    )
    parser.add_argument(
        "--candidates",
        choices=list(CANDIDATE_SETS),
        help="time only the defaults and these candidates (fp8: the round-4 FP8 forward "
        "switches; fp8b: the round-5 ones, q and p; forward bf16 and FP8 only; bwd: the "
        "round-5 staged backward, backward only, at 4096,8192,14336,65536 unless --hidden "
        "says otherwise; big: the H = 65536 forward cluster layouts, at 65536 unless --hidden "
        "says otherwise; bf16p: the bf16 forward with next-row copies, at 4096,8192,14336; "
        "bwd2: more staged backward layouts and grids, at 4096,8192,14336; onered: LayerNorm's "
        "one reduction, FP8 at 4096-14336 and both outputs at 65536; near: the neighbourhood "
        "of each default layout, for paired re-checks with --shuffle; big2: H = 65536 after "
        "the cluster mailboxes, forward and backward; lanes: l and q flipped on each default; "
        "fold: f and d on the staged backward; bwdc: the staged backward and the FP8 forward "
        "over clusters of 2 and 4 at 4096-14336; sfwd: the staged forward, 2-4 rows deep, "
        "weights as stored or fp32; snear: the neighbourhood of each staged forward default; "
        "srows: the staged forward with 2 and 4 rows per CTA, at 4096,8192,14336; bal: each "
        "persistent default with a balanced grid, staged forwards also with 2 rows per CTA; "
        "sregs: the staged forward with its weights in registers, h or e; defer/fdefer: i "
        "on the staged backward/forward; caps: a register cap, m3-m12, on each forward "
        "default, staged ones also with h and i; reread: y, x read from its stage per pass, on "
        "each staged forward default, and the 4096 register defaults staged; hreread: h and y "
        "together on the staged forward defaults that keep their weights in shared memory; wide: "
        "the staged forward over a cluster with its columns over 2, 8 or 16 warps, FP8 only; "
        "shift: z, one-pass statistics, on the staged LayerNorm FP8 forward defaults; pdl: "
        "the staged bf16 forward layouts, with and without y, where the default is a "
        "register layout, and for a staged FP8 default its neighbourhood and its layout as a "
        "register kernel; fetch256: L on each staged backward default)",
    )
    parser.add_argument(
        "--name", type=common.result_name, default="norm_tuning", help="bench/results/NAME.json"
    )
    parser.add_argument("--versus-compile", action="store_true",
                        help="also time torch.compile of each op in every round (vs_compile: "
                        "its time over the candidate's, same round)")  # fmt: skip
    parser.add_argument(
        "--repeat",
        type=int,
        default=20,
        help="timed samples per case and round (common.cuda_time_ms)",
    )
    parser.add_argument(
        "--shuffle",
        action="store_true",
        help="time the cases of a round in a shuffled order (seeded by the "
        "round); with many short rounds, compare same-round ratios "
        "(vs_default) rather than medians",
    )
    parser.add_argument("--zero-amax", action="store_true",
                        help="zero the amax word before every FP8 call (timed)")  # fmt: skip
    parser.add_argument("--list", action="store_true",
                        help="print the cases for sm_90 and exit (no GPU needed)")  # fmt: skip
    args = parser.parse_args()
    if not set(args.norms.split(",")) <= {"layernorm", "rmsnorm"}:
        parser.error(f"--norms {args.norms!r}: layernorm, rmsnorm or layernorm,rmsnorm")
    if args.hidden is not None and not all(
        v.isdigit() and int(v) > 0 for v in args.hidden.split(",")
    ):
        parser.error(f"--hidden {args.hidden!r}: positive integers, comma-separated")
    if args.hidden is None:
        sizes = "4096,8192,14336"
        args.hidden = {
            "fp8": sizes,
            "big": "65536",
            "bf16p": sizes,
            "bwd2": sizes,
            "onered": "4096,8192,14336,65536",
            "big2": "65536",
            "srows": sizes,
        }.get(args.candidates, "4096,8192,14336,65536")
    if args.list:
        try:
            for case in case_list(args, arch="sm_90"):
                print(*case[:4], case[4].tag, ",".join(f"{k}={v}" for k, v in case[5]))
        except BrokenPipeError:  # e.g. | head: stop quietly (no flush of the closed pipe)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    import torch

    import nvrtc_engine as ne
    from nvrtc_engine.engine import Engine

    started = time.perf_counter()
    copy = common.copy_bandwidth_gbps()
    host_defaults = {name: getattr(norm_switches, name) for name in ("BWD_CTAS_PER_SM",
                                                            "FWD_GROUPS_PER_CTA",
                                                            "PERSISTENT_BALANCED")}  # fmt: skip
    bf16 = torch.bfloat16
    scale = torch.full((1,), 2.0, device="cuda")
    amax = torch.zeros(1, device="cuda")
    scale_inv = torch.empty(1, device="cuda")
    results: dict[tuple, list[float]] = {}
    meta: dict[tuple, dict] = {}

    def sweep(h: int) -> None:
        """Every case at hidden size ``h``, ``args.rounds`` times, on one set of buffers."""
        n = args.big_tokens if h >= 65536 else args.tokens
        x = torch.randn(n, h, device="cuda").to(bf16)
        x += torch.randn(n, 1, device="cuda").to(bf16) * 3  # row offsets
        dz = torch.randn(n, h, device="cuda").to(bf16)
        z, dx = torch.empty_like(x), torch.empty_like(x)
        z8 = torch.empty(n, h, dtype=torch.float8_e4m3fn, device="cuda")
        mu, rs = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        w = (torch.randn(h, device="cuda") * 0.1 + 1).to(bf16)
        b = (torch.randn(h, device="cuda") * 0.1).to(bf16)
        dw, db = torch.empty_like(w), torch.empty_like(b)
        fp8 = {"scale": scale, "amax": amax, "scale_inv": scale_inv}
        defaults: dict[tuple, Any] = {}
        cases = case_list(args, [h], defaults)
        compiled: dict[tuple, Any] = {}
        if args.versus_compile:
            from families.norm import torch_fns

            for group in dict.fromkeys(c[:4] for c in cases):
                nm, _, direction, out = group
                name = "bwd" if direction == "bwd" else ("fwd" if out == "bf16" else "fwd_fp8")
                compiled[group] = common.fresh_compile(torch_fns(nm, h)[name], dynamic=False)
                cases.append((*group, COMPILED, ()))
        kernels: dict[tuple, Any] = {}
        workspaces: dict[tuple, Any] = {}
        for rnd in range(args.rounds):
            order = list(cases)
            if args.shuffle:
                random.Random(rnd).shuffle(order)
            for case in order:
                nm, _, direction, out, cfg, host = case
                ln = nm == "layernorm"
                if cfg is COMPILED:
                    f = compiled[case[:4]]
                    if direction == "bwd":
                        a = (dz, x, mu[:, None], rs[:, None], w, b) if ln else (dz, x, rs, w)
                    else:
                        a = (x, w, b) if out == "bf16" else (x, w, b, scale, amax, scale_inv, z8)
                    nbytes = (
                        n * h * (3 * 2 if direction == "bwd" else 2 + (1 if out != "bf16" else 2))
                    )
                    ms = common.cuda_time_ms(lambda f=f, a=a: f(*a), repeat=args.repeat)
                    results.setdefault(case, []).append(ms)
                    meta[case] = {"bytes": nbytes, "symbol": "", "tokens": n, "default": False}
                    continue
                kkey = case[:5]
                if kkey not in kernels:
                    try:
                        extra = {"scaling": "tensor"} if out != "bf16" else {}
                        with common.norm_layout(cfg):
                            kernels[kkey] = Engine().get(ne.make_key(
                                f"{nm}_{direction}", in_dtype="bf16", out_dtype=out,
                                hidden_size=h, **extra,
                            ))  # fmt: skip
                    except Exception as exc:  # e.g. a layout over the register budget
                        kernels[kkey] = None
                        print(f"{case}: {type(exc).__name__}: {exc}"[:300])
                k = kernels[kkey]
                if k is None:
                    continue
                for name, value in {**host_defaults, **dict(host)}.items():
                    setattr(norm_switches, name, value)
                k._prepared.clear()  # host settings change the grid: no prepared launch
                call = k
                if direction == "fwd":
                    zz, kw = (z8, fp8) if out != "bf16" else (z, {})
                    args_ = (x, w, b, EPS, zz, mu, rs) if ln else (x, w, EPS, zz, rs)
                    nbytes = n * h * (2 + (1 if out != "bf16" else 2))
                    if args.zero_amax and out != "bf16":

                        def call(*a: Any, k: Any = k, **kw: Any) -> Any:
                            amax.zero_()
                            return k(*a, **kw)
                else:
                    if case not in workspaces:
                        dev = torch.cuda.current_device()
                        elements = k.workspace_elements(n, h, device=dev)
                        workspaces[case] = torch.empty(max(1, elements), device="cuda")
                    kw = {"workspace": workspaces[case]}
                    args_ = (dz, x, mu, rs, w, dx, dw, db) if ln else (dz, x, rs, w, dx, dw)
                    nbytes = 3 * n * h * 2
                ms = common.cuda_time_ms(lambda k=call, a=args_, kw=kw: k(*a, **kw),
                                         repeat=args.repeat)  # fmt: skip
                for name, value in host_defaults.items():
                    setattr(norm_switches, name, value)
                results.setdefault(case, []).append(ms)
                is_default = cfg == defaults[(nm, direction, out)] and all(
                    host_defaults.get(name) == value for name, value in host
                )
                meta[case] = {"bytes": nbytes, "symbol": k.artifact.symbols[0], "tokens": n,
                              "default": is_default}  # fmt: skip
            print(f"H={h} round {rnd + 1}/{args.rounds} done ({len(cases)} cases, "
                  f"{time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip

    for h in (int(v) for v in args.hidden.split(",")):
        sweep(h)
        torch.cuda.empty_cache()
    rows_out = []
    for case, times in results.items():
        nm, h, direction, out, cfg, host = case
        ms = statistics.median(times)
        nbytes = meta[case]["bytes"]
        rows_out.append({
            "norm": nm, "hidden": h, "tokens": meta[case]["tokens"], "direction": direction,
            "out": "fp8" if out != "bf16" else out, "config": cfg.tag,
            "host": ",".join(f"{k}={v}" for k, v in host), "default": meta[case]["default"],
            "ms_rounds": times, "ms": ms, "pct": 100 * nbytes / (ms * 1e-3) / 1e9 / copy,
            "symbol": meta[case]["symbol"],
        })  # fmt: skip
    same_round(rows_out, lambda r: r["default"], "vs_default", "faster_rounds")
    same_round(rows_out, lambda r: r["config"] == COMPILED.tag, "vs_compile",
               "faster_than_compile")  # fmt: skip
    rows_out.sort(key=lambda r: (r["norm"], r["hidden"], r["direction"], r["out"], r["ms"]))
    info = {**common.gpu_info(), "copy_gbps": copy, "rounds": args.rounds,
            "candidates": args.candidates, "zero_amax": args.zero_amax,
            "repeat": args.repeat, "shuffle": args.shuffle,
            "seconds": time.perf_counter() - started}  # fmt: skip
    path = common.write_results(args.name, {**info, "rows": rows_out})
    shown = []
    for i, r in enumerate(rows_out):
        group = (r["norm"], r["hidden"], r["direction"], r["out"])
        rank = sum((q["norm"], q["hidden"], q["direction"], q["out"]) == group
                   for q in rows_out[:i])  # fmt: skip
        if rank < 4 or r["default"] or r["config"] == COMPILED.tag:
            shown.append({**r, "mark": "*" if r["default"] else ""})
    print(f"device copy {copy:.0f} GB/s; * = current default")
    columns = [("norm", "norm", ""), ("hidden", "H", ""), ("direction", "dir", ""),
               ("out", "out", ""), ("config", "config", ""), ("host", "host", ""),
               ("mark", "", ""), ("ms", "ms", ".4f"), ("pct", "% copy", ".1f"),
               ("vs_default", "x default", ".4f"), ("faster_rounds", "won", ".2f")]  # fmt: skip
    if args.versus_compile:
        columns += [("vs_compile", "x compile", ".4f"), ("faster_than_compile", "beat", ".2f")]
    print(common.table(shown, columns))
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
