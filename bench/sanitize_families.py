"""Launch the norm and cast-family kernels on small, awkward shapes, for compute-sanitizer
(bench/sanitize_kernels.py covers the activation family):

    compute-sanitizer --tool memcheck --report-api-errors no python3 bench/sanitize_families.py
    compute-sanitizer --tool racecheck --report-api-errors no python3 bench/sanitize_families.py

``--list`` prints the case names; ``--case SUBSTRING`` runs only the matching cases (one
process per case isolates a failure). Norms: LayerNorm/RMSNorm forward (bf16, FP8 tensor
scaling, MXFP8) and backward, specialized and general, with odd hidden sizes and rows that
do not fill a CTA; the code switches of nvrtc_engine/ops/norm_switches.py that the defaults leave
off (``norm_switch_*``: backward prefetch, packed rows, clusters, column sums in shared
memory, the staged backward (x and dz in shared memory by cp.async); forward weights held
in registers for bf16 and MXFP8 output, the held path with several row groups per CTA,
early weight loads, the one-reduction statistics, split sums; FP8 forward with the batched
stage, warp amax, word packing and next-row copies together, ``norm_switch_fp8_ogqp``, and
the next-row copies with held weights, ``..._fp8_held_qp``, including shapes where each CTA
takes several row groups; round 8, forward and backward, on the rules' layouts and on TUNED's:
row sums across lanes by shuffles, ``..._lanes``, and with the staged backward's
shared-memory reads as 32-bit words, fp32 gamma and folded dx, ``..._round8``; round 9,
the staged forward, ``norm_switch_staged*`` and TUNED's, ``norm_switch_tuned_*``; with
several rows per CTA, ``norm_staged_rows_*``; round 11, the staged backward and forward with
each row's dx or z written a row later, ``norm_switch_*_deferred_*``; round 13, the staged
forward with x read from its stage in each pass, ``norm_switch_*_reread*``; round 16, the
staged LayerNorm FP8 forward's one-pass statistics, ``norm_switch_*_shifted*`` (round 24, on
the register layouts too, ``norm_switch_*regs_shifted*``); round 19,
the LayerNorm forward's statistics by two passes per warp, ``norm_switch_*warp_stats*``, and
round 23, with ``i``, ``norm_switch_*warp_stats_deferred*``); the
next-row copies with bf16 output at H = 65536 over a cluster of 4, ``norm_bf16_next_row_*``
(a TUNED-style tag; the defaults at 65536 are among the plain cases). The
disk cache is off: switched kernels share keys with the defaults. Cast family: cast (the
flat kernel with the identity, its own tensor-scaled configuration; aligned and at an odd
offset), cast_transpose (+ dbias, + dgelu, gated dswiglu), transpose, multi_cast_transpose and
MXFP8/NVFP4 quantize in every layout, on shapes that leave partial tiles; ``cast_switch_*``:
the dbias kernels with ``TileConfig.strip`` (several tiles per block, two shared buffers,
one barrier per tile) and ``prefetch_next``, off by default, on shapes whose strips end in
partial tiles. Correctness is the GPU tests' job; this only runs the kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

# The norm_switch_* cases build kernels under monkeypatched module switches, which the key
# does not see: keep every kernel in memory, never in (or from) the disk cache.
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"


def cases() -> dict[str, Callable[[], None]]:
    """Name -> a function that launches one kernel (arguments made on the call)."""
    import torch

    import nvrtc_engine as ne

    dev = "cuda"
    bf16 = torch.bfloat16

    def t(*shape):
        return torch.randn(*shape, device=dev).to(bf16)

    def tensor():
        return {"scale": torch.full((1,), 2.0, device=dev), "amax": torch.zeros(1, device=dev),
                "scale_inv": torch.empty(1, device=dev)}  # fmt: skip

    out: dict[str, Callable[[], None]] = {}
    # (97, 65536): the TUNED clusters with held weights, some clusters taking two row groups
    for rows, h, hidden in [(3, 1000, 1000), (5, 4096, 4096), (37, 8192, 8192), (2, 14336, 14336),
                            (97, 65536, 65536), (7, 1000, None), (3, 768, None)]:  # fmt: skip
        for nm in ("layernorm", "rmsnorm"):
            tag = f"{nm}_h{hidden or 'any'}_{h}x{rows}"

            def fwd(nm=nm, rows=rows, h=h, hidden=hidden, out_dtype="bf16", scaling=None):
                x, w, b = t(rows, h), t(h), t(h)
                fields = {"scaling": scaling} if scaling else {}
                k = ne.get_kernel(f"{nm}_fwd", in_dtype="bf16", out_dtype=out_dtype,
                                  hidden_size=hidden, **fields)  # fmt: skip
                kw = tensor() if out_dtype == "fp8" and not scaling else {}
                k(x, w, b, 1e-5, **kw) if nm == "layernorm" else k(x, w, 1e-5, **kw)

            def bwd(nm=nm, rows=rows, h=h, hidden=hidden):
                x, dz, w = t(rows, h), t(rows, h), t(h)
                mu, rs = torch.zeros(rows, device=dev), torch.ones(rows, device=dev)
                k = ne.get_kernel(f"{nm}_bwd", in_dtype="bf16", hidden_size=hidden)
                k(dz, x, mu, rs, w) if nm == "layernorm" else k(dz, x, rs, w)

            out[f"{tag}_fwd"] = fwd
            out[f"{tag}_fwd_fp8"] = lambda f=fwd: f(out_dtype="fp8")
            if h % 32 == 0:
                out[f"{tag}_fwd_mxfp8"] = lambda f=fwd: f(out_dtype="fp8", scaling="mxfp8")
            out[f"{tag}_bwd"] = bwd
    out.update(norm_switch_cases(t, tensor))
    # (96, 320): aligned rows, partial tiles (vectorized and bounds-checked lanes in one block);
    # (256, 512): MXFP8 columnwise / both take the fast path (quantize.MX_FAST_PATH)
    for m, k in [(31, 33), (130, 260), (1, 1), (256, 512), (96, 320)]:
        tag = f"{m}x{k}"
        out[f"cast_transpose_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "cast_transpose", dtype="fp8")(t(m, k), **tensor())  # fmt: skip
        # cast: the flat kernel with the identity (its own tensor-scaled configuration:
        # streaming hints, unguarded amax atomic), aligned and at an odd offset
        out[f"cast_{tag}"] = lambda m=m, k=k: ne.get_kernel("cast", dtype="fp8")(
            t(m, k), **tensor())  # fmt: skip
        out[f"cast_unaligned_{tag}"] = lambda m=m, k=k: ne.get_kernel("cast", dtype="fp8")(
            t(m * k + 1)[1:], **tensor())  # fmt: skip
        out[f"transpose_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "transpose", in_dtype="bf16", out_dtype="bf16")(t(m, k))  # fmt: skip
        out[f"cast_transpose_dbias_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "cast_transpose_dbias", dtype="fp8")(t(m, k), **tensor())  # fmt: skip
        out[f"cast_transpose_dbias_dgelu_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "cast_transpose_dbias_dgelu", dtype="fp8")(t(m, k), t(m, k), **tensor())  # fmt: skip
        out[f"dswiglu_cast_transpose_{tag}"] = lambda m=m, k=k: ne.get_kernel(
            "dswiglu_cast_transpose", dtype="fp8")(t(m, k), t(m, 2 * k), **tensor())  # fmt: skip

        def multi(m=m, k=k):
            lists = [tensor(), tensor()]
            ne.get_kernel("multi_cast_transpose", dtype="fp8")(
                [t(m, k), t(m + 1, k)], scales=[d["scale"] for d in lists],
                amaxes=[d["amax"] for d in lists], scale_invs=[d["scale_inv"] for d in lists],
            )  # fmt: skip

        out[f"multi_cast_transpose_{tag}"] = multi
        for layout in ("rowwise", "columnwise", "both"):
            out[f"quantize_mxfp8_{layout}_{tag}"] = lambda m=m, k=k, lay=layout: ne.get_kernel(
                "quantize", dtype="fp8", layout=lay)(t(m, k))  # fmt: skip
            out[f"quantize_nvfp4_{layout}_{tag}"] = lambda m=m, k=k, lay=layout: ne.get_kernel(
                "quantize", dtype="fp4_e2m1", layout=lay)(t(m, k))  # fmt: skip
    out.update(cast_switch_cases(t, tensor))
    return out


def cast_switch_cases(t: Callable, tensor: Callable) -> dict[str, Callable[[], None]]:
    """The dbias kernels built with TileConfig.strip / prefetch_next, each on a fresh engine."""
    import dataclasses

    import nvrtc_engine as ne
    import nvrtc_engine.ops.cast as cast
    from nvrtc_engine.engine import Engine

    out: dict[str, Callable[[], None]] = {}
    chosen = cast.tile_config
    for op, (threads, blocks, fields) in [
        ("cast_transpose_dbias", (128, 4, {"strip": 4})),
        ("cast_transpose_dbias", (256, 4, {"strip": 2, "prefetch_next": True})),
        ("cast_transpose_dbias_dgelu", (256, 4, {"strip": 4, "prefetch_next": True})),
        ("cast_transpose_dbias", (128, 8, {"strip": 3})),  # one shared buffer
    ]:  # fmt: skip
        for m, k in [(31, 33), (300, 260), (640, 512)]:
            tag = "_".join(f"{n}{'' if v is True else v}" for n, v in fields.items())

            def run(op=op, threads=threads, blocks=blocks, fields=fields, m=m, k=k):
                key = ne.make_key(op, dtype="fp8")
                cfg = dataclasses.replace(chosen(key), threads=threads, min_blocks=blocks,
                                          **fields)  # fmt: skip
                cast.tile_config = lambda key, cfg=cfg: cfg
                try:
                    kern = Engine().get(key)
                finally:
                    cast.tile_config = chosen
                args = (t(m, k), t(m, k)) if "dgelu" in op else (t(m, k),)
                kern(*args, **tensor())

            out[f"cast_switch_{op}_{threads}x{blocks}_{tag}_{m}x{k}"] = run
    return out


def norm_switch_cases(t: Callable, tensor: Callable) -> dict[str, Callable[[], None]]:
    """Norm kernels built with non-default switches, each on a fresh engine."""
    import torch

    import nvrtc_engine as ne
    import nvrtc_engine.ops.norm as norm
    import nvrtc_engine.ops.norm_switches as norm_switches
    from nvrtc_engine.engine import Engine

    def switched(values, op, hidden, **fields):
        values = {"TUNED": {}, **values}  # the rules alone (unless given), so the switches decide
        saved = {name: getattr(norm_switches, name) for name in values}
        try:
            for name, value in values.items():
                setattr(norm_switches, name, value)
            norm.launch_config.cache_clear()
            return Engine().get(ne.make_key(op, in_dtype="bf16", hidden_size=hidden, **fields))
        finally:
            for name, value in saved.items():
                setattr(norm_switches, name, value)
            norm.launch_config.cache_clear()

    out: dict[str, Callable[[], None]] = {}
    bwd = {
        "prefetch": {"BWD_PREFETCH": True, "BWD_PACKED": False},
        "prefetch_packed": {"BWD_PREFETCH": True, "BWD_PACKED": True},
        "packed": {"BWD_PREFETCH": False, "BWD_PACKED": True},
        "clusters": {"BWD_CLUSTERS": True},
        "shared_sums1": {"BWD_SHARED_SUMS": 1},
        "shared_sums2_capped": {"BWD_SHARED_SUMS": 2, "BWD_CAP": True},
        # round 5: x and dz staged in (dynamic) shared memory by cp.async, 2 or 3 rows deep
        "staged2": {"BWD_STAGED": 2},
        "staged3": {"BWD_STAGED": 3},
        # round 8: row sums across lanes by shuffles; the staged backward's reads as 32-bit
        # words, gamma as fp32 in shared memory, dx from the row's constants: on the rules'
        # layouts, and on TUNED's (staged, a cluster of 8 at 65536)
        "lanes": {"ROW_SUM_LANES": True},
        "tuned": {"TUNED": norm_switches.TUNED},
        "staged3_round8": {"BWD_STAGED": 3, "ROW_SUM_LANES": True, "BWD_STAGED_WORDS": True,
                           "BWD_GAMMA32": True, "BWD_FOLDED": True},
        "tuned_round8": {"TUNED": norm_switches.TUNED, "ROW_SUM_LANES": True,
                         "BWD_STAGED_WORDS": True, "BWD_GAMMA32": True, "BWD_FOLDED": True},
        # round 11: each row's dx written a row later (i), on the rules' staged layouts (3 and
        # 4 stages) and on TUNED's (clusters of 2, 4 and 8)
        "staged3_deferred": {"BWD_STAGED": 3, "BWD_DEFERRED": True},
        "staged4_deferred": {"BWD_STAGED": 4, "BWD_DEFERRED": True},
        "tuned_deferred": {"TUNED": norm_switches.TUNED, "BWD_DEFERRED": True},
    }  # fmt: skip
    for label, values in bwd.items():
        shapes = [(5, 4096), (7, 1000), (1003, 1024), (2, 14336)]
        if label.startswith(("staged", "tuned")):  # rows that wrap the stages; H odd; clusters
            shapes += [(1, 8192), (700, 14336), (37, 1001), (3, 65536), (97, 65536)]
        for rows, h in shapes:
            for nm in ("layernorm", "rmsnorm"):

                def run_bwd(values=values, rows=rows, h=h, nm=nm):
                    k = switched(values, f"{nm}_bwd", h)
                    x, dz, w = t(rows, h), t(rows, h), t(h)
                    mu = torch.zeros(rows, device="cuda")
                    rs = torch.ones(rows, device="cuda")
                    k(dz, x, mu, rs, w) if nm == "layernorm" else k(dz, x, rs, w)

                out[f"norm_switch_{label}_{nm}_bwd_h{h}x{rows}"] = run_bwd
    fwd = {
        "held": {"FWD_HOLD_WEIGHTS": dict.fromkeys(norm_switches.FWD_HOLD_WEIGHTS, True)},
        # round 3: early weight loads, one (count, mean, M2) reduction, split sums
        "early_one_a2": {"FWD_EARLY_WEIGHTS": True, "FWD_ONE_REDUCTION": True,
                         "FWD_ACCUMULATORS": 2},
        "one_a4": {"FWD_ONE_REDUCTION": True, "FWD_ACCUMULATORS": 4},
        # FP8 tensor scaling only (the other outputs ignore them): the round-4 and round-5
        # switches together (o, g, q, p), and the next-row copies with held weights (hp)
        "fp8_ogqp": {"FWD_FP8_BATCHED": True, "FWD_FP8_WARP_AMAX": True,
                     "FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True},
        "fp8_held_qp": {"FWD_HOLD_WEIGHTS": dict.fromkeys(norm_switches.FWD_HOLD_WEIGHTS, True),
                        "FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True},
        # round 8: row sums across lanes by shuffles, on the rules' layouts and on TUNED's
        "lanes": {"ROW_SUM_LANES": True},
        "tuned": {"TUNED": norm_switches.TUNED},
        "tuned_lanes": {"TUNED": norm_switches.TUNED, "ROW_SUM_LANES": True},
        # round 9: the staged forward (x in dynamic shared memory by cp.async, a persistent
        # grid), weights as stored (2 rows deep) and as fp32 (3 rows deep)
        "staged2": {"FWD_STAGED": 2},
        "staged3_f32": {"FWD_STAGED": 3, "FWD_GAMMA32": True},
        # round 11: each row's z written a row later (i), 3 stages, with one reduction
        "staged3_deferred": {"FWD_STAGED": 3, "FWD_DEFERRED": True},
        "staged3_deferred_one": {"FWD_STAGED": 3, "FWD_DEFERRED": True, "FWD_ONE_REDUCTION": True},
        "tuned_deferred": {"TUNED": norm_switches.TUNED, "FWD_DEFERRED": True},
        # round 13: x read again from its stage in each pass (y), with and without i and u
        "staged3_reread": {"FWD_STAGED": 3, "FWD_REREAD": True},
        "staged3_reread_deferred_one": {"FWD_STAGED": 3, "FWD_REREAD": True,
                                        "FWD_DEFERRED": True, "FWD_ONE_REDUCTION": True},
        "tuned_reread": {"TUNED": norm_switches.TUNED, "FWD_REREAD": True},
        # round 16: one-pass statistics about the row's first element (z: LayerNorm with an
        # FP8 output; the other outputs run without it), with and without i and y
        "staged3_shifted": {"FWD_STAGED": 3, "FWD_SHIFTED": True},
        "staged3_shifted_deferred_reread": {"FWD_STAGED": 3, "FWD_SHIFTED": True,
                                            "FWD_DEFERRED": True, "FWD_REREAD": True},
        "tuned_shifted": {"TUNED": norm_switches.TUNED, "FWD_SHIFTED": True},
        # round 24: z on the register layouts (K read from global memory), the rules' and
        # with the next-row copies (p, whose copy the z path once left out)
        "regs_shifted": {"FWD_SHIFTED": True},
        "fp8_ogqp_regs_shifted": {"FWD_FP8_BATCHED": True, "FWD_FP8_WARP_AMAX": True,
                                  "FWD_FP8_WORDS": True, "FWD_FP8_NEXT_ROW": True,
                                  "FWD_SHIFTED": True},
        # round 19: each warp's two passes and one exchange per row (W: LayerNorm without a
        # cluster, u or z), register and staged, and on TUNED's layouts; round 23, with each
        # row's z written a row later (i)
        "warp_stats": {"FWD_WARP_STATS": True},
        "staged3_warp_stats": {"FWD_STAGED": 3, "FWD_WARP_STATS": True},
        "tuned_warp_stats": {"TUNED": norm_switches.TUNED, "FWD_WARP_STATS": True},
        "staged3_warp_stats_deferred": {"FWD_STAGED": 3, "FWD_WARP_STATS": True,
                                        "FWD_DEFERRED": True},
        "tuned_warp_stats_deferred": {"TUNED": norm_switches.TUNED, "FWD_WARP_STATS": True,
                                      "FWD_DEFERRED": True},
    }  # fmt: skip
    # the next-row copies with bf16 output (a TUNED-style tag: no module switch turns them on
    # there), a cluster of 4, with and without held weights; 97 and 300 rows: clusters that
    # take several row groups (FWD_GROUPS_PER_CTA, 8)
    for tag in ("w8r1v8j8c4p", "w8r1v8j8c4hp"):
        for rows in (1, 97, 300):
            for nm in ("layernorm", "rmsnorm"):

                def run_p(tag=tag, rows=rows, nm=nm):
                    op = f"{nm}_fwd"
                    k = switched({"TUNED": {(op, 65536, "none"): tag}}, op, 65536)
                    assert k.config.next_row
                    x, w, b = t(rows, 65536), t(65536), t(65536)
                    k(x, w, b, 1e-5) if nm == "layernorm" else k(x, w, 1e-5)

                out[f"norm_bf16_next_row_{tag}_{nm}_h65536x{rows}"] = run_p
    # round 10: the staged forward with 2 and 4 rows per CTA (TUNED-style tags): a row slot
    # without a row in the last group (3 and 7 rows), stages that wrap (2000), H = 1000 (a
    # partial access), H odd (copied element by element)
    # (and, by the last three tags, the weights in registers: held, h, or per row, e)
    for tag, h in (("w4r2v8j4c1qt2", 4096), ("w2r4v8j8c1qft3", 4096), ("w1r4v8j4c1t2", 1000),
                   ("w1r2v1j32c1ft3", 1001), ("w4r2v8j4c1eqt3", 4096), ("w1r2v1j32c1ht2", 1001),
                   ("w4r1v8j8c8ht2", 65536)):  # fmt: skip
        for rows in (1, 3, 7, 2000):
            for nm in ("layernorm", "rmsnorm"):
                for out_dtype, scaling in (("bf16", "none"), ("fp8", "tensor")):

                    def run_rows(tag=tag, h=h, rows=rows, nm=nm, out_dtype=out_dtype,
                                 scaling=scaling):  # fmt: skip
                        op = f"{nm}_fwd"
                        k = switched({"TUNED": {(op, h, scaling): tag}}, op, h,
                                     out_dtype=out_dtype, scaling=scaling)  # fmt: skip
                        assert k.config.stages > 1
                        x, w, b = t(rows, h), t(h), t(h)
                        kw = tensor() if scaling == "tensor" else {}
                        k(x, w, b, 1e-5, **kw) if nm == "layernorm" else k(x, w, 1e-5, **kw)

                    name = f"{nm}_fwd_{out_dtype}_{scaling}_h{h}x{rows}"
                    out[f"norm_staged_rows_{tag}_{name}"] = run_rows
    for label, values in fwd.items():
        fp8_only = label.startswith("fp8_")
        # (2000, 4096), (700, 14336): more row groups than the CTAs of the grid, so each CTA
        # takes several and the next-row copies run
        sizes = [(3, 1000), (4099, 1024), (5, 4096), (2, 65536)]
        if label.startswith("tuned"):  # TUNED's layouts at 4096-14336 (clusters at 8192)
            sizes = [*sizes, (513, 4096), (67, 8192), (700, 14336)]
        if label.startswith(("tuned", "staged")):  # rows that wrap the stages; H odd; clusters
            sizes = [*sizes, (2000, 4096), (37, 1001), (97, 65536)]
        for rows, h in sizes + ([(2000, 4096), (700, 14336)] if fp8_only else []):
            for nm in ("layernorm", "rmsnorm"):
                for out_dtype, scaling in (("bf16", "none"), ("fp8", "tensor"),
                                           ("fp8", "mxfp8")):  # fmt: skip
                    if (scaling == "mxfp8" and h % 32) or (fp8_only and scaling != "tensor"):
                        continue

                    def run_fwd(values=values, rows=rows, h=h, nm=nm, out_dtype=out_dtype,
                                scaling=scaling):  # fmt: skip
                        k = switched(values, f"{nm}_fwd", h, out_dtype=out_dtype,
                                     scaling=scaling)  # fmt: skip
                        x, w, b = t(rows, h), t(h), t(h)
                        kw = tensor() if scaling == "tensor" else {}
                        k(x, w, b, 1e-5, **kw) if nm == "layernorm" else k(x, w, 1e-5, **kw)

                    tag = f"{nm}_fwd_{out_dtype}_{scaling}_h{h}x{rows}"
                    out[f"norm_switch_{label}_{tag}"] = run_fwd
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--case", default="", help="run only cases containing this substring")
    args = parser.parse_args()
    import torch

    chosen = {name: fn for name, fn in cases().items() if args.case in name}
    if args.list:
        print("\n".join(chosen))
        return 0
    for name, fn in chosen.items():
        print(name, flush=True)
        fn()
        torch.cuda.synchronize()  # a fault is reported at the launch that caused it
    print(f"{len(chosen)} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
