"""Host time per launch of small kernels with torch tensors, beside PyTorch's own ops and the
driver's cuLaunchKernel.

    python bench/launch_overhead.py            # on a GPU host (torch, CUDA)
    python bench/launch_overhead.py --cpu      # no GPU: stub libcuda + fake torch tensors

Times (microseconds per call, best of --repeat runs of --calls calls, the GPU not waited on):
Kernel.__call__ of a GELU bf16 kernel on a (1, 1024) tensor (its launch plan; allocating the
output; without a plan, the generic path; the plan's Python fast path; the plan launching
through cuda.bindings instead of the compiled launcher), one small call of each family,
torch.nn.functional.gelu and rms_norm, a cuLaunchKernel through cuda.bindings with per-call
argument tuples, and the bare compiled launch (cuLaunchKernel from C with fixed arguments).
Runs of 200 calls by default: a run of thousands outgrows the GPU's queue of pending
launches, after which each launch waits for the GPU to retire one. Then (--paired ROUNDS)
the main rows again in shuffled rounds, each with its median excess over the bare launch of
the same round (the host's speed drifts between minutes by more than the differences
sought). On a GPU host with nvcc, bench/launch_floor.cu gives the driver's own time per
launch from C++ (``floor:`` rows). Writes bench/results/launch_overhead.json.

--cpu measures the Python side only: tests/host_cuda/libcuda_stub.c stands in for libcuda (so
cuda.bindings and ctypes still convert every argument; the stub's cuLaunchKernel returns at
once) and tests/fake_torch.py for torch. Writes bench/results/launch_overhead-cpu.json.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

HERE = Path(__file__).resolve().parent


def per_call_us(fn: Callable[[], Any], sync: Callable[[], Any], calls: int, repeat: int) -> float:
    for _ in range(200):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        sync()
    return best


BARE = "step: cuLaunchKernel (compiled launcher, packed params)"
PAIRED = (  # the rows timed again in paired rounds (--paired), against the bare launch
    "Kernel.__call__(x, out)",
    "Kernel.__call__(x, out), Python fast path (plans.fast_path, LaunchPlan.run)",
    "Kernel.__call__(x, out), through cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)",
    "torch.nn.functional.gelu(x)",
    "raw cuLaunchKernel, argument tuples",
    BARE,
)


def paired_rows(
    cases: dict[str, Callable[[], Any]], sync: Callable[[], Any], calls: int, rounds: int
) -> list[dict[str, Any]]:
    """The :data:`PAIRED` cases timed in ``rounds`` rounds, each case once per round in a
    shuffled order (the host's speed drifts between minutes by more than the differences
    sought): per case the median over rounds of its time per call and of its excess over the
    bare launch (:data:`BARE`, the driver's cuLaunchKernel called from C with fixed
    arguments) in the same round."""
    import random
    import statistics

    names = [n for n in PAIRED if n in cases]
    if BARE not in names:
        return []
    times: dict[str, list[float]] = {n: [] for n in names}
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            times[name].append(per_call_us(cases[name], sync, calls, 1))
    rows = []
    for name in PAIRED:
        if name not in times:
            continue
        over = [t - b for t, b in zip(times[name], times[BARE], strict=True)]
        rows.append({"case": f"paired: {name}", "us": statistics.median(times[name]),
                     "over_bare_us": statistics.median(over), "rounds": rounds})  # fmt: skip
        print(f"{rows[-1]['us']:8.2f}  ({rows[-1]['over_bare_us']:+.2f} over the bare launch)  "
              f"{rows[-1]['case']}", file=sys.stderr)  # fmt: skip
    return rows


def cpu_environment() -> Any:
    """Stub libcuda and fake torch (tests/): returns the fake torch module."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import fake_torch
    import stub_driver

    stub_driver.load()  # before cuda.bindings opens the driver
    torch = fake_torch.module(current_stream=0x5000)
    sys.modules["torch"] = torch
    return torch


