"""Host time per launch, piece by piece, for a small kernel with torch tensors.

    python bench/launch_overhead.py

Times (microseconds per call, best of 5 x 5000 calls, GPU not waited on): the whole
Kernel.__call__, each step it takes (array adaptation, stream lookup, parameter packing,
context check, the driver call through cuda.bindings and through ctypes), a plain
torch.nn.functional.gelu, and a raw cuLaunchKernel with per-call argument tuples.
Writes bench/results/launch_overhead.json.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def per_call_us(fn, calls: int = 5000) -> float:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> int:
    import torch
    import torch.nn.functional as F
    from cuda.bindings import driver as cu

    import nvrtc_engine as ne
    from nvrtc_engine import driver, interop

    x = torch.randn(1, 1024, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x)
    kernel = ne.get_kernel("gelu", dtype="bf16")
    dev = torch.cuda.current_device()
    loaded = kernel.loaded(dev)
    func = loaded.functions[0]
    threads = kernel._threads  # the block size the kernel was compiled for
    stream = torch.cuda.current_stream().cuda_stream
    pack = driver.ParamPack("PPqPPPi")
    params = pack.pack(x.data_ptr(), out.data_ptr(), 1024, 0, 0, 0, 1)
    xa = interop.as_array(x, "x")
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = (
        [ctypes.c_void_p]
        + [ctypes.c_uint] * 6
        + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    )
    func_int = int(func)
    stream_obj = cu.CUstream(stream)
    raw = libcuda.cuLaunchKernel  # a second handle without argtypes: pre-built ctypes args
    raw.restype = ctypes.c_int
    c_func, c_one, c_256, c_zero = (
        ctypes.c_void_p(func_int),
        ctypes.c_uint(1),
        ctypes.c_uint(256),
        ctypes.c_uint(0),
    )
    c_stream, c_params = ctypes.c_void_p(stream), params  # pack() gives a c_void_p
    vp, ll, i32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int

    def raw_tuples():
        args = ((x.data_ptr(), out.data_ptr(), 1024, 0, 0, 0, 1), (vp, vp, ll, vp, vp, vp, i32))
        cu.cuLaunchKernel(func, 1, 1, 1, threads, 1, 1, 0, stream, args, 0)

    cases = {
        "Kernel.__call__(x, out)": lambda: kernel(x, out),
        "Kernel.__call__(x) (allocates)": lambda: kernel(x),
        "torch.nn.functional.gelu(x)": lambda: F.gelu(x, approximate="tanh"),
        "raw cuLaunchKernel, argument tuples": raw_tuples,
        "step: interop.as_array(x)": lambda: interop.as_array(x, "x"),
        "step: stream_handle(None)": lambda: interop.stream_handle(None, xa),
        "step: ParamPack.pack": lambda: pack.pack(x.data_ptr(), out.data_ptr(), 1024, 0, 0, 0, 1),
        "step: driver.make_current": lambda: driver.make_current(loaded.device),
        "step: cuCtxGetCurrent": cu.cuCtxGetCurrent,
        "step: cuLaunchKernel (cuda.bindings, packed params)":
            lambda: cu.cuLaunchKernel(func, 1, 1, 1, threads, 1, 1, 0, stream, params, 0),
        "step: cuLaunchKernel (ctypes, packed params)":
            lambda: launch(func_int, 1, 1, 1, threads, 1, 1, 0, stream, params, None),
        "step: cuLaunchKernel (cuda.bindings, CUstream object)":
            lambda: cu.cuLaunchKernel(func, 1, 1, 1, threads, 1, 1, 0, stream_obj, params, 0),
        "step: cuLaunchKernel (ctypes, pre-built ctypes args)":
            lambda: raw(c_func, c_one, c_one, c_one, c_256, c_one, c_one, c_zero, c_stream,
                        c_params, None),
        "step: x.data_ptr()": x.data_ptr,
        "step: kernel.loaded(dev)": lambda: kernel.loaded(dev),
    }  # fmt: skip
    rows = [{"case": name, "us": per_call_us(fn)} for name, fn in cases.items()]
    path = common.write_results("launch_overhead", {**common.gpu_info(), "rows": rows})
    print(common.table(rows, [("case", "host time per call", ""), ("us", "us", ".2f")]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
