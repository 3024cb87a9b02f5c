"""How a norm kernel maps rows to threads: :class:`ForwardConfig` and :class:`BackwardConfig`
(a few named fields each, :class:`Staging` for the staged kernels), the rules that choose one
from a key (:func:`norm_config`) and the measured entries that replace the rules
(:data:`TUNED`). Chosen on the host before the source is rendered; no GPU needed.

Three kernels exist per direction: the general kernel (``warps=0``: each row streamed, H a
run-time argument or a constant), the register kernel (the row in registers, every trip
count a constant) and the staged kernel (``staging``: a persistent grid whose CTAs keep their
columns and copy the next rows into shared memory with cp.async while they compute one).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, cast

from ...core.dtypes import DTYPES
from ...core.errors import ArgumentError, ArgumentTypeError
from ...core.key import KernelKey, arch_number
from ...core.record import Checked

if TYPE_CHECKING:
    from .spec import NormSpec

__all__ = [
    "TUNED",
    "BackwardConfig",
    "ForwardConfig",
    "NormConfig",
    "Staging",
    "fits_register_file",
    "gamma_dtype",
    "iters",
    "loop_threads_per_row",
    "norm_config",
    "shared_bytes",
    "vector_width",
]

# Hardware (sm_80 ... sm_100).
REGISTER_FILE = 65536  # 32-bit registers per SM
MAX_REGISTERS = 255  # per thread
MAX_THREADS = 1024  # per CTA
MAX_GRID = 2**31 - 1  # gridDim.x
# Threads per CTA of the general kernels and the finalize kernel.
LOOP_BLOCK = 1024  # general forward and backward row sums
TILE_BLOCK = 256  # general backward: 8 warps on a tile of 32 accesses
TILE_CTAS_PER_SM = 4  # general backward: row chunks sized for this many CTAs per SM (a guess)
FINALIZE_BLOCK = 256

# The rules' thresholds, each with the measurement that set it (H200, bf16; % of copy
# bandwidth; the sweeps' files are in git history, docs/design.md says where).
TARGET_BYTES = 64  # of a row tensor per thread: forward within 1-3% of the best (warps,
# rows) at H = 4096-14336; backward 4 accesses ahead of 2 (LN 4096: 59.4% against 44.7%)
# elements per thread and tensor (backward: 4 x 8 at 14336 over a cluster of 2 measured
# below the general kernel)
MAX_ELEMENTS = MappingProxyType({"fwd": 64, "bwd": 32})
OVERHEAD_REGISTERS = 40  # besides the row values (ptxas -v, sm_90: LN backward w4j4 168,
# estimated 168; RMS w8j2 80-94, estimated 104)
ROW_THREADS = 128  # small rows packed into CTAs of about 128 threads (backward 256: slower)
SLOT_SUM_BYTES = 32768  # the packed rows' column sums (fp32, per accumulator) a CTA may hold
BWD_CTAS_PER_SM = 8  # backward persistent grid: 2, 4 and 8 within 0.5% of each other
# Clusters split a row over CTAs on sm_90 ... sm_10x (portable clusters of 8), forward only:
# the general backward measured ahead of every cluster layout (H = 14336: LN/RMS 44.7/54.1%
# against 42.3/49.0%; 65536: 50.7/55.0% against 21.8/25.5%; norm_bandwidth.json).
CLUSTERS = (1, 2, 4, 8)

WEIGHTS = ("global", "held", "shared", "shared_fp32")
STATS = ("two_pass", "per_warp", "shifted")


class Staging(NamedTuple):
    """The staged kernel's pipeline: ``stages`` rows of x (and dz) in shared memory per CTA,
    ``stages - 1`` of them in flight while one is computed (``stages - 2`` when
    ``deferred``). Checked as part of the configuration that holds it."""

    stages: int
    deferred: bool = False  # a row's output written after the next row's sums are posted
    ctas_per_sm: int = 0  # cap on the persistent grid's CTAs per SM (0: forward the occupancy,
    # backward BWD_CTAS_PER_SM); a capped grid does not trigger the next grid's launch
    align: int = 16  # byte boundary the stages start on (16 or 128)
    fetch: int = 128  # bytes an L2 miss of a row copy brings (cp.async's .L2::128B or 256B)

    @property
    def label(self) -> str:
        parts = [f"stages{self.stages}"] + (["deferred"] if self.deferred else [])
        parts += [f"ctas{self.ctas_per_sm}"] if self.ctas_per_sm else []
        parts += [f"align{self.align}"] if self.align != 16 else []
        return "_".join(parts + ([f"fetch{self.fetch}"] if self.fetch != 128 else []))


class _ForwardFields(NamedTuple):
    warps: int = 0  # 0: the general kernel
    rows: int = 1
    cluster: int = 1
    staging: Staging | None = None
    weights: str = "global"
    stats: str = "two_pass"
    words: bool = False
    batched: bool = False
    row_groups: int = 1


class ForwardConfig(Checked, _ForwardFields):
    """A forward kernel's configuration (see the module docstring for the three kernels).

    A row is held by ``cluster`` CTAs (a thread block cluster, sm_90+) of ``warps`` warps;
    a CTA holds ``rows`` rows. ``weights``: gamma and beta loaded per row (``global``), once
    per CTA into registers (``held``), or into shared memory as stored or as fp32 with
    zero-centring applied (``shared``, ``shared_fp32``: staged only). ``stats``: the mean
    and variance by two passes over the row (``two_pass``), by two passes per warp merged by
    Chan's formula (``per_warp``, LayerNorm, no cluster), or by one pass about the row's first
    element with x read again from its stage in each pass (``shifted``, staged LayerNorm with
    an FP8 z; docs/norms.md). ``words``: bf16 unpacked and FP8 packed by 32-bit words.
    ``batched`` (tensor scaling): the output stage under one branch per row and the amax by
    one guarded atomic per warp. ``row_groups`` (register kernel): row groups a CTA takes in
    turn (at most; never fewer CTAs than are resident at once)."""

    __slots__ = ()

    def _checked(self) -> ForwardConfig:
        _check(self)
        if self.weights in ("shared", "shared_fp32") and self.staging is None:
            raise ArgumentError("ForwardConfig", f"weights={self.weights!r} needs staging")
        if self.stats == "shifted" and self.staging is None:
            raise ArgumentError("ForwardConfig", "stats='shifted' needs staging")
        if not 1 <= self.row_groups <= 1024 or (self.row_groups > 1 and self.staging):
            raise ArgumentError("ForwardConfig", f"row_groups={self.row_groups}: 1 to 1024, "
                                "1 for a staged kernel (a persistent grid)")  # fmt: skip
        return self

    @property
    def label(self) -> str:
        """The configuration in the kernel's symbol: ``w4_r1_c8_stages3_deferred_held_words``;
        ``general`` for the general kernel."""
        if not self.warps:
            return "general"
        parts = _shape(self)
        parts += [self.weights] if self.weights != "global" else []
        parts += [self.stats] if self.stats != "two_pass" else []
        parts += ["words"] if self.words else []
        parts += ["batched"] if self.batched else []
        return "_".join(parts + ([f"groups{self.row_groups}"] if self.row_groups > 1 else []))

    @property
    def threads(self) -> int:
        """Threads per CTA."""
        return self.rows * 32 * self.warps if self.warps else LOOP_BLOCK


class _BackwardFields(NamedTuple):
    warps: int = 0  # 0: the general kernel
    rows: int = 1
    cluster: int = 1
    staging: Staging | None = None
    gamma_fp32: bool = False
    words: bool = False


class BackwardConfig(Checked, _BackwardFields):
    """A backward kernel's configuration: ``warps``, ``rows``, ``cluster`` as the forward's
    (the register kernel takes no cluster); the staged kernel keeps gamma in shared memory,
    as fp32 with zero-centring applied where ``gamma_fp32``, and reads x, dz and gamma there
    by 32-bit words where ``words``."""

    __slots__ = ()

    def _checked(self) -> BackwardConfig:
        _check(self)
        if self.staging is None and (self.gamma_fp32 or self.words):
            raise ArgumentError("BackwardConfig", "gamma_fp32 and words need staging")
        if self.staging is None and self.cluster > 1:
            raise ArgumentError("BackwardConfig", "a cluster needs staging")
        return self

    @property
    def label(self) -> str:
        """The configuration in the kernel's symbol: ``w16_r1_c8_stages3_deferred_words``;
        ``general`` for the general kernel."""
        if not self.warps:
            return "general"
        parts = _shape(self) + (["gamma_fp32"] if self.gamma_fp32 else [])
        return "_".join(parts + (["words"] if self.words else []))

    @property
    def threads(self) -> int:
        """Threads per CTA of the main kernel."""
        return self.rows * 32 * self.warps if self.warps else TILE_BLOCK


NormConfig = ForwardConfig | BackwardConfig


def _shape(cfg: NormConfig) -> list[str]:
    parts = [f"w{cfg.warps}", f"r{cfg.rows}"] + ([f"c{cfg.cluster}"] if cfg.cluster > 1 else [])
    return parts + ([cfg.staging.label] if cfg.staging else [])


def _check(cfg: NormConfig) -> None:
    """The fields' types and ranges: ArgumentTypeError / ArgumentError naming the field."""
    name = type(cfg).__name__
    for field, default in cfg._field_defaults.items():  # each field's default has its type
        want = type(default) if default is not None else None  # (staging: checked below)
        value = getattr(cfg, field)
        if want and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            raise ArgumentTypeError(name, f"{field} is {want.__name__}, not {type(value).__name__}")
    s = cfg.staging
    problems = [
        (0 <= cfg.warps <= 32, f"warps={cfg.warps}: 1 to 32 (0: the general kernel)"),
        (cfg.rows >= 1, f"rows={cfg.rows}: at least 1"),
        (cfg.cluster in CLUSTERS, f"cluster={cfg.cluster}: 1, 2, 4 or 8"),
        (cfg.cluster == 1 or cfg.rows == 1, "a cluster holds one row"),
        (cfg.threads <= MAX_THREADS, f"{cfg.threads} threads per CTA, at most {MAX_THREADS}"),
        (s is None or isinstance(s, Staging), "staging is a Staging or None"),
        (
            cfg.warps > 0 or (cfg.rows, cfg.cluster, s) == (1, 1, None),
            "the general kernel takes no rows, cluster or staging",
        ),
        (getattr(cfg, "weights", "global") in WEIGHTS, f"weights is one of {WEIGHTS}"),
        (getattr(cfg, "stats", "two_pass") in STATS, f"stats is one of {STATS}"),
    ]
    if isinstance(s, Staging):
        problems += [
            (2 <= s.stages <= 32, f"stages={s.stages}: 2 to 32"),
            (
                not s.deferred or (s.stages >= 3 and cfg.rows == 1),
                "deferred needs 3 stages or more and one row per CTA",
            ),
            (0 <= s.ctas_per_sm <= 32, f"ctas_per_sm={s.ctas_per_sm}: 0 to 32"),
            (s.align in (16, 128), f"align={s.align}: 16 or 128"),
            (s.fetch in (128, 256), f"fetch={s.fetch}: 128 or 256"),
        ]
    for ok, text in problems:
        if not ok:
            raise ArgumentError(name, text)


