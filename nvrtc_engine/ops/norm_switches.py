"""The norm family's measured settings: hardware limits, layout targets, code switches and
:data:`TUNED`, each with the measurement that set it.

:mod:`.norm_layout` chooses a variant's layout from these and :mod:`.norm_kernels` sizes its
grids from them. Both read them through this module when they run (``norm_switches.NAME``),
so a test or a tuning script may change one here. The settings are not part of the variant
key: after a change, ``norm_layout.launch_config.cache_clear()`` (layouts are cached per key)
and ``nvrtc_engine.clear_cache(disk=False)`` (kernels, with their prepared launches); the disk cache
checks a kernel's symbols, which carry the layout's tag. docs/norms.md has the recipe. The
switches are off by default unless said; :data:`TUNED` turns them on where they were measured
to win.
"""

from __future__ import annotations

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
NEXT_ROW_SCALING = ("tensor", "none")
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
# were not measured with it. The SASS with and without A differs only in the immediate that
# locates the stages (bench/sass.py edits=align16 --diff), so it is the hardware's response to
# the address, not other code; in LayerNorm FP8 4096 (source_ab-2026-12-05-stage-offsets.json)
# every start 16 bytes off a 32-byte sector (48, 80, 112) lost 13-16%, starts on one (32, 64,
# 96) were within 1.5% of 128, and 256 or 512 added nothing.
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

# Until issue 44 deletes the switches above, the cache digest of a norm kernel takes in any
# switch a test or tuning script changed (nvrtc_engine.cache.digest), so that no kernel built
# under one setting is served under another.
_IMPORTED = {n: dict(v) if isinstance(v, dict) else v for n, v in globals().items() if n.isupper()}


def changed() -> str:
    """The switches whose values differ from this file's, as text; ``""`` when none do."""
    now = globals()
    diff = [(name, now[name]) for name, value in _IMPORTED.items() if now[name] != value]
    return repr(diff) if diff else ""
