"""How a norm variant maps rows to threads: :class:`LaunchConfig`, its tag, and
:func:`launch_config`, which picks one for a key from the rules and the measured settings of
:mod:`.norm_switches` (read through that module at call time, so patches to it apply once
``launch_config.cache_clear()`` has run). No GPU needed: the layout is part of the kernel's
symbol, chosen on the host before the source is rendered.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ..dtypes import DTYPES
from ..errors import ArgumentError, ArgumentTypeError
from ..key import KernelKey, arch_number
from . import norm_switches as sw

if TYPE_CHECKING:
    from .norm import NormSpec

__all__ = [
    "LaunchConfig",
    "fits_register_file",
    "gamma_dtype",
    "launch_config",
    "loop_threads_per_row",
    "next_row_fits",
    "norm_spec",
    "parse_tag",
    "shift_applies",
    "staged_counts",
    "staged_fits",
    "staged_layout",
    "staged_smem_bytes",
    "staged_weights_in_registers",
    "warp_stats_apply",
]


def norm_spec(key: KernelKey) -> NormSpec:
    """``key.spec`` as a :class:`~nvrtc_engine.ops.norm.NormSpec`;
    :class:`~nvrtc_engine.ArgumentTypeError` (a ``TypeError``) for anything but a norm key."""
    if not isinstance(key, KernelKey):
        raise ArgumentTypeError("key", f"a norm KernelKey is needed (a kernel's is kernel.key), "
                                       f"not {type(key).__name__}")  # fmt: skip
    if key.spec.family != "norm":
        raise ArgumentTypeError("key", f"{key.op} is not a norm op (family {key.spec.family!r})")
    return cast("NormSpec", key.spec)


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

    def __post_init__(self) -> None:
        """Check the fields (:class:`~nvrtc_engine.ArgumentError`, a ``ValueError``, for a
        range; :class:`~nvrtc_engine.ArgumentTypeError`, a ``TypeError``, for a type; both
        name the field and its tag letter), so that a layout built by hand fails here rather
        than in the compiler or at launch. Integers of other types (numpy's) are stored as
        ``int``."""
        problems = _field_problems(self)
        if problems:
            raise problems[0][0]("LaunchConfig", "; ".join(text for _, text in problems))

    @property
    def threads(self) -> int:
        """Threads per CTA of the main kernel."""
        return self.rows * 32 * self.warps if self.mode == "regs" else sw.LOOP_BLOCK

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


# LaunchConfig's counts in the register layouts: (field, tag letter, test, what is allowed).
# The upper bounds are the hardware's (32 resident CTAs per SM on sm_80 ... sm_100) or far
# above any layout that fits (256 accesses a thread; 32 stages; 1024 row groups), so that a
# mistyped count fails here rather than in the compiler.
_COUNT_RULES = (
    ("warps", "w", lambda n: 1 <= n <= 32, "1 to 32 warps per row"),
    ("rows", "r", lambda n: n >= 1, "at least 1 row per CTA"),
    ("vec", "v", lambda n: n in (1, 2, 4, 8, 16), "an access of 1, 2, 4, 8 or 16 elements"),
    ("iters", "j", lambda n: 1 <= n <= 256, "1 to 256 accesses per thread"),
    ("cluster", "c", lambda n: n in (1, 2, 4, 8), "a cluster of 1, 2, 4 or 8 CTAs"),
    ("accumulators", "a", lambda n: n in (1, 2, 4), "1, 2 or 4 partial sums"),
    ("shared_sums", "s", lambda n: n in (0, 1, 2), "0, 1 or 2 column-sum arrays"),
    ("stages", "t", lambda n: n == 0 or 2 <= n <= 32, "0 (not staged) or 2 to 32 rows deep"),
    ("min_ctas", "m", lambda n: 0 <= n <= 32, "0 to 32 CTAs per SM (a cap from 2)"),
    ("groups", "x", lambda n: 0 <= n <= 1024, "0 (the module's) to 1024 row groups"),
    ("ctas_per_sm", "b", lambda n: 0 <= n <= 32, "0 (the module's) to 32 CTAs per SM"),
)


def _field_problems(cfg: LaunchConfig) -> list[tuple[type[ArgumentError | ArgumentTypeError], str]]:
    """What is wrong with ``cfg``'s fields, as (exception type, text) pairs; stores integers
    of other integral types as ``int``."""
    problems: list[tuple[type[ArgumentError | ArgumentTypeError], str]] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.type == "bool" and not isinstance(value, bool):
            problems.append((ArgumentTypeError, f"{f.name} is a bool, not {type(value).__name__}"))
        elif f.type == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                problems.append(
                    (ArgumentTypeError, f"{f.name} is an int, not {type(value).__name__}")
                )
            else:
                object.__setattr__(cfg, f.name, int(value))
    if cfg.mode not in ("regs", "loop"):
        problems.append((ArgumentError, f"mode is 'regs' or 'loop', not {cfg.mode!r}"))
    if problems:
        return problems
    rules = _COUNT_RULES if cfg.mode == "regs" else _COUNT_RULES[2:3]
    for name, letter, ok, want in rules:
        n = getattr(cfg, name)
        if not ok(n):
            problems.append((ArgumentError, f"{letter}{n} ({name}={n}): {want}"))
    if not problems and cfg.mode == "regs" and cfg.threads > sw.MAX_THREADS:
        problems.append((ArgumentError, f"r{cfg.rows} w{cfg.warps}: {cfg.threads} threads per CTA "
                                     f"(rows * warps * 32), at most {sw.MAX_THREADS}"))  # fmt: skip
    return problems


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
    return -(-warps // 4) * 4 * 32 * regs <= sw.REGISTER_FILE


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
        regs += 2 * stored + sw.BWD_OVERHEAD_REGISTERS if prefetch else sw.BWD_OVERHEAD_NO_PREFETCH
    else:
        regs = elements + weights * stored + sw.OVERHEAD_REGISTERS
    return -(-regs // 8) * 8


def _switches(key: KernelKey) -> tuple[bool, bool, bool]:
    """``(hold, prefetch, packed)`` for a key, from the module's defaults."""
    spec = norm_spec(key)
    if spec.backward:
        return False, sw.BWD_PREFETCH, sw.BWD_PACKED and key.input.itemsize < 4
    return sw.FWD_HOLD_WEIGHTS.get(key.scaling, False), True, False


class _CachedByKey:
    """:func:`launch_config`: the layout per key, cached (``cache_clear()`` and
    ``cache_info()`` as ``functools.lru_cache``'s), the argument checked before it is hashed
    so that a wrong one gets a TypeError naming it, not the cache's "unhashable type"."""

    def __init__(self, fn: Callable[[KernelKey], LaunchConfig]) -> None:
        self._cached = functools.lru_cache(maxsize=1024)(fn)
        self.cache_clear = self._cached.cache_clear
        self.cache_info = self._cached.cache_info
        functools.update_wrapper(self, fn)

    def __call__(self, key: KernelKey) -> LaunchConfig:
        norm_spec(key)  # a norm key, or a TypeError that says what was passed
        return self._cached(key)


@_CachedByKey
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
        stages = sw.BWD_STAGED if key.spec.backward else sw.FWD_STAGED
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
    spec = norm_spec(key)
    if key.hidden_size is None or stages < 2:
        return None
    if target_bytes is None:
        target_bytes = sw.STAGED_TARGET_BYTES if spec.backward else sw.TARGET_BYTES["fwd"]
    itemsize = key.input.itemsize
    arch = arch_number(key.arch)
    vec = _vector_width(key.hidden_size, itemsize)
    accesses = key.hidden_size // vec
    start = max(1, target_bytes // (vec * itemsize))
    most = max(start, sw.MAX_ELEMENTS // vec)
    clusters = (1, 2, 4, 8) if 90 <= arch < 110 else (1,)
    for cluster in clusters:
        for depth in range(stages, 1, -1):
            for iters in range(start, min(2 * start, most) + 1):
                warps = -(-accesses // (32 * cluster * iters))
                if warps > 32 or (cluster > 1 and warps * 32 * cluster > accesses):
                    continue
                iters = -(-accesses // (32 * cluster * warps))
                cfg = LaunchConfig("regs", vec, warps, 1, iters, cluster, stages=depth)
                if not spec.backward and sw.FWD_GAMMA32:
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
    spec = norm_spec(key)
    elements = cfg.iters * cfg.vec
    w_size = DTYPES[gamma_dtype(key)].itemsize
    if spec.backward:
        regs = -(-(spec.accumulators * elements + sw.STAGED_OVERHEAD_REGISTERS) // 8) * 8
    elif staged_weights_in_registers(spec, cfg):
        regs = _registers(False, 0, elements, w_size, weights=1 if spec.rms else 2)
    else:
        regs = _registers(False, 0, elements)
    if regs > sw.MAX_REGISTERS or not fits_register_file(cfg.rows * cfg.warps, regs):
        return False
    arch = arch_number(key.arch)
    limit = sw.OPTIN_SMEM_BYTES.get(arch, min(sw.OPTIN_SMEM_BYTES.values())) - 1024
    size = staged_smem_bytes(cfg, key.input.itemsize, w_size, **staged_counts(spec, cfg))
    size += cfg.stages * cfg.threads * 4 if cfg.shifted else 0  # z: each thread's copy of K
    return size <= limit


def _round3_switches(key: KernelKey, cfg: LaunchConfig) -> LaunchConfig:
    """``cfg`` with the module's defaults for the round-3 switches (``FWD_EARLY_WEIGHTS``,
    ``FWD_ONE_REDUCTION``, ``FWD_ACCUMULATORS``, ``BWD_SHARED_SUMS``) and the round-4 FP8
    candidates (``FWD_FP8_BATCHED``, ``FWD_FP8_WARP_AMAX``: tensor scaling only) where they
    apply; each stays on where ``cfg``, a :data:`TUNED` entry, has it (``e``, ``u``, ``a2``,
    ``o``, ``g``, ``q``, ``p``)."""
    spec = norm_spec(key)
    if cfg.mode != "regs" or cfg.stages:
        return cfg
    if spec.backward:
        # Column-sum arrays in shared memory: at most what fits in the 48 KB of static shared
        # memory a CTA can have (4 bytes per element a thread holds, per array; 1 KB kept for
        # the kernel's own reductions).
        per_array = cfg.threads * cfg.vec * cfg.iters * 4
        fits = max(0, (sw.STATIC_SMEM_BYTES - 1024) // per_array)
        shared = min(sw.BWD_SHARED_SUMS, spec.accumulators, fits)
        return dataclasses.replace(cfg, shared_sums=shared) if shared else cfg
    return dataclasses.replace(
        cfg, early=(cfg.early or sw.FWD_EARLY_WEIGHTS) and not cfg.hold,
        one_reduction=(cfg.one_reduction or sw.FWD_ONE_REDUCTION) and not spec.rms,
        accumulators=cfg.accumulators if cfg.accumulators > 1 else sw.FWD_ACCUMULATORS,
        batched=(cfg.batched or sw.FWD_FP8_BATCHED) and key.scaling == "tensor",
        warp_amax=(cfg.warp_amax or sw.FWD_FP8_WARP_AMAX) and key.scaling == "tensor",
        words=cfg.words or (sw.FWD_FP8_WORDS and key.scaling == "tensor"),
        next_row=((cfg.next_row and key.scaling in sw.NEXT_ROW_SCALING)
                  or (sw.FWD_FP8_NEXT_ROW and key.scaling == "tensor"))
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
    lanes = (cfg.lanes or sw.ROW_SUM_LANES) and cfg.warps > 1
    words = cfg.words or (sw.BWD_STAGED_WORDS and staged)
    folded = cfg.folded or (sw.BWD_FOLDED and staged)
    # i: a staged kernel of three stages or more (the forward's of one row per CTA)
    deferred = (cfg.deferred or (sw.BWD_DEFERRED if key.spec.backward else sw.FWD_DEFERRED)) and (
        cfg.stages >= 3 and (key.spec.backward or cfg.rows == 1)
    )
    gamma32 = cfg.gamma32 or (
        sw.BWD_GAMMA32 and staged and staged_fits(key, dataclasses.replace(cfg, gamma32=True))
    )
    reread = (cfg.reread or sw.FWD_REREAD) and cfg.stages > 0 and not key.spec.backward
    shifted = (cfg.shifted or sw.FWD_SHIFTED) and shift_applies(key, cfg)
    warp_stats = (cfg.warp_stats or sw.FWD_WARP_STATS) and warp_stats_apply(
        key, dataclasses.replace(cfg, deferred=deferred, shifted=shifted)
    )
    fetch256 = (cfg.fetch256 or sw.STAGED_FETCH256) and cfg.stages > 0
    aligned = (cfg.aligned or sw.STAGED_ALIGNED) and cfg.stages > 0
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
    spec = norm_spec(key)
    return (cfg.mode == "regs" and not spec.backward and not spec.rms
            and key.output.is_fp8 and not cfg.one_reduction)  # fmt: skip


def warp_stats_apply(key: KernelKey, cfg: LaunchConfig) -> bool:
    """Whether ``W`` (``FWD_WARP_STATS``: the statistics by two passes per warp and one
    exchange) applies: the LayerNorm forward in registers (staged or not) without a cluster,
    and without ``u`` or ``z`` (which exchange the statistics their own ways); with ``i``
    (staged, one row per CTA) a row's z follows the next row's exchange."""
    spec = norm_spec(key)
    return (cfg.mode == "regs" and not spec.backward and not spec.rms and cfg.cluster == 1
            and not (cfg.one_reduction or (cfg.shifted and shift_applies(key, cfg))))  # fmt: skip


def next_row_fits(cfg: LaunchConfig, itemsize: int) -> bool:
    """Whether the FP8 forward's next-row copy (``p``) applies to ``cfg`` for x of
    ``itemsize`` bytes: 16-byte accesses, and a slot of 16 bytes per access a thread holds
    within the static shared memory (1 KB kept for the reductions)."""
    return cfg.vec * itemsize == 16 and cfg.threads * cfg.iters * 16 <= sw.STATIC_SMEM_BYTES - 1024


_TAG = re.compile(
    r"w(\d+)r(\d+)v(\d+)j(\d+)c(\d+)(h?)(k?)(n?)(e?)(u?)(o?)(g?)(q?)(p?)(l?)(f?)(d?)(i?)(y?)(z?)(W?)(L?)(A?)"
    r"(?:a(\d+))?"
    r"(?:s(\d+))?"
    r"(?:t(\d+))?(?:m(\d+))?(?:x(\d+))?(?:b(\d+))?",
    re.ASCII,  # ASCII digits only
)


def parse_tag(tag: str) -> LaunchConfig:
    """The :class:`LaunchConfig` a tag names (the inverse of :attr:`LaunchConfig.tag`).

    Raises :class:`~nvrtc_engine.ArgumentTypeError` for a tag that is not a string and
    :class:`~nvrtc_engine.ArgumentError` (a ``ValueError``) for one that is not
    of the form (the message gives it), whose counts :class:`LaunchConfig` rejects (warps, rows
    or accesses of 0, more than 32 warps or 1024 threads a CTA, an access width not 1, 2, 4, 8
    or 16 elements, a cluster not 1, 2, 4 or 8 CTAs, ``a`` not 2 or 4, ``s`` not 1 or 2, ``t1``),
    or which is not the form :attr:`LaunchConfig.tag` writes (``a1``, ``s0``, ``t0``, ``m0``,
    ``m1``, ``x0``, ``b0``: a count that changes nothing is written by leaving it out), so that
    ``parse_tag(t).tag == t`` for every tag it accepts. It checks the form only: whether a
    layout fits a key (its hidden size, arch, registers) is :func:`launch_config`'s and the
    compiler's business."""
    if not isinstance(tag, str):
        raise ArgumentTypeError("tag", f"parse_tag takes a str, not {type(tag).__name__}")
    if tag == "loop":
        raise ArgumentError(
            "tag",
            "'loop' names the general kernel, which has no register layout to "
            "parse (its LaunchConfig is ('loop', vec): launch_config gives it)",
        )
    m = _TAG.fullmatch(tag)
    if m is None:
        raise ArgumentError(
            "tag",
            f"not a norm configuration tag: {tag!r} (expected w<warps>r<rows>v<vec>j<iters>"
            "c<cluster>, then the switch letters that apply in the order h k n e u o g q p l f "
            "d i y z W L A, then a<n> s<n> t<n> m<n> x<n> b<n> in that order)",
        )
    w, r, v, j, c = (int(g) for g in m.groups()[:5])
    try:
        cfg = LaunchConfig("regs", v, w, r, j, c, hold=bool(m[6]), prefetch=not m[8],
                            packed=bool(m[7]), min_ctas=int(m[27] or 0), early=bool(m[9]),
                            one_reduction=bool(m[10]), accumulators=int(m[24] or 1),
                            shared_sums=int(m[25] or 0), batched=bool(m[11]),
                            warp_amax=bool(m[12]), words=bool(m[13]), next_row=bool(m[14]),
                            lanes=bool(m[15]), gamma32=bool(m[16]), folded=bool(m[17]),
                            deferred=bool(m[18]), reread=bool(m[19]), shifted=bool(m[20]),
                            warp_stats=bool(m[21]), fetch256=bool(m[22]), aligned=bool(m[23]),
                            stages=int(m[26] or 0), groups=int(m[28] or 0),
                            ctas_per_sm=int(m[29] or 0))  # fmt: skip
    except ArgumentError as e:  # the fields' checks, in the tag's terms
        raise ArgumentError("tag", f"norm configuration tag {tag!r}: "
                            + str(e).removeprefix("LaunchConfig: ")) from None  # fmt: skip
    if cfg.tag != tag:
        raise ArgumentError(
            "tag",
            f"norm configuration tag {tag!r} is not in the form LaunchConfig.tag "
            f"writes: {cfg.tag!r} names the same layout (counts without leading zeros; a count "
            "that changes nothing, a1, s0, t0, m0, m1, x0 or b0, is left out)",
        )
    return cfg


def _tuned(key: KernelKey) -> LaunchConfig | None:
    """The :data:`TUNED` configuration of a key, if it has one (sm_90, 16-bit x and gamma)."""
    if key.hidden_size is None or arch_number(key.arch) != 90 or key.input.itemsize != 2:
        return None
    if DTYPES[gamma_dtype(key)].itemsize != 2:
        return None
    tag = sw.TUNED.get((key.op, key.hidden_size, key.scaling))
    return None if tag is None else parse_tag(tag)


def _layout(key: KernelKey, hold: bool, prefetch: bool, packed: bool) -> LaunchConfig:
    """:func:`launch_config` for the given code switches."""
    spec = norm_spec(key)
    itemsize = key.input.itemsize
    if key.hidden_size is None:
        return LaunchConfig("loop", 16 // itemsize)
    hidden = key.hidden_size
    vec = _vector_width(hidden, itemsize)
    accesses = hidden // vec
    direction = ("bwd2" if spec.accumulators > 1 else "bwd") if spec.backward else "fwd"
    start = max(1, sw.TARGET_BYTES[direction] // (vec * itemsize))
    clusters = (1, 2, 4, 8) if 90 <= arch_number(key.arch) < 110 else (1,)
    if spec.backward and not sw.BWD_CLUSTERS:
        clusters = (1,)
    weights = (1 if spec.rms else 2) if hold else 0
    w_size = DTYPES[gamma_dtype(key)].itemsize
    most = max(start, (sw.BWD_MAX_ELEMENTS if spec.backward else sw.MAX_ELEMENTS) // vec)
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
            if regs > sw.MAX_REGISTERS or not fits_register_file(warps, regs):
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
            ctas = sw.REGISTER_FILE // (-(-rows * warps // 4) * 4 * 32 * regs)
            if hold and ctas < 2:  # weights in registers only where 2+ CTAs still fit
                return _layout(key, False, prefetch, packed)
            ctas = ctas if ((spec.backward and sw.BWD_CAP) or hold) and ctas > 1 else 0
            return LaunchConfig("regs", vec, warps, rows, iters, cluster, hold, prefetch, packed,
                                ctas)  # fmt: skip
    return LaunchConfig("loop", 16 // itemsize)


def loop_threads_per_row(hidden: int) -> int:
    """Threads per row of the streaming kernels: a power of two in [32, 1024], about 32
    elements per thread (so at most 64 up to H = 65536)."""
    want = max(1, -(-hidden // 32))
    return min(sw.LOOP_BLOCK, max(32, 1 << (want - 1).bit_length()))