def norm_spec(key: KernelKey) -> NormSpec:
    """``key.spec`` as a :class:`~nvrtc_engine.families.norm.spec.NormSpec`; ArgumentTypeError (a
    ``TypeError``) for anything but a norm key."""
    if not isinstance(key, KernelKey):
        raise ArgumentTypeError("key", f"a norm KernelKey is needed (a kernel's is kernel.key), "
                                       f"not {type(key).__name__}")  # fmt: skip
    if key.spec.family != "norm":
        raise ArgumentTypeError("key", f"{key.op} is not a norm op (family {key.spec.family!r})")
    return cast("NormSpec", key.spec)


def gamma_dtype(key: KernelKey) -> str:
    """Dtype of gamma/beta/dgamma/dbeta: fp32 with the ``fp32_gamma`` flag, else x's dtype."""
    return "fp32" if key.flag("fp32_gamma") else key.in_dtype


def vector_width(key: KernelKey, cfg: NormConfig) -> int:
    """Elements per access: the widest (at most 16 bytes of x) that divides H in the register
    and staged kernels; 16 bytes in the general kernel (used where H and the pointers
    allow)."""
    v = 16 // key.input.itemsize
    if not cfg.warps or key.hidden_size is None:
        return v
    while key.hidden_size % v:
        v //= 2
    return v


