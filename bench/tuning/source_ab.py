"""A/B of small edits to a norm forward kernel's rendered source, in paired rounds beside
torch.compile of the same op: what an instruction-level change is worth before it goes into
a template.

    python bench/tuning/source_ab.py [--cases rmsnorm:8192,layernorm:14336] [--out bf16,fp8]
                              [--variants base,notrigger] [--rounds 20] [--name source_ab]

Needs PyTorch with a GPU (``pip install -e '.[test,torch]'``); the arguments are checked first,
and every variant's edits against every case's kernel rendered for sm_90 (no GPU needed).
``--cases`` lists NORM:H (NORM layernorm or rmsnorm, H the hidden size); ``--out`` bf16, fp8
(tensor scaling) or both; ``--variants`` names what to compare, each a ``+``-joined list of
edits (below) and at most one ``@TAG``; ``base`` is the kernel as rendered.

Each variant compiles the case's default kernel (norm.launch_config: TUNED or the rules), or
the layout a ``@TAG`` in it names (e.g. ``@w7r1v8j8c1qft4+cp256``), from its rendered source
with the named edits applied (:data:`EDITS`: plain text replacements in
the source or the helper headers), on an engine
without a disk cache. Every round times each variant and torch.compile once, in a shuffled
order (common.paired_ms), each call on its own buffers (norm_bandwidth.Cycle: at least
256 MB per cycle, so nothing is served from L2); ``vs_base`` and ``vs_compile`` are
same-round ratios (above 1: faster); ``same_results`` whether one call of the variant gives
the first variant's z bytes, rsigma, amax and mu bit for bit. bf16 x, N = 16384 rows (2048
at H = 65536). Writes bench/results/NAME.json (and $OUT/NAME.json when set), with the digest
of the templates it rendered (``templates_digest``: which version of the kernels ``base``
was).

The edits:
  - ``trigger``: ``griddepcontrol.launch_dependents`` at the start of every CTA, in a kernel
    that does not have it (an error where it does): the next call's grid launches once the
    last CTA has started, and its CTAs take the slots that the last wave frees, waiting in
    ``griddepcontrol.wait`` (which still waits for this grid to complete and flush, so the
    results cannot change). The templates have it in the staged kernels and the register
    forwards of one row group per CTA (``norm._triggers``; the first run of this script, on
    2026-12-03, added it to the register forwards, which had none then);
  - ``notrigger``: the template's trigger taken out;
  - ``fmacenter``: the LayerNorm output stage's ``(x - mu) * rsigma`` as ``x * rsigma +
    (-mu * rsigma)``, one FFMA per element instead of a FADD and a FMUL (-mu * rsigma once per
    row); as the shifted statistics' (``z``) output stage does. The rounding differs: an
    absolute error up to ``|mu| * rsigma * 2^-24`` in units of the normalized value, of the
    size the fp32 mean's own rounding already carries into every ``x - mu``;
  - ``cp256``: the staged kernels' 16-byte ``cp.async`` copies ask L2 to fetch 256 bytes
    (``.L2::256B``) rather than 128;
  - ``cpnohint``: the same copies without the L2 prefetch hint;
  - ``noamax``, ``noscale`` (diagnostics: the results are wrong): the FP8 output stage without
    its amax update (one FMNMX per element) or without the scale multiply (one FMUL per
    element), to see what those instructions cost in time: where taking them out changes
    nothing, the kernel is not bound by issuing them;
  - ``cpevictfirst``: the staged kernels' 16-byte ``cp.async`` row copies under an L2
    evict-first policy (``createpolicy.fractional.L2::evict_first``, ``.L2::cache_hint``):
    x is read once, so its lines may leave L2 before the output's; ``cpevictlast`` and
    ``cpevictnormal`` the same with ``evict_last`` and ``evict_normal`` (the hint's own cost);
  - ``stevictfirst``, ``stevictlast``: the 8-byte vector stores (z of the FP8 forwards with
    ``q``) under an L2 ``evict_first`` or ``evict_last`` policy (``st.global.L2::cache_hint``);
  - ``latefill`` (the staged forward of one row per CTA with ``i``): each row's refill
    issued after the row's first block barrier instead of first thing; ``earlyfill`` (the
    same kernels) issues it before the wait for the row's own copies instead of after it
    (each thread refills only its own slots, which it has finished reading);
  - ``tma`` (the same kernels): ``latefill``, and each stage filled by one bulk copy of the
    row (``cp.async.bulk``, the Tensor Memory Accelerator) that one thread issues, completing
    on an mbarrier per stage that every thread waits on, instead of each thread's 16-byte
    ``cp.async`` copies (aligned x; the element-by-element path as before);
  - ``dynrows``, ``dynrows8``, ``dynrows32`` (the staged LayerNorm forward of one row per CTA
    with ``i``): a CTA's rows after its first D + 3 taken from a ticket counter at run time (1,
    8 or 32 counters, each for a shard of the rows and of the CTAs), so that the CTAs that run
    faster take more rows (``DYN_*`` below; bench-only counters, one launch at a time);
    ``dynstatic32`` and ``dynatomic32`` (diagnostics): dynrows32's code with static tickets
    (a persistent grid's rows within each shard), without and with the atomic;
    ``align16``: a staged kernel with ``A`` (the stages on a 128-byte boundary) with them on a
    16-byte one, as without ``A`` (where the static shared memory before them leaves them);
    ``align256``, ``align512``: with them on a 256- or 512-byte boundary (timed 2026-12-05: level);
    ``red4``, ``red8``, ``red12``, ``red16``, ``red20``, ``red24`` (diagnostics): the reduction
    buffer 4-24 floats longer, so the dynamic shared memory after it starts 16-96 bytes further
    on (on a kernel without ``A``: with it the stages stay on their 128-byte boundary). Round
    25 measured 4, 8 and 24; 12 and 20 put the stages 16 bytes off a 32-byte boundary as 4 did,
    16 on one, to tell a 32-byte sector from other offsets (timed 2026-12-05: 12 and 20 lose
    13-16%, 16 does not);
    ``dynstatic1`` dynrows' code with static tickets (the rows of ``base``), ``dynstatic1r``
    the same without the count of CTAs done at the end, ``dynloop1`` only its loop over a ring
    of row groups that every thread works out (no tickets, no shared-memory post);
  - ``latetrigger``: in a staged forward without the trigger, ``griddepcontrol.launch_dependents``
    when a CTA starts its last row rather than not at all (the next call's grid launches once
    every CTA is in its last row);

Every occurrence of an edit's text is replaced; an edit none of whose texts is found is an
error (``earlyfill``, ``latefill``, ``tma`` and the ``dynrows`` edits: any of whose texts is
not found exactly once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"  # the key does not see the edits

import common
from families.norm import EPS, Cycle, kernel_forward, torch_fns, torch_forward

WAIT = "nve::grid_dependency_wait();  // before any access to global memory (see nve_memory.cuh)\n"

TRIGGER = (
    "  nve::launch_dependents();  // the next grid launches once every CTA of this one has "
    "started\n"
)
INCLUDE = '#include "nve_types.cuh"'
CP_ASYNC = "cp.async.cg.shared.global.L2::128B"

# the staged kernels' 16-byte row copies (cp_async_16_policy: the same under an L2 policy)
CP_ASYNC_16 = '"cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(d), "l"(src)'


def cp_async_16_policy(policy: str) -> str:
    """CP_ASYNC_16 under the L2 policy ``policy`` (``evict_first``, ``evict_last``, ...)."""
    return ('"{\\n .reg .b64 pol;\\n createpolicy.fractional.L2::' + policy + '.b64 pol, 1.0;\\n '
            'cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, pol;\\n}" '
            '::"r"(d), "l"(src)')  # fmt: skip


# the plain vector store of nve::store_vec (z of the FP8 forwards with q: 8 bytes a thread)
STORE_VEC = "  reinterpret_cast<vec<S, N>*>(p)[chunk] = t;\n}"


def store_8_policy(policy: str) -> str:
    """STORE_VEC with its stores of two 32-bit words under the L2 policy ``policy``."""
    return ("  if constexpr (sizeof(vec<S, N>) == 8 && sizeof(S) == 4) {\n"
            '    asm volatile("{\\n .reg .b64 pol;\\n createpolicy.fractional.L2::' + policy
            + '.b64 pol, 1.0;\\n st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, pol;\\n}" '
            '::"l"(reinterpret_cast<vec<S, N>*>(p) + chunk), "r"(t.v[0]), "r"(t.v[1]) '
            ': "memory");\n'
            "    return;\n"
            "  }\n" + STORE_VEC)  # fmt: skip


# The staged forward of one row per CTA (C == 1, R == 1: the CTA's stage of a row is the row,
# contiguous): ``latefill`` issues each row's refill after the row's first block barrier
# instead of first thing (every thread has then finished the previous row, so the stage
# refilled is free whoever reads it); ``tma`` does that and fills the stage by one bulk copy
# (``cp.async.bulk``, the Tensor Memory Accelerator) that one thread issues, whose bytes
# complete on an mbarrier per stage, instead of each thread's 16-byte cp.async copies.
STAGED_LOOP_TOP = (
    "    cp_wait<D - 1>();  // this row's copies (and the weights') have landed\n"
    "    issue(grp + D * step, refill_stage(st));\n"
)
EARLY_REFILL = (
    "    issue(grp + D * step, refill_stage(st));  // (earlyfill: before the wait)\n"
    "    cp_wait<D>();  // this row's copies have landed (the refill's may not have)\n"
)
STAGED_FIRST_SUM = "      mean = t[0] * kInvH;\n    }\n"
LATE_REFILL = STAGED_FIRST_SUM + "    issue(grp + D * step, refill_stage(cur));  // (latefill)\n"
ISSUE_HEAD = (
    "  auto issue = [&](long long group, int st) {\n"
    "    const long long row = group * R + slot;\n"
    "    if (row < rows) {  // (past the last group, every slot's row is past the last row)\n"
    "      if (kAsyncIn && v) {\n"
)
TMA_HEAD = (
    '  static_assert(R == 1 && C == 1, "tma: one row per CTA");\n'
    "  __shared__ __align__(8) unsigned long long tma_bar[S];\n"
    "  if (threadIdx.x == 0) {\n"
    "    for (int s = 0; s < S; ++s) nve::mbar_init(&tma_bar[s], 1);\n"
    '    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");\n'
    "  }\n"
    "  __syncthreads();\n"
    "  auto issue = [&](long long group, int st) {\n"
    "    const long long row = group * R + slot;\n"
    "    if (row < rows) {  // (past the last group, every slot's row is past the last row)\n"
    "      if (kAsyncIn && v) {\n"
    "        if (threadIdx.x == 0) {  // (tma) the whole row, one bulk copy\n"
    '          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n'
    "          nve::mbar_expect_tx(&tma_bar[st], H * sizeof(In::storage));\n"
    '          asm volatile("cp.async.bulk.shared::cluster.global"\n'
    '                       ".mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"\n'
    '                       ::"r"(nve::smem_address(sx + st * kShare)), "l"(x + row * H),\n'
    '                       "r"(static_cast<unsigned>(H * sizeof(In::storage))),\n'
    '                       "r"(nve::smem_address(&tma_bar[st])) : "memory");\n'
    "        }\n"
    "      } else if (false) {  // (tma: the per-thread copies, not made)\n"
)
TMA_LOOP_TOP = (
    "    if (kAsyncIn && v) {\n"
    "      nve::mbar_wait(&tma_bar[st], static_cast<unsigned>(tma_it / S) & 1);  // (tma)\n"
    "    } else {\n"
    "      cp_wait<D - 1>();\n"
    "    }\n"
    "    ++tma_it;\n"
)
TMA_COUNTER = ("  int st = 0;\n", "  int st = 0;\n  long long tma_it = 0;  // (tma) rows taken\n")
STAGED_INCLUDE = '#include "nve_reduce.cuh"\n'


# the staged forward's refill of a stage, once per row; LATE_TRIGGER follows it
REFILL = "    issue(grp + D * step, refill_stage(st));\n"
LATE_TRIGGER = "    if (grp + step >= groups) nve::launch_dependents();  // (latetrigger)\n"

# ``dynrows``, ``dynrowsN`` (the staged LayerNorm forward of one row per CTA): rows handed out
# at run time. The row groups are dealt into N shards (1 for ``dynrows``; shard k: groups k, k
# + N, ...) and the CTAs likewise (CTA i to shard i % N), each shard with a ticket counter of its
# own (128 bytes apart). A CTA takes its shard's first D + 3 groups as a persistent grid would
# (its c-th CTA of n: local groups c, c + n, ...), then each next one from its shard's counter:
# at the top of row r thread 0 takes a ticket (one atomicAdd) for row r + D + 3 and posts in
# shared memory the group of row r + D + 2 (its ticket of the row before), which every thread
# reads after the row's first block barrier; the ticket's latency has a row to pass. A CTA that
# runs faster takes more rows, and a shard's CTAs end together. The counters are
# ``__device__`` words of the module, put back to 0 by the last CTA to end: right for one launch
# at a time per module (a bench), not for a library kernel that two streams may run at once.
DYN_SHARDS = {"dynrows": 1, "dynrows8": 8, "dynrows32": 32}
# Diagnostics of dynrows32 (same rows as base): ``dynstatic32`` its code with each ticket
# replaced by the one a static assignment gives (no atomic), ``dynatomic32`` the same with the
# atomic still taken and its result waited for where dynrows32 waits for it (used in a
# comparison that never holds: the counters stay far below 2^32 - 16).
DYN_TICKET = "      dyn_ticket = atomicAdd(&nve_dyn_next[dyn_k * 32], 1u);\n"
DYN_STATIC_TICKET = (
    "      dyn_ticket = static_cast<unsigned>(dyn_c + dyn_r * dyn_n);  // (dynstatic)\n"
)
DYN_ATOMIC_TICKET = (
    "      dyn_ticket = static_cast<unsigned>(dyn_c + dyn_r * dyn_n)  // (dynatomic)\n"
    "          + (atomicAdd(&nve_dyn_next[dyn_k * 32], 1u) > 0xFFFFFFEFu ? 1u : 0u);\n"
)
DYN_FIRST = "#pragma unroll\n  for (int k = 0; k < D; ++k) issue(pos.cluster + k * step, k);\n"
DYN_LOOP = "  for (long long grp = pos.cluster; grp < groups; grp += pos.nclusters) {\n"
DYN_REFILL = (
    "    issue(dq[D], refill_stage(st));\n"
    "    if (threadIdx.x == 0) {  // (dynrows) row r + D + 2's group; a ticket for r + D + 3\n"
    "      dyn_box[dyn_r & 1] = dyn_r == 0 ? dyn_group(dyn_c + (D + 2) * dyn_n)\n"
    "                                      : dyn_group((D + 3) * dyn_n + dyn_ticket);\n"
    "      dyn_ticket = atomicAdd(&nve_dyn_next[dyn_k * 32], 1u);\n"
    "    }\n"
)
DYN_READ = (
    STAGED_FIRST_SUM
    + "    const long long dyn_nxt = dyn_box[dyn_r & 1];  // (dynrows) r + D + 2's\n"
)
DYN_LOOP_END = "  }\n  if (prev >= 0) emit_deferred(parity - 1);\n"
DYN_SHIFT = (
    "#pragma unroll\n"
    "    for (int k = 0; k < D + 1; ++k) dq[k] = dq[k + 1];  // (dynrows)\n"
    "    dq[D + 1] = dyn_nxt;\n"
    "    ++dyn_r;\n" + DYN_LOOP_END
)
DYN_END = "  if (blockIdx.x == 0 && threadIdx.x == 0 && scale_inv_ptr != nullptr)"


def dyn_edit(shards: int, ticket: str = DYN_TICKET, box: bool = True,
             reset: bool = True) -> list[tuple[str, str, str]]:  # fmt: skip
    """The ``dynrows`` edit over ``shards`` ticket counters, each ticket taken by ``ticket``.
    Diagnostics: without ``box`` every thread works out the static rows itself (no ticket,
    no shared-memory post), without ``reset`` no CTA counts itself done at the end (right only
    where no ticket is taken from a counter)."""
    decl = (
        f"// (bench/source_ab.py, dynrows) {shards} ticket counter(s), 128 bytes apart, and the\n"
        "// count of CTAs done\n"
        f"__device__ unsigned nve_dyn_next[{shards} * 32];\n__device__ unsigned nve_dyn_done;\n"
    )
    first = (
        "  // (dynrows) this CTA's shard k of ns, its index c among the shard's n CTAs, and the\n"
        "  // groups of its rows r .. r + D + 1 (the shard's local groups c, c + n, ..., then\n"
        "  // tickets)\n"
        f"  const int dyn_ns = gridDim.x < {shards} ? gridDim.x : {shards};\n"
        "  const int dyn_k = blockIdx.x % dyn_ns;\n"
        "  const long long dyn_c = blockIdx.x / dyn_ns;\n"
        "  const long long dyn_n = (gridDim.x - dyn_k + dyn_ns - 1) / dyn_ns;\n"
        "  auto dyn_group = [&](long long j) { return dyn_k + j * dyn_ns; };\n"
        "  long long dq[D + 2];\n"
        "#pragma unroll\n"
        "  for (int k = 0; k < D + 2; ++k) dq[k] = dyn_group(dyn_c + k * dyn_n);\n"
        "  __shared__ long long dyn_box[2];\n"
        "  unsigned dyn_ticket = 0;\n"
        "  int dyn_r = 0;\n"
        "#pragma unroll\n"
        "  for (int k = 0; k < D; ++k) issue(dq[k], k);\n"
    )
    loop = "  while (dq[0] < groups) {\n    const long long grp = dq[0];\n"
    done = (
        "  if (threadIdx.x == 0) {  // (dynrows) the last CTA to end puts the counters back\n"
        "    // (its last ticket's value feeds the add, so that atomic has been done first)\n"
        "    const unsigned dyn_one = 1u + (dyn_ticket > 0xFFFFFFEFu ? 1u : 0u);\n"
        "    if (atomicAdd(&nve_dyn_done, dyn_one) == gridDim.x - 1) {\n"
        f"      for (int k = 0; k < {shards}; ++k) nve_dyn_next[k * 32] = 0;\n"
        "      nve_dyn_done = 0;\n"
        "    }\n"
        "  }\n" + DYN_END
    )
    edits = [("source", DYN_FIRST, first), ("source", DYN_LOOP, loop)]
    if box:
        edits += [("source", 'extern "C" __global__', decl + 'extern "C" __global__'),
                  ("source", REFILL, DYN_REFILL.replace(DYN_TICKET, ticket)),
                  ("source", STAGED_FIRST_SUM, DYN_READ),
                  ("source", DYN_LOOP_END, DYN_SHIFT)]  # fmt: skip
    else:
        local = "    dq[D + 1] = dyn_group(dyn_c + (dyn_r + D + 2) * dyn_n);  // (dynloop)\n"
        edits += [("source", REFILL, "    issue(dq[D], refill_stage(st));\n"),
                  ("source", DYN_LOOP_END, DYN_SHIFT.replace("    dq[D + 1] = dyn_nxt;\n",
                                                             local))]  # fmt: skip
    if reset:
        edits.append(("source", DYN_END, done))
    return edits


# edits whose every text must be found exactly once (a part of one alone would break the kernel)
# the dynrows edits and their diagnostics (none applies unless all of its parts do)
DYN_EDITS = {
    **{name: dyn_edit(shards) for name, shards in DYN_SHARDS.items()},
    "dynstatic1": dyn_edit(1, DYN_STATIC_TICKET),
    "dynstatic1r": dyn_edit(1, DYN_STATIC_TICKET, reset=False),
    "dynloop1": dyn_edit(1, box=False, reset=False),
    "dynstatic32": dyn_edit(32, DYN_STATIC_TICKET),
    "dynatomic32": dyn_edit(32, DYN_ATOMIC_TICKET),
}
WHOLE_EDITS = ("earlyfill", "latefill", "tma", *DYN_EDITS)

# name: [(where: "source" or "headers", text, replacement), ...]
EDITS: dict[str, list[tuple[str, str, str]]] = {
    "base": [],
    "trigger": [("source", WAIT, WAIT + "  nve::launch_dependents();\n")],
    "notrigger": [("source", TRIGGER, "")],
    "fmacenter": [("source", f"zf[i] = fmaf(({x} - mean) * rs,",
                   f"zf[i] = fmaf(fmaf({x}, rs, -mean * rs),") for x in ("xf[j][i]", "xq[i]")],
    "cp256": [("source", CP_ASYNC, "cp.async.cg.shared.global.L2::256B")],
    "noamax": [("source", "amax = fmaxf(amax, fabsf(zf[i]));", "")],
    "noscale": [("source", "zf[i] *= scale;", "")],
    "cpnohint": [("source", CP_ASYNC, "cp.async.cg.shared.global")],
    "cpevictfirst": [("source", CP_ASYNC_16, cp_async_16_policy("evict_first"))],
    "cpevictlast": [("source", CP_ASYNC_16, cp_async_16_policy("evict_last"))],
    "cpevictnormal": [("source", CP_ASYNC_16, cp_async_16_policy("evict_normal"))],
    "latetrigger": [("source", REFILL, REFILL + LATE_TRIGGER)],
    "earlyfill": [("source", STAGED_LOOP_TOP, EARLY_REFILL)],
    "latefill": [("source", STAGED_LOOP_TOP, STAGED_LOOP_TOP.splitlines(True)[0]),
                 ("source", STAGED_FIRST_SUM, LATE_REFILL)],
    "tma": [("source", STAGED_INCLUDE, STAGED_INCLUDE + '#include "nve_cluster.cuh"\n'),
            ("source", ISSUE_HEAD, TMA_HEAD),
            ("source", STAGED_LOOP_TOP, TMA_LOOP_TOP),
            ("source", STAGED_FIRST_SUM, LATE_REFILL),
            ("source", *TMA_COUNTER)],
    "stevictfirst": [("headers", STORE_VEC, store_8_policy("evict_first"))],
    "stevictlast": [("headers", STORE_VEC, store_8_policy("evict_last"))],
}  # fmt: skip
EDITS.update(DYN_EDITS)
# ``redN`` (diagnostic): N floats more of static shared memory (the forwards' reduction
# buffer), which moves the dynamic shared memory (the staged kernels' stages) N * 4 bytes on.
RED = "  __shared__ float red[kRedFloats];\n"
for _pad in (4, 8, 12, 16, 20, 24):
    EDITS[f"red{_pad}"] = [("source", RED, f"  __shared__ float red[kRedFloats + {_pad}];\n")]
# ``align16``: a staged kernel with ``A`` (STAGED_ALIGNED, TUNED's LayerNorm FP8 4096 and
# 14336) with its stages on a 16-byte boundary, as without ``A``. Round 25 ran it while the
# template gave every staged kernel the 128-byte boundary (source_ab-align16.json).
# ``align256``, ``align512``: the same kernels with the stages on a 256- or 512-byte boundary
# (untimed so far: does the gain at LayerNorm FP8 4096 and 14336 grow past 128?).
for _align in (16, 256, 512):
    EDITS[f"align{_align}"] = [
        ("source", "extern __shared__ __align__(128) unsigned char staged[];",
         f"extern __shared__ __align__({_align}) unsigned char staged[];")]  # fmt: skip


def parse_cases(text: str) -> list[tuple[str, int]]:
    """``--cases``' NORM:H,... as (norm, H) pairs; ValueError naming a bad item."""
    cases = []
    for case in text.split(","):
        norm, _, h = case.partition(":")
        if norm not in ("layernorm", "rmsnorm") or not h.isdigit():
            raise ValueError(f"case {case!r}: expected layernorm:H or rmsnorm:H")
        cases.append((norm, int(h)))
    return cases


