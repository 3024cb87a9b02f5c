"""Launch each kernel variant once on small, awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 bench/sanitize_kernels.py
    compute-sanitizer --tool racecheck python3 bench/sanitize_kernels.py
    compute-sanitizer --tool memcheck  python3 bench/sanitize_kernels.py --flat  # flat only

Uses DeviceBuffer (no PyTorch) so the sanitizer sees only these kernels. Shapes cover the
vector path, the scalar tail and unaligned pointers of the flat GELU kernel, the row-flat
activation kernel (gated ops and MXFP8 rowwise, forward and backward: its vector path and
its element path for H not a multiple of the vector width; owner mode for plain ops; split
row scales) and the tiled one (MXFP8 columnwise and both, partial tiles; several tiles per
block with the next tile's loads in flight; clamped loads); each with one pass and with a
grid of 3 blocks that loop (the tiled kernel's blocks reuse shared memory). Exits non-zero
on a wrong result.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from typing import Any

import numpy as np

import nvrtc_engine as ne
from nvrtc_engine import config, driver, reference
from nvrtc_engine.engine import Engine
from nvrtc_engine.ops import activation
from nvrtc_engine.ops.activation import MXFP8Output
from nvrtc_engine.ops.blockscale import mxfp8_scale_shape


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


def device(host: np.ndarray, dtype: str) -> driver.DeviceBuffer:
    buf = driver.DeviceBuffer(0, host.shape, dtype)
    buf.copy_from_host(host)
    return buf


def run_tiled(key: ne.KernelKey, rows: int, cols: int, rng: np.random.Generator,
              kernel: Any = None) -> None:  # fmt: skip
    """One launch of a row-flat or tiled kernel (cols = H for gated ops; ``kernel``: one
    of ``key`` built otherwise), checked against the reference."""
    kernel = kernel or ne.get_kernel(key)
    kind = reference.op_kind(key.op)
    gated = kind in ("gated", "dgated")
    x_host = reference.sample_input((rows, 2 * cols if gated else cols), key.in_dtype, rng)
    grad_host = None
    args = [device(x_host, key.in_dtype)]
    if kind in ("dact", "dgated"):
        grad_host = reference.sample_input((rows, cols), key.in_dtype, rng, outliers=4.0)
        args.insert(0, device(grad_host, key.in_dtype))
    ref = reference.op_values(key.op, x_host, grad_host, limit=7.0)
    shape = ref.y.shape
    kwargs = {"limit": 7.0} if "clamped" in key.op else {}
    if key.scaling == "mxfp8":
        fields = {}
        for direction in ("rowwise", "columnwise"):
            if key.layout in (direction, "both"):
                fields[direction] = driver.DeviceBuffer(0, shape, key.out_dtype)
                fields[direction].fill_bytes(0xFF)
                s = driver.DeviceBuffer(0, mxfp8_scale_shape(*shape, direction), "fp8_e4m3")
                s.fill_bytes(0xFF)
                fields[direction + "_scale"] = s
        out = MXFP8Output(**fields)
        kernel(*args, out, **kwargs)
        for direction in ("rowwise", "columnwise"):
            if key.layout in (direction, "both"):
                h, w = mxfp8_scale_shape(*shape, direction, padded=False)
                scales = getattr(out, direction + "_scale").to_host().view(np.uint8)[:h, :w]
                reference.check_mxfp8(getattr(out, direction).to_host(), scales, ref.y,
                                      ref.tolerance, key.out_dtype, direction)  # fmt: skip
        return
    y = driver.DeviceBuffer(0, shape, key.out_dtype)
    y.fill_bytes(0xFF)
    if key.scaling == "tensor":
        kwargs["scale"] = device(np.array([2.0], np.float32), "fp32")
        kwargs["amax"] = device(np.zeros(1, np.float32), "fp32")
    kernel(*args, y, **kwargs)
    factor = 2.0 if key.scaling == "tensor" else 1.0
    reference.check_close(y.to_host(), ref.y * factor, key.out_dtype, ref.tolerance * factor)


def configured_kernel(key: ne.KernelKey, chooser: str, cfg: Any) -> Any:
    """``key``'s kernel built with ``activation.<chooser>`` returning ``cfg``, in memory
    only (the disk cache holds the key with its default configuration)."""
    chosen, settings = getattr(activation, chooser), config._current
    setattr(activation, chooser, lambda key: cfg)
    config._current = replace(config.settings(), disable_disk_cache=True)
    try:
        return Engine().get(key)
    finally:
        setattr(activation, chooser, chosen)
        config._current = settings


def main() -> int:
    rng = np.random.default_rng(0)
    count = 0
    for i, o in [("bf16", "fp8_e4m3"), ("bf16", "bf16"), ("fp32", "fp8_e5m2"), ("fp16", "fp32"),
                 ("fp16", "fp8_e4m3")]:  # fmt: skip
        key = ne.make_key("gelu", in_dtype=i, out_dtype=o)
        for n, offset in [(1, 0), (37, 0), (4099, 0), (70001, 0), (4099, 1), (4104, 0)]:
            run(key, n, offset, rng)
            count += 1
    if "--flat" in sys.argv[1:]:  # the flat kernel only
        print(f"sanitize_kernels: {count} launches checked")
        return 0
    tiled = [
        ("swiglu", dict(dtype="bf16")), ("dgeglu", dict(dtype="fp8")),
        ("dclamped_swiglu", dict(in_dtype="fp32", out_dtype="fp16")),
        ("gelu", dict(dtype="fp8", scaling="mxfp8", layout="rowwise")),
        ("dgeglu", dict(dtype="fp8", scaling="mxfp8", layout="rowwise")),
        ("dswiglu", dict(dtype="fp8", scaling="mxfp8", layout="both")),
        ("dsilu", dict(in_dtype="fp32", out_dtype="e5m2", scaling="mxfp8", layout="columnwise")),
    ]  # fmt: skip
    max_grid = activation.MAX_GRID
    for op, fields in tiled:
        key = ne.make_key(op, **fields)
        shapes = [(64, 96), (96, 160)] if key.scaling == "mxfp8" else [(7, 67), (33, 512)]
        if key.layout == "rowwise" and key.scaling == "mxfp8":
            shapes += [(37, 64), (37, 128), (1, 96)]  # 128: compact scale rows
        for (rows, cols), grid in itertools.product(shapes, [max_grid, 3]):
            activation.MAX_GRID = grid  # 3: every block loops over several tiles
            try:
                run_tiled(key, rows, cols, rng)
            finally:
                activation.MAX_GRID = max_grid
            count += 1
    # the row-flat kernel's owner mode (plain ops, MXFP8 rowwise: a thread per 32-value
    # block) and split scales, the tiled kernel with several tiles per block (next tile's
    # loads in flight) and with clamped loads
    extra = [
        (op, "rowwise", "row_config", cfg, [(37, 64), (37, 128), (1, 96), (96, 160)])
        for op in ("gelu", "dsrelu")
        for cfg in (activation.LaunchConfig(128, 2, owner=True),
                    activation.LaunchConfig(256, 1, owner=True))
    ] + [
        (op, "both", "tile_config", cfg, [(64, 96), (96, 160), (32, 32)])
        for op in ("gelu", "dswiglu")
        for cfg in (activation.TileConfig(64, 8, 4, tiles_per_block=3),
                    activation.TileConfig(64, 8, 4, clamp_loads=True),
                    activation.TileConfig(128, 16, 4, clamp_loads=True, tiles_per_block=2),
                    activation.TileConfig(64, 8, 4, split_scales=True),
                    activation.TileConfig(64, 8, 4, clamp_loads=True, split_scales=True,
                                          tiles_per_block=3))
    ] + [
        # split row scales (a block's lanes share the E8M0 work), FP8 stored as bytes
        (op, "rowwise", "row_config", cfg, [(37, 64), (37, 128), (1, 96), (96, 160)])
        for op in ("gelu", "dswiglu")
        for cfg in (activation.LaunchConfig(128, 4, split_scales=True),
                    activation.LaunchConfig(64, 8, split_scales=True, fp8_words=False))
    ]  # fmt: skip
    for op, layout, chooser, cfg, shapes in extra:
        key = ne.make_key(op, dtype="fp8", scaling="mxfp8", layout=layout)
        kernel = configured_kernel(key, chooser, cfg)
        for rows, cols in shapes:
            run_tiled(key, rows, cols, rng, kernel)
            count += 1
    print(f"sanitize_kernels: {count} launches checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
