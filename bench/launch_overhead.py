"""Host time per call of a small kernel, against PyTorch's own ops on the same tensors.

    python bench/launch_overhead.py           # on a GPU host (torch, CUDA)
    python bench/launch_overhead.py --stub    # no GPU: stub libcuda + fake torch tensors

Four calls on a bf16 tensor x of (8, 1024), paired: the engine's GELU (tanh) kernel with its
output given (``kernel(x, out)``) and allocating it (``kernel(x)``), ``torch.add(x, x,
out=out)`` and ``torch.nn.functional.gelu(x, approximate="tanh")``. Each is timed in
--rounds rounds (default 7) of --calls calls (default 2000), the four once per round in a
shuffled order, the GPU synchronized after each; the median per call over the rounds is
reported (host time: the GPU is not waited on within a run). Targets (docs/performance.md):
the engine with ``out`` at most ``torch.add(out=)``, the engine allocating at most
``F.gelu``.

--stub (taken by itself when torch has no CUDA) measures the Python side only:
tests/host_cuda/libcuda_stub.c stands in for libcuda (cuda.bindings still converts every
argument; the driver's own ~3 us per launch is missing) and tests/fake_torch.py for torch
(no torch ops there: the two engine rows only), timed as this thread's CPU time. Writes
bench/results/launch_overhead.json (launch_overhead-stub.json; and to $OUT).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
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


def stub_environment() -> Any:
    """Stub libcuda and fake torch (tests/): returns the fake torch module."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import fake_torch
    import stub_driver

    stub_driver.load()  # before cuda.bindings opens the driver
    torch = fake_torch.module(current_stream=0x5000)
    sys.modules["torch"] = torch
    return torch


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", action="store_true", help="stub libcuda and fake torch")
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
    if stub:
        torch = stub_environment()
        sync: Callable[[], Any] = lambda: None  # noqa: E731
        device = torch.device("cuda", 0)
    else:
        sync = torch.cuda.synchronize
        device = torch.device("cuda", torch.cuda.current_device())
    import nvrtc_engine as ne

    x = torch.empty((8, 1024), dtype=torch.bfloat16, device=device)
    out = torch.empty((8, 1024), dtype=torch.bfloat16, device=device)
    if not stub:
        x.normal_()
    kernel = ne.get_kernel("gelu", dtype="bf16")
    for _ in range(2):  # loads the kernel, then prepares each call's launch
        kernel(x, out)
        kernel(x)
    cases: dict[str, Callable[[], Any]] = {OUT: lambda: kernel(x, out), ALLOC: lambda: kernel(x)}
    if not stub:
        import torch.nn.functional as F

        cases[ADD] = lambda: torch.add(x, x, out=out)
        cases[GELU] = lambda: F.gelu(x, approximate="tanh")
    # the stub's time is all this thread's: its CPU time, which other processes do not inflate
    clock = time.thread_time if stub else time.perf_counter
    times = paired(cases, sync, args.calls, args.rounds, clock)
    # the median is the figure; the least round shows the cost without other processes' load
    rows = [{"case": name, "us": statistics.median(times[name]), "min_us": min(times[name]),
             "rounds_us": times[name]} for name in cases]  # fmt: skip
    medians = {row["case"]: row["us"] for row in rows}
    targets = [
        {"engine": mine, "torch": theirs, "met": medians[mine] <= medians[theirs]}
        for mine, theirs in TARGETS
        if theirs in medians
    ]
    info: dict[str, Any] = {"rounds": args.rounds, "calls": args.calls, "kernel": str(kernel.key),
                            "shape": [8, 1024], "targets": targets}  # fmt: skip
    if stub:
        info["mode"] = "stub libcuda, fake torch (Python-side time only)"
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
    for t in targets:
        print(f"{t['engine']} <= {t['torch']}: {'met' if t['met'] else 'missed'}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
