"""Host time per call of a small kernel, against PyTorch's own ops on the same tensors, and
where that time goes.

    python bench/launch_overhead.py           # on a GPU host (torch, CUDA); about 20 s
    python bench/launch_overhead.py --stub    # no GPU: stub libcuda (see below)

The calls, on a bf16 tensor x of (8, 1024): the engine's GELU (tanh) kernel with its output
given (``kernel(x, out)``) and allocating it (``kernel(x)``), ``torch.add(x, x, out=out)``
and ``torch.nn.functional.gelu(x, approximate="tanh")``. Targets (docs/performance.md): the
engine with ``out`` at most ``torch.add(out=)``, the engine allocating at most ``F.gelu``.
The engine rows time the launcher the package uses (``launcher`` in the results: the wheel's
compiled launcher where it loads, nvrtc_engine/core/native_launch.py, else the pure-Python path);
with the compiled one, the same two calls through the pure-Python path are timed beside them
(``pure-Python launch`` rows).

Timed beside them, the pieces of an engine call (``step:`` rows):

- the two engine calls through the pure-Python path with ``cuLaunchKernelEx``
  (cuda.bindings) replaced by a Python function that returns success at once: the host time
  of everything but the driver call (another kernel object of the same variant, prepared
  with the no-op);
- ``cuLaunchKernelEx`` through cuda.bindings alone, with the arguments the prepared call
  passes it: the driver call (cuda.bindings' conversions and libcuda);
- the call key's read and lookup for ``(x, out)`` (``Kernel._fast2`` with a tag no call
  has: a miss, which skips the key comparison a hit makes), by the launcher used and, with
  the compiled one, by the pure-Python path;
- the context check (``cuCtxGetCurrent`` through cuda.bindings) and PyTorch's current stream
  (``torch._C._cuda_getCurrentRawStream``);
- allocating an output like x: ``torch.empty_like(x)``, the same with another dtype,
  ``x.new_empty(sizes)`` and ``torch.empty(*sizes, dtype=, device=)`` (a prepared call takes
  ``empty_like`` of an input of the output's shape and device, else ``empty``).

On a GPU host with nvcc (on the PATH, or under $CUDA_HOME or /usr/local/cuda), ``floor:``
rows: bench/launch_floor.cu's ``cuLaunchKernel`` called from C++ without Python, best of 5
runs of 5000 and of 200 launches (what no Python launch path can go below).

Each case is timed in --rounds rounds (default 7) of --calls calls (default 2000), every
case once per round in a shuffled order, the GPU synchronized after each; the median per call
over the rounds is reported (host time: the GPU is not waited on within a run).

--stub (taken by itself when torch has no CUDA) measures the Python side only, as this
thread's CPU time (other processes' load does not inflate it): tests/host_cuda/libcuda_stub.c
stands in for libcuda (cuda.bindings still converts every argument; the driver's own work is
missing), and with PyTorch installed its CPU tensors stand in for CUDA tensors (their
``get_device`` and ``is_cuda`` made to say device 0; the allocation rows then time the CPU
allocator), else tests/fake_torch.py (no allocation rows). No torch op rows.
Writes bench/results/launch_overhead.json (launch_overhead-stub.json; and to $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

OUT = "engine gelu(x, out)"
ALLOC = "engine gelu(x) (allocates)"
ADD = "torch.add(x, x, out=out)"
GELU = "torch.nn.functional.gelu(x)"
TARGETS = ((OUT, ADD), (ALLOC, GELU))  # (engine row, the torch row it must not exceed)
STREAM = 0x5000  # the stub's current stream


def stub_environment() -> tuple[Any, str, Any]:
    """Stub libcuda, and torch whose CPU tensors say they are device 0's (fake torch when
    PyTorch is not installed): ``(torch, what stands in for CUDA tensors, their device)``."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import stub_driver

    stub_driver.load()  # before cuda.bindings opens the driver
    from nvrtc_engine.core import driver

    # device 0's context current on this thread, as PyTorch's first CUDA op leaves it on a GPU
    driver.make_current(driver.get_device(0))
    try:
        import torch
    except ImportError:
        import fake_torch

        torch = fake_torch.module(current_stream=STREAM)
        sys.modules["torch"] = torch
        return torch, "fake torch tensors (tests/fake_torch.py)", torch.device("cuda", 0)
    torch.Tensor.get_device = int  # int() is 0: a C call, as get_device is
    torch.Tensor.is_cuda = True
    if not hasattr(torch._C, "_cuda_getCurrentRawStream"):  # a CPU build of PyTorch
        torch._C._cuda_getCurrentRawStream = lambda device: STREAM
    return torch, f"PyTorch {torch.__version__} CPU tensors taken as device 0's", "cpu"