def check_edits(names: list[str]) -> None:
    """ValueError unless ``names`` are known edits and at most one ``@TAG`` (a layout
    norm.parse_tag reads); ``base`` (the kernel as rendered, no edit) only alone, which a
    caller passes as no names."""
    import nvrtc_engine.ops.norm as norm

    if "base" in names:
        raise ValueError(f"{'+'.join(names)}: 'base' is the kernel as rendered, not an edit; "
                         "give it alone")  # fmt: skip
    tags = [n for n in names if n.startswith("@")]
    unknown = [n for n in names if n not in EDITS and not n.startswith("@")]
    if unknown:
        raise ValueError(f"unknown edit(s) {unknown}; known: {', '.join(EDITS)}")
    if len(tags) > 1:
        raise ValueError(f"one @TAG per variant, not {tags}")
    for tag in tags:
        norm.parse_tag(tag[1:])  # ValueError with the expected form


def edited(rendered: Any, names: list[str]) -> Any:
    """``rendered`` (a RenderedSource) with the edits of ``names`` applied; ValueError when an
    edit's text is not there."""
    import dataclasses

    check_edits(names)
    source, headers = rendered.source, list(rendered.headers)
    for name in names:
        if name == "trigger" and "nve::launch_dependents();" in source:
            raise ValueError(f"edit 'trigger': {rendered.name} already triggers (notrigger "
                             "takes it out)")  # fmt: skip
        applied = 0
        for where, old, new in EDITS[name]:
            if where == "source":
                found = source.count(old)
                source = source.replace(old, new)
            else:
                found = 0
                for i, (header, text) in enumerate(headers):
                    found += text.count(old)
                    headers[i] = (header, text.replace(old, new))
            if name in WHOLE_EDITS and found != 1:
                raise ValueError(f"edit {name!r} applies to the staged forward of one row per "
                                 f"CTA with i, not to {rendered.name} (a text found {found} "
                                 "times where it needs 1)")  # fmt: skip
            applied += found
        if not applied:
            raise ValueError(f"edit {name!r}: none of its text is in {rendered.name}")
    return dataclasses.replace(rendered, source=source, headers=tuple(headers))