def family_cases(ne: Any, torch: Any, cuda: Any) -> dict[str, Callable[[], Any]]:
    """One small call of each family (plus GELU with tensor-scaled FP8 output)."""
    bf16, fp32, fp8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn

    def empty(*shape: int, dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device=cuda)

    def filled(*shape: int, dtype: Any, value: float | None = None) -> Any:
        """Defined values (normal samples, or ``value``): uninitialized memory (NaN, huge
        values) changes what the amax guard and atomics do on the GPU. tests/fake_torch.py
        (--cpu) has only ``empty``, and no GPU reads the values there."""
        if not hasattr(torch, "randn"):
            return empty(*shape, dtype=dtype)
        if value is None:
            return torch.randn(*shape, device=cuda).to(dtype)
        return torch.full(shape, value, dtype=dtype, device=cuda)

    x = filled(1, 1024, dtype=bf16)
    s, a, si = filled(1, dtype=fp32, value=1.0), filled(1, dtype=fp32, value=0.0), empty(
        1, dtype=fp32)  # fmt: skip
    gelu_fp8 = ne.get_kernel("gelu", dtype="fp8")
    y8 = empty(1, 1024, dtype=fp8)
    dgelu = ne.get_kernel("dgelu", dtype="bf16")
    g, dx = empty(1, 1024, dtype=bf16), empty(1, 1024, dtype=bf16)
    swiglu = ne.get_kernel("swiglu", dtype="bf16")
    h, sw = empty(4, 2048, dtype=bf16), empty(4, 1024, dtype=bf16)
    rms = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024)
    xr, gamma = empty(4, 1024, dtype=bf16), empty(1024, dtype=bf16)
    z, rs = empty(4, 1024, dtype=bf16), empty(4, dtype=fp32)
    ct = ne.get_kernel("cast_transpose", dtype="fp8")
    xc, q, qt = empty(128, 128, dtype=bf16), empty(128, 128, dtype=fp8), empty(128, 128, dtype=fp8)
    return {
        "gelu bf16->fp8, tensor scaling (x, out, scale, amax, scale_inv)":
            lambda: gelu_fp8(x, y8, scale=s, amax=a, scale_inv=si),
        "dgelu bf16 (grad, x, out)": lambda: dgelu(g, x, dx),
        "swiglu bf16 (x, out), (4, 2048)": lambda: swiglu(h, sw),
        "rmsnorm_fwd bf16 h1024 (x, gamma, out=, rsigma=), (4, 1024)":
            lambda: rms(xr, gamma, out=z, rsigma=rs),
        "cast_transpose bf16->fp8 (x, out=, out_t=, scale, amax), (128, 128)":
            lambda: ct(xc, out=q, out_t=qt, scale=s, amax=a),
    }  # fmt: skip