def paired(
    cases: dict[str, Callable[[], Any]], sync: Callable[[], Any], calls: int, rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:  # fmt: skip
    """Microseconds per call of each case in each round (the cases once per round, in a
    shuffled order; ``sync`` after each timing; ``clock`` the timer)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            fn = cases[name]
            for _ in range(50):
                fn()
            sync()
            start = clock()
            for _ in range(calls):
                fn()
            elapsed = clock() - start
            sync()
            times[name].append(elapsed / calls * 1e6)
    return times


class _Bindings:
    """cuda.bindings.driver with another ``cuLaunchKernelEx`` (an instance attribute, so a
    call of it is a plain function call)."""

    def __init__(self, real: Any, launch_ex: Callable[..., Any]) -> None:
        self._real = real
        self.cuLaunchKernelEx = launch_ex

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def pure(kernel: Any) -> Any:
    """Another kernel object of ``kernel``'s variant that launches through the pure-Python
    path (NVRTC_ENGINE_NATIVE_LAUNCH off while it is made)."""
    import nvrtc_engine as ne

    native = ne.core.config.settings().native_launch
    ne.configure(native_launch=False)
    try:
        return type(kernel)(kernel.key, kernel.artifact, kernel.origin)
    finally:
        ne.configure(native_launch=native)


def with_launch(
    kernel: Any, launch_ex: Callable[..., Any], calls: list[Callable[[Any], Any]]
) -> Any:
    """Another kernel object of ``kernel``'s variant, on the pure-Python path, whose launches
    call ``launch_ex`` instead of cuda.bindings' ``cuLaunchKernelEx``, each of ``calls``
    (``call(kernel)``) made twice with it (the checked path, then its prepared launch)."""
    from nvrtc_engine.core import driver

    real = driver._drv()
    other = pure(kernel)
    driver._bindings = _Bindings(real, launch_ex)
    try:
        for call in calls * 2:
            call(other)
    finally:
        driver._bindings = real
    return other


def launch_floor() -> list[dict[str, Any]]:
    """Rows of bench/launch_floor.cu, built with nvcc for this GPU and run; none (and a note
    on stderr) without nvcc or when building or running it fails."""
    import torch

    homes = [h for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
    candidates = [shutil.which("nvcc"), *(str(Path(h, "bin", "nvcc")) for h in homes)]
    nvcc = next((c for c in candidates if c and Path(c).exists()), None)
    if nvcc is None:
        print("no nvcc: no floor rows", file=sys.stderr)
        return []
    major, minor = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "launch_floor"
        stubs = [f"-L{h}/lib64/stubs" for h in homes if Path(h, "lib64", "stubs").is_dir()]
        build = [nvcc, "-O2", f"-arch=sm_{major}{minor}", str(HERE / "launch_floor.cu"), "-o",
                 str(exe), *stubs, "-lcuda"]  # fmt: skip
        try:
            subprocess.run(build, check=True, capture_output=True, timeout=300)
            done = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            floor = json.loads(done.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            detail = getattr(exc, "stderr", None) or b""
            detail = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
            print(f"launch_floor.cu: {exc} {detail.strip()[-500:]}: no floor rows", file=sys.stderr)
            return []
    rows = []
    for name, us in floor.items():  # e.g. seven_params_nonblocking_stream_5000_us
        match = re.fullmatch(r"(\w+?_params?)_(\w+)_stream_(\d+)_us", name)
        if match is None:
            continue
        params, stream, count = match.groups()
        rows.append({"case": f"floor: cuLaunchKernel from C++, {params.replace('_', ' ')}, "
                             f"{stream} stream, best of 5 runs of {count}",
                     "us": us, "min_us": us})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", action="store_true", help="stub libcuda (no GPU)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing")
    parser.add_argument("--name", type=common.result_name, help="results file name")
    args = parser.parse_args()

    stub = args.stub
    if not stub:
        try:
            import torch

            stub = not torch.cuda.is_available()
        except ImportError:
            stub = True
        if stub:
            print("no CUDA torch: measuring against the stub libcuda", file=sys.stderr)
    tensors = "CUDA tensors"
    if stub:
        torch, tensors, device = stub_environment()
        sync: Callable[[], Any] = lambda: None  # noqa: E731
    else:
        sync = torch.cuda.synchronize
        device = torch.device("cuda", torch.cuda.current_device())
    import nvrtc_engine as ne
    from nvrtc_engine.core import driver

    x = torch.empty((8, 1024), dtype=torch.bfloat16, device=device)
    out = torch.empty((8, 1024), dtype=torch.bfloat16, device=device)
    if not stub:
        x.normal_()
    kernel = ne.get_kernel("gelu", dtype="bf16")
    calls = [lambda k: k(x, out), lambda k: k(x)]
    for call in calls * 2:  # loads the kernel, then prepares each call's launch
        call(kernel)
    bindings = driver._drv()
    launch_ex, get_context = bindings.cuLaunchKernelEx, bindings.cuCtxGetCurrent
    success = (bindings.CUresult.CUDA_SUCCESS,)
    seen: list[tuple[Any, ...]] = []

    def record(*launch: Any) -> tuple[Any]:
        seen[:] = [launch]
        return success

    def no_launch(config: Any, function: Any, params: Any, extra: Any) -> tuple[Any]:
        return success

    # the arguments the engine's prepared call (x, out) gives cuLaunchKernelEx (``recorded``
    # kept: its function and parameters stay valid), and the calls with a no-op instead
    recorded = with_launch(kernel, record, calls[:1])
    launch_args = seen[0]
    idle = with_launch(kernel, no_launch, calls)
    current_stream = torch._C._cuda_getCurrentRawStream
    ordinal = x.get_device()
    empty, empty_like, bf16 = torch.empty, torch.empty_like, torch.bfloat16
    cases: dict[str, Callable[[], Any]] = {OUT: lambda: kernel(x, out), ALLOC: lambda: kernel(x)}
    launcher = "compiled" if kernel._native else "pure-Python"
    if kernel._native:  # the pure-Python path beside it
        slow = pure(kernel)
        for call in calls * 2:
            call(slow)
        cases[f"{OUT}, pure-Python launch"] = lambda: slow(x, out)
        cases[f"{ALLOC}, pure-Python launch"] = lambda: slow(x)
        miss = "step: call key read and lookup, (x, out) (a miss), pure-Python launch"
        cases[miss] = lambda: slow._fast2(None, x, out, (), None)
    if not stub:
        import torch.nn.functional as F

        cases[ADD] = lambda: torch.add(x, x, out=out)
        cases[GELU] = lambda: F.gelu(x, approximate="tanh")
    cases |= {
        "step: engine gelu(x, out), pure-Python launch, cuLaunchKernelEx a no-op": (
            lambda: idle(x, out)
        ),
        "step: engine gelu(x), pure-Python launch, cuLaunchKernelEx a no-op": lambda: idle(x),
        "step: cuLaunchKernelEx through cuda.bindings alone": (
            lambda keep=recorded: launch_ex(*launch_args)  # (keep: recorded's buffers live)
        ),
        f"step: call key read and lookup, (x, out) (a miss), {launcher} launch": (
            lambda: kernel._fast2(None, x, out, (), None)
        ),
        "step: context check, cuCtxGetCurrent through cuda.bindings": lambda: get_context()[1],
        "step: torch._C._cuda_getCurrentRawStream": lambda: current_stream(ordinal),
    }
    if not tensors.startswith("fake"):
        cases["step: torch.empty_like(x)"] = lambda: empty_like(x)
        cases["step: torch.empty_like(x, dtype=torch.uint8)"] = lambda: empty_like(
            x, dtype=torch.uint8
        )
        cases["step: x.new_empty((8, 1024))"] = lambda: x.new_empty((8, 1024))
        cases["step: torch.empty(8, 1024, dtype=, device=)"] = lambda: empty(
            8, 1024, dtype=bf16, device=device
        )
    # the stub's time is all this thread's: its CPU time, which other processes do not inflate
    clock = time.thread_time if stub else time.perf_counter
    times = paired(cases, sync, args.calls, args.rounds, clock)
    # the median is the figure; the least round shows the cost without other processes' load
    rows = [{"case": name, "us": statistics.median(times[name]), "min_us": min(times[name]),
             "rounds_us": times[name]} for name in cases]  # fmt: skip
    if not stub:
        rows += launch_floor()
    medians = {row["case"]: row["us"] for row in rows}
    targets = [
        {"engine": mine, "torch": theirs, "met": medians[mine] <= medians[theirs]}
        for mine, theirs in TARGETS
        if theirs in medians
    ]
    info: dict[str, Any] = {"rounds": args.rounds, "calls": args.calls, "kernel": str(kernel.key),
                            "shape": [8, 1024], "launcher": launcher,
                            "targets": targets}  # fmt: skip
    if stub:
        info["mode"] = f"stub libcuda, {tensors} (Python-side time only)"
    else:
        info.update(common.gpu_info())
    path = common.write_results(
        args.name or ("launch_overhead-stub" if stub else "launch_overhead"), {**info, "rows": rows}
    )
    print(
        common.table(
            rows,
            [
                ("case", "call", ""),
                ("us", "us per call (median)", ".2f"),
                ("min_us", "least round", ".2f"),
            ],
        )
    )
    print(f"launcher: {launcher}")
    for t in targets:
        print(f"{t['engine']} <= {t['torch']}: {'met' if t['met'] else 'missed'}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