def case_key(norm: str, h: int, out: str, arch: str | None = None) -> Any:
    """The forward key of a case: bf16 x, ``h`` columns, bf16 z or (``out`` fp8) E4M3 with
    tensor scaling; ``arch`` None: the GPU's. VariantError for a hidden size out of range."""
    import nvrtc_engine as ne

    extra = {"out_dtype": "fp8", "scaling": "tensor"} if out == "fp8" else {}
    return ne.make_key(f"{norm}_fwd", in_dtype="bf16", hidden_size=h, arch=arch, **extra)


def check_variants(cases: list[tuple[str, int]], outs: list[str], variants: list[list[str]],
                   arch: str = "sm_90") -> None:  # fmt: skip
    """ValueError unless every variant (a list of edit names and at most one ``@TAG``; []
    for ``base``) applies to every case's kernel, rendered for ``arch`` (no GPU, no
    compile): an edit of code the kernel lacks (a staged edit on a register layout, ``align16``
    on a kernel without ``A``) is found here, before any timing."""
    import nvrtc_engine.engine as engine_mod
    import nvrtc_engine.ops.norm as norm

    for norm_name, h in cases:
        for out in outs:
            key = case_key(norm_name, h, out, arch)
            for names in variants:
                tags = [n[1:] for n in names if n.startswith("@")]
                with common.norm_layout(norm.parse_tag(tags[-1]) if tags else None):
                    rendered = engine_mod.render(key)
                try:
                    edited(rendered, [n for n in names if not n.startswith("@")])
                except ValueError as exc:
                    raise ValueError(f"case {norm_name}:{h} --out {out}: {exc}") from None