def launch_floor() -> list[dict[str, Any]]:
    """cuLaunchKernel's own host time, from C++ (bench/launch_floor.cu, built with nvcc when
    there is one): the floor under any Python launch path. No rows without nvcc."""
    import json
    import shutil
    import subprocess
    import tempfile

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("no nvcc: launch floor not measured", file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "launch_floor"
        build = [nvcc, "-O2", "-arch=sm_90", str(HERE / "launch_floor.cu"), "-o", str(exe),
                 "-lcuda"]  # fmt: skip
        subprocess.run(build, check=True, timeout=300)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=300)
    floor = json.loads(out.stdout)
    what = {
        "one_param": "1 param",
        "seven_params": "7 params",
        "legacy_stream": "legacy stream",
        "nonblocking_stream": "non-blocking stream",
    }
    names = {}
    for key in floor:  # e.g. seven_params_legacy_stream_5000_us
        params, _, rest = key.partition("_params_" if "_params_" in key else "_param_")
        params = "seven_params" if params == "seven" else "one_param"
        stream, count = rest.removesuffix("_us").rsplit("_", 1)
        names[key] = (f"floor: cuLaunchKernel from C++, {what[params]}, {what[stream]}, "
                      f"runs of {count}")  # fmt: skip
    rows = [{"case": names[k], "us": float(v)} for k, v in floor.items() if k in names]
    for row in rows:
        print(f"{row['us']:8.2f}  {row['case']}", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="stub libcuda and fake torch")
    parser.add_argument("--calls", type=int, default=200, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=20, help="timings; the best is kept")
    parser.add_argument(
        "--paired", type=int, default=40, metavar="ROUNDS",
        help="then time the main rows again in this many shuffled rounds and report medians "
        "and the excess over the bare compiled launch (0: skip)",
    )  # fmt: skip
    parser.add_argument(
        "--name", type=common.result_name,
        help="results file name (default launch_overhead, with --cpu launch_overhead-cpu)",
    )  # fmt: skip
    args = parser.parse_args()

    if args.cpu:
        torch = cpu_environment()
        sync = lambda: None  # noqa: E731
        cuda = torch.device("cuda", 0)
    else:
        import torch

        sync = torch.cuda.synchronize
        cuda = torch.device("cuda", torch.cuda.current_device())
    from cuda.bindings import driver as cu

    import nvrtc_engine as ne
    from nvrtc_engine import driver

    x = torch.empty((1, 1024), dtype=torch.bfloat16, device=cuda)
    out = torch.empty((1, 1024), dtype=torch.bfloat16, device=cuda)
    kernel = ne.get_kernel("gelu", dtype="bf16")
    for _ in range(2):  # the first call loads the module, the second plans the call
        kernel(x, out)
    dev = cuda.index
    loaded = kernel.loaded(dev)
    func = loaded.functions[0]
    threads = kernel._threads  # the block size the kernel was compiled for
    stream = torch._C._cuda_getCurrentRawStream(dev)
    pack = driver.ParamPack("PPqPPPi")
    params = pack.pack(x.data_ptr(), out.data_ptr(), 1024, 0, 0, 0, 1)
    address = params if isinstance(params, int) else params.value  # c_void_p before the plans
    func_int = int(func)
    vp, ll, i32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int

    def raw_tuples() -> None:
        args = ((x.data_ptr(), out.data_ptr(), 1024, 0, 0, 0, 1), (vp, vp, ll, vp, vp, vp, i32))
        cu.cuLaunchKernel(func, 1, 1, 1, threads, 1, 1, 0, stream, args, 0)

    generic = ne.get_kernel("gelu", dtype="bf16", hidden_size=1024)  # another Kernel object
    if hasattr(generic, "_fast"):  # launch plans: switch them off for this one
        generic._fast = lambda *args, **kwargs: (None, None)

    cases: dict[str, Callable[[], Any]] = {
        "Kernel.__call__(x, out)": lambda: kernel(x, out),
        "Kernel.__call__(x) (allocates)": lambda: kernel(x),
        "Kernel.__call__(x, out), generic path (no launch plan)": lambda: generic(x, out),
    }
    compiled = None
    try:
        from nvrtc_engine import launcher
    except ImportError:  # a version from before the compiled launcher
        launcher = None
    if launcher is not None:
        compiled = launcher.get()
        print(f"launcher: {launcher.status()}", file=sys.stderr)
    if compiled is not None and "_fast" in vars(kernel):  # the compiled fast path (plans.py)
        python_fast = type(kernel)(kernel.key, kernel.artifact, kernel.origin)
        for _ in range(2):
            python_fast(x, out)
        del python_fast._fast  # back to the class's key reader; its plan keeps its Python run
        cases["Kernel.__call__(x, out), Python fast path (plans.fast_path, LaunchPlan.run)"] = (
            lambda: python_fast(x, out)
        )
    if compiled is not None:  # the same kernel, its plan made to launch through cuda.bindings
        bound = type(kernel)(kernel.key, kernel.artifact, kernel.origin)
        mode = ne.config.settings().launcher
        ne.configure(launcher="bindings")
        try:
            for _ in range(2):
                bound(x, out)
        finally:
            ne.configure(launcher=mode)
        compiled = launcher.get()  # resolved again: the extension built before
        plan = next(iter(bound._launch_plans.values()))
        assert "cu_launch(" in plan.source, "the bindings-planned case launches otherwise"
        cases["Kernel.__call__(x, out), through cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)"] = (
            lambda: bound(x, out)
        )
    if not args.cpu:
        import torch.nn.functional as F

        cases["torch.nn.functional.gelu(x)"] = lambda: F.gelu(x, approximate="tanh")
        if hasattr(F, "rms_norm"):
            xr = torch.empty((4, 1024), dtype=torch.bfloat16, device=cuda)
            w = torch.ones(1024, dtype=torch.bfloat16, device=cuda)
            cases["torch.nn.functional.rms_norm (4, 1024)"] = lambda: F.rms_norm(xr, (1024,), w)
    cases["raw cuLaunchKernel, argument tuples"] = raw_tuples
    cases.update(family_cases(ne, torch, cuda))
    if compiled is not None:
        cases["step: cuLaunchKernel (compiled launcher, packed params)"] = lambda: compiled(
            func_int, 1, threads, 0, stream, address, 0
        )

    rows = []
    for name, fn in cases.items():
        rows.append({"case": name, "us": per_call_us(fn, sync, args.calls, args.repeat)})
        print(f"{rows[-1]['us']:8.2f}  {name}", file=sys.stderr)
    if args.paired:
        rows += paired_rows(cases, sync, min(args.calls, 200), args.paired)
    if not args.cpu:
        rows += launch_floor()
    import nvrtc_engine

    info: dict[str, Any] = {"nvrtc_engine": str(Path(nvrtc_engine.__file__).parent),
                            "version": f"{nvrtc_engine.__version__} at {common.commit()}",
                            "calls": args.calls, "repeat": args.repeat}  # fmt: skip
    if launcher is not None:
        info["launcher"] = launcher.status()
    if args.cpu:
        info.update(mode="cpu: stub libcuda, fake torch (Python-side time only)")
        path = common.write_results(args.name or "launch_overhead-cpu", {**info, "rows": rows})
    else:
        payload = {**common.gpu_info(), **info, "rows": rows}
        path = common.write_results(args.name or "launch_overhead", payload)
    print(common.table(rows, [("case", "host time per call", ""), ("us", "us", ".2f")]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
