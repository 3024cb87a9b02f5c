"""What programmatic dependent launch (PDL, sm_90+) saves per kernel boundary on this GPU.

    python bench/tuning/pdl_probe.py [--mib 96] [--rounds 5] [--repeat 20] [--name pdl_probe]

bench/norm_fixed_cost.py found the norm forwards at H = 4096 and 8192 with a fixed cost of
4.7-10 us per call where a copy of the same bytes has 2.9-4.1 us. Part of any kernel's fixed
cost in a stream of back-to-back kernels is the boundary: the next grid is launched only
after the previous one has completed and its memory is flushed. With the launch attribute
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION the next grid may start early; its
threads run ``griddepcontrol.wait`` before touching memory, which returns once the previous
grid has completed and flushed, so the results are the same.

This probe copies --mib MiB (uint4 accesses, every call on its own buffers, cycled past the
L2) with a kernel that is the same in every mode except the PTX at its start, launched
back to back by cuLaunchKernelEx (cuda.bindings), timed with CUDA events over batches of
10 in paired rounds (common.paired_ms):

  - ``plain``: no griddepcontrol, no attribute (an ordinary launch);
  - ``wait``: ``griddepcontrol.wait`` first, launched without the attribute (its cost alone);
  - ``pdl``: the same kernel launched with the attribute; no trigger, so the next grid starts
    when this one's blocks have all exited;
  - ``pdl+trigger``: also ``griddepcontrol.launch_dependents`` right after the wait, so the
    next grid may be scheduled as soon as every block of this one has started.

Two grids each: persistent (SMs x 8 CTAs of 256 threads, a strided loop) and one CTA per 16
KiB. Writes bench/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/

import common

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256)
probe(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n) {
#if WAIT
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if TRIGGER
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[i];
}
"""
MODES = {"plain": (0, 0, False), "wait": (1, 0, False), "pdl": (1, 0, True),
         "pdl+trigger": (1, 1, True)}  # fmt: skip
BLOCK = 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=96, help="MiB copied per call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--name", type=common.result_name, default="pdl_probe")
    args = parser.parse_args()
    import torch
    from cuda.bindings import driver as cu

    from nvrtc_engine.core import nvrtc

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"

    def check(result: Any) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None

    functions = {}
    for mode, (wait, trigger, _) in MODES.items():
        opts = nvrtc.CompileOptions(arch=arch, defines=(("WAIT", str(wait)),
                                                        ("TRIGGER", str(trigger))))  # fmt: skip
        image = nvrtc.compile_source(f"probe_{mode}.cu", SOURCE, (), opts).image
        module = check(cu.cuModuleLoadData(image))
        functions[mode] = check(cu.cuModuleGetFunction(module, b"probe"))

    nbytes = args.mib << 20
    n = nbytes // 16
    copies = max(2, -(-(256 << 20) // (2 * nbytes)))

    def pair() -> tuple[Any, Any]:
        return (torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
                torch.empty(nbytes, dtype=torch.uint8, device="cuda"))  # fmt: skip

    bufs = [pair() for _ in range(copies)]
    stream = torch.cuda.current_stream().cuda_stream
    grids = {"persistent": props.multi_processor_count * 8, "one CTA per 16 KiB": -(-n // 1024)}

    def launcher(mode: str, grid: int) -> Any:
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = BLOCK, 1, 1
        cfg.sharedMemBytes = 0
        cfg.hStream = cu.CUstream(stream)
        if MODES[mode][2]:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs, cfg.numAttrs = [attr], 1
        else:
            cfg.numAttrs = 0
        types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong)
        params = [((s.data_ptr(), d.data_ptr(), n), types) for s, d in bufs]
        state = {"i": 0}
        fn = functions[mode]

        def call() -> None:
            i = state["i"]
            state["i"] = (i + 1) % len(params)
            check(cu.cuLaunchKernelEx(cfg, fn, params[i], 0))

        return call

    # correctness of every mode: each copy lands whole
    for s, _ in bufs:
        s.random_(0, 256)
    for mode in MODES:
        for grid in grids.values():
            for _, d in bufs:
                d.zero_()
            call = launcher(mode, grid)
            for _ in range(copies):
                call()
            torch.cuda.synchronize()
            bad = [i for i, (s, d) in enumerate(bufs) if not torch.equal(s, d)]
            if bad:
                raise SystemExit(f"{mode}: copies {bad} differ")

    fns = {(mode, gname): launcher(mode, grid) for mode in MODES for gname, grid in grids.items()}
    times = common.paired_ms(fns, rounds=args.rounds, repeat=args.repeat)
    copy = common.copy_bandwidth_gbps()
    rows = []
    for gname in grids:
        base = statistics.median(times[("plain", gname)])
        for mode in MODES:
            ms = statistics.median(times[(mode, gname)])
            ratios = [b / t for b, t in zip(times[("plain", gname)], times[(mode, gname)],
                                            strict=True)]  # fmt: skip
            rows.append({"grid": gname, "mode": mode, "us": ms * 1e3,
                         "saved_us": (base - ms) * 1e3,
                         "pct_of_copy": 100 * 2 * nbytes / (ms * 1e-3) / 1e9 / copy,
                         "vs_plain": statistics.median(ratios),
                         "rounds_us": [t * 1e3 for t in times[(mode, gname)]]})  # fmt: skip
    path = common.write_results(args.name, {
        **common.gpu_info(), "copy_gbps": copy, "mib": args.mib, "rounds": args.rounds,
        "repeat": args.repeat, "grids": grids, "rows": rows,
    })  # fmt: skip
    print(f"copy of {args.mib} MiB per call; device copy (1 GiB): {copy:.0f} GB/s")
    print(common.table(rows, [("grid", "grid", ""), ("mode", "mode", ""), ("us", "us", ".2f"),
                              ("saved_us", "saved us", ".2f"), ("vs_plain", "x plain", ".3f"),
                              ("pct_of_copy", "% of copy", ".1f")]))  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