def build(key: Any, names: list[str]) -> Any:
    """``key``'s kernel compiled from its edited source, on a fresh memory-only engine; a name
    ``@TAG`` compiles the layout TAG (norm.parse_tag) instead of the key's default."""
    import nvrtc_engine.engine as engine_mod
    import nvrtc_engine.ops.norm as norm

    common.memory_only()  # the key does not see the edits
    plain = engine_mod.render
    tags = [n[1:] for n in names if n.startswith("@")]
    edits = [n for n in names if not n.startswith("@")]
    engine_mod.render = lambda k: edited(plain(k), edits)
    try:
        with common.norm_layout(norm.parse_tag(tags[-1]) if tags else None):
            return engine_mod.Engine().get(key)
    finally:
        engine_mod.render = plain


def bench_case(norm: str, h: int, out: str, variants: list[str], rounds: int) -> dict:
    import torch

    n = 2048 if h >= 65536 else 16384
    ln = norm == "layernorm"
    fp8 = out == "fp8"
    bf16 = torch.bfloat16
    w = (torch.randn(h, device="cuda") * 0.1 + 1).to(bf16)
    b = (torch.randn(h, device="cuda") * 0.1).to(bf16)
    scale = torch.full((1,), 2.0, device="cuda")
    amax, scale_inv = torch.zeros(1, device="cuda"), torch.empty(1, device="cuda")

    def make() -> dict[str, Any]:
        x = torch.randn(n, h, device="cuda").to(bf16)
        z = torch.empty(n, h, dtype=torch.float8_e4m3fn if fp8 else bf16, device="cuda")
        mu, rs = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        return {"x": x, "z": z, "mu": mu, "rs": rs}

    cycle = Cycle(make, 2 * n * h * 2)
    key = case_key(norm, h, out)
    fp8_kw = {"scale": scale, "amax": amax, "scale_inv": scale_inv} if fp8 else {}
    fns: dict[str, Any] = {}
    symbols: dict[str, str] = {}
    results: dict[str, tuple[Any, ...]] = {}

    def outputs(k: Any) -> tuple[Any, ...]:
        """z's bytes, mu, rsigma and the amax of one call on the first buffer set, whose
        outputs are first filled with a pattern no row leaves (so a row the call skipped does
        not show the bytes an earlier variant wrote)."""
        s = cycle.sets[0]
        amax.zero_()
        s["z"].view(torch.uint8).fill_(0x7F)  # (z is compared by its bytes)
        s["mu"].fill_(float("nan"))
        s["rs"].fill_(float("nan"))
        if ln:
            k(s["x"], w, b, EPS, s["z"], s["mu"], s["rs"], **fp8_kw)
        else:
            k(s["x"], w, EPS, s["z"], s["rs"], **fp8_kw)
        torch.cuda.synchronize()
        return (s["z"].view(torch.uint8).clone(), s["rs"].clone(), amax.clone(),
                *((s["mu"].clone(),) if ln else ()))  # fmt: skip

    for variant in variants:
        k = build(key, [] if variant == "base" else variant.split("+"))
        symbols[variant] = k.artifact.symbols[0]
        fns[variant] = kernel_forward(k, cycle, ln, w, b, **fp8_kw)
        results[variant] = outputs(k)
    first = results[variants[0]]
    same = {v: all(torch.equal(got, want) for got, want in zip(r, first, strict=True))
            for v, r in results.items()}  # fmt: skip
    results.clear()
    f = common.fresh_compile(torch_fns(norm, h)["fwd_fp8" if fp8 else "fwd"], dynamic=False)
    fns["torch.compile"] = torch_forward(f, cycle, w, b, **fp8_kw)
    times = common.paired_ms(fns, rounds=rounds, seed=h)
    vs_base = common.paired_ratios(times, "base") if "base" in fns else {}
    vs_compile = common.paired_ratios(times, "torch.compile")
    nbytes = n * h * (2 + (1 if fp8 else 2))
    rows = []
    for name, ts in times.items():
        ms = statistics.median(ts)
        rows.append({"norm": norm, "hidden": h, "out": out, "variant": name,
                     "kernel": symbols.get(name, ""), "ms": ms, "ms_rounds": ts,
                     "gbps": nbytes / (ms * 1e-3) / 1e9, "vs_base": vs_base.get(name),
                     "vs_compile": vs_compile[name], "same_results": same.get(name)})  # fmt: skip
    cycle.sets.clear()
    torch.cuda.empty_cache()
    return {"rows": rows}


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--cases", default="rmsnorm:8192,layernorm:14336",
                        help="NORM:H,... (default %(default)s)")  # fmt: skip
    parser.add_argument("--out", default="bf16", help="bf16, fp8 or bf16,fp8 (default bf16)")
    parser.add_argument("--variants", default="base,notrigger",
                        help="comma-separated; '+' joins edits and one @TAG; edits: "
                        + ", ".join(EDITS) + " (default %(default)s)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds (default 20)")
    parser.add_argument(
        "--name", type=common.result_name, default="source_ab", help="bench/results/NAME.json"
    )
    args = parser.parse_args()
    variants = args.variants.split(",")
    cases = []
    try:
        for v in variants:
            check_edits([] if v == "base" else v.split("+"))
        cases = parse_cases(args.cases)
        outs = args.out.split(",")
        if not set(outs) <= {"bf16", "fp8"}:
            raise ValueError(f"--out {args.out!r}: bf16, fp8 or bf16,fp8")
        if args.rounds < 1:
            raise ValueError("--rounds: at least 1")
        check_variants(cases, outs, [[] if v == "base" else v.split("+") for v in variants])
    except ValueError as exc:
        parser.error(str(exc))
    torch = common.torch_or_exit(parser)

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    rows = []
    for norm, h in cases:
        for out in outs:
            rows += bench_case(norm, h, out, variants, args.rounds)["rows"]
    for r in rows:
        r["pct_of_copy"] = 100 * r["gbps"] / copy
    from nvrtc_engine.render import templates_digest

    path = common.write_results(args.name, {**common.gpu_info(), "copy_gbps": copy,
                                            "rounds": args.rounds,
                                            "templates_digest": templates_digest(),
                                            "rows": rows})  # fmt: skip
    print(f"device copy {copy:.0f} GB/s; ratios are same-round medians (above 1: faster)")
    vs = [("vs_base", "x base", "median"), ("vs_compile", "x compile", "median"),
          ("vs_compile", "won vs compile", "faster")]  # fmt: skip
    shown = [{**r, **{f"{k}_{s}": (r[k] or {}).get(s) for k, _, s in vs}} for r in rows]
    print(common.table(shown, [("norm", "norm", ""), ("hidden", "H", ""), ("out", "out", ""),
                               ("variant", "variant", ""), ("ms", "ms", ".4f"),
                               ("pct_of_copy", "% copy", ".1f"), ("same_results", "same", ""),
                               *[(f"{k}_{s}", head, ".3f") for k, head, s in vs]]))  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
