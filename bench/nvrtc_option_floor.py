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

Then a ladder of kernels under the engine's options, in the same round-robin: the empty
kernel; the smallest GELU kernel one can write with the engine's device helpers (one bf16
element per thread, a bounds check: no vector access, no tail loop, no amax; far from the
bandwidth targets, so only a lower bound); the engine's own GELU variants bf16 -> bf16 and
bf16 -> fp8_e4m3 (rendered from templates/activation.cu.j2). What a kernel adds to the floor
shows how much room a kernel that meets the bandwidth targets has under a compile target.
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


# The fewest instructions a GELU kernel can have with the engine's helpers.
SCALAR_GELU = b"""#include "nve_types.cuh"
#include "nve_act.cuh"
extern "C" __global__ void scalar_gelu(const unsigned short* x, unsigned short* y, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = nve::bf16::store(nve::gelu(nve::bf16::load(x[i])));
}
"""


def compile_ms(
    options: list[str], source: bytes = SOURCE, headers: tuple[tuple[str, str], ...] = ()
) -> float:
    """One compile of ``source`` (default: the empty kernel), milliseconds."""
    from cuda.bindings import nvrtc

    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(
        source, b"floor.cu", len(headers), [t.encode() for _, t in headers],
        [n.encode() for n, _ in headers],
    )  # fmt: skip
    if int(err):
        raise RuntimeError(f"nvrtcCreateProgram: {err}")
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
    nvrtc.nvrtcDestroyProgram(prog)
    if int(err):
        raise RuntimeError(f"nvrtcCompileProgram {options}: {err}")
    return (time.perf_counter() - start) * 1e3


def _ladder(arch: str) -> list[tuple[str, bytes, tuple[tuple[str, str], ...]]]:
    """(name, source, in-memory headers) of the kernel ladder, the empty kernel first."""
    import nvrtc_engine as ne
    from nvrtc_engine import render

    helpers = render.helper_headers()
    ladder = [("empty kernel", SOURCE, ()), ("scalar GELU (lower bound)", SCALAR_GELU, helpers)]
    for out in ("bf16", "fp8_e4m3"):
        src = render.render(ne.make_key("gelu", in_dtype="bf16", out_dtype=out, arch=arch))
        if src.cuda_headers:  # CUDA toolkit headers: not comparable with the floor
            continue
        ladder.append((f"engine {src.name}", src.source.encode(), tuple(src.headers)))
    return ladder


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
    ladder = _ladder(args.arch)
    for _ in range(3):  # NVRTC's initialization, and the machine settling
        compile_ms(cubin)
    times: list[list[float]] = [[] for _ in sets]
    for _ in range(args.repeat):  # round-robin: a drift of the machine's speed hits all sets
        for i, (*_, options) in enumerate(sets):
            times[i].append(compile_ms(options))
    rows = [{"options": name, "output": output, "keeps_sass": keeps,
             "ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
            for (name, output, keeps, _), t in zip(sets, times, strict=True)]  # fmt: skip
    ladder_times: list[list[float]] = [[] for _ in ladder]
    for _ in range(args.repeat):
        for i, (_, source, headers) in enumerate(ladder):
            ladder_times[i].append(compile_ms(cubin, source, headers))
    floor = statistics.median(ladder_times[0])
    kernels = [{"kernel": name, "ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                "over_floor_ms": statistics.median(t) - floor}
               for (name, _, _), t in zip(ladder, ladder_times, strict=True)]  # fmt: skip
    path = common.write_results(f"nvrtc_option_floor-{args.tag}", {
        "arch": args.arch, "nvrtc": nvrtc_version(), "repeat": args.repeat, "rows": rows,
        "kernels": kernels,
    })  # fmt: skip
    print(f"empty kernel, NVRTC {nvrtc_version()}, {args.arch}, median of {args.repeat}, "
          f"{common.host_info()['cpus']} CPUs")  # fmt: skip
    print(common.table(rows, [("options", "options", ""), ("output", "output", ""),
                              ("keeps_sass", "keeps SASS", ""), ("ms", "median ms", ".1f"),
                              ("min_ms", "min", ".1f"), ("max_ms", "max", ".1f")]))  # fmt: skip
    print(common.table(kernels, [("kernel", "kernel (engine options)", ""),
                                 ("ms", "median ms", ".1f"), ("over_floor_ms", "over empty", ".1f"),
                                 ("min_ms", "min", ".1f"), ("max_ms", "max", ".1f")]))  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
