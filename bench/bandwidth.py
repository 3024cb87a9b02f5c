"""Bandwidth of one kernel family on the GPU: nvrtc_engine against the device copy, PyTorch
eager and torch.compile of the same math.

    python bench/bandwidth.py --family activation|norm|cast [--shapes NxH,...] [--ops ...]
                              [--no-compile] [--repeat N] [--paired ROUNDS] [--name NAME]
    python bench/bandwidth.py --family norm --dry-run [--arch sm_90]   # no GPU: compile only

Each timing is common.cuda_time_ms: CUDA events around 10 back-to-back calls, divided by 10,
the median of ``--repeat`` such samples after 5 warm-up calls. The copy bandwidth is a torch
``copy_`` of 1 GiB timed the same way (bytes read + written), at the start of the run
(``copy_gbps``, what ``% of copy`` divides by) and again at its end (``copy_gbps_end``).
What each family times, its defaults and its result schema: bench/families/*.py. Writes
bench/results/NAME.json (default FAMILY_bandwidth; and $OUT/NAME.json where OUT is set).
``--dry-run`` compiles every engine kernel the run would launch for ``--arch`` and exits:
a check of the arguments and the kernels on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

FAMILIES = ("activation", "norm", "cast")


def family_module(name: str) -> ModuleType:
    return importlib.import_module(f"families.{name}")


def shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``' type: comma-separated ``NxH`` of positive integers."""
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"[1-9]\d*x[1-9]\d*", p) for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: NxH,... with positive integers")
    return [(int(n), int(h)) for n, h in (p.split("x") for p in parts)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--family", required=True, choices=FAMILIES)
    parser.add_argument("--shapes", type=shapes, help="NxH,... (tokens x hidden; cast: M x K); "
                        "default: the family's")  # fmt: skip
    parser.add_argument("--ops", default="", help="activation: ops to run (default all); "
                        "norm: layernorm, rmsnorm or both")  # fmt: skip
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--compile-ops", default="", help="activation: the ops also timed under "
                        "torch.compile (default all)")  # fmt: skip
    parser.add_argument("--kernels", choices=["specialized", "general"], default="specialized",
                        help="activation: hidden_size compiled in (default) or None")  # fmt: skip
    parser.add_argument("--repeat", type=int, help="samples per timing (default: the family's)")
    parser.add_argument("--paired", type=int, metavar="ROUNDS", help="rounds of the kernel "
                        "paired with torch.compile (norm: default 20; cast: 0, none)")  # fmt: skip
    parser.add_argument("--name", type=common.result_name, help="bench/results/NAME.json "
                        "(default FAMILY_bandwidth)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="compile the kernels, no GPU")
    parser.add_argument("--arch", default="sm_90", help="--dry-run's arch (default sm_90)")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = parser.parse_args(argv)
    family = family_module(args.family)
    defaults = family.DEFAULTS
    args.shapes = args.shapes or shapes(defaults["shapes"])
    args.repeat = args.repeat if args.repeat is not None else defaults["repeat"]
    args.paired = args.paired if args.paired is not None else defaults["paired"]
    args.name = args.name or f"{args.family}_bandwidth"
    if args.repeat < 1 or args.paired < 0:
        parser.error("--repeat must be at least 1 and --paired at least 0")
    problem = family.check(args)
    if problem:
        parser.error(problem)
    args.parser = parser
    return args


def dry_run(args: argparse.Namespace, family: ModuleType) -> int:
    """Compile every engine kernel of the run for ``args.arch`` (no GPU needed)."""
    import nvrtc_engine as ne

    start = time.perf_counter()
    wanted = family.kernels(args)
    names = {str(ne.get_kernel(op, arch=args.arch, **fields).key) for op, fields in wanted}
    print(f"{args.family}: {len(names)} kernels for {args.arch} ready in "
          f"{time.perf_counter() - start:.1f} s; {len(args.shapes)} shapes; would write "
          f"{common.results_dir() / args.name}.json")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    family = family_module(args.family)
    if args.dry_run:
        return dry_run(args, family)
    torch = common.torch_or_exit(args.parser)
    torch.manual_seed(0)
    reference = common.CopyReference()
    copy = reference.gbps()
    payload = family.run(args, reference, copy)
    copy_end = reference.gbps()
    path = common.write_results(args.name, {**common.gpu_info(), "copy_gbps": copy,
                                            "copy_gbps_end": copy_end, **payload})  # fmt: skip
    print(f"device copy: {copy:.0f} GB/s at the start, {copy_end:.0f} at the end; bf16 input; "
          "GB/s counts each tensor once")  # fmt: skip
    print(family.show(payload))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