def iters(key: KernelKey, cfg: NormConfig) -> int:
    """Accesses per thread per row in the register and staged kernels."""
    assert key.hidden_size is not None and cfg.warps
    accesses = key.hidden_size // vector_width(key, cfg)
    return -(-accesses // (32 * cfg.cluster * cfg.warps))


def fits_register_file(warps: int, regs: int) -> bool:
    """Whether a CTA of ``warps`` warps using ``regs`` registers per thread fits one SM: the
    register file is split over 4 sub-partitions, each holding a quarter of the warps."""
    return -(-warps // 4) * 4 * 32 * regs <= REGISTER_FILE


def loop_threads_per_row(hidden: int) -> int:
    """Threads per row of the general kernels: a power of two in [32, 1024], about 32
    elements per thread."""
    want = max(1, -(-hidden // 32))
    return min(LOOP_BLOCK, max(32, 1 << (want - 1).bit_length()))


def shared_bytes(key: KernelKey, cfg: NormConfig) -> int:
    """Dynamic shared memory (bytes) of a staged kernel's CTA, 0 for the others: ``stages``
    rows of x (backward: and dz) for each row slot, then the weights once (backward gamma;
    forward gamma and beta unless held in registers), as stored or as fp32."""
    if cfg.staging is None:
        return 0
    spec = norm_spec(key)
    share = iters(key, cfg) * 32 * cfg.warps * vector_width(key, cfg)
    rows = (2 if spec.backward else 1) * cfg.staging.stages * cfg.rows * key.input.itemsize
    if isinstance(cfg, BackwardConfig):
        weights, fp32 = 1, cfg.gamma_fp32
    else:
        weights = 0 if cfg.weights == "held" else 1 if spec.rms else 2
        fp32 = cfg.weights == "shared_fp32"
    return share * (rows + weights * (4 if fp32 else DTYPES[gamma_dtype(key)].itemsize))


def _registers(backward: bool, accumulators: int, elements: int) -> int:
    """Estimated registers per thread holding ``elements`` values of each row tensor, rounded
    up to the allocation unit (8): x in fp32 (backward: x and dz as xhat and dy, and the
    ``accumulators`` column sums), plus OVERHEAD_REGISTERS."""
    per_element = accumulators + 2 if backward else 1
    return -(-(per_element * elements + OVERHEAD_REGISTERS) // 8) * 8


def _register_layout(key: KernelKey) -> NormConfig:
    """The rules: each thread holds about TARGET_BYTES of a row tensor in registers (up to
    twice that, then up to MAX_ELEMENTS), over the fewest warps, one CTA per row first,
    then (forward, sm_90 ... sm_10x) a cluster; the estimated registers within 255 and the
    register file; small rows packed into CTAs of about ROW_THREADS threads. The general
    kernel where nothing fits."""
    spec = norm_spec(key)
    make = BackwardConfig if spec.backward else ForwardConfig
    assert key.hidden_size is not None
    itemsize = key.input.itemsize
    vec = vector_width(key, ForwardConfig(warps=1))
    accesses = key.hidden_size // vec
    start = max(1, TARGET_BYTES // (vec * itemsize))
    most = max(start, MAX_ELEMENTS["bwd" if spec.backward else "fwd"] // vec)
    arch = arch_number(key.arch)
    clusters = CLUSTERS if not spec.backward and 90 <= arch < 110 else (1,)
    candidates = [(c, range(start, min(2 * start, most) + 1)) for c in clusters]
    candidates += [(c, range(2 * start + 1, most + 1)) for c in clusters]
    for cluster, shares in candidates:
        for share in shares:
            warps = -(-accesses // (32 * cluster * share))
            if warps > 32 or (cluster > 1 and warps * 32 * cluster > accesses):
                continue
            j = -(-accesses // (32 * cluster * warps))  # the threads' shares balanced
            regs = _registers(spec.backward, spec.accumulators, j * vec)
            if regs > MAX_REGISTERS or not fits_register_file(warps, regs):
                continue
            rows = 1 if cluster > 1 else max(1, ROW_THREADS // (32 * warps))
            while rows > 1 and (
                not fits_register_file(rows * warps, regs)
                or spec.accumulators * j * vec * 32 * warps * 4 > SLOT_SUM_BYTES
            ):
                rows //= 2
            return make(warps=warps, rows=rows, cluster=cluster)
    return make()


@functools.lru_cache(maxsize=1024)
def _config(key: KernelKey) -> NormConfig:
    if key.hidden_size is None:
        return BackwardConfig() if key.spec.backward else ForwardConfig()
    tuned = TUNED.get((key.op, key.hidden_size, key.scaling))
    w_size = DTYPES[gamma_dtype(key)].itemsize
    if tuned and arch_number(key.arch) == 90 and key.input.itemsize == 2 and w_size == 2:
        return tuned[0]
    return _register_layout(key)


def norm_config(key: KernelKey) -> NormConfig:
    """The configuration of a norm key's kernel: the :data:`TUNED` entry of (op, H, scaling)
    on sm_90 with 16-bit x and gamma, else the rules (:func:`_register_layout`); the general
    kernel for ``hidden_size=None``. Raises ArgumentTypeError for anything but a norm key."""
    norm_spec(key)
    return _config(key)


F, B, S = ForwardConfig, BackwardConfig, Staging
# Measured winners on sm_90 with 16-bit x and gamma (H200, bf16; other keys take the rules):
# (op, H, scaling) -> (config, why). Figures: % of copy bandwidth at N = 16384 (2048 at
# H = 65536) against the entry or rule it replaced, from the results file named (at 77a0600;
# paired rounds: the same-round median speed-up; bench/tuning/source_ab.py reruns a field).
_Table = dict[tuple[str, int, str], tuple[NormConfig, str]]


def _with_add(table: _Table) -> _Table:
    """``table`` and, for each rmsnorm_bwd entry, rmsnorm_bwd_add's: the same kernel with the
    residual gradient added (not measured apart)."""
    add = {("rmsnorm_bwd_add", h, s): v for (op, h, s), v in table.items() if op == "rmsnorm_bwd"}
    return {**table, **add}


# fmt: off
_MEASURED: _Table = {
    ("rmsnorm_fwd", 4096, "none"): (F(8), "91.1 against w4 88.0 (norm_tuning.json)"),
    ("rmsnorm_fwd", 14336, "none"): (F(7), "96.2 against w14 93.2 (norm_tuning.json)"),
    ("rmsnorm_fwd", 65536, "none"): (
        F(4, cluster=8, staging=S(3, deferred=True, ctas_per_sm=2), weights="held",
          words=True),
        "92.6 against 90.5 of the held register kernel, 1.023x (norm_tuning-fdefer.json)"),
    ("layernorm_fwd", 65536, "none"): (
        F(4, cluster=8, staging=S(3, deferred=True), weights="held", words=True),
        "91.5 against 86.3 (not deferred), 1.057x (norm_tuning-fdefer.json)"),
    ("layernorm_fwd", 14336, "none"): (
        F(7, staging=S(4), weights="shared_fp32", stats="per_warp", words=True),
        "94.9 against 93.0 (two-pass), 1.022x in 17 of 20 rounds (source_ab-ln14336-W2.json)"),
    ("layernorm_fwd", 4096, "tensor"): (
        F(4, staging=S(3, deferred=True, align=128), weights="held", words=True, batched=True),
        "89.3 against 88.4 (2 rows per CTA; norm_tuning-fdefer.json); align128 1.010x "
        "(source_ab-ln4096-fp8-smemoffset.json)"),
    ("layernorm_fwd", 8192, "tensor"): (
        F(4, staging=S(3), weights="shared", stats="per_warp", words=True, batched=True),
        "93.5 against 90.8 (one Chan reduction), 1.030x every round "
        "(source_ab-ln8192-fp8-W2.json)"),
    ("layernorm_fwd", 14336, "tensor"): (
        F(14, rows=2, staging=S(2, align=128), weights="shared", words=True, batched=True),
        "92.4 against 90.6 of w7 c2 (norm_tuning-bal.json); align128 1.056x "
        "(source_ab-align16.json)"),
    ("layernorm_fwd", 65536, "tensor"): (
        F(4, cluster=8, staging=S(3, deferred=True), weights="held", stats="shifted",
          words=True, batched=True),
        "93.6 against 85.5 (two-pass), 1.086x every round (norm_tuning-shift.json)"),
    ("rmsnorm_fwd", 4096, "tensor"): (
        F(4, weights="held", words=True, batched=True, row_groups=4),
        "89.2 against 88.3 (one row group per CTA; norm_tuning-near-rms.json)"),
    ("rmsnorm_fwd", 8192, "tensor"): (
        F(2, cluster=2, weights="held", words=True, batched=True, row_groups=64),
        "95.2 against 91.5 of w4; measured with next_row, since removed "
        "(norm_tuning-bwdc.json)"),
    ("rmsnorm_fwd", 14336, "tensor"): (
        F(14, weights="held", words=True, batched=True, row_groups=8),
        "94.7 against 83.9 (weights loaded per row; norm_tuning-fp8b.json)"),
    ("rmsnorm_fwd", 65536, "tensor"): (
        F(4, cluster=8, staging=S(3, deferred=True, fetch=256), weights="held", words=True,
          batched=True),
        "94.9 against 90.9 (fetch128), 1.046x (source_ab-fp8-cp256.json)"),
    ("layernorm_bwd", 4096, "none"): (
        B(1, cluster=4, staging=S(3), words=True),
        "83.1 against 79.8 of w8; measured with folded, since removed "
        "(norm_tuning-bwdc-4096.json)"),
    ("layernorm_bwd", 8192, "none"): (
        B(16, staging=S(4), words=True),
        "86.3 against 84.8 (without words; measured with lanes, since removed; "
        "norm_tuning-lanes.json)"),
    ("layernorm_bwd", 14336, "none"): (
        B(7, cluster=2, staging=S(3), words=True),
        "88.9 against 75.2 of w28 (norm_tuning-bwdc.json)"),
    ("layernorm_bwd", 65536, "none"): (
        B(16, cluster=8, staging=S(3, deferred=True, ctas_per_sm=2), words=True),
        "77.2 against 71.1 of w8 (not deferred), 1.090x; measured with lanes, since removed "
        "(norm_tuning-defer.json)"),
    ("rmsnorm_bwd", 4096, "none"): (
        B(8, staging=S(5)), "85.7 against 77.3 of 4 stages (norm_tuning-bwd2.json)"),
    ("rmsnorm_bwd", 8192, "none"): (
        B(16, staging=S(4), words=True), "92.9 against 92.7 (norm_tuning-lanes.json)"),
    ("rmsnorm_bwd", 14336, "none"): (
        B(28, staging=S(3, deferred=True, fetch=256), gamma_fp32=True),
        "91.3 against 89.9 (fetch128), 1.016x in 20 of 20; measured with lanes, since removed "
        "(norm_tuning-fetch256-rms14336.json)"),
    ("rmsnorm_bwd", 65536, "none"): (
        B(16, cluster=8, staging=S(4, deferred=True, ctas_per_sm=1)),
        "88.1 against 78.3 of w4 (not deferred; norm_tuning-defer.json)"),
}
# fmt: on
TUNED: Mapping[tuple[str, int, str], tuple[NormConfig, str]] = MappingProxyType(
    _with_add(_MEASURED)
)
del F, B, S, _MEASURED
