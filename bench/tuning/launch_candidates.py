"""Host time per launch of one tiny kernel through each way of calling the driver, paired.

    python bench/launch_candidates.py            # on a GPU host (torch allocates the buffers)
    python bench/launch_candidates.py --stub     # no GPU: stub libcuda and fake torch

The kernel: rmsnorm_fwd bf16, hidden size 1024, 4 rows (its template waits for its grid
dependency, so it may be a programmatic dependent launch). Each candidate is a factory
``make(function, grid, block, shmem, dependent) -> go(stream, params)``, and its ``go`` does
per launch what a call does: find the per-stream object (a CUstream, a launch configuration, a
cuda.core Stream) from the stream handle, and launch with the parameters packed once
(cuda.core takes the values instead, the float as a numpy float32 made per call):

- ``bindings cuLaunchKernel``: cuda.bindings' cuLaunchKernel (cuLaunchKernelEx when
  ``dependent``: cuLaunchKernel has no launch attributes);
- ``bindings cuLaunchKernelEx``: cuda.bindings' cuLaunchKernelEx, a CUlaunchConfig per stream;
- ``ctypes cuLaunchKernel`` / ``ctypes cuLaunchKernelEx``: the driver's functions (from
  cuGetProcAddress, as cuda.bindings finds them) called through ctypes, a config struct per
  stream for the Ex form;
- ``cuda.core launch``: ``cuda.core.launch(stream, config, kernel, *args)``, a cuda.core
  ``Stream`` per stream handle and a ``LaunchConfig`` made once
  (``programmatic_stream_serialization`` for ``dependent``);
- ``nvrtc_engine.core.launch.launch``: the package's driver call (cuLaunchKernelEx through
  cuda.bindings, the configuration from its cache by launch shape and stream), for
  reference.

Plus the context check each launch needs: cuCtxGetCurrent through cuda.bindings and through
ctypes. Each is timed with and without programmatic dependent launch (PDL), in --rounds
rounds (default 7) of --calls launches (default 2000), every candidate once per round in a
shuffled order, then synchronized; the median per launch over the rounds is reported. With
--stub the driver returns at once, so the figures are each candidate's Python-side cost
alone (timed as this thread's CPU time, which other processes' load does not inflate), and
every candidate's last launch is checked against what it should have given the driver.
Writes bench/tuning/launch_candidates.json (launch_candidates-stub.json; and to $OUT): the
measurement behind the choice of cuLaunchKernelEx through cuda.bindings (docs/design.md).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent  # bench/
sys.path.insert(0, str(HERE))

import common  # noqa: E402

Go = Callable[[int, int], None]


def _check(err: Any, call: str) -> None:
    if int(err) != 0:
        raise RuntimeError(f"{call} failed: {err}")


def bindings_launch(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
    from cuda.bindings import driver as cu

    if dependent:  # only cuLaunchKernelEx carries the attribute
        return bindings_launch_ex(function, grid, block, shmem, dependent)
    streams: dict[int, Any] = {}

    def go(stream: int, params: int) -> None:
        s = streams.get(stream)
        if s is None:
            s = streams[stream] = cu.CUstream(stream)
        (err,) = cu.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shmem, s, params, 0)
        if err:
            _check(err, "cuLaunchKernel")

    return go


def bindings_launch_ex(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
    from cuda.bindings import driver as cu

    configs: dict[int, Any] = {}

    def config_for(stream: int) -> Any:
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = shmem
        config.hStream = cu.CUstream(stream)
        if dependent:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config.attrs = [attr]
            config.numAttrs = 1
        else:
            config.numAttrs = 0
        return config

    launch_ex = cu.cuLaunchKernelEx

    def go(stream: int, params: int) -> None:
        config = configs.get(stream)
        if config is None:
            config = configs[stream] = config_for(stream)
        (err,) = launch_ex(config, function, params, 0)
        if err:
            _check(err, "cuLaunchKernelEx")

    return go


class _Attribute(ctypes.Structure):  # cuda.h's CUlaunchAttribute: an enum id, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]  # fmt: skip


class _Config(ctypes.Structure):  # cuda.h's CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shmem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]  # fmt: skip


def _driver_function(symbol: str, prototype: Any) -> Any:
    """The driver's ``symbol`` as cuda.bindings finds it (cuGetProcAddress, the same
    default-stream mode), wrapped by ctypes with ``prototype``."""
    from cuda.bindings import driver as cu

    flags = cu.CUdriverProcAddress_flags
    ptds = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0").strip()
    flag = (flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if ptds not in ("", "0")
            else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM)  # fmt: skip
    err, pfn, _ = cu.cuGetProcAddress(symbol.encode(), 12000, flag)
    _check(err, f"cuGetProcAddress({symbol})")
    return prototype(int(pfn))


_vp, _u = ctypes.c_void_p, ctypes.c_uint
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, _vp, _u, _u, _u, _u, _u, _u, _u, _vp, _vp, _vp)
_LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, _vp, _vp, _vp, _vp)
_GET_CONTEXT = ctypes.CFUNCTYPE(ctypes.c_int, _vp)


def ctypes_launch(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
    if dependent:
        return ctypes_launch_ex(function, grid, block, shmem, dependent)
    launch = _driver_function("cuLaunchKernel", _LAUNCH)
    f = int(function)

    def go(stream: int, params: int) -> None:
        err = launch(f, grid, 1, 1, block, 1, 1, shmem, stream, params, None)
        if err:
            _check(err, "cuLaunchKernel")

    return go


def ctypes_launch_ex(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
    launch_ex = _driver_function("cuLaunchKernelEx", _LAUNCH_EX)
    f = int(function)
    configs: dict[int, tuple[int, Any]] = {}

    def config_for(stream: int) -> tuple[int, Any]:
        attr = _Attribute(id=6, value=1)  # PROGRAMMATIC_STREAM_SERIALIZATION, allowed
        config = _Config((grid, 1, 1), (block, 1, 1), shmem, stream, ctypes.pointer(attr),
                         1 if dependent else 0)  # fmt: skip
        return ctypes.addressof(config), (config, attr)

    def go(stream: int, params: int) -> None:
        entry = configs.get(stream)
        if entry is None:
            entry = configs[stream] = config_for(stream)
        err = launch_ex(entry[0], f, params, None)
        if err:
            _check(err, "cuLaunchKernelEx")

    return go


def engine_launch(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
    from nvrtc_engine.core.launch import launch

    def go(stream: int, params: int) -> None:
        launch(function, grid, block, shmem, dependent, stream, params)

    return go


def cuda_core_launch(values: list[Any], float_at: int) -> Callable[..., Go]:
    """cuda.core's launch, given the parameter values (it packs them itself) and the index
    of the float one (a numpy float32 made per call, as a call's eps would be)."""

    def make(function: Any, grid: int, block: int, shmem: int, dependent: bool) -> Go:
        import numpy as np
        from cuda.core import Kernel, LaunchConfig, Stream, launch

        kernel = Kernel.from_handle(int(function))
        config = LaunchConfig(grid=grid, block=block, shmem_size=shmem,
                              programmatic_stream_serialization=dependent)  # fmt: skip
        streams: dict[int, Any] = {}
        head, eps, tail = values[:float_at], float(values[float_at]), values[float_at + 1 :]
        float32 = np.float32

        def go(stream: int, params: int) -> None:
            s = streams.get(stream)
            if s is None:
                s = streams[stream] = Stream.from_handle(stream)
            launch(s, config, kernel, *head, float32(eps), *tail)

        return go

    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", action="store_true", help="stub libcuda and fake torch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="launches per timing")
    parser.add_argument("--name", type=common.result_name, help="results file name")
    args = parser.parse_args()

    stub = None
    if args.stub:
        sys.path.insert(0, str(HERE.parent / "tests"))
        import fake_torch
        import stub_driver

        stub = stub_driver.load()  # before cuda.bindings opens the driver
        torch = fake_torch.module(current_stream=0x5000)
        sys.modules["torch"] = torch
        sync: Callable[[], Any] = lambda: None  # noqa: E731
    else:
        import torch

        sync = torch.cuda.synchronize
    import nvrtc_engine as ne
    from nvrtc_engine.core.signature import param_buffer
    from nvrtc_engine.families.norm.kernels import FWD

    device = 0 if args.stub else torch.cuda.current_device()
    cuda = torch.device("cuda", device)
    kernel = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024)
    x = torch.empty((4, 1024), dtype=torch.bfloat16, device=cuda)
    w = torch.empty((1024,), dtype=torch.bfloat16, device=cuda)
    z = torch.empty((4, 1024), dtype=torch.bfloat16, device=cuda)
    r = torch.empty((4,), dtype=torch.float32, device=cuda)
    if not args.stub:
        x.normal_()
        w.fill_(1.0)
    for _ in range(2):  # loads the kernel, prepares the call
        kernel(x, w, 1e-5, z, r)
    sync()
    loaded = kernel.loaded(device)
    # the device's context current for the candidates' own launches (PyTorch's is, on a GPU)
    ne.driver.make_current(loaded.device)
    function = loaded.functions[0]
    grid, block = kernel.launch_grid(4), kernel.config.threads
    shmem = kernel._shared[0] if kernel._shared else 0
    stream = torch._C._cuda_getCurrentRawStream(device)
    bound = FWD.bind(
        x=x.data_ptr(), gamma=w.data_ptr(), beta=0, z=z.data_ptr(), mu_out=0, rs_out=r.data_ptr(),
        scale_ptr=0, amax_ptr=0, scale_inv_ptr=0, mx_scale=0, rows=4, hidden=1024, eps=1e-5,
        vec=1, tpr=0, mx_stride=0, mx_rows=0,
    )  # fmt: skip
    values = FWD.values(bound, (), ())
    image = FWD.struct.pack(*values)
    keep = param_buffer(len(image), image)
    params = keep[3]
    candidates: dict[str, Callable[..., Go]] = {
        "bindings cuLaunchKernel": bindings_launch,
        "bindings cuLaunchKernelEx": bindings_launch_ex,
        "ctypes cuLaunchKernel": ctypes_launch,
        "ctypes cuLaunchKernelEx": ctypes_launch_ex,
        "nvrtc_engine.core.launch.launch": engine_launch,
    }
    try:
        import cuda.core

        candidates["cuda.core launch"] = cuda_core_launch(values, FWD.names.index("eps"))
        core_version = cuda.core.__version__
    except ImportError as exc:
        print(f"no cuda.core: {exc}", file=sys.stderr)
        core_version = None
    cases: dict[str, Callable[[], None]] = {}
    for name, make in candidates.items():
        for dependent in (False, True):
            go = make(function, grid, block, shmem, dependent)
            cases[f"{name}{', PDL' if dependent else ''}"] = (
                lambda go=go: go(stream, params)  # type: ignore[misc]
            )
    from cuda.bindings import driver as cu

    get_context = _driver_function("cuCtxGetCurrent", _GET_CONTEXT)
    out = ctypes.c_void_p()
    out_address = ctypes.addressof(out)
    cases["context check: bindings cuCtxGetCurrent"] = lambda: cu.cuCtxGetCurrent()[1]
    cases["context check: ctypes cuCtxGetCurrent"] = lambda: get_context(out_address)

    if stub is not None:  # each candidate launched exactly the packed parameters
        stub.record_params(len(FWD.names), function)
        for case, fn in cases.items():
            if case.startswith("context"):
                continue
            fn()
            last = stub.last()
            slots = struct.unpack(f"<{len(FWD.names)}Q", image)
            got = [p & 0xFFFFFFFF if k in ("i32", "f32") else p
                   for p, k in zip(last["params"], FWD.kinds, strict=True)]  # fmt: skip
            want = [p & 0xFFFFFFFF if k in ("i32", "f32") else p
                    for p, k in zip(slots, FWD.kinds, strict=True)]  # fmt: skip
            assert got == want, (case, got, want)
            assert (last["grid"][0], last["block"][0], last["stream"]) == (grid, block, stream)
            assert last["dependent"] == case.endswith("PDL"), case

    # the stub's time is all this thread's: its CPU time, which other processes do not inflate
    clock = time.thread_time if stub is not None else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(names)
        for name in names:
            fn = cases[name]
            for _ in range(50):
                fn()
            sync()
            start = clock()
            for _ in range(args.calls):
                fn()
            elapsed = clock() - start
            sync()
            times[name].append(elapsed / args.calls * 1e6)
    # the median is the figure; the least round shows the cost without other processes' load
    rows = [{"case": name, "us": statistics.median(times[name]), "min_us": min(times[name]),
             "rounds_us": times[name]} for name in cases]  # fmt: skip
    info: dict[str, Any] = {
        "mode": "stub libcuda, fake torch (Python-side time only)" if stub else "GPU",
        "rounds": args.rounds, "calls": args.calls, "cuda_core": core_version,
        "kernel": str(kernel.key), "grid": grid, "block": block,
    }  # fmt: skip
    if stub is None:
        info.update(common.gpu_info())
    name = args.name or ("launch_candidates-stub" if stub else "launch_candidates")
    path = common.write_results(name, {**info, "rows": rows}, directory=HERE / "tuning")
    print(
        common.table(
            rows,
            [
                ("case", "launch", ""),
                ("us", "us per launch (median)", ".3f"),
                ("min_us", "least round", ".3f"),
            ],
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
