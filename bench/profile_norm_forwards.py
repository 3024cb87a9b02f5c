"""Launch norm forwards once each, for a hardware-counter profile under Nsight Compute:

    ncu --clock-control none -k regex:norm_fwd --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section LaunchStats --csv --page details \\
        python bench/profile_norm_forwards.py [--cases layernorm:4096:fp8:16384,...]

``--cases`` NORM:H:OUT:N as in bench/norm_tail.py (default: LayerNorm FP8 4096 and RMSNorm
FP8 65536, the forwards nearest 90% of copy bandwidth, each beside its bf16 sibling; RMSNorm
FP8 4096, a register layout; LayerNorm FP8 65536). bf16 x, gamma and beta; FP8 is E4M3 with
tensor scaling. Every kernel is compiled before the first launch, so the profile holds one
launch of each, in the order given. ``--cast`` adds, after them, one launch of nvrtc_engine's
``cast`` (bf16 -> E4M3, tensor scaling) of an x of each case's shape: the same x read and z
written with no row statistics, to set the norms' DRAM and L2 counts beside (profile with
``-k regex:'norm_fwd|cast'``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from norm_bandwidth import MIN_CYCLE_BYTES, Cycle, forward_rows, forward_weights, kernel_forward
from norm_tail import parse_cases

DEFAULT = ("layernorm:4096:fp8:16384,layernorm:4096:bf16:16384,rmsnorm:4096:fp8:16384,"
           "rmsnorm:65536:fp8:2048,rmsnorm:65536:bf16:2048,layernorm:65536:fp8:2048")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT, help="NORM:H:OUT:N,...")
    parser.add_argument("--cast", action="store_true",
                        help="then one FP8 cast of an x of each case's shape")  # fmt: skip
    args = parser.parse_args()
    try:
        cases = parse_cases(args.cases)
    except ValueError as exc:
        parser.error(f"--cases {exc}")
    torch = common.torch_or_exit(parser)

    import nvrtc_engine as ne

    kernels = [ne.get_kernel(f"{norm}_fwd", in_dtype="bf16", out_dtype=out, hidden_size=h)
               for norm, h, out, _ in cases]  # fmt: skip
    for k, (norm, h, out, n) in zip(kernels, cases, strict=True):
        fp8_out = out == "fp8"
        one_set = Cycle(lambda n=n, h=h, o=fp8_out: forward_rows(n, h, o), MIN_CYCLE_BYTES)
        w, b, fp8 = forward_weights(h, fp8_out)
        kernel_forward(k, one_set, norm == "layernorm", w, b, **fp8)()
        torch.cuda.synchronize()
        print(k.artifact.symbols[0], k.residency(torch.cuda.current_device()), flush=True)
    if args.cast:
        cast = ne.get_kernel("cast", dtype="fp8")
        for _, h, _, n in cases:
            rows = forward_rows(n, h, True)
            cast(rows["x"], rows["z"], **forward_weights(h, True)[2])
            torch.cuda.synchronize()
            print(cast.artifact.symbols[0], f"{n}x{h}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
