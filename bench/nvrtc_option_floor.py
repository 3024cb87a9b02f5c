"""NVRTC's fixed cost per compile under option sets: an empty kernel, no headers, no GPU.

    python bench/nvrtc_option_floor.py [--arch sm_90] [--repeat 9] [--tag dev-2core]

The floor under every cold compile of issue 7's latency target: whatever a kernel adds comes
on top of this. Times ``nvrtcCreateProgram`` + ``nvrtcCompileProgram`` + destroy for
``extern "C" __global__ void empty_kernel(float* y) {}`` with the engine's options
(``-arch``, ``-std=c++17``, ``-minimal``), and with each extra option that could cut front-end
or back-end work. ``keeps SASS`` says whether the option leaves a compiled kernel's machine
code alone (the issue allows only those): ``-Ofc`` and ``-Xptxas -O0`` change it, PTX
output has none. Three warm-up compiles first (NVRTC's initialization), then ``--repeat``
rounds over all the sets in turn (so that a drift in the machine's speed touches each);
median, min and max per set.
Writes bench/results/nvrtc_option_floor-<tag>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SOURCE = b'extern "C" __global__ void empty_kernel(float* y) {}\n'
BASE = ["-std=c++17", "-minimal"]
# (extra options, keeps the SASS of a real kernel)
EXTRAS: list[tuple[list[str], bool]] = [
    ([], True),
    (["-default-device"], True),
    (["-no-source-include"], True),
    (["-split-compile=0"], True),
    (["-Xptxas", "-O0"], False),
    (["-Ofc=max"], False),
]


def compile_ms(options: list[str]) -> float:
    """One compile of the empty kernel, milliseconds."""
    from cuda.bindings import nvrtc

    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(SOURCE, b"empty.cu", 0, [], [])
    if int(err):
        raise RuntimeError(f"nvrtcCreateProgram: {err}")
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
    nvrtc.nvrtcDestroyProgram(prog)
    if int(err):
        raise RuntimeError(f"nvrtcCompileProgram {options}: {err}")
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--tag", default="dev-2core")
    args = parser.parse_args()
    from nvrtc_engine.nvrtc import nvrtc_version

    cubin = [f"-arch={args.arch}", *BASE]
    sets = [(" ".join(extra) or "(engine options)", "cubin", keeps, cubin + extra)
            for extra, keeps in EXTRAS]  # fmt: skip
    sets.append(("(engine options), PTX output", "ptx", False,
                 [f"-arch=compute_{args.arch[3:]}", *BASE]))  # fmt: skip
    for _ in range(3):  # NVRTC's initialization, and the machine settling
        compile_ms(cubin)
    times: list[list[float]] = [[] for _ in sets]
    for _ in range(args.repeat):  # round-robin: a drift of the machine's speed hits all sets
        for i, (*_, options) in enumerate(sets):
            times[i].append(compile_ms(options))
    rows = [{"options": name, "output": output, "keeps_sass": keeps,
             "ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
            for (name, output, keeps, _), t in zip(sets, times, strict=True)]  # fmt: skip
    path = common.write_results(f"nvrtc_option_floor-{args.tag}", {
        "arch": args.arch, "nvrtc": nvrtc_version(), "repeat": args.repeat, "rows": rows,
    })  # fmt: skip
    print(f"empty kernel, NVRTC {nvrtc_version()}, {args.arch}, median of {args.repeat}, "
          f"{common.host_info()['cpus']} CPUs")  # fmt: skip
    print(common.table(rows, [("options", "options", ""), ("output", "output", ""),
                              ("keeps_sass", "keeps SASS", ""), ("ms", "median ms", ".1f"),
                              ("min_ms", "min", ".1f"), ("max_ms", "max", ".1f")]))  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
