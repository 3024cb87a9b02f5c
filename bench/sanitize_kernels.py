"""Launch each kernel variant once on small, awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 bench/sanitize_kernels.py
    compute-sanitizer --tool racecheck python3 bench/sanitize_kernels.py

Uses DeviceBuffer (no PyTorch) so the sanitizer sees only these kernels. Shapes cover the
vector path, the scalar tail and unaligned pointers. Exits non-zero on a wrong result.
"""

from __future__ import annotations

import sys

import numpy as np

import nvrtc_engine as ne
from nvrtc_engine import driver, reference


def run(key: ne.KernelKey, n: int, offset: int, rng: np.random.Generator) -> None:
    kernel = ne.get_kernel(key)
    x_host = reference.sample_input((n,), key.in_dtype, rng)
    # over-allocate by one element and offset the pointer to test unaligned access
    x = driver.DeviceBuffer(0, (n + offset,), key.in_dtype)
    y = driver.DeviceBuffer(0, (n + offset,), key.out_dtype)
    x.copy_from_host(np.concatenate([np.zeros(offset, x_host.dtype), x_host]))
    y.fill_bytes(0xFF)

    class View:
        def __init__(self, buf, dtype):
            d = ne.DTYPES[dtype]
            self.__cuda_array_interface__ = {
                "shape": (n,),
                "data": (buf.ptr + offset * d.itemsize, False),
                "version": 3,
                "typestr": d.typestrs[0] if d.typestrs else d.storage_typestr,
                "strides": None,
            }

    kwargs = {}
    if key.scaling == "tensor":
        s = driver.DeviceBuffer(0, (1,), "fp32")
        s.copy_from_host(np.array([2.0], np.float32))
        a = driver.DeviceBuffer(0, (1,), "fp32")
        a.fill_bytes(0)
        si = driver.DeviceBuffer(0, (1,), "fp32")
        kwargs = {"scale": s, "amax": a, "scale_inv": si}
    kernel(View(x, key.in_dtype), View(y, key.out_dtype), **kwargs)
    got = y.to_host()[offset:]
    ref = reference.activation(key.op, x_host, key.out_dtype, 2.0 if kwargs else None)
    factor = 2.0 if kwargs else 1.0
    reference.check_close(got, ref.y * factor, key.out_dtype, ref.tolerance * factor)


def main() -> int:
    rng = np.random.default_rng(0)
    count = 0
    for i, o in [("bf16", "fp8_e4m3"), ("bf16", "bf16"), ("fp32", "fp8_e5m2"), ("fp16", "fp32")]:
        key = ne.make_key("gelu", in_dtype=i, out_dtype=o)
        for n, offset in [(1, 0), (37, 0), (4099, 0), (70001, 0), (4099, 1)]:
            run(key, n, offset, rng)
            count += 1
    print(f"sanitize_kernels: {count} launches checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
