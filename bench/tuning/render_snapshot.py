"""What every norm variant renders to, as a snapshot to compare before and after a refactor.

    python bench/tuning/render_snapshot.py --out before.json [--switches]
    python bench/tuning/render_snapshot.py --compare before.json after.json

For each key of the norm family (every op; fp32, fp16 and bf16 x; z in x's dtype, E4M3 with
tensor scaling and E5M2 MXFP8 for the forwards; no flag, zero-centred gamma, fp32 gamma; the
general kernel and H in {64, 768, 1000, 1024, 4096, 5120, 8192, 14336, 16384, 65536}; sm_80,
sm_89, sm_90 and sm_100a) it records the kernel's symbols, the SHA-256 of its rendered
source and its launch configuration. No GPU and no compile: rendering is what a refactor of
the Python side or a split of the template could change. ``--switches`` records the same
with ``norm_switches.TUNED`` empty and the code switches on (the staged kernels of 3 stages,
held weights, and every switch that changes code), so that the code paths the defaults
leave off are covered too. ``--compare`` prints how many keys match and the first that do
not, and exits 1 when any differ. Used to split ops/norm.py into four modules and
templates/norm.cu.j2 into five files (2026-12-04): 3168 keys the same, both ways.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HIDDEN = [None, 64, 768, 1000, 1024, 4096, 5120, 8192, 14336, 16384, 65536]
ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100a"]
OPS = ["layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"]
FORWARD_MODES = [("same", "none"), ("fp8_e4m3", "tensor"), ("fp8_e5m2", "mxfp8")]
FLAGS: list[dict[str, bool]] = [{}, {"zero_centered_gamma": True}, {"fp32_gamma": True}]
# the settings --switches turns on (norm_switches names), beside TUNED = {}
SWITCHES: dict[str, Any] = {
    "FWD_STAGED": 3, "BWD_STAGED": 3, "FWD_GAMMA32": True, "ROW_SUM_LANES": True,
    "BWD_STAGED_WORDS": True, "BWD_FOLDED": True, "BWD_DEFERRED": True, "FWD_DEFERRED": True,
    "FWD_REREAD": True, "FWD_SHIFTED": True, "STAGED_FETCH256": True, "STAGED_ALIGNED": True,
    "BWD_PREFETCH": True, "BWD_CLUSTERS": True, "FWD_WARP_STATS": True,
    "FWD_HOLD_WEIGHTS": {"none": True, "tensor": True, "mxfp8": False},
}  # fmt: skip


def snapshot(switches: bool) -> dict[str, list[Any]]:
    """``{key: [symbols, sha256 of the rendered source, repr of the layout]}``."""
    import nvrtc_engine as ne
    from nvrtc_engine.ops import norm, norm_switches
    from nvrtc_engine.render import render

    if switches:
        norm_switches.TUNED = {}
        for name, value in SWITCHES.items():
            if not hasattr(norm_switches, name):
                sys.exit(f"norm_switches has no {name}: update SWITCHES in {__file__}")
            setattr(norm_switches, name, value)
        norm.launch_config.cache_clear()
    out: dict[str, list[Any]] = {}
    for arch in ARCHS:
        for hidden in HIDDEN:
            for dt in ("fp32", "fp16", "bf16"):
                for op in OPS:
                    modes = [("same", "none")] if "bwd" in op else FORWARD_MODES
                    for z, scaling in modes:
                        for flags in FLAGS:
                            if dt == "fp32" and "fp32_gamma" in flags:
                                continue
                            key = ne.make_key(op, in_dtype=dt, out_dtype=dt if z == "same" else z,
                                              scaling=scaling, hidden_size=hidden, arch=arch,
                                              **flags)  # fmt: skip
                            digest = hashlib.sha256(render(key).source.encode()).hexdigest()
                            out[str(key)] = [list(key.spec.symbols(key)), digest,
                                             repr(norm.launch_config(key))]  # fmt: skip
    return out


def compare(a: Path, b: Path) -> int:
    """Print how many keys of two snapshots match; 1 where any key differs or is missing."""
    first, second = json.loads(a.read_text()), json.loads(b.read_text())
    keys = sorted(set(first) | set(second))
    differ = [k for k in keys if first.get(k) != second.get(k)]
    print(f"{len(keys) - len(differ)} of {len(keys)} keys the same ({a.name} against {b.name})")
    for k in differ[:10]:
        print(f"  differs: {k}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the snapshot to this JSON file")
    parser.add_argument(
        "--switches",
        action="store_true",
        help="TUNED empty and the code switches on (see the module docstring)",
    )
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                        help="compare two snapshots instead of taking one")  # fmt: skip
    args = parser.parse_args()
    if args.compare:
        for path in args.compare:
            if not path.is_file():
                parser.error(f"--compare: no file {path}")
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out FILE is needed to take a snapshot (or --compare A B)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    snap = snapshot(args.switches)
    args.out.write_text(json.dumps(snap, indent=0, sort_keys=True))
    print(f"{len(snap)} keys -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
